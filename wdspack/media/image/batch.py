"""The image kind in the loader, with a processor: a pack's images decoded (guarded), through the family's image
side to its pixel keys, padded to the budgets' static shapes; uint8 rows normalised as the processor does.

``batcher`` is the loader's ``wdspack.loader.batch.model.ModelBatcher`` (processor, family, budgets, max_pixels).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..kind import Media
from .pixels import ImageDecodeError, decode_image

__all__ = ["MASK_KEY", "ROWS_KEY", "active", "normalize", "outputs", "pad"]

#: The batch key of the images' pixel rows (made bytes under ``pixel_dtype="uint8"``) and of their real rows' mask.
ROWS_KEY, MASK_KEY = "pixel_values", "patch_mask"


def active(batcher: Any) -> bool:
    """Every batch of a processor whose family takes images has the image keys."""
    return batcher.family.image is not None


def outputs(batcher: Any, items: Media, raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """The processor's outputs for a pack's images (``raw``: the un-normalised pixels' settings)."""
    images: list[Any] = [_decode(k, data, batcher.max_pixels) for k, data in enumerate(items.data)]
    if images and batcher.family.image.pixels_per_sample:
        owners = list(items.sample)
        images = [[im for im, o in zip(images, owners) if o == s] for s in dict.fromkeys(owners)]
    return batcher.family.image.pixels(batcher.processor, images, **raw) if images else {}


def pad(batcher: Any, out: Mapping[str, Any], tokens: tuple[int, ...]) -> Mapping[str, Any]:
    """The outputs padded to the budgets' static shapes (the family's image side)."""
    return batcher.family.image.pad(out, batcher.processor, batcher.budgets, tokens)


def normalize(batcher: Any, pixels: torch.Tensor) -> torch.Tensor:
    """uint8 ``pixel_values`` rows (``pixel_dtype="uint8"``) → float32, rescaled and normalised as the processor
    does (``x · rescale_factor``, then ``(x - mean) / std`` per channel), on their device."""
    ip = batcher.processor.image_processor
    mean = torch.tensor(ip.image_mean, dtype=torch.float32, device=pixels.device)[:, None]
    std = torch.tensor(ip.image_std, dtype=torch.float32, device=pixels.device)[:, None]
    rows = pixels.to(torch.float32).view(pixels.shape[0], mean.shape[0], -1)  # channel-major rows
    return rows.mul_(float(ip.rescale_factor)).sub_(mean).div_(std).view(pixels.shape)


def _decode(k: int, data: bytes, max_pixels: int) -> Any:
    try:
        return decode_image(data, max_pixels=max_pixels)
    except ImageDecodeError as e:
        raise type(e)(f"image {k}: {e}", index=k) from None
