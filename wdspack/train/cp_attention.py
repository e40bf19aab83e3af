"""Attention across context-parallel ranks for transformers models, and the step that feeds it.

:func:`use_cp_attention` registers :data:`CP_ATTENTION` with ``transformers.AttentionInterface`` and
sets it on the text stack; inside :func:`context_parallel` the text model runs on this rank's share
(:mod:`wdspack.train.cp`), taken from its input embeddings after the encoders' features are merged.
Each layer all-gathers keys and values over the CP group (backward: reduce-scatter of their
gradients) and every query sees its own segment's keys causally, by their padded positions::

    rank r: q [1, H, n, D]   k, v [1, Hkv, n, D] ─all-gather─► [1, Hkv, cp·n, D]  (rank after rank)
    SDPA path:   mask [n, cp·n]: same segment and key offset <= query offset (and within a sliding window)
                 SDPA(q, k, v, mask) ─► [1, n, H, D]
    varlen path: each of the rank's two chunks of a segment is a query sequence over its segment's keys up
                 to the chunk's end (CPLayout.varlen: cu_seqlens_q ≠ cu_seqlens_k, causal bottom-right)
                 kernel(q [n, H, D], k [Σ prefixes, Hkv, D], v, cu_q, cu_k, ...) ─► [1, n, H, D]

:func:`cp_attention` runs the varlen path on PyTorch's varlen FlashAttention kernel for CUDA queries in
bfloat16/float16 (:func:`auto_kernel`), the SDPA path elsewhere; ``use_cp_attention(model, kernel=...)``
runs the varlen path over any kernel of ``varlen_attn``'s signature (``reference_varlen_attn`` on CPU).

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
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..models.varlen import Kernel, _check_half_on_cuda, torch_varlen_kernel
from .cp import CPLayout, CPShare, cp_shard

__all__ = ["CP_ATTENTION", "CP_LAYOUT_KEY", "all_gather_sequence", "all_reduce_gradients", "attend_gathered",
           "auto_kernel", "context_parallel", "cp_attention", "cp_varlen_attention", "use_cp_attention"]

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


def attend_gathered(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, layout: CPLayout,
                    scale: float | None = None, window: int | None = None,
                    kernel: Kernel | None = None) -> torch.Tensor:
    """This rank's attention output ``[1, n, H, D]`` from its queries ``[1, H, n, D]`` and every rank's keys
    and values ``[1, Hkv, N_pad, D]`` (all-gathered: rank after rank, ``layout.all_index``'s order).

    Without ``kernel``: SDPA with ``layout.mask`` (``[n, N_pad]``, any device and dtype). With one (``varlen_attn``'s
    signature): each of this rank's two chunks of every segment is a query sequence attending to its key
    prefix (``layout.varlen``; ``cu_seqlens_q`` ≠ ``cu_seqlens_k``, bottom-right-aligned causal), one kernel
    call and no ``[n, N_pad]`` mask. Both give every query its own segment's keys, causally, within ``window``.
    """
    if kernel is None:
        mask = layout.mask(window, device=query.device)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale,
                                             enable_gqa=key.shape[1] != query.shape[1])
        return out.transpose(1, 2).contiguous()
    plan = layout.varlen(query.device)
    q = query[0].transpose(0, 1).contiguous()  # [n, H, D]
    k, v = (t[0].transpose(0, 1).index_select(0, plan.key_index) for t in (key, value))  # [Σ prefixes, Hkv, D]
    extra = {"enable_gqa": k.shape[1] != q.shape[1]} if _takes_gqa(kernel) else {}
    out = kernel(q, k, v, plan.cu_seqlens_q, plan.cu_seqlens_k, plan.max_seqlen_q, plan.max_seqlen_k, scale=scale,
                 window_size=(-1, 0) if window is None else (int(window) - 1, 0), **extra)
    return out[None]


def auto_kernel(query: torch.Tensor) -> Kernel | None:
    """The kernel :func:`cp_attention` runs for ``query``: PyTorch's varlen FlashAttention kernel for a CUDA query in
    bfloat16/float16 where this torch has it, else ``None`` (SDPA with the mask). Reads no tensor: no host sync."""
    if query.device.type != "cuda" or query.dtype not in (torch.bfloat16, torch.float16):
        return None
    return _torch_kernel()


@functools.cache
def _torch_kernel() -> Kernel | None:
    try:
        return torch_varlen_kernel()
    except ConfigError:
        return None


@functools.cache
def _takes_gqa(kernel: Kernel) -> bool:
    return "enable_gqa" in inspect.signature(kernel).parameters


def _check_call(module: Any, query: torch.Tensor, layout: CPLayout | None, *, name: str, dropout: float,
                softcap: float | None, is_causal: bool | None, s_aux: torch.Tensor | None) -> CPLayout:
    layer = type(module).__name__
    if layout is None:
        raise ConfigError(f"{layer} runs attn_implementation {name!r} outside a CP step: call the model "
                          "inside `with wdspack.train.cp_attention.context_parallel(model, layout):`")
    if dropout and module.training:
        raise ConfigError(f"{layer}: attention dropout {dropout} while training is not supported by {name!r}; "
                          "set the config's attention_dropout to 0.0")
    if softcap is not None or s_aux is not None:
        raise ConfigError(f"{layer} uses {'logit soft-capping' if softcap is not None else 'attention sinks'}, "
                          f"which {name!r} does not compute")
    if not (is_causal if is_causal is not None else getattr(module, "is_causal", True)):
        raise ConfigError(f"{layer} is not causal; {name!r} serves causal text layers only")
    if query.shape[0] != 1 or query.shape[2] != layout.index.numel():
        raise ConfigError(f"{layer}: a query of {tuple(query.shape)} ([B, H, n, D]), but this rank's share holds "
                          f"{layout.index.numel()} tokens in one row: run the model inside context_parallel")
    return layout


def _gather(key: torch.Tensor, value: torch.Tensor, layout: CPLayout) -> tuple[torch.Tensor, torch.Tensor]:
    if layout.cp == 1:
        return key, value
    if key.shape == value.shape:
        key, value = all_gather_sequence(torch.stack([key, value]), layout.group).unbind(0)
        return key, value
    return all_gather_sequence(key, layout.group), all_gather_sequence(value, layout.group)


def cp_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: Any = None, dropout: float = 0.0, scaling: float | None = None,
                 sliding_window: int | None = None, softcap: float | None = None, is_causal: bool | None = None,
                 s_aux: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The transformers attention function of :data:`CP_ATTENTION`: ``query`` ``[1, H, n, D]`` of this
    rank's tokens, keys and values gathered from every CP rank, each query's segment causal mask; returns
    ``([1, n, H, D], None)``. On CUDA in bfloat16/float16 it runs PyTorch's varlen kernel (:func:`auto_kernel`),
    elsewhere SDPA with the mask (:func:`attend_gathered`)."""
    layout = _check_call(module, query, kwargs.get(CP_LAYOUT_KEY), name=CP_ATTENTION, dropout=dropout,
                         softcap=softcap, is_causal=is_causal, s_aux=s_aux)
    key, value = _gather(key, value, layout)
    return attend_gathered(query, key, value, layout=layout, scale=scaling,
                           window=None if sliding_window is None else int(sliding_window),
                           kernel=auto_kernel(query)), None


def cp_varlen_attention(kernel: Kernel | None = None) -> Callable[..., tuple[torch.Tensor, None]]:
    """:func:`cp_attention` always on the varlen path, over ``kernel`` (default: PyTorch's ``varlen_attn``,
    checked for CUDA and half precision at each call; ``reference_varlen_attn`` runs it anywhere)."""
    checked = kernel is None
    run = torch_varlen_kernel() if kernel is None else kernel
    name = f"{CP_ATTENTION}_varlen" + ("" if kernel is None else f"_{getattr(kernel, '__name__', 'kernel')}")

    def attend(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: Any = None, dropout: float = 0.0, scaling: float | None = None,
               sliding_window: int | None = None, softcap: float | None = None, is_causal: bool | None = None,
               s_aux: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
        layout = _check_call(module, query, kwargs.get(CP_LAYOUT_KEY), name=name, dropout=dropout,
                             softcap=softcap, is_causal=is_causal, s_aux=s_aux)
        if checked:
            _check_half_on_cuda(query)
        key, value = _gather(key, value, layout)
        return attend_gathered(query, key, value, layout=layout, scale=scaling,
                               window=None if sliding_window is None else int(sliding_window), kernel=run), None

    attend.__name__ = name
    return attend


def use_cp_attention(model: Any, *, kernel: Kernel | None = None) -> str:
    """Register :data:`CP_ATTENTION` with transformers and set it on ``model``'s text stack (the vision
    and audio towers keep theirs: they run on whole images before the split).

    Args:
        model: a transformers model of a family wdspack feeds.
        kernel: run the varlen path over this kernel always (``varlen_attn``'s signature;
            ``wdspack.models.varlen.reference_varlen_attn`` on CPU). Default: :func:`cp_attention`, which
            takes PyTorch's varlen kernel on CUDA in bfloat16/float16 and SDPA with a mask elsewhere.

    Returns:
        The implementation's name: ``"wdspack_cp"``, or with a ``kernel`` ``"wdspack_cp_varlen_"`` + its ``__name__``.

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
    fn = cp_attention if kernel is None else cp_varlen_attention(kernel)
    name = CP_ATTENTION if kernel is None else fn.__name__
    AttentionInterface.register(name, fn)
    key = _text_config_key(model.config)
    model.set_attn_implementation(name if key is None else {key: name})
    return name


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
    if not str(getattr(text, "_attn_implementation", None)).startswith(CP_ATTENTION):
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
