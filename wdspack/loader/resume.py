"""The loader's checkpoint: its state as a typed record, and each kind of restore as one function.

    state_dict:      LoaderPosition ─► save_state ─► LoaderState.to_json ─► JSON
    load_state_dict: JSON ─► LoaderState.from_json ─► restore ─┬─ restore_same_layout (+ restore_continuation)
                                                                ├─ restore_other_workers     (a mixture, same ranks)
                                                                ├─ restore_elastic           (one dataset, other layout)
                                                                └─ restore_mixture_elastic   (a mixture, other ranks)
                                                               ─► LoaderPosition the loader goes on from

Holds: ``to_json`` writes the keys and values loaders have always saved, and ``from_json`` reads any
state saved since version 1, refusing a damaged one in one line; a restore changes the dataset's
shared state (elastic basis, mixture continuation, balance run) and returns the loader's position.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any

from ..errors import ConfigError
from .dataset import PackedDataset
from .elastic import lockstep_positions
from .plan import EpochPlan

__all__ = ["LoaderConfig", "LoaderPosition", "LoaderState", "PLAN_VERSION", "STATE_VERSION", "adopt_balance_run",
           "check_kept_sources", "loader_config", "restore", "restore_continuation", "restore_elastic",
           "restore_mixture_elastic", "restore_other_workers", "restore_same_layout", "save_state"]

logger = logging.getLogger(__name__)

#: How shards are split over slots (:mod:`.plan`); a state saved under another split is refused.
#: 2: McNaughton's wrap-around (shards back to back, cut at slot boundaries).
PLAN_VERSION = 2
STATE_VERSION = 1

#: a worker's position: (lap, emitted, yielded)
Worker = tuple[int, ...]

_LAYOUT = ("rank", "world_size", "num_workers")
_CONFIG_INTS = ("seed", "shuffle_buffer", "batch_size", "rank", "world_size", "num_workers")


# -- the records ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoaderConfig:
    """What a state was saved under: restore refuses any difference but the layout (rank, world size, workers).

    Example:
        >>> c = LoaderConfig(plan=2, dataset="98f7b2cc94980b75", seed=7, shuffle=True, shuffle_buffer=256,
        ...                  remainder="drop", batch_size=2, rank=0, world_size=1, num_workers=2)
        >>> LoaderConfig.from_json(c.to_json()) == c, list(c.to_json())[:3]
        (True, ['plan', 'dataset', 'seed'])
    """

    #: how shards are split over slots (:data:`PLAN_VERSION`; 1 in states saved before it was kept)
    plan: int
    #: 16 hex digits of a sha256 over the shards' names, pack counts and checksums
    dataset: str
    seed: int
    shuffle: bool
    shuffle_buffer: int
    remainder: str
    batch_size: int
    rank: int
    world_size: int
    num_workers: int
    #: the mixture's record (``MixedSources.config()``); only for a mixture
    mixture: Mapping[str, Any] | None = None
    #: ``{"kind", "cost_model", "heaviest_first", "window", "run"}``; only with a balance
    balance: Mapping[str, Any] | None = None
    #: keys this wdspack does not write (a newer one's), kept so a restore names them
    other: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON, in the order loaders have always written it."""
        value: dict[str, Any] = {"plan": self.plan, "dataset": self.dataset, "seed": self.seed, "shuffle": self.shuffle,
                                 "shuffle_buffer": self.shuffle_buffer, "remainder": self.remainder,
                                 "batch_size": self.batch_size, "rank": self.rank, "world_size": self.world_size,
                                 "num_workers": self.num_workers}
        if self.mixture is not None:  # only then: a single dataset's state is unchanged
            value["mixture"] = self.mixture
        if self.balance is not None:  # only then: states saved without balance stay loadable
            value["balance"] = self.balance
        value.update(self.other)
        return value

    @classmethod
    def from_json(cls, value: Any) -> LoaderConfig:
        """The inverse of :meth:`to_json`; raises :class:`ConfigError` naming what is missing or mistyped."""
        if not isinstance(value, Mapping):
            raise ConfigError(f"the loader state's config is a {type(value).__name__}, not a dict; the state is "
                              "damaged")
        wrong = _missing(value, ("dataset", "remainder", "shuffle", *_CONFIG_INTS))
        wrong += [f"{k} {value[k]!r} is not an int" for k in ("plan", *_CONFIG_INTS)
                  if k in value and not _is_int(value[k])]
        wrong += [f"{k} {value[k]!r} is not a string" for k in ("dataset", "remainder")
                  if k in value and not isinstance(value[k], str)]
        if "shuffle" in value and not isinstance(value["shuffle"], Integral):  # a bool (True == 1 as ever)
            wrong.append(f"shuffle {value['shuffle']!r} is not a bool")
        wrong += [f"{k} {value[k]!r} is not a dict" for k in ("mixture", "balance")
                  if value.get(k) is not None and not isinstance(value[k], Mapping)]
        _refuse(wrong, "config")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(plan=int(value.get("plan", 1)), dataset=value["dataset"], seed=int(value["seed"]),
                   shuffle=bool(value["shuffle"]), shuffle_buffer=int(value["shuffle_buffer"]),
                   remainder=value["remainder"], batch_size=int(value["batch_size"]), rank=int(value["rank"]),
                   world_size=int(value["world_size"]), num_workers=int(value["num_workers"]),
                   mixture=value.get("mixture"), balance=value.get("balance"),
                   other={k: v for k, v in value.items() if k not in known})


@dataclass(frozen=True, slots=True)
class LoaderState:
    """What ``loader.state_dict()`` returns, as a record; :meth:`to_json` is that dict.

    Example:
        >>> config = LoaderConfig(plan=2, dataset="98f7b2cc94980b75", seed=7, shuffle=True, shuffle_buffer=256,
        ...                       remainder="drop", batch_size=2, rank=0, world_size=1, num_workers=0)
        >>> s = LoaderState(version=1, epoch=0, batches=5, workers=((0, 10, 10),), stats={}, config=config)
        >>> LoaderState.from_json(s.to_json()) == s, s.to_json()["workers"]
        (True, [[0, 10, 10]])
    """

    version: int
    #: the epoch, and the batches of it the loader handed out
    epoch: int
    batches: int
    #: per worker, ``(lap, emitted, yielded)`` of what was consumed
    workers: tuple[Worker, ...]
    #: the counters (``STAT_KEYS``) summed over workers and epochs
    stats: Mapping[str, int]
    config: LoaderConfig
    #: ``{"epoch", "basis"}`` until the end of an epoch resumed under another layout (:mod:`.elastic`)
    elastic: Mapping[str, Any] | None = None
    #: a mixture's save point: the rank's cursor per source and its continuation (``MixedSources.save_point``)
    mixture: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON, in the order loaders have always written it."""
        value: dict[str, Any] = {"version": self.version, "epoch": self.epoch, "batches": self.batches,
                                 "workers": [list(p) for p in self.workers], "stats": dict(self.stats),
                                 "config": self.config.to_json()}
        if self.elastic is not None:
            value["elastic"] = self.elastic
        if self.mixture is not None:
            value["mixture"] = self.mixture
        return value

    @classmethod
    def from_json(cls, value: Any) -> LoaderState:
        """The inverse of :meth:`to_json`, checked once: the version first, then the keys and their types."""
        if not isinstance(value, Mapping):
            raise ConfigError(f"a loader state is a dict (loader.state_dict()), not a {type(value).__name__}")
        if value.get("version") != STATE_VERSION:
            raise ConfigError(f"loader state version {value.get('version')!r} is not {STATE_VERSION}; it was saved "
                              "by another wdspack version")
        wrong = _missing(value, ("epoch", "batches", "workers", "config"))
        wrong += [f"{k} {value[k]!r} is not an int" for k in ("epoch", "batches")
                  if k in value and not _is_int(value[k])]
        workers = value.get("workers", [])
        if not isinstance(workers, Sequence) or not all(
                isinstance(p, Sequence) and len(p) == 3 and all(_is_int(v) for v in p) for p in workers):
            wrong.append(f"workers {workers!r} is not a list of [lap, emitted, yielded] per worker")
        stats = value.get("stats", {})
        if not isinstance(stats, Mapping) or not all(isinstance(k, str) and _is_int(v) for k, v in stats.items()):
            wrong.append(f"stats {stats!r} is not a dict of counters")
        wrong += [f"{k} {value[k]!r} is not a dict" for k in ("elastic", "mixture")
                  if value.get(k) is not None and not isinstance(value[k], Mapping)]
        _refuse(wrong, "")
        return cls(version=STATE_VERSION, epoch=int(value["epoch"]), batches=int(value["batches"]),
                   workers=tuple(tuple(int(v) for v in p) for p in workers),
                   stats={k: int(v) for k, v in stats.items()}, config=LoaderConfig.from_json(value["config"]),
                   elastic=value.get("elastic"), mixture=value.get("mixture"))


@dataclass(frozen=True, slots=True)
class LoaderPosition:
    """Where the loader stands, or goes on from after a restore."""

    epoch: int
    #: batches of ``epoch`` handed out (their turn picks the worker whose batch comes next)
    batches: int
    #: per worker, ``(lap, emitted, yielded)``
    workers: tuple[Worker, ...]
    #: the workers start from ``workers`` even at batch 0
    resume: bool
    #: the counters to count on from
    stats: Mapping[str, int]


def _is_int(v: Any) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)


def _missing(value: Mapping[str, Any], keys: Sequence[str]) -> list[str]:
    return [f"{k} is missing" for k in keys if k not in value]


def _refuse(wrong: list[str], where: str) -> None:
    if wrong:
        part = f"'s {where}" if where else ""
        raise ConfigError(f"the loader state{part} is damaged: {'; '.join(wrong)}; pass what loader.state_dict() "
                          "returned")


# -- saving ----------------------------------------------------------------------------------------


def loader_config(ds: PackedDataset, *, batch_size: int, num_workers: int) -> LoaderConfig:
    """What a state saved now is saved under."""
    shards = [(os.path.basename(u), n) for u, n in zip(ds.shards, (s.packs for s in ds.source.shards))]
    m = ds.manifest
    digest = hashlib.sha256(json.dumps([shards, [s.sha256 for s in m.shards] if m else None]).encode()).hexdigest()
    balance = None
    if ds.balance is not None:
        b = ds.balance
        run = ds.balance_run(ds.world_size, max(1, num_workers)) if ds.mixture is None else ds.mixture.run
        balance = {"kind": "cost", "cost_model": dataclasses.asdict(b.cost_model),
                   "heaviest_first": b.heaviest_first, "window": ds.balance_window, "run": run}
    return LoaderConfig(plan=PLAN_VERSION, dataset=digest[:16], seed=ds.seed, shuffle=ds.shuffle,
                        shuffle_buffer=ds.shuffle_buffer, remainder=ds.remainder, batch_size=batch_size,
                        rank=ds.rank, world_size=ds.world_size, num_workers=num_workers,
                        mixture=ds.mixture.config() if ds.mixture is not None else None, balance=balance)


def save_state(ds: PackedDataset, at: LoaderPosition, *, batch_size: int, num_workers: int) -> LoaderState:
    """The state of a loader over ``ds`` standing at ``at``; after an elastic resume, until that epoch ends,
    it also holds the layout the epoch came from."""
    workers = max(1, num_workers)
    config = loader_config(ds, batch_size=batch_size, num_workers=num_workers)
    elastic = ds.elastic()
    mixture = None
    if ds.mixture is not None:  # the rank's cursor per source, so another mixture can continue from here
        mixture = ds.mixture.save_point(
            rank=ds.rank, slots=ds.world_size * workers, workers=workers, epoch=at.epoch,
            emitted=[p[1] for p in at.workers], batch_size=batch_size, seed=ds.seed, shuffle=ds.shuffle,
            shuffle_buffer=ds.shuffle_buffer)
    return LoaderState(version=STATE_VERSION, epoch=at.epoch, batches=at.batches, workers=at.workers,
                       stats=at.stats, config=config,
                       elastic=elastic if elastic is not None and elastic["epoch"] == at.epoch else None,
                       mixture=mixture)


# -- which restore ---------------------------------------------------------------------------------


def restore(ds: PackedDataset, states: Sequence[LoaderState], *, batch_size: int, num_workers: int,
            started: bool) -> LoaderPosition:
    """Refuse ``states`` saved under another setup, else pick the kind of restore and return where to go on.

    ``started``: the DataLoader's workers already hold this loader's plan (a balance run can no longer change).
    """
    workers = max(1, num_workers)
    first = states[0]
    adopt_balance_run(ds, first.config, workers=workers, started=started)
    saved_config, now_config = first.config, loader_config(ds, batch_size=batch_size, num_workers=num_workers)
    if saved_config.plan != now_config.plan:
        raise ConfigError(f"the state was saved by a wdspack that splits shards over ranks and workers another way "
                          f"(plan {saved_config.plan}, this one {now_config.plan}), so its positions mean other "
                          f"packs here; finish epoch {first.epoch} with that version, or start the next one "
                          f"with loader.set_epoch({first.epoch + 1})")
    saved, now = saved_config.to_json(), now_config.to_json()
    diff = [f"{k}: saved {saved.get(k)!r}, now {now.get(k)!r}" for k in (*now, *(k for k in saved if k not in now))
            if k not in _LAYOUT and saved.get(k) != now.get(k)]
    mixed = [d for d in diff if d.startswith("mixture:")]
    if mixed and (ds.mixture is None or saved_config.mixture is None or first.mixture is None):
        raise ConfigError(f"cannot resume: the state was saved for another mixture ({mixed[0]}) by a loader that "
                          "kept no per-source cursors (a single dataset, or an older wdspack); restore "
                          "with the mixture that saved the state, or start the new mixture with "
                          f"loader.set_epoch({first.epoch + 1})")
    if mixed:  # a new continuation: other weights, sources added or removed (checked by name below)
        diff = [d for d in diff if not d.startswith(("mixture:", "dataset:"))]
        assert saved_config.mixture is not None and now_config.mixture is not None
        check_kept_sources(saved_config.mixture, now_config.mixture)
    if diff:
        raise ConfigError("cannot resume: the loader differs from the one that saved the state ("
                          + "; ".join(diff) + "); restore with the same settings (see PackedLoader's docstring)")
    mine = [s for s in states if s.config.rank == now_config.rank]
    same = (saved_config.world_size == now_config.world_size and saved_config.num_workers == now_config.num_workers
            and bool(mine))
    if not same and ds.mixture is not None:
        if saved_config.world_size == now_config.world_size and mine:
            return restore_other_workers(ds, mine[0], workers=workers, batch_size=batch_size)
        if mixed:
            raise ConfigError(f"the state was saved by {saved_config.world_size} ranks under another mixture "
                              f"({mixed[0]}); change the number of ranks and the mixture at two checkpoints: "
                              "resume under the saved mixture on the new ranks first (or the new mixture on "
                              f"{saved_config.world_size} ranks)")
        return restore_mixture_elastic(ds, states, workers=workers, batch_size=batch_size)
    if not same:
        return restore_elastic(ds, states, workers=workers, batch_size=batch_size)
    at = restore_same_layout(ds, mine[0], workers=workers)
    if ds.mixture is not None:
        at = restore_continuation(ds, mine[0], at, workers=workers, batch_size=batch_size, changed=bool(mixed))
    return at


def adopt_balance_run(ds: PackedDataset, saved: LoaderConfig, *, workers: int, started: bool) -> None:
    """A balance that chooses its run length resumes with the one the state was saved with."""
    run = (saved.balance or {}).get("run")
    if ds.balance is None or ds.balance.run is not None or run is None:
        return
    if ds.mixture is not None:  # its passes are dealt in runs: the saved run, for the cursors to mean the same
        if run != ds.mixture.run:
            ds.mixture.set_balance(ds.balance.cost_model, window=ds.balance_window,
                                   heaviest_first=ds.balance.heaviest_first, run=int(run))
        return
    if run != ds.balance_run(ds.world_size, workers):
        if started:
            raise ConfigError(f"the state was saved with balance run {run}; load it before the first batch "
                              f"(the workers already hold this loader's plan), or pass balance={{'run': {run}}}")
        ds.adopt_balance_run(int(run))


def check_kept_sources(saved: Mapping[str, Any], now: Mapping[str, Any]) -> None:
    """A source kept by name across a continuation must be the same data: its shards' pack counts."""
    before = dict(zip(saved["names"], saved["packs"]))
    for name, packs in zip(now["names"], now["packs"]):
        if name in before and list(before[name]) != list(packs):
            raise ConfigError(f"mixture source {name!r} had {sum(before[name])} packs in {len(before[name])} shards "
                              f"when the state was saved and has {sum(packs)} in {len(packs)} now, so its cursor "
                              "means other packs; give the new data another name (it then starts at its first "
                              "pass), or restore with the data that saved the state")


# -- the kinds of restore --------------------------------------------------------------------------


def restore_same_layout(ds: PackedDataset, state: LoaderState, *, workers: int) -> LoaderPosition:
    """The layout that saved ``state``: its positions as they are."""
    if len(state.workers) != workers:
        raise ConfigError(f"the state has {len(state.workers)} worker positions for {workers} workers")
    ds.set_elastic(state.elastic)
    return LoaderPosition(epoch=state.epoch, batches=state.batches, workers=state.workers, resume=True,
                          stats=state.stats)


def restore_continuation(ds: PackedDataset, state: LoaderState, at: LoaderPosition, *, workers: int,
                         batch_size: int, changed: bool) -> LoaderPosition:
    """A mixture's continuation: the saved one, an anchor at the saved epoch, or a new one (another mixture,
    or another number of workers on as many ranks) from ``at``."""
    mix = ds.mixture
    assert mix is not None
    if state.mixture is None:  # saved before continuations: every epoch chains from epoch 0, as then
        mix.set_continuation(None)
        return at
    epoch, batches, yielded = mix.resume_continuation(
        state.mixture, epoch=at.epoch, batches=at.batches, yielded=[p[2] for p in at.workers],
        workers=workers, batch_size=batch_size, changed=changed)
    if not changed:
        return at
    # the continuation's schedule starts after what each worker yielded
    at = LoaderPosition(epoch=epoch, batches=batches, workers=tuple((0, y, y) for y in yielded),
                        resume=bool(batches or any(yielded)), stats=at.stats)
    logger.info("mixture continuation: epoch %d continues from batch %d under %s on %d workers", at.epoch,
                at.batches, ", ".join(f"{n} {w:.3f}" for n, w in zip(mix.names, mix.mixture.shares)), workers)
    return at


def restore_other_workers(ds: PackedDataset, state: LoaderState, *, workers: int, batch_size: int) -> LoaderPosition:
    """A mixture's state saved by another number of workers on as many ranks: a continuation from this
    rank's cursors."""
    if state.mixture is None:
        raise ConfigError(f"the state was saved by {state.config.num_workers} workers by a wdspack that kept no "
                          "per-source cursors; restore with that many workers, or start the next epoch with "
                          f"loader.set_epoch({state.epoch + 1})")
    ds.set_elastic(None)
    at = LoaderPosition(epoch=state.epoch, batches=state.batches, workers=state.workers, resume=False,
                        stats=state.stats)
    return restore_continuation(ds, state, at, workers=workers, batch_size=batch_size, changed=True)


def restore_elastic(ds: PackedDataset, states: Sequence[LoaderState], *, workers: int,
                    batch_size: int) -> LoaderPosition:
    """A single dataset's state saved with other ranks or workers: the epoch's unread packs over this layout."""
    config = states[0].config
    world, saved_workers = config.world_size, config.num_workers
    epochs = {(s.epoch, s.batches) for s in states}
    if len(epochs) != 1 or any(s.config.world_size != world or s.config.num_workers != saved_workers
                               for s in states):
        raise ConfigError(f"the states disagree on the epoch, batches or layout ({sorted(epochs)}); pass the "
                          "states all ranks saved at one step")
    (epoch, batches), = epochs
    elastic = states[0].elastic
    prior = elastic["basis"] if elastic is not None and elastic["epoch"] == epoch else None
    by_rank = {s.config.rank: list(s.workers) for s in states}
    if len(states) > 1 and sorted(by_rank) != list(range(world)):
        raise ConfigError(f"got the states of ranks {sorted(by_rank)} of a {world}-rank run; pass all {world}, "
                          "or just one")
    if all(r in by_rank for r in range(world)):
        ranks = [by_rank[r] for r in range(world)]
    else:
        ranks = _lockstep(ds, states[0], world, max(1, saved_workers), epoch, prior)
    at = LoaderPosition(epoch=epoch, batches=0, workers=((0, 0, 0),) * workers, resume=False,
                        stats=states[0].stats if len(states) == 1 else {})
    if batches == 0 and prior is None:
        ds.set_elastic(None)  # at an epoch's start: nothing read yet, plan it whole
    else:
        basis = {"world_size": world, "num_workers": saved_workers, "ranks": [[list(p) for p in r] for r in ranks],
                 "basis": prior}
        ds.set_elastic({"epoch": epoch, "basis": basis})
        ds.load_offsets_if_split(workers, force=True)  # the rest starts mid-shard
    logger.info("elastic resume: epoch %d saved by %d ranks × %d workers continues on %d × %d (%d batches left "
                "on this rank)", epoch, world, saved_workers, ds.world_size, workers,
                _epoch_batches(ds, workers, epoch, batch_size))
    return at


def restore_mixture_elastic(ds: PackedDataset, states: Sequence[LoaderState], *, workers: int,
                            batch_size: int) -> LoaderPosition:
    """A mixture's state saved by other ranks: the rest of each source's unfinished passes over this
    layout (``MixedSources.elastic_continuation``), from every saved rank's cursors."""
    mix = ds.mixture
    assert mix is not None
    config = states[0].config
    world, saved_workers = config.world_size, max(1, config.num_workers)
    epochs = {(s.epoch, s.batches) for s in states}
    if len(epochs) != 1 or any(s.config.world_size != world or s.config.num_workers != config.num_workers
                               for s in states):
        raise ConfigError(f"the states disagree on the epoch, batches or layout ({sorted(epochs)}); pass the "
                          "states all ranks saved at one step")
    (epoch, batches), = epochs
    points = [s.mixture for s in states if s.mixture is not None]
    if len(points) != len(states):
        raise ConfigError(f"the state was saved by {world} ranks by a wdspack that kept no per-source cursors; "
                          f"restore with world_size={world}, or start the next epoch with "
                          f"loader.set_epoch({epoch + 1})")
    by_rank = {s.config.rank: point for s, point in zip(states, points)}
    if sorted(by_rank) == list(range(world)):
        points = [by_rank[r] for r in range(world)]
    elif len(states) == 1 and points[0].get("stage") is None and all(  # "stage": the continuation
            e == y for _, e, y in states[0].workers):
        # exactly recoverable: no continuation and no pack skipped, so every rank consumed the same batches
        # of the same chain from epoch 0, and the others' cursors follow from this one's positions
        mix.set_continuation(None)
        points = [mix.save_point(rank=r, slots=world * saved_workers, workers=saved_workers, epoch=epoch,
                                 emitted=[p[1] for p in states[0].workers], batch_size=batch_size,
                                 seed=ds.seed, shuffle=ds.shuffle, shuffle_buffer=ds.shuffle_buffer)
                  for r in range(world)]
    else:
        raise ConfigError(f"got the states of ranks {sorted(by_rank)} of a {world}-rank mixture run; a mixture "
                          f"resumed on {ds.world_size} ranks needs the states of all {world} (each rank's cursors "
                          "are within its own share of every pass): gather every rank's loader.state_dict() and "
                          "pass the list to load_state_dict on every new rank")
    epoch, short, yielded = mix.elastic_continuation(points, epoch=epoch, batches=batches, ranks=ds.world_size,
                                                     workers=workers, batch_size=batch_size,
                                                     seed=ds.seed, shuffle=ds.shuffle)
    ds.set_elastic(None)
    at = LoaderPosition(epoch=epoch, batches=short, workers=tuple((0, y, y) for y in yielded),
                        resume=bool(short or any(yielded)), stats=states[0].stats if len(states) == 1 else {})
    logger.info("elastic resume of a mixture: epoch %d saved by %d ranks × %d workers continues on %d × %d "
                "(%d batches left on this rank)", epoch, world, saved_workers, ds.world_size, workers,
                _epoch_batches(ds, workers, epoch, batch_size) - short)
    return at


def _lockstep(ds: PackedDataset, state: LoaderState, world: int, workers: int, epoch: int,
              prior: Mapping[str, Any] | None) -> list[list[Worker]]:
    """Every saved rank's worker positions from one rank's: they all consumed the same batches."""
    plan: EpochPlan = ds.layout_plan(world, workers, epoch, ds.consumed(epoch, prior) if prior is not None else None)
    return lockstep_positions(state.to_json(), plan, world=world, workers=workers)


def _epoch_batches(ds: PackedDataset, workers: int, epoch: int, batch_size: int) -> int:
    """``len(loader)`` of a loader over ``ds`` at ``epoch``."""
    return workers * ds.packs_per_slot(workers, epoch) // batch_size
