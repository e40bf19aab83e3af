"""Sequential byte streams over local files and HTTP(S), resumable at any byte.

A stream is read front to back in reads of at most ``block_size``; :meth:`skip` jumps forward (a seek
locally; over HTTP a new ``Range`` request when the jump is long and the server honours ranges).
Transient network failures — a refused or reset connection, a timeout, a body shorter than its
``Content-Length``, HTTP 408/425/429/5xx — are retried with exponential back-off (or the server's
``Retry-After``), and the read continues at the exact byte with ``Range: bytes={offset}-``. A server
that ignores ``Range`` (answers 200) is handled by discarding the bytes already read.

Headers (a Hub token among them) are sent to the URL's host only: a redirect to another host drops
``Authorization``. No header value ever reaches a log line, an error message or a ``repr``.
"""

from __future__ import annotations

import http.client
import logging
import random
import re
import socket
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Mapping
from urllib.parse import urlsplit

from ..errors import SourceError

__all__ = ["HttpStream", "LocalStream", "NotFoundError", "open_stream", "read_all"]

logger = logging.getLogger("wdspack.loader")

TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
MAX_WAIT_S = 60.0
_TRANSIENT_ERRORS = (OSError, http.client.HTTPException)  # resets, timeouts, IncompleteRead, ...


class NotFoundError(SourceError):
    """The file is not there (HTTP 404, or no such local file)."""


def is_remote(url: str) -> bool:
    return url.startswith(("http://", "https://"))


def open_stream(url: str, *, offset: int = 0, block_size: int = 1 << 20, retries: int = 5, backoff: float = 0.5,
                headers: Mapping[str, str] | None = None, stats: Counter | None = None,
                timeout: float = 60.0) -> LocalStream | HttpStream:
    """Open ``url`` (a local path or an http(s) URL) for sequential reading from ``offset``."""
    if is_remote(url):
        return HttpStream(url, offset=offset, block_size=block_size, retries=retries, backoff=backoff,
                          headers=headers, stats=stats, timeout=timeout)
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


class HttpStream:
    """One HTTP(S) resource read front to back; survives dropped connections (see the module doc).

    Example:
        >>> with HttpStream("https://example.org/train-000000.tar") as s:  # doctest: +SKIP
        ...     header = s.read(512)
    """

    def __init__(self, url: str, *, offset: int = 0, block_size: int = 1 << 20, retries: int = 5,
                 backoff: float = 0.5, headers: Mapping[str, str] | None = None, stats: Counter | None = None,
                 timeout: float = 60.0) -> None:
        self.url = url
        self.offset = offset  # next byte the caller gets
        self._block = max(512, int(block_size))
        self._retries = retries
        self._backoff = backoff
        self._headers = dict(headers or {})
        self._stats = stats if stats is not None else Counter()
        self._timeout = timeout
        self._buf = bytearray()
        self._resp = None
        self._remaining: int | None = None  # body bytes the open response still owes
        self._eof = False
        self._ranges = True  # False once the server answered 200 to a Range request
        self._jitter = random.Random()  # back-off jitter only; never touches the data order

    def __repr__(self) -> str:
        return f"HttpStream({self.url!r}, offset={self.offset})"

    # -- reading --------------------------------------------------------------------------------

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes; fewer only at the end of the resource."""
        while len(self._buf) < n and not self._eof:
            self._fill()
        out = bytes(self._buf[:n])
        del self._buf[:n]
        self.offset += len(out)
        return out

    def skip(self, n: int) -> None:
        """Move ``n`` bytes forward: drop buffered bytes, read through short gaps, re-request long ones."""
        if n <= len(self._buf):
            del self._buf[:n]
            self.offset += n
            return
        n -= len(self._buf)
        self.offset += len(self._buf)
        self._buf.clear()
        if self._ranges and n > 4 * self._block and not self._eof:
            self._close_response()
            self.offset += n
            return
        while n > 0:
            chunk = self.read(min(n, self._block))
            if not chunk:
                break
            n -= len(chunk)

    def close(self) -> None:
        self._close_response()
        self._eof = True

    def __enter__(self) -> HttpStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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
                    self._close_response()
                    return
                if self._remaining is not None:
                    self._remaining -= len(chunk)
                self._buf += chunk
                self._stats["bytes_read"] += len(chunk)
                return
            except (_Transient, *_TRANSIENT_ERRORS) as e:
                self._close_response()
                attempt += 1
                if attempt > self._retries:
                    raise SourceError(f"reading {self.url} failed at byte {self._net_offset()} after "
                                      f"{self._retries} retries: {_describe(e)}; check the network or raise "
                                      "retries=") from None
                wait = getattr(e, "wait", None)
                if wait is None:
                    wait = self._backoff * 2 ** (attempt - 1) * (0.5 + self._jitter.random())
                wait = min(wait, MAX_WAIT_S)
                self._stats["retries"] += 1
                logger.warning("%s: %s; retry %d/%d at byte %d in %.1fs", self.url, _describe(e), attempt,
                               self._retries, self._net_offset(), wait)
                time.sleep(wait)

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

    def _close_response(self) -> None:
        if self._resp is not None:
            try:
                self._resp.close()
            except OSError:
                pass
            self._resp = None
            self._remaining = None


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
