"""Sequential byte streams over local files, HTTP(S) and fsspec stores, resumable at any byte.

:func:`open_stream` picks the transport by the URL: a local path (:mod:`.local`), ``http(s)://``
(:mod:`.http`; a Hub dataset is read from its ``resolve`` URLs, :mod:`.hf`) or any other
``scheme://``, an fsspec store (:mod:`.fsspec`). Each reads front to back in reads of at most
``block_size``, skips forward, and retries transient failures with back-off, resuming at the exact
byte (:mod:`.base`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from .fsspec import FsspecStream
from .http import HttpStream
from .local import LocalStream
from .urls import is_fsspec, is_http

__all__ = ["open_stream", "read_all"]


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
