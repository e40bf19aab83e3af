"""Mistral 3 (Mistral Small 3.1 / 3.2): Pixtral-style image rows, ``pixel_values`` + ``image_sizes``.

The image processor resizes an image so its longest edge fits ``size`` and each side is a multiple
of the processor's cell (``patch_size · spatial_merge_size`` pixels). Each cell is one ``[IMG]``;
rows end in ``[IMG_BREAK]``, the last one in ``[IMG_END]`` instead. The chat template writes one
``[IMG]`` per image; the processor's ``replace_image_token`` expands it from the resized size alone,
so the layout follows from the image header::

    image 40×50 px, longest edge 64, cell 16  ──►  resized to 48×64: 3 rows × 4 cells

    <s> [INST] [IMG][IMG][IMG][IMG][IMG_BREAK]      hi [/INST] ok </s>
               [IMG][IMG][IMG][IMG][IMG_BREAK]
               [IMG][IMG][IMG][IMG][IMG_END]

The vision features fill the ``[IMG]`` tokens only (12 here); breaks and end are text tokens.

Pixels: the processor's ``pixel_values`` ``[k, 3, h, w]`` (zero-padded to the largest image) and
``image_sizes`` ``[k, 2]`` (each image's resized size). A pack pads them to ``max_images`` slots of
the largest resized size (``[M, 3, S, S]``, ``S`` = the longest edge rounded up to a cell), zeros in
empty slots (as :class:`~wdspack.models.family.Rows`: the loader writes the real slots into its
reused batch buffers). The vision tower crops every image to its ``image_sizes`` before anything
else, so the padding never reaches a feature. Text positions are the batch contract's restarting
``position_ids`` (the Mistral text model builds the block-causal mask from them); image patches
attend within their own image (the vision tower's block mask).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError
from ..family import Budgets, Family, ImageSide, Rows, run_image_processor, take_rows

__all__ = ["MISTRAL3", "canvas", "resized_size"]


def _cell(processor: Any) -> int:
    """The pixels one ``[IMG]`` covers per side (what ``PixtralProcessor`` passes as ``patch_size``)."""
    return int(processor.patch_size) * int(processor.spatial_merge_size)


def _size(processor: Any, key: str) -> int | None:
    size = processor.image_processor.size
    value = size.get(key) if isinstance(size, Mapping) else getattr(size, key, None)
    return int(value) if value else None


def _bounds(processor: Any) -> tuple[int, int]:
    """``(height, width)`` an image is resized to fit: ``longest_edge`` square, else ``height × width``."""
    longest = _size(processor, "longest_edge")
    if longest:
        return longest, longest
    height, width = _size(processor, "height"), _size(processor, "width")
    if not (height and width):
        raise ConfigError(f"the image processor's size {processor.image_processor.size} has neither longest_edge "
                          "nor height and width; give it size={'longest_edge': N}")
    return height, width


def resized_size(processor: Any, height: int, width: int) -> tuple[int, int]:
    """The ``(height, width)`` the image processor gives an image of this size (its own resize rule)."""
    ip = processor.image_processor
    if not getattr(ip, "do_resize", True):
        return height, width
    rule = getattr(sys.modules[type(ip).__module__], "get_resize_output_image_size", None)
    if rule is None:
        raise ConfigError(f"{type(ip).__name__} has no get_resize_output_image_size; use a Pixtral image processor")
    # The rule reads only the array's shape: a zero-strided view costs no memory for any image size.
    header = np.broadcast_to(np.zeros((), np.uint8), (height, width, 3))
    from transformers.image_utils import ChannelDimension

    cell = _cell(processor)
    h, w = (int(v) for v in rule(header, size=_bounds(processor), patch_size=(cell, cell),
                                 input_data_format=ChannelDimension.LAST))
    return h, w


def _replacements(processor: Any, sizes: Sequence[tuple[int, int]]) -> list[str]:
    header = {"image_sizes": [resized_size(processor, h, w) for h, w in sizes]}
    return [processor.replace_image_token(header, image_idx=i) for i in range(len(sizes))]


def _pixels(processor: Any, images: Sequence[Any]) -> dict[str, torch.Tensor]:
    # The processor overrides its image processor's patch_size (the vision tower's) with the cell.
    return run_image_processor(processor, images, patch_size=_cell(processor))


def canvas(processor: Any) -> tuple[int, int]:
    """``(H, W)`` of one image slot: the largest resized image (bounds rounded up to whole cells)."""
    ip = processor.image_processor
    if not getattr(ip, "do_resize", True):
        raise ConfigError(f"{type(ip).__name__} has do_resize=False, so images have no largest size to pad "
                          "a pack to; load with do_resize=True")
    cell = _cell(processor)
    h, w = (-(-side // cell) * cell for side in _bounds(processor))
    return h, w


def _pad_pixels(out: Mapping[str, torch.Tensor], processor: Any, budgets: Budgets,
                image_tokens: Sequence[int]) -> dict[str, torch.Tensor | Rows]:
    (H, W), M, k = canvas(processor), budgets.max_images, len(image_tokens)
    pixels = torch.zeros(k, 3, H, W, dtype=torch.float32)  # the real slots; the loader adds the empty ones
    sizes = torch.zeros(M, 2, dtype=torch.int64)
    if k:
        pv, got = out["pixel_values"], out["image_sizes"]
        cell = _cell(processor)
        tokens = [(h // cell) * (w // cell) for h, w in got.tolist()]
        if tokens != list(image_tokens):
            raise ConfigError(f"the image processor gives {tokens} tokens for these images but the pack reserved "
                              f"{list(image_tokens)}; load with the processor (and settings) the dataset was "
                              "packed with")
        if k > M or pv.shape[2] > H or pv.shape[3] > W:
            raise ConfigError(f"{k} images of up to {tuple(pv.shape[2:])} px do not fit {M} slots of {(H, W)} px; "
                              "load with the processor the dataset was packed with")
        pixels[:k, :, :pv.shape[2], :pv.shape[3]] = pv
        sizes[:k] = got
    return {"pixel_values": Rows(pixels, M), "image_sizes": sizes}


def _model_kwargs(batch: Mapping[str, Any], model: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
    if bool(batch["image_mask"].any()):
        kwargs["pixel_values"] = take_rows(batch["pixel_values"], batch["image_mask"])
        kwargs["image_sizes"] = take_rows(batch["image_sizes"], batch["image_mask"])
    return kwargs


MISTRAL3 = Family(
    name="mistral3", processors=("PixtralProcessor",), model_types=("mistral3",),
    image=ImageSide(replacements=_replacements, pixels=_pixels, pad=_pad_pixels), model_kwargs=_model_kwargs,
    notes="[IMG] rows ended by [IMG_BREAK] / [IMG_END]; pixel_values [B·M, 3, S, S] + image_sizes [B·M, 2]",
)

FAMILIES = (MISTRAL3,)
