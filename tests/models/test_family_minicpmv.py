"""MiniCPM-V 4.6, exactly: the real ``MiniCPMV4_6Processor`` and ``MiniCPMV4_6ForConditionalGeneration`` (tiny).

Images become an overview and a grid of slices (``<image>…</image><slice>…</slice>`` rows); the batch carries
each pack's NaViT patches as rows with each slice's ``target_sizes``. The text model (Qwen3.5) has
linear-attention layers, which run per sub-sample.
"""

from __future__ import annotations

import pytest
import torch
from PIL import Image

import wdspack
from tests.support import vlm_harness as h
from wdspack.models.families.minicpmv import MINICPMV4_6, image_layout

SEQ_LEN = h.ALL_FAMILIES["minicpmv4_6"][3]

#: (height, width): within one slice, just over it, wide, tall, extreme ratios, past max_slice_nums.
SIZES = [(1, 1), (20, 30), (56, 56), (57, 56), (56, 96), (100, 44), (70, 36), (13, 200), (200, 13), (3, 500),
         (300, 400), (1000, 999)]

#: Qwen3.5's Gated DeltaNet casts its inputs to float32 (transformers' torch path), so the float64 rounding that
#: differs between a pack and a sub-sample alone (SDPA over a longer row) can flip a float32 rounding there: the
#: gradients agree to float32 rounding on small entries (measured 5e-11 absolute, 1.3e-5 relative); the loss to 1e-9.
GRADIENTS = h.EAGER_GRADIENTS
TOLERANCE = {"sdpa": dict(rtol=1e-9, atol=1e-11), "eager": dict(rtol=1e-6, atol=1e-8)}


@pytest.fixture(scope="module")
def minicpmv(vlm_family):
    processor, model, dataset = vlm_family("minicpmv4_6")
    return processor, model.double(), dataset


def test_family_is_found_from_processor_and_model(minicpmv):
    processor, model, _ = minicpmv
    assert wdspack.models.family_for(processor) is MINICPMV4_6 and wdspack.models.family_for(model) is MINICPMV4_6


def test_tokens_are_the_processors(minicpmv):
    processor, _, dataset = minicpmv
    h.check_tokens(dataset, processor)


def test_replacements_from_sizes_are_the_processors(minicpmv):
    """For every size, the text from the header alone is the processor's own from the pixels (its slice grid,
    overview and slices), and so are the slices' target sizes."""
    processor = minicpmv[0]
    tok, token = processor.tokenizer, processor.image_token
    for height, width in SIZES:
        image = Image.new("RGB", (width, height), (120, 30, 200))
        want = processor(text=[f"a{token}b{token}"], images=[image, image], return_tensors="pt")
        texts = MINICPMV4_6.image.replacements(processor, [(height, width), (height, width)])
        got = tok(f"a{texts[0]}b{texts[1]}", add_special_tokens=False)["input_ids"]
        assert got == want["input_ids"][0].tolist(), (height, width)
        _, sizes = image_layout(processor.image_processor, height, width)
        assert sizes * 2 == want["target_sizes"].tolist(), (height, width)


def test_layout_drawn_in_the_docstring(minicpmv):
    processor = minicpmv[0]
    one = "<image>" + "<|image_pad|>" + "</image>"
    (text,) = MINICPMV4_6.image.replacements(processor, [(56, 96)])
    assert text == f"<image_id>0</image_id>{one}" + "<slice><|image_pad|></slice>" * 2
    assert MINICPMV4_6.image.replacements(processor, [(40, 40)]) == [f"<image_id>0</image_id>{one}"]


def test_pixels_and_target_sizes_are_the_processors(minicpmv):
    processor, model, dataset = minicpmv
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    chats = {c[0]: c for c in h.CHATS}
    pixels, sizes = [], []
    for sid in [sid for ids in h.pack_sample_ids(dataset) for sid in ids]:
        alone = h.oracle(processor, chats[sid])
        if "pixel_values" in alone:
            pixels.append(alone["pixel_values"])
            sizes += alone["target_sizes"].tolist()
    want = torch.cat(pixels, dim=-1)
    assert kwargs["target_sizes"].tolist() == sizes
    torch.testing.assert_close(kwargs["pixel_values"], want.to(kwargs["pixel_values"].dtype), rtol=0, atol=0)
    assert not batch["pixel_values"][~batch["patch_mask"]].any()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_loss_and_gradients_equal_one_by_one(minicpmv, attn):
    processor, model, dataset = minicpmv
    packs = h.pack_sample_ids(dataset)
    assert len(packs) >= 2 and any(len(p) > 1 for p in packs)
    got, want = h.packed_and_reference(model, processor, dataset, attn=attn, seq_len=SEQ_LEN)
    h.assert_same(model, got, want, **TOLERANCE[attn], looser=GRADIENTS)


def test_linear_attention_across_sub_samples_is_not_exact(minicpmv):
    """The check above can fail: without the segments the linear-attention state runs on across sub-samples
    (the random model's near-uniform logits move the mean loss by little, so its logits are compared)."""
    processor, model, dataset = minicpmv
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    with torch.no_grad():
        exact = model(**kwargs).logits
        state = model(**{k: v for k, v in kwargs.items() if k != "wdspack_cu_seqlens"}).logits
    assert float((state - exact).abs().max()) > 1e-3
