"""Exact loss normalisation for packed batches, across gradient accumulation and ranks.

Packs hold different numbers of target tokens, so ``loss.mean()`` per micro-batch weighs a token
of a sparse pack more than one of a dense pack, and DDP's gradient average weighs ranks equally
whatever their targets. The exact token mean of one optimizer step is::

    Σ (over ranks r, micro-batches m, targets t) loss[r, m, t]  /  N,   N = all targets of the step

:func:`num_items_in_batch` gives ``N`` (one ``all_reduce`` per step); pass it to a transformers
model (``model(..., num_items_in_batch=N).loss`` is ``Σ loss / N`` on this micro-batch, the
convention transformers' ``Trainer`` uses, though only for models that declare
``accepts_loss_kwargs``: not Qwen-VL or Gemma 3, for which :class:`wdspack.train.trainers.PackedTrainer`
applies it) and multiply by the world size, since DDP divides the summed gradients by it::

    micro = [next(it) for _ in range(accumulation)]
    n = wdspack.num_items_in_batch(micro)                       # every rank, every micro-batch
    for batch in micro:
        loss = model(**wdspack.model_inputs(batch, model), num_items_in_batch=n).loss
        (loss * world_size).backward()                         # DDP averages: undo it
    opt.step(); opt.zero_grad()

Recipes that weigh every sample equally (each sub-sample's mean loss, averaged over sub-samples)
use :func:`sample_mean_loss` with :func:`num_samples_in_batch`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ..loader.batch.collate import IGNORE_INDEX

__all__ = ["num_items_in_batch", "num_samples_in_batch", "sample_mean_loss", "token_losses"]


def _all_reduce(total: torch.Tensor, group: Any) -> torch.Tensor:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(total, group=group)
    return total


def num_items_in_batch(batches: Iterable[Mapping[str, Any]], *, group: Any = None) -> torch.Tensor:
    """Target tokens in ``batches`` (one optimizer step's micro-batches), summed over all ranks.

    Targets are ``labels != -100`` (the labels are unshifted and every sub-sample's first label is
    already ``-100``, so this equals the count after the model's shift). With ``torch.distributed``
    initialised the count is ``all_reduce``d over ``group`` (default: every rank). At least 1: a step
    with no target at all (every pack padding: each of its samples dropped at load time) then has a
    loss of 0, not 0 / 0.

    Example:
        >>> b = {"labels": torch.tensor([[-100, 5, 6, -100], [-100, -100, 7, -100]])}
        >>> int(num_items_in_batch([b, b]))
        6
    """
    total = torch.zeros((), dtype=torch.int64)
    for batch in batches:
        labels = batch["labels"]
        total = total.to(labels.device) + (labels != IGNORE_INDEX).sum()
    return _all_reduce(total, group).clamp_(min=1)


def num_samples_in_batch(batches: Iterable[Mapping[str, Any]], *, group: Any = None) -> torch.Tensor:
    """Sub-samples with at least one target in ``batches``, summed over all ranks (see :func:`sample_mean_loss`);
    at least 1, as :func:`num_items_in_batch`."""
    total = torch.zeros((), dtype=torch.int64)
    for batch in batches:
        total = total.to(batch["labels"].device) + (_sample_targets(batch) > 0).sum()  # no host sync
    return _all_reduce(total, group).clamp_(min=1)


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token cross entropy of the unshifted ``labels`` (position ``i`` predicts ``labels[i + 1]``),
    ``[R, T]`` with zeros where there is no target (the last column included).

    Example:
        >>> logits = torch.zeros(1, 3, 4)  # uniform over 4 tokens: every target costs log 4
        >>> token_losses(logits, torch.tensor([[-100, 2, -100]]))
        tensor([[1.3863, 0.0000, 0.0000]])
    """
    R, T, V = logits.shape
    # The shift moves the labels, not the logits: every position gets the next label and the last
    # one IGNORE_INDEX (a zero loss), so the logits go to cross_entropy as a flat [R * T, V] view,
    # with no copy of the vocabulary-wide tensor; the transposed [R, V, T] layout that a shifted
    # slice needs reads the vocabulary with a stride of T and is ~6x slower on CPU.
    targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX).reshape(-1)
    x = logits.reshape(R * T, V)
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()  # as transformers' loss does
    return F.cross_entropy(x, targets, ignore_index=IGNORE_INDEX, reduction="none").view(R, T)


def sample_mean_loss(logits: torch.Tensor, batch: Mapping[str, Any], num_samples: torch.Tensor | int) -> torch.Tensor:
    """This micro-batch's share of the step's per-sample mean: ``Σ_s mean_t(loss of s) / num_samples``.

    Each sub-sample's target tokens weigh ``1 / (its targets)``; summed over the micro-batches of a
    step (and, times the world size, over DDP's averaged ranks) this is the mean over all the step's
    sub-samples of each one's mean token loss, as if every sample were its own row.

    Args:
        logits: ``[R, T, V]`` for the batch's ``input_ids`` (padded or padding-free).
        batch: the loader's batch (``labels``, ``seq_idx``).
        num_samples: :func:`num_samples_in_batch` of the step.
    """
    labels, seq_idx = batch["labels"], batch["seq_idx"].to(torch.int64)
    losses = token_losses(logits, labels)
    targets = torch.roll(labels != IGNORE_INDEX, -1, dims=1)  # the loss at i belongs to label i + 1
    owner = torch.roll(seq_idx, -1, dims=1)
    R, T = labels.shape
    key = (torch.arange(R, device=labels.device)[:, None] * (T + 1) + owner).reshape(-1)
    counts = torch.zeros(R * (T + 1), dtype=losses.dtype, device=labels.device)
    counts.index_add_(0, key, targets.reshape(-1).to(losses.dtype))
    weight = torch.where(targets.reshape(-1), 1.0 / counts[key].clamp(min=1), torch.zeros((), dtype=losses.dtype))
    return (losses.reshape(-1) * weight).sum() / num_samples


def _sample_targets(batch: Mapping[str, Any]) -> torch.Tensor:
    """Targets per (row, sub-sample) of a batch, flattened."""
    labels, seq_idx = batch["labels"], batch["seq_idx"].to(torch.int64)
    R, T = labels.shape
    key = (torch.arange(R, device=labels.device)[:, None] * (T + 1) + seq_idx).reshape(-1)
    counts = torch.zeros(R * (T + 1), dtype=torch.int64, device=labels.device)
    counts.index_add_(0, key, (labels != IGNORE_INDEX).reshape(-1).to(torch.int64))
    return counts
