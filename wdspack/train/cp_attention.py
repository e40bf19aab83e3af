"""Attention across context-parallel ranks for transformers models, and the step that feeds it.

:func:`use_cp_attention` registers :data:`CP_ATTENTION` with ``transformers.AttentionInterface`` and
sets it on the text stack; inside :func:`context_parallel` the text model runs on this rank's share
(:mod:`wdspack.train.cp`), taken from its input embeddings after the encoders' features are merged.
Each layer all-gathers keys and values over the CP group (backward: reduce-scatter of their
gradients) and every query sees its own segment's keys causally, by their padded positions::

    rank r: q [1, H, n, D]   k, v [1, Hkv, n, D] ─all-gather─► [1, Hkv, cp·n, D]  (rank after rank)
    mask [n, cp·n]: same segment and key offset <= query offset (and within a sliding window)
    SDPA(q, k, v, mask) ─► [1, n, H, D]

The step (``cp_layout`` from :mod:`wdspack.train.cp`)::

    layout = cp_layout(batch["cu_seqlens"], cp=cp, rank=cp_rank, group=cp_group, cu_seqlens=True)
    kwargs = wdspack.model_inputs(batch, model)                  # its labels stay with the CP step
    with context_parallel(model, layout) as share:
        logits = model(**kwargs).logits                        # [1, n, V]: this rank's tokens
    loss = F.cross_entropy(logits[0], share.labels[0], ignore_index=-100, reduction="sum") / n_items

Refused with the fix: attention dropout while training, logit soft-capping, attention sinks and
non-causal text layers (Gemma 3's bidirectional image spans: ``Family.no_varlen``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from .cp import CPLayout, CPShare, cp_shard

__all__ = ["CP_ATTENTION", "CP_LAYOUT_KEY", "all_gather_sequence", "all_reduce_gradients", "context_parallel",
           "cp_attention", "use_cp_attention"]

#: The name :func:`use_cp_attention` registers with ``transformers.AttentionInterface``.
CP_ATTENTION = "wdspack_cp"

#: The keyword argument that carries the :class:`~wdspack.train.cp.CPLayout` to every attention layer.
CP_LAYOUT_KEY = "wdspack_cp_layout"


class _GatherSequence(torch.autograd.Function):
    """All-gather along the sequence dim (``-2``), rank after rank; backward: each rank's slice of the
    gradient summed over the group (reduce-scatter; all-reduce and slice on gloo, which has no reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        dist = torch.distributed
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        dist = torch.distributed
        world, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        grad = grad.contiguous()
        if dist.get_backend(ctx.group) == "gloo":
            dist.all_reduce(grad, group=ctx.group)
            return grad.chunk(world, dim=-2)[rank].contiguous(), None
        parts = [p.contiguous() for p in grad.chunk(world, dim=-2)]
        out = torch.empty_like(parts[rank])
        dist.reduce_scatter(out, parts, group=ctx.group)
        return out, None


class _SumGradient(torch.autograd.Function):
    """Identity forward; backward: the gradient summed over the group and divided by its size, so every rank
    backpropagates the whole batch's gradient into the encoders (the same rounding as one process: the models'
    float32 norms round a sum once, not each rank's part; 1/cp is exact for a power of two)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        dist = torch.distributed
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad / dist.get_world_size(ctx.group), None


def all_gather_sequence(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """``x`` ``[..., n, D]`` of every rank of ``group``, concatenated along ``n`` in rank order; its
    gradient is summed back to each rank's slice. Without a group of more than one rank: ``x``."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return x
    return _GatherSequence.apply(x, group)


def cp_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: Any = None, dropout: float = 0.0, scaling: float | None = None,
                 sliding_window: int | None = None, softcap: float | None = None, is_causal: bool | None = None,
                 s_aux: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The transformers attention function of :data:`CP_ATTENTION`: ``query`` ``[1, H, n, D]`` of this
    rank's tokens, keys and values gathered from every CP rank, each query's segment causal mask; returns
    ``([1, n, H, D], None)``."""
    layout: CPLayout | None = kwargs.get(CP_LAYOUT_KEY)
    layer = type(module).__name__
    if layout is None:
        raise ConfigError(f"{layer} runs attn_implementation {CP_ATTENTION!r} outside a CP step: call the model "
                          "inside `with wdspack.train.cp_attention.context_parallel(model, layout):`")
    if dropout and module.training:
        raise ConfigError(f"{layer}: attention dropout {dropout} while training is not supported by {CP_ATTENTION!r}; "
                          "set the config's attention_dropout to 0.0")
    if softcap is not None or s_aux is not None:
        raise ConfigError(f"{layer} uses {'logit soft-capping' if softcap is not None else 'attention sinks'}, "
                          f"which {CP_ATTENTION!r} does not compute")
    if not (is_causal if is_causal is not None else getattr(module, "is_causal", True)):
        raise ConfigError(f"{layer} is not causal; {CP_ATTENTION!r} serves causal text layers only")
    if query.shape[0] != 1 or query.shape[2] != layout.index.numel():
        raise ConfigError(f"{layer}: a query of {tuple(query.shape)} ([B, H, n, D]), but this rank's share holds "
                          f"{layout.index.numel()} tokens in one row: run the model inside context_parallel")
    if layout.cp == 1:
        pass
    elif key.shape == value.shape:
        key, value = all_gather_sequence(torch.stack([key, value]), layout.group).unbind(0)
    else:
        key, value = all_gather_sequence(key, layout.group), all_gather_sequence(value, layout.group)
    mask = layout.mask(None if sliding_window is None else int(sliding_window), device=query.device)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling,
                                         enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def use_cp_attention(model: Any) -> str:
    """Register :data:`CP_ATTENTION` with transformers and set it on ``model``'s text stack (the vision
    and audio towers keep theirs: they run on whole images before the split).

    Raises:
        ConfigError: the family's text masks are not block-causal (Gemma 3); the message says why.
    """
    from transformers import AttentionInterface

    from ..models import known_families
    from ..models.varlen import _text_config_key

    refusal = next((f.no_varlen for f in known_families() if model.config.model_type in f.model_types and f.no_varlen),
                   "")
    if refusal:
        raise ConfigError(f"{CP_ATTENTION!r} cannot train {model.config.model_type}: {refusal}")
    AttentionInterface.register(CP_ATTENTION, cp_attention)
    key = _text_config_key(model.config)
    model.set_attn_implementation(CP_ATTENTION if key is None else {key: CP_ATTENTION})
    return CP_ATTENTION


def _text_model(model: Any) -> Any:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    if decoder is model or not hasattr(decoder, "forward"):
        raise ConfigError(f"cannot find the text model of {type(model).__name__} (model.get_decoder()) to split")
    return decoder


@contextlib.contextmanager
def context_parallel(model: Any, layout: CPLayout, *, labels: torch.Tensor | None = None) -> Iterator[CPShare]:
    """Inside, ``model``'s text model runs on this rank's share of its inputs: its input embeddings (the
    encoders' features merged) and positions are split by ``layout`` as they enter it, so the model's
    logits are this rank's ``[1, n, V]``. Yields a :class:`~wdspack.train.cp.CPShare` whose ``labels`` are
    the shifted targets of those tokens (of ``labels``, else of the batch's ``labels`` given to the model,
    which then computes no loss of its own) and whose tensors are filled at the forward.

    In the backward, the gradient of the whole batch's input embeddings is summed over the CP group and
    divided by ``cp``: every rank backpropagates the same gradient into the vision/audio encoders and the
    embedding table, so after :func:`all_reduce_gradients` they hold what one process computes (to the bit
    for a power-of-two ``cp``: the models' float32 norms otherwise round each rank's part apart, ~1e-8).

    Raises:
        ConfigError: the text stack does not run :data:`CP_ATTENTION` (call :func:`use_cp_attention`).
    """
    text = model.config.get_text_config()
    if getattr(text, "_attn_implementation", None) != CP_ATTENTION:
        raise ConfigError(f"the text stack runs {getattr(text, '_attn_implementation', None)!r}, not "
                          f"{CP_ATTENTION!r}: call wdspack.train.cp_attention.use_cp_attention(model) once before "
                          "the CP steps")
    decoder = _text_model(model)
    shares: list[CPShare] = []
    proxy = _ShareProxy(shares, labels)

    def model_pre(module: Any, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if kwargs.get("labels") is not None:  # the model's own loss would meet n logits and N labels
            if proxy._labels is None:
                proxy._labels = kwargs["labels"]
            kwargs = {**kwargs, "labels": None}
        return args, kwargs

    def text_pre(module: Any, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        embeds = kwargs.get("inputs_embeds")
        if embeds is None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            embeds = module.get_input_embeddings()(ids)
        if layout.cp > 1 and embeds.requires_grad:
            embeds = _SumGradient.apply(embeds, layout.group)
        share = cp_shard(inputs_embeds=embeds, layout=layout, position_ids=kwargs.get("position_ids"),
                         labels=proxy._labels)
        shares.append(share)
        kwargs = {**kwargs, "input_ids": None, "inputs_embeds": share.inputs_embeds,
                  "position_ids": share.position_ids, "attention_mask": None, CP_LAYOUT_KEY: layout}
        return (), kwargs

    handles = [model.register_forward_pre_hook(model_pre, with_kwargs=True),
               decoder.register_forward_pre_hook(text_pre, with_kwargs=True)]
    try:
        yield proxy  # type: ignore[misc]
    finally:
        for h in handles:
            h.remove()


class _ShareProxy:
    """The :class:`CPShare` of the forward run inside :func:`context_parallel` (filled when it runs)."""

    def __init__(self, shares: list[CPShare], labels: torch.Tensor | None) -> None:
        self._shares, self._labels = shares, labels

    def __getattr__(self, name: str) -> Any:
        shares = self.__dict__["_shares"]
        if not shares:
            raise ConfigError("the CP share is filled by the model's forward: run the model inside "
                              "context_parallel first")
        return getattr(shares[-1], name)


def all_reduce_gradients(model: Any, group: Any = None) -> None:
    """Sum every parameter's gradient over ``group`` (the CP ranks, or DP × CP), in place; a parameter
    without one on this rank takes part with zeros."""
    dist = torch.distributed
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, group=group)
