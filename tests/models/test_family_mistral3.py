"""Mistral 3, exactly: the real ``PixtralProcessor`` and ``Mistral3ForConditionalGeneration`` (tiny, random).

Images become ``[IMG]`` rows closed by ``[IMG_BREAK]`` / ``[IMG_END]``; the batch carries each pack's
images in ``max_images`` square slots with their ``image_sizes``, which the vision tower crops to.
"""

from __future__ import annotations

import pytest
import torch
from PIL import Image

import wdspack
from tests.support import vlm_harness as h
from wdspack.errors import WdspackError
from wdspack.models.families.mistral3 import MISTRAL3, resized_size

SEQ_LEN = h.FAMILIES["mistral3"][3]  # the packed chats' rows (tests/conftest.py vlm_family)

#: (height, width): tiny, exact cells, one pixel over a cell, wider / taller than the longest edge,
#: extreme aspect ratios, larger than both processors' longest edge.
SIZES = [(1, 1), (16, 16), (17, 15), (31, 33), (40, 50), (56, 96), (64, 64), (65, 64), (64, 65), (70, 36),
         (100, 44), (200, 13), (13, 200), (3, 500), (999, 1000), (1541, 700), (2000, 3000), (4000, 90)]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("mistral3-tok")


@pytest.fixture(scope="module")
def mistral(vlm_family):
    """The real processor, the tiny model (float64) and the packed chats (built once per session)."""
    processor, model, dataset = vlm_family("mistral3")
    return processor, model.double(), dataset


def test_family_is_found_from_processor_and_model(mistral):
    processor, model, _ = mistral
    assert wdspack.models.family_for(processor) is MISTRAL3 and wdspack.models.family_for(model) is MISTRAL3


def test_tokens_are_the_processors(mistral):
    processor, _, dataset = mistral
    h.check_tokens(dataset, processor)


@pytest.mark.parametrize("settings", [dict(), dict(longest_edge=1540, patch_size=14)],
                         ids=["tiny", "mistral-small-3.1"])
def test_replacements_from_sizes_are_the_processors(mistral, tok_dir, settings):
    """For every size, the text and ``image_sizes`` from the header alone equal the processor's own
    from the pixels; a size the processor refuses is refused too."""
    from tiny_vlm import mistral3

    processor = mistral3.processor(tok_dir, **settings) if settings else mistral[0]
    tok = processor.tokenizer
    for height, width in SIZES:
        image = Image.new("RGB", (width, height), (120, 30, 200))
        try:
            want = processor(text=["[IMG]"], images=[image], return_tensors="pt")
        except Exception:
            with pytest.raises(Exception):  # noqa: B017  (whatever the processor raised: ours refuses too)
                MISTRAL3.image.replacements(processor, [(height, width)])
            continue
        (text,) = MISTRAL3.image.replacements(processor, [(height, width)])
        assert tok(text, add_special_tokens=False)["input_ids"] == want["input_ids"][0].tolist(), (height, width)
        assert list(resized_size(processor, height, width)) == want["image_sizes"][0].tolist(), (height, width)


def test_layout_drawn_in_the_docstring(mistral):
    processor = mistral[0]
    row = "[IMG]" * 4
    assert MISTRAL3.image.replacements(processor, [(40, 50)]) == [f"{row}[IMG_BREAK]{row}[IMG_BREAK]{row}[IMG_END]"]


def test_pixels_and_sizes_are_the_processors(mistral):
    processor, model, dataset = mistral
    (batch,) = h.loader_batches(dataset, processor)
    B, M = batch["input_ids"].shape[0], 4
    assert batch["pixel_values"].shape == (B * M, 3, 64, 64) and batch["image_sizes"].shape == (B * M, 2)
    kwargs = wdspack.model_inputs(batch, model)
    chats = {c[0]: c for c in h.CHATS}
    pixels, sizes = [], []
    for sid in [sid for ids in h.pack_sample_ids(dataset) for sid in ids]:
        alone = h.oracle(processor, chats[sid])  # the processor's own apply_chat_template path
        if "pixel_values" in alone:
            pixels += list(alone["pixel_values"])
            sizes += alone["image_sizes"].tolist()
    assert kwargs["image_sizes"].tolist() == sizes
    assert kwargs["pixel_values"].shape[0] == len(pixels) == int(batch["image_mask"].sum())
    for got, want, (height, width) in zip(kwargs["pixel_values"], pixels, sizes):
        torch.testing.assert_close(got[:, :height, :width], want[:, :height, :width], rtol=0, atol=0)
        assert not got[:, height:].any() and not got[:, :, width:].any(), "zero padding"
    empty = ~batch["image_mask"]
    assert not batch["pixel_values"][empty].any() and not batch["image_sizes"][empty].any()


#: Tolerances per attention. Eager attention takes its softmax in float32 (transformers'
#: ``softmax(..., dtype=torch.float32)``) even in a float64 model, and the float32 row sum rounds
#: differently for a sub-sample alone than at an offset in a longer packed row (with the softmax in
#: float64 the packed eager logits equal the one-by-one ones to 2e-16). So eager agrees to float32
#: rounding (seen: 2.5e-9 on gradients up to 0.3), SDPA (float64 throughout) to float64 rounding.
TOLERANCE = {"sdpa": dict(rtol=1e-9, atol=1e-11), "eager": dict(rtol=1e-6, atol=1e-8)}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_loss_and_gradients_equal_one_by_one(mistral, attn):
    processor, model, dataset = mistral
    packs = h.pack_sample_ids(dataset)
    assert len(packs) >= 2 and any(len(p) > 1 for p in packs)
    got, want = h.packed_and_reference(model, processor, dataset, attn=attn, seq_len=SEQ_LEN)
    h.assert_same(model, got, want, **TOLERANCE[attn])


def test_flex_attention_loss_equals_one_by_one(mistral, monkeypatch):
    """Under FlexAttention (the class supports it) the packed loss is the one-by-one loss: forward on
    CPU in float64 (torch has no CPU FlexAttention backward); gradients in the ``gpu`` test below."""
    processor, model, dataset = mistral
    h.check_flex(model, processor, dataset, seq_len=SEQ_LEN, monkeypatch=monkeypatch)


@pytest.mark.gpu
def test_flex_attention_gradients_equal_one_by_one(mistral):
    """On CUDA with the compiled kernel, which takes head dims of 16 or more: the same tiny model with head_dim 16."""
    from tiny_vlm import mistral3

    processor, _, dataset = mistral
    h.check_flex_gradients(mistral3.model(processor, head_dim=16), processor, dataset, seq_len=SEQ_LEN)


def test_one_causal_sequence_per_pack_is_not_exact(mistral):
    """The check above can fail: positions that do not restart per sub-sample (no block mask) give another loss."""
    processor, model, dataset = mistral
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    with torch.no_grad():
        exact = model(**kwargs).loss
        L = kwargs["input_ids"].shape[1]
        flat = model(**{**kwargs, "position_ids": torch.arange(L).expand_as(kwargs["input_ids"])}).loss
    assert not torch.allclose(flat, exact, rtol=1e-6)


def test_slot_padding_never_reaches_the_model(mistral):
    """The vision tower crops each image to its ``image_sizes``: noise in the padding changes nothing,
    noise inside an image does."""
    processor, model, dataset = mistral
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    inside = torch.zeros_like(kwargs["pixel_values"], dtype=torch.bool)
    for k, (height, width) in enumerate(kwargs["image_sizes"].tolist()):
        inside[k, :, :height, :width] = True
    noise = torch.randn(kwargs["pixel_values"].shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        exact = model(**kwargs).loss
        padded = model(**{**kwargs, "pixel_values": torch.where(inside, kwargs["pixel_values"], noise)}).loss
        inner = model(**{**kwargs, "pixel_values": torch.where(inside, noise, kwargs["pixel_values"])}).loss
    assert torch.equal(padded, exact)
    assert not torch.allclose(inner, exact, rtol=1e-6)


def test_loading_with_another_processor_names_the_fix(mistral, tok_dir):
    from tiny_vlm import mistral3

    _, _, dataset = mistral
    # answered when the loader is built (#38 item 6), in one line, before any batch
    with pytest.raises(WdspackError, match=r"was packed with the mistral3 processor .*, which gave a \d+x\d+ image 12 "
                                           r"tokens; the loader's processor .* gives it 4 \(another patch size"):
        h.loader_batches(dataset, mistral3.processor(tok_dir, longest_edge=32))  # raises, even with on_corrupt="skip"


def test_training_from_the_loader_lowers_the_loss(mistral):
    processor, model, dataset = mistral
    h.check_training(model, dataset, processor)
