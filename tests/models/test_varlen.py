"""Padding-free attention on PyTorch's varlen kernel (wdspack.models.varlen): the plumbing, on CPU.

torch's ``varlen_attn`` runs on CUDA only, so here the attention function is fed
``reference_varlen_attn`` (per-segment SDPA; itself checked against a dense block-diagonal mask) and
a recording wrapper shows what reaches the kernel. A tiny Llama then trains a packed row exactly as
its segments one by one. The families and the real kernel: tests/models/test_varlen_families.py.
"""

from __future__ import annotations

import itertools
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import wdspack
from wdspack.errors import ConfigError
from wdspack.models.varlen import (
    CU_SEQLENS_KEY,
    MAX_SEQLEN_KEY,
    VARLEN_ATTENTION,
    is_varlen,
    reference_varlen_attn,
    use_varlen_attention,
    varlen_attention,
    varlen_kwargs,
    varlen_vision_attention,
)

LENGTHS = (5, 1, 9, 3)  # segments of the flattened batch, one of a single token


def _cu(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _dense(q, k, v, lengths, *, window: int | None, scale: float | None = None) -> torch.Tensor:
    """[T, H, D] attention with one dense [T, T] mask: same segment, causal, inside the window."""
    seg = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    pos = torch.arange(len(seg))
    mask = (seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None])
    if window is not None:
        mask &= pos[None, :] > pos[:, None] - window
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    return F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask,
                                          scale=scale).transpose(0, 1)


@pytest.mark.parametrize("window", [None, 2, 4])
def test_reference_kernel_is_block_diagonal_causal_attention(window):
    g = torch.Generator().manual_seed(0)
    T = sum(LENGTHS)
    q = torch.randn(T, 4, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(T, 2, 8, generator=g, dtype=torch.float64) for _ in range(2))
    cu = torch.cat([_cu(LENGTHS), torch.tensor([T, T], dtype=torch.int32)])  # the loader's trailing empty segments
    got = reference_varlen_attn(q, k, v, cu, cu, 9, 9, scale=0.3,
                                window_size=(-1, 0) if window is None else (window - 1, 0))
    torch.testing.assert_close(got, _dense(q, k, v, LENGTHS, window=window, scale=0.3), rtol=1e-12, atol=1e-12)
    # and the check can fail: a causal mask over the whole row is another result
    assert not torch.allclose(got, _dense(q, k, v, (T,), window=window, scale=0.3))


class _Recorder:
    """The reference kernel, noting what it was called with."""

    __name__ = "recorder"

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(self, q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False):
        self.calls.append(dict(q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, max_q=max_q, max_k=max_k, scale=scale,
                               window_size=window_size, enable_gqa=enable_gqa))
        return reference_varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, window_size=window_size)


def _module(training: bool = False, is_causal: bool = True) -> torch.nn.Module:
    m = torch.nn.Linear(1, 1)
    m.is_causal = is_causal
    return m.train(training)


@pytest.mark.parametrize("sliding_window", [None, 4])
def test_what_reaches_the_kernel(sliding_window):
    """[B, H, L, D] → [B·L, H, D] (GQA heads as they are), the batch's own cu_seqlens and max_seqlen, the layer's
    scale, the window as (W - 1, 0); the output comes back as [B, L, H, D] and equals dense masked attention."""
    B, L, H, Hkv, D = 2, 9, 4, 2, 8
    lengths = (5, 4, 2, 7)  # row 0: 5 + 4; row 1: 2 + 7
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, L, D, generator=g, dtype=torch.float64) for _ in range(2))
    cu = _cu(lengths)
    kernel = _Recorder()
    out, weights = varlen_attention(kernel)(_module(), q, k, v, None, dropout=0.0, scaling=0.25,
                                            sliding_window=sliding_window, **{CU_SEQLENS_KEY: cu, MAX_SEQLEN_KEY: 7})
    (call,) = kernel.calls
    assert weights is None and out.shape == (B, L, H, D)
    assert call["cu_q"] is cu and call["cu_k"] is cu and call["max_q"] == call["max_k"] == 7
    assert call["q"].shape == (B * L, H, D) and call["k"].shape == call["v"].shape == (B * L, Hkv, D)
    torch.testing.assert_close(call["q"][L + 3], q[1, :, 3])  # token 3 of row 1 is flattened token L + 3
    assert call["scale"] == 0.25 and call["enable_gqa"] is True
    assert call["window_size"] == ((-1, 0) if sliding_window is None else (sliding_window - 1, 0))
    flat = (t.transpose(1, 2).reshape(B * L, t.shape[1], D) for t in (q, k, v))
    want = _dense(*flat, lengths, window=sliding_window, scale=0.25).view(B, L, H, D)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_what_reaches_the_kernel_from_a_vision_tower():
    """A vision tower's FlashAttention path: [1, H, T, D] and the tower's own cu_seq_lens_q (int64 there is
    made int32) reach the kernel once, every span attending to itself both ways; equal to per-span SDPA."""
    lengths, H, D = (4, 9, 1, 6), 2, 8
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, H, sum(lengths), D, generator=g, dtype=torch.float64) for _ in range(3))
    kernel = _Recorder()
    cu = _cu(lengths).long()
    out, _ = varlen_vision_attention(kernel)(_module(is_causal=False), q, k, v, None, scaling=0.5,
                                             cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=9, max_length_k=9,
                                             is_causal=False, **{CU_SEQLENS_KEY: _cu((5,)), MAX_SEQLEN_KEY: 5})
    (call,) = kernel.calls
    assert call["window_size"] == (-1, -1) and call["scale"] == 0.5 and call["max_q"] == call["max_k"] == 9
    assert call["cu_q"].dtype == torch.int32 and call["cu_q"].tolist() == cu.tolist(), "the tower's, not the text's"
    spans = zip(*(t[0].split(list(lengths), dim=1) for t in (q, k, v)))
    want = torch.cat([F.scaled_dot_product_attention(a, b, c, scale=0.5) for a, b, c in spans], dim=1)
    torch.testing.assert_close(out[0], want.transpose(0, 1), rtol=1e-12, atol=1e-12)
    attend = varlen_vision_attention(reference_varlen_attn)
    with pytest.raises(ConfigError, match=r"without its cu_seqlens.*'sdpa'"):
        attend(_module(), q, k, v, None)
    with pytest.raises(ConfigError, match=r"bidirectional.*is_causal=True"):
        attend(_module(), q, k, v, None, cu_seq_lens_q=cu, max_length_q=9, is_causal=True)


def test_refusals_name_the_fix():
    q = torch.zeros(1, 2, 4, 8)
    segments = {CU_SEQLENS_KEY: _cu((4,)), MAX_SEQLEN_KEY: 4}
    attend = varlen_attention(reference_varlen_attn)
    with pytest.raises(ConfigError, match="model_inputs"):
        attend(_module(), q, q, q, None)
    with pytest.raises(ConfigError, match=r"attention_dropout to 0.0"):
        attend(_module(training=True), q, q, q, None, dropout=0.1, **segments)
    attend(_module(training=False), q, q, q, None, dropout=0.1, **segments)  # dropout is off in eval: fine
    with pytest.raises(ConfigError, match=r"soft-capping.*'eager'"):
        attend(_module(), q, q, q, None, softcap=30.0, **segments)
    with pytest.raises(ConfigError, match=r"not causal.*vision tower"):
        attend(_module(is_causal=False), q, q, q, None, **segments)
    with pytest.raises(ConfigError, match=r"cu_seqlens.*make_loader"):
        varlen_kwargs({"input_ids": torch.zeros(1, 4)})


def test_the_real_kernel_names_device_and_dtype():
    """torch's own kernel (the default): float32 and CPU are refused before the kernel runs, with the fix."""
    pytest.importorskip("torch.nn.attention.varlen", reason="this torch has no varlen_attn")
    attend = varlen_attention()
    segments = {CU_SEQLENS_KEY: _cu((4,)), MAX_SEQLEN_KEY: 4}
    q = torch.zeros(1, 2, 4, 16)
    with pytest.raises(ConfigError, match=r"bfloat16 or float16, not torch.float32.*autocast"):
        attend(_module(), q, q, q, None, **segments)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"CUDA only.*'sdpa' on CPU"):
            attend(_module(), q.bfloat16(), q.bfloat16(), q.bfloat16(), None, **segments)


def test_a_torch_without_varlen_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", None)  # import fails as on torch < 2.10
    with pytest.raises(ConfigError, match=r"torch .* has no torch.nn.attention.varlen.*upgrade torch"):
        varlen_attention()


def test_gemma3_is_refused_with_what_to_use():
    model = SimpleNamespace(config=SimpleNamespace(model_type="gemma3"))
    with pytest.raises(ConfigError, match=r"gemma3.*both ways.*'sdpa' or 'flex_attention'"):
        use_varlen_attention(model, kernel=reference_varlen_attn)


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).double().eval()


def test_registration_and_an_exact_packed_row():
    """Registered with transformers and set on the model; a packed row of three segments (restarting
    positions, the batch's cu_seqlens) gives the loss and gradients of the three run one by one."""
    from transformers import AttentionInterface

    model = _tiny_llama()
    name = use_varlen_attention(model, kernel=reference_varlen_attn)
    assert name == f"{VARLEN_ATTENTION}_reference_varlen_attn" and name in AttentionInterface._global_mapping
    assert model.config._attn_implementation == name and is_varlen(model)
    lengths = (6, 3, 7)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 64, (1, sum(lengths)), generator=g)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    batch = {"cu_seqlens": _cu(lengths), "max_seqlen": max(lengths)}

    def loss_and_grads(run):
        model.zero_grad()
        loss = run()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    def packed():
        logits = model(input_ids=ids, position_ids=positions, use_cache=False, **varlen_kwargs(batch)).logits
        starts = _cu(lengths).tolist()
        return sum(F.cross_entropy(logits[0, s:e - 1], ids[0, s + 1:e], reduction="sum")
                   for s, e in itertools.pairwise(starts))

    def one_by_one():
        total = torch.zeros((), dtype=torch.float64)
        model.set_attn_implementation("sdpa")
        try:
            for piece in ids.split(list(lengths), dim=1):
                logits = model(input_ids=piece, use_cache=False).logits
                total = total + F.cross_entropy(logits[0, :-1], piece[0, 1:], reduction="sum")
        finally:
            model.set_attn_implementation(name)
        return total

    (got, got_grads), (want, want_grads) = loss_and_grads(packed), loss_and_grads(one_by_one)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # the check can fail: the same row as one causal segment (what a missing cu_seqlens would mean) is another loss
    batch = {"cu_seqlens": _cu((sum(lengths),)), "max_seqlen": sum(lengths)}
    with torch.no_grad():
        assert not torch.allclose(packed(), want, rtol=1e-6)


def test_use_varlen_attention_is_exported():
    assert wdspack.use_varlen_attention is use_varlen_attention
