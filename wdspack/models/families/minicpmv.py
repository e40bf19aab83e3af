"""MiniCPM-V 4.6: an overview image plus a grid of slices, each its own NaViT patch sequence.

The image processor picks the slice grid from the image size (``get_sliced_grid``: about
``area / scale_resolution²`` slices, at most ``max_slice_nums``, the grid closest to the aspect
ratio), resizes the overview to about ``scale_resolution²`` and the slices to a refined size, in
``patch_size · 4`` steps. A slice of ``h × w`` patches is ``h·w / 16`` tokens (``"16x"``; ``"4x"``: / 4).
The processor writes, per image (``I`` the image token; ``use_image_id``: its index in the sample)::

    <image_id>0</image_id><image>I I I I</image><slice>I</slice><slice>I</slice>\\n
                                                 <slice>I</slice><slice>I</slice>     grid 2 × 2
    an image within scale_resolution²:  <image_id>0</image_id><image>I I I I</image>

The count comes from the image size alone, through the image processor's own methods. The loader
keeps each pack's patches as rows (``pixel_values`` ``[R, 3, P, P]``, ``patch_mask``) and each
slice's ``target_sizes`` ``[S, 2]`` (``slice_mask``); ``model_kwargs`` hands the model the real ones
in NaViT form (``[1, 3, P, n·P]``). The tower attends within each slice, so packing changes nothing
there. The text model (Qwen3.5) takes the restarting ``position_ids``; its linear-attention (Gated
DeltaNet) layers carry a recurrent state along the row, so wdspack runs them per sub-sample
(:func:`segment_linear_attention`; transformers' CPU path ignores ``cu_seqlens``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError
from ..family import Budgets, Family, ImageSide, Rows, take_rows
from ..varlen import CU_SEQLENS_KEY, MAX_SEQLEN_KEY

__all__ = ["MINICPMV4_6", "image_layout", "segment_linear_attention"]


def _divisor(part: Any) -> int:
    """Patches per token: 16 (``"16x"``: the tower's window merger and the MLP merger, 2 × 2 each), or 4."""
    return 4 if getattr(part, "downsample_mode", "16x") == "4x" else 16


def image_layout(part: Any, height: int, width: int) -> tuple[list[int], list[list[int]]]:
    """``(grid, target_sizes)`` the image (or video) processor ``part`` gives an image of ``height × width``:
    the slice grid ``[rows, cols]`` (``[0, 0]``: the overview alone) and ``[h, w]`` in patches of the overview
    then each slice, by the processor's own methods (its ``_preprocess`` step by step).

    Example:
        >>> image_layout(MiniCPMV4_6ImageProcessorPil(scale_resolution=56), 56, 96)  # doctest: +SKIP
        ([1, 2], [[4, 4], [4, 4], [4, 4]])
    """
    if not getattr(part, "do_resize", True):
        raise ConfigError(f"{type(part).__name__} with do_resize false keeps each image's own size; wdspack plans "
                          "MiniCPM-V's resized slices only: set do_resize true")
    res, patch, mode = int(part.scale_resolution), int(part.patch_size), str(part.downsample_mode)
    grid = part.get_sliced_grid((height, width), int(part.max_slice_nums), res) if part.slice_mode else None
    src_h, src_w = part.find_best_resize((height, width), res, patch, downsample_mode=mode,
                                         allow_upscale=grid is None)
    sizes = [[src_h // patch, src_w // patch]]
    if grid is None:
        return [0, 0], sizes
    ref_h, ref_w = part.get_refine_size((height, width), grid, res, patch, downsample_mode=mode, allow_upscale=True)
    rows, cols = int(grid[0]), int(grid[1])
    sizes += [[ref_h // rows // patch, ref_w // cols // patch]] * (rows * cols)
    return [rows, cols], sizes


def _id_prefix(processor: Any, index: int) -> str:
    use = getattr(processor, "default_use_image_id", None)
    if use is None:
        use = getattr(processor.image_processor, "use_image_id", True)
    return f"{processor.image_id_start_token}{index}{processor.image_id_end_token}" if use else ""


def _replacements(processor: Any, sizes: Sequence[tuple[int, int]]) -> list[str]:
    ip, out = processor.image_processor, []
    for k, (height, width) in enumerate(sizes):
        grid, targets = image_layout(ip, int(height), int(width))
        inputs = {"grids": [grid], "num_patches_per_image": [len(targets)],
                  "target_sizes": np.array(targets, dtype=np.int32)}
        text = processor.replace_image_token(inputs, image_idx=0, image_token_divisor=_divisor(ip))
        out.append(_id_prefix(processor, k) + text)
    return out


def _patch_rows(pixel_values: torch.Tensor, patch: int) -> torch.Tensor:
    """NaViT ``[1, 3, P, n·P]`` as ``n`` patch rows ``[n, 3, P, P]`` (row-major patches of each slice in turn)."""
    channels = pixel_values.shape[1]
    return pixel_values[0].reshape(channels, patch, -1, patch).permute(2, 0, 1, 3)


def _navit(rows: torch.Tensor) -> torch.Tensor:
    """Patch rows ``[n, 3, P, P]`` back in the NaViT form the tower takes, ``[1, 3, P, n·P]``."""
    n, channels, patch, _ = rows.shape
    return rows.permute(1, 2, 0, 3).reshape(1, channels, patch, n * patch)


def _pixels(processor: Any, images: Sequence[Any]) -> dict[str, torch.Tensor]:
    ip = processor.image_processor
    out = ip(list(images), return_tensors="pt")
    return {"pixel_values": _patch_rows(out["pixel_values"], int(ip.patch_size)).to(torch.float32),
            "target_sizes": out["target_sizes"].to(torch.int64),
            "image_slices": torch.tensor(out["num_patches_per_image"], dtype=torch.int64)}


def _slots(part: Any, budgets: Budgets, tokens: int) -> tuple[int, int]:
    """``(patch rows, slice slots)`` per pack: ``divisor`` patches a token; a slice holds a token at least,
    and an image ``max_slice_nums + 1`` slices at most."""
    if not budgets.max_images:
        return 0, 0
    slices = min(tokens, budgets.max_images * (int(part.max_slice_nums) + 1))
    return tokens * _divisor(part), slices


def _pad(out: Mapping[str, torch.Tensor], processor: Any, budgets: Budgets,
         image_tokens: Sequence[int]) -> dict[str, torch.Tensor | Rows]:
    ip = processor.image_processor
    rows, slots = _slots(ip, budgets, budgets.image_tokens)
    patch, k = int(ip.patch_size), len(image_tokens)
    pv = out["pixel_values"] if k else torch.zeros(0, 3, patch, patch)
    sizes = out["target_sizes"] if k else torch.zeros(0, 2, dtype=torch.int64)
    if k:
        per_slice = (sizes.prod(dim=1) // _divisor(ip)).tolist()
        bounds = [0, *itertools.accumulate(out["image_slices"].tolist())]
        tokens = [sum(per_slice[a:b]) for a, b in itertools.pairwise(bounds)]
        if tokens != list(image_tokens):
            raise ConfigError(f"the image processor gives {tokens} image tokens for these images but the pack "
                              f"reserved {list(image_tokens)}; load with the processor (and settings) the dataset "
                              "was packed with")
    n, s = int(pv.shape[0]), int(sizes.shape[0])
    if n > rows or s > slots:
        raise ConfigError(f"{n} image patches in {s} slices > the {rows} patch rows and {slots} slice slots a pack "
                          "has room for; the dataset's manifest and the processor disagree: load with the processor "
                          "it was packed with")
    return {"pixel_values": Rows(pv, rows), "patch_mask": torch.arange(rows) < n,
            "target_sizes": Rows(sizes, slots), "slice_mask": torch.arange(slots) < s}


# ---- the text model's linear-attention layers, per sub-sample -----------------------------------


def _per_segment(forward: Any) -> Any:
    def run(hidden_states: torch.Tensor, cache: Any = None, attention_mask: Any = None, **kwargs: Any) -> Any:
        cu = kwargs.pop(CU_SEQLENS_KEY, None)
        kwargs.pop(MAX_SEQLEN_KEY, None)
        if cu is None or cache is not None:
            return forward(hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
        B, L, D = hidden_states.shape
        flat = hidden_states.reshape(1, B * L, D)
        # each segment alone, from a zero state: what the layer computes for that sub-sample run by itself
        outs = [forward(flat[:, a:b], cache=None, attention_mask=None, **kwargs)
                for a, b in itertools.pairwise(cu.tolist()) if b > a]
        return torch.cat(outs, dim=1).view(B, L, -1)

    run.wdspack_segmented = True  # type: ignore[attr-defined]
    return run


def segment_linear_attention(model: Any) -> int:
    """Make ``model``'s linear-attention layers (Qwen3.5's Gated DeltaNet: a causal convolution and a recurrent
    state along the sequence) start afresh at every sub-sample of a packed batch: given the batch's segment
    offsets (``wdspack_cu_seqlens``, which :func:`wdspack.model_inputs` passes), each layer runs once per segment.
    Without them (a plain forward, generation with a cache) the layers run as transformers wrote them. Idempotent;
    returns the layers changed.

    Example:
        >>> segment_linear_attention(model)  # doctest: +SKIP
        2
    """
    changed = 0
    for module in model.modules():
        if getattr(module, "layer_type", None) != "linear_attention":
            continue
        if not getattr(module.forward, "wdspack_segmented", False):
            module.forward = _per_segment(module.forward)
            changed += 1
    return changed


def _model_kwargs(batch: Mapping[str, Any], model: Any) -> dict[str, Any]:
    segment_linear_attention(model)
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"],
                              CU_SEQLENS_KEY: batch["cu_seqlens"]}
    if bool(batch["image_mask"].any()):
        kwargs["pixel_values"] = _navit(take_rows(batch["pixel_values"], batch["patch_mask"]))
        kwargs["target_sizes"] = take_rows(batch["target_sizes"], batch["slice_mask"]).to(torch.int32)
    return kwargs


def _image_token(processor: Any) -> str:
    return str(processor.image_token)


MINICPMV4_6 = Family(
    name="minicpmv4_6", processors=("MiniCPMV4_6Processor",), model_types=("minicpmv4_6",),
    image=ImageSide(replacements=_replacements, pixels=_pixels, pad=_pad, feature_token=_image_token,
                    placeholder=_image_token),
    model_kwargs=_model_kwargs,
    notes="an overview + a grid of slices (<image>…</image><slice>…</slice> rows, <image_id>k</image_id>); NaViT "
          "patch rows + target_sizes [B·S, 2]; linear-attention layers run per sub-sample",
)

FAMILIES = (MINICPMV4_6,)
