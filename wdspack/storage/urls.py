"""Names of places, local or remote, and how they expand; no I/O.

Local paths (``file://`` stripped), ``http(s)://``, ``hf://`` and any other ``scheme://`` (an fsspec
store: ``s3://``, ``gs://``, ``az://``, ``memory://``). A remote folder is never listed: its files are
named by joining with ``/`` or by a brace pattern (:func:`expand_braces`).
"""

from __future__ import annotations

import os
import posixpath
import re

__all__ = ["basename_url", "dirname_url", "expand_braces", "is_fsspec", "is_http", "is_remote", "is_url",
           "join_url", "local_path"]


def is_url(path: str | os.PathLike[str]) -> bool:
    """True for ``scheme://…`` other than ``file://`` (which is read as a local path).

    Example:
        >>> is_url("s3://b/x.jsonl"), is_url("file:///x.jsonl"), is_url("data/x.jsonl")
        (True, False, False)
    """
    text = str(path)
    return "://" in text and not text.startswith("file://")


def local_path(path: str | os.PathLike[str]) -> str:
    """A local path, with ``file://`` stripped and ``~`` expanded, made absolute."""
    text = str(path)
    if text.startswith("file://"):
        text = text[len("file://"):]
    return os.path.abspath(os.path.expanduser(text))


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


def expand_braces(pattern: str) -> list[str]:
    """Expand ``{a,b}`` alternatives and zero-padded ``{000..012}`` ranges.

    Example:
        >>> expand_braces("train-{000..002}.tar")
        ['train-000.tar', 'train-001.tar', 'train-002.tar']
    """
    m = re.search(r"\{(\d+\.\.\d+|[^{}]*,[^{}]*)\}", pattern)
    if not m:
        return [pattern]
    body = m.group(1)
    r = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if r:
        width = len(r.group(1)) if r.group(1).startswith("0") else 0
        items = [str(i).zfill(width) for i in range(int(r.group(1)), int(r.group(2)) + 1)]
    else:
        items = body.split(",")
    head, tail = pattern[:m.start()], pattern[m.end():]
    return [out for item in items for out in expand_braces(head + item + tail)]


def join_url(folder: str, name: str) -> str:
    """``name`` inside ``folder``: ``/``-joined for a remote folder, ``os.path.join`` for a local one."""
    if is_remote(folder):
        return folder.rstrip("/") + "/" + name
    return os.path.join(folder, name)


def dirname_url(url: str) -> str:
    """The folder of a path or URL."""
    return posixpath.dirname(url) if is_remote(url) else os.path.dirname(url)


def basename_url(url: str) -> str:
    """The file name of a path or URL."""
    return posixpath.basename(url)
