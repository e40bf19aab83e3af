"""The loader's generator stages, chained per slot and per lap::

    lap_source ─► reorder ─► decode_packs ─► (to_example in the dataset)
      │ for each PackRange:
      │   open_stream ─► shard_packs (the tar reader, wdspack.format.tar)
      ▼
    (position, member bytes | None)        None = a hole: the pack could not be read

Each stage is a plain generator over the previous one. Errors about the *data* (a corrupt pack, a
truncated or garbled shard) go to ``handler(kind, error)``, which counts them and either logs a
warning and lets the stage go on, or raises (``on_corrupt="raise"``); errors about the *setup*
(a missing shard, a network that stays down, a pack of a newer format version) always raise.

The tar reader (:mod:`wdspack.format.tar`, beside the writer) takes only regular files named
``*.mp`` as packs; every other member is skipped and counted as ``ignored_members``. Nothing is
ever unpickled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Generator, Hashable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import FormatError, NewerFormatError
from ..format.pack import Pack, decode_pack
from ..format.tar import Handler, ShardError, shard_packs

__all__ = ["decode_packs", "lap_source", "reorder", "reorder_sources"]


def lap_source(ranges: Sequence, *, first: int, emitted: Container[int],
               open_shard: Callable[[int, int], tuple[Any, int]], shard_name: Callable[[int], str], stats: Counter,
               handler: Handler) -> Generator[tuple[int, bytes | None], None, None]:
    """Yield ``(position, bytes | None)`` for every lap position ``>= first`` not in ``emitted``, in order.

    Positions number the packs of the slot's ranges back to back. ``open_shard(shard, pack)``
    returns ``(stream, index)``: a stream positioned at pack ``index`` (``pack`` when the reader
    knows where it starts, else 0). A shard that breaks off yields
    ``None`` (a hole) for each pack it still owed, after ``handler("truncated_shards", error)``.
    """
    base = 0
    for rng in ranges:
        lo = max(first - base, 0)
        if lo < len(rng):
            skip = {rng.start + p - base for p in range(base + lo, base + len(rng)) if p in emitted}
            if len(skip) < len(rng) - lo:
                yield from _range_packs(rng, base, lo, skip, open_shard, shard_name(rng.shard), stats, handler)
        base += len(rng)


def _range_packs(rng, base, lo, skip, open_shard, where, stats, handler):
    done = rng.start + lo
    try:
        stream, at = open_shard(rng.shard, rng.start + lo)
        with stream:
            for index, data in shard_packs(stream, start=rng.start + lo, stop=rng.stop, skip=skip, stats=stats,
                                           where=where, first=at, handler=handler):
                yield base + index - rng.start, data
                done = index + 1
    except ShardError as e:
        handler("truncated_shards", e)
        for index in range(done, rng.stop):
            if index not in skip:
                yield base + index - rng.start, None


def reorder(src: Iterator[tuple[int, bytes | None]], order: np.ndarray, *, start: int
            ) -> Generator[tuple[int, bytes | None], None, None]:
    """Yield ``(k, item)`` for ``k = start..len(order)-1``, item being the one at position ``order[k]``.

    ``src`` yields ``(position, item)`` by increasing position and covers every position of
    ``order[start:]``; items arriving early wait in a dict (at most the shuffle buffer's size,
    see :func:`~wdspack.loader.plan.shuffle_order`).
    """
    return reorder_sources([src], None, np.asarray(order).tolist(), start=start)


def reorder_sources(srcs: Sequence[Iterator[tuple[Hashable, bytes | None]]], source: Sequence[int] | None,
                    keys: Sequence[Hashable], *, start: int) -> Generator[tuple[int, bytes | None], None, None]:
    """Yield ``(k, item)`` for ``k = start..len(keys)-1``, item being the one keyed ``keys[k]`` from
    ``srcs[source[k]]`` (``srcs[0]`` when ``source`` is None): :func:`reorder` over several sources.

    Each source yields ``(key, item)`` in its own reading order and covers every key asked of it; items
    arriving before they are wanted wait in a dict per source.
    """
    held: list[dict[Hashable, bytes | None]] = [{} for _ in srcs]
    for k in range(start, len(keys)):
        i = 0 if source is None else source[k]
        want, wait = keys[k], held[i]
        while want not in wait:
            try:
                key, item = next(srcs[i])
            except StopIteration:
                raise RuntimeError(f"source {i} ended before position {k} ({want}); this is a wdspack bug") from None
            wait[key] = item
        yield k, wait.pop(want)


def decode_packs(src: Iterator[tuple[int, bytes | None]], *, seq_len: int, max_images: int, handler: Handler,
                 where: Callable[[int], str]) -> Iterator[tuple[int, Pack | None]]:
    """Decode and check each pack against the budgets; a bad one becomes ``None`` after the handler.

    A pack of a newer format version is never "corrupt": its :class:`NewerFormatError` raises.
    """
    for k, data in src:
        if data is None:
            yield k, None
            continue
        try:
            pack = decode_pack(data, seq_len=seq_len, max_images=max_images)
        except NewerFormatError:
            raise
        except FormatError as e:
            handler("corrupt_packs", FormatError(f"{where(k)}: {e}"))
            yield k, None
            continue
        yield k, pack
