"""Gated DeltaNet (linear-attention) layers of a packed row, one sub-sample at a time.

Qwen3.5's linear-attention layers (MiniCPM-V 4.6's text model) carry a recurrent state along the row, and
transformers' CPU path ignores ``cu_seqlens``: in a pack, one sub-sample's state would leak into the next.
:func:`segment_linear_attention` runs each such layer once per segment, eager; under ``torch.compile``
(:func:`wdspack.models.compile.compile_decoder_layers`) :func:`traceable_linear_attention` splits the layer
instead: its per-token work traced on the whole rows, the per-segment core one custom op.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from .varlen import CU_SEQLENS_KEY, MAX_SEQLEN_KEY

__all__ = ["segment_linear_attention", "traceable_linear_attention"]


# ---- the text model's linear-attention layers, per sub-sample -----------------------------------


def _per_segment(forward: Any) -> Any:
    def run(hidden_states: torch.Tensor, cache: Any = None, attention_mask: Any = None, **kwargs: Any) -> Any:
        cu = kwargs.pop(CU_SEQLENS_KEY, None)
        kwargs.pop(MAX_SEQLEN_KEY, None)
        if cu is None or cache is not None:
            return forward(hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
        B, L, D = hidden_states.shape
        flat = hidden_states.reshape(1, B * L, D)
        # each segment alone, from a zero state: what the layer computes for that sub-sample run by itself
        outs = [forward(flat[:, a:b], cache=None, attention_mask=None, **kwargs)
                for a, b in itertools.pairwise(cu.tolist()) if b > a]
        return torch.cat(outs, dim=1).view(B, L, -1)

    run.wdspack_segmented = True  # type: ignore[attr-defined]
    return run


def segment_linear_attention(model: Any) -> int:
    """Make ``model``'s linear-attention layers (Qwen3.5's Gated DeltaNet: a causal convolution and a recurrent
    state along the sequence) start afresh at every sub-sample of a packed batch: given the batch's segment
    offsets (``wdspack_cu_seqlens``, which :func:`wdspack.model_inputs` passes), each layer runs once per segment.
    Without them (a plain forward, generation with a cache) the layers run as transformers wrote them. Idempotent;
    returns the layers changed.

    Example:
        >>> segment_linear_attention(model)  # doctest: +SKIP
        2
    """
    changed = 0
    for module in model.modules():
        if getattr(module, "layer_type", None) != "linear_attention":
            continue
        if not getattr(module.forward, "wdspack_segmented", False):
            module.forward = _per_segment(module.forward)
            changed += 1
    return changed


# ---- compiled: the layer's row work traced, the per-segment core one opaque op --------------------
#
#     traced (one graph for every pack)     in_proj_qkv/z/b/a on the whole [B, L] row, beta, g; the gated norm,
#                                           out_proj; the decoder layer around it (norms, residuals, MLP)
#     wdspack::gated_delta_segments (eager) per segment: the causal convolution, then the chunked gated delta
#                                           rule from a zero state (the layer's own functions); backward: their
#                                           autograd, run again


#: What a Qwen3.5 Gated DeltaNet holds, which :func:`traceable_linear_attention` splits (a layer laid out
#: otherwise, Qwen3-Next's fused ``in_proj_qkvz`` say, is refused).
_GATED_DELTANET = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "conv1d", "A_log", "dt_bias", "norm",
                   "out_proj")


def _segments_core(mixed_qkv: torch.Tensor, weight: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   cu: torch.Tensor, dims: Sequence[int], activation: str, source: str) -> torch.Tensor:
    """``[B, L, Hv, Dv]``: each segment of the flattened rows alone through the convolution and the delta rule of
    the modeling module ``source``, as transformers' forward runs them (no cache, no initial state)."""
    import sys

    code = sys.modules[source]
    key_dim, value_dim, head_k, head_v = dims
    B, L, C = mixed_qkv.shape
    flat, g, beta = mixed_qkv.reshape(1, B * L, C), g.reshape(1, B * L, -1), beta.reshape(1, B * L, -1)
    outs = []
    for a, b in itertools.pairwise(cu.tolist()):
        if b <= a:
            continue
        qkv = code.causal_conv1d_fn(flat[:, a:b].transpose(1, 2), weight, None, activation=activation).transpose(1, 2)
        q, k, v = torch.split(qkv, [key_dim, key_dim, value_dim], dim=-1)
        n = b - a
        out, _ = code.torch_chunk_gated_delta_rule(
            q.reshape(1, n, -1, head_k), k.reshape(1, n, -1, head_k), v.reshape(1, n, -1, head_v), g=g[:, a:b],
            beta=beta[:, a:b], initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=True)
        outs.append(out)
    return torch.cat(outs, dim=1).view(B, L, -1, head_v)


@torch.library.custom_op("wdspack::gated_delta_segments", mutates_args=())
def _segments_op(mixed_qkv: torch.Tensor, weight: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 cu: torch.Tensor, dims: list[int], activation: str, source: str) -> torch.Tensor:
    return _segments_core(mixed_qkv, weight, g, beta, cu, dims, activation, source)


@_segments_op.register_fake
def _(mixed_qkv: torch.Tensor, weight: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, cu: torch.Tensor,
      dims: list[int], activation: str, source: str) -> torch.Tensor:
    B, L, _ = mixed_qkv.shape
    return mixed_qkv.new_empty((B, L, dims[1] // dims[3], dims[3]))


@torch.library.custom_op("wdspack::gated_delta_segments_backward", mutates_args=())
def _segments_backward_op(grad: torch.Tensor, mixed_qkv: torch.Tensor, weight: torch.Tensor, g: torch.Tensor,
                          beta: torch.Tensor, cu: torch.Tensor, dims: list[int], activation: str,
                          source: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    def replay() -> tuple[torch.Tensor, ...]:
        with torch.enable_grad():
            x, w, decay, gate = (t.detach().requires_grad_() for t in (mixed_qkv, weight, g, beta))
            out = _segments_core(x, w, decay, gate, cu, dims, activation, source)
            return torch.autograd.grad(out, (x, w, decay, gate), grad)

    # autograd is off for this thread inside an op (a thread-local dispatch setting): replay in a thread of its own
    with ThreadPoolExecutor(max_workers=1) as pool:
        d_qkv, d_weight, d_g, d_beta = pool.submit(replay).result()
    return d_qkv, d_weight, d_g, d_beta


@_segments_backward_op.register_fake
def _(grad: torch.Tensor, mixed_qkv: torch.Tensor, weight: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
      *args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(mixed_qkv), torch.empty_like(weight), torch.empty_like(g), torch.empty_like(beta)


def _segments_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs[:5])
    ctx.rest = inputs[5:]


def _segments_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    return (*_segments_backward_op(grad, *ctx.saved_tensors, *ctx.rest), None, None, None, None)


_segments_op.register_autograd(_segments_backward, setup_context=_segments_setup)


def _row_forward(self: Any, hidden_states: torch.Tensor, cache: Any = None, attention_mask: Any = None,
                 **kwargs: Any) -> torch.Tensor:
    """Qwen3.5's ``Qwen3_5GatedDeltaNet.forward`` without a cache, its per-token work on the whole rows and its
    per-segment core (``wdspack_cu_seqlens``) one op; without the segments or with a cache, the layer's own."""
    cu = kwargs.pop(CU_SEQLENS_KEY, None)
    kwargs.pop(MAX_SEQLEN_KEY, None)
    if cu is None or cache is not None:
        return type(self).forward(self, hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
    B, L, _ = hidden_states.shape
    mixed_qkv = self.in_proj_qkv(hidden_states)
    z = self.in_proj_z(hidden_states).reshape(-1, self.head_v_dim)
    beta = self.in_proj_b(hidden_states).sigmoid()
    g = -self.A_log.float().exp() * torch.nn.functional.softplus(self.in_proj_a(hidden_states).float() + self.dt_bias)
    core = _segments_op(mixed_qkv, self.conv1d.weight.squeeze(1), g, beta, cu,
                        [self.key_dim, self.value_dim, self.head_k_dim, self.head_v_dim], str(self.activation),
                        type(self).__module__)
    out = self.norm(core.reshape(-1, self.head_v_dim), z).reshape(B, L, -1)
    return self.out_proj(out)


_row_forward.wdspack_segmented = True  # type: ignore[attr-defined]  # segment_linear_attention leaves it
_row_forward.wdspack_traceable = True  # type: ignore[attr-defined]


def traceable_linear_attention(model: Any) -> list[str]:
    """Make ``model``'s linear-attention layers traceable by ``torch.compile`` with no graph break and one graph for
    every pack (:func:`wdspack.models.compile.compile_decoder_layers` calls it): the per-token work (the input
    projections, beta and the decay ``g``, the gated norm, ``out_proj``) runs on the whole ``[B, L]`` rows, which
    have the same shape every step; the per-segment core (each sub-sample's causal convolution and gated delta rule
    from a zero state, a Python loop over the pack's segments) is the custom op ``wdspack::gated_delta_segments``,
    which dynamo traces without entering and which runs eager, its backward their autograd run again. Given no
    ``wdspack_cu_seqlens`` (a plain forward) or a cache the layers run as transformers wrote them. Idempotent.

    Returns:
        The class names of the linear-attention modules it cannot split (laid out otherwise than Qwen3.5's Gated
        DeltaNet, or with a convolution bias); given any, no layer is changed (the caller refuses the model).

    Example:
        >>> traceable_linear_attention(model)  # doctest: +SKIP
        []
    """
    import types

    linear = [m for m in model.modules() if getattr(m, "layer_type", None) == "linear_attention"]
    refused = sorted({type(m).__name__ for m in linear
                      if not all(hasattr(m, name) for name in _GATED_DELTANET) or m.conv1d.bias is not None})
    if refused:
        return refused
    for module in linear:
        if not getattr(module.forward, "wdspack_traceable", False):
            module.forward = types.MethodType(_row_forward, module)
    return []
