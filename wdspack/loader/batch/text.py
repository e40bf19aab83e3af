"""The loader's text side of a batch, built from its packs in one pass.

    packs ─► text_batch ─► input_ids, labels, position_ids, seq_idx [B, L], counts, source_idx, image slots
                           (sub-sample lengths and targets read from the packs) ─► segment_batch

:func:`text_batch` gives exactly what :func:`~.collate.pack_to_example` + :func:`~.collate.collate_packs`
give, key order included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ...format.pack import Pack
from .collate import IGNORE_INDEX, SOURCE_KEY, check_budgets, check_options, segment_batch

__all__ = ["text_batch"]


def text_batch(packs: Sequence[Pack], sources: Sequence[int], *, seq_len: int, max_images: int, pad_token_id: int,
               attention_mask: str | None = None, padding_free: bool = False, max_segments: int | None = None
               ) -> dict[str, Any]:
    """``collate_packs([pack_to_example(p, seq_len=..., max_images=..., pad_token_id=...) ...], ...)``
    without the per-pack tensors, for packs with no image transform (the loader places the pixels
    itself); ``sources[b]`` is pack ``b``'s ``source_idx``.

    Raises:
        FormatError: a pack over a budget (as :func:`~.collate.pack_to_example`).
        ConfigError: options as :func:`~.collate.collate_packs` refuses them.
    """
    check_options(attention_mask, padding_free)
    B, L, M = len(packs), seq_len, max_images
    ids = np.full((B, L), pad_token_id, np.int64)
    labels = np.full((B, L), IGNORE_INDEX, np.int64)
    positions = np.empty((B, L), np.int64)
    seq_idx = np.empty((B, L), np.int32)
    owner = np.full((B, M), -1, np.int64)
    counts = np.zeros((B, M), np.int64)
    tokens, samples, images = np.empty(B, np.int64), np.empty(B, np.int64), np.empty(B, np.int64)
    sample_lens: list[np.ndarray] = []
    targets: list[list[int]] = []
    for b, pack in enumerate(packs):
        check_budgets(pack, seq_len=seq_len, max_images=max_images)
        n, k = pack.num_tokens, pack.num_images
        lens = np.asarray(pack.seq_lens, np.int64)
        starts = np.cumsum(lens) - lens
        ids[b, :n] = pack.input_ids
        trained = pack.loss_mask.astype(bool)
        trained[starts] = False  # no target across a sub-sample boundary
        np.copyto(labels[b, :n], ids[b, :n], where=trained)
        positions[b, :n] = np.arange(n) - np.repeat(starts, lens)
        positions[b, n:] = np.arange(L - n)
        seq_idx[b, :n] = np.repeat(np.arange(len(lens), dtype=np.int32), lens)
        seq_idx[b, n:] = len(lens)
        owner[b, :k] = pack.image_sample
        counts[b, :k] = pack.image_tokens
        tokens[b], samples[b], images[b] = n, len(lens), k
        sample_lens.append(lens)
        targets.append(np.add.reduceat(trained, starts).tolist() if n else [])
    batch: dict[str, Any] = {
        "input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels),
        "position_ids": torch.from_numpy(positions), "seq_idx": torch.from_numpy(seq_idx),
        "num_tokens": torch.from_numpy(tokens), "num_samples": torch.from_numpy(samples),
        SOURCE_KEY: torch.from_numpy(np.asarray(sources, np.int64).reshape(B)),
        "image_mask": torch.from_numpy((np.arange(M)[None, :] < images[:, None]).reshape(-1)),
        "image_sample_idx": torch.from_numpy(owner.reshape(-1)),
        "image_token_counts": torch.from_numpy(counts.reshape(-1)),
        "image_pack_idx": torch.from_numpy(np.arange(B, dtype=np.int64).repeat(M)),
    }
    return segment_batch(batch, sample_lens, targets, L=L, padding_free=padding_free, pad_to="batch",
                         max_segments=max_segments, attention_mask=attention_mask, mask_dtype=torch.bool)
