"""The pack job's image check gives Pillow's full decode's verdict on corrupted JPEGs, cheaper.

Both ways it has: the scan of a sequential JPEG (markers, the scan's bytes, its own headers and
tables decoded as one block of zeros) and the strict 1/8-scale decode.

A corpus of JPEGs of every common layout (baseline 4:2:0 and 4:4:4, grayscale, CMYK, progressive,
restart markers), each corrupted 50 ways (truncated, bits flipped, bytes overwritten, inserted,
deleted, zeroed): ``check_image`` must accept exactly what ``Image.open(...).load()`` decodes.
"""

from __future__ import annotations

import io
import random

import pytest
from PIL import Image, ImageDraw

from wdspack.errors import SampleError
from wdspack.media.image import check as imagecheck
from wdspack.media.image.check import check_image

KINDS = ("base", "gray", "cmyk", "progressive", "444", "restart")


def _jpeg(rng: random.Random, kind: str) -> bytes:
    img = Image.new("RGB", (rng.randint(40, 300), rng.randint(40, 300)), (rng.randrange(256),) * 3)
    draw = ImageDraw.Draw(img)
    for _ in range(5):
        x, y = rng.randrange(img.width), rng.randrange(img.height)
        draw.ellipse((x, y, x + 30, y + 20), fill=(rng.randrange(256), rng.randrange(256), rng.randrange(256)))
    options = {"progressive": {"progressive": True}, "444": {"subsampling": 0},
               "restart": {"restart_marker_blocks": 4}}.get(kind, {})
    img = img.convert({"gray": "L", "cmyk": "CMYK"}.get(kind, "RGB"))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=rng.choice([50, 85, 95]), **options)
    return buf.getvalue()


def _corrupt(rng: random.Random, data: bytes) -> bytes:
    d = bytearray(data)
    i = rng.randrange(len(d))
    how = rng.choice(["truncate", "flip", "overwrite", "insert", "delete", "zero"])
    if how == "truncate":
        return bytes(d[:i])
    if how == "flip":
        d[i] ^= 1 << rng.randrange(8)
    elif how == "overwrite":
        for _ in range(5):
            d[rng.randrange(len(d))] = rng.randrange(256)
    elif how == "insert":
        d[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    elif how == "delete":
        del d[i:i + rng.randint(1, 8)]
    else:
        d[i:i + 16] = bytes(min(16, len(d) - i))
    return bytes(d)


def _pillow_decodes(data: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
        return True
    except Exception:
        return False


def _accepts(data: bytes) -> bool:
    try:
        check_image(data, "image 0", sid="s", max_pixels=64_000_000)
        return True
    except SampleError as e:
        assert e.reason in ("unreadable_image", "image_too_large")  # a corrupted header can claim any size
        return False


@pytest.fixture(scope="module")
def corpus() -> list[bytes]:
    rng = random.Random(0)
    files = []
    for kind in KINDS:
        for _ in range(10):
            good = _jpeg(rng, kind)
            files += [good] + [_corrupt(rng, good) for _ in range(50)]
    return files


@pytest.mark.parametrize("scan", [False, True], ids=["1/8-scale decode", "scan first"])
def test_same_verdict_as_a_full_decode(corpus, monkeypatch, scan):
    """The corpus's files are small: decoded at 1/8 scale, as such files are; with ``scan`` every one
    is scanned first (as files over SCAN_FROM are), and what the scan passes is the decode's to judge no more."""
    fast: list = []
    scanned: list = []
    strict, scanner = imagecheck._strict_jpeg, imagecheck._scanned_jpeg
    monkeypatch.setattr(imagecheck, "_strict_jpeg", lambda d, m: fast.append(strict(d, m)) or fast[-1])
    monkeypatch.setattr(imagecheck, "_scanned_jpeg", lambda d, m: scanned.append(scanner(d, m)) or scanned[-1])
    monkeypatch.setattr(imagecheck, "SCAN_FROM", 0 if scan else 10**9)
    verdicts = [(_accepts(d), _pillow_decodes(d)) for d in corpus]
    wrong = [i for i, (ours, pillow) in enumerate(verdicts) if ours != pillow]
    assert not wrong, f"{len(wrong)} of {len(corpus)} files judged otherwise than Pillow's full decode"
    # every way is exercised: the scan or the strict 1/8-scale decode passes most intact files, Pillow the rest
    passed = sum(s is not None for s in fast + scanned)
    assert passed > len(corpus) // 5
    assert sum(ours for ours, _ in verdicts) > passed  # Pillow accepted some they refused
    assert sum(not ours for ours, _ in verdicts) > len(corpus) // 5
    if scan:  # the scan passes the sequential ones (progressive files are decoded), and some damaged ones too
        assert sum(s is not None for s in scanned) > len(corpus) // 3 and len(scanned) == len(corpus)
    else:
        assert scanned == []


def test_a_photo_sized_jpeg_is_scanned_not_decoded(monkeypatch):
    """A large sequential JPEG is judged by its markers and headers; a progressive one is decoded."""
    import numpy as np

    rng = np.random.default_rng(0)
    pixels = np.clip(rng.normal(128, 40, (480, 640, 3)), 0, 255).astype(np.uint8)
    decoded = []
    strict = imagecheck._strict_jpeg
    monkeypatch.setattr(imagecheck, "_strict_jpeg", lambda d, m: decoded.append(len(d)) or strict(d, m))
    for progressive in (False, True):
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "JPEG", quality=85, progressive=progressive)
        data = buf.getvalue()
        assert len(data) > imagecheck.SCAN_FROM
        assert check_image(data, "image 0", sid="s", max_pixels=10**9) == ((640, 480), "JPEG")
        assert (imagecheck._scanned_jpeg(data, 10**9) is None) is progressive
        assert decoded == ([len(data)] if progressive else [])
        # cut short, or with a marker the scan does not know in its data: decoded, and the verdict Pillow's
        for bad in (data[:-5000], data[:len(data) // 2] + b"\xff\x01" + data[len(data) // 2:]):
            assert imagecheck._scanned_jpeg(bad, 10**9) is None
            assert _accepts(bad) == _pillow_decodes(bad)
        decoded.clear()
    # a bad Huffman table (a DC symbol over 15) is libjpeg's error where the scan starts: the scan
    # decodes the file's tables (one block of zeros) and sees it, as Pillow does
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=85)
    data = bytearray(buf.getvalue())
    dht = data.index(b"\xff\xc4")
    data[dht + 5 + 16 + 11] = 0xFA  # the 12th symbol of the first (DC) table
    assert imagecheck._scanned_jpeg(bytes(data), 10**9) is None
    assert not _pillow_decodes(bytes(data)) and not _accepts(bytes(data))


def test_intact_jpegs_take_the_fast_path_with_their_size():
    rng = random.Random(1)
    for kind in ("base", "gray", "progressive", "444", "restart"):
        data = _jpeg(rng, kind)
        with Image.open(io.BytesIO(data)) as img:
            assert imagecheck._strict_jpeg(data, 10**9) == img.size
            assert check_image(data, "image 0", sid="s", max_pixels=10**9) == (img.size, "JPEG")


def test_without_simplejpeg_pillow_decides_alone(corpus, monkeypatch):
    sample = corpus[::7]
    before = [_accepts(d) for d in sample]
    monkeypatch.setattr(imagecheck, "_simplejpeg", None)
    assert [_accepts(d) for d in sample] == before


def test_limits_are_pillows_messages(monkeypatch):
    data = _jpeg(random.Random(2), "base")
    with Image.open(io.BytesIO(data)) as img:
        w, h = img.size
    with pytest.raises(SampleError, match=rf"image 3 \('a.jpg'\) is {w}x{h} = {w * h} pixels > the limit 100; "
                                          "downscale it or raise max_image_pixels") as e:
        check_image(data, "image 3 ('a.jpg')", sid="s", max_pixels=100)
    assert e.value.reason == "image_too_large"
    # above Pillow's own bomb limit the strict path steps aside and Pillow refuses, as before
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", (w * h) // 3)
    assert imagecheck._strict_jpeg(data, 10**9) is None
    with pytest.raises(SampleError, match="decompression bomb") as e:
        check_image(data, "image 0", sid="s", max_pixels=10**9)
    assert e.value.reason == "image_too_large"
