"""``make_loader(pixel_dtype="uint8")``: workers ship the decoded bytes, ``normalize_pixels`` finishes them.

Checked against the float32 path of the same loader (same data, seed, workers): every batch's
normalised ``pixel_values`` equal, every other key identical, empty slots zero, resume exact.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

import wdspack
from tests.support.synthetic import pack_numbers, write_dataset
from wdspack.errors import ConfigError
from wdspack.format.pack import decode_pack
from wdspack.loader import make_loader
from wdspack.loader.batch.buffers import PixelBuffers, _release
from wdspack.media.image.pixels import CLIP_MEAN, CLIP_STD, make_image_transform


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> Path:
    """36 packs of 0-3 real PNG/JPEG images each (M = 3)."""
    root = tmp_path_factory.mktemp("pictures-uint8")
    write_dataset(root, shards=3, packs_per_shard=12, max_images=3, seed=7)
    return root


def _loader(root: Path, pixel_dtype: str, *, size: int = 32, workers: int = 1, **kw):
    transform = make_image_transform(size=size, mean=CLIP_MEAN, std=CLIP_STD)
    return make_loader(root, batch_size=2, num_workers=workers, seed=11, pin_memory=False, image_transform=transform,
                       pixel_dtype=pixel_dtype, **kw)


def _assert_same_batch(uint8: dict, floats: dict, loader) -> None:
    """``uint8`` normalised equals ``floats``; every other key identical, in the same order."""
    assert list(uint8) == list(floats)
    pv = uint8["pixel_values"]
    assert pv.dtype == torch.uint8 and pv.shape == floats["pixel_values"].shape
    assert not pv[~uint8["image_mask"]].any(), "empty slots ship as zeros"
    got = wdspack.normalize_pixels(uint8, loader)
    torch.testing.assert_close(got["pixel_values"], floats["pixel_values"], rtol=0, atol=1e-6)
    assert torch.equal(got["pixel_values"][~uint8["image_mask"]], floats["pixel_values"][~floats["image_mask"]])
    for key, value in floats.items():
        if key != "pixel_values":
            same = torch.equal(uint8[key], value) if isinstance(value, torch.Tensor) else uint8[key] == value
            assert same, key
            assert got[key] is uint8[key], f"{key} is passed through as it is"


@pytest.mark.parametrize("workers, size", [(0, 32), (1, 32), (2, 32), (1, 256)])  # 256: through shared memory
def test_uint8_batches_normalise_to_the_float32_batches(pictures, workers, size):
    floats = _loader(pictures, "float32", size=size, workers=workers)
    uint8 = _loader(pictures, "uint8", size=size, workers=workers)
    n = 0
    for _ in range(2):  # two epochs: recycled buffers hold images, then empty slots
        for a, b in zip(uint8, floats, strict=True):
            _assert_same_batch(a, b, uint8)
            n += 1
    assert n == 2 * len(floats) == 36
    assert uint8.stats == floats.stats


def test_uint8_bytes_are_the_decoded_images(pictures):
    """What ships is the transform's first half, CHW: the decoded, resized bytes themselves."""
    loader = _loader(pictures, "uint8", workers=0)
    transform = loader.dataset.image_transform
    batch = next(iter(loader))
    M = batch["image_mask"].shape[0] // 2
    checked = 0
    for b, number in enumerate(pack_numbers(batch["input_ids"])):
        for k, px in enumerate(transform.decode_resized(_pack_images(pictures, number))):
            assert torch.equal(batch["pixel_values"][b * M + k], torch.from_numpy(px.copy()))
            checked += 1
    assert checked == int(batch["image_mask"].sum())


def _pack_images(root: Path, number: int) -> list[bytes]:
    """Pack ``number``'s encoded images, read from the shards with ``tarfile`` (packs are numbered in order)."""
    seen = 0
    for shard in sorted(root.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                if member.isfile() and seen == number:
                    data = tar.extractfile(member)
                    assert data is not None
                    return list(decode_pack(data.read()).images)
                seen += member.isfile()
    raise AssertionError(f"no pack {number}")


def test_resume_with_uint8_continues_the_stream_exactly(pictures):
    uninterrupted = _loader(pictures, "uint8")
    whole = [wdspack.normalize_pixels(b, uninterrupted) for b in uninterrupted]
    first = _loader(pictures, "uint8")
    it = iter(first)
    head = [next(it) for _ in range(4)]
    state = first.state_dict()
    del it
    for saved_with in ("uint8", "float32"):  # pixel_dtype may change across a restore
        again = _loader(pictures, "uint8")
        again.load_state_dict(state if saved_with == "uint8" else _state_of(pictures, "float32", 4))
        rest = [wdspack.normalize_pixels(b, again) for b in again]
        assert len(head) + len(rest) == len(whole) == 18
        for got, want in zip(rest, whole[4:], strict=True):
            assert pack_numbers(got["input_ids"]) == pack_numbers(want["input_ids"])
            assert torch.equal(got["pixel_values"], want["pixel_values"])
    floats = _loader(pictures, "float32")
    for got, want in zip(floats, whole, strict=True):  # and the float32 stream is the same stream
        torch.testing.assert_close(want["pixel_values"], got["pixel_values"], rtol=0, atol=1e-6)


def _state_of(root: Path, pixel_dtype: str, batches: int) -> dict:
    loader = _loader(root, pixel_dtype)
    it = iter(loader)
    for _ in range(batches):
        next(it)
    return loader.state_dict()


def test_normalize_pixels_casts_and_passes_float_batches_through(pictures):
    uint8, floats = _loader(pictures, "uint8", workers=0), _loader(pictures, "float32", workers=0)
    a, b = next(iter(uint8)), next(iter(floats))
    bf16 = wdspack.normalize_pixels(a, uint8, device="cpu", dtype=torch.bfloat16)["pixel_values"]
    assert bf16.dtype == torch.bfloat16 and torch.equal(bf16, b["pixel_values"].to(torch.bfloat16))
    same = wdspack.normalize_pixels(b, floats)  # the float32 path: nothing to undo
    assert same["pixel_values"] is b["pixel_values"] or torch.equal(same["pixel_values"], b["pixel_values"])
    assert same["pixel_values"].dtype == torch.float32
    assert a["pixel_values"].dtype == torch.uint8, "the batch given is not changed"


def test_bad_uses_are_refused_with_the_fix(pictures):
    with pytest.raises(ConfigError, match=r"pixel_dtype='float16' is not one of \['float32', 'uint8'\]"):
        _loader(pictures, "float16")

    def custom(images):
        return {"pixel_values": torch.zeros(len(images), 3, 4, 4)}

    with pytest.raises(ConfigError, match=r"needs the built-in image transform .*pixel_dtype='float32'"):
        make_loader(pictures, batch_size=2, num_workers=0, image_transform=custom, pixel_dtype="uint8")
    loader = _loader(pictures, "uint8", workers=0)
    batch = next(iter(loader))
    with pytest.raises(ConfigError, match="needs the loader, dataset or image transform that made the batch"):
        wdspack.normalize_pixels(batch, object())
    with pytest.raises(ConfigError, match=r"pass the loader that made the batch"):
        wdspack.normalize_pixels(batch, make_image_transform(size=16))
    with pytest.raises(ConfigError, match="must be a floating dtype"):
        wdspack.normalize_pixels(batch, loader, dtype=torch.int32)
    with pytest.raises(ConfigError, match="has no pixel_values"):
        wdspack.normalize_pixels({"input_ids": batch["input_ids"]}, loader)
    assert make_loader(pictures, batch_size=2, num_workers=0, text_only=True, pixel_dtype=torch.uint8).pixel_dtype \
        == "uint8", "a torch dtype is taken by name; text only: nothing to ship"


def test_a_recycled_buffer_is_reused_only_for_the_same_dtype():
    pool = PixelBuffers(workers=1, size=2)
    shape = (2, 3, 4, 4)
    a, _, lease = pool.take(shape, worker=0, packs=2, dtype=torch.uint8)
    assert a.dtype == torch.uint8 and a.is_shared() and a.untyped_storage().nbytes() == 96
    pool.ship(lease, [1, 0])
    _release(pool.released, 0, lease.index, lease.number)
    b, _, _ = pool.take(shape, worker=0, packs=2)  # float32: not the uint8 buffer
    assert b.dtype == torch.float32 and b.data_ptr() != a.data_ptr()
    again, dirty, _ = pool.take(shape, worker=0, packs=2, dtype=torch.uint8)
    assert again.data_ptr() == a.data_ptr() and dirty == [1, 0]


def test_normalize_matches_the_cpu_path_bit_for_bit():
    t = make_image_transform(size=5, mean=CLIP_MEAN, std=CLIP_STD)
    px = [np.random.default_rng(k).integers(0, 256, (3, 5, 5), dtype=np.uint8) for k in range(3)]
    floats, raw = torch.empty(3, 3, 5, 5), torch.empty(3, 3, 5, 5, dtype=torch.uint8)
    t.normalize_into(px, floats)
    t.copy_into(px, raw)
    assert torch.equal(t.normalize(raw), floats)
    with pytest.raises(ConfigError, match=r"uint8 \[>= 3, 3, 5, 5\]"):
        t.copy_into(px, torch.empty(3, 3, 5, 5))


@pytest.mark.gpu
def test_normalised_on_the_gpu_equal_the_float32_path(pictures):
    """The point of uint8: copy a quarter of the bytes, normalise on the device; equal to float rounding."""
    floats = _loader(pictures, "float32", size=64, workers=1)
    uint8 = _loader(pictures, "uint8", size=64, workers=1)
    for a, b in zip(uint8, floats, strict=True):
        got = wdspack.normalize_pixels(a, uint8, device="cuda", non_blocking=True)
        assert got["pixel_values"].device.type == "cuda" and got["input_ids"] is a["input_ids"]
        torch.testing.assert_close(got["pixel_values"].cpu(), b["pixel_values"], rtol=0, atol=1e-6)
        half = wdspack.normalize_pixels(a, uint8, device="cuda", dtype=torch.bfloat16)["pixel_values"]
        assert torch.equal(half.cpu(), got["pixel_values"].cpu().to(torch.bfloat16))
