"""Qwen2-VL and Qwen2.5-VL: flattened patches, ``image_grid_thw`` and 3-D (mRoPE) positions.

One image of ``t × h × w`` patches becomes ``t·h·w / merge²`` ``<|image_pad|>`` tokens between
``<|vision_start|>`` and ``<|vision_end|>`` (the chat template writes those two and one pad; the
processor repeats the pad). The count comes from the image size alone (``smart_resize``).

Positions, per sub-sample of a pack (what the model's ``get_rope_index`` gives that sub-sample alone)::

    tokens       <s>  hi  <vs> [P] [P] [P] [P] <ve>  ok      (one image, grid 1×4×4, merge 2 → 2×2)
    row 0 (text)  0   1    2    3   4   5   6   7     8      restarts at 0 per sub-sample
    temporal      0   1    2    3   3   3   3   5     6
    height        0   1    2    3   3   4   4   5     6
    width         0   1    2    3   4   3   4   5     6

The loader's ``position_ids`` is ``[4, B, L]``: row 0 is the batch contract's restarting positions
(the model finds the sub-sample boundaries in it and builds the block-causal mask), rows 1-3 the
3-D positions. ``mm_token_type_ids`` is 1 on image tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError
from ..family import Budgets, Family, Rows, run_image_processor, take_rows
from ..vision_meta import precomputed_vision_kwargs

__all__ = ["QWEN2_5_VL", "QWEN2_VL", "mrope_positions"]


def _replacements(processor: Any, sizes: Sequence[tuple[int, int]]) -> list[str]:
    ip = processor.image_processor
    patches = [ip.get_number_of_image_patches(h, w, {}) for h, w in sizes]
    grids = {"image_grid_thw": torch.tensor([[1, p, 1] for p in patches], dtype=torch.int64)}
    return [processor.replace_image_token(grids, image_idx=i) for i in range(len(sizes))]


def _pixels(processor: Any, images: Sequence[Any], **kwargs: Any) -> dict[str, Any]:
    """The image processor image by image: the same bytes as one call over the list (each image's
    patches are independent), and about a tenth faster than the batched call. ``pixel_values`` stays
    a tuple of the images' patch blocks (the batch writes each once, no concatenated copy).
    ``kwargs`` go to the image processor (``do_rescale=False, do_normalize=False`` for uint8 pixels)."""
    outs = [run_image_processor(processor, [image], **kwargs) for image in images]
    return {"pixel_values": tuple(o["pixel_values"] for o in outs),
            "image_grid_thw": torch.cat([o["image_grid_thw"] for o in outs])}


def patch_rows(processor: Any, budgets: Budgets) -> int:
    """Patch rows per pack: what the pack's image tokens can fill (``merge²`` patches each; the
    manifest's largest pack, else ``seq_len``), capped by ``max_images`` of the processor's largest image."""
    ip = processor.image_processor
    merge, patch = int(ip.merge_size), int(ip.patch_size)
    by_tokens = budgets.image_tokens * merge * merge
    largest = int(ip.size["longest_edge"]) // (patch * patch)
    return min(by_tokens, budgets.max_images * largest) if budgets.max_images else 0


def _pad_pixels(out: Mapping[str, torch.Tensor], processor: Any, budgets: Budgets,
                image_tokens: Sequence[int]) -> dict[str, torch.Tensor | Rows]:
    rows, M = patch_rows(processor, budgets), budgets.max_images
    k = len(image_tokens)
    merge = int(processor.image_processor.merge_size)
    pv = out.get("pixel_values")
    grid = out.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.int64))
    if k:
        tokens = (grid.prod(dim=1) // (merge * merge)).tolist()
        if tokens != list(image_tokens):
            raise ConfigError(f"the image processor gives {tokens} tokens for these images but the pack reserved "
                              f"{list(image_tokens)}; load with the processor (and settings) the dataset was "
                              "packed with")
    blocks = tuple(pv or ())  # one patch block per image (``_pixels``)
    n = sum(int(b.shape[0]) for b in blocks) if k else 0
    if n > rows:
        raise ConfigError(f"{n} image patches > the {rows} patch rows a pack has room for; the dataset's manifest "
                          "and the processor disagree: load with the processor it was packed with")
    real = tuple(b.to(torch.float32) for b in blocks) if n else torch.zeros(0, _patch_width(processor))
    grids = torch.zeros(M, 3, dtype=torch.int64)
    grids[:k] = grid[:k]
    return {"pixel_values": Rows(real, rows), "patch_mask": torch.arange(rows) < n, "image_grid_thw": grids}


def _patch_width(processor: Any) -> int:
    ip = processor.image_processor
    return 3 * int(ip.temporal_patch_size) * int(ip.patch_size) ** 2


def mrope_positions(input_ids: torch.Tensor, seq_lens: Sequence[int], grids: torch.Tensor, *, image_token_id: int,
                    merge_size: int) -> torch.Tensor:
    """``[3, L]`` 3-D positions of one pack, each sub-sample on its own (images only, no video).

    Text tokens count on from the largest position so far; an image's tokens sit on a
    ``t × h/merge × w/merge`` grid starting at the next position, and text after it continues at
    ``start + max(h, w) / merge``. Padding after the sub-samples counts ``0, 1, 2, …``.
    """
    L = input_ids.shape[0]
    lens = np.asarray(seq_lens, dtype=np.int64)
    real = int(lens.sum())
    where = np.flatnonzero(input_ids[:real].numpy() == image_token_id)  # image tokens, in image order
    g = grids.numpy().astype(np.int64).reshape(-1, 3)
    t, h, w = g[:, 0], g[:, 1] // merge_size, g[:, 2] // merge_size
    sizes = t * h * w
    if int(sizes.sum()) != len(where):
        raise ConfigError(f"the pack has {len(where)} image tokens but its grids give {int(sizes.sum())}; load with "
                          "the processor the dataset was packed with")
    # Each text token advances the position by 1, each image by max(h, w) (counted at its first token);
    # a token's base is what the units before it in its own sub-sample advanced.
    offsets = np.cumsum(sizes) - sizes  # each image's first token among the image tokens
    firsts = where[offsets]
    width = np.ones(real, np.int64)
    width[where] = 0
    width[firsts] = np.maximum(h, w)
    before = np.cumsum(width) - width
    base = before - np.repeat(before[np.cumsum(lens) - lens], lens)
    base[where] = base[np.repeat(firsts, sizes)]  # an image's tokens all start where the image does
    out = np.empty((3, L), np.int64)
    out[:, :real] = base
    image = np.repeat(np.arange(len(sizes)), sizes)  # each image token's image, and its index inside it
    j = np.arange(len(where)) - np.repeat(offsets, sizes)
    out[0, where] += j // (h * w)[image]
    out[1, where] += (j // w[image]) % h[image]
    out[2, where] += j % w[image]
    out[:, real:] = np.arange(L - real)
    return torch.from_numpy(out)


def _token_rows(input_ids: torch.Tensor, seq_lens: Sequence[int], pixels: Mapping[str, torch.Tensor],
                processor: Any) -> dict[str, torch.Tensor]:
    image_id = int(processor.image_token_id)
    grids = pixels.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.int64))
    rope = mrope_positions(input_ids, seq_lens, grids, image_token_id=image_id,
                           merge_size=int(processor.image_processor.merge_size))
    return {"mrope_position_ids": rope, "mm_token_type_ids": (input_ids == image_id).to(torch.int64)}


def _finish(batch: dict[str, Any]) -> dict[str, Any]:
    rope = batch.pop("mrope_position_ids")
    batch["position_ids"] = torch.cat([batch["position_ids"][None], rope])
    return batch


def _model_kwargs(batch: Mapping[str, Any], model: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"],
                              "mm_token_type_ids": batch["mm_token_type_ids"]}
    if bool(batch["image_mask"].any()):
        kwargs["pixel_values"] = take_rows(batch["pixel_values"], batch["patch_mask"])
        kwargs["image_grid_thw"] = grid = take_rows(batch["image_grid_thw"], batch["image_mask"])
        if grid.device.type == "cpu":  # the tower's bookkeeping, worked out here instead of on the GPU
            kwargs.update(precomputed_vision_kwargs(model, grid))
    return kwargs


def _family(name: str, processor: str, model_type: str) -> Family:
    return Family(
        name=name, processors=(processor,), model_types=(model_type,), replacements=_replacements,
        pixels=_pixels, pad_pixels=_pad_pixels, token_rows=_token_rows, uint8_pixels=True,
        token_keys=("mrope_position_ids", "mm_token_type_ids"), finish_batch=_finish, model_kwargs=_model_kwargs,
        notes="flattened patches + image_grid_thw; position_ids [4, B, L] (text row + 3-D mRoPE rows); "
              "mm_token_type_ids",
    )


def _image_processor() -> Any:
    from transformers import Qwen2VLImageProcessor

    return Qwen2VLImageProcessor()


QWEN2_VL = replace(_family("qwen2_vl", "Qwen2VLProcessor", "qwen2_vl"), aliases=("qwen2vl", "qwen2-vl"),
                   image_processor=_image_processor)
QWEN2_5_VL = _family("qwen2_5_vl", "Qwen2_5_VLProcessor", "qwen2_5_vl")

FAMILIES = (QWEN2_VL, QWEN2_5_VL)
