"""The LM head and the loss on the target positions only: ``model_inputs(batch, model, logits="targets")``.

A VLM computes its LM head over every position, then the loss in float32 over the whole vocabulary, and
keeps the positions whose next token is a target. Image tokens, prompts and system turns are never
targets, and in a VLM they are most of a pack (576 image tokens per LLaVA-1.5 image, hundreds per Qwen-VL
image). With ``logits="targets"`` the model computes the head and the loss only where the next token
is trained::

    labels        -100 -100  A    B   -100  C    D
    position       0    1    2    3    4    5    6
    next is a target:    [1]  [2]           [4]  [5]          (position 6 has no next token)
    logits_to_keep = [1, 2, 4, 5]       shift_labels = [[A, B, C, D]]

transformers' causal-LM heads take both: ``logits_to_keep`` (a tensor of positions) slices the hidden
states before the head, and the loss function uses ``shift_labels`` as given instead of shifting
``labels`` itself. The loss is the same mean over the same targets, and so are the gradients (to float
rounding: the terms are summed in another order); ``outputs.logits`` holds the kept positions only.

Positions are worked out on the host from the batch's CPU labels (the loader's): no host-device sync.
The batch must be one row (``padding_free=True``, or ``batch_size=1``): ``logits_to_keep`` picks the same
positions in every row.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import ConfigError

__all__ = ["LOGITS", "target_logits_kwargs"]

#: What ``model_inputs(..., logits=...)`` takes: every position (the model's own default) or the targets'.
LOGITS = ("all", "targets")

#: The label of an untrained position (transformers' ``ignore_index``, the loader's ``IGNORE_INDEX``).
IGNORE_INDEX = -100


def target_logits_kwargs(batch: Mapping[str, Any], model: Any) -> dict[str, torch.Tensor]:
    """``logits_to_keep`` (the positions whose next token is a target) and ``shift_labels`` (those targets,
    ``[1, K]``) for a one-row batch, on the labels' device (the loader's: the CPU).

    Raises:
        ConfigError: the batch has several rows, or the model's ``forward`` takes no ``logits_to_keep``;
            the message names the fix.

    Example:
        >>> labels = torch.tensor([[-100, -100, 7, 8, -100, 9, 10]])
        >>> class Head(torch.nn.Module):
        ...     def forward(self, input_ids=None, labels=None, logits_to_keep=0, **kwargs): ...
        >>> kw = target_logits_kwargs({"labels": labels}, Head())
        >>> kw["logits_to_keep"].tolist(), kw["shift_labels"].tolist()
        ([1, 2, 4, 5], [[7, 8, 9, 10]])
    """
    labels = batch["labels"]
    if labels.ndim != 2 or labels.shape[0] != 1:
        raise ConfigError(f"logits='targets' needs a batch of one row; this one has labels of shape "
                          f"{tuple(labels.shape)}: make_loader(..., padding_free=True) puts a batch's packs in one "
                          "row (or use batch_size=1), or pass logits='all'")
    forward = getattr(getattr(model, "_orig_mod", model), "forward", None)  # torch.compile's wrapper takes *args
    try:
        takes = forward is not None and "logits_to_keep" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        takes = False
    if not takes:
        raise ConfigError(f"{type(model).__name__}.forward takes no logits_to_keep (transformers' causal-LM heads "
                          "take it), so it cannot compute its logits on the target positions alone: pass "
                          "logits='all'")
    following = labels[0, 1:]
    keep = torch.nonzero(following != IGNORE_INDEX).flatten()
    return {"logits_to_keep": keep, "shift_labels": following[keep].unsqueeze(0)}
