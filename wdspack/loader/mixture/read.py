"""One slot's packs of a mixture, read in the schedule's order.

    MixedSources.schedule ─► per source: the slot's ranged reads (_source_packs) ─┐
                             reorder_sources (each position from its source's read-ahead) ◄┘
                             ─► decode_packs ─► to_example (+ source_idx)

Holds: each source reads only the packs this worker's positions take, each from its first needed
pack to its last; what a source has read ahead and not yet given is at most its shuffle buffer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator, Iterator
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError, FormatError, WdspackError
from ...format.tar import Handler
from ...storage.streams import open_stream
from ..batch.collate import SOURCE_KEY
from ..plan import PackRange
from ..stages import decode_packs, lap_source, reorder_sources
from .continuation import mid_continuation
from .merge import SlotSchedule
from .sources import MixedSources

__all__ = ["iter_slot"]


def iter_slot(mix: MixedSources, *, slot: int, slots: int, workers: int, epoch: int, position: tuple[int, int, int],
              batch_size: int, seed: int, shuffle: bool, shuffle_buffer: int, read: dict[str, Any],
              stats: Counter, handler: Handler, to_example: Callable[[Any], dict[str, Any]]
              ) -> Iterator[tuple[dict[str, Any], tuple[int, int, int]]]:
    """Yield ``(example, (0, emitted, yielded))`` until the slot has yielded its ``per_slot`` packs
    (``slot``, ``slots``, ``workers``, ``batch_size``: as :meth:`MixedSources.schedule` takes them; positions count
    from the epoch's start, in a continuation's epoch too)."""
    per_slot = mix.per_slot(slots, batch_size, epoch)
    _, emitted, yielded = position
    continuation = mix.continuation()
    before = 0
    if continuation is not None and mid_continuation(continuation, epoch):
        # the continuation's schedule counts from where it began: positions here are the epoch's
        before = continuation.before[slot % workers]
        emitted, yielded, per_slot = emitted - before, yielded - before, per_slot - before
    while yielded < per_slot:
        sched = mix.schedule(slot=slot, slots=slots, workers=workers, epoch=epoch,
                              positions=emitted + per_slot - yielded, batch_size=batch_size, seed=seed,
                              shuffle=shuffle, shuffle_buffer=shuffle_buffer)
        begin, got = emitted, 0
        reads = [_source_packs(mix, i, sched, emitted, read=read, stats=stats, handler=handler)
                 for i in range(len(mix.sources))]
        items = reorder_sources(reads, sched.source.tolist(), list(zip(sched.pass_no.tolist(), sched.row.tolist())),
                                start=emitted)

        def where(k: int, sched: SlotSchedule = sched) -> str:
            i, shard = int(sched.source[k]), int(sched.shard[k])
            return f"mixture source {mix.names[i]!r}: {mix.sources[i].shards[shard].url} pack {sched.pack[k]}"

        try:
            for k, pack in decode_packs(items, seq_len=mix.seq_len, max_images=mix.max_images, handler=handler,
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
                yield example, (0, emitted + before, yielded + before)
                if yielded >= per_slot:
                    return
        finally:
            items.close()
            for r in reads:
                r.close()
        if got == 0 and emitted - begin >= per_slot:
            raise WdspackError(f"slot {slot} read {emitted - begin} packs of the mixture and none was readable "
                               "(see the warnings above); a source is damaged")

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

