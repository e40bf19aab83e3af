"""``make_loader``: a ready, resumable DataLoader of fixed-shape batches.

Why not ``torchdata.StatefulDataLoader``: it is the ecosystem's resumable DataLoader, but it is
another dependency whose state is a snapshot of each worker's dataset state plus prefetch
bookkeeping. Here each worker's stream is a pure function of ``(manifest, seed, epoch, slot)``,
so a checkpoint is three integers per worker — ``(lap, emitted, yielded)`` — carried to the main
process inside every batch (a private key the loader strips before you see the batch). The main
process therefore knows exactly what was *consumed* (not what was prefetched), and a restore
hands those positions to the workers through a small shared-memory tensor that persistent
workers read at the start of each iteration. A stock ``torch.utils.data.DataLoader`` does the rest.

Batches come from the workers in turn (DataLoader's in-order round robin); every worker yields the
same number of full batches, so the round robin never stalls and every rank has ``len(loader)``
batches per epoch.

How a worker's batch travels, and the shared memory it reuses: :mod:`.batch.buffers`. Elastic resume (a
state saved under other ranks or workers): :mod:`.elastic`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader

from ..errors import ConfigError, suggest_keywords
from .batch.buffers import PixelBuffers
from .batch.collate_fn import LoaderCollate, check_pixel_dtype, resolve_max_segments
from .batch.packed_with import check_packed_with
from .dataset import META_KEY, STAT_KEYS, PackedDataset
from .elastic import lockstep_positions
from .mixture.spec import Mixture
from .options import Balance, ReadOptions

__all__ = ["PackedLoader", "make_loader"]

logger = logging.getLogger("wdspack.loader")
#: How shards are split over slots (:mod:`.plan`); a state saved under another split is refused.
#: 2: McNaughton's wrap-around (shards back to back, cut at slot boundaries).
PLAN_VERSION = 2
STATE_VERSION = 1


@suggest_keywords
def make_loader(source: str | os.PathLike[str] | Sequence[Any] | Mixture | PackedDataset, *, batch_size: int,
                num_workers: int = 2, seed: int = 0, shuffle: bool = True, shuffle_buffer: int = 256,
                rank: int | None = None, world_size: int | None = None, remainder: str = "drop",
                seq_len: int | None = None, max_images: int | None = None, pad_token_id: int | None = None,
                image_transform: Callable[[Sequence[bytes]], dict[str, torch.Tensor]] | None = None,
                processor: Any = None, text_only: bool = False,
                expect_tokenizer: str | Mapping[str, Any] | None = None, on_corrupt: str = "skip",
                read: ReadOptions | Mapping[str, Any] | None = None,
                balance: str | Balance | Mapping[str, Any] | None = None,
                attention_mask: str | None = None, padding_free: bool = False,
                max_segments: int | str | None = "auto", pin_memory: bool | None = None,
                persistent_workers: bool | None = None, prefetch_factor: int | None = None,
                multiprocessing_context: Any = None, timeout: float = 0,
                reuse_buffers: bool = True, pixel_dtype: str = "float32") -> PackedLoader:
    """A DataLoader of fixed-shape batches over a packed dataset, with ``state_dict`` / ``load_state_dict``.

    Args:
        source: anything :class:`PackedDataset` takes (one dataset or a mixture), or a dataset built
            already (then the dataset options below must stay at their defaults: they were the dataset's to take).
        batch_size: packs per batch (``B``); every batch is full.
        num_workers: DataLoader worker processes (0: read in this process).
        seed: the shuffling seed (the same on every rank).
        shuffle: shuffle shard order per epoch and packs through a buffer (both seeded).
        shuffle_buffer: packs held by the shuffle buffer per worker.
        rank: default from ``torch.distributed`` when initialised, else 0.
        world_size: default from ``torch.distributed`` when initialised, else 1.
        remainder: ``"drop"`` or ``"wrap"``: how ranks are evened out.
        seq_len: tokens per example; default the manifest's.
        max_images: image slots per example; default the manifest's.
        pad_token_id: default the manifest tokenizer's.
        image_transform: image bytes → tensors (``wdspack.make_image_transform``), for pixels.
        processor: the model's processor, for what its ``forward`` takes: the one the dataset was packed
            with (a processor with another image token or image layout is refused here, not in a worker:
            :mod:`.batch.packed_with`).
        text_only: stream an image dataset's text without pixels on purpose.
        expect_tokenizer: the tokenizer the training uses; a mismatch raises :class:`ConfigError`.
        on_corrupt: ``"skip"`` or ``"raise"`` for corrupt packs and truncated shards.
        read: how shards are read, a :class:`~wdspack.ReadOptions` or a dict of its fields
            (``read={"timeout": 10}`` is the network timeout, which ``timeout`` here is not).
        balance: ``"cost"``, a :class:`~wdspack.Balance` or a dict of its fields; evens out ranks and workers
            (batches are taken from workers in turn: 2 workers on image packs, busy 74 % → 92 % of the time).
        attention_mask, padding_free: passed to ``collate.collate_packs``.
        max_segments: ``cu_seqlens`` gets ``max_segments + 1`` entries in every batch (static shapes),
            padded with empty segments. ``"auto"``: ``batch_size × (max_samples_per_pack + 1)`` from
            the manifest (each pack's sub-samples plus its padding tail); ``None``: only the real segments.
        pin_memory: default True when CUDA is available.
        persistent_workers: default True when ``num_workers > 0``.
        prefetch_factor, multiprocessing_context, timeout: passed to the DataLoader (``timeout``: seconds
            to wait for a worker's batch).
        reuse_buffers: with workers, each keeps ``prefetch_factor + 3`` ``pixel_values`` tensors in
            shared memory and writes a later batch into one once this process holds no view of it
            any more (new shared memory costs a page fault per 4 KiB: about a third of a worker's
            time). Pass False if batches go on to *other* processes uncopied (the main process
            cannot see when those let go).
        pixel_dtype: ``"float32"``: ``pixel_values`` arrive normalised. ``"uint8"``: the workers ship
            the decoded, resized bytes un-normalised, a quarter of the bytes through shared memory and
            to the device; finish each batch there with :func:`wdspack.normalize_pixels` (equal to the
            float32 path to float rounding; empty slots and padding rows zero in both). With the
            built-in ``image_transform``, or a ``processor`` of the Qwen-VL families (flattened
            patches); other processors lay out float pixels themselves and refuse it.

    Example:
        >>> loader = make_loader("hf://datasets/my-org/llava-packed@main", batch_size=8)  # doctest: +SKIP
        >>> for step, batch in enumerate(loader):  # doctest: +SKIP
        ...     loss = model(**batch).loss
        ...     if step % 1000 == 0:
        ...         torch.save({"model": model.state_dict(), "data": loader.state_dict()}, "ckpt.pt")
    """
    options = {"seed": seed, "shuffle": shuffle, "shuffle_buffer": shuffle_buffer, "rank": rank,
               "world_size": world_size, "remainder": remainder, "seq_len": seq_len, "max_images": max_images,
               "pad_token_id": pad_token_id, "image_transform": image_transform, "processor": processor,
               "text_only": text_only, "expect_tokenizer": expect_tokenizer, "on_corrupt": on_corrupt,
               "read": read, "balance": balance}
    if isinstance(source, PackedDataset):
        given = sorted(k for k, v in options.items() if v is not _DATASET_DEFAULTS[k] and v != _DATASET_DEFAULTS[k])
        if given:
            raise ConfigError(f"dataset options {given} were given with a dataset built already; "
                              "pass them to PackedDataset instead")
        if source.batch_size != batch_size:
            raise ConfigError(f"the dataset was built with batch_size={source.batch_size}, the loader has "
                              f"{batch_size}; they must agree so every rank gets the same number of full batches")
        dataset = source
    else:
        dataset = PackedDataset(source, batch_size=batch_size, **options)
    return PackedLoader(dataset, batch_size=batch_size, num_workers=num_workers, attention_mask=attention_mask,
                        padding_free=padding_free, max_segments=max_segments, pin_memory=pin_memory,
                        persistent_workers=persistent_workers,
                        prefetch_factor=prefetch_factor, multiprocessing_context=multiprocessing_context,
                        timeout=timeout, reuse_buffers=reuse_buffers, pixel_dtype=pixel_dtype)


#: PackedDataset's defaults of the options make_loader passes on (to tell "given" from "left alone").
_DATASET_DEFAULTS = {name: p.default for name, p in inspect.signature(PackedDataset.__init__).parameters.items()
                     if p.default is not inspect.Parameter.empty}


class PackedLoader:
    """Iterate batches; ``state_dict()`` after any batch, ``load_state_dict()`` in a fresh loader to continue.

    Each ``for batch in loader`` continues the stream where the last one stopped (after a
    ``break`` too) and moves to the next epoch once an epoch is consumed; ``set_epoch`` jumps.

    What may change between save and restore: the data's location (a local copy instead of the
    Hub, a mirror), ``block_size``, ``retries``, ``pin_memory``, ``prefetch_factor``, the image
    transform, ``pixel_dtype`` and the process. What may not (restore refuses, naming the field): the dataset's
    shards, ``seed``, ``shuffle``, ``shuffle_buffer``, ``remainder``, ``batch_size`` and the balance
    settings. Rank, world size and ``num_workers`` may: the rest of the epoch is then re-split
    (elastic resume, see :meth:`load_state_dict`).
    """

    def __init__(self, dataset: PackedDataset, *, batch_size: int, num_workers: int = 2,
                 attention_mask: str | None = None, padding_free: bool = False,
                 max_segments: int | str | None = "auto", pin_memory: bool | None = None,
                 persistent_workers: bool | None = None, prefetch_factor: int | None = None,
                 multiprocessing_context: Any = None, timeout: float = 0, reuse_buffers: bool = True,
                 pixel_dtype: str = "float32") -> None:
        if num_workers < 0:
            raise ConfigError(f"num_workers={num_workers} must be >= 0")
        self.pixel_dtype = check_pixel_dtype(pixel_dtype, dataset)
        check_packed_with(dataset)  # here, not in worker 0's first batch
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.num_workers = int(num_workers)
        self._workers = max(1, self.num_workers)
        dataset.with_position = True
        self.max_segments = resolve_max_segments(max_segments, dataset, self.batch_size)
        extra = {} if self.num_workers == 0 else {
            "persistent_workers": True if persistent_workers is None else persistent_workers,
            "prefetch_factor": prefetch_factor, "multiprocessing_context": multiprocessing_context}
        reuse = reuse_buffers and self.num_workers > 0
        buffers = PixelBuffers(self.num_workers, (prefetch_factor or 2) + 3) if reuse else None
        self.dataloader = DataLoader(
            dataset, batch_size=self.batch_size, num_workers=self.num_workers, drop_last=True, timeout=timeout,
            collate_fn=LoaderCollate(attention_mask=attention_mask, padding_free=padding_free,
                                max_segments=self.max_segments, buffers=buffers, pixel_dtype=self.pixel_dtype),
            pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory, **extra)
        self._epoch = dataset.epoch
        self._positions: list[tuple[int, ...]] = [(0, 0, 0)] * self._workers  # (lap, emitted, yielded) per worker
        self._batches = 0
        self._resume = False
        self._stats_base: Counter = Counter()
        self._stats_live: dict[int, Counter] = {}
        len(self)  # fail now when there are too few packs for ranks × workers × batch_size
        dataset.load_offsets_if_split(self._workers)  # before workers copy the dataset

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        return self._workers * self.dataset.packs_per_slot(self._workers, self._epoch) // self.batch_size

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def source_names(self) -> tuple[str, ...]:
        """The sources' names, indexed by each batch's ``source_idx`` (one dataset: one name)."""
        return self.dataset.source_names

    @property
    def stats(self) -> dict[str, int]:
        """Counters summed over workers and epochs: corrupt_packs, truncated_shards, ignored_members, retries, ..."""
        total = Counter(self._stats_base)
        for c in self._stats_live.values():
            total.update(c)
        return {k: int(total[k]) for k in STAT_KEYS}

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning at the next iteration."""
        mix = self.dataset.mixture
        if mix is not None and mix.mid_continuation(int(epoch)):
            raise ConfigError(f"epoch {epoch} began under another mixture or layout (a resume began inside it), so its "
                              f"beginning cannot be replayed here; go on with it, or set_epoch({int(epoch) + 1})")
        self.dataset.set_elastic(None)
        self._epoch, self._batches, self._resume = int(epoch), 0, False
        self._positions = [(0, 0, 0)] * self._workers

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        self._fold_stats()
        self.dataset._publish(self._epoch, self._positions if self._batches or self._resume else None,
                              shift=self._batches % self._workers)
        epoch_len = len(self)
        if epoch_len == 0:  # an elastic resume that left nothing for this layout: go on with the next epoch
            self._next_epoch()
            self.dataset._publish(self._epoch, None)
            epoch_len = len(self)
        mix = self.dataset.mixture
        if (mix is not None and self.num_workers > 0 and getattr(self.dataloader, "_iterator", None) is None
                and not mix.mid_continuation(self._epoch)):
            ds = self.dataset  # the epoch's start cursors, computed once here: the workers inherit them
            mix.epoch_start(rank=ds.rank, slots=ds.world_size * self._workers, workers=self._workers,
                            epoch=self._epoch, batch_size=self.batch_size, seed=ds.seed, shuffle=ds.shuffle,
                            shuffle_buffer=ds.shuffle_buffer)
        for batch in self.dataloader:
            meta = batch.pop(META_KEY)
            self._note(meta)
            if self._batches >= epoch_len:
                self._next_epoch()
            yield batch

    def _note(self, meta: torch.Tensor) -> None:
        last = [int(v) for v in meta[-1]]
        worker, epoch = last[0], last[1]
        if epoch != self._epoch:
            raise RuntimeError(f"a batch of epoch {epoch} arrived in epoch {self._epoch}; this is a wdspack bug")
        self._positions[worker] = (last[2], last[3], last[4])
        self._stats_live[worker] = Counter(dict(zip(STAT_KEYS, last[5:])))
        self._batches += 1

    def _next_epoch(self) -> None:
        self._epoch += 1
        self._batches, self._resume = 0, False
        self._positions = [(0, 0, 0)] * self._workers

    def _fold_stats(self) -> None:
        for c in self._stats_live.values():
            self._stats_base.update(c)
        self._stats_live = {}

    # -- checkpoints ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """A small JSON-able dict: epoch, batches consumed in it, each worker's position, counters, config.

        After an elastic resume, until that epoch ends, it also holds the layout the epoch came from.
        """
        state = {"version": STATE_VERSION, "epoch": self._epoch, "batches": self._batches,
                 "workers": [list(p) for p in self._positions], "stats": self.stats, "config": self._config()}
        elastic = self.dataset.elastic()
        if elastic is not None and elastic["epoch"] == self._epoch:
            state["elastic"] = elastic
        ds = self.dataset
        if ds.mixture is not None:  # the rank's cursor per source, so another mixture can continue from here
            state["mixture"] = ds.mixture.save_point(
                rank=ds.rank, slots=ds.world_size * self._workers, workers=self._workers, epoch=self._epoch,
                emitted=[p[1] for p in self._positions], batch_size=self.batch_size, seed=ds.seed,
                shuffle=ds.shuffle, shuffle_buffer=ds.shuffle_buffer)
        return state

    def load_state_dict(self, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Continue from ``state`` at the next iteration; refuses a state from another setup.

        The state of a run with other ranks or workers resumes **elastically**: the rest of the
        saved epoch (every pack it has not read yet) is split over this layout, and later epochs
        follow this layout. Pass the states of *all* the saved ranks (a list, any order) for an
        exact rest; one state alone also works when no pack was skipped as corrupt (every rank
        consumed the same batches, so the others' positions follow from this one's).

        A mixture resumes under another number of workers from this rank's state (its cursor per
        source), and under another number of ranks from *all* the saved ranks' states: each source's
        unfinished passes continue as their rest (the packs no saved rank consumed) split over the new
        ranks, then the following passes as usual, nothing within a pass read twice or skipped, and
        the saved ranks' batches left shared out evenly (``MixedSources.elastic_continuation``). One state
        alone is refused there unless the others follow from it (no continuation began and no pack was
        skipped).
        """
        states = [state] if isinstance(state, Mapping) else list(state)
        if not states:
            raise ConfigError("load_state_dict got an empty list of states")
        for s in states:
            if s.get("version") != STATE_VERSION:
                raise ConfigError(f"loader state version {s.get('version')!r} is not {STATE_VERSION}; it was saved "
                                  "by another wdspack version")
        layout = ("rank", "world_size", "num_workers")
        self._adopt_balance_run(states[0]["config"])
        saved, now = states[0]["config"], self._config()
        if saved.get("plan") != now["plan"]:
            raise ConfigError(f"the state was saved by a wdspack that splits shards over ranks and workers another way "
                              f"(plan {saved.get('plan', 1)}, this one {now['plan']}), so its positions mean other "
                              f"packs here; finish epoch {states[0]['epoch']} with that version, or start the next one "
                              f"with loader.set_epoch({int(states[0]['epoch']) + 1})")
        diff = [f"{k}: saved {saved.get(k)!r}, now {now.get(k)!r}" for k in (*now, *(k for k in saved if k not in now))
                if k not in layout and saved.get(k) != now.get(k)]
        mixed = [d for d in diff if d.startswith("mixture:")]
        if mixed and (self.dataset.mixture is None or saved.get("mixture") is None or "mixture" not in states[0]):
            raise ConfigError(f"cannot resume: the state was saved for another mixture ({mixed[0]}) by a loader that "
                              "kept no per-source cursors (a single dataset, or an older wdspack); restore "
                              "with the mixture that saved the state, or start the new mixture with "
                              f"loader.set_epoch({int(states[0]['epoch']) + 1})")
        if mixed:  # a new continuation: other weights, sources added or removed (checked by name below)
            diff = [d for d in diff if not d.startswith(("mixture:", "dataset:"))]
            _check_kept_sources(saved["mixture"], now["mixture"])
        if diff:
            raise ConfigError("cannot resume: the loader differs from the one that saved the state ("
                              + "; ".join(diff) + "); restore with the same settings (see PackedLoader's docstring)")
        mine = [s for s in states if s["config"]["rank"] == now["rank"]]
        same = all(saved[k] == now[k] for k in ("world_size", "num_workers")) and mine
        if not same and self.dataset.mixture is not None and saved["world_size"] == now["world_size"] and mine:
            # another number of workers on as many ranks: a continuation from this rank's cursors
            state = mine[0]
            if "mixture" not in state:
                raise ConfigError(f"the state was saved by {saved['num_workers']} workers by a wdspack that kept no "
                                  "per-source cursors; restore with that many workers, or start the next epoch with "
                                  f"loader.set_epoch({int(state['epoch']) + 1})")
            self.dataset.set_elastic(None)
            self._epoch, self._batches = int(state["epoch"]), int(state["batches"])
            self._positions = [tuple(int(v) for v in p) for p in state["workers"]]
            self._stats_base, self._stats_live = Counter(state.get("stats", {})), {}
            self._restore_continuation(state, changed=True)
            return
        if not same and self.dataset.mixture is not None:
            if mixed:
                raise ConfigError(f"the state was saved by {saved['world_size']} ranks under another mixture "
                                  f"({mixed[0]}); change the number of ranks and the mixture at two checkpoints: "
                                  "resume under the saved mixture on the new ranks first (or the new mixture on "
                                  f"{saved['world_size']} ranks)")
            self._restore_mixture_elastic(states)
            return
        if same:
            self._restore(mine[0])
            if self.dataset.mixture is not None:
                self._restore_continuation(mine[0], changed=bool(mixed))
        else:
            self._restore_elastic(states)

    def _restore_mixture_elastic(self, states: list[Mapping[str, Any]]) -> None:
        """A mixture's state saved by other ranks: the rest of each source's unfinished passes over this
        layout (``MixedSources.elastic_continuation``), from every saved rank's cursors."""
        ds, mix = self.dataset, self.dataset.mixture
        assert mix is not None
        config = states[0]["config"]
        world, workers = int(config["world_size"]), max(1, int(config["num_workers"]))
        epochs = {(int(s["epoch"]), int(s["batches"])) for s in states}
        if len(epochs) != 1 or any(s["config"]["world_size"] != world or s["config"]["num_workers"] != config[
                "num_workers"] for s in states):
            raise ConfigError(f"the states disagree on the epoch, batches or layout ({sorted(epochs)}); pass the "
                              "states all ranks saved at one step")
        (epoch, batches), = epochs
        if any("mixture" not in s for s in states):
            raise ConfigError(f"the state was saved by {world} ranks by a wdspack that kept no per-source cursors; "
                              f"restore with world_size={world}, or start the next epoch with "
                              f"loader.set_epoch({epoch + 1})")
        by_rank = {int(s["config"]["rank"]): s for s in states}
        if sorted(by_rank) == list(range(world)):
            points = [by_rank[r]["mixture"] for r in range(world)]
        elif len(states) == 1 and states[0]["mixture"].get("stage") is None and all(  # "stage": the continuation
                int(p[1]) == int(p[2]) for p in states[0]["workers"]):
            # exactly recoverable: no continuation and no pack skipped, so every rank consumed the same batches
            # of the same chain from epoch 0, and the others' cursors follow from this one's positions
            mix.set_continuation(None)
            points = [mix.save_point(rank=r, slots=world * workers, workers=workers, epoch=epoch,
                                     emitted=[int(p[1]) for p in states[0]["workers"]], batch_size=self.batch_size,
                                     seed=ds.seed, shuffle=ds.shuffle, shuffle_buffer=ds.shuffle_buffer)
                      for r in range(world)]
        else:
            raise ConfigError(f"got the states of ranks {sorted(by_rank)} of a {world}-rank mixture run; a mixture "
                              f"resumed on {ds.world_size} ranks needs the states of all {world} (each rank's cursors "
                              "are within its own share of every pass): gather every rank's loader.state_dict() and "
                              "pass the list to load_state_dict on every new rank")
        epoch, short, yielded = mix.elastic_continuation(points, epoch=epoch, batches=batches, ranks=ds.world_size,
                                                         workers=self._workers, batch_size=self.batch_size,
                                                         seed=ds.seed, shuffle=ds.shuffle)
        ds.set_elastic(None)
        self._stats_base, self._stats_live = Counter(states[0].get("stats", {}) if len(states) == 1 else {}), {}
        self._epoch, self._batches = epoch, short
        self._positions = [(0, y, y) for y in yielded]
        self._resume = bool(short or any(yielded))
        logger.info("elastic resume of a mixture: epoch %d saved by %d ranks × %d workers continues on %d × %d "
                    "(%d batches left on this rank)", epoch, world, workers, ds.world_size, self._workers,
                    len(self) - short)

    def _adopt_balance_run(self, saved: Mapping[str, Any]) -> None:
        """A balance that chooses its run length resumes with the one the state was saved with."""
        ds, run = self.dataset, (saved.get("balance") or {}).get("run")
        if ds.balance is None or ds.balance.run is not None or run is None:
            return
        if ds.mixture is not None:  # its passes are dealt in runs: the saved run, for the cursors to mean the same
            if run != ds.mixture.run:
                ds.mixture.set_balance(ds.balance.cost_model, window=ds.balance_window,
                                       heaviest_first=ds.balance.heaviest_first, run=int(run))
            return
        if run != ds.balance_run(ds.world_size, self._workers):
            if getattr(self.dataloader, "_iterator", None) is not None:
                raise ConfigError(f"the state was saved with balance run {run}; load it before the first batch "
                                  f"(the workers already hold this loader's plan), or pass balance={{'run': {run}}}")
            ds.adopt_balance_run(int(run))

    def _restore_continuation(self, state: Mapping[str, Any], *, changed: bool) -> None:
        """A mixture's continuation: the saved one, an anchor at the saved epoch, or a new one (another mixture,
        or another number of workers on as many ranks)."""
        mix = self.dataset.mixture
        assert mix is not None
        if "mixture" not in state:  # saved before continuations: every epoch chains from epoch 0, as then
            mix.set_continuation(None)
            return
        epoch, batches, yielded = mix.resume_continuation(
            state["mixture"], epoch=self._epoch, batches=self._batches, yielded=[p[2] for p in self._positions],
            workers=self._workers, batch_size=self.batch_size, changed=changed)
        if changed:  # the continuation's schedule starts after what each worker yielded
            self._positions = [(0, y, y) for y in yielded]
            self._epoch, self._batches, self._resume = epoch, batches, bool(batches or any(yielded))
            logger.info("mixture continuation: epoch %d continues from batch %d under %s on %d workers", self._epoch,
                        self._batches, ", ".join(f"{n} {w:.3f}" for n, w in zip(mix.names, mix.mixture.shares)),
                        self._workers)

    def _restore(self, state: Mapping[str, Any]) -> None:
        workers = [tuple(int(v) for v in p) for p in state["workers"]]
        if len(workers) != self._workers:
            raise ConfigError(f"the state has {len(workers)} worker positions for {self._workers} workers")
        self.dataset.set_elastic(state.get("elastic"))
        self._epoch, self._batches, self._positions = int(state["epoch"]), int(state["batches"]), workers
        self._resume = True
        self._stats_base, self._stats_live = Counter(state.get("stats", {})), {}

    def _restore_elastic(self, states: list[Mapping[str, Any]]) -> None:
        """Resume a state saved with other ranks or workers: the epoch's unread packs over this layout."""
        config = states[0]["config"]
        world, workers = int(config["world_size"]), int(config["num_workers"])
        epochs = {(int(s["epoch"]), int(s["batches"])) for s in states}
        if len(epochs) != 1 or any(s["config"]["world_size"] != world or s["config"]["num_workers"] != workers
                                   for s in states):
            raise ConfigError(f"the states disagree on the epoch, batches or layout ({sorted(epochs)}); pass the "
                              "states all ranks saved at one step")
        (epoch, batches), = epochs
        elastic = [s.get("elastic") for s in states]
        prior = elastic[0]["basis"] if elastic[0] is not None and elastic[0]["epoch"] == epoch else None
        by_rank = {int(s["config"]["rank"]): [tuple(int(v) for v in p) for p in s["workers"]] for s in states}
        if len(states) > 1 and sorted(by_rank) != list(range(world)):
            raise ConfigError(f"got the states of ranks {sorted(by_rank)} of a {world}-rank run; pass all {world}, "
                              "or just one")
        if all(r in by_rank for r in range(world)):
            ranks = [by_rank[r] for r in range(world)]
        else:
            ranks = self._lockstep(states[0], world, max(1, workers), epoch, prior)
        self._stats_base, self._stats_live = Counter(states[0].get("stats", {}) if len(states) == 1 else {}), {}
        self._epoch, self._batches, self._resume = epoch, 0, False
        self._positions = [(0, 0, 0)] * self._workers
        if batches == 0 and prior is None:
            self.dataset.set_elastic(None)  # at an epoch's start: nothing read yet, plan it whole
        else:
            basis = {"world_size": world, "num_workers": workers, "ranks": [[list(p) for p in r] for r in ranks],
                     "basis": prior}
            self.dataset.set_elastic({"epoch": epoch, "basis": basis})
            self.dataset.load_offsets_if_split(self._workers, force=True)  # the rest starts mid-shard
        logger.info("elastic resume: epoch %d saved by %d ranks × %d workers continues on %d × %d (%d batches left "
                    "on this rank)", epoch, world, workers, self.dataset.world_size, self._workers, len(self))

    def _lockstep(self, state: Mapping[str, Any], world: int, workers: int, epoch: int, prior) -> list[list[tuple]]:
        """Every saved rank's worker positions from one rank's: they all consumed the same batches."""
        ds = self.dataset
        if prior is not None:
            plan = ds._layout_plan(world, workers, epoch, ds.consumed(epoch, prior))
        else:
            plan = ds._layout_plan(world, workers, epoch, None)
        return lockstep_positions(state, plan, world=world, workers=workers)

    def _config(self) -> dict[str, Any]:
        ds = self.dataset
        shards = [(os.path.basename(u), n) for u, n in zip(ds.shards, (s.packs for s in ds._source.shards))]
        m = ds.manifest
        digest = hashlib.sha256(json.dumps([shards, [s.sha256 for s in m.shards] if m else None]).encode()).hexdigest()
        config = {"plan": PLAN_VERSION, "dataset": digest[:16], "seed": ds.seed, "shuffle": ds.shuffle,
                  "shuffle_buffer": ds.shuffle_buffer, "remainder": ds.remainder, "batch_size": self.batch_size,
                  "rank": ds.rank, "world_size": ds.world_size, "num_workers": self.num_workers}
        if ds.mixture is not None:  # only then: a single dataset's state is unchanged
            config["mixture"] = ds.mixture.config()
        if ds.balance is not None:  # only then: states saved without balance stay loadable
            b = ds.balance
            run = ds.balance_run(ds.world_size, self._workers) if ds.mixture is None else ds.mixture.run
            config["balance"] = {"kind": "cost", "cost_model": dataclasses.asdict(b.cost_model),
                                 "heaviest_first": b.heaviest_first, "window": ds.balance_window, "run": run}
        return config


def _check_kept_sources(saved: Mapping[str, Any], now: Mapping[str, Any]) -> None:
    """A source kept by name across a continuation must be the same data: its shards' pack counts."""
    before = dict(zip(saved["names"], saved["packs"]))
    for name, packs in zip(now["names"], now["packs"]):
        if name in before and list(before[name]) != list(packs):
            raise ConfigError(f"mixture source {name!r} had {sum(before[name])} packs in {len(before[name])} shards "
                              f"when the state was saved and has {sum(packs)} in {len(packs)} now, so its cursor "
                              "means other packs; give the new data another name (it then starts at its first "
                              "pass), or restore with the data that saved the state")
