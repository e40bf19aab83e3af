"""A :class:`~wdspack.loader.dataset.PackedDataset` over a mixture: its sources opened, each slot's schedule planned.

    the rank's cursors (chained from epoch 0, or from a :class:`~.continuation.Continuation`)
      ─► plan_slot per segment (the rank's merge over its workers' batches; this worker's positions)
      ─► plan.reads: the slot's ranged reads, block after block ─► :mod:`.read`

Holds: every worker of a rank plans the same rank merge, so the rank's batches follow the weights
as one stream would and an epoch's end cursors are the rank's; a slot yields ``per_slot`` packs
even after corrupt skips (a longer schedule begins with the shorter one), and a restored position
recomputes the very same schedule; a resume under another mixture, number of workers or ranks
continues each source's pass, nothing within a pass read twice or skipped.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import ConfigError
from ...format.dataset import ResolvedSource, read_pack_index, resolve_source
from ...format.pack_index import COLUMNS
from ..balance import band_order
from ..batch.budgets import dataset_budgets
from ..elastic import SharedBasis
from ..options import ReadOptions
from .continuation import Continuation, mid_continuation
from .cursors import concat_plans, cursor_from_json, cursor_to_json, rank_cursors, renumber, shifted, take_positions
from .merge import SlotSchedule, plan_slot
from .rest import rest_layouts
from .spec import Mixture, MixtureEpoch, check_compatible, combined_source, mixture_epoch, unit_values
from .streams import SourceCursor, SourceLayout, source_layout

__all__ = ["MixedSources"]

logger = logging.getLogger(__name__)


class MixedSources:
    """The sources of a mixture, opened once in the main process (workers get a copy).

    Example:
        >>> mix = MixedSources.open([("a/", 1), ("b/", 1)], read=ReadOptions())  # doctest: +SKIP
        >>> mix.names, mix.per_slot(4, 2)  # doctest: +SKIP
        (('a', 'b'), 40)
    """

    def __init__(self, mixture: Mixture, sources: Sequence[ResolvedSource], layouts: Sequence[SourceLayout],
                 epoch: MixtureEpoch, offsets: Sequence[list[np.ndarray]], budgets: tuple[int, int, int]) -> None:
        self.mixture = mixture
        self.sources = tuple(sources)
        self.layouts = tuple(layouts)
        self.epoch = epoch
        self.offsets = tuple(offsets)
        self.seq_len, self.max_images, self.pad_token_id = budgets
        self.combined = combined_source(mixture, self.sources, self.max_images)
        self._starts: dict[tuple, list[tuple[SourceCursor, ...]]] = {}  # per slot setup: each epoch's cursors
        self._segs: dict[tuple, list[_Segment]] = {}  # per slot setup and epoch: its segments
        # the continuation the stream goes on from (set by a resume under another mixture; see continuation()),
        # as JSON in shared memory: persistent DataLoader workers read it at each iteration
        self._continuation = SharedBasis()
        self._rest: tuple[str, tuple[SourceLayout, ...]] | None = None  # the layouts with the continuation's rest
        self.rows: tuple[np.ndarray, ...] = ()  # each source's pack index (rows in manifest order)
        #: ``balance="cost"``: each source's pack costs, the window and heaviest_first (:meth:`set_balance`)
        self.balance: tuple[tuple[np.ndarray, ...], int, bool] | None = None
        self.run = 1  # packs per run a balanced pass is dealt in

    @classmethod
    def open(cls, value: Any, *, read: ReadOptions, seq_len: int | None = None, max_images: int | None = None,
             pad_token_id: int | None = None) -> MixedSources:
        """Resolve every source of ``value`` (anything :meth:`Mixture.of` takes), check that they can share
        a batch, and read their pack indexes (one request each)."""
        mixture = Mixture.of(value)
        kwargs = read.stream_kwargs()
        sources = tuple(resolve_source(s.path, storage_options=read.storage_options, **kwargs)
                        for s in mixture.sources)
        check_compatible(mixture.names, [s.manifest for s in sources])
        budgets = [dataset_budgets(s, seq_len, max_images, pad_token_id, read=kwargs) for s in sources]
        slots = max(b[1] for b in budgets)  # image slots sized for the fullest source
        layouts, offsets, units, packs, tables = [], [], [], [], []
        for name, src in zip(mixture.names, sources):
            assert src.manifest is not None  # check_compatible refuses sources without one
            if not src.manifest.pack_index:
                raise ConfigError(f"mixture source {name!r} ({src.display}) has no pack index (pack_index.npy), "
                                  "which the mixture's schedule weighs packs by; add one with `wdspack index "
                                  f"{src.display}` (reads the shards once, rewrites nothing else)")
            index = read_pack_index(src, **kwargs)
            rows = np.concatenate(index) if index else np.zeros((0, len(COLUMNS)), np.int64)
            tables.append(rows)
            values = unit_values(rows, mixture.unit)
            layouts.append(source_layout(name, [s.packs for s in src.shards], values))
            offsets.append([r[:, COLUMNS.index("offset")].copy() for r in index])
            units.append(int(values.sum()))
            packs.append(len(values))
        epoch = mixture_epoch(mixture, units, packs)
        logger.info("mixture of %d sources (%s, in %s): one epoch makes %s passes", len(sources),
                    ", ".join(f"{n} {w:.3f}" for n, w in zip(mixture.names, mixture.shares)), mixture.unit,
                    ", ".join(f"{n} {p:.3g}" for n, p in zip(mixture.names, epoch.passes)))
        mix = cls(mixture, sources, layouts, epoch, offsets, (budgets[0][0], slots, budgets[0][2]))
        mix.rows = tuple(tables)
        return mix

    @property
    def names(self) -> tuple[str, ...]:
        return self.mixture.names

    def set_balance(self, cost_model: Any, *, window: int, heaviest_first: bool = False, run: int = 1) -> None:
        """Balance every slot's windows by cost (``balance="cost"``; None: off): the schedule fixes which
        packs a rank reads, and each worker's window of ``window`` packs is sorted into cost bands run in
        the same order on every rank (:func:`~wdspack.loader.balance.band_order`), so a step's ranks run about the same
        cost while every window keeps the schedule's packs, hence its shares. For the ranks to hold
        alike costs, each source's pass is dealt to them by cost, in runs of ``run`` packs
        (:func:`~.streams.dealt_share`), instead of cut into consecutive runs.

        ``cost_model`` is a :class:`~wdspack.format.pack_index.CostModel` (its ``costs`` of the pack
        index rows)."""
        self.balance = None if cost_model is None else (
            tuple(cost_model.costs(rows) for rows in self.rows), int(window), bool(heaviest_first))
        costs = self.balance[0] if self.balance is not None else [None] * len(self.layouts)
        self.run = int(run)
        self.layouts = tuple(dataclasses.replace(layout, costs=c, run=int(run))
                             for layout, c in zip(self.layouts, costs))
        self._rest, self._starts, self._segs = None, {}, {}

    def per_slot(self, slots: int, batch_size: int, epoch: int | None = None) -> int:
        """Packs every slot yields per epoch: the mixture's, except in the epoch a continuation began in, which
        keeps the length it began with (:meth:`continuation`)."""
        c = self.continuation()
        if c is not None and epoch == c.epoch and c.length is not None:
            return c.length
        return self.epoch.per_slot(slots, batch_size)

    def buffer(self, shuffle_buffer: int) -> int:
        """Each source's shuffle buffer: the dataset's, shared out (a continuation keeps the one it began
        with: a cursor's emitted packs are a prefix of its blocks' buffer order)."""
        c = self.continuation()
        if c is not None:
            return c.buffer
        if self.balance is not None:  # a balanced share is read in its seeded order of cost rounds, as is
            return 1
        return max(1, shuffle_buffer // len(self.sources))

    def config(self) -> dict[str, Any]:
        """What a checkpoint of this mixture's stream depends on besides the dataset options."""
        config = {"names": list(self.names), "shares": [round(w, 12) for w in self.mixture.shares],
                  "unit": self.mixture.unit, "packs": [list(layout.counts) for layout in self.layouts]}
        if self.mixture.schedule:  # only then: states saved without one are unchanged
            config["schedule"] = [[step, [round(float(w[n]), 12) for n in self.names]]
                                  for step, w in self.mixture.schedule]
            config["every"] = self.mixture.every
        return config

    # -- continuations ----------------------------------------------------------------------------

    def mid_continuation(self, epoch: int) -> bool:
        """Whether a continuation began inside ``epoch`` (its schedule then runs from the continuation's cursors)."""
        return mid_continuation(self.continuation(), epoch)

    def continuation(self) -> Continuation | None:
        """The continuation the stream goes on from, or None (every epoch chained from epoch 0)."""
        value = self._continuation.get()
        return None if value is None else Continuation.from_json(value)

    def set_continuation(self, continuation: Continuation | None) -> None:
        """Publish ``continuation`` (None: none) to this process and the workers (persistent ones too)."""
        if continuation is not None and list(continuation.names) != list(self.names):
            raise ConfigError(f"the continuation is for sources {list(continuation.names)}, this mixture has "
                              f"{list(self.names)}")
        self._continuation.set(None if continuation is None else continuation.to_json())

    def active_layouts(self) -> tuple[SourceLayout, ...]:
        """The sources' layouts as the stream reads them: after an elastic resume with the rest of the
        passes the saved ranks left (:mod:`.rest`), else :attr:`layouts`."""
        c = self.continuation()
        rest = None if c is None else c.rest
        if rest is None:
            return self.layouts
        key = json.dumps(rest, sort_keys=True)
        if self._rest is None or self._rest[0] != key:
            self._rest = key, rest_layouts(self.layouts, self.names, rest)
        return self._rest[1]

    def _plan(self, n: int, cursors: Sequence[SourceCursor], *, slot: int, slots: int, workers: int,
              batch_size: int, seed: int, shuffle: bool, shuffle_buffer: int,
              shares: Sequence[float] | None = None) -> SlotSchedule:
        return plan_slot(self.active_layouts(), self.mixture.shares if shares is None else shares, slot=slot,
                         slots=slots, per_slot=n, seed=seed, cursors=cursors, shuffle=shuffle,
                         shuffle_buffer=self.buffer(shuffle_buffer), workers=workers, batch_size=batch_size,
                         own_shares=self.balance is not None)

    def _segments(self, *, rank: int, slots: int, workers: int, epoch: int, batch_size: int, seed: int,
                  shuffle: bool, shuffle_buffer: int) -> list[_Segment]:
        """The rank's plan of ``epoch`` (of its continuation's part, in that epoch) as segments of the rank's
        batches: one, or with a weight schedule one per ``every`` steps, each from the cursors the one
        before ended at (the rank's, workers numbered as in the epoch)."""
        kw: dict[str, Any] = dict(slots=slots, workers=workers, batch_size=batch_size, seed=seed, shuffle=shuffle,
                                  shuffle_buffer=shuffle_buffer)
        c = self.continuation()
        key = (rank, *kw.values(), epoch, self.buffer(shuffle_buffer), _key(c))
        if key in self._segs:
            return self._segs[key]
        total = workers * self.per_slot(slots, batch_size, epoch) // batch_size  # the rank's batches
        if c is not None and mid_continuation(c, epoch):
            first, start = sum(c.before) // batch_size, c.start
        else:
            first, start = 0, self.epoch_start(rank=rank, epoch=epoch, **kw)
        every = self.mixture.every if self.mixture.schedule else max(total, 1)
        cuts = [first, *range((first // every + 1) * every, total, every), total]
        segs: list[_Segment] = []
        per_epoch = workers * self.epoch.per_slot(slots, batch_size) // batch_size
        for t0, t1 in itertools.pairwise(cuts):
            # the weights at the segment's middle step (steps: epochs of this mixture's batches, then the batch)
            shares = self.mixture.shares_at(epoch * per_epoch + (t0 + t1) / 2)
            counts = [batch_size * len(range((w - t0) % workers + t0, t1, workers)) for w in range(workers)]
            # the last segment's end only when asked (the next epoch's start): most plans never need it
            end = _replay(self, start, counts, t0, shares, rank=rank, **kw) if t1 < total else None
            segs.append(_Segment(t0, t1, shares, start, end, counts))
            start = end  # type: ignore[assignment]
        if not segs:
            segs.append(_Segment(first, first, self.mixture.shares_at(0), start, start, [0] * workers))
        if len(self._segs) > 64:
            self._segs.clear()
        self._segs[key] = segs
        return segs

    def _end(self, *, rank: int, epoch: int, **kw: Any) -> tuple[SourceCursor, ...]:
        """Where the rank's plan of ``epoch`` ends (its last segment's end, computed once)."""
        segs = self._segments(rank=rank, epoch=epoch, **kw)
        last = segs[-1]
        if last.end is None:
            end = _replay(self, last.start, last.counts, last.t0, last.shares, rank=rank, **kw)
            segs[-1] = last = dataclasses.replace(last, end=end)
        assert last.end is not None
        return last.end

    def epoch_start(self, *, rank: int, slots: int, workers: int, epoch: int, batch_size: int, seed: int,
                    shuffle: bool, shuffle_buffer: int) -> tuple[SourceCursor, ...]:
        """The rank's cursors at the start of ``epoch`` (not the continuation's own epoch, unless an
        anchor), chained from epoch 0 or from the continuation's end; cached, so call it in the main process before the
        workers start and they inherit the chain."""
        kw: dict[str, Any] = dict(slots=slots, workers=workers, batch_size=batch_size, seed=seed, shuffle=shuffle,
                                  shuffle_buffer=shuffle_buffer)
        c = self.continuation()
        anchor = c is not None and c.anchor
        if c is not None and (epoch > c.epoch or (anchor and epoch == c.epoch)):
            first = c.epoch if anchor else c.epoch + 1
            key: tuple = (rank, *kw.values(), self.buffer(shuffle_buffer), _key(c))
        else:
            c, first = None, 0
            key = (rank, *kw.values(), self.buffer(shuffle_buffer), None)
        starts = self._starts.get(key)
        if starts is None:
            if c is None:
                origin = (SourceCursor(),) * len(self.layouts)
            elif anchor:
                origin = c.start
            else:
                origin = self._end(rank=rank, epoch=c.epoch, **kw)
            starts = self._starts[key] = [origin]
        while len(starts) <= epoch - first:  # every epoch starts where the one before left each source
            e = first + len(starts) - 1
            if self.mixture.schedule:
                starts.append(self._end(rank=rank, epoch=e, **kw))
            else:  # one segment: its plan's end (cheaper than the replay)
                n = self.epoch.per_slot(slots, batch_size)
                starts.append(self._plan(n, starts[-1], slot=rank * workers, **kw).end)
        return starts[epoch - first]

    def _cursors_at(self, *, rank: int, epoch: int, emitted: Sequence[int], **kw: Any) -> tuple[SourceCursor, ...]:
        """The rank's cursors once worker ``w`` emitted ``emitted[w]`` positions of the epoch's plan (of the
        continuation's part, counted from where it began, in that epoch)."""
        segs = self._segments(rank=rank, epoch=epoch, **kw)
        done = [int(e) for e in emitted]
        for seg in segs:
            now = [min(max(d, 0), c) for d, c in zip(done, seg.counts)]
            if now != seg.counts:
                return _replay(self, seg.start, now, seg.t0, seg.shares, rank=rank, **kw)
            done = [d - c for d, c in zip(done, seg.counts)]
        return self._end(rank=rank, epoch=epoch, **kw)

    def save_point(self, *, rank: int, slots: int, workers: int, epoch: int, emitted: Sequence[int], batch_size: int,
                   seed: int, shuffle: bool, shuffle_buffer: int) -> dict[str, Any]:
        """What a loader state keeps of the mixture (plain JSON): the rank's cursors (by source name) where
        its workers stand, the epoch's start cursors and length, each source's buffer, and the continuation
        (under ``"stage"``, the key states have always kept it under)."""
        kw: dict[str, Any] = dict(slots=slots, workers=workers, batch_size=batch_size, seed=seed, shuffle=shuffle,
                                  shuffle_buffer=shuffle_buffer)
        c = self.continuation()
        start: tuple[SourceCursor, ...] | None = None
        if c is not None and mid_continuation(c, epoch):
            emitted = [e - b for e, b in zip(emitted, c.before)]
        else:
            start = self.epoch_start(rank=rank, epoch=epoch, **kw)
        cursors = self._cursors_at(rank=rank, epoch=epoch, emitted=emitted, **kw)
        point = {"names": list(self.names), "cursors": [cursor_to_json(x) for x in cursors],
                 "start": None if start is None else [cursor_to_json(x) for x in start],
                 "length": self.per_slot(slots, batch_size, epoch), "buffer": self.buffer(shuffle_buffer),
                 "workers": workers, "stage": None if c is None else c.to_json()}
        if self.mid_window([e + b for e, b in zip(emitted, c.before)] if start is None and c is not None
                           else emitted, slots=slots, workers=workers, epoch=epoch, batch_size=batch_size):
            point["mid_window"] = True  # only then: other states are unchanged
        return point

    def resume_continuation(self, saved: Mapping[str, Any], *, epoch: int, batches: int, yielded: Sequence[int],
                            workers: int, batch_size: int, changed: bool) -> tuple[int, int, list[int]]:
        """Set the continuation a loader state goes on from (``saved``: its :meth:`save_point`, ``yielded``:
        what each of the saved workers yielded); returns the epoch, batches and each worker's yielded packs
        to continue from (``workers``: this loader's).

        Under the mixture and workers that saved it (``changed`` False) the saved continuation, or an anchor
        at the saved epoch's start cursors (so no worker replans the epochs before it). Under another mixture
        (new weights, sources added or removed) or another number of workers on as many ranks
        (``changed``), a new continuation begins where the rank stood: each source kept (by name) continues
        from its cursor, a new one starts at its first pass, and the epoch keeps the rank's batches; an epoch
        consumed whole, or not begun, makes an anchor instead.
        """
        old = {n: cursor_from_json(c) for n, c in zip(saved["names"], saved["cursors"])}
        if changed:
            _refuse_mid_window([saved])
        length, buffer, was = int(saved["length"]), int(saved["buffer"]), int(saved["workers"])
        kept = None if saved.get("stage") is None else Continuation.from_json(saved["stage"])
        # an elastic resume's rest of the passes: kept until the stream leaves them
        common: dict[str, Any] = dict(names=self.names, buffer=buffer, workers=workers,
                                      rest=None if kept is None else kept.rest)
        if not changed:
            if not mid_continuation(kept, epoch):
                kept = None if saved.get("start") is None else Continuation(
                    **common, epoch=epoch, start=tuple(cursor_from_json(c) for c in saved["start"]),
                    before=(0,) * workers, shift=0, length=None, anchor=True)
            self.set_continuation(kept)
            return epoch, batches, list(yielded)
        start = tuple(old.get(n, SourceCursor()) for n in self.names)  # workers numbered as in the epoch
        if all(y >= length for y in yielded) or batches == 0:  # at an epoch's end or start: an anchor
            epoch += batches > 0
            self.set_continuation(Continuation(**common, epoch=epoch, start=start, before=(0,) * workers, shift=0,
                                               length=None, anchor=True))
            return epoch, 0, [0] * workers
        if was != workers:
            # the rank's batches left, dealt over the new workers: the last round may be short, so the
            # workers it skips count one batch as yielded before the continuation (they come first, their
            # turn is taken: the continuation begins at worker `short`)
            left = was * length // batch_size - batches
            rounds = -(-left // workers)
            short = rounds * workers - left
            length, yielded, batches = rounds * batch_size, [batch_size] * short + [0] * (workers - short), short
        self.set_continuation(Continuation(**common, epoch=epoch, start=start, before=tuple(int(y) for y in yielded),
                                           shift=batches % workers, length=int(length), anchor=False))
        return epoch, batches, list(yielded)

    def elastic_continuation(self, saved: Sequence[Mapping[str, Any]], *, epoch: int, batches: int, ranks: int,
                             workers: int, batch_size: int, seed: int, shuffle: bool) -> tuple[int, int, list[int]]:
        """Set the continuation a run saved by ``len(saved)`` ranks goes on from on ``ranks`` ranks × ``workers``
        (``saved``: every saved rank's :meth:`save_point`, rank ``r``'s at ``r``, all at ``batches`` of
        ``epoch``); returns the epoch, batches and each worker's yielded packs to continue from.

        Each source's passes the saved ranks left unfinished continue as their rest (the packs no saved
        rank consumed, :mod:`.rest`), split over the new ranks; the new ranks' streams start at
        the first such pass. The rest of the epoch (the saved ranks' batches left, in all) is shared
        out evenly, rounded up, so every new rank makes as many batches; an epoch consumed whole, or
        not begun, makes an anchor at the next one's (this one's) start instead.
        """
        first = saved[0]
        _refuse_mid_window(saved)
        for key in ("names", "buffer", "length", "workers"):
            if any(p[key] != first[key] for p in saved):
                raise ConfigError(f"the ranks' states disagree on the mixture's {key!r}; pass the states all ranks "
                                  "saved at one step of one run")
        prior = [(p.get("stage") or {}).get("rest") for p in saved]
        if any(r != prior[0] for r in prior):
            raise ConfigError("the ranks' states hold different elastic rests; pass the states all ranks saved at "
                              "one step of one run")
        if list(first["names"]) != list(self.names):
            raise ConfigError(f"the states are for sources {first['names']}, this mixture has {list(self.names)}: "
                              "resume under the saved mixture first, then change it at a later checkpoint")
        length, buffer, was = int(first["length"]), int(first["buffer"]), int(first["workers"])
        rest = {"ranks": int(ranks), "old_ranks": len(saved), "seed": int(seed), "shuffle": bool(shuffle),
                "buffer": buffer, "prior": prior[0],
                "cursors": {n: [p["cursors"][i] for p in saved] for i, n in enumerate(self.names)}}
        layouts = rest_layouts(self.layouts, self.names, rest)
        start = tuple(SourceCursor(min(layout.rest) if layout.rest else 0, 0) for layout in layouts)
        common: dict[str, Any] = dict(names=self.names, buffer=buffer, workers=workers, rest=rest, start=start,
                                      epoch=epoch)
        total = was * length // batch_size  # a saved rank's batches in the epoch
        if batches >= total or batches == 0:  # at an epoch's end or start: an anchor
            common["epoch"] = epoch = epoch + (batches > 0)
            self.set_continuation(Continuation(**common, before=(0,) * workers, shift=0, length=None, anchor=True))
            return epoch, 0, [0] * workers
        mine = -(-len(saved) * (total - batches) // ranks)  # this rank's batches left
        rounds = -(-mine // workers)
        short = rounds * workers - mine  # the workers the last round skips count one batch as yielded before
        yielded = [batch_size] * short + [0] * (workers - short)
        self.set_continuation(Continuation(**common, before=tuple(yielded), shift=short % workers,
                                           length=rounds * batch_size, anchor=False))
        return epoch, short, yielded

    def schedule(self, *, slot: int, slots: int, workers: int, epoch: int, positions: int, batch_size: int,
                 seed: int, shuffle: bool, shuffle_buffer: int) -> SlotSchedule:
        """Slot ``slot``'s first ``positions`` packs of ``epoch`` (``per_slot`` of them, more after skips;
        in a continuation's epoch, of the continuation: counted from where it began).

        ``slot`` is ``rank * workers + worker``, ``slots`` is ``ranks * workers``, ``workers`` the
        DataLoader's workers per rank (at least 1) and ``batch_size`` its batch: the rank's merge runs
        over its workers' batches in the order the DataLoader yields them (:func:`.merge.plan_slot`).

        Example:
            >>> plan = ds.mixture.schedule(slot=1, slots=2, workers=2, epoch=0, positions=4, batch_size=2,
            ...                            seed=0, shuffle=True, shuffle_buffer=256)  # doctest: +SKIP
            >>> len(plan.source)  # worker 1's first 4 packs: the rank's batches 1 and 3  # doctest: +SKIP
            4
        """
        kw: dict[str, Any] = dict(slots=slots, workers=workers, batch_size=batch_size, seed=seed, shuffle=shuffle,
                                  shuffle_buffer=shuffle_buffer)
        rank, worker = divmod(slot, workers)
        if self.balance is not None:  # windows balanced whole: planned to the epoch's end at least
            limit = self._balance_limit(worker, slots=slots, workers=workers, epoch=epoch, batch_size=batch_size)
            wanted, positions = positions, max(positions, limit)
        segs = self._segments(rank=rank, epoch=epoch, **kw)
        parts, left = [], positions
        for k, seg in enumerate(segs):
            n = seg.counts[worker] if k + 1 < len(segs) else left  # the last one runs on (after skips)
            n = min(n, left)
            if n <= 0 and k + 1 < len(segs):
                continue
            role = rank * workers + (worker - seg.t0) % workers
            start = tuple(renumber(c, shifted(-seg.t0, workers)) for c in seg.start)
            parts.append(self._plan(n, start, slot=role, shares=seg.shares, **kw))
            left -= n
            if left <= 0:
                break
        plan = parts[0] if len(parts) == 1 else concat_plans(parts)
        if self.balance is None:
            return plan
        costs, window, heaviest = self.balance
        cost = np.zeros(len(plan.source), np.int64)
        for i, c in enumerate(costs):
            mine = plan.source == i
            cost[mine] = c[plan.row[mine]]
        order = band_order(cost, limit=min(limit, len(cost)), window=window, batch_size=batch_size, seed=seed,
                           epoch=epoch, heaviest_first=heaviest and not self.mid_continuation(epoch))
        return take_positions(plan, order[:wanted])

    def step_costs(self, costs: Sequence[np.ndarray], *, ranks: int, workers: int, batch_size: int, seed: int,
                   shuffle: bool, shuffle_buffer: int, epoch: int = 0) -> np.ndarray:
        """``[steps, ranks]``: the cost each rank runs at each step of ``epoch`` (``costs``: each source's pack
        costs, in manifest order), as the loader would emit it (balanced or not); no pack is read.

        Worker ``t % workers`` of every rank serves step ``t``; :func:`~wdspack.loader.balance.waiting` of the table is
        how long the slowest rank makes the steps take over the mean.
        """
        slots = ranks * workers
        per = self.per_slot(slots, batch_size, epoch)
        out = np.zeros((per // batch_size * workers, ranks), np.int64)
        for r in range(ranks):
            for w in range(workers):
                plan = self.schedule(slot=r * workers + w, slots=slots, workers=workers, epoch=epoch, positions=per,
                                     batch_size=batch_size, seed=seed, shuffle=shuffle, shuffle_buffer=shuffle_buffer)
                cost = np.zeros(len(plan.source), np.int64)
                for i, c in enumerate(costs):
                    mine = plan.source == i
                    cost[mine] = np.asarray(c)[plan.row[mine]]
                out[w::workers, r] = cost[:per // batch_size * batch_size].reshape(-1, batch_size).sum(1)
        return out

    def _balance_limit(self, worker: int, *, slots: int, workers: int, epoch: int, batch_size: int) -> int:
        """The positions of ``worker``'s plan that the balance reorders: its packs of the epoch (of the
        continuation's part, in that epoch)."""
        c = self.continuation()
        before = c.before[worker] if c is not None and mid_continuation(c, epoch) else 0
        return self.per_slot(slots, batch_size, epoch) - before

    def mid_window(self, emitted: Sequence[int], *, slots: int, workers: int, epoch: int, batch_size: int) -> bool:
        """Whether a worker of a balanced mixture stands inside a balance window (its cursors are then
        the schedule's, not what it consumed: a window is emitted in cost order)."""
        if self.balance is None:
            return False
        c = self.continuation()
        before = list(c.before) if c is not None and mid_continuation(c, epoch) else [0] * workers
        window = max(self.balance[1] // batch_size, 1) * batch_size
        return any(0 < e - b < self._balance_limit(w, slots=slots, workers=workers, epoch=epoch,
                                                   batch_size=batch_size) and (e - b) % window
                   for w, (e, b) in enumerate(zip(emitted, before)))


# ---------------------------------------------------------------------------------------------
# Segments and continuations


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class _Segment:
    """Rank batches ``[t0, t1)`` of an epoch planned with ``shares`` from ``start`` to ``end`` (the rank's
    cursors, workers numbered as in the epoch); ``counts``: each worker's positions in it."""

    t0: int
    t1: int
    shares: tuple[float, ...]
    start: tuple[SourceCursor, ...]
    end: tuple[SourceCursor, ...] | None  # None until asked for (the last segment's)
    counts: list[int]


def _replay(mix: MixedSources, start: Sequence[SourceCursor], counts: Sequence[int], t0: int,
            shares: Sequence[float], *, rank: int, slots: int, workers: int, batch_size: int, seed: int,
            shuffle: bool, shuffle_buffer: int) -> tuple[SourceCursor, ...]:
    """:func:`rank_cursors` for a segment beginning at the rank's batch ``t0`` (worker ``t0 % workers``
    plays role 0): ``start``, ``counts`` and the result with workers numbered as in the epoch."""
    roles = [counts[(u + t0) % workers] for u in range(workers)]
    begin = [renumber(c, lambda w: (w - t0) % workers) for c in start]
    end = rank_cursors(mix.active_layouts(), shares, begin, roles, rank=rank, ranks=slots // workers, workers=workers,
                       batch_size=batch_size, seed=seed, shuffle=shuffle, shuffle_buffer=mix.buffer(shuffle_buffer),
                       own_shares=mix.balance is not None)
    return tuple(renumber(c, lambda u: (u + t0) % workers) for c in end)


def _key(continuation: Continuation | None) -> str | None:
    """A continuation as a cache key."""
    return None if continuation is None else json.dumps(continuation.to_json(), sort_keys=True)


def _refuse_mid_window(saved: Sequence[Mapping[str, Any]]) -> None:
    if any(p.get("mid_window") for p in saved):
        raise ConfigError("the state was saved inside a balance window of a balanced mixture (balance='cost'), "
                          "where a worker has emitted part of its window in cost order, so its cursors do not say "
                          "which packs it consumed; resume it with the same mixture, ranks and workers, and change "
                          "them at a state saved at a window's end (every window / batch_size batches of each "
                          "worker) or an epoch's end")
