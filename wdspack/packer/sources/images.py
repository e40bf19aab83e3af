"""Turn an image reference from a record into encoded image bytes.

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
when samples are built.
"""

from __future__ import annotations

import base64
import binascii
import os
import posixpath
from typing import Any

from ...errors import SampleError
from ...storage.fsspec import filesystem
from ...storage.urls import is_url

__all__ = ["image_name", "load_image", "resolve_image_path"]


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
    if isinstance(ref, (bytes, bytearray, memoryview)):
        return bytes(ref)
    if isinstance(ref, dict):
        return _load_dict(ref, image_root, absolute_ok)
    if isinstance(ref, str):
        if ref.startswith("data:"):
            return _decode_data_url(ref)
        if ref.startswith(("http://", "https://")) or (is_url(ref) and not is_url(image_root)):
            raise SampleError("missing_image", f"image {ref!r} is a remote URL outside the image root "
                              f"{image_root!r}; refer to images by a path relative to the image root "
                              "(--image-root may itself be a URL such as s3://bucket/images)")
        if ref.startswith("file://"):
            ref = ref[len("file://"):]
        if is_url(image_root):
            return _read_file(_resolve_url(ref, image_root), ref)
        return _read_file(resolve_image_path(ref, image_root, absolute_ok=absolute_ok), ref)
    raise SampleError("malformed_record", f"an image reference is {type(ref).__name__} {_short(ref)}; "
                      "expected a path string, bytes, or a {'bytes', 'path'} object")


def image_name(ref: Any) -> str:
    """How a drop detail names an image: its path, or ``""`` for inline bytes.

    Example:
        >>> image_name("imgs/a.png"), image_name({"bytes": b"...", "path": "a.png"}), image_name(b"...")
        ('imgs/a.png', 'a.png', '')
    """
    if isinstance(ref, str):
        return "a data: URL" if ref.startswith("data:") else ref
    if isinstance(ref, dict):
        for key in ("path", "url", "image_url", "image"):
            if ref.get(key) is not None:
                return image_name(ref[key])
    return ""


def _load_dict(ref: dict, image_root: str, absolute_ok: bool) -> bytes:
    if ref.get("bytes") is not None:
        return load_image(ref["bytes"], image_root)
    url = ref.get("url")
    if url is None and isinstance(ref.get("image_url"), (dict, str)):
        inner = ref["image_url"]
        url = inner.get("url") if isinstance(inner, dict) else inner
    for key in ("path", "image"):
        if url is None and isinstance(ref.get(key), (str, dict, bytes)):
            url = ref[key]
    if url is None:
        raise SampleError("malformed_record", f"an image object {_short(ref)} has no bytes, path or url; "
                          "give each image as a path string or a {'bytes', 'path'} object")
    return load_image(url, image_root, absolute_ok=absolute_ok)


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
    if not path:
        raise SampleError("malformed_record", "an image path is the empty string; name the image file")
    written = os.path.normpath(os.path.join(image_root, path))
    if (absolute_ok and os.path.isabs(path)) or _inside(written, image_root):
        return written
    real = os.path.realpath(written)
    if _inside(real, image_root):
        return real
    fix = ("give the folder that holds such paths as --image-root (or --image-root / for absolute paths "
           "anywhere)" if os.path.isabs(path) else "keep image paths inside the root (or pass a wider --image-root)")
    raise SampleError("image_path_escape", f"image path {path!r} resolves to {written!r}, outside the "
                      f"image root {image_root!r}; {fix}")


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def _read_file(where: str, shown: str) -> bytes:
    """The bytes of a local path or a URL; any failure is a ``missing_image`` drop."""
    try:
        if is_url(where):
            fs, inner = filesystem(where)
            return fs.cat_file(inner)
        with open(where, "rb") as f:
            return f.read()
    except FileNotFoundError:
        detail = f"image {shown!r} does not exist (looked for {where!r}); check the path or --image-root"
    except IsADirectoryError:
        detail = f"image {shown!r} is a folder ({where!r}), not an image file; check the path"
    except OSError as e:
        detail = f"image {shown!r} cannot be read ({e.strerror or e}); check its permissions or credentials"
    raise SampleError("missing_image", detail)


def _resolve_url(ref: str, image_root: str) -> str:
    """``ref`` (relative, or a URL) joined to a URL root, ``..`` resolved, checked to stay inside."""
    if not ref:
        raise SampleError("malformed_record", "an image path is the empty string; name the image file")
    root = image_root.rstrip("/")
    scheme, _, root_path = root.partition("://")
    joined = ref if is_url(ref) else f"{scheme}://" + posixpath.normpath(posixpath.join(root_path, ref))
    if not (joined == root or joined.startswith(root + "/")):
        raise SampleError("image_path_escape", f"image path {ref!r} resolves to {joined!r}, outside the "
                          f"image root {image_root!r}; keep image paths inside the root (or pass a "
                          "wider --image-root)")
    return joined


def _decode_data_url(url: str) -> bytes:
    head, sep, payload = url.partition(",")
    if not sep or not head.endswith(";base64"):
        raise SampleError("malformed_record", f"image URL {_short(url)} is not a base64 data URL "
                          "('data:image/png;base64,...')")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise SampleError("malformed_record", f"image data URL {_short(url)} is not valid base64") from None


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
