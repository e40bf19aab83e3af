"""The batch contract: literal layout, static shapes, masks, image slots, padding-free layout."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from wdspack.codec import Pack
from wdspack.collate import collate_packs, pack_to_example
from wdspack.images import ImageDecodeError, decode_image, make_image_transform


def _jpeg(w=40, h=30, color=(255, 0, 0)):
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


PACK = Pack(np.array([1, 10, 10, 7, 5, 2, 1, 6, 2]), np.array([0, 0, 0, 0, 1, 1, 0, 1, 1]), (6, 3), ("a", "b"),
            (_jpeg(),), (0,), (2,))


def test_literal_layout():
    e = pack_to_example(PACK, seq_len=10, max_images=2, pad_token_id=0)
    assert e["input_ids"].tolist() == [1, 10, 10, 7, 5, 2, 1, 6, 2, 0]
    assert e["labels"].tolist() == [-100, -100, -100, -100, 5, 2, -100, 6, 2, -100]
    assert e["position_ids"].tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 0]
    assert e["seq_idx"].tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1, 2]
    assert e["image_mask"].tolist() == [True, False] and e["image_sample_idx"].tolist() == [0, -1]
    assert e["image_token_counts"].tolist() == [2, 0]
    b = collate_packs([e, e])
    assert b["cu_seqlens"].tolist() == [0, 6, 9, 10, 16, 19, 20] and b["max_seqlen"] == 6
    assert b["input_ids"].dtype == torch.int64 and b["seq_idx"].dtype == torch.int32
    assert b["cu_seqlens"].dtype == torch.int32 and b["image_pack_idx"].tolist() == [0, 0, 1, 1]


def test_first_token_of_each_sub_sample_is_never_a_target():
    p = Pack(np.array([3, 4, 5, 6]), np.array([1, 1, 1, 1]), (2, 2), ("a", "b"))
    assert pack_to_example(p, seq_len=4, max_images=0, pad_token_id=0)["labels"].tolist() == [-100, 4, -100, 6]


def _random_pack(rng, seq_len, max_images):
    n_samples = int(rng.integers(1, 5))
    lens = rng.integers(1, max(2, seq_len // n_samples), n_samples)
    lens = lens[np.cumsum(lens) <= seq_len] if lens.sum() > seq_len else lens
    n = int(lens.sum())
    k = int(rng.integers(0, max_images + 1))
    owners = tuple(sorted(int(x) for x in rng.integers(0, len(lens), k)))
    return Pack(rng.integers(0, 1000, n), rng.integers(0, 2, n).astype(np.uint8), tuple(int(x) for x in lens),
                tuple(f"s{i}" for i in range(len(lens))), tuple(_jpeg(8, 8) for _ in owners), owners,
                tuple(1 for _ in owners))


@given(seed=st.integers(0, 10_000))
@settings(max_examples=40, deadline=None)
def test_shapes_are_static_and_4d_mask_is_block_causal(seed):
    rng = np.random.default_rng(seed)
    packs = [_random_pack(rng, 16, 3) for _ in range(3)]
    exs = [pack_to_example(p, seq_len=16, max_images=3, pad_token_id=0, image_transform=make_image_transform(size=8))
           for p in packs]
    b = collate_packs(exs, attention_mask="4d")
    assert b["input_ids"].shape == (3, 16) and b["pixel_values"].shape == (9, 3, 8, 8)
    assert b["attention_mask"].shape == (3, 1, 16, 16)
    assert int(b["cu_seqlens"][-1]) == 48
    for bi, p in enumerate(packs):
        sid = np.repeat(np.arange(len(p.seq_lens) + 1), list(p.seq_lens) + [16 - p.num_tokens])
        brute = np.array([[sid[i] == sid[j] and j <= i for j in range(16)] for i in range(16)])
        assert np.array_equal(b["attention_mask"][bi, 0].numpy(), brute)
        real = b["image_mask"][bi * 3:(bi + 1) * 3]
        assert int(real.sum()) == p.num_images
        assert not b["pixel_values"][bi * 3 + p.num_images:(bi + 1) * 3].any(), "empty slots are zero"
        assert b["image_sample_idx"][bi * 3:bi * 3 + p.num_images].tolist() == list(p.image_sample)


def test_2d_mask_and_padding_free():
    e = pack_to_example(PACK, seq_len=10, max_images=1, pad_token_id=0)
    b = collate_packs([e, e], attention_mask="2d")
    assert b["attention_mask"].tolist()[0] == [1] * 9 + [0]
    f = collate_packs([e, e], padding_free=True)
    assert f["input_ids"].shape == (1, 20)
    assert f["position_ids"].tolist()[0] == [0, 1, 2, 3, 4, 5, 0, 1, 2, 0] * 2
    assert f["seq_idx"].tolist()[0] == [0] * 6 + [1] * 3 + [2] + [3] * 6 + [4] * 3 + [5]
    with pytest.raises(ValueError, match="attention_mask"):
        collate_packs([e], attention_mask="3d")


def test_image_transform_values_and_guards():
    t = make_image_transform(size=8, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    pv = t([_jpeg(64, 48, (255, 0, 0))], max_images=2, seq_len=4)["pixel_values"]
    assert pv.shape == (2, 3, 8, 8)
    assert pv[0, 0].mean() > 0.9 and pv[0, 1].mean() < 0.1 and not pv[1].any()
    with pytest.raises(ImageDecodeError, match="exceeds the limit"):
        decode_image(_jpeg(200, 200), max_pixels=100)
    with pytest.raises(ImageDecodeError, match="cannot decode"):
        decode_image(b"garbage")


def test_qwen2vl_processor_layout():
    from transformers import Qwen2VLImageProcessor

    proc = Qwen2VLImageProcessor()
    t = make_image_transform(processor=proc)
    out = t([_jpeg(56, 56), _jpeg(112, 56)], max_images=3, seq_len=64)
    rows = 64 * proc.merge_size ** 2
    assert out["pixel_values"].shape[0] == rows and out["patch_mask"].shape == (rows,)
    assert out["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 8], [0, 0, 0]]
    assert int(out["patch_mask"].sum()) == 16 + 32
