"""Padding-free training on PyTorch's varlen kernel (``wdspack.use_varlen_attention``), every family.

For each family the loader feeds, the tiny real model (``examples/tiny_vlm``) trained on the loader's
batches under the varlen attention gives the loss and gradients of its sub-samples run one by one
through the plain processor → model path under SDPA:

* on CPU (float64) with ``kernel=reference_varlen_attn`` (per-segment SDPA) for three families, both
  batch layouts, one with a sliding window: the plumbing (the segments reach every text layer
  through ``model_inputs``; the Qwen-VL vision towers run the kernel once per layer on their own
  offsets, bidirectionally; Pixtral's keeps SDPA);
* on CUDA (``gpu``) with torch's own kernel in bfloat16, every family (Mistral 3 with and without a
  sliding window), at the FlashAttention-2 tests' tolerances.

Gemma 3 is refused (its image spans attend both ways), naming what to use instead.
"""

from __future__ import annotations

import copy

import pytest
import torch

import wdspack
from tests.support import vlm_harness as h
from wdspack.errors import ConfigError
from wdspack.models.varlen import reference_varlen_attn

FAMILIES = h.FAMILIES


class _Counting:
    """``reference_varlen_attn``, counting its calls by window: causal (text layers) and both ways (vision)."""

    __name__ = "counting_reference"

    def __init__(self):
        self.calls = {"text": 0, "vision": 0}

    def __call__(self, *args, **kwargs):
        self.calls["vision" if kwargs["window_size"] == (-1, -1) else "text"] += 1
        return reference_varlen_attn(*args, **kwargs)


def _check(model, processor, dataset, *, kernel=None, padding_free: bool, rtol: float, atol: float, want=None):
    """The packed loss and gradients under the varlen kernel against the one-by-one SDPA ones (``want``, worked out
    here unless given); ``(the loader's batches, want)``."""
    model.set_attn_implementation("sdpa")
    if want is None:
        want = h.reference(model, processor, dataset)
    wdspack.use_varlen_attention(model, kernel=kernel)
    try:
        assert model.config.get_text_config()._attn_implementation.startswith("wdspack_varlen")
        batches = h.loader_batches(dataset, processor, padding_free=padding_free)
        got = h.packed(model, batches)
    finally:
        model.set_attn_implementation("sdpa")
    h.assert_same(model, got, want, rtol=rtol, atol=atol)
    return batches, want


@pytest.fixture(scope="module")
def cpu_references() -> dict:
    """The one-by-one float64 loss and gradients per family, worked out once for both layouts (each test's fresh
    tiny model has the same weights, seed 0)."""
    return {}


@pytest.mark.parametrize("padding_free", [False, True], ids=["rows", "padding_free"])
@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl", "mistral3_sliding"])
def test_packed_equals_one_by_one_on_cpu(name, padding_free, vlm_family, cpu_references):
    processor, model, dataset = vlm_family(name)
    model = model.double()
    kernel = _Counting()
    batches, cpu_references[name] = _check(model, processor, dataset, kernel=kernel, padding_free=padding_free,
                                           rtol=1e-9, atol=1e-11, want=cpu_references.get(name))
    layers = model.config.get_text_config().num_hidden_layers
    assert kernel.calls["text"] == layers * len(batches), "every text layer of every forward"
    with_images = sum(int(b["pixel_values"].numel() > 0) for b in batches if "pixel_values" in b)
    depth = 0 if name.startswith("mistral3") else model.config.vision_config.depth  # Pixtral's tower keeps SDPA
    assert with_images and kernel.calls["vision"] == depth * with_images, "one call per vision layer per forward"
    assert model.config.vision_config._attn_implementation == "sdpa", "set_attn_implementation('sdpa') undoes both"
    if name == "mistral3_sliding":
        lengths = [len(ids) for ids, *_ in h.dataset_sub_samples(dataset).values()]
        assert max(lengths) > 8, "a sub-sample is longer than the window"


def test_vision_false_leaves_the_tower_alone(tiny_processors):
    """``vision=False``: the text stack runs the kernel, the Qwen-VL vision tower keeps SDPA; by default both."""
    from tiny_vlm import qwen2_5_vl

    processor = tiny_processors.get("qwen2_5_vl")  # the session's; the model is this test's own
    model = qwen2_5_vl.model(processor)
    wdspack.use_varlen_attention(model, kernel=reference_varlen_attn, vision=False)
    assert model.config.get_text_config()._attn_implementation.startswith("wdspack_varlen")
    assert model.config.vision_config._attn_implementation == "sdpa"
    wdspack.use_varlen_attention(model, kernel=reference_varlen_attn)
    assert model.config.vision_config._attn_implementation.startswith("wdspack_flash_varlen_vision")
    assert model.model.visual.config is model.config.vision_config, "the tower reads the config that was set"


def test_gemma3_is_refused(tiny_processors):
    from tiny_vlm import gemma3

    processor = tiny_processors.get("gemma3")  # the session's
    with pytest.raises(ConfigError, match=r"gemma3.*'sdpa' or 'flex_attention'"):
        wdspack.use_varlen_attention(gemma3.model(processor), kernel=reference_varlen_attn)


@pytest.mark.gpu
@pytest.mark.parametrize("padding_free", [True, False], ids=["padding_free", "rows"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_packed_equals_one_by_one_on_cuda(name, padding_free, vlm_family):
    """torch's varlen kernel, bfloat16, loss and gradients (the FlashAttention-2 tests' tolerances)."""
    pytest.importorskip("torch.nn.attention.varlen", reason=f"torch {torch.__version__} has no varlen_attn")
    processor, model, dataset = vlm_family(name)
    gpu = copy.deepcopy(model).to("cuda", torch.bfloat16)
    _check(gpu, processor, dataset, padding_free=padding_free, rtol=2e-2, atol=2e-2)
