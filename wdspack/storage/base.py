"""What the network streams share: a block buffer read and skipped front to back, and retries.

A transient failure (see :class:`Transient`) is retried with exponential back-off, or after the
server's ``Retry-After``, at most :data:`MAX_WAIT_S` seconds a wait; a transport subclass
(:class:`~wdspack.storage.http.HttpStream`, :class:`~wdspack.storage.fsspec.FsspecStream`) then
reopens at the exact byte. Every retry is counted (``stats["retries"]``) and logged; no header
value or storage option ever reaches a log line, an error message or a ``repr``.
"""

from __future__ import annotations

import logging
import random
import re
import socket
import time
from collections import Counter

from ..errors import SourceError, WdspackError

__all__ = ["MAX_WAIT_S", "TRANSIENT_STATUS", "NotFoundError", "RetryingStream", "Transient", "content_range_start",
           "describe_error"]

# The loader's logger: whatever streams shards logs under the one name users configure.
logger = logging.getLogger(__name__)

TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
MAX_WAIT_S = 60.0


class NotFoundError(SourceError):
    """The file is not there (HTTP 404, or no such local file)."""


class Transient(WdspackError):
    """A failure worth retrying (throttling, a connection closed early); ``wait`` is the server's ask, in seconds.

    The retry loop catches it; once the retries are spent the reader raises :class:`SourceError`.
    """

    def __init__(self, what: str, wait: float | None = None) -> None:
        super().__init__(what)
        self.wait = wait


class RetryingStream:
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
                              f"{describe_error(e)}; check the network or raise retries=") from None
        wait = getattr(e, "wait", None)
        if wait is None:
            wait = self._backoff * 2 ** (attempt - 1) * (0.5 + self._jitter.random())
        wait = min(wait, MAX_WAIT_S)
        self._stats["retries"] += 1
        logger.warning("%s: %s; retry %d/%d at byte %d in %.1fs", self.url, describe_error(e), attempt, self._retries,
                       at, wait)
        time.sleep(wait)


def describe_error(e: BaseException) -> str:
    if isinstance(e, socket.timeout):
        return "timed out"
    return f"{type(e).__name__}: {e}" if not isinstance(e, Transient) else str(e)


def content_range_start(value: str | None) -> int | None:
    m = re.match(r"bytes (\d+)-", value or "")
    return int(m.group(1)) if m else None
