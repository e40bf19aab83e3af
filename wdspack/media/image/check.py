"""Check that an image decodes, at a fraction of a full decode's cost, with Pillow's verdict.

Every image of a pack job is checked once before it is packed: its size against the pixel limit,
and that it decodes (a file that does not would fail the training step that reads it). A full
decode is the costliest part of a pack job's CPU time; a JPEG decoded at 1/8 scale reads and
Huffman-decodes every entropy-coded byte, so it fails exactly where the full decode fails, at a
third of the cost. ``tests/packer/test_imagecheck.py`` holds the verdict to a full decode's over 3,060
intact and corrupted JPEGs of six layouts (the same verdict on every one; 7,320 in a wider run, likewise).

A sequential JPEG of :data:`SCAN_FROM` bytes or more is not Huffman-decoded at all
(:func:`_scanned_jpeg`): libjpeg gives up only on what is in a JPEG's markers (headers, tables, a
scan's references) or on a stream cut short; damaged entropy-coded bytes are warned about and
decoded anyway, by Pillow too. So its markers are walked, its one scan's bytes searched for a
marker (only restart markers and then the end of image may come), and its own headers and tables
decoded by libjpeg-turbo in strict mode with the image made one MCU of zeros: a sixth of the
1/8-scale decode's cost for a photo (0.17 against 1.07 ms for a 640x480, 85 KB one), half for a
9 KB drawing. The test holds the scan to the full decode's verdict over the same corpus, every file
scanned first; a wider run of 74,928 files (1,488 of them photo-sized) found none among the 43,256
it passed that Pillow refused. (A first try, decoding the headers with no scan data in libjpeg's
lenient mode, let bad Huffman tables through: 7 files in 30,600; strict mode needs the one MCU.)

Otherwise a JPEG goes first through libjpeg-turbo by ``simplejpeg`` (header, then a 1/8-scale decode to
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

from ...errors import SampleError

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


#: A marker inside entropy-coded data: 0xFF then neither a stuffed 0x00, a fill 0xFF nor RST0-7.
_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")
_NO_LENGTH = frozenset([0x00, 0x01, 0xD8, 0xD9, *range(0xD0, 0xD8)])
_SEQUENTIAL = (0xC0, 0xC1)  # baseline and extended Huffman-coded; others (progressive, ...) decode
#: Bytes from which a JPEG is scanned rather than decoded at 1/8 scale. Measured: the scan costs
#: about 30 us whatever the size, the decode 19 us for 1.6 KB, 39 us for 3 KB, 170 us for 9 KB.
SCAN_FROM = 4 * 1024
_ZERO_CODES: dict[bytes, dict[tuple[int, int], tuple[int, int] | None]] = {}  # by DHT segment


def _zero_codes(segment: bytes) -> dict[tuple[int, int], tuple[int, int] | None]:
    """Per table of a DHT segment (``(class, id)``): the Huffman code of symbol 0 (a DC difference of
    0, an AC end of block) as ``(bits, length)``, None where the table has none (canonical codes, T.81 C)."""
    found = _ZERO_CODES.get(segment)
    if found is not None:
        return found
    out: dict[tuple[int, int], tuple[int, int] | None] = {}
    at = 0
    while at < len(segment):
        counts = segment[at + 1:at + 17]
        values = segment[at + 17:at + 17 + sum(counts)]
        if len(counts) < 16 or len(values) < sum(counts):
            raise ValueError("a DHT segment cut short")
        code, k, zero = 0, 0, None
        for length, count in enumerate(counts, 1):
            for _ in range(count):
                if values[k] == 0 and zero is None:
                    zero = (code, length)
                code, k = code + 1, k + 1
            code <<= 1
        out[(segment[at] >> 4, segment[at] & 15)] = zero
        at += 17 + len(values)
    if len(_ZERO_CODES) < 256:
        _ZERO_CODES[segment] = out
    return out


def _one_mcu(frame: bytes, scan: bytes, tables: dict) -> tuple[int, int, bytes] | None:
    """``(height, width, entropy-coded bytes)`` of an image one MCU in size whose every block is
    zero (a DC difference of 0, then end of block), in the file's own tables; None where it cannot
    be written (a table missing, or without symbol 0)."""
    sampling = {frame[1 + 3 * k]: (frame[2 + 3 * k] >> 4, frame[2 + 3 * k] & 15) for k in range(frame[0])}
    parts = [(scan[1 + 2 * k], scan[2 + 2 * k]) for k in range(scan[0])]
    if len(parts) != len(sampling) or any(c not in sampling for c, _ in parts):
        return None
    hmax = max(h for h, _ in sampling.values())
    vmax = max(v for _, v in sampling.values())
    bits = ""
    for c, t in parts:
        dc, ac = tables.get((0, t >> 4)), tables.get((1, t & 15))
        if dc is None or ac is None:
            return None
        h, v = sampling[c] if len(parts) > 1 else (1, 1)
        bits += (format(dc[0], f"0{dc[1]}b") + format(ac[0], f"0{ac[1]}b")) * (h * v)
    bits += "1" * (-len(bits) % 8)  # padded with ones, as T.81 F.1.2.3 asks
    coded = bytes(int(bits[i:i + 8], 2) for i in range(0, len(bits), 8)).replace(b"\xff", b"\xff\x00")
    return 8 * vmax, 8 * hmax, coded


def _scanned_jpeg(data: bytes, max_pixels: int) -> tuple[int, int] | None:
    """``(w, h)`` of a sequential JPEG whose one scan runs to its end of image with nothing but
    entropy-coded bytes and restart markers in between, and whose headers and tables libjpeg sets up
    and decodes without a warning; None where it cannot tell (the decode decides).

    What makes libjpeg give up on a JPEG is in its markers (headers, tables, what a scan refers to)
    or a stream that ends before its end-of-image marker: bytes of entropy-coded data that are
    wrong are warned about and decoded anyway, by Pillow too. So a file is judged here without
    Huffman-decoding it: its markers walked and its scan's bytes searched for a marker; then its own
    headers and tables, with the image made one MCU of zeros (:func:`_one_mcu`), are decoded by
    libjpeg-turbo in strict mode (a bad table is an error where the scan starts, whatever the size)."""
    if _simplejpeg is None or not data.startswith(b"\xff\xd8"):
        return None
    pos, n, sof, tables = 2, len(data), -1, {}
    try:
        while True:  # the markers up to the scan
            if pos + 4 > n or data[pos] != 0xFF:
                return None
            while pos < n - 3 and data[pos] == 0xFF:
                pos += 1
            marker, length = data[pos], (data[pos + 1] << 8) | data[pos + 2]
            if marker in _NO_LENGTH or length < 2:
                return None
            if marker == 0xC4:
                tables.update(_zero_codes(data[pos + 3:pos + 1 + length]))
            elif 0xC0 <= marker <= 0xCF and marker not in (0xC8, 0xCC):  # a frame header
                if sof >= 0 or marker not in _SEQUENTIAL or length < 8:
                    return None
                sof = pos
            pos += 1 + length
            if marker == 0xDA:
                break
        end = _MARKER.search(data, pos) if sof >= 0 and pos <= n else None
        if end is None or data[end.end() - 1] != 0xD9:  # another scan, a marker after it, no end: decode it
            return None
        h, w = (data[sof + 4] << 8) | data[sof + 5], (data[sof + 6] << 8) | data[sof + 7]  # SOF: Y, then X
        if w * h > min(max_pixels, _bomb_limit()) or not (0 < w <= 65500 and 0 < h <= 65500):
            return None  # the decode's path names the limit; libjpeg's own dimension limit is 65500
        tiny = _one_mcu(data[sof + 8:], data[pos - length + 2:pos], tables)
        if tiny is None:
            return None
        size = bytes([tiny[0] >> 8, tiny[0] & 255, tiny[1] >> 8, tiny[1] & 255])
        _simplejpeg.decode_jpeg(data[:sof + 4] + size + data[sof + 8:pos] + tiny[2] + b"\xff\xd9",
                                colorspace="GRAY", strict=True)
    except Exception:  # a header cut short, a table libjpeg refuses, a warning: decode it
        return None
    return w, h


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
    size = (_scanned_jpeg(data, max_pixels) if len(data) >= SCAN_FROM else None) or _strict_jpeg(data, max_pixels)
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
