"""Local files as streams: :class:`LocalStream` (a shard path) and :class:`FileStream` (an open file)."""

from __future__ import annotations

from ..errors import SourceError
from .base import NotFoundError

__all__ = ["FileStream", "LocalStream"]


class LocalStream:
    """A local file read with ``open()`` and a ``block_size`` buffer."""

    def __init__(self, path: str, *, offset: int = 0, block_size: int = 1 << 20) -> None:
        self.url = path[len("file://"):] if path.startswith("file://") else path
        try:
            self._f = open(self.url, "rb", buffering=block_size)  # noqa: SIM115  (the stream's own; close() closes it)
        except FileNotFoundError:
            raise NotFoundError(f"shard {self.url} does not exist; the manifest lists it, so the dataset folder "
                                "is incomplete") from None
        except OSError as e:
            raise SourceError(f"cannot open shard {self.url}: {e.strerror}; check the path "
                              "(the manifest lists it)") from None
        self._f.seek(offset)
        self.offset = offset

    def read(self, n: int) -> bytes:
        data = self._f.read(n)
        self.offset += len(data)
        return data

    def skip(self, n: int) -> None:
        self._f.seek(n, 1)
        self.offset += n

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> LocalStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class FileStream:
    """``read`` / ``skip`` / ``offset`` over an open, seekable binary file, for the tar reader
    (:func:`wdspack.format.tar.tar_entries`). Positions are absolute, so others may seek ``f``
    between calls."""

    def __init__(self, f, *, offset: int = 0) -> None:
        self._f, self.offset = f, offset
        f.seek(offset)

    def read(self, n: int) -> bytes:
        self._f.seek(self.offset)
        data = self._f.read(n)
        self.offset += len(data)
        return data

    def skip(self, n: int) -> None:
        self.offset += n
