"""Where the pack job reads and writes: local paths through ``os``, URLs through fsspec.

Sources, ``--image-root`` and ``--output`` may each be a local path or an fsspec URL::

    /data/llava.jsonl  file:///data/llava.jsonl        local (``file://`` is stripped)
    s3://bucket/llava/*.jsonl  gs://…  az://…          any fsspec backend that is installed
                                                       (s3fs, gcsfs, adlfs, …)
    hf://datasets/ORG/NAME@REV/data/*.parquet          the Hub, inputs only (``@main`` when
                                                       no revision is named)

Credentials and endpoints come from where each backend looks for them (environment variables
such as ``AWS_ENDPOINT_URL``/``AWS_PROFILE``, fsspec's config files, ``HF_TOKEN``), never
from a command line, a log or a manifest.

Writes keep the local guarantee that a file under its final name is complete: it is written
under a temp name and then renamed (``os.replace`` locally; ``fs.mv`` remotely, which object
stores do as a server-side copy, so the final object appears whole or not at all).

Example:
    >>> out = Location("/tmp/wdspack-doc-example"); out.makedirs("")
    >>> out.write_atomic("a.json", b"{}"); out.read_bytes("a.json")
    b'{}'
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import IO, Any

from ..errors import ConfigError, OutputError, SourceError
from .fsspec import filesystem
from .urls import is_url, local_path

__all__ = ["Location", "copy_to_local", "open_input", "read_range", "stat_tag"]


def stat_tag(path: str) -> list[Any]:
    """``[size, version]`` of a file, for resume fingerprints: a changed file changes it.

    Local files give their mtime in ns; remote ones the backend's ETag, blob id or modification
    time, whichever it reports.
    """
    if not is_url(path):
        st = os.stat(local_path(path))
        return [st.st_size, st.st_mtime_ns]
    fs, inner = filesystem(path)
    info = fs.info(inner)
    for key in ("ETag", "etag", "blob_id", "md5Hash", "crc32c", "sha256", "mtime", "LastModified",
                "last_modified", "updated", "created"):
        if info.get(key) is not None:
            return [info.get("size"), str(info[key])]
    return [info.get("size"), None]


def open_input(path: str, *, block_size: int | None = None) -> IO[bytes]:
    """Open a local path or URL for reading (binary, seekable)."""
    if not is_url(path):
        return open(local_path(path), "rb")
    fs, inner = filesystem(path)
    kwargs = {} if block_size is None else {"block_size": block_size}
    return fs.open(inner, "rb", **kwargs)


def read_range(path: str, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of a file: one ranged read."""
    if not is_url(path):
        with open(local_path(path), "rb") as f:
            f.seek(start)
            return f.read(stop - start)
    fs, inner = filesystem(path)
    data = fs.cat_file(inner, start=start, end=stop)
    if len(data) == stop - start:
        return data
    # HTTP lets a server ignore Range and answer with the whole body (olah does): take the slice.
    size = fs.info(inner).get("size")
    if len(data) == size and stop <= size:
        return data[start:stop]
    raise SourceError(f"{path!r}: asked for bytes {start}-{stop} and got {len(data)} bytes back; the file "
                      "changed while being read, or the server mishandles ranged reads")


@contextlib.contextmanager
def copy_to_local(path: str) -> Iterator[str]:
    """A local path holding the file's bytes: the path itself, or a temp copy of a URL.

    Used where a whole-file scan needs random access (finding the records of JSON and Arrow
    files); the copy lives in the system temp folder and is deleted on exit.
    """
    if not is_url(path):
        yield local_path(path)
        return
    fs, inner = filesystem(path)
    fd, tmp = tempfile.mkstemp(prefix="wdspack-", suffix=posixpath.splitext(inner)[1])
    os.close(fd)
    try:
        fs.get_file(inner, tmp)
        yield tmp
    finally:
        with contextlib.suppress(OSError):
            os.remove(tmp)


class Location:
    """A folder, local or remote, that the pack job writes into; names inside are ``/``-joined.

    It holds only its URL: it is cheap to pickle, and each process opens the filesystem itself
    (fsspec caches instances).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        text = str(root)
        if text.startswith("hf://"):
            raise ConfigError(f"--output {text!r}: the Hub is not a place to write a pack job into; write "
                              "the dataset locally (or to object storage) and `wdspack upload` it")
        self.remote = is_url(text)
        self.root = text.rstrip("/") if self.remote else local_path(text)

    def __str__(self) -> str:
        return self.root

    def __repr__(self) -> str:
        return f"Location({self.root!r})"

    def __reduce__(self):
        return Location, (self.root,)

    def join(self, *names: str) -> str:
        """The path or URL of ``names`` inside this folder."""
        if self.remote:
            return "/".join([self.root, *(n for n in names if n)])
        return os.path.join(self.root, *names)

    def child(self, name: str) -> Location:
        return Location(self.join(name))

    def _fs(self) -> tuple[Any, str]:
        # Other processes write here too: a cached listing would hide their files.
        return filesystem(self.root, use_listings_cache=False)

    def _inner(self, *names: str) -> tuple[Any, str]:
        fs, base = self._fs()
        return fs, "/".join([base.rstrip("/"), *(n for n in names if n)])

    def exists(self, *names: str) -> bool:
        if not self.remote:
            return os.path.exists(self.join(*names))
        fs, inner = self._inner(*names)
        return fs.exists(inner)

    def is_empty(self) -> bool:
        """True when the folder is missing or holds nothing."""
        if not self.remote:
            return not os.path.isdir(self.root) or not any(os.scandir(self.root))
        fs, inner = self._fs()
        try:
            return not fs.ls(inner, detail=False)
        except FileNotFoundError:
            return True

    def listdir(self, name: str = "") -> set[str]:
        """The names directly inside ``name`` (this folder when empty; none when it does not
        exist): one listing."""
        if not self.remote:
            try:
                return set(os.listdir(self.join(name)))
            except FileNotFoundError:
                return set()
        fs, inner = self._inner(name)
        try:
            return {posixpath.basename(p.rstrip("/")) for p in fs.ls(inner, detail=False)}
        except FileNotFoundError:
            return set()

    def makedirs(self, name: str) -> None:
        try:
            if not self.remote:
                os.makedirs(self.join(name), exist_ok=True)
            else:
                fs, inner = self._inner(name)
                fs.makedirs(inner, exist_ok=True)
        except OSError as e:
            raise OutputError(f"cannot create {self.join(name)}: {e.strerror or e}; check the path and "
                              "permissions") from None

    def read_bytes(self, *names: str) -> bytes:
        if not self.remote:
            with open(self.join(*names), "rb") as f:
                return f.read()
        fs, inner = self._inner(*names)
        return fs.cat_file(inner)

    def size(self, *names: str) -> int:
        if not self.remote:
            return os.path.getsize(self.join(*names))
        fs, inner = self._inner(*names)
        return int(fs.info(inner)["size"])

    def open_read(self, *names: str) -> IO[bytes]:
        if not self.remote:
            return open(self.join(*names), "rb")
        fs, inner = self._inner(*names)
        return fs.open(inner, "rb")

    def open_write(self, *names: str) -> IO[bytes]:
        """A new file for writing; remote files appear when closed (uploads are whole)."""
        if not self.remote:
            return open(self.join(*names), "wb")
        fs, inner = self._inner(*names)
        return fs.open(inner, "wb")

    def read_ranges(self, name_of: Sequence[str], starts: Sequence[int], stops: Sequence[int]) -> list[bytes]:
        """Several ranged reads; remote ones run concurrently where the backend can."""
        if not self.remote:
            out = []
            for name, a, b in zip(name_of, starts, stops):
                with open(self.join(name), "rb") as f:
                    f.seek(a)
                    out.append(f.read(b - a))
            return out
        fs, base = self._fs()
        paths = ["/".join([base.rstrip("/"), n]) for n in name_of]
        return list(fs.cat_ranges(paths, list(starts), list(stops)))

    def commit(self, tmp: str, name: str) -> None:
        """Rename ``tmp`` to ``name`` (both inside this folder), replacing it."""
        if not self.remote:
            os.replace(self.join(tmp), self.join(name))
            return
        fs, src = self._inner(tmp)
        _, dst = self._inner(name)
        fs.mv(src, dst)

    def write_atomic(self, name: str, data: bytes) -> None:
        """Write ``data`` to ``name`` through a temp name (fsynced locally): never half a file."""
        parent, _, base = name.rpartition("/")
        tmp = f"{parent}/.{base}.tmp" if parent else f".{base}.tmp"
        with self.open_write(tmp) as f:
            f.write(data)
            if not self.remote:
                f.flush()
                os.fsync(f.fileno())
        self.commit(tmp, name)

    def remove(self, *names: str) -> None:
        """Remove a file or folder tree; a missing one is fine."""
        if not self.remote:
            target = self.join(*names)
            if os.path.isdir(target):
                shutil.rmtree(target, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(target)
            return
        fs, inner = self._inner(*names)
        with contextlib.suppress(FileNotFoundError):
            fs.rm(inner, recursive=True)

