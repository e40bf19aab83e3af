"""The DataLoader's ``collate_fn`` (:class:`LoaderCollate`) and the batch options it is built with.

    examples (one per pack) ─► collate_staged ─► batch  (+ the packs' positions, META_KEY)
                                   │ pixels written once: a worker's recycled buffer, else new memory
                                   ▼
                           Shipment (in a worker with buffers) ─► unpickled as the batch in the main process
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import get_worker_info

from ...errors import ConfigError
from .buffers import PIXEL_DTYPES, Lease, PixelBuffers, Shipment, collate_staged, fresh_pixels
from .collate import META_KEY

if TYPE_CHECKING:
    from ..dataset import PackedDataset

__all__ = ["LoaderCollate", "check_pixel_dtype", "resolve_max_segments"]

logger = logging.getLogger(__name__)


def check_pixel_dtype(value: Any, dataset: PackedDataset) -> str:
    """``pixel_dtype`` as its name; uint8 only where the pixels can travel as the resized bytes: the built-in
    transform's two halves, or a processor whose family says so (``ImageSide.uint8_pixels``). Sets the dataset's
    batcher to it."""
    from ...media.image.pixels import ImageTransform

    name = str(value).removeprefix("torch.")
    if name not in PIXEL_DTYPES:
        raise ConfigError(f"pixel_dtype={value!r} is not one of {sorted(PIXEL_DTYPES)}")
    batcher = dataset.model_batcher
    if name == "uint8" and batcher is not None and not (batcher.family.image and batcher.family.image.uint8_pixels):
        raise ConfigError(f"pixel_dtype='uint8' is not available with {type(batcher.processor).__name__} (the "
                          f"{batcher.family.name} family): its image processor lays out float pixels itself (tiles, "
                          "padding) that wdspack cannot finish on the device; pass pixel_dtype='float32' (uint8 "
                          "works with the Qwen-VL families' flattened patches and with the built-in image transform)")
    if batcher is not None:
        batcher.pixel_dtype = name
    transform = dataset.image_transform
    if name == "uint8" and transform is not None and not (isinstance(transform, ImageTransform)
                                                          and transform.writes_into):
        raise ConfigError(f"pixel_dtype='uint8' needs the built-in image transform (make_image_transform(size=...)), "
                          f"not {transform!r}, whose output the loader cannot leave un-normalised; pass "
                          "pixel_dtype='float32'")
    return name


def resolve_max_segments(value: int | str | None, dataset: PackedDataset, batch_size: int) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    if value != "auto":
        raise ConfigError(f"max_segments={value!r}: give 'auto', None or a positive int")
    m = dataset.manifest
    most = m.totals.get("max_samples_per_pack") if m is not None else None
    if most is None:
        logger.info("the manifest does not give max_samples_per_pack, so cu_seqlens keeps its natural length; "
                    "pass max_segments= for a static shape")
        return None
    return batch_size * (int(most) + 1)


class LoaderCollate:
    """The loader's ``collate_fn``: :func:`~.buffers.collate_staged` and each batch's position.

    The pixels of the packs (decoded uint8 images, or a processor's parts) are written once, straight
    into the batch's ``pixel_values``: in a worker into one of its recycled buffers
    (:class:`PixelBuffers`), otherwise into new memory. A worker with buffers returns a
    :class:`Shipment`, which unpickles in the main process as the batch.
    """

    def __init__(self, *, attention_mask: str | None, padding_free: bool, max_segments: int | None,
                 buffers: PixelBuffers | None, pixel_dtype: str = "float32") -> None:
        self.options: dict[str, Any] = {"attention_mask": attention_mask, "padding_free": padding_free,
                                        "max_segments": max_segments, "pixel_dtype": pixel_dtype}
        self.buffers = buffers

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any] | Shipment:
        info = get_worker_info()
        buffers = self.buffers if info is not None else None  # recycled in a worker only
        recycle = buffers is not None
        meta = torch.stack([ex.pop(META_KEY) for ex in examples])
        leases: dict[str, Lease] = {}

        def take(shape: tuple[int, ...], packs: int, key: str) -> tuple[torch.Tensor, list[int] | None]:
            dtype = PIXEL_DTYPES[self.options["pixel_dtype"]]
            if buffers is None or info is None:
                return fresh_pixels(shape, packs, dtype=dtype)
            out, dirty, lease = buffers.take(shape, worker=info.id, packs=packs, dtype=dtype, key=key)
            if lease is not None:
                leases[key] = lease
            return out, dirty

        batch, counts = collate_staged(examples, **self.options, take=take,
                                       share_memory=info is not None and not recycle)
        if buffers is not None:  # a lease is taken from the buffers, then written
            leases = {key: buffers.ship(lease, counts[key], batch.get(key)) for key, lease in leases.items()}
        batch[META_KEY] = meta
        return Shipment(batch, tuple(leases.values())) if recycle else batch


