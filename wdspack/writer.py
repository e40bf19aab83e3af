"""Tar shards with deterministic headers, written to a temp name and renamed when complete."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile

from .manifest import ShardInfo
from .storage import Location

__all__ = ["ShardWriter", "shard_name"]

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
        >>> w.add("000000000000", b"...", samples=3, tokens=4000, images=2); info = w.close()  # doctest: +SKIP
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        text = str(path)
        self.name = text.replace("\\", "/").rsplit("/", 1)[-1]
        self._folder = Location(text[: len(text) - len(self.name)] or ".")
        self._tmp = f".{self.name}.tmp"
        self._file = self._folder.open_write(self._tmp)
        self._size = 0
        self._hash = hashlib.sha256()
        self._tar = tarfile.open(fileobj=_HashingWriter(self._file, self._hash), mode="w",
                                 format=tarfile.USTAR_FORMAT)
        self._packs = self._samples = self._tokens = self._images = 0
        #: where each pack's tar header starts in the shard (the pack index records it)
        self.offsets: list[int] = []

    def add(self, key: str, data: bytes, *, samples: int, tokens: int, images: int) -> None:
        """Append the pack ``{key}.mp``."""
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
        self._images += images

    def close(self) -> ShardInfo:
        """Finish the tar, fsync, rename to the final name; return the manifest entry."""
        self._tar.close()
        if not self._folder.remote:
            self._file.flush()
            os.fsync(self._file.fileno())
        size = self._file.tell()
        self._file.close()
        self._folder.commit(self._tmp, self.name)
        return ShardInfo(name=self.name, packs=self._packs, samples=self._samples, tokens=self._tokens,
                         images=self._images, bytes=size, sha256=self._hash.hexdigest())

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
