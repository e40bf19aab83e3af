"""A Qwen-VL tower's grid bookkeeping worked out on the host (``wdspack.models.vision_meta``).

``model_inputs`` hands the tower its position ids, offsets, window order and position-table weights
ready-made (``image_*`` kwargs, from the loader's CPU grid). Checked here on the real tiny models of
Qwen2-VL, Qwen2.5-VL and Qwen3-VL in float64: the logits and every gradient are bit-identical to the
tower computing them itself, and the reads of tensor values during a step (each a wait for the GPU on
a GPU) drop from several per image to the two that transformers makes outside the tower.
"""

from __future__ import annotations

import collections
import traceback
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

import wdspack
from tests.support import vlm_harness as h
from wdspack.errors import ConfigError
from wdspack.models import compat, vision_meta

#: name -> (tiny_vlm module, processor options, model options, helpers its tower calls)
QWEN = {
    "qwen2_vl": ("qwen2_5_vl", {"cls": "Qwen2VLProcessor"}, {"cls": "Qwen2VLForConditionalGeneration"},
                 {"get_vision_position_ids", "get_vision_attention_seqlens"}),
    "qwen2_5_vl": ("qwen2_5_vl", {"cls": "Qwen2_5_VLProcessor"}, {"cls": "Qwen2_5_VLForConditionalGeneration"},
                   {"get_vision_position_ids", "get_vision_attention_seqlens", "get_vision_window_index",
                    "get_max_seqlen"}),
    "qwen3_vl": ("qwen3_vl", {}, {}, {"get_vision_position_ids", "get_vision_attention_seqlens",
                                      "get_vision_interpolation_indices_and_weights"}),
}
#: The Tensor methods that read a value back to the host (on a GPU: wait for it).
READS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "unique",
                   "unique_consecutive", "masked_select", "argwhere", "equal"})


class Reads(TorchFunctionMode):
    """Counts value reads (and boolean-mask indexing, or ``repeat_interleave`` without ``output_size``, which
    read too) by the transformers file and line that made them."""

    def __init__(self):
        super().__init__()
        self.where = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        index = args[1] if name in ("__getitem__", "__setitem__") and len(args) > 1 else None
        masked = any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                     for i in (index if isinstance(index, tuple) else (index,)))
        if name in READS or masked or (name == "repeat_interleave" and not kwargs.get("output_size")):
            frames = [f for f in traceback.extract_stack()[:-1]
                      if "/torch/" not in f.filename and f.filename != __file__]
            if frames and "/transformers/" in frames[-1].filename:  # not wdspack's CPU reference kernel
                self.where[f"{Path(frames[-1].filename).name}:{frames[-1].name}"] += 1
        return func(*args, **kwargs)


@pytest.fixture(scope="module", params=sorted(QWEN))
def qwen(request, tmp_path_factory):
    import importlib

    module, proc_opts, model_opts, helpers = QWEN[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    tiny = importlib.import_module(f"tiny_vlm.{module}")
    processor = tiny.processor(folder / "tok", **proc_opts)
    model = tiny.model(processor, **model_opts).double()
    dataset = h.pack_chats(folder, processor, seq_len=80 if module == "qwen3_vl" else 96)
    return model, h.loader_batches(dataset, processor), helpers


def _run(model, kwargs):
    model.zero_grad()
    with Reads() as reads:
        out = model(**kwargs)
        out.loss.backward()
    return out.logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None], reads.where


def test_the_tower_reads_the_host_values_and_gives_the_same_numbers(qwen):
    model, batches, helpers = qwen
    assert compat.in_tested_range(), (f"transformers {compat._installed()} is outside {compat.TESTED_TRANSFORMERS}: "
                                      "check these tests on it, then raise TESTED_TRANSFORMERS")
    assert vision_meta.vision_helpers(model.model.visual) == helpers
    (batch,) = batches
    kwargs = wdspack.model_inputs(batch, model)
    extra = {k for k in kwargs if k.startswith("image_") and k != "image_grid_thw"}
    assert {"image_position_ids", "image_cu_seqlens", "image_max_seqlen"} <= extra
    assert ("image_window_index" in extra) == ("get_vision_window_index" in helpers)
    assert ("image_interp_weights" in extra) == ("get_vision_interpolation_indices_and_weights" in helpers)
    images = int(kwargs["image_grid_thw"].shape[0])
    assert images >= 2

    got_logits, got_grads, got_reads = _run(model, kwargs)
    want_logits, want_grads, want_reads = _run(model, {k: v for k, v in kwargs.items() if k not in extra})
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=0)
    assert len(got_grads) == len(want_grads) > 0
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    # the tower's own bookkeeping reads (Qwen2.5-VL's window order: per image); handed in, it reads none
    assert sum(n for w, n in want_reads.items() if w.startswith("vision_utils.py")) >= (
        images if "get_vision_window_index" in helpers else 1)
    assert not any(w.startswith(("vision_utils.py", "generic.py:get_max_seqlen")) for w in got_reads), got_reads
    assert sum(got_reads.values()) < sum(want_reads.values())


def test_under_the_varlen_kernel_the_same_loss_after_two_reads(qwen):
    """With ``use_varlen_attention`` (the tower on offsets, where ``max_seqlen`` is read): the same loss, and of
    transformers' reads only the two outside the tower are left (the image features' split sizes, the
    placeholder count check), and Qwen3-VL's DeepStack's, which indexes the text stack's hidden states by a
    boolean mask in each layer it feeds."""
    from wdspack.models.varlen import reference_varlen_attn

    model, batches, _ = qwen
    (batch,) = batches
    wdspack.use_varlen_attention(model, kernel=reference_varlen_attn)
    try:
        kwargs = wdspack.model_inputs(batch, model)
        plain = {k: v for k, v in kwargs.items() if not (k.startswith("image_") and k != "image_grid_thw")}
        with torch.no_grad(), Reads() as got_reads:
            got = model(**kwargs).loss
        with torch.no_grad(), Reads() as want_reads:
            want = model(**plain).loss
    finally:
        model.set_attn_implementation("sdpa")
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    left = {w: n for w, n in got_reads.where.items() if not w.endswith(":_deepstack_process")}
    assert sum(left.values()) == 2, got_reads.where
    assert sum(want_reads.where.values()) > 2, want_reads.where


def test_left_to_the_tower_where_it_is_not_known_to_be_exact(qwen, monkeypatch):
    model, batches, _ = qwen
    grid = batches[0]["image_grid_thw"][batches[0]["image_mask"]]
    assert vision_meta.precomputed_vision_kwargs(model, grid)
    monkeypatch.setattr(compat, "TESTED_TRANSFORMERS", ("0.1.0", "0.2.0"))  # an untested release
    assert vision_meta.precomputed_vision_kwargs(model, grid) == {}
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="image_grid_thw is on meta"):
        vision_meta.precomputed_vision_kwargs(model, grid.to("meta"))


def test_towers_that_call_other_helpers_or_none_are_left_alone():
    from transformers import CLIPVisionConfig, CLIPVisionModel

    class Future(torch.nn.Module):
        def forward(self, x, grid_thw, **kwargs):  # a helper precomputed_vision_kwargs does not fill in
            get_vision_position_ids(grid_thw, 2, kwargs=kwargs)  # noqa: F821
            return get_vision_merged_shape(grid_thw, kwargs=kwargs)  # noqa: F821

    assert vision_meta.vision_helpers(Future()) is None
    clip = CLIPVisionModel(CLIPVisionConfig(hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                            num_attention_heads=2, image_size=8, patch_size=4))
    assert vision_meta.vision_helpers(clip) is None
    assert vision_meta.precomputed_vision_kwargs(clip, torch.tensor([[1, 2, 2]])) == {}


def test_joined_per_image_parts_equal_one_call_over_the_whole_grid(qwen):
    """Each image's part comes from transformers' helper on that image alone (kept per size); joined, they
    equal the helper over the whole grid: windows that pad, several frames, sizes repeated and new."""
    from transformers import vision_utils as vu

    model, _, helpers = qwen
    tower = model.model.visual
    grid = torch.tensor([[1, 4, 6], [1, 8, 8], [1, 2, 14], [2, 4, 4], [1, 16, 10], [1, 4, 6], [1, 2, 2]])
    got = vision_meta.precomputed_vision_kwargs(model, grid)
    m = tower.spatial_merge_size
    cu = vu.get_vision_cu_seqlens(grid)
    want = {"image_position_ids": vu.get_vision_position_ids(grid, m), "image_cu_seqlens": cu,
            "image_max_seqlen": int((cu[1:] - cu[:-1]).max())}
    if "get_vision_window_index" in helpers:
        index, windows = vu.get_vision_window_index(grid, spatial_merge_size=m, window_size=tower.window_size,
                                                    patch_size=tower.patch_size)
        assert len(windows) > len(grid) + 1, "several windows per image"
        want.update(image_window_index=index, image_cu_window_seqlens=windows,
                    image_max_window_seqlen=int((windows[1:] - windows[:-1]).max()))
    if "get_vision_interpolation_indices_and_weights" in helpers:
        want["image_interp_indices"], want["image_interp_weights"] = vu.get_vision_interpolation_indices_and_weights(
            grid, num_grid_per_side=tower.num_grid_per_side, mode=tower.interpolation_mode,
            align_corners=tower.interpolation_align_corners, spatial_merge_size=tower.config.spatial_merge_size)
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype, key
            torch.testing.assert_close(got[key], value, rtol=0, atol=0, msg=key)
        else:
            assert got[key] == value, key
