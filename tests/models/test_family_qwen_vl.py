"""Qwen2.5-VL and Qwen2-VL, exactly: the real processor classes and model classes (tiny, random).

The packed batch carries ``position_ids`` ``[4, B, L]``: the restarting text row (the model builds
the block-causal mask from it) and each sub-sample's own 3-D mRoPE rows.
"""

from __future__ import annotations

import pytest
import torch

import wdspack
from tests.support import vlm_harness as h
from wdspack.errors import ConfigError
from wdspack.models.families.qwen_vl import mrope_positions

SEQ_LEN = h.FAMILIES["qwen2_5_vl"][3]  # the packed chats' rows (tests/conftest.py vlm_family)
NAMES = {"Qwen2_5_VL": "qwen2_5_vl", "Qwen2VL": "qwen2_vl"}


@pytest.fixture(scope="module", params=["Qwen2_5_VL", "Qwen2VL"])
def qwen(request, vlm_family):
    """The real processor class, the tiny model (float64) and the packed chats (built once per session)."""
    processor, model, dataset = vlm_family(NAMES[request.param])
    assert type(model).__name__ == f"{request.param}ForConditionalGeneration"
    return processor, model.double(), dataset


def test_tokens_are_the_processors(qwen):
    processor, _, dataset = qwen
    h.check_tokens(dataset, processor)


def test_pixels_and_positions_are_the_models(qwen):
    processor, model, dataset = qwen
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    order = [sid for sid in _pack_order(dataset)]
    chats = {c[0]: c for c in h.CHATS}
    images = [img for sid in order for img in h.chat_images(chats[sid])]
    import io

    from PIL import Image
    want = processor.image_processor([Image.open(io.BytesIO(b)) for b in images], return_tensors="pt")
    torch.testing.assert_close(kwargs["pixel_values"], want["pixel_values"], rtol=0, atol=0)
    assert kwargs["image_grid_thw"].tolist() == want["image_grid_thw"].tolist()
    B, L = batch["input_ids"].shape
    assert batch["position_ids"].shape == (4, B, L) and batch["mm_token_type_ids"].shape == (B, L)
    # Rows 1-3 of every sub-sample are the model's own get_rope_index of that sub-sample alone.
    subs = h.dataset_sub_samples(dataset)
    for b in range(B):
        start = 0
        for sid in h.pack_sample_ids(dataset)[b]:
            n = len(subs[sid][0])
            alone = h.oracle(processor, chats[sid])
            rope, _ = model.model.get_rope_index(alone["input_ids"], alone["mm_token_type_ids"],
                                                 alone.get("image_grid_thw"))
            assert torch.equal(batch["position_ids"][1:, b, start:start + n], rope[:, 0]), sid
            assert torch.equal(batch["position_ids"][0, b, start:start + n], torch.arange(n))
            start += n


def _pack_order(dataset):
    return [sid for ids in h.pack_sample_ids(dataset) for sid in ids]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_loss_and_gradients_equal_one_by_one(qwen, attn):
    processor, model, dataset = qwen
    packs = h.pack_sample_ids(dataset)
    assert len(packs) >= 2 and any(len(p) > 1 for p in packs)
    got, want = h.packed_and_reference(model, processor, dataset, attn=attn, seq_len=SEQ_LEN)
    h.assert_same(model, got, want)


def test_flex_attention_is_refused_by_the_class(qwen):
    """Qwen2-VL and Qwen2.5-VL do not support FlexAttention in transformers (so the Families table of
    docs/guides/models.md lists SDPA and eager for them); the day they do, this fails and a flex check belongs here."""
    _, model, _ = qwen
    assert not type(model)._supports_flex_attn
    with pytest.raises(ValueError, match="flex_attention"):
        model.set_attn_implementation("flex_attention")


def test_two_d_positions_are_not_exact(qwen):
    """The check above can fail: the loader's plain [B, L] positions give another loss (the issue's bug)."""
    processor, model, dataset = qwen
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    kwargs["position_ids"] = kwargs["position_ids"][0]
    with torch.no_grad():
        flat = model(**kwargs).loss
        exact = model(**wdspack.model_inputs(batch, model)).loss
    assert not torch.allclose(flat, exact, rtol=1e-6)


def test_training_from_the_loader_lowers_the_loss(qwen):
    processor, model, dataset = qwen
    h.check_training(model, dataset, processor)


def test_mrope_positions_drawn_in_the_docstring():
    ids = torch.tensor([1, 5, 7, 9, 9, 9, 9, 8, 6, 0])
    rope = mrope_positions(ids, [9], torch.tensor([[1, 4, 4]]), image_token_id=9, merge_size=2)
    assert rope[:, :9].tolist() == [[0, 1, 2, 3, 3, 3, 3, 5, 6], [0, 1, 2, 3, 3, 4, 4, 5, 6],
                                    [0, 1, 2, 3, 4, 3, 4, 5, 6]]
    assert rope[:, 9].tolist() == [0, 0, 0]


def test_mrope_positions_of_images_back_to_back_and_sub_samples():
    """Two images in one run (A: 2×2 merged, B: 1×2), text after them, a second sub-sample that starts
    again at 0, and padding: each image starts where the one before it ends (``max(h, w)`` on)."""
    ids = torch.tensor([1, 9, 9, 9, 9, 9, 9, 5, 2, 9, 0, 0])
    rope = mrope_positions(ids, [8, 2], torch.tensor([[1, 4, 4], [1, 2, 4], [1, 2, 2]]), image_token_id=9,
                           merge_size=2)
    assert rope.tolist() == [[0, 1, 1, 1, 1, 3, 3, 5, 0, 1, 0, 1],
                             [0, 1, 1, 2, 2, 3, 3, 5, 0, 1, 0, 1],
                             [0, 1, 2, 1, 2, 3, 4, 5, 0, 1, 0, 1]]
    with pytest.raises(ConfigError, match="image tokens but its grids give"):
        mrope_positions(ids, [8, 2], torch.tensor([[1, 4, 4]]), image_token_id=9, merge_size=2)


@pytest.mark.gpu
def test_padding_free_flash_attention_2_equals_one_by_one(qwen):
    """FlashAttention-2 varlen over the padding-free row ([1, N], 4 position rows), bf16 on CUDA."""
    pytest.importorskip("flash_attn", reason="needs the flash_attn package (transformers' flash_attention_2); the "
                        "same check without it: tests/models/test_varlen_families.py")
    processor, model, dataset = qwen
    import copy

    gpu = copy.deepcopy(model).to("cuda", torch.bfloat16)
    gpu.set_attn_implementation("flash_attention_2")
    want = h.reference(gpu, processor, dataset)
    got = h.packed(gpu, h.loader_batches(dataset, processor, padding_free=True))
    h.assert_same(gpu, got, want, rtol=2e-2, atol=2e-2)
