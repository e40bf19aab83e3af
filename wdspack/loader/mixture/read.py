"""One slot's packs of a mixture, read in the schedule's order.

    MixedSources.schedule ─► per source: the slot's ranged reads (_source_packs) ─┐
                             reorder_sources (each position from its source's read-ahead) ◄┘
                             ─► a Round ─► wdspack.loader.read.read_slot (decode, example, source_idx)

Holds: each source reads only the packs this worker's positions take, each from its first needed
pack to its last; what a source has read ahead and not yet given is at most its shuffle buffer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator, Iterator
from typing import Any

import numpy as np

from ...errors import WdspackError
from ...format.tar import Handler
from ...storage.streams import open_stream
from ..plan import PackRange
from ..read import Round
from ..stages import lap_source, reorder_sources
from .continuation import mid_continuation
from .merge import SlotSchedule
from .sources import MixedSources

__all__ = ["slot_rounds"]


def slot_rounds(mix: MixedSources, *, slot: int, slots: int, workers: int, epoch: int, position: tuple[int, int, int],
                batch_size: int, seed: int, shuffle: bool, shuffle_buffer: int, read: dict[str, Any],
                stats: Counter, handler: Handler) -> tuple[int, int, Iterator[Round]]:
    """The slot's reading as :func:`~wdspack.loader.read.read_slot` takes it: ``(yielded, per_slot, rounds)``,
    counted from where the slot's schedule begins (``slot``, ``slots``, ``workers``, ``batch_size``: as
    :meth:`MixedSources.schedule` takes them; the rounds report positions from the epoch's start, in a
    continuation's epoch too)."""
    per_slot = mix.per_slot(slots, batch_size, epoch)
    _, emitted, yielded = position
    continuation = mix.continuation()
    before = 0
    if continuation is not None and mid_continuation(continuation, epoch):
        # the continuation's schedule counts from where it began: positions here are the epoch's
        before = continuation.before[slot % workers]
        emitted, yielded, per_slot = emitted - before, yielded - before, per_slot - before
    rounds = _rounds(mix, slot=slot, slots=slots, workers=workers, epoch=epoch, emitted=emitted, yielded=yielded,
                     per_slot=per_slot, before=before, batch_size=batch_size, seed=seed, shuffle=shuffle,
                     shuffle_buffer=shuffle_buffer, read=read, stats=stats, handler=handler)
    return yielded, per_slot, rounds


def _rounds(mix: MixedSources, *, slot: int, slots: int, workers: int, epoch: int, emitted: int, yielded: int,
            per_slot: int, before: int, batch_size: int, seed: int, shuffle: bool, shuffle_buffer: int,
            read: dict[str, Any], stats: Counter, handler: Handler) -> Iterator[Round]:
    """One schedule per round: the first for the slot's ``per_slot`` positions; after corrupt packs, a
    longer one of the same epoch (it begins with the shorter), read on from where the last stopped."""
    while True:
        sched = mix.schedule(slot=slot, slots=slots, workers=workers, epoch=epoch,
                             positions=emitted + per_slot - yielded, batch_size=batch_size, seed=seed,
                             shuffle=shuffle, shuffle_buffer=shuffle_buffer)
        reads = [_source_packs(mix, i, sched, emitted, read=read, stats=stats, handler=handler)
                 for i in range(len(mix.sources))]
        items = reorder_sources(reads, sched.source.tolist(), list(zip(sched.pass_no.tolist(), sched.row.tolist())),
                                start=emitted)

        def where(k: int, sched: SlotSchedule = sched) -> str:
            i, shard = int(sched.source[k]), int(sched.shard[k])
            return f"mixture source {mix.names[i]!r}: {mix.sources[i].shards[shard].url} pack {sched.pack[k]}"

        rnd = Round(emitted, items, where, lambda e, y: (0, e + before, y + before), source=sched.source,
                    streams=tuple(reads))
        yield rnd
        if rnd.got == 0 and rnd.end - emitted >= per_slot:
            raise WdspackError(f"slot {slot} read {rnd.end - emitted} packs of the mixture and none was readable "
                               "(see the warnings above); a source is damaged")
        emitted, yielded = rnd.end, yielded + rnd.got


def _source_packs(mix: MixedSources, i: int, sched: SlotSchedule, first: int, *, read: dict[str, Any], stats: Counter,
                  handler: Handler) -> Generator[tuple[tuple[int, int], bytes | None], None, None]:
    """Source ``i``'s packs that positions ``first..`` of ``sched`` take, as ``((pass, row), bytes | None)``:
    the slot's ranged reads of the source (``sched.reads``, in order), each from its first needed pack
    to its last, the others passed over; a read with none needed (positions before ``first``) is not made.
    """
    layout, src, offsets = mix.layouts[i], mix.sources[i], mix.offsets[i]
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

