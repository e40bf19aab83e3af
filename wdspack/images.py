"""Image decoding for the loader, in its workers: guarded, fast, fixed shapes.

The built-in path decodes with Pillow (JPEG draft mode decodes at a reduced scale when the
target is much smaller), converts to RGB, resizes to a fixed square and normalises. Any
``transformers`` image processor can be used instead; its output keeps the processor's layout,
padded to fixed shapes. Every decode checks the header's pixel count against a limit *before*
decoding, so a decompression bomb costs nothing.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from .errors import FormatError

__all__ = ["ImageDecodeError", "ImageTransform", "decode_image", "make_image_transform"]

_DEFAULT_MAX_PIXELS = 64_000_000


class ImageDecodeError(FormatError):
    """Image bytes in a pack that cannot (or must not) be decoded."""


def decode_image(data: bytes, *, max_pixels: int = _DEFAULT_MAX_PIXELS, draft: int | None = None) -> Image.Image:
    """Decode encoded bytes to an RGB image, refusing more than ``max_pixels`` before decoding.

    Example:
        >>> buf = io.BytesIO(); Image.new("RGB", (8, 4)).save(buf, format="PNG")
        >>> decode_image(buf.getvalue()).size
        (8, 4)
    """
    try:
        img = Image.open(io.BytesIO(data))
        w, h = img.size
        if w * h > max_pixels:
            raise ImageDecodeError(f"image of {w}x{h} = {w * h} pixels exceeds the limit {max_pixels}; "
                                   "raise max_pixels if it is genuine")
        if draft and img.format == "JPEG":
            img.draft("RGB", (draft, draft))
        return img.convert("RGB")
    except ImageDecodeError:
        raise
    except Exception as e:  # PIL raises many unrelated types on bad bytes
        raise ImageDecodeError(f"cannot decode image: {type(e).__name__}") from None


class ImageTransform:
    """Picklable ``bytes list → tensors`` for :func:`wdspack.collate.pack_to_example`.

    Built-in path: ``pixel_values`` ``[M, 3, size, size]`` float32, empty slots zero. Processor
    path: the processor's outputs; fixed-size ones padded to ``M`` slots, flattened-patch ones
    (Qwen2-VL: ``pixel_values`` ``[patches, D]`` + ``image_grid_thw``) padded to ``max_patches``
    rows (default: what the token budget implies, ``seq_len × merge_size²``) with a
    ``patch_mask`` and zero grids for empty slots.
    """

    def __init__(self, *, size: int = 224, mean: Sequence[float] = (0.5, 0.5, 0.5),
                 std: Sequence[float] = (0.5, 0.5, 0.5), processor: Any = None,
                 max_pixels: int = _DEFAULT_MAX_PIXELS, max_patches: int | None = None) -> None:
        self.size, self.processor, self.max_pixels, self.max_patches = size, processor, max_pixels, max_patches
        self.mean = np.asarray(mean, np.float32).reshape(3, 1, 1)
        self.std = np.asarray(std, np.float32).reshape(3, 1, 1)

    def __call__(self, images: Sequence[bytes], *, max_images: int, seq_len: int) -> dict[str, torch.Tensor]:
        if self.processor is not None:
            return self._with_processor(images, max_images, seq_len)
        out = np.zeros((max_images, 3, self.size, self.size), np.float32)
        for k, data in enumerate(images):
            img = decode_image(data, max_pixels=self.max_pixels, draft=self.size)
            img = img.resize((self.size, self.size), Image.Resampling.BICUBIC)
            arr = np.asarray(img, np.float32).transpose(2, 0, 1) / 255.0
            out[k] = (arr - self.mean) / self.std
        return {"pixel_values": torch.from_numpy(out)}

    def _with_processor(self, images, max_images: int, seq_len: int) -> dict[str, torch.Tensor]:
        pil = [decode_image(d, max_pixels=self.max_pixels) for d in images]
        if "image_grid_thw" in getattr(self.processor, "model_input_names", ()):
            merge = getattr(self.processor, "merge_size", 1) or 1
            rows = self.max_patches or seq_len * merge * merge
            grid = torch.zeros(max_images, 3, dtype=torch.long)
            if pil:
                got = self.processor(images=pil, return_tensors="pt")
                pv, thw = got["pixel_values"], got["image_grid_thw"]
                if pv.shape[0] > rows:
                    raise ImageDecodeError(f"{pv.shape[0]} patches > max_patches {rows}")
                grid[: len(pil)] = thw
            else:
                dim = 3 * getattr(self.processor, "temporal_patch_size", 2) * self.processor.patch_size ** 2
                pv = torch.zeros(0, dim)
            padded = torch.zeros(rows, pv.shape[1], dtype=torch.float32)
            padded[: pv.shape[0]] = pv
            mask = torch.zeros(rows, dtype=torch.bool)
            mask[: pv.shape[0]] = True
            return {"pixel_values": padded, "image_grid_thw": grid, "patch_mask": mask}
        got = self.processor(images=pil or [Image.new("RGB", (self.size, self.size))], return_tensors="pt")
        pv = got["pixel_values"]
        out = torch.zeros((max_images, *pv.shape[1:]), dtype=torch.float32)
        if pil:
            out[: len(pil)] = pv
        return {"pixel_values": out}


def make_image_transform(*, size: int = 224, mean: Sequence[float] = (0.5, 0.5, 0.5),
                         std: Sequence[float] = (0.5, 0.5, 0.5), processor: Any = None,
                         max_pixels: int = _DEFAULT_MAX_PIXELS, max_patches: int | None = None) -> ImageTransform:
    """An :class:`ImageTransform` (built-in Pillow path, or wrapping a transformers processor).

    Example:
        >>> t = make_image_transform(size=32)
        >>> t([], max_images=2, seq_len=16)["pixel_values"].shape
        torch.Size([2, 3, 32, 32])
    """
    return ImageTransform(size=size, mean=mean, std=std, processor=processor, max_pixels=max_pixels,
                          max_patches=max_patches)
