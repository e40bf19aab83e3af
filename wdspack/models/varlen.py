"""Padding-free attention with no extra package: PyTorch's own varlen FlashAttention kernel
(``torch.nn.attention.varlen.varlen_attn``) as a transformers attention implementation.

:func:`use_varlen_attention` registers :data:`VARLEN_ATTENTION` with ``transformers.AttentionInterface``
and sets it on the model's text stack; from then on :func:`wdspack.model_inputs` hands every decoder
layer the batch's own segment offsets. Vision towers that attend within images by offsets of their
own (Qwen2-VL, Qwen2.5-VL, Qwen3-VL: transformers runs their FlashAttention path on ``cu_seqlens``,
every other implementation one attention call per image or window, each with a host sync) run
:data:`VARLEN_VISION_ATTENTION` too: one kernel call per layer, bidirectional within each span.
Other towers (CLIP, SigLIP, Pixtral) keep their implementation. A packed batch
is flattened to one row of tokens and each segment (a sub-sample, or a pack's padding tail) attends
only to itself, causally::

    batch (B = 2, L = 5)       <s> A  B </s> <pad> | <s> C </s> <s> D
    flattened [B·L]             0  1  2  3    4    |  5  6  7    8  9
    cu_seqlens                 [0, 4, 5, 8, 10]      (the loader's, int32 on the device)
    max_seqlen                 4                     (a Python int: no host-device sync per layer)
    query per layer            [B, H, L, D] ─► [B·L, H, D] ─► varlen_attn(..., window_size=(-1, 0))

Both of the loader's layouts work: ``[B, L]`` rows (``cu_seqlens`` covers the padding tails) and
``padding_free=True`` (``[1, N]``). The mask builders of transformers build nothing for this
implementation (no ``[B, 1, L, L]`` mask per step).

What reaches the kernel, per layer: ``scale`` = the layer's ``scaling``; ``window_size`` ``(-1, 0)``
(causal), or ``(W - 1, 0)`` for a layer with ``sliding_window = W`` (the key window transformers'
own masks and its FlashAttention-2 path use: the token itself and ``W - 1`` before it); grouped-query
key/value heads as they are (``enable_gqa`` where the kernel takes it).

Not expressible, refused with the fix: layers with dropout while training, logit soft-capping,
attention sinks, non-causal (bidirectional) text layers, and families whose masks are not
block-causal (Gemma 3's bidirectional image spans: ``Family.no_varlen``). The kernel runs on CUDA
in bfloat16/float16 only; elsewhere the attention raises naming the fix. For tests on CPU, pass
``kernel=reference_varlen_attn`` (the same computation per segment with SDPA).
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import ConfigError

__all__ = ["VARLEN_ATTENTION", "VARLEN_VISION_ATTENTION", "is_varlen", "reference_varlen_attn", "use_varlen_attention",
           "varlen_attention", "varlen_kwargs", "varlen_vision_attention"]

#: The name :func:`use_varlen_attention` registers with ``transformers.AttentionInterface`` (with a
#: custom ``kernel``: this name plus ``_`` and the kernel's ``__name__``).
VARLEN_ATTENTION = "wdspack_varlen"

#: The vision towers' implementation. The name holds "flash": transformers sends a tower down its
#: ``cu_seqlens`` path when its config's implementation name does (``is_flash_attention_requested``).
VARLEN_VISION_ATTENTION = "wdspack_flash_varlen_vision"

#: The forward keyword arguments that carry the batch's segments to every attention layer.
CU_SEQLENS_KEY, MAX_SEQLEN_KEY = "wdspack_cu_seqlens", "wdspack_max_seqlen"

#: A kernel: ``(q [T, H, D], k [T, Hkv, D], v, cu_q, cu_k, max_q, max_k, *, scale, window_size,
#: enable_gqa) -> [T, H, D]`` (the signature of ``torch.nn.attention.varlen.varlen_attn``).
Kernel = Callable[..., torch.Tensor]


def torch_varlen_kernel() -> Kernel:
    """``torch.nn.attention.varlen.varlen_attn``.

    Raises:
        ConfigError: this torch build has none; the message names the torch version and the fix.
    """
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        raise ConfigError(f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn (PyTorch's "
                          f"FlashAttention varlen kernel, torch >= 2.10): upgrade torch, or train padding-free with "
                          f"attn_implementation='flash_attention_2' (the flash_attn package) or packed rows with "
                          f"'sdpa' / 'flex_attention'") from None
    return varlen_attn  # type: ignore[return-value]  # returns a tensor unless return_aux is asked for


def reference_varlen_attn(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_q: torch.Tensor,
                          cu_seq_k: torch.Tensor, max_q: int, max_k: int, *, scale: float | None = None,
                          window_size: tuple[int, int] = (-1, -1), enable_gqa: bool = False) -> torch.Tensor:
    """What the varlen kernel computes, segment by segment with SDPA, on any device and dtype (slow:
    it reads ``cu_seq_q`` on the host). The ``kernel=`` of :func:`use_varlen_attention` for CPU tests.

    ``window_size`` ``(left, right)``: query ``i`` sees keys ``i - left .. i + right`` of its own
    segment (``-1``: unbounded); ``(-1, 0)`` is causal. Where a segment has more keys than queries
    (``cu_seq_k`` ≠ ``cu_seq_q``: queries that attend to a longer key prefix, as context parallelism's
    chunks do), the window is aligned bottom-right as FlashAttention aligns it: the segment's last query
    is its last key's position, query ``i`` of ``n_q`` stands at key position ``i + n_k - n_q``. A query
    that sees no key gets zeros.

    Example:
        >>> q = torch.randn(5, 2, 4); cu = torch.tensor([0, 3, 5], dtype=torch.int32)
        >>> out = reference_varlen_attn(q, q, q, cu, cu, 3, 3, window_size=(-1, 0))
        >>> torch.allclose(out[3], q[3])  # the first token of a segment sees only itself
        True
        >>> k = torch.randn(4, 2, 4); one, four = (torch.tensor([0, n], dtype=torch.int32) for n in (1, 4))
        >>> out = reference_varlen_attn(q[:1], k, k, one, four, 1, 4, window_size=(-1, 0))
        >>> torch.allclose(out, F.scaled_dot_product_attention(q[:1].transpose(0, 1), k.transpose(0, 1),
        ...                k.transpose(0, 1)).transpose(0, 1))  # the last query of its segment: every key
        True
    """
    if cu_seq_q.shape != cu_seq_k.shape:
        raise ConfigError(f"cu_seq_q holds {cu_seq_q.numel()} offsets and cu_seq_k {cu_seq_k.numel()}: one segment "
                          "of keys per segment of queries")
    out = torch.zeros_like(query)
    left, right = window_size
    same = cu_seq_k is cu_seq_q or torch.equal(cu_seq_q, cu_seq_k)
    bounds_k = cu_seq_q.tolist() if same else cu_seq_k.tolist()
    for (start, end), (k_start, k_end) in zip(itertools.pairwise(cu_seq_q.tolist()), itertools.pairwise(bounds_k)):
        if end <= start:
            continue
        pos = torch.arange(end - start, device=query.device)
        k_pos = pos if same else torch.arange(k_end - k_start, device=query.device) - (k_end - k_start - (end - start))
        diff = k_pos[None, :] - pos[:, None]  # key - query
        allowed = torch.ones_like(diff, dtype=torch.bool)
        if right >= 0:
            allowed &= diff <= right
        if left >= 0:
            allowed &= diff >= -left
        q = query[start:end].transpose(0, 1)  # [H, n, D]
        k, v = (t[k_start:k_end].transpose(0, 1) for t in (key, value))
        if k.shape[0] != q.shape[0]:
            k, v = (t.repeat_interleave(q.shape[0] // t.shape[0], dim=0) for t in (k, v))
        seen = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale).transpose(0, 1)
        out[start:end] = seen if same else torch.where(allowed.any(dim=1)[:, None, None], seen, 0)
    return out


def _check_half_on_cuda(query: torch.Tensor) -> None:
    """What torch's kernel takes, checked without a host-device sync; the errors name the fix."""
    if query.dtype not in (torch.bfloat16, torch.float16):
        raise ConfigError(f"{VARLEN_ATTENTION!r} (FlashAttention) takes bfloat16 or float16, not "
                          f"{query.dtype}: model.to(torch.bfloat16) or run under "
                          "torch.autocast('cuda', dtype=torch.bfloat16)")
    if query.device.type != "cuda":
        raise ConfigError(f"{VARLEN_ATTENTION!r} runs on CUDA only (query on {query.device}): move the model "
                          "to a CUDA device, or use 'sdpa' on CPU")


def _flat_call(kernel: Kernel, takes_gqa: bool, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               cu: tuple[torch.Tensor, torch.Tensor], max_len: tuple[int, int], *, scale: float | None,
               window: tuple[int, int]) -> torch.Tensor:
    """``[B, H, L, D]`` query, key and value flattened to ``[B·L, H, D]`` through ``kernel``; ``[B, L, H, D]``."""
    B, H, L, D = query.shape
    q = query.transpose(1, 2).reshape(B * L, H, D)
    k = key.transpose(1, 2).reshape(B * L, key.shape[1], D)
    v = value.transpose(1, 2).reshape(B * L, value.shape[1], value.shape[-1])
    extra = {"enable_gqa": key.shape[1] != H} if takes_gqa else {}
    out = kernel(q, k, v, cu[0], cu[1], max_len[0], max_len[1], scale=scale, window_size=window, **extra)
    return out.view(B, L, H, out.shape[-1])


def varlen_attention(kernel: Kernel | None = None) -> Callable[..., tuple[torch.Tensor, None]]:
    """The transformers attention function over ``kernel`` (default: torch's ``varlen_attn``, checked
    for CUDA and half precision at each call, without a host-device sync).

    It takes ``(module, query [B, H, L, D], key [B, Hkv, L, D], value, attention_mask, *, dropout,
    scaling, sliding_window, **kwargs)`` as transformers calls it, reads the batch's segments from
    ``kwargs`` (put there by :func:`wdspack.model_inputs`) and returns ``([B, L, H, D], None)``.
    """
    checked = kernel is None
    if kernel is None:
        kernel = torch_varlen_kernel()
    takes_gqa = "enable_gqa" in inspect.signature(kernel).parameters

    def attend(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: Any = None, dropout: float = 0.0, scaling: float | None = None,
               sliding_window: int | None = None, softcap: float | None = None, is_causal: bool | None = None,
               s_aux: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
        cu_seqlens, max_seqlen = kwargs.get(CU_SEQLENS_KEY), kwargs.get(MAX_SEQLEN_KEY)
        layer = type(module).__name__
        if cu_seqlens is None or max_seqlen is None:
            raise ConfigError(f"{layer} runs attn_implementation {VARLEN_ATTENTION!r} without the batch's segments: "
                              "call the model with wdspack.model_inputs(batch, model) (it adds them), or pass "
                              f"{CU_SEQLENS_KEY}=batch['cu_seqlens'] and {MAX_SEQLEN_KEY}=batch['max_seqlen']")
        if dropout and module.training:
            raise ConfigError(f"{layer}: attention dropout {dropout} while training is not supported by "
                              f"{VARLEN_ATTENTION!r}; set the config's attention_dropout to 0.0 or use 'sdpa'")
        if softcap is not None or s_aux is not None:
            raise ConfigError(f"{layer} uses {'logit soft-capping' if softcap is not None else 'attention sinks'}, "
                              f"which {VARLEN_ATTENTION!r} does not compute; use 'eager' or 'flex_attention'")
        if not (is_causal if is_causal is not None else getattr(module, "is_causal", True)):
            raise ConfigError(f"{layer} is not causal; {VARLEN_ATTENTION!r} serves causal text layers only: set it on "
                              "the text stack (use_varlen_attention does) and keep the vision tower on 'sdpa'")
        if checked:
            _check_half_on_cuda(query)
        window = (-1, 0) if sliding_window is None else (int(sliding_window) - 1, 0)
        return _flat_call(kernel, takes_gqa, query, key, value, (cu_seqlens, cu_seqlens), (max_seqlen, max_seqlen),
                          scale=scaling, window=window), None

    attend.__name__ = f"{VARLEN_ATTENTION}_attention"
    return attend


def varlen_vision_attention(kernel: Kernel | None = None) -> Callable[..., tuple[torch.Tensor, None]]:
    """The attention function of a vision tower's FlashAttention path over ``kernel``: transformers calls
    it with ``query [1, H, T, D]`` and the tower's own ``cu_seq_lens_q``/``max_length_q`` (one span per
    image or window); every span attends to itself both ways (``window_size=(-1, -1)``)."""
    checked = kernel is None
    if kernel is None:
        kernel = torch_varlen_kernel()
    takes_gqa = "enable_gqa" in inspect.signature(kernel).parameters

    def attend(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: Any = None, dropout: float = 0.0, scaling: float | None = None,
               cu_seq_lens_q: torch.Tensor | None = None, cu_seq_lens_k: torch.Tensor | None = None,
               max_length_q: Any = None, max_length_k: Any = None, is_causal: bool | None = None,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
        layer = type(module).__name__
        if cu_seq_lens_q is None or max_length_q is None:
            raise ConfigError(f"{layer} runs {VARLEN_VISION_ATTENTION!r} without its cu_seqlens: only vision towers "
                              "that attend by offsets take it; set 'sdpa' on this one")
        if is_causal or (dropout and module.training):
            raise ConfigError(f"{layer}: {VARLEN_VISION_ATTENTION!r} computes bidirectional attention without "
                              f"dropout (got is_causal={is_causal}, dropout={dropout}); set 'sdpa' on this tower")
        if checked:
            _check_half_on_cuda(query)
        cu_q = cu_seq_lens_q.to(torch.int32)
        cu_k = cu_q if cu_seq_lens_k is None else cu_seq_lens_k.to(torch.int32)
        max_q = int(max_length_q)
        max_k = max_q if max_length_k is None else int(max_length_k)
        return _flat_call(kernel, takes_gqa, query, key, value, (cu_q, cu_k), (max_q, max_k), scale=scaling,
                          window=(-1, -1)), None

    attend.__name__ = f"{VARLEN_VISION_ATTENTION}_attention"
    return attend


def _offset_vision_configs(model: Any) -> list[Any]:
    """The configs of ``model``'s vision attention layers that run on ``cu_seqlens`` under FlashAttention
    (read from their ``forward``: the path transformers takes when the implementation name holds "flash")."""
    text = model.config.get_text_config()
    found: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is None or config is text or config is model.config or id(config) in found:
            continue
        if _attends_by_offsets(type(module)):
            found[id(config)] = config
    return list(found.values())


_OFFSET_CLASSES: dict[type, bool] = {}


def _attends_by_offsets(cls: type) -> bool:
    """Whether ``cls.forward`` takes ``cu_seqlens`` and passes them on under FlashAttention (read once per class)."""
    if cls not in _OFFSET_CLASSES:
        forward = getattr(cls, "forward", None)
        source = ""
        try:
            if forward is not None and "cu_seqlens" in inspect.signature(forward).parameters:
                source = inspect.getsource(forward)
        except (OSError, TypeError, ValueError):
            pass
        _OFFSET_CLASSES[cls] = "cu_seq_lens_q" in source and "is_flash_attention_requested" in source
    return _OFFSET_CLASSES[cls]


def _text_config_key(config: Any) -> str | None:
    text = config.get_text_config()
    if text is config:
        return None
    for key in getattr(config, "sub_configs", {}):
        if getattr(config, key, None) is text:
            return str(key)
    raise ConfigError(f"cannot find the text sub-config of {type(config).__name__} to set {VARLEN_ATTENTION!r} on")


def use_varlen_attention(model: Any, *, kernel: Kernel | None = None, vision: bool = True) -> str:
    """Train ``model``'s text stack padding-free on PyTorch's varlen FlashAttention kernel.

    Registers the attention function with transformers and sets it on the text config;
    :func:`wdspack.model_inputs` then adds the batch's ``cu_seqlens``/``max_seqlen``. Either loader
    layout works; ``make_loader(..., padding_free=True)`` drops the padding tokens. With ``vision``,
    a vision tower that attends by offsets (the Qwen-VL families) runs the same kernel, one call per
    layer instead of one per image or window (:data:`VARLEN_VISION_ATTENTION`).

    Args:
        model: a transformers model of a family wdspack feeds.
        kernel: the attention kernel, with ``varlen_attn``'s signature (default: torch's, CUDA and
            bf16/fp16 only). ``reference_varlen_attn`` runs the same computation anywhere (tests).
        vision: also the vision tower, where it attends by offsets (``False``: it keeps its own).

    Returns:
        The attention implementation's name (``"wdspack_varlen"``; with a ``kernel``, that name + ``_`` +
        the kernel's ``__name__``).

    Raises:
        ConfigError: torch has no varlen kernel, or the family's masks are not block-causal (Gemma 3);
            the message names what to use instead.

    Example:
        >>> model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.bfloat16).cuda()  # doctest: +SKIP
        >>> wdspack.use_varlen_attention(model)  # doctest: +SKIP
        'wdspack_varlen'
        >>> loss = model(**wdspack.model_inputs(batch, model)).loss  # doctest: +SKIP
    """
    from transformers import AttentionInterface

    from . import known_families

    refusal = next((f.no_varlen for f in known_families() if model.config.model_type in f.model_types and f.no_varlen),
                   "")
    if refusal:
        raise ConfigError(f"{VARLEN_ATTENTION!r} cannot train {model.config.model_type}: {refusal}")
    name = VARLEN_ATTENTION if kernel is None else f"{VARLEN_ATTENTION}_{getattr(kernel, '__name__', 'kernel')}"
    AttentionInterface.register(name, varlen_attention(kernel))
    key = _text_config_key(model.config)
    model.set_attn_implementation(name if key is None else {key: name})
    if vision:
        towers = _offset_vision_configs(model)
        if towers:
            vision_name = VARLEN_VISION_ATTENTION if kernel is None else f"{VARLEN_VISION_ATTENTION}_{name}"
            AttentionInterface.register(vision_name, varlen_vision_attention(kernel))
            for config in towers:  # set on the config, not through set_attn_implementation: that takes a
                config._attn_implementation = vision_name  # name holding "flash" for a hub kernel to load
    return name


def is_varlen(model: Any) -> bool:
    """Whether ``model``'s text stack runs :data:`VARLEN_ATTENTION` (set by :func:`use_varlen_attention`)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        return False
    return str(getattr(config.get_text_config(), "_attn_implementation", "")).startswith(VARLEN_ATTENTION)


def varlen_kwargs(batch: Any) -> dict[str, Any]:
    """The forward keyword arguments that carry a loader batch's segments to the attention layers.

    Raises:
        ConfigError: the batch has no ``cu_seqlens`` (it was not made by wdspack's loader).
    """
    if "cu_seqlens" not in batch or "max_seqlen" not in batch:
        raise ConfigError(f"{VARLEN_ATTENTION!r} needs the batch's 'cu_seqlens' and 'max_seqlen' (wdspack.make_loader "
                          f"yields them); this batch has keys {sorted(batch)}")
    return {CU_SEQLENS_KEY: batch["cu_seqlens"], MAX_SEQLEN_KEY: int(batch["max_seqlen"])}
