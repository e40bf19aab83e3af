"""HTTP(S) resources as streams that survive dropped connections (:class:`HttpStream`).

A stream is read front to back in reads of at most ``block_size``; :meth:`~HttpStream.skip` jumps
forward with a new ``Range`` request when the jump is long and the server honours ranges.
Transient failures — a refused or reset connection, a timeout, a body shorter than its
``Content-Length``, HTTP 408/425/429/5xx — are retried (:mod:`.base`), and the read continues at the
exact byte with ``Range: bytes={offset}-``. A server that ignores ``Range`` (answers 200) is
handled by discarding the bytes already read.

Headers (a Hub token among them) are sent to the URL's host only: a redirect to another host drops
``Authorization``. No header value ever reaches a log line, an error message or a ``repr``.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Mapping
from urllib.parse import urlsplit

from ..errors import SourceError
from .base import TRANSIENT_STATUS, NotFoundError, RetryingStream, Transient, content_range_start

__all__ = ["HttpStream"]

# The loader's logger: whatever streams shards logs under the one name users configure.
logger = logging.getLogger(__name__)

_TRANSIENT_ERRORS = (OSError, http.client.HTTPException)  # resets, timeouts, IncompleteRead, ...


class _SameHostAuth(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but never carry ``Authorization`` to another host (a CDN)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urlsplit(newurl).netloc != urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_SameHostAuth())


class HttpStream(RetryingStream):
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
        self._resp: http.client.HTTPResponse | None = None
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
                assert self._resp is not None  # _connect() opened it (or reached the end: _eof)
                # read1: what has arrived, up to a block. read() would wait for the whole block and
                # drop the part it holds when the connection then resets or times out, so a server
                # that cuts every connection short of a block would never let the read progress.
                chunk = self._resp.read1(self._block)
                if not chunk:
                    if self._remaining:
                        raise Transient(f"connection closed {self._remaining} bytes early")
                    self._eof = True
                    self._drop()
                    return
                if self._remaining is not None:
                    self._remaining -= len(chunk)
                self._buf += chunk
                self._stats["bytes_read"] += len(chunk)
                return
            except (Transient, *_TRANSIENT_ERRORS) as e:
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
                raise Transient(f"HTTP {status}", retry_after) from None
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
            got = content_range_start(resp.headers.get("Content-Range"))
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
                raise Transient("connection closed while skipping to the resume offset")
            skip_bytes -= len(chunk)
            if self._remaining is not None:
                self._remaining -= len(chunk)

    def _drop(self) -> None:
        if self._resp is not None:
            with contextlib.suppress(OSError):
                self._resp.close()
            self._resp = None
            self._remaining = None


def _retry_after(value: str | None) -> float | None:
    if value and value.strip().isdigit():
        return float(value.strip())
    return None


def _status_message(url: str, status: int) -> str:
    if status == 404:
        return (f"{url}: HTTP 404, not found; the manifest lists it, so the dataset is incomplete at this "
                "location or the revision is wrong")
    if status in (401, 403):
        return (f"{url}: HTTP {status}, not authorised; for a private Hub dataset log in (`hf auth login`) or "
                "pass storage_options={'token': ...}")
    return f"{url}: HTTP {status}"
