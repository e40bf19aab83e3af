"""Loss and target tokens per source of a mixture (DESIGN.md section 8), from the model's token losses.

Every batch of a mixture loader carries ``source_idx`` ``[B]`` (the source of each pack, so of each
of its sub-samples); with :func:`~.loss.token_losses` that is one line per step::

    losses = wdspack.train.loss.token_losses(logits, batch["labels"])
    for name, (total, targets) in per_source_losses(losses, batch, loader.source_names).items():
        log(f"loss/{name}", total / targets.clamp(min=1))

Sum ``total`` and ``targets`` over the steps (and ranks) you log before dividing, so each source's
figure is its exact token mean: :func:`source_totals` gives them as two tensors to add up and
reduce once per log, which is what :class:`~wdspack.train.trainers.PackedTrainer` does to log
``loss/<name>`` and ``tokens/<name>``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..errors import ConfigError
from ..loader.batch.collate import IGNORE_INDEX, SOURCE_KEY

__all__ = ["per_source_losses", "source_totals"]


def per_source_losses(token_losses: torch.Tensor, batch: Mapping[str, Any], source_names: Sequence[str]
                      ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{name: (loss_sum, target_tokens)}`` of one batch, per source.

    Args:
        token_losses: ``[R, T]`` per-token losses in the layout :func:`~.loss.token_losses` gives (the
            loss at position ``i`` is that of ``labels[i + 1]``; padded ``[B, L]`` or padding-free ``[1, N]``).
        batch: the loader's batch (``labels``, ``num_tokens``, ``source_idx``; a batch without
            ``source_idx`` is all source 0).
        source_names: the loader's ``source_names`` (``source_idx`` indexes it).

    Returns:
        Per source, the sum of its target tokens' losses (a 0-d tensor, in the graph) and their count.

    Example:
        >>> batch = {"labels": torch.tensor([[-100, 5, 6], [-100, 7, -100]]), "num_tokens": torch.tensor([3, 2]),
        ...          "source_idx": torch.tensor([1, 0])}
        >>> out = per_source_losses(torch.tensor([[1.0, 2.0, 0.0], [4.0, 0.0, 0.0]]), batch, ["a", "b"])
        >>> {k: (float(s), int(n)) for k, (s, n) in out.items()}
        {'a': (4.0, 1), 'b': (3.0, 2)}
    """
    total, number = source_totals(token_losses, batch, len(source_names))
    return {name: (total[i], number[i]) for i, name in enumerate(source_names)}


def source_totals(token_losses: torch.Tensor, batch: Mapping[str, Any], num_sources: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`per_source_losses` as two ``[num_sources]`` tensors: loss sums and target counts, by ``source_idx``.

    What a training loop accumulates between logs (``PackedTrainer`` does): add them up step after
    step, reduce once over ranks when logging, divide.

    Example:
        >>> batch = {"labels": torch.tensor([[-100, 5, 6], [-100, 7, -100]]), "num_tokens": torch.tensor([3, 2]),
        ...          "source_idx": torch.tensor([1, 0])}
        >>> total, number = source_totals(torch.tensor([[1.0, 2.0, 0.0], [4.0, 0.0, 0.0]]), batch, 2)
        >>> total.tolist(), number.tolist()
        ([4.0, 3.0], [1, 2])
    """
    labels = batch["labels"]
    if token_losses.shape != labels.shape:
        raise ConfigError(f"token_losses has shape {tuple(token_losses.shape)}, the batch's labels "
                         f"{tuple(labels.shape)}; pass token_losses(logits, batch['labels'])")
    device = labels.device
    counts = batch["num_tokens"].to(device)
    sources = batch.get(SOURCE_KEY)
    sources = torch.zeros_like(counts) if sources is None else sources.to(device)
    R, T = labels.shape
    targets = torch.roll(labels != IGNORE_INDEX, -1, dims=1)  # the loss at i belongs to label i + 1
    targets[:, -1] = False
    if R == counts.shape[0]:  # padded: a row per pack
        pack = torch.arange(R, device=device)[:, None].expand(R, T)
    else:  # padding-free: the packs' real tokens back to back in one row
        ends = torch.cumsum(counts, 0)
        pack = torch.searchsorted(ends, torch.arange(1, T + 1, device=device)[None], right=True)
        pack = pack.clamp(max=counts.shape[0] - 1)
    owner = sources[pack][targets]
    k = num_sources
    if owner.numel() and int(owner.max()) >= k:
        raise ConfigError(f"the batch has source_idx {int(owner.max())} but the mixture has {k} sources; "
                         "pass the loader's source_names (or their number)")
    total = torch.zeros(k, dtype=token_losses.dtype, device=device).index_add(0, owner, token_losses[targets])
    return total, torch.bincount(owner, minlength=k)
