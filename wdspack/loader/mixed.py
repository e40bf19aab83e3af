"""A :class:`~.dataset.PackedDataset` over a mixture: its sources opened, and one slot's packs read in
the schedule's order (DESIGN.md section 8; the pure parts are :mod:`.mixture` and :mod:`.schedule`).

Per ``(rank, worker)`` slot and epoch::

    the rank's cursors (chained from epoch 0) ─► plan_slot (the rank's merge over its workers'
    batches in the DataLoader's round robin; this worker's positions) ─► per source: the slot's
    ranged reads (``plan.reads``: its blocks of the rank's share, pass after pass) ─► the
    schedule's positions, each taken from its source's read-ahead ─► decode_packs ─► example
    (+ ``source_idx``)

Each source reads only the packs this worker's positions need: the blocks of the rank's share the
schedule handed this worker, each as ranged reads from its first needed pack to its last (opened
at the pack's byte offset from the pack index), so no pack is read by two workers of a rank. A
block's packs leave in its shuffle-buffer order, so what a source has read ahead and not yet given
is at most its buffer (``max(1, shuffle_buffer // sources)`` packs): the mixture holds about
``shuffle_buffer`` packs, as one dataset does.

The number of workers ``W`` is the DataLoader's (``get_worker_info()``; 1 without workers): every
worker of a rank plans the same rank merge, so the rank's batches, worker ``w``'s being the rank's
``w, w + W, ...``, follow the weights as one stream would, and the cursors an epoch ends at are
the rank's.

The position of a slot is ``(0, emitted, yielded)``: ``emitted`` positions of the schedule consumed
(corrupt ones included), ``yielded`` examples given. A slot that skipped corrupt packs plans a longer
schedule of the same epoch (``emitted + per_slot - yielded`` positions: the merge is a sort with one
worker and a walk over the rank's batches with several, so a longer schedule begins with the
shorter one), so every slot still yields ``per_slot`` packs and a restored position recomputes the
very same schedule. The next epoch starts from the rank's cursors at ``per_slot``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError, FormatError, WdspackError
from ..format.dataset import ResolvedSource, ShardRef, read_pack_index, resolve_source
from ..format.pack_index import COLUMNS
from ..format.tar import Handler
from ..storage.streams import open_stream
from .budgets import dataset_budgets
from .collate import SOURCE_KEY
from .mixture import Mixture, MixtureEpoch, check_compatible, mixture_epoch, unit_values
from .options import ReadOptions
from .plan import PackRange
from .schedule import SlotSchedule, SourceCursor, SourceLayout, plan_slot, source_layout
from .stages import decode_packs, lap_source

__all__ = ["MixedSources"]

logger = logging.getLogger("wdspack.loader")


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
        self.combined = _combined(mixture, self.sources, self.max_images)
        self._starts: dict[tuple, list[tuple[SourceCursor, ...]]] = {}  # per slot setup: each epoch's cursors

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
        layouts, offsets, units, packs = [], [], [], []
        for name, src in zip(mixture.names, sources):
            assert src.manifest is not None  # check_compatible refuses sources without one
            if not src.manifest.pack_index:
                raise ConfigError(f"mixture source {name!r} ({src.display}) has no pack index (pack_index.npy), "
                                  "which the mixture's schedule weighs packs by; add one with `wdspack index "
                                  f"{src.display}` (reads the shards once, rewrites nothing else)")
            index = read_pack_index(src, **kwargs)
            rows = np.concatenate(index) if index else np.zeros((0, len(COLUMNS)), np.int64)
            values = unit_values(rows, mixture.unit)
            layouts.append(source_layout(name, [s.packs for s in src.shards], values))
            offsets.append([r[:, COLUMNS.index("offset")].copy() for r in index])
            units.append(int(values.sum()))
            packs.append(len(values))
        epoch = mixture_epoch(mixture, units, packs)
        logger.info("mixture of %d sources (%s, in %s): one epoch makes %s passes", len(sources),
                    ", ".join(f"{n} {w:.3f}" for n, w in zip(mixture.names, mixture.shares)), mixture.unit,
                    ", ".join(f"{n} {p:.3g}" for n, p in zip(mixture.names, epoch.passes)))
        return cls(mixture, sources, layouts, epoch, offsets, (budgets[0][0], slots, budgets[0][2]))

    @property
    def names(self) -> tuple[str, ...]:
        return self.mixture.names

    def per_slot(self, slots: int, batch_size: int) -> int:
        """Packs every slot yields per epoch (the same in every epoch)."""
        return self.epoch.per_slot(slots, batch_size)

    def buffer(self, shuffle_buffer: int) -> int:
        """Each source's shuffle buffer: the dataset's, shared out."""
        return max(1, shuffle_buffer // len(self.sources))

    def config(self) -> dict[str, Any]:
        """What a checkpoint of this mixture's stream depends on besides the dataset options."""
        return {"names": list(self.names), "shares": [round(w, 12) for w in self.mixture.shares],
                "unit": self.mixture.unit, "packs": [list(layout.counts) for layout in self.layouts]}

    def schedule(self, *, slot: int, slots: int, workers: int, epoch: int, positions: int, batch_size: int,
                 seed: int, shuffle: bool, shuffle_buffer: int) -> SlotSchedule:
        """Slot ``slot``'s first ``positions`` packs of ``epoch`` (``per_slot`` of them, more after skips).

        ``slot`` is ``rank * workers + worker``, ``slots`` is ``ranks * workers``, ``workers`` the
        DataLoader's workers per rank (at least 1) and ``batch_size`` its batch: the rank's merge runs
        over its workers' batches in the order the DataLoader yields them (:func:`.schedule.plan_slot`).

        Example:
            >>> plan = ds.mixture.schedule(slot=1, slots=2, workers=2, epoch=0, positions=4, batch_size=2,
            ...                            seed=0, shuffle=True, shuffle_buffer=256)  # doctest: +SKIP
            >>> len(plan.source)  # worker 1's first 4 packs: the rank's batches 1 and 3  # doctest: +SKIP
            4
        """
        per_slot = self.per_slot(slots, batch_size)
        buffer = self.buffer(shuffle_buffer)

        def plan(n: int, cursors: tuple[SourceCursor, ...]) -> SlotSchedule:
            return plan_slot(self.layouts, self.mixture.shares, slot=slot, slots=slots, per_slot=n, seed=seed,
                             cursors=cursors, shuffle=shuffle, shuffle_buffer=buffer, workers=workers,
                             batch_size=batch_size)

        # the cursors are the rank's: every worker of a rank chains the same ones
        starts = self._starts.setdefault((slot // workers, slots, workers, batch_size, per_slot, seed, shuffle, buffer),
                                         [(SourceCursor(),) * len(self.layouts)])
        while len(starts) <= epoch:  # every epoch starts where the one before left each source
            starts.append(plan(per_slot, starts[-1]).end)
        return plan(positions, starts[epoch])

    def iter_slot(self, *, slot: int, slots: int, workers: int, epoch: int, position: tuple[int, int, int],
                  batch_size: int, seed: int, shuffle: bool, shuffle_buffer: int, read: dict[str, Any],
                  stats: Counter, handler: Handler, to_example: Callable[[Any], dict[str, Any]]
                  ) -> Iterator[tuple[dict[str, Any], tuple[int, int, int]]]:
        """Yield ``(example, (0, emitted, yielded))`` until the slot has yielded its ``per_slot`` packs
        (``slot``, ``slots``, ``workers``, ``batch_size``: as :meth:`schedule` takes them)."""
        per_slot = self.per_slot(slots, batch_size)
        _, emitted, yielded = position
        while yielded < per_slot:
            sched = self.schedule(slot=slot, slots=slots, workers=workers, epoch=epoch,
                                  positions=emitted + per_slot - yielded, batch_size=batch_size, seed=seed,
                                  shuffle=shuffle, shuffle_buffer=shuffle_buffer)
            begin, got = emitted, 0
            reads = [self._source_packs(i, sched, emitted, read=read, stats=stats, handler=handler)
                     for i in range(len(self.sources))]
            items = _in_order(sched, emitted, reads)

            def where(k: int, sched: SlotSchedule = sched) -> str:
                i, shard = int(sched.source[k]), int(sched.shard[k])
                return f"mixture source {self.names[i]!r}: {self.sources[i].shards[shard].url} pack {sched.pack[k]}"

            try:
                for k, pack in decode_packs(items, seq_len=self.seq_len, max_images=self.max_images, handler=handler,
                                            where=where):
                    emitted = k + 1
                    if pack is None:
                        continue
                    try:
                        example = to_example(pack)
                    except ConfigError:
                        raise  # a loader set up unlike the data: not the pack's fault
                    except (WdspackError, OSError, ValueError) as e:
                        handler("corrupt_packs", FormatError(f"{where(k)}: {type(e).__name__}: {e}"))
                        continue
                    example[SOURCE_KEY] = torch.tensor(int(sched.source[k]), dtype=torch.int64)
                    got += 1
                    yielded += 1
                    yield example, (0, emitted, yielded)
                    if yielded >= per_slot:
                        return
            finally:
                items.close()
                for r in reads:
                    r.close()
            if got == 0 and emitted - begin >= per_slot:
                raise WdspackError(f"slot {slot} read {emitted - begin} packs of the mixture and none was readable "
                                   "(see the warnings above); a source is damaged")

    def _source_packs(self, i: int, sched: SlotSchedule, first: int, *, read: dict[str, Any], stats: Counter,
                      handler: Handler) -> Generator[tuple[tuple[int, int], bytes | None], None, None]:
        """Source ``i``'s packs that positions ``first..`` of ``sched`` take, as ``((pass, row), bytes | None)``:
        the slot's ranged reads of the source (``sched.reads``, in order), each from its first needed pack
        to its last, the others passed over; a read with none needed (positions before ``first``) is not made.
        """
        layout, src, offsets = self.layouts[i], self.sources[i], self.offsets[i]
        mine = sched.source[first:] == i
        # (pass, row) as one integer, so the packs a read holds are looked up at once
        wanted = sched.pass_no[first:][mine] * layout.packs + sched.row[first:][mine]
        starts = np.cumsum((0, *layout.counts))

        def open_shard(shard: int, pack: int):
            at = pack if pack < len(offsets[shard]) else 0
            return open_stream(src.shards[shard].url, offset=int(offsets[shard][at]) if at else 0,
                               headers=src.headers, stats=stats, **read), at

        for r in sched.reads:
            if r.source != i:
                continue
            rows = starts[r.shard] + np.arange(r.start, r.stop)
            needed = np.isin(r.pass_no * layout.packs + rows, wanted)
            if not needed.any():
                continue
            lo, hi = int(np.argmax(needed)), len(needed) - int(np.argmax(needed[::-1]))
            skip = set(np.flatnonzero(~needed[lo:hi]).tolist())
            packs = lap_source([PackRange(r.shard, r.start + lo, r.start + hi)], first=0, emitted=skip,
                               open_shard=open_shard, shard_name=lambda s: src.shards[s].url, stats=stats,
                               handler=handler)
            try:
                for p, data in packs:
                    yield (r.pass_no, int(rows[lo + p])), data
            finally:
                packs.close()


def _in_order(sched: SlotSchedule, first: int, reads: Sequence[Iterator[tuple[tuple[int, int], bytes | None]]]
              ) -> Generator[tuple[int, bytes | None], None, None]:
    """``(k, bytes | None)`` for the schedule's positions ``first..``, each from its source's read-ahead."""
    held: list[dict[tuple[int, int], bytes | None]] = [{} for _ in reads]
    for k in range(first, len(sched.source)):
        i = int(sched.source[k])
        want = (int(sched.pass_no[k]), int(sched.row[k]))
        while want not in held[i]:
            try:
                key, data = next(reads[i])
            except StopIteration:
                raise RuntimeError(f"source {i} ended before position {k}; this is a wdspack bug") from None
            held[i][key] = data
        yield k, held[i].pop(want)


def _combined(mixture: Mixture, sources: Sequence[ResolvedSource], max_images: int) -> ResolvedSource:
    """One :class:`ResolvedSource` that stands for the mixture where the dataset asks about "its" data:
    every source's shards, and a manifest whose totals are the sources' (sums, and maxima for what sizes
    the batch's static shapes); the image policy of the first source that holds images."""
    manifests = [s.manifest for s in sources]
    assert all(m is not None for m in manifests)
    ms = [m for m in manifests if m is not None]
    holding = next((m for m in ms if any(s.images for s in m.shards)), ms[0])
    totals: dict[str, Any] = {}
    for key in ("packs", "tokens", "images", "samples_packed"):
        totals[key] = sum(int(m.totals.get(key) or 0) for m in ms)
    for key in ("max_samples_per_pack", "max_images_per_pack", "max_image_tokens_per_pack"):
        known = [m.totals.get(key) for m in ms]
        if all(v is not None for v in known):
            totals[key] = max(int(v or 0) for v in known)
    manifest = dataclasses.replace(holding, max_images=max_images, totals=totals, pack_index={},
                                   shards=tuple(s for m in ms for s in m.shards), sources=tuple(mixture.names))
    shards = tuple(ShardRef(f"{name}/{s.name}", s.url, s.packs) for name, src in zip(mixture.names, sources)
                   for s in src.shards)
    display = "mixture of " + ", ".join(f"{n} ({s.display})" for n, s in zip(mixture.names, sources))
    return ResolvedSource(display, shards, manifest)
