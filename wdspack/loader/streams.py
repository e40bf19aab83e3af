"""Sequential byte streams over local files, HTTP(S) and fsspec stores, resumable at any byte.

A stream is read front to back in reads of at most ``block_size``; :meth:`skip` jumps forward (a seek
locally; over HTTP a new ``Range`` request when the jump is long and the server honours ranges).
Transient network failures — a refused or reset connection, a timeout, a body shorter than its
``Content-Length``, HTTP 408/425/429/5xx — are retried with exponential back-off (or the server's
``Retry-After``), and the read continues at the exact byte with ``Range: bytes={offset}-``. A server
that ignores ``Range`` (answers 200) is handled by discarding the bytes already read.

Headers (a Hub token among them) are sent to the URL's host only: a redirect to another host drops
``Authorization``. No header value ever reaches a log line, an error message or a ``repr``.

Any other ``scheme://`` (``s3://``, ``gs://``, ``az://``, ``memory://``) is an fsspec store, read by
:class:`FsspecStream` with the same contract. On S3 (s3fs) a stream is one streaming ``GetObject``
(``Range: bytes={offset}-`` past byte 0), read a block at a time, with no cache and no read-ahead
beyond the socket's; botocore's own retries are switched off (``max_attempts=1``) and s3fs's
retrying wrapper is not used, so every retry is this module's: counted, logged, and resumed at the
exact byte. Other stores are opened with ``fs.open(cache_type="none")`` and seeked to the byte.
The storage options (keys, tokens) travel in the ``headers`` argument and are never printed either.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import logging
import os
import random
import re
import socket
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ..errors import SourceError

__all__ = ["FileStream", "FsspecStream", "HttpStream", "LocalStream", "NotFoundError", "is_fsspec", "open_stream", "read_all"]

logger = logging.getLogger("wdspack.loader")

TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
MAX_WAIT_S = 60.0
_TRANSIENT_ERRORS = (OSError, http.client.HTTPException)  # resets, timeouts, IncompleteRead, ...


class NotFoundError(SourceError):
    """The file is not there (HTTP 404, or no such local file)."""


_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


def is_http(url: str) -> bool:
    return url.startswith(("http://", "https://"))


def is_fsspec(url: str) -> bool:
    """True for a URL fsspec opens: a ``scheme://`` other than http(s), ``hf://`` and ``file://``.

    Example:
        >>> is_fsspec("s3://bucket/ds/"), is_fsspec("https://host/ds/"), is_fsspec("/data/ds")
        (True, False, False)
    """
    m = _SCHEME.match(url)
    return m is not None and m.group(1).lower() not in ("http", "https", "hf", "file")


def is_remote(url: str) -> bool:
    """Read over the network (http(s) or an fsspec store): joined with ``/``, never listed."""
    return is_http(url) or is_fsspec(url)


def open_stream(url: str, *, offset: int = 0, block_size: int = 1 << 20, retries: int = 5, backoff: float = 0.5,
                headers: Mapping[str, Any] | None = None, stats: Counter | None = None,
                timeout: float = 60.0) -> LocalStream | HttpStream | FsspecStream:
    """Open ``url`` (a local path, an http(s) URL or an fsspec URL) for sequential reading from ``offset``.

    ``headers`` are the request headers of an http(s) URL, or the storage options of an fsspec URL.
    """
    if is_http(url):
        return HttpStream(url, offset=offset, block_size=block_size, retries=retries, backoff=backoff,
                          headers=headers, stats=stats, timeout=timeout)
    if is_fsspec(url):
        return FsspecStream(url, offset=offset, block_size=block_size, retries=retries, backoff=backoff,
                            storage_options=headers, stats=stats, timeout=timeout)
    return LocalStream(url, offset=offset, block_size=block_size)


def read_all(url: str, **kwargs) -> bytes:
    """The whole resource (a manifest), through the same retrying stream."""
    with open_stream(url, **kwargs) as s:
        chunks = []
        while chunk := s.read(1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)


class LocalStream:
    """A local file read with ``open()`` and a ``block_size`` buffer."""

    def __init__(self, path: str, *, offset: int = 0, block_size: int = 1 << 20) -> None:
        self.url = path[len("file://"):] if path.startswith("file://") else path
        try:
            self._f = open(self.url, "rb", buffering=block_size)
        except FileNotFoundError:
            raise NotFoundError(f"shard {self.url} does not exist; the manifest lists it, so the dataset folder "
                                "is incomplete") from None
        except OSError as e:
            raise SourceError(f"cannot open shard {self.url}: {e.strerror}; check the path (the manifest lists it)") from None
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
    (:func:`wdspack.loader.stages.tar_entries`). Positions are absolute, so others may seek ``f``
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


class _SameHostAuth(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but never carry ``Authorization`` to another host (a CDN)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urlsplit(newurl).netloc != urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_SameHostAuth())


class _Transient(Exception):
    def __init__(self, what: str, wait: float | None = None) -> None:
        super().__init__(what)
        self.wait = wait


class _RetryingStream:
    """What the network streams share: a block buffer the caller reads and skips through, and
    retries with back-off. A subclass fills the buffer (``_fill``) and drops its transport
    (``_drop``: a response, a body); the next ``_fill`` reopens at ``offset + len(_buf)``."""

    _ranges = True  # False once a server showed it ignores Range: long skips then read through

    def __init__(self, url: str, *, offset: int, block_size: int, retries: int, backoff: float,
                 stats: Counter | None, timeout: float) -> None:
        self.url = url
        self.offset = offset  # next byte the caller gets
        self._block = max(512, int(block_size))
        self._retries = retries
        self._backoff = backoff
        self._stats = stats if stats is not None else Counter()
        self._timeout = timeout
        self._buf = bytearray()
        self._eof = False
        self._jitter = random.Random()  # back-off jitter only; never touches the data order

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, offset={self.offset})"

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes; fewer only at the end of the resource."""
        while len(self._buf) < n and not self._eof:
            self._fill()
        out = bytes(self._buf[:n])
        del self._buf[:n]
        self.offset += len(out)
        return out

    def skip(self, n: int) -> None:
        """Move ``n`` bytes forward: drop buffered bytes, read through short gaps, reopen at the byte past long ones."""
        if n <= len(self._buf):
            del self._buf[:n]
            self.offset += n
            return
        n -= len(self._buf)
        self.offset += len(self._buf)
        self._buf.clear()
        if self._ranges and n > 4 * self._block and not self._eof:
            self._drop()
            self.offset += n
            return
        while n > 0:
            chunk = self.read(min(n, self._block))
            if not chunk:
                break
            n -= len(chunk)

    def close(self) -> None:
        self._drop()
        self._eof = True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _fill(self) -> None:
        raise NotImplementedError

    def _drop(self) -> None:
        raise NotImplementedError

    def _wait_to_retry(self, e: BaseException, attempt: int) -> None:
        """Count and log retry ``attempt`` and sleep its back-off, or raise once the retries are spent."""
        at = self.offset + len(self._buf)
        if attempt > self._retries:
            raise SourceError(f"reading {self.url} failed at byte {at} after {self._retries} retries: "
                              f"{_describe(e)}; check the network or raise retries=") from None
        wait = getattr(e, "wait", None)
        if wait is None:
            wait = self._backoff * 2 ** (attempt - 1) * (0.5 + self._jitter.random())
        wait = min(wait, MAX_WAIT_S)
        self._stats["retries"] += 1
        logger.warning("%s: %s; retry %d/%d at byte %d in %.1fs", self.url, _describe(e), attempt, self._retries,
                       at, wait)
        time.sleep(wait)


class HttpStream(_RetryingStream):
    """One HTTP(S) resource read front to back; survives dropped connections (see the module doc).

    Example:
        >>> with HttpStream("https://example.org/train-000000.tar") as s:  # doctest: +SKIP
        ...     header = s.read(512)
    """

    def __init__(self, url: str, *, offset: int = 0, block_size: int = 1 << 20, retries: int = 5,
                 backoff: float = 0.5, headers: Mapping[str, str] | None = None, stats: Counter | None = None,
                 timeout: float = 60.0) -> None:
        super().__init__(url, offset=offset, block_size=block_size, retries=retries, backoff=backoff, stats=stats,
                         timeout=timeout)
        self._headers = dict(headers or {})
        self._resp = None
        self._remaining: int | None = None  # body bytes the open response still owes

    # -- network --------------------------------------------------------------------------------

    def _fill(self) -> None:
        attempt = 0
        while True:
            try:
                if self._resp is None:
                    self._connect()
                    if self._eof:
                        return
                # read1: what has arrived, up to a block. read() would wait for the whole block and
                # drop the part it holds when the connection then resets or times out, so a server
                # that cuts every connection short of a block would never let the read progress.
                chunk = self._resp.read1(self._block)
                if not chunk:
                    if self._remaining:
                        raise _Transient(f"connection closed {self._remaining} bytes early")
                    self._eof = True
                    self._drop()
                    return
                if self._remaining is not None:
                    self._remaining -= len(chunk)
                self._buf += chunk
                self._stats["bytes_read"] += len(chunk)
                return
            except (_Transient, *_TRANSIENT_ERRORS) as e:
                self._drop()
                attempt += 1
                self._wait_to_retry(e, attempt)

    def _net_offset(self) -> int:
        return self.offset + len(self._buf)

    def _connect(self) -> None:
        start = self._net_offset()
        req = urllib.request.Request(self.url, headers=self._headers)
        if start > 0:
            req.add_header("Range", f"bytes={start}-")
        try:
            resp = _OPENER.open(req, timeout=self._timeout)
        except urllib.error.HTTPError as e:
            status = e.code
            retry_after = _retry_after(e.headers.get("Retry-After") if e.headers else None)
            e.close()
            if status == 416 and start > 0:  # nothing left past ``start``: the end
                self._eof = True
                return
            if status in TRANSIENT_STATUS:
                raise _Transient(f"HTTP {status}", retry_after) from None
            if status == 404:
                raise NotFoundError(_status_message(self.url, status)) from None
            raise SourceError(_status_message(self.url, status)) from None
        self._stats["requests"] += 1
        skip_bytes = 0
        if start > 0 and resp.status == 200:
            # The server ignored Range and sends the whole body: throw away what we already have.
            if self._ranges:
                logger.info("%s: the server ignores Range requests; re-reading %d bytes", self.url, start)
            self._ranges = False
            skip_bytes = start
        elif start > 0:
            got = _content_range_start(resp.headers.get("Content-Range"))
            if got != start:
                resp.close()
                raise SourceError(f"{self.url}: asked for bytes from {start}, the server sent {got}; "
                                  "the file changed on the server while reading it")
        length = resp.headers.get("Content-Length")
        self._remaining = int(length) if length is not None and length.isdigit() else None
        self._resp = resp
        while skip_bytes > 0:
            chunk = resp.read(min(skip_bytes, self._block))
            if not chunk:
                raise _Transient("connection closed while skipping to the resume offset")
            skip_bytes -= len(chunk)
            if self._remaining is not None:
                self._remaining -= len(chunk)

    def _drop(self) -> None:
        if self._resp is not None:
            try:
                self._resp.close()
            except OSError:
                pass
            self._resp = None
            self._remaining = None


# -- fsspec stores ----------------------------------------------------------------------------------

#: S3 error codes that mean "try again later" whatever the status (throttling, a busy or failing node).
TRANSIENT_S3_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                                "RequestTimeout", "InternalError", "ServiceUnavailable", "OperationAborted"})
_MISSING_S3_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NoSuchVersion", "404"})


class FsspecStream(_RetryingStream):
    """One object in an fsspec store (``s3://``, ``gs://``, ...) read front to back; survives dropped connections.

    ``storage_options`` go to the store's fsspec filesystem and are never printed. See the module
    doc for how S3 is read (one streaming request per stream, our retries only).

    Example:
        >>> with FsspecStream("s3://bucket/ds/train-000000.tar", storage_options={"profile": "data"}) as s:  # doctest: +SKIP
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
                                      f"{_describe(e)}; check the URL and the storage options") from None
                attempt += 1
                self._wait_to_retry(e, attempt)

    def _open_body(self) -> _S3Body | _FileBody | None:
        start = self.offset + len(self._buf)
        fs, path = _store(self.url, self._options, self._timeout)
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

    from ..storage import filesystem

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
                raise _Transient(f"HTTP {status} {code}".strip()) from None
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
        got = _content_range_start(response.get("ContentRange"))
        if start > 0 and got is None:  # a store that ignores Range sends it all: drop what was read already
            logger.info("%s: the store ignores ranged reads; re-reading %d bytes", url, start)
            try:
                while start > 0:
                    chunk = body.read(min(start, 1 << 20))
                    if not chunk:
                        raise _Transient("connection closed while skipping to the resume offset")
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
    if isinstance(e, _Transient):
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


def _describe(e: BaseException) -> str:
    if isinstance(e, socket.timeout):
        return "timed out"
    return f"{type(e).__name__}: {e}" if not isinstance(e, _Transient) else str(e)


def _retry_after(value: str | None) -> float | None:
    if value and value.strip().isdigit():
        return float(value.strip())
    return None


def _content_range_start(value: str | None) -> int | None:
    m = re.match(r"bytes (\d+)-", value or "")
    return int(m.group(1)) if m else None


def _status_message(url: str, status: int) -> str:
    if status == 404:
        return (f"{url}: HTTP 404, not found; the manifest lists it, so the dataset is incomplete at this "
                "location or the revision is wrong")
    if status in (401, 403):
        return (f"{url}: HTTP {status}, not authorised; for a private Hub dataset log in (`hf auth login`) or "
                "pass storage_options={'token': ...}")
    return f"{url}: HTTP {status}"
