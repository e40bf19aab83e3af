"""Any fsspec store (``s3://``, ``gs://``, ``az://``, ``memory://``, ...): its filesystem, and its objects as streams.

:func:`filesystem` opens the store a URL names (the pack job's reads and writes go through it,
:mod:`.location`). :class:`FsspecStream` reads one object front to back with the contract of the
other streams (:mod:`.base`): on S3 (s3fs) a stream is one streaming ``GetObject``
(``Range: bytes={offset}-`` past byte 0), read a block at a time, with no cache and no read-ahead
beyond the socket's; botocore's own retries are switched off (``max_attempts=1``) and s3fs's
retrying wrapper is not used, so every retry is this module's: counted, logged, and resumed at the
exact byte. Other stores are opened with ``fs.open(cache_type="none")`` and seeked to the byte.
The storage options (keys, tokens) travel in the ``headers`` argument of
:func:`~wdspack.storage.streams.open_stream` and are never printed.

Credentials and endpoints come from where each backend looks for them (environment variables
such as ``AWS_ENDPOINT_URL``/``AWS_PROFILE``, fsspec's config files, ``HF_TOKEN``), or from the
storage options, never from a log or a manifest.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import logging
import os
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError, SourceError
from .base import TRANSIENT_STATUS, NotFoundError, RetryingStream, Transient, content_range_start, describe_error
from .hf import with_hub_revision

__all__ = ["TRANSIENT_S3_CODES", "FsspecStream", "filesystem", "url_of"]

# The loader's logger: whatever streams shards logs under the one name users configure.
logger = logging.getLogger(__name__)

_BACKENDS = "s3fs for s3://, gcsfs for gs://, adlfs for az://"


def filesystem(url: str, **options: Any) -> tuple[Any, str]:
    """``(fsspec filesystem, path inside it)`` for a URL; ``hf://`` gets ``@main`` when unnamed.

    Raises:
        ConfigError: no fsspec backend for the URL's scheme is installed.
    """
    import fsspec

    url = with_hub_revision(url)
    try:
        return fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError) as e:
        scheme = url.split("://", 1)[0]
        raise ConfigError(f"cannot open {url!r}: {e}; install the fsspec backend for {scheme}:// "
                          f"({_BACKENDS})") from None


def url_of(fs: Any, path: str) -> str:
    """The full URL of ``path`` inside ``fs`` (the inverse of :func:`filesystem`)."""
    return fs.unstrip_protocol(path)


# -- objects as streams -----------------------------------------------------------------------------

#: S3 error codes that mean "try again later" whatever the status (throttling, a busy or failing node).
TRANSIENT_S3_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                                "RequestTimeout", "InternalError", "ServiceUnavailable", "OperationAborted"})
_MISSING_S3_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NoSuchVersion", "404"})


class FsspecStream(RetryingStream):
    """One object in an fsspec store (``s3://``, ``gs://``, ...) read front to back; survives dropped connections.

    ``storage_options`` go to the store's fsspec filesystem and are never printed. See the module
    doc for how S3 is read (one streaming request per stream, our retries only).

    Example:
        >>> with FsspecStream("s3://bucket/ds/train-000000.tar",
        ...                   storage_options={"profile": "data"}) as s:  # doctest: +SKIP
        ...     header = s.read(512)
    """

    def __init__(self, url: str, *, offset: int = 0, block_size: int = 1 << 20, retries: int = 5,
                 backoff: float = 0.5, storage_options: Mapping[str, Any] | None = None,
                 stats: Counter | None = None, timeout: float = 60.0) -> None:
        super().__init__(url, offset=offset, block_size=block_size, retries=retries, backoff=backoff, stats=stats,
                         timeout=timeout)
        self._options = dict(storage_options or {})
        self._body: _S3Body | _FileBody | None = None

    def _fill(self) -> None:
        attempt = 0
        while True:
            try:
                if self._body is None:
                    self._body = self._open_body()
                    if self._body is None:  # nothing past the offset
                        self._eof = True
                        return
                chunk = self._body.read(self._block)
                if not chunk:
                    self._eof = True
                    self._drop()
                    return
                self._buf += chunk
                self._stats["bytes_read"] += len(chunk)
                return
            except Exception as e:  # sorted below into transient (retried) and the rest (raised)
                self._drop()
                if isinstance(e, SourceError):
                    raise
                if not _is_transient(e):
                    raise SourceError(f"reading {self.url} failed at byte {self.offset + len(self._buf)}: "
                                      f"{describe_error(e)}; check the URL and the storage options") from None
                attempt += 1
                self._wait_to_retry(e, attempt)

    def _open_body(self) -> _S3Body | _FileBody | None:
        start = self.offset + len(self._buf)
        fs, path = _store(self.url, self._options, self._timeout)
        body: _S3Body | _FileBody | None
        if "s3" in _protocols(fs) and hasattr(fs, "split_path") and hasattr(fs, "get_s3"):
            body = _S3Body.open(fs, path, start=start, url=self.url)
        else:
            body = _FileBody.open(fs, path, start=start, block_size=self._block, url=self.url)
        if body is not None:
            self._stats["requests"] += 1
        return body

    def _drop(self) -> None:
        if self._body is not None:
            body, self._body = self._body, None
            body.close()


_STORES: dict[tuple[int, str], Any] = {}  # (pid, options token) -> filesystem; never emptied (see _store)
_INHERITED: list[Any] = []


def _store(url: str, options: dict[str, Any], timeout: float) -> tuple[Any, str]:
    """``(filesystem, path)`` for ``url``: one filesystem per process and options, reused by its streams.

    A forked process (a DataLoader worker) makes its own, and keeps the parent's alive rather than
    letting them be collected: collecting one runs s3fs's finalizer, which closes the parent's
    connections through the parent's event loop, whose epoll set the child shares, so the parent
    stops hearing from those sockets and its next request on one hangs until the read timeout.
    fsspec's own instance cache drops the parent's instances in a new process; ours are made with
    ``skip_instance_cache`` and the ones fsspec drops are held here first.
    """
    import fsspec
    from fsspec.utils import tokenize

    options = _store_options(url, options, timeout)
    scheme = url.split("://", 1)[0].lower()
    pid = os.getpid()
    key = (pid, tokenize(scheme, options))
    fs = _STORES.get(key)
    if fs is None:
        try:
            cls = fsspec.get_filesystem_class(scheme)
            if getattr(cls, "_pid", pid) != pid:  # the first filesystem of its class in this (forked) process
                _INHERITED.extend(getattr(cls, "_cache", {}).values())
        except (ImportError, ValueError):
            pass  # filesystem() says which backend to install
        fs, _ = filesystem(url, **options, skip_instance_cache=True)
        _STORES[key] = fs
    return fs, fs._strip_protocol(url)


def _protocols(fs) -> tuple[str, ...]:
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


def _store_options(url: str, options: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The filesystem's options: for S3, botocore's retries off (ours are counted and resume at the byte)
    and the read's ``timeout`` as its connect and read timeouts unless the options name their own."""
    scheme = url.split("://", 1)[0].lower()
    if scheme not in ("s3", "s3a"):
        return options
    config = dict(options.get("config_kwargs") or {})
    config["retries"] = {"total_max_attempts": 1, "mode": "standard"}  # botocore reads max_attempts as retries
    config.setdefault("connect_timeout", timeout)
    config.setdefault("read_timeout", timeout)
    return {**options, "config_kwargs": config}


class _S3Body:
    """One streaming ``GetObject`` from a byte on (s3fs's client; none of its caches or retries)."""

    def __init__(self, fs, response: dict[str, Any]) -> None:
        self._fs = fs
        self._stream = response["Body"]

    @classmethod
    def open(cls, fs, path: str, *, start: int, url: str) -> _S3Body | None:
        from botocore.exceptions import ClientError
        from fsspec.asyn import sync

        bucket, key, version = fs.split_path(path)
        try:
            response = sync(fs.loop, _get_object, fs, bucket, key, version, start)
        except ClientError as e:
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = str(e.response.get("Error", {}).get("Code", ""))
            if (status == 416 or code == "InvalidRange") and start > 0:
                return None
            if status in TRANSIENT_STATUS or code in TRANSIENT_S3_CODES:
                raise Transient(f"HTTP {status} {code}".strip()) from None
            if status == 404 or code in _MISSING_S3_CODES:
                raise NotFoundError(f"{url}: not found ({code or status}); the manifest lists it, so the dataset "
                                    "is incomplete at this location (copy the whole dataset folder) or the bucket "
                                    "or prefix is wrong") from None
            if status in (401, 403):
                raise SourceError(f"{url}: HTTP {status} ({code}), not authorised; give credentials through "
                                  "storage_options (key/secret, profile) or the environment (AWS_PROFILE, "
                                  "AWS_ACCESS_KEY_ID)") from None
            raise SourceError(f"{url}: S3 error {code} (HTTP {status})") from None
        body = cls(fs, response)
        got = content_range_start(response.get("ContentRange"))
        if start > 0 and got is None:  # a store that ignores Range sends it all: drop what was read already
            logger.info("%s: the store ignores ranged reads; re-reading %d bytes", url, start)
            try:
                while start > 0:
                    chunk = body.read(min(start, 1 << 20))
                    if not chunk:
                        raise Transient("connection closed while skipping to the resume offset")
                    start -= len(chunk)
            except BaseException:
                body.close()
                raise
        elif start > 0 and got != start:
            body.close()
            raise SourceError(f"{url}: asked for bytes from {start}, the store sent {got}; the object changed "
                              "while reading it")
        return body

    def read(self, n: int) -> bytes:
        from fsspec.asyn import sync

        return sync(self._fs.loop, self._stream.read, n)

    def close(self) -> None:
        from fsspec.asyn import sync

        # Drops the connection (not drained): the rest of the object is not wanted. Closing a broken
        # connection may fail; it is gone either way.
        with contextlib.suppress(Exception):
            sync(self._fs.loop, _close_async, self._stream)


async def _get_object(fs, bucket: str, key: str, version: str | None, start: int) -> dict[str, Any]:
    await fs.set_session()
    client = await fs.get_s3(bucket)
    kwargs = {"Bucket": bucket, "Key": key, **fs.req_kw}
    if version:
        kwargs["VersionId"] = version
    if start > 0:
        kwargs["Range"] = f"bytes={start}-"
    return await client.get_object(**kwargs)


async def _close_async(stream) -> None:
    stream.close()


class _FileBody:
    """Any other fsspec store: ``fs.open`` without a cache, seeked to the byte."""

    def __init__(self, f) -> None:
        self._f = f

    @classmethod
    def open(cls, fs, path: str, *, start: int, block_size: int, url: str) -> _FileBody:
        try:
            f = fs.open(path, "rb", block_size=block_size, cache_type="none")
        except FileNotFoundError:
            raise NotFoundError(f"{url}: not found; the manifest lists it, so the dataset is incomplete at this "
                                "location (copy the whole dataset folder) or the URL is wrong") from None
        except PermissionError:
            raise SourceError(f"{url}: not authorised; give credentials through storage_options or the "
                              "environment the store's fsspec backend reads") from None
        if start:
            f.seek(start)
        return cls(f)

    def read(self, n: int) -> bytes:
        return self._f.read(n)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._f.close()


def _is_transient(e: BaseException) -> bool:
    """Worth retrying: resets, timeouts, short bodies, throttling; not a missing object or a refusal."""
    if isinstance(e, Transient):
        return True
    if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    return isinstance(e, (OSError, TimeoutError, http.client.HTTPException, *_network_errors()))


@functools.cache
def _network_errors() -> tuple[type[BaseException], ...]:
    """The network error types of the optional fsspec backends that are installed."""
    out: list[type[BaseException]] = []
    try:
        from fsspec.exceptions import FSTimeoutError

        out.append(FSTimeoutError)
    except ImportError:
        pass
    try:
        import aiohttp

        out.append(aiohttp.ClientError)  # ClientPayloadError (a short body), ServerDisconnectedError, ...
    except ImportError:
        pass
    try:
        from botocore import exceptions as bx
        from botocore.parsers import ResponseParserError  # throttling can answer with broken XML

        out += [bx.HTTPClientError, bx.ConnectionError, bx.IncompleteReadError, ResponseParserError]
    except ImportError:
        pass
    return tuple(out)


