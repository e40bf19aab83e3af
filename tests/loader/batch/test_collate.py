"""The batch contract: literal layouts, static shapes, masks, image slots, padding-free rows, properties."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from wdspack.errors import ConfigError, FormatError
from wdspack.format.pack import Pack
from wdspack.loader.batch.buffers import (
    collate_staged,
    decode_pack_images,
    fresh_pixels,
    staged_example,
    write_pixel_slots,
)
from wdspack.loader.batch.collate import IGNORE_INDEX, collate_packs, pack_to_example
from wdspack.media.image.pixels import ImageDecodeError, make_image_transform

IMG = 10


def _png(color=(255, 0, 0), w=12, h=9) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, format="PNG")
    return buf.getvalue()


# <s> [IMG] [IMG] hi A </s> | <s> B </s>; the pack marks the first token of "b" as trained,
# and collation must still drop it (no target across the boundary).
PACK = Pack(np.array([1, IMG, IMG, 7, 5, 2, 1, 6, 2], np.uint16), np.array([0, 0, 0, 0, 1, 1, 1, 1, 1], np.uint8),
            (6, 3), ("a", "b"), (_png(),), (0,), (2,))
SHORT = Pack(np.array([1, 4, 2], np.uint16), np.array([0, 1, 1], np.uint8), (3,), ("c",))


def test_literal_layout_of_one_pack_and_a_batch():
    e = pack_to_example(PACK, seq_len=10, max_images=2, pad_token_id=0)
    assert e["input_ids"].tolist() == [1, 10, 10, 7, 5, 2, 1, 6, 2, 0]
    assert e["labels"].tolist() == [-100, -100, -100, -100, 5, 2, -100, 6, 2, -100]
    assert e["position_ids"].tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 0]
    assert e["seq_idx"].tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1, 2]
    assert (int(e["num_tokens"]), int(e["num_samples"])) == (9, 2)
    s = pack_to_example(SHORT, seq_len=10, max_images=2, pad_token_id=0)
    assert s["position_ids"].tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 5, 6]
    assert s["seq_idx"].tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]
    b = collate_packs([e, s])
    assert b["cu_seqlens"].tolist() == [0, 6, 9, 10, 13, 20] and b["max_seqlen"] == 7
    assert b["input_ids"].tolist()[1] == [1, 4, 2, 0, 0, 0, 0, 0, 0, 0]
    assert b["labels"].tolist()[1] == [-100, 4, 2] + [-100] * 7
    dtypes = {k: b[k].dtype for k in ("input_ids", "labels", "position_ids", "seq_idx", "cu_seqlens")}
    assert dtypes == {"input_ids": torch.int64, "labels": torch.int64, "position_ids": torch.int64,
                      "seq_idx": torch.int32, "cu_seqlens": torch.int32}
    assert isinstance(b["max_seqlen"], int) and b["num_tokens"].tolist() == [9, 3]


def test_full_pack_has_no_padding_segment():
    p = Pack(np.array([3, 4, 5, 6]), np.ones(4, np.uint8), (2, 2), ("a", "b"))
    e = pack_to_example(p, seq_len=4, max_images=0, pad_token_id=0)
    assert e["labels"].tolist() == [-100, 4, -100, 6] and e["seq_idx"].tolist() == [0, 0, 1, 1]
    assert collate_packs([e])["cu_seqlens"].tolist() == [0, 2, 4]


def _shapes(batch):
    return {k: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else type(v) for k, v in batch.items()
            if k not in ("cu_seqlens", "segment_targets")}  # without max_segments: one entry per segment


def test_shapes_are_identical_for_packs_of_any_fill():
    t = make_image_transform(size=8)
    full = Pack(np.arange(1, 11), np.ones(10, np.uint8), (4, 6), ("x", "y"), (_png(), _png()), (0, 1), (1, 1))
    empty = Pack(np.zeros(0, np.uint16), np.zeros(0, np.uint8), (), ())
    batches = [collate_packs([pack_to_example(p, seq_len=10, max_images=2, pad_token_id=0, image_transform=t)
                              for p in packs], attention_mask="4d")
               for packs in ([PACK, SHORT], [full, full], [empty, SHORT])]
    assert _shapes(batches[0]) == _shapes(batches[1]) == _shapes(batches[2])
    assert batches[0]["pixel_values"].shape == (4, 3, 8, 8) and batches[0]["attention_mask"].shape == (2, 1, 10, 10)
    assert batches[2]["cu_seqlens"].tolist() == [0, 10, 13, 20]  # an empty pack is one padding segment


def _brute_mask(seq_idx_row):
    s = seq_idx_row.tolist()
    return torch.tensor([[s[i] == s[j] and j <= i for j in range(len(s))] for i in range(len(s))])


def test_2d_and_4d_masks():
    e, s = (pack_to_example(p, seq_len=10, max_images=1, pad_token_id=0) for p in (PACK, SHORT))
    b = collate_packs([e, s], attention_mask="2d")
    assert b["attention_mask"].tolist() == [[1] * 9 + [0], [1] * 3 + [0] * 7]
    m = collate_packs([e, s], attention_mask="4d")["attention_mask"]
    assert m.dtype == torch.bool and m.shape == (2, 1, 10, 10)
    for r in range(2):
        assert torch.equal(m[r, 0], _brute_mask(b["seq_idx"][r]))
    assert m[0, 0, 6].tolist() == [False] * 6 + [True] + [False] * 3  # first token of "b" sees only itself
    f = collate_packs([e, s], attention_mask="4d", mask_dtype=torch.float64)["attention_mask"]
    assert f.dtype == torch.float64
    assert torch.equal(f == 0, m) and torch.all(f[~m] == torch.finfo(torch.float64).min)


def test_padding_free_layout():
    e, s = (pack_to_example(p, seq_len=10, max_images=1, pad_token_id=0) for p in (PACK, SHORT))
    b = collate_packs([e, s], padding_free=True)
    assert b["input_ids"].tolist() == [[1, 10, 10, 7, 5, 2, 1, 6, 2, 1, 4, 2] + [0] * 8]
    assert b["labels"].tolist() == [[-100, -100, -100, -100, 5, 2, -100, 6, 2, -100, 4, 2] + [-100] * 8]
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7]]
    assert b["seq_idx"].tolist() == [[0] * 6 + [1] * 3 + [2] * 3 + [3] * 8]
    assert b["cu_seqlens"].tolist() == [0, 6, 9, 12, 20] and b["max_seqlen"] == 8
    fixed = collate_packs([e, s], padding_free=True, pad_to=14)
    assert fixed["input_ids"].shape == (1, 14) and fixed["cu_seqlens"].tolist() == [0, 6, 9, 12, 14]
    tight = collate_packs([e, s], padding_free=True, pad_to=None)
    assert tight["input_ids"].shape == (1, 12) and tight["cu_seqlens"].tolist() == [0, 6, 9, 12]
    m = collate_packs([e, s], padding_free=True, attention_mask="4d")["attention_mask"]
    assert m.shape == (1, 1, 20, 20) and torch.equal(m[0, 0], _brute_mask(b["seq_idx"][0]))
    with pytest.raises(ConfigError, match="whole row as one sequence"):
        collate_packs([e, s], padding_free=True, attention_mask="2d")
    with pytest.raises(ConfigError, match="pad_to=11"):
        collate_packs([e, s], padding_free=True, pad_to=11)


def test_max_segments_gives_cu_seqlens_a_static_shape():
    e, s = (pack_to_example(p, seq_len=10, max_images=1, pad_token_id=0) for p in (PACK, SHORT))
    assert collate_packs([e, s], max_segments=7)["cu_seqlens"].tolist() == [0, 6, 9, 10, 13, 20, 20, 20]
    with pytest.raises(ConfigError, match="5 segments > max_segments 4"):
        collate_packs([e, s], max_segments=4)


def test_image_slots_ownership_and_order():
    red, green, blue = _png((255, 0, 0)), _png((0, 255, 0)), _png((0, 0, 255))
    # Sub-sample 1 owns two images, sub-sample 2 one; sub-sample 0 none.
    p = Pack(np.array([1, 5, 1, IMG, 5, IMG, IMG, 1, IMG]), np.zeros(9, np.uint8), (2, 5, 2), ("a", "b", "c"),
             (red, green, blue), (1, 1, 2), (1, 2, 1))
    t = make_image_transform(size=4, mean=(0, 0, 0), std=(1, 1, 1))
    exs = [pack_to_example(q, seq_len=10, max_images=4, pad_token_id=0, image_transform=t) for q in (p, SHORT)]
    b = collate_packs(exs)
    assert b["image_mask"].tolist() == [True, True, True, False] + [False] * 4
    assert b["image_pack_idx"].tolist() == [0] * 4 + [1] * 4
    assert b["image_sample_idx"].tolist() == [1, 1, 2, -1] + [-1] * 4
    assert b["image_token_counts"].tolist() == [1, 2, 1, 0] + [0] * 4
    pv = b["pixel_values"]
    assert pv.shape == (8, 3, 4, 4) and not pv[3:].any(), "slots past the real images are zero"
    assert pv[:3].mean(dim=(2, 3)).round().tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    # Image tokens in flattened order belong, in slot order, to the owning sub-sample.
    where = (b["input_ids"].reshape(-1) == IMG).nonzero().flatten()
    owners = torch.repeat_interleave(b["image_sample_idx"][b["image_mask"]], b["image_token_counts"][b["image_mask"]])
    assert torch.equal(b["seq_idx"].reshape(-1)[where].long(), owners)


def test_errors_name_the_problem():
    with pytest.raises(FormatError, match="9 tokens > seq_len 8"):
        pack_to_example(PACK, seq_len=8, max_images=1, pad_token_id=0)
    with pytest.raises(FormatError, match="1 images > max_images 0"):
        pack_to_example(PACK, seq_len=10, max_images=0, pad_token_id=0)
    bad = Pack(PACK.input_ids, PACK.loss_mask, PACK.seq_lens, ("a", "b"), (b"not an image",), (1,), (2,))
    with pytest.raises(ImageDecodeError, match="sample 'b': image 0: cannot read the image header"):
        pack_to_example(bad, seq_len=10, max_images=1, pad_token_id=0, image_transform=make_image_transform(size=4))
    a = pack_to_example(PACK, seq_len=10, max_images=1, pad_token_id=0)
    c = pack_to_example(PACK, seq_len=12, max_images=1, pad_token_id=0)
    with pytest.raises(ConfigError, match="different"):
        collate_packs([a, c])
    with pytest.raises(ConfigError, match="attention_mask"):
        collate_packs([a], attention_mask="3d")
    with pytest.raises(ConfigError, match="at least one"):
        collate_packs([])


def test_a_plain_callable_transform_is_padded_to_the_slots():
    def transform(images):  # one entry per image, any layout
        return {"pixel_values": torch.ones(len(images), 2, 3), "sizes": torch.full((len(images), 2), 7)}

    e = pack_to_example(PACK, seq_len=10, max_images=3, pad_token_id=0, image_transform=transform)
    assert e["pixel_values"].shape == (3, 2, 3) and e["pixel_values"][1:].sum() == 0
    assert e["sizes"].tolist() == [[7, 7], [0, 0], [0, 0]]
    with pytest.raises(ConfigError, match="one entry per image"):
        pack_to_example(PACK, seq_len=10, max_images=3, pad_token_id=0,
                        image_transform=lambda ims: {"pixel_values": torch.ones(5, 2)})


# --- properties over random packs --------------------------------------------------------------

@st.composite
def packs(draw, seq_len=24, max_images=3):
    lens = draw(st.lists(st.integers(1, 9), min_size=0, max_size=5))
    while sum(lens) > seq_len:
        lens.pop()
    n = sum(lens)
    ids = np.array(draw(st.lists(st.integers(0, 500), min_size=n, max_size=n)), np.uint16)
    mask = np.array(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)), np.uint8)
    owners = sorted(draw(st.lists(st.integers(0, len(lens) - 1), max_size=max_images))) if lens else []
    return Pack(ids, mask, tuple(lens), tuple(f"s{i}" for i in range(len(lens))), tuple(b"" for _ in owners),
                tuple(owners), tuple(1 for _ in owners))


def _runs(values):
    """Lengths of the runs of equal consecutive values."""
    v = np.asarray(values)
    cuts = np.flatnonzero(np.diff(v)) + 1
    return np.diff(np.r_[0, cuts, v.size]).tolist()


def _position_segments(positions):
    """Segments as transformers finds them: a new one wherever the position does not step by 1."""
    p = np.asarray(positions)
    return np.cumsum(np.r_[1, np.diff(p)] != 1)


@given(st.lists(packs(), min_size=1, max_size=4), st.booleans())
@settings(max_examples=60, deadline=None)
def test_properties_over_random_packs(batch_packs, padding_free):
    L, M = 24, 3
    exs = [pack_to_example(p, seq_len=L, max_images=M, pad_token_id=999) for p in batch_packs]
    for p, e in zip(batch_packs, exs):
        n = p.num_tokens
        starts = set(np.cumsum((0,) + p.seq_lens[:-1]).tolist()) if p.seq_lens else set()
        want = [int(t) if m and i not in starts else IGNORE_INDEX
                for i, (t, m) in enumerate(zip(p.input_ids, p.loss_mask))] + [IGNORE_INDEX] * (L - n)
        assert e["labels"].tolist() == want
        assert e["input_ids"][:n].tolist() == p.input_ids.tolist() and set(e["input_ids"][n:].tolist()) <= {999}
        assert _runs(e["seq_idx"].tolist()) == [x for x in (*p.seq_lens, L - n) if x]
        assert np.array_equal(_position_segments(e["position_ids"]), e["seq_idx"].numpy())
        assert e["image_sample_idx"][: p.num_images].tolist() == list(p.image_sample)
        assert e["image_mask"].sum() == p.num_images
    b = collate_packs(exs, attention_mask="4d", padding_free=padding_free)
    B = len(batch_packs)
    flat_seq = b["seq_idx"].reshape(-1)
    cu = b["cu_seqlens"].tolist()
    assert cu[-1] == B * L == flat_seq.numel()
    if padding_free:
        assert b["input_ids"].shape == (1, B * L)
        assert _runs(flat_seq.tolist()) == np.diff(cu).tolist()  # ids are unique over the row
        assert b["input_ids"][0, : sum(p.num_tokens for p in batch_packs)].tolist() == \
            [int(t) for p in batch_packs for t in p.input_ids]
    else:
        assert b["input_ids"].shape == (B, L)
        assert [x for r in range(B) for x in _runs(b["seq_idx"][r].tolist())] == np.diff(cu).tolist()
    assert b["max_seqlen"] == max(np.diff(cu))
    for r in range(b["seq_idx"].shape[0]):
        assert torch.equal(b["attention_mask"][r, 0], _brute_mask(b["seq_idx"][r]))
        segs = _position_segments(b["position_ids"][r])
        assert _runs(segs.tolist()) == _runs(b["seq_idx"][r].tolist()), "position ids mark the same segments"


class _Packs(torch.utils.data.IterableDataset):
    def __init__(self, pad_images: bool = True) -> None:
        self.pad_images = pad_images

    def __iter__(self):
        t = make_image_transform(size=4)
        for p in (PACK, SHORT, SHORT, PACK):
            yield pack_to_example(p, seq_len=10, max_images=2, pad_token_id=0, image_transform=t,
                                  pad_images=self.pad_images)


def test_unpadded_images_are_padded_by_collate_to_the_same_batch():
    padded, compact = list(_Packs(True)), list(_Packs(False))
    assert [e["pixel_values"].shape[0] for e in compact] == [1, 0, 0, 1]
    assert all(e["pixel_values"].shape[0] == 2 for e in padded)
    for i in (0, 2):
        a, b = collate_packs(padded[i:i + 2]), collate_packs(compact[i:i + 2])
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k], k


@pytest.mark.parametrize("pad_images", [True, False])
def test_collate_in_a_dataloader_worker_matches_in_process(pad_images):
    """In a worker, batches are built straight in shared memory; the values must not change."""
    here = [collate_packs(list(_Packs())[i:i + 2]) for i in (0, 2)]
    loader = torch.utils.data.DataLoader(_Packs(pad_images), batch_size=2, num_workers=1, collate_fn=collate_packs,
                                         multiprocessing_context="fork")
    there = list(loader)
    assert len(there) == 2 and there[0]["pixel_values"].is_shared()
    for a, b in zip(here, there):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k], k


def _jpeg(seed: int, w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


IMAGES = (_jpeg(1, 40, 30), _png((10, 200, 30), 31, 17), _jpeg(2, 16, 16))
# Three packs: two images of sample "x" and one of "z"; no image; one image of "w".
MIXED = [Pack(np.array([1, IMG, IMG, 2, 1, IMG, 2, IMG, 2], np.uint16), np.ones(9, np.uint8), (4, 3, 2),
              ("x", "y", "z"), IMAGES, (0, 0, 2), (1, 1, 1)),
         SHORT,
         Pack(np.array([1, IMG, 5, 2], np.uint16), np.ones(4, np.uint8), (4,), ("w",), (IMAGES[1],), (0,), (1,))]


def test_collate_stage_decode_equals_the_transform_bit_for_bit():
    """``decode_pack_images`` + ``write_pixel_slots`` (the loader's way) == ``pack_to_example`` with the transform."""
    t = make_image_transform(size=16)
    ref = collate_packs([pack_to_example(p, seq_len=10, max_images=4, pad_token_id=0, image_transform=t)
                         for p in MIXED])
    images = [decode_pack_images(p, t) for p in MIXED]
    assert [len(x) for x in images] == [3, 0, 1]
    garbage = torch.full((12, 3, 16, 16), float("nan"))  # memory of unknown content: every empty slot zeroed
    assert write_pixel_slots(images, garbage, slots=4) == [3, 0, 1]
    assert torch.equal(garbage, ref["pixel_values"])
    assert torch.equal(garbage[~ref["image_mask"]], torch.zeros(8, 3, 16, 16))
    reused = torch.full((12, 3, 16, 16), float("nan"))
    reused[[3, 7, 9, 10, 11]] = 0  # slots known to be zero already (a reused buffer): only the stale ones rewritten
    write_pixel_slots(images, reused, slots=4, dirty=[2, 3, 1])
    assert torch.equal(reused, ref["pixel_values"])
    fresh = torch.zeros(12, 3, 16, 16)  # new shared memory is zero: nothing to zero
    write_pixel_slots(images, fresh, slots=4, dirty=[0, 0, 0])
    assert torch.equal(fresh, ref["pixel_values"])
    assert torch.equal(t(list(IMAGES))["pixel_values"], ref["pixel_values"][:3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8, torch.bfloat16])
def test_fresh_pixels_outside_a_worker_are_zero_and_written_once(dtype):
    """Out of a worker the memory is new and zero (numpy's calloc; bf16 through torch), so its packs'
    empty slots need no writing (``dirty`` 0 each); a batch made with it has zeros in every empty slot."""
    out, dirty = fresh_pixels((6, 3, 4, 4), 2, dtype=dtype)
    assert out.dtype == dtype and out.shape == (6, 3, 4, 4) and dirty == [0, 0]
    assert not out.any()
    t = make_image_transform(size=16)
    examples = [staged_example(p, seq_len=10, max_images=4, pad_token_id=0, image_transform=t) for p in MIXED]
    batch, counts = collate_staged(examples)
    ref = collate_packs([pack_to_example(p, seq_len=10, max_images=4, pad_token_id=0, image_transform=t)
                         for p in MIXED])
    assert counts == {"pixel_values": [3, 0, 1]} and torch.equal(batch["pixel_values"], ref["pixel_values"])
    assert not batch["pixel_values"][3:8].any() and batch["pixel_values"][:3].abs().sum() > 0


def test_collate_stage_decode_errors_name_the_sample():
    t = make_image_transform(size=8)
    bad = Pack(MIXED[0].input_ids, MIXED[0].loss_mask, MIXED[0].seq_lens, MIXED[0].sample_ids,
               (IMAGES[0], IMAGES[1], b"not an image"), (0, 0, 2), (1, 1, 1))
    with pytest.raises(ImageDecodeError, match=r"^sample 'z': image 2: cannot read the image header") as info:
        decode_pack_images(bad, t)
    assert info.value.index == 2 and isinstance(info.value, FormatError)
    with pytest.raises(ConfigError, match="5 images > 4 image slots"):
        write_pixel_slots([decode_pack_images(Pack(np.array([1]), np.ones(1, np.uint8), (1,), ("v",),
                                                   (IMAGES[1],) * 5, (0,) * 5, (0,) * 5), t)],
                          torch.zeros(4, 3, 8, 8), slots=4)
