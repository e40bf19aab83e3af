"""The video kind in the loader, with a processor: a pack's videos decoded at their planned frames only, through
the family's video side to its pixel keys, padded to the budgets' static shapes; uint8 rows normalised as the
video processor does.

``batcher`` is the loader's ``wdspack.loader.batch.model.ModelBatcher`` (processor, family, budgets, max_pixels).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..kind import Media

__all__ = ["MASK_KEY", "ROWS_KEY", "active", "normalize", "outputs", "pad"]

#: The batch key of the videos' pixel rows (made bytes under ``pixel_dtype="uint8"``) and of their real rows' mask.
ROWS_KEY, MASK_KEY = "pixel_values_videos", "video_patch_mask"


def active(batcher: Any) -> bool:
    """A batch has the video keys where the dataset's budgets have video tokens (and the family a video side)."""
    return bool(batcher.budgets.max_video_tokens) and batcher.family.video is not None


def outputs(batcher: Any, items: Media, raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """The videos at their planned frames (a video that does not decode raises ``VideoDecodeError`` with its
    ``index``; the loader names its sample)."""
    return batcher.family.video.pixels(batcher.processor, items.data, items.plans, max_pixels=batcher.max_pixels)


def pad(batcher: Any, out: Mapping[str, Any], tokens: tuple[int, ...]) -> Mapping[str, Any]:
    """The outputs padded to the budgets' static shapes (the family's video side)."""
    return batcher.family.video.pad(out, batcher.processor, batcher.budgets, tokens)


def normalize(batcher: Any, pixels: torch.Tensor) -> torch.Tensor:
    """uint8 ``pixel_values_videos`` rows → float32 as the video processor normalises them (its fused
    ``(x - mean/rescale) / (std/rescale)``, bit for bit on the CPU), on their device."""
    from .pixels import normalize_video_rows

    ip = batcher.processor.image_processor
    return normalize_video_rows(pixels, mean=ip.image_mean, std=ip.image_std, rescale_factor=float(ip.rescale_factor))
