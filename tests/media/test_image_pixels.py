"""Image decoding: values, JPEG draft mode, formats, decompression bombs, corrupt bytes, processors."""

from __future__ import annotations

import io
import pickle
import struct
import warnings
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from wdspack.errors import ConfigError, FormatError
from wdspack.format.pack import Pack
from wdspack.loader.batch.collate import pack_to_example
from wdspack.media.image.pixels import (
    CLIP_MEAN,
    CLIP_STD,
    ImageDecodeError,
    ImageTooLargeError,
    decode_image,
    make_image_transform,
    open_image,
)


def _encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _noise(w: int, h: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def _smooth(w: int, h: int) -> Image.Image:
    """A gradient: JPEG-friendly, so draft decoding and full decoding agree closely."""
    x, y = np.meshgrid(np.linspace(0, 255, w), np.linspace(0, 255, h))
    return Image.fromarray(np.stack([x, y, 255 - x], -1).astype(np.uint8), "RGB")


def _png_claiming(width: int, height: int) -> bytes:
    """A real 1×1 PNG whose IHDR (with a valid CRC) claims ``width × height``."""
    data = bytearray(_encode(Image.new("RGB", (1, 1)), "PNG"))
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def test_builtin_values_are_resized_and_normalised():
    pv = make_image_transform(size=6)([_encode(Image.new("RGB", (20, 10), (255, 0, 51)), "PNG")])["pixel_values"]
    assert pv.shape == (1, 3, 6, 6) and pv.dtype == torch.float32
    torch.testing.assert_close(pv[0, :, 0, 0], torch.tensor([1.0, -1.0, 51 / 255 * 2 - 1]))
    img = _noise(33, 17)
    got = make_image_transform(size=8, mean=CLIP_MEAN, std=CLIP_STD)([_encode(img, "PNG")])["pixel_values"][0]
    ref = np.asarray(img.resize((8, 8), Image.Resampling.BICUBIC), np.float64) / 255.0
    ref = (ref - np.array(CLIP_MEAN)) / np.array(CLIP_STD)
    torch.testing.assert_close(got, torch.from_numpy(ref.transpose(2, 0, 1)).float(), rtol=0, atol=1e-5)


def test_jpeg_draft_decodes_at_a_reduced_scale():
    data = _encode(_smooth(1024, 768), "JPEG", quality=95)
    assert decode_image(data).size == (1024, 768)
    assert decode_image(data, draft=90).size == (128, 96)  # 1/8: the smallest scale still >= 90 on both sides
    assert decode_image(data, draft=100).size == (256, 192)  # 1/8 would give 96 < 100 rows
    assert decode_image(data, draft=200).size == (512, 384)
    assert decode_image(_encode(_smooth(64, 48), "PNG"), draft=8).size == (64, 48)  # not a JPEG: untouched
    fast = make_image_transform(size=64)([data])["pixel_values"]
    full = make_image_transform(size=64, draft=False)([data])["pixel_values"]
    assert not torch.equal(fast, full)
    assert (fast - full).abs().mean() < 0.02  # same picture, values in [-1, 1]


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "GIF", "BMP", "TIFF"])
def test_formats_decode_to_rgb(fmt):
    img = Image.new("RGB", (16, 12), (0, 128, 255))
    out = decode_image(_encode(img, fmt, **({"lossless": True} if fmt == "WEBP" else {})))
    assert out.mode == "RGB" and out.size == (16, 12)
    assert out.getpixel((3, 3)) == (0, 128, 255) or fmt == "GIF"  # GIF quantises to a palette


def test_modes_alpha_over_white_and_grey():
    rgba = Image.new("RGBA", (4, 4), (255, 0, 0, 0))
    rgba.putpixel((0, 0), (255, 0, 0, 255))
    out = decode_image(_encode(rgba, "PNG"))
    assert out.getpixel((0, 0)) == (255, 0, 0) and out.getpixel((1, 1)) == (255, 255, 255)
    assert decode_image(_encode(Image.new("L", (4, 4), 77), "PNG")).getpixel((2, 2)) == (77, 77, 77)
    pv = make_image_transform(size=4)([_encode(Image.new("LA", (4, 4), (0, 0)), "PNG")])["pixel_values"]
    assert torch.all(pv == 1.0), "fully transparent is white"


def test_decompression_bomb_refused_before_decoding():
    bomb = _png_claiming(50_000, 50_000)  # 2.5 G pixels claimed, 1 pixel of data
    with pytest.raises(ImageTooLargeError, match=r"refused before decoding|exceeds the limit"):
        decode_image(bomb)
    claim = _png_claiming(9_000, 9_000)  # 81 M pixels: over our default limit, under Pillow's hard one
    with pytest.raises(ImageTooLargeError, match="9000x9000 = 81000000 pixels exceeds the limit of 64000000"):
        decode_image(claim)
    # A raised limit lets the header through without Pillow's warning; the 1-pixel data then fails to decode.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert open_image(_png_claiming(10_000, 10_000), max_pixels=10**9).size == (10_000, 10_000)
    with pytest.raises(ImageDecodeError, match="corrupt or truncated") as info:
        decode_image(_png_claiming(10_000, 10_000), max_pixels=10**9)
    assert not isinstance(info.value, ImageTooLargeError)
    real = _encode(_noise(300, 200), "PNG")
    with pytest.raises(ImageTooLargeError, match="60000 pixels exceeds the limit of 10000"):
        make_image_transform(size=8, max_pixels=10_000)([real])


def test_corrupt_and_refused_bytes():
    assert issubclass(ImageDecodeError, FormatError)
    with pytest.raises(ImageDecodeError, match="cannot read the image header"):
        decode_image(b"definitely not an image")
    jpeg = _encode(_noise(64, 64), "JPEG")
    with pytest.raises(ImageDecodeError, match="cannot decode JPEG image of 64x64"):
        decode_image(jpeg[: len(jpeg) // 2])
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n"
    with pytest.raises(ImageDecodeError, match="formats"):
        decode_image(eps)  # EPS would shell out to Ghostscript: not opened
    with pytest.raises(ImageDecodeError, match="cannot read"):
        decode_image(_encode(Image.new("RGB", (4, 4)), "BMP"), formats=("PNG",))
    good = _encode(Image.new("RGB", (4, 4)), "PNG")
    with pytest.raises(ImageDecodeError, match=r"^image 1: ") as info:
        make_image_transform(size=4)([good, b"garbage", good])
    assert info.value.index == 1
    again = pickle.loads(pickle.dumps(info.value))  # survives a worker process boundary
    assert type(again) is ImageDecodeError and str(again) == str(info.value)


def test_transform_is_picklable_and_validates():
    t = make_image_transform(size=8, mean=CLIP_MEAN, std=CLIP_STD)
    data = [_encode(_noise(20, 20), "PNG")]
    assert torch.equal(pickle.loads(pickle.dumps(t))(data)["pixel_values"], t(data)["pixel_values"])
    assert t([])["pixel_values"].shape == (0, 3, 8, 8)
    with pytest.raises(ConfigError):
        make_image_transform(size=0)
    with pytest.raises(ConfigError):
        make_image_transform(std=(1.0, 0.0, 1.0))


def test_split_path_gives_what_the_transform_gives_bit_for_bit():
    """``decode_resized`` then ``normalize_into`` (the loader's two halves) == ``__call__``, on real bytes."""
    t = make_image_transform(size=24, mean=CLIP_MEAN, std=CLIP_STD)
    data = [_encode(_noise(40, 30, 5), "JPEG", quality=90), _encode(_noise(24, 24, 6), "PNG"),
            _encode(_smooth(300, 200), "JPEG"), _encode(Image.new("LA", (9, 31), (80, 200)), "PNG")]
    whole = t(data)["pixel_values"]
    pixels = t.decode_resized(data)
    assert [(p.shape, p.dtype) for p in pixels] == [((3, 24, 24), np.uint8)] * 4
    out = torch.full((6, 3, 24, 24), 7.0)  # larger than needed: entries past the images stay as they are
    t.normalize_into(pixels, out)
    assert torch.equal(out[:4], whole) and torch.all(out[4:] == 7.0)
    batch = torch.zeros(8, 3, 24, 24)  # a view into a batch tensor, as the loader passes it
    t.normalize_into(pixels[1:3], batch[5:7])
    assert torch.equal(batch[5:7], whole[1:3]) and not batch[:5].any() and not batch[7:].any()


def test_decode_resized_is_pillows_image_channel_first():
    """The planes read band by band are Pillow's decoded, resized image itself, HWC → CHW (checked against
    ``np.asarray`` of the same image, the interleaved read), for every mode ``_to_rgb`` turns into RGB."""
    t = make_image_transform(size=24)
    data = [_encode(_noise(40, 30, 5), "JPEG", quality=90), _encode(_noise(24, 24, 6), "PNG"),
            _encode(_smooth(300, 200), "JPEG"), _encode(Image.new("LA", (9, 31), (80, 200)), "PNG"),
            _encode(_noise(33, 17, 7).convert("L"), "PNG"), _encode(_noise(20, 20, 8).convert("CMYK"), "JPEG")]
    for px, raw in zip(t.decode_resized(data), data, strict=True):
        img = decode_image(raw, draft=24)
        expected = np.asarray(img if img.size == (24, 24) else img.resize((24, 24), Image.Resampling.BICUBIC))
        assert np.array_equal(px, expected.transpose(2, 0, 1)) and px.dtype == np.uint8


def test_split_path_refuses_wrong_inputs():
    t = make_image_transform(size=4)
    px = t.decode_resized([_encode(_noise(8, 8), "PNG")])
    for bad in (torch.zeros(1, 3, 4, 4, dtype=torch.float64), torch.zeros(1, 3, 5, 5), torch.zeros(0, 3, 4, 4)):
        with pytest.raises(ConfigError, match=r"float32 \[>= 1, 3, 4, 4\]"):
            t.normalize_into(px, bad)
    with pytest.raises(ConfigError, match=r"expected uint8 \(3, 4, 4\)"):
        t.normalize_into([np.zeros((3, 4, 4), np.float32)], torch.zeros(1, 3, 4, 4))
    with pytest.raises(ConfigError, match=r"is uint8 \(4, 4, 3\); expected uint8 \(3, 4, 4\)"):
        t.copy_into([np.zeros((4, 4, 3), np.uint8)], torch.zeros(1, 3, 4, 4, dtype=torch.uint8))
    with pytest.raises(ImageDecodeError, match=r"^image 1: ") as info:
        t.decode_resized([_encode(_noise(8, 8), "PNG"), b"garbage"])
    assert info.value.index == 1
    from transformers import SiglipImageProcessorPil

    proc = make_image_transform(processor=SiglipImageProcessorPil(size={"height": 8, "width": 8}))
    assert t.writes_into and not proc.writes_into
    with pytest.raises(ConfigError, match="wraps SiglipImageProcessorPil"):
        proc.decode_resized([])


def _qwen():
    try:
        from transformers import Qwen2VLImageProcessorPil as Processor
    except ImportError:  # older transformers: the slow processor is the PIL one
        from transformers import Qwen2VLImageProcessor as Processor
    return Processor()


def test_qwen2vl_processor_layout():
    proc = _qwen()
    imgs = [_noise(56, 56, 1), _noise(112, 56, 2)]
    t = make_image_transform(processor=proc)
    assert t.flattened and t.merge_size == 2
    out = t([_encode(i, "PNG") for i in imgs])
    ref = proc(images=imgs, return_tensors="pt")
    assert out["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 8]]
    torch.testing.assert_close(out["pixel_values"], ref["pixel_values"].float())
    assert out["pixel_values"].shape == (48, 3 * 2 * 14 * 14)
    empty = t([])
    assert empty["pixel_values"].shape == (0, 1176) and empty["image_grid_thw"].shape == (0, 3)
    # Padded into a pack: patch rows fixed by the budget (seq_len × merge²), grids per slot.
    pack = Pack(np.array([1] + [9] * 12 + [2]), np.ones(14, np.uint8), (6, 8), ("a", "b"),
                tuple(_encode(i, "PNG") for i in imgs), (0, 1), (4, 8))
    e = pack_to_example(pack, seq_len=16, max_images=3, pad_token_id=0, image_transform=pickle.loads(pickle.dumps(t)))
    assert e["pixel_values"].shape == (64, 1176) and e["patch_mask"].sum() == 48 and not e["pixel_values"][48:].any()
    assert e["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 8], [0, 0, 0]]
    assert t.patch_rows(16, 3) == 64 and t.patch_rows(100_000, 2) == 2 * 1003520 // 196
    assert make_image_transform(processor=proc, max_patches=50).patch_rows(16, 3) == 50
    wrong = Pack(pack.input_ids, pack.loss_mask, pack.seq_lens, pack.sample_ids, pack.images, (0, 1), (4, 4))
    with pytest.raises(ConfigError, match=r"gives \[4, 8\] tokens .* reserved \[4, 4\]"):
        pack_to_example(wrong, seq_len=16, max_images=3, pad_token_id=0, image_transform=t)
    with pytest.raises(ConfigError, match="48 image patches > the 40 patch rows"):
        pack_to_example(pack, seq_len=16, max_images=3, pad_token_id=0,
                        image_transform=make_image_transform(processor=proc, max_patches=40))


def test_fixed_size_processor_layout():
    from transformers import SiglipImageProcessorPil

    proc = SiglipImageProcessorPil(size={"height": 32, "width": 32})
    imgs = [_noise(40, 30, 3), _noise(20, 50, 4)]
    t = pickle.loads(pickle.dumps(make_image_transform(processor=proc)))
    out = t([_encode(i, "PNG") for i in imgs])
    torch.testing.assert_close(out["pixel_values"], proc(images=imgs, return_tensors="pt")["pixel_values"])
    pack = Pack(np.array([1, 9, 2]), np.ones(3, np.uint8), (3,), ("a",), (_encode(imgs[0], "PNG"),), (0,), (1,))
    e = pack_to_example(pack, seq_len=4, max_images=2, pad_token_id=0, image_transform=t)
    assert e["pixel_values"].shape == (2, 3, 32, 32) and not e["pixel_values"][1].any()
    text_only = Pack(np.array([1, 2]), np.ones(2, np.uint8), (2,), ("b",))
    assert pack_to_example(text_only, seq_len=4, max_images=2, pad_token_id=0,
                           image_transform=t)["pixel_values"].shape == (2, 3, 32, 32)
