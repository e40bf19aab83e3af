"""Packs → fixed-shape tensors: the batch contract of DESIGN.md §4 (every key: docs/architecture.md).

One pack, ``seq_len`` 10, two sub-samples; sub-sample 0 owns one image of 2 tokens::

    input_ids     <s> [IMG][IMG]  hi   A  </s> <s>   B  </s> <pad>
    loss_mask      1    0    0    0    1    1    0    1    1    -     (as stored in the pack)
    labels       -100 -100 -100 -100   A  </s> -100  B  </s> -100    (unshifted; -100 opens a sub-sample)
    position_ids   0    1    2    3    4    5    0    1    2    0     (padding: a segment of its own)
    seq_idx        0    0    0    0    0    0    1    1    1    2

:func:`pack_to_example` makes one pack's tensors and :func:`collate_packs` stacks ``B`` of them: text
``[B, L]``, image slots ``[B·M, ...]`` pack-major, ``cu_seqlens`` / ``max_seqlen`` over the flattened
``[B·L]``; ``padding_free=True`` lays the text out as one ``[1, N]`` row of real tokens. The loader's
staged path to the same batch: :mod:`.buffers`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...errors import ConfigError, FormatError
from ...format.pack import Pack
from ...media import KINDS, MediaKind

if TYPE_CHECKING:
    from ...media.image.pixels import PatchLayout

__all__ = ["IGNORE_INDEX", "META_KEY", "SOURCE_KEY", "collate_packs", "failed_sample", "naming_sample",
           "pack_to_example"]

#: The label of a token that is not a target (PyTorch's and transformers' ``ignore_index``).
IGNORE_INDEX = -100

_TEXT_KEYS = ("input_ids", "labels", "position_ids", "seq_idx")
_COUNT_KEYS = ("num_tokens", "num_samples")
#: Each pack's source in a mixture (:mod:`wdspack.loader.mixture.read`); an example without it is from source 0
SOURCE_KEY = "source_idx"
#: Under the loader, each example's slot position and counters (``[worker, epoch, lap, emitted, yielded,
#: *stats]``); the collate function stacks them and the loader pops them off each batch.
META_KEY = "__wdspack_position__"


def pack_to_example(pack: Pack, *, seq_len: int, max_images: int, pad_token_id: int,
                    image_transform: Callable[[Sequence[bytes]], dict[str, torch.Tensor]] | None = None,
                    pad_images: bool = True) -> dict[str, torch.Tensor]:
    """One pack as fixed-shape tensors (layout and conventions in the module docstring).

    Args:
        pack: a decoded pack of at most ``seq_len`` tokens and ``max_images`` images.
        seq_len: ``L``, the row length; padding fills the rest.
        max_images: ``M``, the image slots; empty slots are zero.
        pad_token_id: the id written into padding.
        image_transform: encoded images → one tensor entry per image (see
            :func:`wdspack.media.image.pixels.make_image_transform`); padded here to ``M`` slots (or, for the
            flattened-patch layout, to the transform's ``patch_rows(L, M)`` rows).
        pad_images: False leaves one-entry-per-image tensors at the real images' count ``[k, ...]``;
            :func:`collate_packs` then pads them straight into the ``[B·M, ...]`` batch tensor,
            which saves writing and copying the empty slots twice (the loader does this).

    Returns:
        ``input_ids``, ``labels``, ``position_ids`` ``[L]`` int64; ``seq_idx`` ``[L]`` int32;
        ``num_tokens``, ``num_samples`` 0-d int64; ``image_mask`` ``[M]`` bool;
        ``image_sample_idx`` ``[M]`` int64 (owner sub-sample, -1 for empty slots);
        ``image_token_counts`` ``[M]`` int64; and the padded image tensors.

    Raises:
        FormatError: the pack is over a budget, or an image cannot be decoded (an
            ``ImageDecodeError`` naming the sub-sample's id; the loader drops that sub-sample
            instead, :func:`failed_sample`); :class:`ConfigError` when the image
            processor's grid disagrees with the image tokens the pack reserved.

    Example:
        >>> p = Pack(np.array([1, 5, 2]), np.array([1, 1, 1]), (3,), ("a",))
        >>> e = pack_to_example(p, seq_len=5, max_images=0, pad_token_id=0)
        >>> e["labels"].tolist(), e["position_ids"].tolist(), e["seq_idx"].tolist()
        ([-100, 5, 2, -100, -100], [0, 1, 2, 0, 1], [0, 0, 0, 1, 1])
    """
    check_budgets(pack, seq_len=seq_len, max_images=max_images)
    n, k = pack.num_tokens, pack.num_images
    lens = np.asarray(pack.seq_lens, np.int64)
    starts = np.cumsum(lens) - lens
    ids = np.full(seq_len, pad_token_id, np.int64)
    ids[:n] = pack.input_ids
    trained = pack.loss_mask.astype(bool)
    trained[starts] = False  # no target across a sub-sample boundary
    labels = np.full(seq_len, IGNORE_INDEX, np.int64)
    labels[:n] = np.where(trained, ids[:n], IGNORE_INDEX)
    positions = np.empty(seq_len, np.int64)
    positions[:n] = np.arange(n) - np.repeat(starts, lens)
    positions[n:] = np.arange(seq_len - n)
    seq_idx = np.full(seq_len, len(lens), np.int32)
    seq_idx[:n] = np.repeat(np.arange(len(lens), dtype=np.int32), lens)
    owner = np.full(max_images, -1, np.int64)
    owner[:k] = pack.image_sample
    counts = np.zeros(max_images, np.int64)
    counts[:k] = pack.image_tokens
    out = {
        "input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels),
        "position_ids": torch.from_numpy(positions), "seq_idx": torch.from_numpy(seq_idx),
        "num_tokens": torch.tensor(n, dtype=torch.int64), "num_samples": torch.tensor(len(lens), dtype=torch.int64),
        "image_mask": torch.arange(max_images) < k, "image_sample_idx": torch.from_numpy(owner),
        "image_token_counts": torch.from_numpy(counts),
    }
    if image_transform is not None:
        out.update(_images_to_slots(pack, image_transform, seq_len=seq_len, max_images=max_images,
                                    pad=pad_images))
    return out


def check_budgets(pack: Pack, *, seq_len: int, max_images: int) -> None:
    """:class:`FormatError` for a pack over the row's tokens or image slots, naming its samples and the fix."""
    n, k = pack.num_tokens, pack.num_images
    if n > seq_len:
        raise FormatError(f"pack with samples {_names(pack)} has {n} tokens > seq_len {seq_len}; load with the "
                          "seq_len the dataset was packed for (its manifest), or reshard it")
    if k > max_images:
        raise FormatError(f"pack with samples {_names(pack)} has {k} images > max_images {max_images}; load with "
                          "max_images at least the images of the dataset's fullest pack (the loader's default)")


def check_options(attention_mask: str | None, padding_free: bool) -> None:
    """:class:`ConfigError` for an ``attention_mask`` / ``padding_free`` pair a batch cannot have."""
    if attention_mask not in (None, "2d", "4d"):
        raise ConfigError(f"attention_mask must be None, '2d' or '4d', got {attention_mask!r}")
    if padding_free and attention_mask == "2d":
        raise ConfigError("a '2d' attention_mask with padding_free=True would make the model treat the whole row "
                          "as one sequence; pass attention_mask=None (boundaries are in position_ids and cu_seqlens) "
                          "or '4d'")


def collate_packs(examples: Sequence[dict[str, torch.Tensor]], *, attention_mask: str | None = None,
                  padding_free: bool = False, pad_to: int | str | None = "batch",
                  mask_dtype: torch.dtype = torch.bool, max_segments: int | None = None,
                  share_memory: bool | None = None) -> dict[str, torch.Tensor | int]:
    """Stack :func:`pack_to_example` outputs into one batch of fixed shapes.

    Args:
        examples: ``B`` examples with the same ``seq_len`` and image slots.
        attention_mask: ``None`` (use ``position_ids`` / ``seq_idx`` / ``cu_seqlens``); ``"2d"``
            for a ``[B, L]`` padding mask (1 = real token); ``"4d"`` for a ``[B, 1, L, L]``
            block-diagonal causal mask (padding attends to itself, so no row is empty).
        padding_free: one ``[1, N]`` row of real tokens (see the module docstring); a ``"2d"``
            mask is refused there (transformers would take the whole row as one sequence).
        pad_to: padding-free only: ``"batch"`` pads to ``B·L`` (static), an int pads to that
            length (static, must hold the real tokens), ``None`` keeps only real tokens.
        mask_dtype: ``"4d"`` only: ``torch.bool`` (SDPA, flex) or a float dtype for an additive
            mask (0 = attend, the dtype's minimum = masked; eager attention) matching the model's.
        max_segments: pad ``cu_seqlens`` to ``max_segments + 1`` entries by repeating its last
            offset (empty segments), so its shape is static too.
        share_memory: build the stacked tensors straight in shared memory (what a DataLoader
            worker sends them through). Default: when called in a DataLoader worker.

    Returns:
        Text tensors as above; ``cu_seqlens`` ``[S+1]`` int32 and ``max_seqlen`` (a Python int)
        over the flattened tokens; ``num_tokens``, ``num_samples`` ``[B]``; ``source_idx`` ``[B]``
        int64 (each pack's source in a mixture, zeros for one dataset); the image slot
        tensors concatenated pack-major (``[B·M, ...]``) with ``image_pack_idx`` ``[B·M]``.

    Example:
        >>> p = Pack(np.array([1, 5, 2]), np.array([0, 1, 1]), (3,), ("a",))
        >>> b = collate_packs([pack_to_example(p, seq_len=4, max_images=0, pad_token_id=0)] * 2)
        >>> b["cu_seqlens"].tolist(), b["max_seqlen"], tuple(b["input_ids"].shape)
        ([0, 3, 4, 7, 8], 3, (2, 4))
    """
    if not examples:
        raise ConfigError("collate_packs needs at least one example")
    check_options(attention_mask, padding_free)
    shapes = {tuple(e["input_ids"].shape) + tuple(e["image_mask"].shape) for e in examples}
    if len(shapes) != 1:
        raise ConfigError(f"examples have different (seq_len, max_images): {sorted(shapes)}; build them all with "
                          "the same budgets")
    B, L, M = len(examples), examples[0]["input_ids"].shape[0], examples[0]["image_mask"].shape[0]
    shared = torch.utils.data.get_worker_info() is not None if share_memory is None else share_memory
    batch: dict[str, Any] = {key: _join([e[key] for e in examples], stack=True, shared=shared)
                             for key in _TEXT_KEYS + _COUNT_KEYS}
    batch[SOURCE_KEY] = torch.tensor([int(e.get(SOURCE_KEY, 0)) for e in examples], dtype=torch.int64)
    for key in examples[0]:
        if key not in (*_TEXT_KEYS, *_COUNT_KEYS, SOURCE_KEY):  # image slots and image tensors: pack-major
            tensors = [e[key] for e in examples]
            if any(t.shape[0] != M for t in tensors) and "image_grid_thw" not in examples[0]:
                batch[key] = _pad_join(tensors, M, key=key, shared=shared)  # pad_images=False: real images only
            else:
                batch[key] = _join(tensors, stack=False, shared=shared)
    batch["image_pack_idx"] = torch.arange(B).repeat_interleave(M)
    real = batch["num_tokens"].tolist()
    sample_lens = [np.bincount(e["seq_idx"][:n].numpy(), minlength=int(e["num_samples"]))
                   for e, n in zip(examples, real)]
    targets = [_sample_targets(e, n) for e, n in zip(examples, real)]
    return segment_batch(batch, sample_lens, targets, L=L, padding_free=padding_free, pad_to=pad_to,
                         max_segments=max_segments, attention_mask=attention_mask, mask_dtype=mask_dtype)


def segment_batch(batch: dict[str, Any], sample_lens: Sequence[np.ndarray], targets: Sequence[list[int]], *, L: int,
                  padding_free: bool, pad_to: int | str | None, max_segments: int | None, attention_mask: str | None,
                  mask_dtype: torch.dtype) -> dict[str, Any]:
    """The rest of a batch from its stacked text and, per pack, its sub-samples' lengths and targets:
    the padding-free layout, ``cu_seqlens`` / ``max_seqlen``, ``num_targets`` / ``segment_targets``
    (targets per pack, and per segment with padding segments 0) and the attention mask."""
    real = batch["num_tokens"].tolist()
    if padding_free:
        lengths = _padding_free(batch, sample_lens, B=len(real), L=L, pad_to=pad_to)
    else:
        lengths = [x for lens, n in zip(sample_lens, real) for x in (*lens.tolist(), L - n) if x > 0]
    batch["cu_seqlens"] = _cu_seqlens(lengths, max_segments)
    batch["max_seqlen"] = max(lengths, default=0)
    per_segment = [c for t, n in zip(targets, real) for c in t + ([0] if L > n and not padding_free else [])]
    segments = np.zeros(batch["cu_seqlens"].numel() - 1, np.int64)
    segments[:len(per_segment)] = per_segment
    batch["num_targets"] = torch.tensor([sum(t) for t in targets], dtype=torch.int64)
    batch["segment_targets"] = torch.from_numpy(segments)
    if attention_mask == "2d":
        batch["attention_mask"] = (torch.arange(L)[None, :] < batch["num_tokens"][:, None]).long()
    elif attention_mask == "4d":
        batch["attention_mask"] = _block_causal(batch["seq_idx"], mask_dtype)
    return batch


def _join(tensors: list[torch.Tensor], *, stack: bool, shared: bool) -> torch.Tensor:
    """``torch.stack`` / ``torch.cat``; with ``shared`` (in a DataLoader worker), straight into shared memory.

    The worker would otherwise copy every batch tensor into shared memory to send it (as
    ``default_collate`` avoids too): for image batches that copy is tens of megabytes.
    """
    first = tensors[0]
    shape = (len(tensors), *first.shape) if stack else (sum(t.shape[0] for t in tensors), *first.shape[1:])
    out = _shared(first, shape) if shared else None
    return torch.stack(tensors, out=out) if stack else torch.cat(tensors, out=out)


def _pad_join(tensors: list[torch.Tensor], slots: int, *, key: str, shared: bool) -> torch.Tensor:
    """Concatenate per-pack ``[k_b, ...]`` tensors into ``[B·slots, ...]``, zeros past each pack's ``k_b``."""
    first = tensors[0]
    if any(t.shape[0] > slots for t in tensors):
        raise ConfigError(f"{key}: a pack has {max(t.shape[0] for t in tensors)} entries > {slots} image slots")
    shape = (len(tensors) * slots, *first.shape[1:])
    out = _shared(first, shape) if shared else None
    fresh = out is not None  # a new shared-memory segment reads as zeros already
    out = first.new_empty(shape) if out is None else out
    for b, t in enumerate(tensors):  # every byte written at most once: the real rows, then zeros
        out[b * slots: b * slots + t.shape[0]] = t
        if not fresh:
            out[b * slots + t.shape[0]: (b + 1) * slots] = 0
    return out


def _shared(like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
    """A new tensor in shared memory (None where that is not available).

    Its bytes are zero: the segment is a new file in ``/dev/shm``, which the OS hands out zero-filled
    (PyTorch ``fallocate``s it whole, so the pages exist already; writing zeros again would only
    cost time).
    """
    try:  # the private call default_collate makes; without it the copy just happens later
        return like.new(like._typed_storage()._new_shared(math.prod(shape), device=like.device)).view(shape)
    except (AttributeError, RuntimeError):
        return None


def _names(pack: Pack) -> str:
    ids = list(pack.sample_ids[:3])
    return f"{ids}"[:-1] + ", ...]" if pack.num_samples > 3 else f"{ids}"


def _padding_free(batch: dict[str, Any], sample_lens: Sequence[np.ndarray], *, B: int, L: int,
                  pad_to: int | str | None) -> list[int]:
    """Rewrite the text tensors of ``batch`` as one ``[1, N]`` row; return the segment lengths."""
    total = int(batch["num_tokens"].sum())
    width = B * L if pad_to == "batch" else total if pad_to is None else pad_to
    if not isinstance(width, int) or isinstance(width, bool) or not total <= width <= B * L:
        raise ConfigError(f"pad_to={pad_to!r}: give 'batch', None, or an int from the batch's {total} real tokens "
                          f"up to B·L = {B * L}")
    keep = (torch.arange(L)[None, :] < batch["num_tokens"][:, None]).reshape(-1)
    lens = [int(x) for s in sample_lens for x in s]
    tail = width - total
    pad_id = batch["input_ids"].reshape(-1)[~keep][:1]  # some pack has padding whenever tail > 0
    fill = {"input_ids": pad_id.expand(tail), "labels": torch.full((tail,), IGNORE_INDEX),
            "position_ids": torch.arange(tail), "seq_idx": torch.full((tail,), len(lens), dtype=torch.int32)}
    for key in ("input_ids", "labels", "position_ids"):
        batch[key] = torch.cat([batch[key].reshape(-1)[keep], fill[key]])[None]
    seq_idx = torch.repeat_interleave(torch.arange(len(lens), dtype=torch.int32), torch.tensor(lens, dtype=torch.int64))
    batch["seq_idx"] = torch.cat([seq_idx, fill["seq_idx"]])[None]
    return lens + ([tail] if tail else [])


def _sample_targets(example: dict[str, torch.Tensor], n: int) -> list[int]:
    """Target tokens (``labels != -100``) per sub-sample of one example: what exact loss normalisation
    counts (:mod:`wdspack.train.loss`)."""
    trained = (example["labels"][:n] != IGNORE_INDEX).numpy()
    return np.bincount(example["seq_idx"][:n].numpy()[trained], minlength=int(example["num_samples"])).tolist()


def _cu_seqlens(lengths: list[int], max_segments: int | None) -> torch.Tensor:
    size = len(lengths) if max_segments is None else max_segments
    if size < len(lengths):
        raise ConfigError(f"the batch has {len(lengths)} segments > max_segments {max_segments}; raise it "
                          "(at most B × (sub-samples per pack + 1))")
    cu = np.zeros(size + 1, np.int32)
    cu[1:len(lengths) + 1] = np.cumsum(lengths)
    cu[len(lengths) + 1:] = cu[len(lengths)]
    return torch.from_numpy(cu)


def _block_causal(seq_idx: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[R, 1, T, T]``: query ``i`` may see key ``j`` when both are in one segment and ``j <= i``."""
    T = seq_idx.shape[1]
    allowed = (seq_idx[:, :, None] == seq_idx[:, None, :]) & torch.ones(T, T, dtype=torch.bool).tril()
    if dtype == torch.bool:
        return allowed[:, None]
    if not dtype.is_floating_point:
        raise ConfigError(f"mask_dtype must be torch.bool or a float dtype, got {dtype}")
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def _images_to_slots(pack: Pack, transform: Callable[[Sequence[bytes]], dict[str, torch.Tensor]], *,
                     seq_len: int, max_images: int, pad: bool = True) -> dict[str, torch.Tensor]:
    """Run the transform and pad its per-image outputs to ``max_images`` slots (fixed shapes)."""
    with naming_sample(pack):
        got = dict(transform(pack.images))
    k = pack.num_images
    if "image_grid_thw" in got:
        return _pad_patches(pack, got, transform, seq_len=seq_len, max_images=max_images)
    out = {}
    for key, value in got.items():
        if value.ndim == 0 or value.shape[0] != k:
            raise ConfigError(f"image transform returned {key} of shape {tuple(value.shape)} for {k} images; "
                              "it must return one entry per image")
        if pad and k < max_images:
            slots = value.new_empty((max_images, *value.shape[1:]))
            slots[:k] = value
            slots[k:] = 0
            value = slots
        out[key] = value
    return out


@contextmanager
def naming_sample(pack: Pack) -> Iterator[None]:
    """Re-raise a medium's decoding error (each kind's ``decode_errors()``, e.g. an
    :class:`~wdspack.media.image.pixels.ImageDecodeError`) with the owner sub-sample's id in front (once: an
    error that names it already goes on as it is)."""
    try:
        yield
    except Exception as e:
        found = _decoding(pack, e)
        if found is None:
            raise
        owner, _ = found
        who = f"sample {pack.sample_ids[owner]!r}: "
        if str(e).startswith(who):
            raise
        k = e.index  # type: ignore[attr-defined]  # a kind's decode error carries its medium's index
        raise type(e)(f"{who}{e}", index=k) from None  # type: ignore[call-arg]


def failed_sample(pack: Pack, error: Exception) -> tuple[int, str] | None:
    """``(sub-sample, reason)`` when ``error`` is a medium's decoding failure (of any kind) that names its
    medium (``index``) in ``pack``: the sub-sample that owns it and a drop reason of its kind
    (``unreadable_image``, ``image_too_large``, ``unreadable_video``); None for anything else (the pack itself
    is bad)."""
    return _decoding(pack, error)


def _decoding(pack: Pack, error: BaseException) -> tuple[int, str] | None:
    """``(owner sub-sample, load drop reason)`` of the pack's medium whose decoding ``error`` is, or None."""
    k = getattr(error, "index", None)
    if not isinstance(k, int) or k < 0:
        return None
    for kind in KINDS:
        if isinstance(error, kind.decode_errors()) and k < pack.count(kind.name):
            return pack.media[kind.name].sample[k], _load_reason(kind, error)
    return None


def _load_reason(kind: MediaKind, error: BaseException) -> str:
    """The kind's load drop reason for ``error``: the one its error type spells (``image_too_large`` for an
    ``ImageTooLargeError``), else the kind's first (``unreadable_image``)."""
    spelled = {"".join(part.title() for part in reason.split("_")) + "Error": reason
               for reason in kind.load_drop_reasons}
    return next((spelled[t.__name__] for t in type(error).__mro__ if t.__name__ in spelled),
                kind.load_drop_reasons[0])


def _pad_patches(pack: Pack, got: dict[str, torch.Tensor], transform: PatchLayout | Any, *, seq_len: int,
                 max_images: int) -> dict[str, torch.Tensor]:
    """Flattened-patch layout: ``pixel_values`` [P, D] → [R, D] + ``patch_mask``; grids → [M, 3].

    Reads :class:`~wdspack.media.image.pixels.PatchLayout` from the transform; without it, merge size 1 and
    ``seq_len`` rows.
    """
    pv, grid = got["pixel_values"], got["image_grid_thw"]
    merge = int(getattr(transform, "merge_size", 1))
    tokens = (grid.prod(dim=1) // (merge * merge)).tolist()
    if tokens != list(pack.image_tokens):
        raise ConfigError(f"the image processor gives {tokens} tokens for the images of samples "
                          f"{sorted(set(pack.sample_ids[i] for i in pack.image_sample))} but the pack reserved "
                          f"{list(pack.image_tokens)}; use the processor (and settings) the dataset was packed with")
    rows_of = getattr(transform, "patch_rows", None)
    rows = rows_of(seq_len, max_images) if rows_of is not None else seq_len * merge * merge
    if pv.shape[0] > rows:
        raise ConfigError(f"{pv.shape[0]} image patches > the {rows} patch rows per pack; raise max_patches")
    padded = pv.new_zeros((rows, pv.shape[1]))
    padded[: pv.shape[0]] = pv
    grids = torch.zeros(max_images, 3, dtype=torch.int64)
    grids[: grid.shape[0]] = grid
    return {"pixel_values": padded, "image_grid_thw": grids, "patch_mask": torch.arange(rows) < pv.shape[0]}
