"""LLaVA-1.5 and LLaVA-OneVision, exactly: the real processor classes and model classes (tiny, random).

LLaVA-1.5 gives every image the same number of ``<image>`` tokens; LLaVA-OneVision counts them from
the image size (any-resolution grid, unpadded and pooled features, newlines), and lays an image out
differently when its sample holds several, so the loader runs the image processor per sub-sample.
"""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import torch
from PIL import Image

import wdspack
from tests.support import vlm_harness as h
from wdspack.format.pack import decode_pack

SEQ_LEN = 96
KINDS = ["llava", "llava_onevision"]
#: The harness's chats and two small one-image chats, so that a pack holds a one-image sub-sample
#: next to the two-image one (OneVision tiles the first, not the second).
CHATS = h.CHATS + (
    ("img-small", (("user", "<image>Colour?"), ("assistant", "Grey.")), ((30, 20),)),
    ("img-tiny", (("user", "<image>Size?"), ("assistant", "Tiny.")), ((16, 16),)),
)


@pytest.fixture(scope="module")
def processors(tmp_path_factory):
    """Each kind's real processor, built once (the tekken tokenizer loads once)."""
    from tiny_vlm import llava

    folder = tmp_path_factory.mktemp("tok")
    return {kind: llava.processor(folder, kind=kind) for kind in KINDS}


@pytest.fixture(scope="module", params=KINDS)
def llava(request, tmp_path_factory, processors):
    from tiny_vlm import llava

    processor = processors[request.param]
    model = llava.model(processor).double()
    dataset = h.pack_chats(tmp_path_factory.mktemp(request.param), processor, seq_len=SEQ_LEN, chats=CHATS)
    return processor, model, dataset


def _packs(dataset):
    import tarfile

    out = []
    for shard in sorted(dataset.glob("*.tar")):
        with tarfile.open(shard) as tar:
            out += [decode_pack(tar.extractfile(m).read()) for m in tar.getmembers()]
    return out


def test_tokens_are_the_processors(llava):
    processor, _, dataset = llava
    h.check_tokens(dataset, processor, CHATS)


def test_pixels_are_the_processors(llava):
    """Each real image slot holds the processor's own pixels (and sizes) for that image in its chat;
    the model gets each sub-sample's image count as the processor gives it."""
    processor, model, dataset = llava
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    chats = {c[0]: c for c in CHATS}
    packs = _packs(dataset)
    alone = [h.oracle(processor, chats[sid]) for pack in packs for sid in pack.sample_ids if chats[sid][2]]
    want = [pv for a in alone for pv in a["pixel_values"]]
    got = kwargs["pixel_values"]
    assert len(got) == len(want) == int(batch["image_mask"].sum())
    onevision = "image_sizes" in alone[0]
    for g, w in zip(got, want):
        if onevision:  # [P, 3, S, S]: the image's own patches, then zeros up to the slot's P
            assert not g[w.shape[0]:].any()
            g = g[:w.shape[0]]
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert not batch["pixel_values"][~batch["image_mask"]].any()
    slots = batch["image_mask"].shape[0]
    if onevision:
        P = wdspack.models.families.llava.max_patches(processor.image_processor)
        assert batch["pixel_values"].shape == (slots, P, 3, 16, 16) and batch["image_sizes"].shape == (slots, 2)
        assert kwargs["image_sizes"].tolist() == [s for a in alone for s in a["image_sizes"].tolist()]
        assert kwargs["batch_num_images"].tolist() == [n for a in alone for n in a["batch_num_images"].tolist()]
        per_pack = [sorted(p.image_sample.count(s) for s in set(p.image_sample)) for p in packs]
        assert [1, 2] in per_pack, per_pack  # a pack holds a lone image (tiled) and a pair (one tile each)
    else:
        assert batch["pixel_values"].shape == (slots, 3, 32, 32)
        assert set(kwargs) == {"input_ids", "position_ids", "pixel_values", "labels", "use_cache"}


@pytest.mark.parametrize("llava", ["llava_onevision"], indirect=True)
def test_images_not_grouped_per_sample_are_refused(llava):
    """Negative control for ``pixels_per_sample``: the pack's images as one flat list are each
    taken as alone in its sample, so the pair is tiled and the counts the pack reserved no longer
    match; the loader says so instead of feeding the model other pixels."""
    import dataclasses

    from wdspack.errors import ConfigError
    from wdspack.loader.batch.model import ModelBatcher

    processor, _, dataset = llava
    pack = next(p for p in _packs(dataset) if "two-images" in p.sample_ids)
    ids = torch.from_numpy(pack.input_ids.astype(np.int64))
    batcher = ModelBatcher(processor, seq_len=SEQ_LEN, max_images=4)
    pixels, _ = batcher.pack_parts(pack, ids)
    k = len(pack.images)
    assert pixels["image_sizes"][:k].tolist() == [list(Image.open(io.BytesIO(b)).size[::-1]) for b in pack.images]
    batcher.family = dataclasses.replace(
        batcher.family, image=dataclasses.replace(batcher.family.image, pixels_per_sample=False))
    with pytest.raises(ConfigError, match="image tokens for these images but the pack reserved"):
        batcher.pack_parts(pack, ids)


def _softmax_in_input_dtype(monkeypatch) -> None:
    """Eager attention keeps float64 probabilities (transformers rounds them to float32)."""
    softmax = torch.nn.functional.softmax

    def softmax64(x, dim=None, _stacklevel=3, dtype=None):
        return softmax(x, dim=dim, dtype=None if x.dtype == torch.float64 else dtype)

    monkeypatch.setattr(torch.nn.functional, "softmax", softmax64)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_loss_and_gradients_equal_one_by_one(llava, attn, monkeypatch):
    """Exact in float64. transformers' eager attention rounds the softmax to float32, whose
    summation order depends on the row's length (a pack's rows are longer than a sub-sample alone),
    so as it is eager agrees only to float32 rounding (LLaVA-1.5 here: gradients within 4e-7); with
    float64 probabilities (the eager mask path unchanged) it agrees exactly."""
    processor, model, dataset = llava
    packs = [p.sample_ids for p in _packs(dataset)]
    assert len(packs) >= 2 and any(len(p) > 1 for p in packs)
    model.set_attn_implementation(attn)
    try:
        batches = h.loader_batches(dataset, processor)
        assert any(int(n) < SEQ_LEN for b in batches for n in b["num_tokens"]), "a pack has padding"
        if attn == "eager":
            _softmax_in_input_dtype(monkeypatch)
        want = h.reference(model, processor, dataset, CHATS)
        got = h.packed(model, batches)
    finally:
        model.set_attn_implementation("sdpa")
    h.assert_same(model, got, want)


def test_flex_attention_loss_equals_one_by_one(llava, monkeypatch):
    """Under FlexAttention (the class supports it) the packed loss is the one-by-one loss: forward on
    CPU in float64 (torch has no CPU FlexAttention backward); gradients in the ``gpu`` test below."""
    processor, model, dataset = llava
    h.check_flex(model, processor, dataset, seq_len=SEQ_LEN, chats=CHATS, monkeypatch=monkeypatch)


@pytest.mark.gpu
def test_flex_attention_gradients_equal_one_by_one(llava):
    """On CUDA with the compiled kernel, which takes head dims of 16 or more: the same tiny model with head_dim 16."""
    from tiny_vlm import llava as tiny

    processor, _, dataset = llava
    h.check_flex_gradients(tiny.model(processor, head_dim=16), processor, dataset, seq_len=SEQ_LEN, chats=CHATS)


def test_unbroken_positions_are_not_exact(llava):
    """The check above can fail: positions that do not restart per sub-sample (one causal mask over
    the whole pack) give another loss."""
    processor, model, dataset = llava
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    with torch.no_grad():
        exact = model(**kwargs).loss
        kwargs["position_ids"] = torch.arange(kwargs["input_ids"].shape[1]).expand_as(kwargs["input_ids"])
        flat = model(**kwargs).loss
    assert not torch.allclose(flat, exact, rtol=1e-6)


def test_training_from_the_loader_lowers_the_loss(llava):
    processor, model, dataset = llava
    h.check_training(model, dataset, processor)


# (height, width): square, wide, tall, tiny, large, extreme ratios.
SIZES = [(16, 16), (40, 40), (30, 90), (90, 30), (56, 96), (100, 44), (7, 5), (300, 200), (20, 200), (200, 21),
         (48, 33), (33, 48), (64, 17)]


def _processor_count(processor, sizes) -> list[int]:
    """The real processor's ``<image>`` count per image of one text holding ``len(sizes)`` images."""
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (hh, ww, 3), dtype=np.uint8)) for hh, ww in sizes]
    text = "x".join(processor.image_token for _ in sizes) + "x"
    ids = processor(text=[text], images=[images], return_tensors="pt")["input_ids"][0]
    runs, n = [], 0
    for is_image in (ids == processor.image_token_id).tolist() + [False]:
        if is_image:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    return runs


@pytest.mark.parametrize("kind,options", [("llava", {}), ("llava", {"vision_feature_select_strategy": "full"}),
                                          ("llava_onevision", {}),
                                          ("llava_onevision", {"vision_aspect_ratio": "anyres_max_9"})])
def test_replacements_from_sizes_are_the_processors(processors, kind, options):
    """From header sizes alone, every size and aspect ratio (different grid pinpoints), alone and
    several to a sample, gives the processor's own count."""
    from transformers.image_processing_utils import select_best_resolution

    processor = copy.copy(processors[kind])
    for name, value in options.items():  # what the processor's __init__ sets from these options
        setattr(processor, name, value)
    family = wdspack.models.family_for(processor)
    for sizes in [[s] for s in SIZES] + [SIZES[:2], SIZES[2:5]]:
        got = [len(t) // len(processor.image_token) for t in family.image.replacements(processor, sizes)]
        assert "".join(family.image.replacements(processor, sizes)).replace(processor.image_token, "") == ""
        assert got == _processor_count(processor, sizes), sizes
    if kind == "llava_onevision":
        grids = {tuple(select_best_resolution(s, processor.image_processor.image_grid_pinpoints)) for s in SIZES}
        assert len(grids) >= 5, grids
    else:
        cls = "vision_feature_select_strategy" in options  # "full" keeps the CLS feature
        assert family.image.replacements(processor, SIZES[:1])[0].count("<image>") == 16 + cls
