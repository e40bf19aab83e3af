"""Gemma 3, exactly: the real ``Gemma3Processor`` and ``Gemma3ForConditionalGeneration`` (tiny, random).

The tiny text stack mixes sliding (window 8) and full layers; every sub-sample and every image's
16 soft tokens are longer than the window, so the sliding layers' mask differs from the full ones'.
The packed batch carries ``attention_mask`` = ``{"full_attention", "sliding_attention"}`` masks
built by the family (the model's own mask path is wrong for packs: see
``test_the_models_own_packed_mask_is_not_exact``).

Float64 caveat: ``Gemma3RMSNorm`` computes in float32 whatever the model's dtype (``x.float()``),
and an RMSNorm weight's gradient is a float32 sum over every token of the forward; summing the
tokens of a pack instead of a sub-sample changes it at float32 rounding (~1e-7 relative), and the
vision tower's gradients (behind ``mm_soft_emb_norm``) by ~1e-8. So the loss is compared at float64
tolerance and the gradients at float32's; the negative controls below differ by orders more.
"""

from __future__ import annotations

import inspect

import pytest
import torch

import wdspack
from tests.support import vlm_harness as h
from wdspack.errors import ConfigError
from wdspack.models.families.gemma3 import GEMMA3, packed_masks

SEQ_LEN = h.ALL_FAMILIES["gemma3"][3]  # the packed chats' rows (tests/conftest.py vlm_family)
GRAD_TOLERANCE = {"rtol": 1e-6, "atol": 1e-8}  # float32 RMSNorm (module docstring)


@pytest.fixture(scope="module")
def gemma(vlm_family):
    """The real processor, the tiny model (float64) and the packed chats (built once per session)."""
    processor, model, dataset = vlm_family("gemma3")
    return processor, model.double(), dataset


def test_tokens_are_the_processors(gemma):
    processor, _, dataset = gemma
    h.check_tokens(dataset, processor)
    bos = processor.tokenizer.bos_token_id
    for sid, (ids, *_rest) in h.dataset_sub_samples(dataset).items():
        assert ids[0] == bos and int((ids == bos).sum()) == 1, f"{sid}: one BOS, at the start"


def test_pixels_and_token_types_are_the_processors(gemma):
    processor, model, dataset = gemma
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    chats = {c[0]: c for c in h.CHATS}
    packs = h.pack_sample_ids(dataset)
    alone = {sid: h.oracle(processor, chats[sid]) for sid in chats}
    want = torch.cat([alone[sid]["pixel_values"] for ids in packs for sid in ids if "pixel_values" in alone[sid]])
    torch.testing.assert_close(kwargs["pixel_values"], want, rtol=0, atol=0)
    for b, ids in enumerate(packs):
        start = 0
        for sid in ids:
            types = alone[sid]["token_type_ids"][0]
            assert torch.equal(batch["token_type_ids"][b, start:start + len(types)], types), sid
            start += len(types)


def test_masks_are_the_models_per_sub_sample(gemma):
    """Each sub-sample's block of the packed masks is the mask the model builds for it alone; the rest is masked."""
    from transformers.models.gemma3.modeling_gemma3 import (
        create_masks_for_vision_model,
        get_block_sequence_ids_for_mask,
    )

    # The model's own builder names its cache argument `cache` from transformers 5.24 on (before: past_key_values).
    no_cache = {"cache" if "cache" in inspect.signature(create_masks_for_vision_model).parameters
                else "past_key_values": None}

    processor, model, dataset = gemma
    (batch,) = h.loader_batches(dataset, processor)
    masks = wdspack.model_inputs(batch, model)["attention_mask"]
    text = model.config.get_text_config()
    assert text._attn_implementation == "sdpa" and masks["full_attention"].dtype == torch.bool
    B, _ = batch["input_ids"].shape
    for b in range(B):
        for s in batch["seq_idx"][b].unique().tolist():
            where = torch.nonzero(batch["seq_idx"][b] == s)[:, 0]
            lo, hi = int(where[0]), int(where[-1]) + 1
            types = batch["token_type_ids"][b, lo:hi][None]
            own = create_masks_for_vision_model(config=text, inputs_embeds=torch.zeros(1, hi - lo, 1),
                                                attention_mask=None, position_ids=None, **no_cache,
                                                block_sequence_ids=get_block_sequence_ids_for_mask(types))
            for name, mask in masks.items():
                assert torch.equal(mask[b, 0, lo:hi, lo:hi], own[name][0, 0]), (b, s, name)
                assert not mask[b, 0, lo:hi, :lo].any() and not mask[b, 0, lo:hi, hi:].any(), (b, s, name)
    full, sliding = masks["full_attention"], masks["sliding_attention"]
    assert (full & ~sliding).any(), "the window is shorter than a sub-sample"
    assert full.triu(1).any() and sliding.triu(1).any(), "soft tokens see the later soft tokens of their image"


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_loss_and_gradients_equal_one_by_one(gemma, attn):
    processor, model, dataset = gemma
    packs = h.pack_sample_ids(dataset)
    assert len(packs) >= 2 and any(len(p) > 1 for p in packs)
    sizes = {c[0]: c[2] for c in h.CHATS}
    assert any(sizes[sid] for p in packs for sid in p[1:]), "an image sits in a pack's second or later sub-sample"
    model.set_attn_implementation(attn)
    try:
        batches = h.loader_batches(dataset, processor)
        assert any(int(n) < SEQ_LEN for b in batches for n in b["num_tokens"]), "a pack has padding"
        if attn == "eager":
            mask = wdspack.model_inputs(batches[0], model)["attention_mask"]["sliding_attention"]
            assert mask.dtype == torch.float64 and mask.max() == 0 and mask.min() == torch.finfo(torch.float64).min
        want = h.reference(model, processor, dataset)
        got = h.packed(model, batches)
    finally:
        model.set_attn_implementation("sdpa")
    torch.testing.assert_close(got[0] / got[1], want[0] / want[1], rtol=1e-12, atol=1e-12)
    h.assert_same(model, got, want, **GRAD_TOLERANCE)


def test_flex_attention_loss_equals_one_by_one(gemma, monkeypatch):
    """The ``BlockMask`` pair ``packed_masks`` builds for FlexAttention gives the one-by-one loss: forward
    on CPU in float64 (torch has no CPU FlexAttention backward); gradients in the ``gpu`` test below."""
    from torch.nn.attention.flex_attention import BlockMask

    processor, model, dataset = gemma
    (batch,) = h.loader_batches(dataset, processor)
    model.set_attn_implementation("flex_attention")
    try:
        masks = wdspack.model_inputs(batch, model)["attention_mask"]
    finally:
        model.set_attn_implementation("sdpa")
    assert all(isinstance(m, BlockMask) for m in masks.values())
    assert set(masks) == {"full_attention", "sliding_attention"}
    h.check_flex(model, processor, dataset, seq_len=SEQ_LEN, monkeypatch=monkeypatch, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
def test_flex_attention_gradients_equal_one_by_one(gemma):
    """On CUDA with the compiled kernel, which takes head dims of 16 or more: the same tiny model with head_dim 16."""
    from tiny_vlm import gemma3

    processor, _, dataset = gemma
    h.check_flex_gradients(gemma3.model(processor, head_dim=16), processor, dataset, seq_len=SEQ_LEN)


def _loss(model, kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(**kwargs).loss


def test_block_causal_is_not_exact(gemma):
    """The check above can fail: plain block-causal attention (the restarting positions, no image spans) differs."""
    processor, model, dataset = gemma
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    exact = _loss(model, kwargs)
    del kwargs["attention_mask"]
    assert not torch.allclose(_loss(model, kwargs), exact, rtol=1e-6)


def test_the_models_own_packed_mask_is_not_exact(gemma):
    """Why the family builds the masks: the model's own path (token_type_ids + restarting positions) is wrong for
    packs where transformers remaps a packed sequence's mask indices by position
    (``masking_utils.remap_positions_for_packed_sequence``, after 5.17): the image-block lookup then reads the
    block ids at positions, not at indices. Without the remap (5.17) the own path gives the exact loss."""
    import transformers.masking_utils as masking

    processor, model, dataset = gemma
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    exact = _loss(model, kwargs)
    del kwargs["attention_mask"]
    kwargs["token_type_ids"] = batch["token_type_ids"]
    own = _loss(model, kwargs)
    if hasattr(masking, "remap_positions_for_packed_sequence"):
        assert not torch.allclose(own, exact, rtol=1e-6)
    else:
        torch.testing.assert_close(own, exact, rtol=1e-6, atol=1e-7)


def test_training_from_the_loader_lowers_the_loss(gemma):
    processor, model, dataset = gemma
    h.check_training(model, dataset, processor, dtype=torch.float32)


def test_refusals_name_the_fix(gemma):
    processor, _, _ = gemma
    processor.image_processor.do_pan_and_scan = True
    try:
        with pytest.raises(ConfigError, match="pan-and-scan"):
            GEMMA3.image.replacements(processor, [(40, 64)])
    finally:
        processor.image_processor.do_pan_and_scan = None
    with pytest.raises(ConfigError, match="sdpa, eager"):
        packed_masks(torch.zeros(1, 4, dtype=torch.int64), torch.zeros(1, 4, dtype=torch.int32), sliding_window=2,
                     implementation="flash_attention_2")

