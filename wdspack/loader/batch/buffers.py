"""The loader's staged path: pixels written once into the batch, and where a batch's memory comes from.

    dataset: pack ─► staged_example: budgets checked; images decoded + resized to uint8 (or a processor's parts)
    collate: text  ─► collate_staged: written in one pass [B, L] (text_batch) ─► by value (Shipment)
             uint8 ─► normalised straight into pixel_values [B·M, 3, S, S] ─► a recycled shared-memory buffer
                      (PixelBuffers; pixel_dtype="uint8": copied as they are, normalize_pixels on the device)

Holds :func:`staged_example`, :func:`collate_staged`, :class:`PixelBuffers`, :class:`Shipment`,
:func:`normalize_pixels`.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import torch

from ...errors import ConfigError
from ...format.pack import Pack
from .collate import SOURCE_KEY, check_budgets, collate_packs, naming_sample, pack_to_example
from .text import text_batch

if TYPE_CHECKING:
    from ...media.image.pixels import ImageTransform

__all__ = ["MODEL_KEY", "PIXELS_KEY", "PIXEL_DTYPES", "DecodedImages", "PixelBuffers", "Shipment", "TakePixels",
           "collate_staged", "decode_pack_images", "fresh_pixels", "new_shared", "normalize_pixels", "staged_example",
           "write_pixel_slots"]

#: Private example key (:func:`staged_example`): the pack's images decoded to uint8, not yet normalised.
PIXELS_KEY = "__wdspack_pixels__"
#: Private example key (:func:`staged_example`): ``(batcher, pixels, rows)``, the processor's parts of the pack.
MODEL_KEY = "__wdspack_model__"
#: Private example key (:func:`staged_example`): ``(pack, seq_len, max_images, pad_token_id)``, the pack's text
#: left for :func:`collate_staged` to write straight into the batch (:func:`~.text.text_batch`).
TEXT_KEY = "__wdspack_text__"
_STAGED_KEYS = (PIXELS_KEY, MODEL_KEY, TEXT_KEY)
#: ``make_loader(pixel_dtype=...)``: what a batch's ``pixel_values`` travel as.
PIXEL_DTYPES = {"float32": torch.float32, "uint8": torch.uint8}
_NUMPY_DTYPES = {torch.float32: np.float32, torch.uint8: np.uint8}
#: ``take(shape, packs, key) -> (tensor, dirty)``: memory for a batch's pixels under ``key`` (``pixel_values``,
#: or another row key such as ``pixel_values_videos``) and, per pack, how many leading slots (or rows) may
#: hold non-zero bytes from earlier use (``None``: unknown, zero them all).
TakePixels = Callable[[tuple[int, ...], int, str], tuple[torch.Tensor, "list[int] | None"]]


@dataclass(frozen=True, slots=True)
class DecodedImages:
    """A pack's images decoded and resized (``[S, S, 3]`` uint8 each), not yet normalised.

    The loader's dataset leaves these in each example (:func:`decode_pack_images`) and its collate
    function normalises them straight into their slots of the batch tensor
    (:func:`write_pixel_slots`): one float write per real pixel, no per-pack float copy.
    """

    pixels: tuple[np.ndarray, ...]
    transform: ImageTransform

    def __len__(self) -> int:
        return len(self.pixels)


def decode_pack_images(pack: Pack, transform: ImageTransform) -> DecodedImages:
    """First half of the built-in image path for one pack; errors name the sub-sample.

    Raises:
        ImageDecodeError: an image cannot be decoded; the message names the owner sample's id.
    """
    with naming_sample(pack):
        return DecodedImages(tuple(transform.decode_resized(pack.images)), transform)


def write_pixel_slots(images: Sequence[DecodedImages], out: torch.Tensor, *, slots: int,
                      dirty: Sequence[int] | None = None) -> list[int]:
    """Second half: pack ``b``'s images into ``out[b·slots : b·slots + k_b]``; return the ``k_b``.

    Args:
        images: one entry per pack (``B``), each with at most ``slots`` images.
        out: ``[B·slots, 3, S, S]``, the batch's ``pixel_values``: float32 (normalised here) or
            uint8 (the decoded bytes, CHW, for :func:`wdspack.normalize_pixels`).
        slots: ``M``, the image slots per pack.
        dirty: per pack, how many leading slots may hold non-zero bytes from earlier use;
            those past ``k_b`` are zeroed. ``None``: all of them (memory of unknown content);
            all zeros for a new shared-memory segment, which is zero already.
    """
    counts = [len(x) for x in images]
    if any(k > slots for k in counts):
        raise ConfigError(f"pixel_values: a pack has {max(counts)} images > {slots} image slots")
    for b, (x, k) in enumerate(zip(images, counts)):
        write = x.transform.copy_into if out.dtype == torch.uint8 else x.transform.normalize_into
        write(x.pixels, out[b * slots: b * slots + k])
        stale = slots if dirty is None else dirty[b]
        if stale > k:
            out[b * slots + k: b * slots + stale] = 0
    return counts


def staged_example(pack: Pack, *, seq_len: int, max_images: int, pad_token_id: int, image_transform: Any = None,
                   batcher: Any = None, defer_text: bool = False) -> dict[str, Any]:
    """:func:`~.collate.pack_to_example` with the pixels left for :func:`collate_staged` to place in the batch.

    With a processor's ``batcher`` (:class:`~wdspack.loader.batch.model.ModelBatcher`) the pack's parts
    go under :data:`MODEL_KEY`; with the built-in transform the images are only decoded and resized
    (:data:`PIXELS_KEY`, uint8); any other transform runs here as in :func:`~.collate.pack_to_example`. Decode
    errors and packs over a budget surface here, where the loader can still act on them: an image or video that
    does not decode names its sub-sample and its index (the loader drops that sub-sample and makes the pack
    again, :func:`~.collate.failed_sample`); anything else skips the pack.

    ``defer_text`` (the loader's own dataset, whose examples only its collate sees): with the built-in
    transform or none, the example holds the pack itself (:data:`TEXT_KEY`) instead of its text tensors, and
    :func:`collate_staged` writes the whole batch's text in one pass (:func:`~.text.text_batch`).
    """
    from ...media.image.pixels import ImageTransform

    if batcher is not None:
        parts: dict[str, Any] = pack_to_example(pack, seq_len=seq_len, max_images=max_images, pad_token_id=pad_token_id)
        with naming_sample(pack):
            pixels, rows = batcher.pack_parts(pack, parts["input_ids"])
        parts[MODEL_KEY] = (batcher, pixels, rows)
        return parts
    staged = isinstance(image_transform, ImageTransform) and image_transform.writes_into
    example: dict[str, Any]  # text tensors, or the pack itself; and the decoded images
    if defer_text and (staged or image_transform is None):
        check_budgets(pack, seq_len=seq_len, max_images=max_images)  # refused here, where the pack can be skipped
        example = {TEXT_KEY: (pack, seq_len, max_images, pad_token_id)}
    else:
        example = dict(pack_to_example(pack, seq_len=seq_len, max_images=max_images, pad_token_id=pad_token_id,
                                       image_transform=None if staged else image_transform, pad_images=False))
    if staged:
        example[PIXELS_KEY] = decode_pack_images(pack, image_transform)
    return example


def collate_staged(examples: Sequence[dict[str, Any]], *, attention_mask: str | None = None,
                   padding_free: bool = False, max_segments: int | None = None, take: TakePixels | None = None,
                   share_memory: bool | None = None, pixel_dtype: str = "float32"
                   ) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """:func:`staged_example` outputs → one batch: :func:`~.collate.collate_packs`, then the pixels written once.

    A processor's parts are joined by its batcher (the family's keys and last rewrite); decoded
    images are normalised straight into their slots of ``pixel_values`` ``[B·M, 3, S, S]``
    (``pixel_dtype="uint8"``: copied there un-normalised). Both write into the memory ``take`` gives
    (default :func:`fresh_pixels`), float32 or ``pixel_dtype``. The examples are not changed.

    Returns:
        The batch, and per key taken (``pixel_values``, ``pixel_values_videos``) the slots (rows) written
        per pack into ``take``'s tensor.
    """
    if not examples:
        raise ConfigError("a batch needs at least one example")
    first, packs = examples[0], len(examples)
    images = [ex[PIXELS_KEY] for ex in examples] if PIXELS_KEY in first else None
    parts = [ex[MODEL_KEY] for ex in examples] if MODEL_KEY in first else None
    if pixel_dtype not in PIXEL_DTYPES:
        raise ConfigError(f"pixel_dtype={pixel_dtype!r} is not one of {sorted(PIXEL_DTYPES)}")
    take = take or (lambda shape, n, key: fresh_pixels(shape, n, dtype=PIXEL_DTYPES[pixel_dtype]))
    options: dict[str, Any] = {"attention_mask": attention_mask, "padding_free": padding_free,
                               "max_segments": max_segments}
    shared = torch.utils.data.get_worker_info() is not None if share_memory is None else share_memory
    if TEXT_KEY in first and not shared and all(k in _ONE_PASS_KEYS for ex in examples for k in ex):
        _, seq_len, max_images, pad_token_id = first[TEXT_KEY]
        batch: dict[str, Any] = text_batch([ex[TEXT_KEY][0] for ex in examples],
                                           [int(ex.get(SOURCE_KEY, 0)) for ex in examples], seq_len=seq_len,
                                           max_images=max_images, pad_token_id=pad_token_id, **options)
    else:  # the reference path: each pack's tensors, then stacked (straight into shared memory if asked)
        plain = [_text_tensors(ex) for ex in examples]
        batch = dict(collate_packs(plain, **options, share_memory=share_memory))
    counts: dict[str, list[int]] = {}
    if parts is not None:
        batch, counts = parts[0][0].collate(batch, [(pixels, rows) for _, pixels, rows in parts],
                                            padding_free=padding_free,
                                            take=lambda shape, key: take(shape, packs, key))
    if images is not None:
        M, size = batch["image_mask"].shape[0] // packs, images[0].transform.size
        out, dirty = take((packs * M, 3, size, size), packs, "pixel_values")
        counts = {"pixel_values": write_pixel_slots(images, out, slots=M, dirty=dirty)}
        batch = _insert_after(batch, "image_token_counts", "pixel_values", out)
    return batch, counts


#: The keys a staged example may hold for :func:`collate_staged` to take its one-pass text path.
_ONE_PASS_KEYS = frozenset({TEXT_KEY, PIXELS_KEY, SOURCE_KEY})


def _text_tensors(example: Mapping[str, Any]) -> dict[str, Any]:
    """A staged example's own keys, with its pack's text as :func:`~.collate.pack_to_example`'s tensors."""
    out = {k: v for k, v in example.items() if k not in _STAGED_KEYS}
    if TEXT_KEY in example:
        pack, seq_len, max_images, pad_token_id = example[TEXT_KEY]
        out = {**pack_to_example(pack, seq_len=seq_len, max_images=max_images, pad_token_id=pad_token_id,
                                 pad_images=False), **out}
    return out


def normalize_pixels(batch: Mapping[str, Any], source: Any, *, device: torch.device | str | None = None,
                     dtype: torch.dtype = torch.float32, non_blocking: bool = False) -> dict[str, Any]:
    """A batch of ``make_loader(..., pixel_dtype="uint8")`` with its ``pixel_values`` normalised, on ``device``.

    Copy the uint8 bytes first (a quarter of float32's), then normalise where they landed: the same
    float32 operations, with the same mean, std and 1/255 as the loader's float32 path (they come
    from its image transform), and zeros in the empty slots (``image_mask`` False), so the result
    equals what ``pixel_dtype="float32"`` gives, to float rounding; then cast to ``dtype``. Every
    other key is returned as it is (not moved). A batch whose ``pixel_values`` are float already
    (the float32 path) only moves and casts, so one training loop serves both settings.

    Args:
        batch: a batch from the loader (not changed).
        source: the :class:`~wdspack.loader.PackedLoader` (or :class:`~wdspack.loader.PackedDataset`,
            or the :class:`~wdspack.media.image.pixels.ImageTransform`) that made the batch: its image
            transform, or in processor mode its processor, gives the mean, std and rescale factor.
        device: where to normalise (``"cuda"``); default where ``pixel_values`` are.
        dtype: the floating dtype of the result (``torch.bfloat16`` for a bf16 vision tower).
        non_blocking: passed to the copy (pinned batches copy asynchronously).

    Example:
        >>> loader = make_loader(path, batch_size=8, image_transform=make_image_transform(),
        ...                      pixel_dtype="uint8")  # doctest: +SKIP
        >>> for batch in loader:  # doctest: +SKIP
        ...     batch = wdspack.normalize_pixels(batch, loader, device="cuda", dtype=torch.bfloat16)
    """
    from ...media.image.pixels import ImageTransform

    if "pixel_values" not in batch:
        raise ConfigError(f"the batch has no pixel_values (keys {sorted(batch)}); normalize_pixels is for a batch "
                          "with images")
    pixels = batch["pixel_values"]
    if device is not None:
        pixels = pixels.to(device, non_blocking=non_blocking)
    if not dtype.is_floating_point:
        raise ConfigError(f"dtype={dtype} must be a floating dtype (torch.float32, torch.bfloat16, ...)")
    if pixels.is_floating_point():
        return {**batch, "pixel_values": pixels.to(dtype)}
    batcher = getattr(getattr(source, "dataset", source), "model_batcher", None)
    if batcher is not None:  # a processor's flattened patches: [B·R, 3·…] rows, patch_mask says which are real
        if pixels.dtype != torch.uint8 or "patch_mask" not in batch:
            raise ConfigError(f"pixel_values are {pixels.dtype} {tuple(pixels.shape)} without a patch_mask; pass the "
                              "loader that made the batch")
        done = dict(batch)
        for key, mask_key, normalize in batcher.pixel_rows:  # each kind's rows, as its processor normalises them
            if key not in batch:
                continue
            rows = batch[key].to(device, non_blocking=non_blocking) if device is not None else batch[key]
            if rows.is_floating_point():
                done[key] = rows.to(dtype)
                continue
            out = normalize(rows)
            real = batch[mask_key].to(out.device, non_blocking=non_blocking).bool()
            done[key] = out.masked_fill_(~real[:, None], 0.0).to(dtype)
        return done
    transform = source
    for attr in ("dataset", "image_transform"):  # a loader → its dataset → its transform
        if not isinstance(transform, ImageTransform):
            transform = getattr(transform, attr, transform)
    if not isinstance(transform, ImageTransform):
        raise ConfigError(f"normalize_pixels needs the loader, dataset or image transform that made the batch (its "
                          f"mean and std), got {type(source).__name__}")
    if pixels.dtype != torch.uint8 or tuple(pixels.shape[1:]) != (3, transform.size, transform.size):
        raise ConfigError(f"pixel_values are {pixels.dtype} {tuple(pixels.shape)}; this transform makes uint8 "
                          f"[B·M, 3, {transform.size}, {transform.size}]: pass the loader that made the batch")
    out = transform.normalize(pixels)
    mask = batch["image_mask"].to(out.device, non_blocking=non_blocking)
    out.masked_fill_(~mask.bool()[:, None, None, None], 0.0)  # empty slots: zeros, as the float32 path has them
    return {**batch, "pixel_values": out.to(dtype)}


def fresh_pixels(shape: tuple[int, ...], packs: int, *, dtype: torch.dtype = torch.float32
                 ) -> tuple[torch.Tensor, list[int] | None]:
    """New memory (a :data:`TakePixels`), zero from the start, so only the real images are written: in a
    DataLoader worker a new shared-memory segment, which the OS zero-fills and the DataLoader passes on
    without copying; elsewhere numpy's zeros (``calloc``: a batch's megabytes come as fresh zero pages,
    not written twice; empty slots used to cost a float32 batch as much as decoding its images)."""
    if torch.utils.data.get_worker_info() is not None:
        return new_shared(shape, dtype=dtype), [0] * packs
    if dtype in _NUMPY_DTYPES:
        return torch.from_numpy(np.zeros(shape, dtype=_NUMPY_DTYPES[dtype])), [0] * packs
    return torch.zeros(shape, dtype=dtype), [0] * packs


def new_shared(shape: tuple[int, ...], *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A new tensor in shared memory (float32 by default); its bytes are zero (a new file, which the OS zero-fills)."""
    storage = torch.UntypedStorage._new_shared(dtype.itemsize * math.prod(shape))
    # torch's stubs make `stride` required; set_ takes it as optional (contiguous)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)  # type: ignore[call-overload]


def _insert_after(batch: dict[str, Any], anchor: str, key: str, value: Any) -> dict[str, Any]:
    """``batch`` with ``key`` right after ``anchor`` (where :func:`~.collate.collate_packs` puts ``pixel_values``)."""
    out = {}
    for k, v in batch.items():
        out[k] = v
        if k == anchor:
            out[key] = value
    out.setdefault(key, value)
    return out


# ---------------------------------------------------------------------------------------------
# Recycled pixel buffers, and batches that travel by value


class PixelBuffers:
    """A worker's pixel tensors in shared memory, reused once the main process has dropped them:
    ``pixel_values``, and ``pixel_values_videos`` where the batch has video rows (a buffer per key).

    A new shared-memory tensor costs a zeroed page and a page fault per 4 KiB (38 MB a batch at
    ``B = 4``, ``M = 16``, ``S = 224``), which on a busy or virtualised host is about a third of a
    worker's time. So each worker keeps up to ``size`` of them per key (``keys`` keys). A buffer leaves *leased* with a
    batch (:class:`Shipment`); unpickled in the main process, the shipment registers a finalizer
    on the tensor's storage there, and when no tensor in that process views the memory any more
    the finalizer writes the lease's number into ``released[worker, index]``. The worker reuses a
    buffer only when that number is the one it was leased under (numbers never repeat: pid and a
    counter), so a late or stale release can only make it allocate a new buffer, never reuse one
    still in use. Slots that held images last time and are empty now are zeroed again.

    A buffer crosses to the main process once: the first shipment passes its file descriptor (a
    socket connection with an authentication handshake per batch, then a mapping made and unmade),
    and the main process keeps that mapping while the loader lives (:data:`_MAPPED`). Later
    shipments of the same buffer carry only where the batch lies in it, and the main process views
    it through a new storage object of its own, whose end is the release.

    Memory handed on from the main process to *another* process is not tracked: for that, pass
    ``reuse_buffers=False`` to :func:`~wdspack.loader.make_loader`.
    """

    def __init__(self, workers: int, size: int, *, keys: int = 2) -> None:
        self.size = size
        self.released = torch.zeros((workers, size * keys), dtype=torch.int64).share_memory_()
        self.table = f"{os.getpid()}-{os.urandom(8).hex()}"
        _RELEASE_TABLES[self.table] = self.released
        _MAPPED[self.table] = {}
        weakref.finalize(self.released, _MAPPED.pop, self.table, None).atexit = False  # the mappings go with it
        self._held: list[tuple[torch.Tensor, Lease | None, list[int]]] = []  # tensor, last lease, filled slots
        self._keys: list[str] = []  # the batch key each held buffer serves
        self._sent: set[int] = set()  # buffers the main process has mapped (shipped once through shared memory)
        self._leases = 0

    def __getstate__(self) -> dict[str, Any]:  # a worker starts with no buffers of its own
        return {**self.__dict__, "_held": [], "_keys": [], "_sent": set(), "_leases": 0}

    def take(self, shape: tuple[int, ...], *, worker: int, packs: int, dtype: torch.dtype = torch.float32,
             key: str = "pixel_values") -> tuple[torch.Tensor, list[int], Lease | None]:
        """A ``shape`` tensor of ``dtype`` in shared memory for the batch's ``key``, per pack the leading slots
        that may be non-zero, its lease.

        No lease (None) when ``size`` buffers for ``key`` are still out: the tensor is then a new one, not kept.
        """
        for i, (tensor, lease, filled) in enumerate(self._held):
            if (lease is not None and lease.key == key and tuple(tensor.shape) == shape and tensor.dtype == dtype
                    and len(filled) == packs and int(self.released[worker, i]) == lease.number):
                self._held[i] = (tensor, None, filled)  # taken: not handed out again before it ships
                return tensor, filled, self._lease(worker, i, key, mapped=i in self._sent)
        tensor = new_shared(shape, dtype=dtype)
        if sum(k == key for k in self._keys) >= self.size or len(self._held) >= self.released.shape[1]:
            return tensor, [0] * packs, None
        self._held.append((tensor, None, []))
        self._keys.append(key)
        return tensor, [0] * packs, self._lease(worker, len(self._held) - 1, key)

    def ship(self, lease: Lease, counts: list[int], pixels: torch.Tensor | None = None) -> Lease:
        """Record that ``lease``'s buffer leaves with images in the first ``counts[b]`` slots of pack ``b``,
        as (or in) ``pixels``; the lease to send with it (:class:`Lease`'s ``mapped`` / ``map``).

        The place alone goes only where the main process mapped this very buffer before; the buffer goes
        to be mapped only when ``pixels`` lie in it and travel through shared memory (not by value).
        """
        i, tensor = lease.index, self._held[lease.index][0]
        through = (pixels is not None and not _by_value(pixels)[0]
                   and pixels.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr())
        if lease.mapped and not through:  # by value, or not in the buffer: as any other batch
            lease = replace(lease, mapped=False)
        elif through and not lease.mapped:
            lease = replace(lease, map=True)
            self._sent.add(i)
        self._held[i] = (tensor, lease, list(counts))
        return lease

    def _lease(self, worker: int, index: int, key: str, *, mapped: bool = False) -> Lease:
        self._leases += 1
        return Lease(self.table, worker, index, (os.getpid() << 31) + self._leases, mapped, key=key)


@dataclass(frozen=True, slots=True)
class Lease:
    table: str  # which PixelBuffers (its entry in _RELEASE_TABLES)
    worker: int
    index: int
    number: int  # the worker's pid << 31, plus a counter
    mapped: bool = False  # the main process has this buffer mapped already: send only where the batch lies
    map: bool = False  # the pixels travel in this buffer through shared memory: the main process maps it
    key: str = "pixel_values"  # the batch key whose tensor lies in the buffer


@dataclass(frozen=True, slots=True)
class _Place:
    """Where a batch's pixels lie in a buffer the main process has mapped (instead of the buffer)."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype


#: Per main process: the ``released`` tensor of each live :class:`PixelBuffers`, by its ``table`` name.
_RELEASE_TABLES: weakref.WeakValueDictionary[str, torch.Tensor] = weakref.WeakValueDictionary()
#: Tensors up to this size travel by value through the worker's pipe: cheaper than a shared-memory
#: segment each (a new file, a file descriptor passed over a socket, a mapping made and unmade).
_BY_VALUE_BYTES = 1 << 20
#: Per main process and live :class:`PixelBuffers` (by ``table``): the worker buffers mapped here,
#: ``(worker, index) -> (the worker's pid, the buffer's whole memory as a flat uint8 tensor)``.
_MAPPED: dict[str, dict[tuple[int, int], tuple[int, torch.Tensor]]] = {}


class Shipment:
    """A worker's batch on its way to the main process, where unpickling turns it back into the dict.

    Small tensors go by value (as NumPy arrays), large ones as shared memory; each leased key's tensor
    (``pixel_values``, ``pixel_values_videos``) gets its release finalizer on arrival.
    """

    __slots__ = ("batch", "leases")

    def __init__(self, batch: dict[str, Any], leases: Lease | Sequence[Lease] | None) -> None:
        self.batch = batch
        self.leases = () if leases is None else (leases,) if isinstance(leases, Lease) else tuple(leases)

    def __reduce__(self):
        items = [(k, *_by_value(v)) for k, v in self.batch.items()]
        mapped = {lease.key for lease in self.leases if lease.mapped}
        if mapped:  # the main process has these buffers: say where the tensors lie, not what they hold
            items = [(k, False, _Place(tuple(v.shape), v.stride(), int(v.storage_offset()), v.dtype))
                     if k in mapped and not by_value else (k, by_value, v) for k, by_value, v in items]
        return (_receive, (items, self.leases))


def _by_value(value: Any) -> tuple[bool, Any]:
    """``(True, array)`` for a small tensor NumPy can hold (pickled by value), else ``(False, value)``."""
    if isinstance(value, torch.Tensor) and value.nbytes <= _BY_VALUE_BYTES:
        try:
            return True, value.numpy()
        except TypeError:  # bfloat16 and other dtypes NumPy lacks: as a tensor
            pass
    return False, value


def _receive(items: list[tuple[str, bool, Any]], leases: tuple[Lease, ...]) -> dict[str, Any]:
    """Unpickling a :class:`Shipment`: the batch, with the release of its pixel buffers arranged."""
    batch = {k: torch.from_numpy(v) if by_value else v for k, by_value, v in items}
    for lease in leases:
        released = _RELEASE_TABLES.get(lease.table)
        if released is not None:  # elsewhere than in the loader's process nothing is released
            if lease.mapped or lease.map:
                batch[lease.key] = _mapped_view(batch[lease.key], lease)
            storage = batch[lease.key].untyped_storage()
            weakref.finalize(storage, _release, released, lease.worker, lease.index, lease.number).atexit = False
        elif lease.mapped:
            _unmapped(lease)
    return batch


def _mapped_view(pixels: torch.Tensor | _Place, lease: Lease) -> torch.Tensor:
    """The batch's pixels as a view of the mapped buffer through a storage object of its own (its end is
    the release; the mapping stays); the buffer is mapped on its first arrival through shared memory."""
    table, pid = _MAPPED.get(lease.table), lease.number >> 31
    if isinstance(pixels, _Place):
        entry = table.get((lease.worker, lease.index)) if table is not None else None
        if entry is None or entry[0] != pid:
            _unmapped(lease)
        base, place = entry[1], pixels
    elif table is not None:  # lease.map: the buffer itself, through shared memory
        for key in [k for k, (owner, _) in table.items() if k[0] == lease.worker and owner != pid]:
            del table[key]  # a restarted worker's buffers are new ones
        base = torch.empty(0, dtype=torch.uint8).set_(pixels.untyped_storage())
        table[(lease.worker, lease.index)] = (pid, base)
        place = _Place(tuple(pixels.shape), pixels.stride(), int(pixels.storage_offset()), pixels.dtype)
    else:  # the loader is gone: nothing to map into
        return pixels
    return torch.from_numpy(base.numpy()).view(place.dtype).as_strided(place.size, place.stride, place.offset)


def _unmapped(lease: Lease) -> NoReturn:
    raise ConfigError(f"a batch of worker {lease.worker} of a wdspack loader names a pixel buffer this process has "
                      "not mapped: such batches can only be received by the loader's own process; pass "
                      "reuse_buffers=False to make_loader for batches handed on to other processes")


def _release(released: torch.Tensor, worker: int, index: int, number: int) -> None:
    released[worker, index] = number
