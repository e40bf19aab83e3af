"""Tar shards, written and read: the writer and the reader side by side.

Writing: :class:`ShardWriter` puts each pack in one member ``{key}.mp`` with deterministic headers
(fixed mtime, uid/gid 0, fixed mode), so the same packs give the same bytes, under a temp name that
is renamed when the shard is complete.

Reading: our own reader, over any stream with ``read`` / ``skip`` / ``offset``
(:mod:`wdspack.storage`): 512-byte headers parsed from the stream (ustar, GNU long names, pax
``path``/``size``), checksums verified, only regular files named ``*.mp`` taken as packs
(:func:`shard_packs`; every other member is skipped and counted as ``ignored_members``). Nothing is
ever unpickled.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections import Counter
from collections.abc import Callable, Container, Iterator, Mapping
from dataclasses import dataclass

from ..errors import FormatError
from ..media import KINDS
from ..storage.location import Location
from .manifest import ShardInfo
from .pack import MAX_PACK_BYTES

__all__ = ["FOREIGN_RULE", "ShardError", "ShardWriter", "TarEntry", "shard_name", "shard_packs", "tar_entries"]

# ---------------------------------------------------------------------------------------------
# Writing

_MTIME = 0  # fixed, so the same packs give the same bytes


def shard_name(split: str, index: int) -> str:
    """``{split}-{index:06d}.tar``.

    Example:
        >>> shard_name("train", 3)
        'train-000003.tar'
    """
    return f"{split}-{index:06d}.tar"


class ShardWriter:
    """Writes one shard: members in the order given (callers pass them sorted by key).

    The file lives under ``.{name}.tmp`` until :meth:`close`, which fsyncs and renames it, so a
    shard under its final name is always complete. ``path`` may be an fsspec URL
    (``s3://bucket/ds/train-000000.tar``): the temp object is uploaded as it is written, then
    renamed.

    Example:
        >>> w = ShardWriter("/tmp/out/train-000000.tar")  # doctest: +SKIP
        >>> w.add("000000000000", b"...", samples=3, tokens=4000, media={"image": 2})  # doctest: +SKIP
        >>> info = w.close()  # doctest: +SKIP
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        text = str(path)
        self.name = text.replace("\\", "/").rsplit("/", 1)[-1]
        self._folder = Location(text[: len(text) - len(self.name)] or ".")
        self._tmp = f".{self.name}.tmp"
        self._file = self._folder.open_write(self._tmp)
        self._size = 0
        self._hash = hashlib.sha256()
        # SIM115: the writer holds the tar open until close() or abort()
        self._tar = tarfile.open(fileobj=_HashingWriter(self._file, self._hash), mode="w",  # noqa: SIM115
                                 format=tarfile.USTAR_FORMAT)
        self._packs = self._samples = self._tokens = 0
        self._count: Counter[str] = Counter()  # items of each kind
        self._most: Counter[str] = Counter()  # the most tokens of each kind in one pack
        #: where each pack's tar header starts in the shard (the pack index records it)
        self.offsets: list[int] = []

    def add(self, key: str, data: bytes, *, samples: int, tokens: int, media: Mapping[str, int] | None = None,
            media_tokens: Mapping[str, int] | None = None, **by_key: int) -> None:
        """Append the pack ``{key}.mp``: ``media`` its items of each kind (``{"image": 2}``), ``media_tokens``
        their tokens (for the shard's most in one pack). Also by their pack keys: ``images=2``,
        ``video_tokens=...``."""
        counts, most = dict(media or {}), dict(media_tokens or {})
        for name, value in by_key.items():
            kind, part = _COUNT_OF.get(name, ("", ""))
            if not kind:
                raise TypeError(f"ShardWriter.add() got an unexpected keyword argument {name!r}")
            (counts if part == "count" else most)[kind] = value
        info = tarfile.TarInfo(f"{key}.mp")
        info.size = len(data)
        info.mtime = _MTIME
        info.mode = 0o444
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        self.offsets.append(self._tar.offset)
        self._tar.addfile(info, io.BytesIO(data))
        self._packs += 1
        self._samples += samples
        self._tokens += tokens
        self._count.update(counts)
        for kind, n in most.items():
            self._most[kind] = max(self._most[kind], n)

    def close(self, *, record: Callable[[ShardInfo], None] | None = None) -> ShardInfo:
        """Finish the tar, fsync, rename to the final name; return the manifest entry. ``record(info)`` runs
        before the rename: whoever keeps the entry has it for every shard under its final name."""
        self._tar.close()
        if not self._folder.remote:
            self._file.flush()
            os.fsync(self._file.fileno())
        size = self._file.tell()
        self._file.close()
        info = ShardInfo(name=self.name, packs=self._packs, samples=self._samples, tokens=self._tokens,
                         bytes=size, sha256=self._hash.hexdigest(), media=_media_numbers(self._count, self._most))
        if record is not None:
            record(info)
        self._folder.commit(self._tmp, self.name)
        return info

    def abort(self) -> None:
        """Drop the unfinished temp file."""
        try:
            self._file.close()
        finally:
            self._folder.remove(self._tmp)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


#: ShardWriter.add's counts by their pack keys: ``images`` -> ("image", "count"), ``video_tokens`` -> ("video",
#: "tokens").
_COUNT_OF = {**{kind.plural: (kind.name, "count") for kind in KINDS},
             **{f"{kind.name}_tokens": (kind.name, "tokens") for kind in KINDS}}


def _media_numbers(count: Mapping[str, int], most: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """A shard's media as :class:`ShardInfo` keeps them: per kind, its items and the most of its tokens in one
    pack (the images' not kept: the manifest's totals record them)."""
    return {kind.name: (count.get(kind.name, 0), 0 if kind.always_stored else most.get(kind.name, 0))
            for kind in KINDS}


class _HashingWriter(io.RawIOBase):
    """A write-only file object that hashes what passes through it."""

    def __init__(self, f, h) -> None:
        self._f, self._h = f, h

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self._h.update(b)
        return self._f.write(b)

    def tell(self) -> int:
        return self._f.tell()


# ---------------------------------------------------------------------------------------------
# Reading

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
