"""Qwen3-VL (dense and MoE), exactly: the real ``Qwen3VLProcessor`` and model classes (tiny, random).

The packed batch carries ``position_ids`` ``[4, B, L]``: the restarting text row (the model builds
the block-causal mask from it) and each sub-sample's own 3-D mRoPE rows, which the model's
interleaved rotary embedding mixes; DeepStack adds early vision features at the image tokens.
"""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

import wdspack
from tests.support import vlm_harness as h
from wdspack.errors import ConfigError

SEQ_LEN = h.FAMILIES["qwen3_vl"][3]  # the packed chats' rows (tests/conftest.py vlm_family)


@pytest.fixture(scope="module")
def packed_set(vlm_family):
    """The processor and the packed dataset (dense and MoE models share the processor, so the dataset), built once
    per session."""
    processor, _, dataset = vlm_family("qwen3_vl")
    return processor, dataset


@pytest.fixture(scope="module", params=["Qwen3VL", "Qwen3VLMoe"])
def qwen3(request, packed_set):
    from tiny_vlm import qwen3_vl

    processor, dataset = packed_set
    model = qwen3_vl.model(processor, cls=f"{request.param}ForConditionalGeneration").double()
    if "Moe" in request.param:
        model.set_experts_implementation("eager")  # the default grouped_mm kernel has no float64 on CPU
    return processor, model, dataset


def test_family_is_found_from_processor_and_model(qwen3):
    processor, model, _ = qwen3
    assert wdspack.models.family_for(processor).name == "qwen3_vl"
    assert wdspack.models.family_for(model).name == "qwen3_vl"
    # Qwen3.5 shares the processor class but its linear-attention layers are not fed by this family.
    with pytest.raises(ConfigError, match="qwen3_5"):
        wdspack.models.family_for(SimpleNamespace(config=SimpleNamespace(model_type="qwen3_5")))


def test_tokens_are_the_processors(packed_set):
    processor, dataset = packed_set
    h.check_tokens(dataset, processor)


def test_pixels_and_positions_are_the_models(qwen3):
    processor, model, dataset = qwen3
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    packs = h.pack_sample_ids(dataset)
    chats = {c[0]: c for c in h.CHATS}
    images = [img for ids in packs for sid in ids for img in h.chat_images(chats[sid])]
    want = processor.image_processor([Image.open(io.BytesIO(b)) for b in images], return_tensors="pt")
    assert want["pixel_values"].shape[1] == 3 * 2 * 16 * 16  # the 16-pixel patches of the published config
    torch.testing.assert_close(kwargs["pixel_values"], want["pixel_values"], rtol=0, atol=0)
    assert kwargs["image_grid_thw"].tolist() == want["image_grid_thw"].tolist()
    B, L = batch["input_ids"].shape
    assert batch["position_ids"].shape == (4, B, L) and batch["mm_token_type_ids"].shape == (B, L)
    # Rows 1-3 of every sub-sample are the model's own get_rope_index of that sub-sample alone, and
    # mm_token_type_ids is the processor's.
    subs = h.dataset_sub_samples(dataset)
    for b in range(B):
        start = 0
        for sid in packs[b]:
            n = len(subs[sid][0])
            alone = h.oracle(processor, chats[sid])
            rope, _ = model.model.get_rope_index(alone["input_ids"], alone["mm_token_type_ids"],
                                                 alone.get("image_grid_thw"))
            assert torch.equal(batch["position_ids"][1:, b, start:start + n], rope[:, 0]), sid
            assert torch.equal(batch["position_ids"][0, b, start:start + n], torch.arange(n))
            assert torch.equal(batch["mm_token_type_ids"][b, start:start + n], alone["mm_token_type_ids"][0].long())
            start += n


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_loss_and_gradients_equal_one_by_one(qwen3, attn):
    processor, model, dataset = qwen3
    packs = h.pack_sample_ids(dataset)
    assert len(packs) >= 2 and any(len(p) > 1 for p in packs)
    assert any(len(p) > 1 and any(h.chat_images(c) for c in h.CHATS if c[0] in p) for p in packs), \
        "a pack holds an image sub-sample after another sub-sample (DeepStack and positions are offset)"
    got, want = h.packed_and_reference(model, processor, dataset, attn=attn, seq_len=SEQ_LEN)
    h.assert_same(model, got, want)
    # The DeepStack mergers reached the loss, so the check above covers their injection too.
    deepstack = [g for (name, _), g in zip(model.named_parameters(), want[2]) if "deepstack_merger_list" in name]
    assert deepstack and all(g.abs().sum() > 0 for g in deepstack)


def test_flex_attention_loss_equals_one_by_one(qwen3, monkeypatch):
    """Qwen3-VL MoE supports FlexAttention: the packed loss is the one-by-one loss (forward on CPU in
    float64; torch has no CPU FlexAttention backward). The dense class refuses FlexAttention itself."""
    processor, model, dataset = qwen3
    if not type(model)._supports_flex_attn:
        with pytest.raises(ValueError, match="flex_attention"):
            model.set_attn_implementation("flex_attention")
        return
    h.check_flex(model, processor, dataset, seq_len=SEQ_LEN, monkeypatch=monkeypatch)


@pytest.mark.gpu
def test_flex_attention_gradients_equal_one_by_one(qwen3):
    processor, model, dataset = qwen3
    if not type(model)._supports_flex_attn:
        pytest.skip(f"{type(model).__name__} does not support FlexAttention")
    h.check_flex_gradients(model, processor, dataset, seq_len=SEQ_LEN)


def test_two_d_positions_are_not_exact(qwen3):
    """The check above can fail: the loader's plain [B, L] positions give another loss."""
    processor, model, dataset = qwen3
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    kwargs["position_ids"] = kwargs["position_ids"][0]
    with torch.no_grad():
        flat = model(**kwargs).loss
        exact = model(**wdspack.model_inputs(batch, model)).loss
    assert not torch.allclose(flat, exact, rtol=1e-6)


def test_training_from_the_loader_lowers_the_loss(packed_set):
    """The dense class alone: the MoE class runs the same loader → model_inputs → optimizer path (its packed loss and
    gradients are checked exact above, its experts and router included)."""
    from tiny_vlm import qwen3_vl

    processor, dataset = packed_set
    h.check_training(qwen3_vl.model(processor, cls="Qwen3VLForConditionalGeneration").double(), dataset, processor)
