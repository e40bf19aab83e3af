"""The loader's generator stages, chained per slot and per lap::

    lap_source ─► reorder ─► decode_packs ─► (to_example in the dataset)
      │ for each PackRange:
      │   open_stream ─► tar_entries ─► shard_packs
      ▼
    (position, member bytes | None)        None = a hole: the pack could not be read

Each stage is a plain generator over the previous one. Errors about the *data* (a corrupt pack, a
truncated or garbled shard) go to ``handler(kind, error)``, which counts them and either logs a
warning and lets the stage go on, or raises (``on_corrupt="raise"``); errors about the *setup*
(a missing shard, a network that stays down, an unknown format version) always raise.

The tar reader is our own: 512-byte headers parsed from the stream (ustar, GNU long names, pax
``path``/``size``), checksums verified, only regular files named ``*.mp`` taken as packs; every
other member is skipped and counted as ``ignored_members``. Nothing is ever unpickled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass

import msgpack
import numpy as np

from ..codec import FORMAT, MAX_PACK_BYTES, Pack, decode_pack
from ..errors import FormatError

__all__ = ["TarEntry", "decode_packs", "lap_source", "reorder", "shard_packs", "tar_entries"]

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
_REGULAR = (b"0", b"\0", b"7")
_META = (b"L", b"x", b"g", b"K")  # GNU long name/link, pax header, pax global header
_MAX_META = 1 << 20
_MAX_MEMBER = 1 << 40  # a size past this is a garbled header, not a member (and would overflow a seek)
_READ_PIECE = 16 << 20  # a read asks for at most this much: memory follows the bytes that exist, not a claim

#: What a shard may hold, for the loader and ``wdspack verify`` alike.
FOREIGN_RULE = ("a wdspack shard holds only regular '{key}.mp' pack members; anything else is damage "
                "(skipped and counted, or an error with on_corrupt='raise'): re-pack, or remove the member")
#: handler(kind, error): count a data error of ``kind`` and warn, or raise it.
Handler = Callable[[str, Exception], None]


@dataclass(frozen=True, slots=True)
class TarEntry:
    name: str
    size: int
    regular: bool
    offset: int = 0  # where the member's first header (a pax / long-name one, if any) starts


class ShardError(FormatError):
    """A shard that ends early or has a garbled header; the packs after the damage are lost.

    ``offset``: where the damage starts (the damaged header, or the start of the read that came short).
    """

    def __init__(self, message: str, *, offset: int | None = None) -> None:
        super().__init__(message)
        self.offset = offset


def tar_entries(stream, *, where: str) -> Iterator[TarEntry]:
    """Yield each member's header; the consumer reads or skips exactly ``entry.size`` bytes before the next.

    Raises :class:`ShardError` when the stream ends inside the archive or a header is damaged.
    """
    pending_name: str | None = None
    pending_size: int | None = None
    start: int | None = None
    while True:
        if start is None:
            start = stream.offset
        header = _read_exact(stream, BLOCK, where=where, what="a tar header")
        if header == _ZERO_BLOCK:
            return  # end-of-archive marker
        _check_header(header, where=where, offset=stream.offset - BLOCK)
        kind = header[156:157]
        size = _parse_size(header[124:136], where=where, offset=stream.offset - BLOCK)
        if kind in _META:
            if size > _MAX_META:
                raise ShardError(f"{where}: a {size}-byte tar meta header at byte {stream.offset - BLOCK}",
                                 offset=stream.offset - BLOCK)
            data = _read_exact(stream, size, where=where, what="a tar meta header")
            stream.skip(_pad(size))
            if kind == b"L":
                pending_name = data.split(b"\0", 1)[0].decode("utf-8", "replace")
            elif kind == b"x":
                fields = _parse_pax(data)
                pending_name = fields.get("path", pending_name)
                if "size" in fields and fields["size"].isdigit():
                    pending_size = int(fields["size"])
            continue
        name = pending_name or _header_name(header)
        size = pending_size if pending_size is not None else size
        if size > _MAX_MEMBER:
            at = stream.offset - BLOCK
            raise ShardError(f"{where}: the tar header at byte {at} claims a {size}-byte member; the header is garbled",
                             offset=at)
        pending_name = pending_size = None
        yield TarEntry(name=name, size=size, regular=kind in _REGULAR, offset=start)
        start = None
        stream.skip(_pad(size))


def shard_packs(stream, *, start: int, stop: int, skip: Container[int] = (), stats: Counter,
                where: str, first: int = 0, handler: Handler | None = None) -> Iterator[tuple[int, bytes]]:
    """Yield ``(index, bytes)`` of packs ``start..stop-1`` (the index counts ``*.mp`` members only).

    ``first`` is the index of the pack the stream is positioned at (0: the shard's beginning; a
    reader that knows pack offsets from the pack index opens the stream at pack ``start``).
    Packs before ``start`` and those in ``skip`` are passed over without reading their bytes.
    Reading stops right after pack ``stop - 1``. A shard that ends before it raises :class:`ShardError`.

    A member that is not a pack (wdspack writes none; :data:`FOREIGN_RULE`) is skipped unread and
    counted as ``ignored_members``; with a ``handler`` it also goes through it (a warning, or an
    error under ``on_corrupt="raise"``), the rule ``wdspack verify`` applies too.
    """
    index = first
    for entry in tar_entries(stream, where=where):
        if not (entry.regular and entry.name.endswith(".mp")):
            stream.skip(entry.size)
            if handler is None:
                stats["ignored_members"] += 1
            else:
                handler("ignored_members", FormatError(f"{where}: member {entry.name!r} is not a pack; "
                                                       f"{FOREIGN_RULE}"))
            continue
        if entry.size > MAX_PACK_BYTES:
            raise ShardError(f"{where}: pack {entry.name} claims {entry.size} bytes, over the {MAX_PACK_BYTES}-byte "
                             "limit of a pack; the tar header is garbled")
        if index >= start and index not in skip:
            yield index, _read_exact(stream, entry.size, where=where, what=f"pack {entry.name}")
        else:
            stream.skip(entry.size)
        index += 1
        if index >= stop:
            return
    raise ShardError(f"{where}: the archive ends after {index} packs, the manifest says at least {stop}")


def lap_source(ranges: Sequence, *, first: int, emitted: Container[int], open_shard: Callable[[int], object],
               shard_name: Callable[[int], str], stats: Counter, handler: Handler) -> Iterator[tuple[int, bytes | None]]:
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
            ) -> Iterator[tuple[int, bytes | None]]:
    """Yield ``(k, item)`` for ``k = start..len(order)-1``, item being the one at position ``order[k]``.

    ``src`` yields ``(position, item)`` by increasing position and covers every position of
    ``order[start:]``; items arriving early wait in a dict (at most the shuffle buffer's size,
    see :func:`~wdspack.loader.plan.shuffle_order`).
    """
    held: dict[int, bytes | None] = {}
    for k in range(start, len(order)):
        want = int(order[k])
        while want not in held:
            try:
                pos, item = next(src)
            except StopIteration:
                raise RuntimeError(f"lap source ended before position {want}; this is a wdspack bug") from None
            held[pos] = item
        yield k, held.pop(want)


def decode_packs(src: Iterator[tuple[int, bytes | None]], *, seq_len: int, max_images: int, handler: Handler,
                 where: Callable[[int], str]) -> Iterator[tuple[int, Pack | None]]:
    """Decode and check each pack against the budgets; a bad one becomes ``None`` after the handler.

    A pack of another format version is never "corrupt": it raises, naming both versions.
    """
    for k, data in src:
        if data is None:
            yield k, None
            continue
        try:
            pack = decode_pack(data, seq_len=seq_len, max_images=max_images)
        except FormatError as e:
            _raise_if_other_version(data)
            handler("corrupt_packs", FormatError(f"{where(k)}: {e}"))
            yield k, None
            continue
        yield k, pack


def _raise_if_other_version(data: bytes) -> None:
    try:
        record = msgpack.unpackb(data, raw=False, max_bin_len=len(data), max_ext_len=0)
    except Exception:
        return
    fmt = record.get("format") if isinstance(record, dict) else None
    if isinstance(fmt, str) and fmt != FORMAT and fmt.startswith("wdspack/"):
        raise FormatError(f"pack format {fmt!r} is not supported by this reader, which reads {FORMAT!r}; "
                          "upgrade wdspack or re-pack the data")


# -- tar header details --------------------------------------------------------------------------


def _read_exact(stream, n: int, *, where: str, what: str) -> bytes:
    """Exactly ``n`` bytes, read in pieces: a header claiming gigabytes in a short shard costs no more
    memory than the bytes that are really there (``read(n)`` would allocate ``n`` up front)."""
    pieces, got, start = [], 0, stream.offset
    while got < n and (piece := stream.read(min(n - got, _READ_PIECE))):
        pieces.append(piece)
        got += len(piece)
    data = b"".join(pieces)  # one piece is returned as it is, not copied
    if len(data) != n:
        raise ShardError(f"{where}: truncated at byte {stream.offset} while reading {what} "
                         f"({len(data)} of {n} bytes)", offset=start)
    return data


def _pad(size: int) -> int:
    return -size % BLOCK


def _check_header(header: bytes, *, where: str, offset: int) -> None:
    stored = header[148:156].split(b"\0", 1)[0].strip()
    try:
        expected = int(stored or b"-1", 8)
    except ValueError:
        expected = -1
    actual = sum(header[:148]) + 8 * 32 + sum(header[156:])
    if expected != actual:
        raise ShardError(f"{where}: damaged tar header at byte {offset} (checksum {expected} != {actual})",
                         offset=offset)


def _parse_size(field: bytes, *, where: str, offset: int) -> int:
    if field[0] & 0x80:  # GNU base-256 for sizes past 8 GiB
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    try:
        size = int(text or b"0", 8)
    except ValueError:
        size = -1
    if size < 0:
        raise ShardError(f"{where}: the tar header at byte {offset} has a malformed size {field!r}", offset=offset)
    return size


def _header_name(header: bytes) -> str:
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "replace")


def _parse_pax(data: bytes) -> dict[str, str]:
    fields = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(data[pos:space])
        except ValueError:
            break
        record = data[space + 1:pos + length - 1]
        key, _, value = record.partition(b"=")
        fields[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        pos += max(length, 1)
    return fields
