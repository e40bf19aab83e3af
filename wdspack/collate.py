"""Packs → fixed-shape tensors (the batch contract of DESIGN.md §4).

One pack of two sub-samples (``seq_len`` 10, sub-sample 0 owns one image of 2 tokens)::

    index          0    1    2    3    4    5    6    7    8    9
    input_ids     <s> [IMG][IMG]  hi   A  </s> <s>   B  </s> <pad>
    loss_mask      0    0    0    0    1    1    0    1    1    -
    labels       -100 -100 -100 -100   A  </s> -100  B  </s> -100
    position_ids   0    1    2    3    4    5    0    1    2    0
    seq_idx        0    0    0    0    0    0    1    1    1    2   (padding: its own id = S)

``labels`` are *unshifted*, as Hugging Face models expect (the model predicts ``labels[i]`` from
position ``i - 1``); the first token of every sub-sample is ``-100`` so no loss crosses a
boundary. Over a batch, ``cu_seqlens`` lists every segment of the flattened ``[B·L]`` tokens,
each pack's padding tail being a segment of its own, so ``cu_seqlens[-1] == B·L`` and varlen
attention kernels can take the padded batch as is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from .codec import Pack

__all__ = ["IGNORE_INDEX", "collate_packs", "pack_to_example"]

IGNORE_INDEX = -100


def pack_to_example(pack: Pack, *, seq_len: int, max_images: int, pad_token_id: int,
                    image_transform: Callable[[Sequence[bytes]], dict[str, torch.Tensor]] | None = None,
                    ) -> dict[str, torch.Tensor]:
    """One pack as fixed-shape tensors (see the module docstring for the layout).

    Keys: ``input_ids``, ``labels``, ``position_ids`` ``[L]`` int64; ``seq_idx`` ``[L]`` int32;
    ``num_tokens`` and ``num_samples`` (0-d); ``image_mask`` ``[M]`` bool,
    ``image_sample_idx`` ``[M]`` (owner sub-sample, -1 for empty slots), ``image_token_counts``
    ``[M]``; and the image tensors from ``image_transform`` padded to ``M`` slots (its
    ``pixel_values`` ``[M, C, H, W]``, or for flattened-patch processors the processor's own layout
    padded to a fixed number of rows).

    Example:
        >>> p = Pack(np.array([1, 5, 2]), np.array([0, 1, 1]), (3,), ("a",))
        >>> pack_to_example(p, seq_len=4, max_images=0, pad_token_id=0)["labels"].tolist()
        [-100, 5, 2, -100]
    """
    n = pack.num_tokens
    if n > seq_len:
        raise ValueError(f"pack has {n} tokens > seq_len {seq_len}")
    if pack.num_images > max_images:
        raise ValueError(f"pack has {pack.num_images} images > max_images {max_images}")
    ids = np.full(seq_len, pad_token_id, np.int64)
    ids[:n] = pack.input_ids
    labels = np.full(seq_len, IGNORE_INDEX, np.int64)
    trained = pack.loss_mask.astype(bool)
    starts = np.cumsum((0,) + pack.seq_lens[:-1]) if pack.seq_lens else np.zeros(0, np.int64)
    trained[starts] = False  # no target across a sub-sample boundary
    labels[:n][trained] = ids[:n][trained]
    seq_idx = np.full(seq_len, len(pack.seq_lens), np.int32)
    seq_idx[:n] = np.repeat(np.arange(len(pack.seq_lens), dtype=np.int32), pack.seq_lens)
    positions = np.zeros(seq_len, np.int64)
    positions[:n] = np.arange(n) - np.repeat(starts, pack.seq_lens)
    positions[n:] = np.arange(seq_len - n)
    owner = np.full(max_images, -1, np.int64)
    owner[: pack.num_images] = pack.image_sample
    counts = np.zeros(max_images, np.int64)
    counts[: pack.num_images] = pack.image_tokens
    mask = np.zeros(max_images, bool)
    mask[: pack.num_images] = True
    out = {
        "input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels),
        "position_ids": torch.from_numpy(positions), "seq_idx": torch.from_numpy(seq_idx),
        "num_tokens": torch.tensor(n), "num_samples": torch.tensor(len(pack.seq_lens)),
        "image_mask": torch.from_numpy(mask), "image_sample_idx": torch.from_numpy(owner),
        "image_token_counts": torch.from_numpy(counts),
    }
    if image_transform is not None:
        out.update(image_transform(pack.images, max_images=max_images, seq_len=seq_len))
    return out


def collate_packs(examples: Sequence[dict[str, torch.Tensor]], *, attention_mask: str | None = None,
                  padding_free: bool = False) -> dict[str, torch.Tensor]:
    """Stack examples into a batch of fixed shapes.

    Args:
        examples: outputs of :func:`pack_to_example`, all with the same ``seq_len`` and slots.
        attention_mask: ``None``; ``"2d"`` for a ``[B, L]`` padding mask (1 = real token); or
            ``"4d"`` for a ``[B, 1, L, L]`` bool block-diagonal causal mask (True = attend;
            padding attends to itself, so no row is empty).
        padding_free: lay the batch out as ``[1, B·L]`` (``input_ids``, ``labels``,
            ``position_ids``, ``seq_idx``) for transformers' FlashAttention-2 path, which finds
            sub-sample boundaries where ``position_ids`` restart. Padding stays (static shape),
            as its own segment with positions restarting at 0 and labels -100.

    Returns:
        The batch dict, with ``cu_seqlens`` ``[S+1]`` int32 and ``max_seqlen`` (int) over the
        flattened tokens; image tensors concatenated to ``[B·M, ...]`` with ``image_pack_idx``.

    Example:
        >>> p = Pack(np.array([1, 5, 2]), np.array([0, 1, 1]), (3,), ("a",))
        >>> b = collate_packs([pack_to_example(p, seq_len=4, max_images=0, pad_token_id=0)] * 2)
        >>> b["cu_seqlens"].tolist(), b["input_ids"].shape
        ([0, 3, 4, 7, 8], torch.Size([2, 4]))
    """
    B = len(examples)
    L = examples[0]["input_ids"].shape[0]
    batch: dict[str, torch.Tensor] = {}
    for key in ("input_ids", "labels", "position_ids", "seq_idx"):
        batch[key] = torch.stack([e[key] for e in examples])
    lengths: list[int] = []
    for e in examples:
        n = int(e["num_tokens"])
        seg = torch.bincount(e["seq_idx"][:n].long(), minlength=int(e["num_samples"]))
        lengths.extend(int(x) for x in seg if x > 0)
        if n < L:
            lengths.append(L - n)
    cu = np.zeros(len(lengths) + 1, np.int32)
    cu[1:] = np.cumsum(lengths)
    batch["cu_seqlens"] = torch.from_numpy(cu)
    batch["max_seqlen"] = max(lengths) if lengths else 0
    batch["num_tokens"] = torch.stack([e["num_tokens"] for e in examples])
    for key in ("image_mask", "image_sample_idx", "image_token_counts"):
        batch[key] = torch.cat([e[key] for e in examples])
    M = examples[0]["image_mask"].shape[0]
    batch["image_pack_idx"] = torch.arange(B).repeat_interleave(M)
    for key in ("pixel_values", "image_grid_thw", "patch_mask"):
        if key in examples[0]:
            batch[key] = torch.cat([e[key] for e in examples])
    if attention_mask == "2d":
        batch["attention_mask"] = (torch.arange(L)[None, :] < batch["num_tokens"][:, None]).long()
    elif attention_mask == "4d":
        same = batch["seq_idx"][:, :, None] == batch["seq_idx"][:, None, :]
        causal = torch.ones(L, L, dtype=torch.bool).tril()
        batch["attention_mask"] = (same & causal)[:, None]
    elif attention_mask is not None:
        raise ValueError(f"attention_mask must be None, '2d' or '4d', got {attention_mask!r}")
    if padding_free:
        for key in ("input_ids", "labels", "position_ids"):
            batch[key] = batch[key].reshape(1, B * L)
        # Segment ids unique over the flattened batch (padding tails included).
        batch["seq_idx"] = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32),
                                                   torch.tensor(lengths)).reshape(1, B * L)
        if attention_mask == "2d":
            batch["attention_mask"] = batch["attention_mask"].reshape(1, B * L)
    return batch
