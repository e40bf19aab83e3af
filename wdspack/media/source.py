"""Turn an image (or video) reference from a record into its encoded bytes.

A reference is what a record holds for an image: a path relative to the image root, raw bytes,
a Hugging Face ``{"bytes": ..., "path": ...}`` struct, an ``image_url`` dict, or a
``data:image/...;base64,`` URL. Paths are confined to the image root *as written*: joined to
the root and normalised (``..`` resolved lexically), the path must stay inside it. Symlinks are
followed, not judged: a Hugging Face hub-cache snapshot (``snapshots/REV/x.png`` links into
``../../blobs/…``) and a folder of links into other folders are read like plain files, while
``../x.png`` and an absolute path outside an explicitly given root are refused. With no root
given (the root is then just the data file's folder), absolute paths are read where they point.
The root may be a URL (``s3://…``, ``hf://…``): paths are then joined to it, ``..`` resolved,
and read through fsspec. Bytes are returned as they are; whether they decode is checked later,
when samples are built. Videos are read by the same rules (:mod:`.videos`), with their own
drop reasons and a size limit.
"""

from __future__ import annotations

import base64
import binascii
import os
import posixpath
from typing import Any

from ..errors import SampleError
from ..storage.fsspec import filesystem
from ..storage.urls import is_url

__all__ = ["image_name", "load_image", "load_media", "resolve_image_path"]


def load_image(ref: Any, image_root: str, *, absolute_ok: bool = False) -> bytes:
    """The encoded bytes an image reference stands for.

    Args:
        ref: bytes, a path (relative to ``image_root``, or absolute inside it), a
            ``data:`` URL, a ``{"bytes", "path"}`` dict or an ``image_url`` dict.
        image_root: the folder image paths are relative to (already resolved).
        absolute_ok: read absolute paths wherever they point (no image root was given).

    Raises:
        SampleError: ``missing_image``, ``image_path_escape`` or ``malformed_record``.

    Example:
        >>> load_image({"bytes": b"\\x89PNG...", "path": "a.png"}, "/data")
        b'\\x89PNG...'
    """
    return load_media(ref, image_root, absolute_ok=absolute_ok)


def load_media(ref: Any, root: str, *, what: str = "image", absolute_ok: bool = False,
               max_bytes: int | None = None) -> bytes:
    """:func:`load_image`'s rules for a medium ``what`` (``"image"`` or ``"video"``), whose drop
    reasons are ``missing_{what}`` and ``{what}_path_escape``; a file over ``max_bytes`` is
    ``unreadable_{what}`` and is not read.

    Example:
        >>> load_media(b"\\x00\\x00\\x00\\x18ftypmp42", "/data", what="video")
        b'\\x00\\x00\\x00\\x18ftypmp42'
    """
    if isinstance(ref, (bytes, bytearray, memoryview)):
        _check_size(len(ref), "(inline bytes)", what, max_bytes)
        return bytes(ref)
    if isinstance(ref, dict):
        return _load_dict(ref, root, what, absolute_ok, max_bytes)
    if isinstance(ref, str):
        if ref.startswith("data:"):
            data = _decode_data_url(ref, what)
            _check_size(len(data), "(a data: URL)", what, max_bytes)
            return data
        if ref.startswith(("http://", "https://")) or (is_url(ref) and not is_url(root)):
            raise SampleError(f"missing_{what}", f"{what} {ref!r} is a remote URL outside the image root "
                              f"{root!r}; refer to {what}s by a path relative to the image root "
                              "(--image-root may itself be a URL such as s3://bucket/images)")
        if ref.startswith("file://"):
            ref = ref[len("file://"):]
        where = _resolve_url(ref, root, what) if is_url(root) else _resolve(ref, root, absolute_ok, what)
        return _read_file(where, ref, what, max_bytes)
    raise SampleError("malformed_record", f"{_article(what)} {what} reference is {type(ref).__name__} "
                      f"{_short(ref)}; expected a path string, bytes, or a {{'bytes', 'path'}} object")


def image_name(ref: Any) -> str:
    """How a drop detail names an image: its path, or ``""`` for inline bytes.

    Example:
        >>> image_name("imgs/a.png"), image_name({"bytes": b"...", "path": "a.png"}), image_name(b"...")
        ('imgs/a.png', 'a.png', '')
    """
    if isinstance(ref, str):
        return "a data: URL" if ref.startswith("data:") else ref
    if isinstance(ref, dict):
        for key in ("path", "url", "image_url", "image", "video_url", "video"):
            if ref.get(key) is not None:
                return image_name(ref[key])
    return ""


def _load_dict(ref: dict, root: str, what: str, absolute_ok: bool, max_bytes: int | None) -> bytes:
    if ref.get("bytes") is not None:
        return load_media(ref["bytes"], root, what=what, max_bytes=max_bytes)
    url = ref.get("url")
    for key in (f"{what}_url", "image_url"):
        if url is None and isinstance(ref.get(key), (dict, str)):
            inner = ref[key]
            url = inner.get("url") if isinstance(inner, dict) else inner
    for key in ("path", what):
        if url is None and isinstance(ref.get(key), (str, dict, bytes)):
            url = ref[key]
    if url is None:
        raise SampleError("malformed_record", f"{_article(what)} {what} object {_short(ref)} has no bytes, path or "
                          f"url; give each {what} as a path string or a {{'bytes', 'path'}} object")
    return load_media(url, root, what=what, absolute_ok=absolute_ok, max_bytes=max_bytes)


def resolve_image_path(path: str, image_root: str, *, absolute_ok: bool = False) -> str:
    """The path of an image file, checked to lie inside ``image_root`` as written.

    Containment is judged on the path joined to the root and normalised, not on where symlinks
    lead (a hub-cache snapshot's files are links into ``blobs/``); a path whose link target lies
    inside the root is accepted too (a root reached through a symlink). ``absolute_ok`` accepts
    any absolute path (no image root was given).

    Raises:
        SampleError: ``image_path_escape`` when the path leaves the root, ``malformed_record``
            for an empty path.

    Example:
        >>> resolve_image_path("imgs/../imgs/a.png", "/data")
        '/data/imgs/a.png'
    """
    return _resolve(path, image_root, absolute_ok, "image")


def _resolve(path: str, root: str, absolute_ok: bool, what: str) -> str:
    if not path:
        raise SampleError("malformed_record", f"{_article(what)} {what} path is the empty string; name the {what} file")
    written = os.path.normpath(os.path.join(root, path))
    if (absolute_ok and os.path.isabs(path)) or _inside(written, root):
        return written
    real = os.path.realpath(written)
    if _inside(real, root):
        return real
    fix = ("give the folder that holds such paths as --image-root (or --image-root / for absolute paths anywhere)"
           if os.path.isabs(path) else f"keep {what} paths inside the root (or pass a wider --image-root)")
    raise SampleError(f"{what}_path_escape", f"{what} path {path!r} resolves to {written!r}, outside the "
                      f"image root {root!r}; {fix}")


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def _read_file(where: str, shown: str, what: str, max_bytes: int | None) -> bytes:
    """The bytes of a local path or a URL; a missing or unreadable file is a ``missing_{what}`` drop."""
    try:
        if is_url(where):
            fs, inner = filesystem(where)
            if max_bytes is not None:
                _check_size(int(fs.size(inner)), repr(shown), what, max_bytes)
            return fs.cat_file(inner)
        with open(where, "rb") as f:
            if max_bytes is not None:
                _check_size(os.fstat(f.fileno()).st_size, repr(shown), what, max_bytes)
            return f.read()
    except FileNotFoundError:
        detail = f"{what} {shown!r} does not exist (looked for {where!r}); check the path or --image-root"
    except IsADirectoryError:
        detail = f"{what} {shown!r} is a folder ({where!r}), not {_article(what)} {what} file; check the path"
    except OSError as e:
        detail = f"{what} {shown!r} cannot be read ({e.strerror or e}); check its permissions or credentials"
    raise SampleError(f"missing_{what}", detail)


def _check_size(size: int, shown: str, what: str, max_bytes: int | None) -> None:
    if max_bytes is not None and size > max_bytes:
        raise SampleError(f"unreadable_{what}", f"{what} {shown} is {size:,} bytes, over the {max_bytes:,}-byte "
                          f"limit for one {what}; cut or re-encode it smaller, or leave the record out")


def _resolve_url(ref: str, image_root: str, what: str) -> str:
    """``ref`` (relative, or a URL) joined to a URL root, ``..`` resolved, checked to stay inside."""
    if not ref:
        raise SampleError("malformed_record", f"{_article(what)} {what} path is the empty string; name the {what} file")
    root = image_root.rstrip("/")
    scheme, _, root_path = root.partition("://")
    joined = ref if is_url(ref) else f"{scheme}://" + posixpath.normpath(posixpath.join(root_path, ref))
    if not (joined == root or joined.startswith(root + "/")):
        raise SampleError(f"{what}_path_escape", f"{what} path {ref!r} resolves to {joined!r}, outside the "
                          f"image root {image_root!r}; keep {what} paths inside the root (or pass a "
                          "wider --image-root)")
    return joined


def _decode_data_url(url: str, what: str) -> bytes:
    head, sep, payload = url.partition(",")
    if not sep or not head.endswith(";base64"):
        example = "image/png" if what == "image" else "video/mp4"
        raise SampleError("malformed_record", f"{what} URL {_short(url)} is not a base64 data URL "
                          f"('data:{example};base64,...')")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise SampleError("malformed_record", f"{what} data URL {_short(url)} is not valid base64") from None


def _article(what: str) -> str:
    return "an" if what[0] in "aeiou" else "a"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
