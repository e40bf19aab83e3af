"""Check that an image decodes, at a fraction of a full decode's cost, with Pillow's verdict.

Every image of a pack job is checked once before it is packed: its size against the pixel limit,
and that it decodes (a file that does not would fail the training step that reads it). A full
decode is the costliest part of a pack job's CPU time; a JPEG decoded at 1/8 scale reads and
Huffman-decodes every entropy-coded byte, so it fails exactly where the full decode fails, at a
third of the cost. ``tests/test_imagecheck.py`` holds the verdict to a full decode's over 3,060
intact and corrupted JPEGs of six layouts (the same verdict on every one; 7,320 in a wider run, likewise).

A JPEG goes first through libjpeg-turbo by ``simplejpeg`` (header, then a 1/8-scale decode to
grey in *strict* mode: any warning of corrupt data is an error; every component's coefficients are
still entropy-decoded, only the colour planes' inverse DCT is skipped), half the cost of Pillow's
draft decode. A strict pass is a clean file, one Pillow decodes too; anything strict mode refuses (a
corrupt but decodable file, a CMYK or 12-bit JPEG, a size over Pillow's bomb limit), every other
format, and a machine without ``simplejpeg`` get Pillow's own check (``Image.open`` then a draft
decode), so the verdict, and the drop reason, are always Pillow's.

Example:
    >>> w, h = check_image(jpeg_bytes, "image 0", sid="s1", max_pixels=64_000_000)  # doctest: +SKIP
"""

from __future__ import annotations

import io
import re
from typing import Any

from PIL import Image

from ..errors import SampleError

__all__ = ["check_image", "downscale", "error_text"]

_simplejpeg: Any
try:  # a wheel for every common platform; without it, Pillow checks every image (slower, the same verdicts)
    import simplejpeg as _simplejpeg  # type: ignore[import-untyped,no-redef]
except ImportError:  # pragma: no cover - the lock installs it
    _simplejpeg = None

_JPEG = b"\xff\xd8\xff"


def error_text(e: BaseException) -> str:
    """The exception as text, without object addresses (drop details must be deterministic)."""
    return f"{type(e).__name__}: " + re.sub(r"\s*<[^<>]* at 0x[0-9a-f]+>", "", str(e))


def _bomb_limit() -> float:
    """Pillow's own decompression-bomb error threshold (above it ``Image.open`` raises)."""
    limit = Image.MAX_IMAGE_PIXELS
    return float("inf") if limit is None else 2 * limit


def _strict_jpeg(data: bytes, max_pixels: int) -> tuple[int, int] | None:
    """``(w, h)`` of a JPEG that decodes cleanly at 1/8 scale, else None (Pillow decides)."""
    if _simplejpeg is None or not data.startswith(_JPEG):
        return None
    try:
        h, w, _, _ = _simplejpeg.decode_jpeg_header(data)
        if w * h > min(max_pixels, _bomb_limit()) or w < 1 or h < 1:
            return None  # Pillow's path names the limit in its message
        # the pixels are thrown away: the fast IDCT and upsampling, 20 % less CPU, same verdict
        _simplejpeg.decode_jpeg(data, colorspace="GRAY", min_height=1, min_width=1, strict=True, fastdct=True,
                                fastupsample=True)
    except Exception:  # strict mode refuses warnings too: Pillow has the last word
        return None
    return w, h


def check_image(data: bytes, which: str, *, sid: str, max_pixels: int) -> tuple[tuple[int, int], str | None]:
    """The image's ``(w, h)`` and format (``"JPEG"``, ...; None where unknown) if it decodes and
    holds at most ``max_pixels`` pixels; else :class:`SampleError` ``image_too_large`` or
    ``unreadable_image`` naming ``which`` (e.g. ``"image 0 ('a.jpg')"``) and the fix."""
    size = _strict_jpeg(data, max_pixels)
    if size is not None:
        return size, "JPEG"
    try:
        with Image.open(io.BytesIO(data)) as img:
            w, h = img.size
            if w * h > max_pixels:
                raise SampleError("image_too_large", f"{which} is {w}x{h} = {w * h} pixels > the limit "
                                  f"{max_pixels}; downscale it or raise max_image_pixels", sid)
            fmt = img.format
            img.draft("RGB", (max(1, w // 8), max(1, h // 8)))  # JPEG: a 1/8-scale decode, every byte read
            img.load()
    except SampleError:
        raise
    except Image.DecompressionBombError as e:
        raise SampleError("image_too_large", f"{which}: {e}", sid) from None
    except Exception as e:  # PIL raises many types for bad bytes
        raise SampleError("unreadable_image", f"{which} cannot be decoded ({error_text(e)}); "
                          "fix or remove the file", sid) from None
    return (w, h), fmt


def downscale(data: bytes, side: int, fmt: str | None) -> tuple[bytes, tuple[int, int]]:
    """The image re-encoded with its longer side at most ``side`` (Lanczos), and its new size."""
    with Image.open(io.BytesIO(data)) as src:
        img: Any = src.convert("RGB") if fmt == "JPEG" else src.copy()
        img.thumbnail((side, side), Image.Resampling.LANCZOS)
        buf = io.BytesIO()
        img.save(buf, format=fmt or "PNG", **({"quality": 90} if fmt == "JPEG" else {}))
        return buf.getvalue(), img.size
