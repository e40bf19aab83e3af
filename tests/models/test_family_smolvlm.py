"""SmolVLM and Idefics3, exactly: the real processor classes and model classes (tiny, random).

Images are split into 32-pixel tiles (up to 3×3 + a global tile, ``<row_i_col_j>`` tokens); the
packed batch carries each pack's tiles ``[T, 3, 32, 32]`` (``T`` static) with
``pixel_attention_mask`` and ``tile_mask``, and plain restarting ``position_ids`` ``[B, L]``.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import wdspack
from tests.support import vlm_harness as h
from wdspack.models import Budgets
from wdspack.models.families.idefics3 import tile_grid, tile_slots

SEQ_LEN = h.FAMILIES["smolvlm"][3]  # 192: packs of 21 and 7 tiles, the second one's tile slots end in padding


@pytest.fixture(scope="module", params=["SmolVLM", "Idefics3"])
def smol(request, vlm_family):
    """The real processor class, the tiny model (float64) and the packed chats (built once per session)."""
    processor, model, dataset = vlm_family(request.param.lower())
    assert type(model).__name__ == f"{request.param}ForConditionalGeneration"
    return processor, model.double(), dataset


def test_tokens_are_the_processors(smol):
    processor, _, dataset = smol
    h.check_tokens(dataset, processor)
    text = processor.tokenizer.decode(np.concatenate([s[0] for s in h.dataset_sub_samples(dataset).values()]))
    assert "<row_3_col_2>" in text and "<row_2_col_3>" in text and "<global-img>" in text, "tiles both ways"


@pytest.mark.parametrize("longest_edge, splitting", [(96, True), (80, True), (48, True), (32, True), (96, False)])
def test_replacements_follow_the_image_processor(smol, longest_edge, splitting):
    """The layout from the header size alone is the processor's, for many sizes and aspect ratios, also
    where ``size`` is no multiple of the tile (``get_number_of_image_patches`` is off by a row there)."""
    processor = copy.copy(smol[0])
    processor.image_processor = type(processor.image_processor)(
        size={"longest_edge": longest_edge}, max_image_size={"longest_edge": 32}, do_image_splitting=splitting)
    family = wdspack.models.family_for(processor)
    rng = np.random.default_rng(longest_edge)
    sizes = [(int(a), int(b)) for a, b in rng.integers(3, 400, size=(40, 2))] + [(32, 32), (33, 31), (65, 64), (1, 90)]
    images = [Image.fromarray(rng.integers(0, 256, (hh, ww, 3), dtype=np.uint8)) for hh, ww in sizes]
    real = processor.image_processor([images], return_row_col_info=True)
    reps = family.image.replacements(processor, sizes)
    for i, (size, rep) in enumerate(zip(sizes, reps)):
        assert tile_grid(processor.image_processor, *size) == (real["rows"][0][i], real["cols"][0][i]), size
        assert rep == processor.replace_image_token(real, image_idx=i), size
    assert len({rep.count("<image>") for rep in reps}) > 1 or not splitting or longest_edge <= 32
    # And token for token through the processor's own __call__ (a few images in one text).
    text = "Look: " + " and ".join(processor.image_token for _ in images[:6]) + "."
    want = processor(text=[text], images=[images[:6]])["input_ids"][0]
    pieces = text.split(processor.image_token)
    expanded = pieces[0] + "".join(rep + piece for rep, piece in zip(reps[:6], pieces[1:]))
    assert processor.tokenizer(expanded)["input_ids"] == want


def test_pixels_are_the_processors(smol):
    processor, model, dataset = smol
    (batch,) = h.loader_batches(dataset, processor)
    B, _ = batch["input_ids"].shape
    manifest = wdspack.read_manifest(dataset / "manifest.json")
    T = tile_slots(processor, Budgets(SEQ_LEN, 4, manifest.totals["max_image_tokens_per_pack"]))
    assert T < tile_slots(processor, Budgets(SEQ_LEN, 4)), "sized for the largest pack's image tokens"
    assert batch["pixel_values"].shape == (B * T, 3, 32, 32) and batch["pixel_attention_mask"].shape == (B * T, 32, 32)
    kwargs = wdspack.model_inputs(batch, model)
    chats = {c[0]: c for c in h.CHATS}
    alone = [h.oracle(processor, chats[sid]) for ids in h.pack_sample_ids(dataset) for sid in ids if chats[sid][2]]
    want = torch.cat([o["pixel_values"][0] for o in alone])[None]
    torch.testing.assert_close(kwargs["pixel_values"], want, rtol=0, atol=0)
    want_mask = torch.cat([o["pixel_attention_mask"][0] for o in alone])[None]
    torch.testing.assert_close(kwargs["pixel_attention_mask"], want_mask, rtol=0, atol=0)
    assert int(batch["tile_mask"].sum()) == want.shape[1] < B * T, "padding tile slots"
    pad = ~batch["tile_mask"]
    assert not batch["pixel_values"][pad].any() and not batch["pixel_attention_mask"][pad].any()
    image_id = processor.image_token_id
    assert int((kwargs["input_ids"] == image_id).sum()) == want.shape[1] * processor.image_seq_len
    assert set(kwargs) == {"input_ids", "position_ids", "pixel_values", "pixel_attention_mask", "labels", "use_cache"}


#: The chats of at least 16 tokens. Eager attention takes its softmax in float32 (also in a float64
#: model), and torch's CPU float32 softmax sums a row of fewer than 16 keys in another order than a
#: longer one: a sub-sample that short (the 14-token "short-text") run alone differs from the same
#: sub-sample in a longer pack at ~1e-8, packing or not. SDPA (float64 throughout) takes them all.
LONG_CHATS = tuple(c for c in h.CHATS if c[0] != "short-text")


@pytest.fixture(scope="module")
def long_chats(smol, tmp_path_factory):
    processor, _, _ = smol
    return h.pack_chats(tmp_path_factory.mktemp("long"), processor, seq_len=SEQ_LEN, chats=LONG_CHATS)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_loss_and_gradients_equal_one_by_one(smol, long_chats, attn):
    processor, model, dataset = smol
    chats = h.CHATS
    if attn == "eager":
        dataset, chats = long_chats, LONG_CHATS
    packs = h.pack_sample_ids(dataset)
    assert len(packs) >= 2 and any(len(p) > 1 for p in packs)
    got, want = h.packed_and_reference(model, processor, dataset, attn=attn, seq_len=SEQ_LEN, chats=chats)
    h.assert_same(model, got, want)


@pytest.mark.gpu
def test_flex_attention_gradients_equal_one_by_one(smol):
    """On CUDA with the compiled kernel, which takes head dims of 16 or more: the same tiny model with head_dim 16."""
    from tiny_vlm import smolvlm

    processor, model, dataset = smol
    gpu_model = smolvlm.model(processor, cls=type(model).__name__, head_dim=16)
    assert gpu_model.config.text_config.head_dim == 16
    h.check_flex_gradients(gpu_model, processor, dataset, seq_len=SEQ_LEN)


def test_flex_attention_loss_equals_one_by_one_on_the_main_kernel(smol, monkeypatch):
    """Under FlexAttention (the class supports it) the packed loss is the one-by-one loss: forward on CPU in float64
    (torch has no CPU FlexAttention backward; gradients in the ``gpu`` test below), transformers' compiled wrapper
    swapped for the uncompiled ``flex_attention`` as :func:`vlm_harness.check_flex` does, to its tolerances. The gpu
    flex test's one-by-one chats include queries under 128 tokens whose length × 2 query heads per KV head passes
    128, where torch's decoding kernel finds no tile (pytorch/pytorch#185349); under ``flex_main_kernel`` every
    FlexAttention call carries the option that keeps it on the main kernel."""
    import transformers.integrations.flex_attention as tfa
    from torch.nn.attention.flex_attention import flex_attention

    processor, model, dataset = smol
    seen = []

    def uncompiled(query, key, value, training=False, kernel_options=None, **kwargs):
        seen.append((query.shape[1] // key.shape[1], query.shape[-2], kernel_options))
        with warnings.catch_warnings():  # "called without torch.compile()": on purpose here
            warnings.simplefilter("ignore", UserWarning)
            return flex_attention(query, key, value, kernel_options=kernel_options, **kwargs)

    monkeypatch.setattr(tfa, "compile_friendly_flex_attention", uncompiled)
    h.uncompiled_block_masks(monkeypatch)
    with h.flex_main_kernel() as calls:
        got, want = h.packed_and_reference(model, processor, dataset, attn="flex_attention", seq_len=SEQ_LEN,
                                           backward=False)
    h.assert_same(model, got, want)
    assert len(calls) == len(seen) > 0 and tfa.compile_friendly_flex_attention is uncompiled
    assert all(options == {"FORCE_USE_FLEX_ATTENTION": True} for _, _, options in seen)
    assert any(q_len < 128 < group * q_len for group, q_len, _ in seen), "a query the decoding kernel refuses"


def test_the_gpu_build_takes_the_compiled_kernel(smol):
    """The flex test's build (head_dim 16) has no head dim the compiled kernel refuses; the default (8) has."""
    from tiny_vlm import smolvlm

    processor, model, _ = smol
    assert h.small_head_dims(model) and set(h.small_head_dims(model).values()) == {8}
    assert not h.small_head_dims(smolvlm.model(processor, cls=type(model).__name__, head_dim=16))


def test_padding_free_row_gives_the_same_loss(smol):
    """``padding_free=True`` (one ``[1, N]`` row, the packs' tiles concatenated the same way) = the padded batch."""
    processor, model, dataset = smol
    (padded,) = h.loader_batches(dataset, processor)
    (flat,) = h.loader_batches(dataset, processor, padding_free=True)
    assert flat["input_ids"].shape[0] == 1
    with torch.no_grad():  # the loss summed in float64 (the model's own loss is float32)
        want, got = (h._token_losses(model(**kw).logits, kw["labels"])
                     for kw in (wdspack.model_inputs(b, model) for b in (padded, flat)))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=0)


def test_misplaced_tiles_or_positions_are_not_exact(smol):
    """The check above can fail: tiles one slot off, or positions that do not restart, give another loss."""
    processor, model, dataset = smol
    (batch,) = h.loader_batches(dataset, processor)
    exact_kwargs = wdspack.model_inputs(batch, model)
    rolled = dict(exact_kwargs, pixel_values=exact_kwargs["pixel_values"].roll(1, dims=1))
    B, L = batch["input_ids"].shape
    running = dict(exact_kwargs, position_ids=torch.arange(L).expand(B, L))
    with torch.no_grad():
        exact = model(**exact_kwargs).loss
        for wrong in (rolled, running):
            assert not torch.allclose(model(**wrong).loss, exact, rtol=1e-6)


def test_training_from_the_loader_lowers_the_loss(vlm_family):
    """SmolVLM's class alone: Idefics3's runs the same loader → model_inputs → optimizer path (its packed loss and
    gradients are checked exact above)."""
    processor, model, dataset = vlm_family("smolvlm")
    h.check_training(model.double(), dataset, processor)


def test_tile_slots_depend_on_the_budgets_only(smol):
    processor = smol[0]
    seq = processor.image_seq_len
    assert tile_slots(processor, Budgets(SEQ_LEN, 4)) == min(SEQ_LEN // (seq + 2), 4 * (3 * 3 + 1))
    assert tile_slots(processor, Budgets(SEQ_LEN, 4, max_image_tokens=40)) == 40 // seq
    assert tile_slots(processor, Budgets(4096, 2)) == 2 * (3 * 3 + 1)
    assert tile_slots(processor, Budgets(4096, 0)) == 0


@pytest.mark.gpu
def test_padding_free_flash_attention_2_equals_one_by_one(smol):
    """FlashAttention-2 varlen over the padding-free row ([1, N]), bf16 on CUDA."""
    pytest.importorskip("flash_attn", reason="needs the flash_attn package (transformers' flash_attention_2); the "
                        "same check without it: tests/models/test_varlen_families.py")
    processor, model, dataset = smol
    gpu = copy.deepcopy(model).to("cuda", torch.bfloat16)
    gpu.set_attn_implementation("flash_attention_2")
    want = h.reference(gpu, processor, dataset)
    got = h.packed(gpu, h.loader_batches(dataset, processor, padding_free=True))
    h.assert_same(gpu, got, want, rtol=2e-2, atol=2e-2)
