"""One compile for the run: ``torch.compile`` of the text stack's decoder layers, fed fixed-shape packs.

A packed batch's text side has the same shapes every step (``[B, L]`` rows, a ``[B, 1, L, L]`` mask or
padded ``cu_seqlens``), so the decoder layers compile once. What varies per pack stays outside them:
the vision tower (its patch rows and grid bookkeeping follow the pack's images) runs eager. The
layers see every forward keyword the model passes on, and the vision tower's precomputed
``image_*``/``video_*`` ones (:mod:`wdspack.models.vision_meta`) change shape with the images and
are absent from a text-only pack; :func:`compile_decoder_layers` drops them at the layer's door, so
dynamo does not guard on them. Under :func:`wdspack.use_varlen_attention` it also hands the layers the
row length as ``max_seqlen`` (an upper bound, as the kernel allows) instead of the pack's own, an int
that would recompile per value; :func:`traceable_kernel` makes a Python kernel (the CPU reference) a
custom op that dynamo traces without reading ``cu_seqlens``. Linear-attention layers (MiniCPM-V 4.6's Qwen3.5
Gated DeltaNet), which run once per sub-sample, are split first
(:func:`~wdspack.models.linear_attention.traceable_linear_attention`): their per-token work is traced on the
whole rows, their per-segment core (convolution and recurrence) is one custom op that runs eager.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from ..errors import ConfigError
from .linear_attention import traceable_linear_attention
from .varlen import MAX_SEQLEN_KEY, Kernel

__all__ = ["VISION_PREFIXES", "compile_decoder_layers", "decoder_layers", "traceable_kernel"]

#: Forward keywords of the vision towers' precomputed bookkeeping: no text layer reads them.
VISION_PREFIXES = ("image_", "video_")


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The text stack's decoder layers of a transformers VLM (``model.get_decoder().layers``).

    Raises:
        ConfigError: the model has no decoder with a ``layers`` list; the message names its class.
    """
    try:
        layers = model.get_decoder().layers
    except (AttributeError, ValueError):
        layers = None
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise ConfigError(f"{type(model).__name__} has no text decoder with a `layers` list (model.get_decoder()); "
                          "compile its layers yourself: torch.compile(layer.forward)")
    return list(layers)


def compile_decoder_layers(model: Any, **options: Any) -> Any:
    """Compile each text decoder layer of ``model`` (in place) with ``torch.compile(**options)``.

    Over an epoch of packs whose contents differ (text only, one image, several) the layers
    compile at the first step and never again: every layer is the same code with the same input shapes
    (one graph per kind of layer). The vision tower, the embeddings, the mask and the LM head stay eager.
    A model with linear-attention layers (MiniCPM-V 4.6) has them made traceable first
    (:func:`~wdspack.models.linear_attention.traceable_linear_attention`): compiled, the decoder layer
    around them and their per-token projections, gates, gated norm and ``out_proj`` on the whole rows; eager,
    inside one custom op, each sub-sample's causal convolution and gated delta rule. Loss and gradients are the
    eager model's (tests/models/test_compile.py). Calling it twice is refused; copy a model before, not after
    (a copy's layers would call the original's).

    Args:
        model: a transformers model of a family wdspack feeds, with the attention it will train with set.
        options: ``torch.compile``'s (``backend``, ``mode``, ``fullgraph``, ``dynamic``...).

    Returns:
        ``model``.

    Raises:
        ConfigError: a layer's forward already replaced, or linear-attention layers laid out otherwise than
            Qwen3.5's Gated DeltaNet (they would run whole once per sub-sample: train such a model eager).

    Example:
        >>> wdspack.models.compile.compile_decoder_layers(model, fullgraph=True)  # doctest: +SKIP
        >>> loss = model(**wdspack.model_inputs(batch, model)).loss  # doctest: +SKIP
    """
    layers = decoder_layers(model)
    for layer in layers:
        if "forward" in vars(layer):
            raise ConfigError(f"{type(layer).__name__}.forward is already replaced on this model "
                              "(compile_decoder_layers ran, or a hook library patched it); compile a fresh copy")
    refused = traceable_linear_attention(model)
    if refused:  # a pack's sub-samples each start the recurrence afresh: one run per segment, in Python
        raise ConfigError(f"{type(model).__name__} has linear-attention layers ({', '.join(refused)}) that run once "
                          "per sub-sample of a pack, and wdspack splits only Qwen3.5's Gated DeltaNet into traced "
                          "row work and an opaque per-segment core: compiled whole, they would recompile for each "
                          "new layout; train this model eager")
    for layer in layers:
        layer.forward = _without_vision_kwargs(torch.compile(layer.forward, **options))
    return model


def _without_vision_kwargs(forward: Callable[..., Any]) -> Callable[..., Any]:
    def call(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        kwargs = {k: v for k, v in kwargs.items() if not k.startswith(VISION_PREFIXES)}
        if MAX_SEQLEN_KEY in kwargs:  # a segment never crosses a row: the row length bounds it, and never changes
            kwargs[MAX_SEQLEN_KEY] = int(hidden_states.shape[1])
        return forward(hidden_states, *args, **kwargs)

    return call


#: The kernels :func:`traceable_kernel` made custom ops of, by name (the op takes the name, a string).
_KERNELS: dict[str, Kernel] = {}


def _run(name: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_q: torch.Tensor,
         cu_k: torch.Tensor, max_q: int, max_k: int, scale: float | None, left: int, right: int,
         gqa: bool) -> torch.Tensor:
    kernel = _KERNELS[name]
    extra = {"enable_gqa": gqa} if "enable_gqa" in inspect.signature(kernel).parameters else {}
    return kernel(query, key, value, cu_q, cu_k, max_q, max_k, scale=scale, window_size=(left, right), **extra)


@torch.library.custom_op("wdspack::varlen_kernel", mutates_args=())
def _varlen_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
               max_q: int, max_k: int, scale: float | None, left: int, right: int, gqa: bool,
               name: str) -> torch.Tensor:
    return _run(name, query, key, value, cu_q, cu_k, max_q, max_k, scale, left, right, gqa).clone()


@_varlen_op.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any) -> torch.Tensor:
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


@torch.library.custom_op("wdspack::varlen_kernel_backward", mutates_args=())
def _varlen_backward_op(grad: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int, scale: float | None,
                        left: int, right: int, gqa: bool, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    def replay() -> tuple[torch.Tensor, ...]:
        with torch.enable_grad():
            q, k, v = (t.detach().requires_grad_() for t in (query, key, value))
            out = _run(name, q, k, v, cu_q, cu_k, max_q, max_k, scale, left, right, gqa)
            return torch.autograd.grad(out, (q, k, v), grad)

    # The kernel's own autograd, run again on the saved inputs, in a thread of its own: here, inside an
    # op, autograd is switched off for this thread (a thread-local dispatch setting) and enable_grad cannot undo it.
    with ThreadPoolExecutor(max_workers=1) as pool:
        dq, dk, dv = pool.submit(replay).result()
    return dq, dk, dv


@_varlen_backward_op.register_fake
def _(grad: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
      *args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs[:5])
    ctx.rest = inputs[5:]


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    dq, dk, dv = _varlen_backward_op(grad, *ctx.saved_tensors, *ctx.rest)
    return (dq, dk, dv) + (None,) * 9


_varlen_op.register_autograd(_backward, setup_context=_setup)


def traceable_kernel(kernel: Kernel) -> Kernel:
    """``kernel`` (``varlen_attn``'s signature) as the custom op ``wdspack::varlen_kernel``: under
    ``torch.compile`` dynamo traces the call without running the kernel (a kernel that reads
    ``cu_seqlens`` on the host, as :func:`~wdspack.models.varlen.reference_varlen_attn` does, would break
    the graph); its backward is the kernel's own autograd, run again. torch's ``varlen_attn`` is a custom
    op already and needs none of this.

    Example:
        >>> from wdspack.models.varlen import reference_varlen_attn
        >>> wdspack.use_varlen_attention(model, kernel=traceable_kernel(reference_varlen_attn))  # doctest: +SKIP
    """
    name = f"{kernel.__module__}.{getattr(kernel, '__qualname__', type(kernel).__name__)}"
    _KERNELS[name] = kernel

    def traced(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_q: torch.Tensor,
               cu_seq_k: torch.Tensor, max_q: int, max_k: int, *, scale: float | None = None,
               window_size: tuple[int, int] = (-1, -1), enable_gqa: bool = False) -> torch.Tensor:
        return _varlen_op(query, key, value, cu_seq_q, cu_seq_k, int(max_q), int(max_k),
                          None if scale is None else float(scale), int(window_size[0]), int(window_size[1]),
                          bool(enable_gqa), name)

    traced.__name__ = getattr(kernel, "__name__", "kernel")
    return traced
