"""The context-parallel split: TransformerEngine's index on its own cases, and what holds for any segments."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wdspack.errors import ConfigError
from wdspack.models.varlen import reference_varlen_attn
from wdspack.train.cp import cp_layout, cp_shard, padded_lengths, partitioned_indices, shift_labels, split_tokens
from wdspack.train.cp_attention import attend_gathered, auto_kernel

pytestmark = pytest.mark.cp  # make gpu-check runs these too (tools/gpu_check.py)


def test_index_equals_transformer_engines_case():
    """``tests/pytorch/attention/test_cp_utils.py``: cu_seqlens [0, 8, 16], cp = 2."""
    assert partitioned_indices([0, 8, 16], cp=2, rank=0).tolist() == [0, 1, 6, 7, 8, 9, 14, 15]
    assert partitioned_indices([0, 8, 16], cp=2, rank=1).tolist() == [2, 3, 4, 5, 10, 11, 12, 13]


def test_documents_4_8_4_with_cp_2_as_transformer_engine_lays_them_out():
    """CP.md: TransformerEngine gives rank 0 {0, 3, 4, 5, 10, 11, 12, 15} for documents [4, 8, 4]."""
    assert partitioned_indices([0, 4, 12, 16], cp=2, rank=0).tolist() == [0, 3, 4, 5, 10, 11, 12, 15]


def test_lengths_not_divisible_are_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"7 tokens, not a multiple of 2·cp = 4.*padded_lengths"):
        partitioned_indices([0, 7], cp=2, rank=0)
    with pytest.raises(ConfigError, match=r"CP rank 2 is outside 0\.\.1"):
        partitioned_indices([0, 8], cp=2, rank=2)
    with pytest.raises(ConfigError, match="cp = 0"):
        padded_lengths([3], cp=0)


def test_a_short_segment_is_padded_and_its_padding_counted():
    lay = cp_layout([3, 13, 1], cp=4, rank=0)
    assert lay.padded_lens == (8, 16, 8) and lay.padding == 32 - 17
    assert lay.cu_seqlens.tolist() == [0, 3, 16, 17] and lay.cu_seqlens_padded.tolist() == [0, 8, 24, 32]
    assert lay.local_cu_seqlens.tolist() == [0, 2, 6, 8]
    # rank 0 keeps chunk 0 and chunk 7 of each: of the 3-token segment, its first token and padding; of the
    # 13-token one, its first two and the padding at its end; of the 1-token one, that token and padding
    assert lay.source[lay.index].tolist() == [0, -1, 3, 4, -1, -1, 16, -1]


segments = st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=6)


@settings(max_examples=30, deadline=None)
@given(lens=segments, cp=st.integers(min_value=1, max_value=4))
def test_the_ranks_share_every_token_once_in_balanced_halves(lens, cp):
    layouts = [cp_layout(lens, cp=cp, rank=r) for r in range(cp)]
    held = torch.cat([lay.index for lay in layouts])
    assert sorted(held.tolist()) == list(range(sum(layouts[0].padded_lens))), "every padded position once"
    for lay in layouts:
        assert lay.index.numel() == sum(layouts[0].padded_lens) // cp, "every rank the same number of tokens"
        assert torch.equal(lay.all_index, held)
        src = lay.source[lay.index]
        assert torch.equal(src[src >= 0], src[src >= 0].sort().values), "document order kept"
    real = torch.cat([lay.source[lay.index] for lay in layouts])
    assert sorted(real[real >= 0].tolist()) == list(range(sum(lens))), "every real token on exactly one rank"
    for lay in layouts:  # the causal work is balanced: chunk r and chunk 2cp-1-r add up to the same
        work = lay.offset[lay.index].sum() + lay.index.numel()
        assert int(work) == int(layouts[0].offset[layouts[0].index].sum() + layouts[0].index.numel())


@settings(max_examples=25, deadline=None)
@given(lens=segments, cp=st.integers(min_value=1, max_value=4), window=st.none() | st.integers(1, 9))
def test_the_mask_is_each_segments_causal_mask_in_the_gathered_order(lens, cp, window):
    pos = torch.cat([torch.arange(n) for n in lens]) if lens else torch.zeros(0)
    seg = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    for r in range(cp):
        lay = cp_layout(lens, cp=cp, rank=r)
        q, k = lay.source[lay.index], lay.source[lay.all_index]
        mask = lay.mask(window)
        rq, rk = q >= 0, k >= 0
        sub = mask[rq][:, rk]
        want = (seg[q[rq]][:, None] == seg[k[rk]][None]) & (pos[k[rk]][None] <= pos[q[rq]][:, None])
        if window is not None:
            want &= pos[q[rq]][:, None] - pos[k[rk]][None] < window
        assert torch.equal(sub, want)
        assert not mask[rq][:, ~rk].any(), "a real token never sees padding"
        assert mask.any(dim=1).all(), "every query sees at least itself"


def test_shard_splits_embeddings_positions_and_shifted_labels():
    B, L, H = 2, 6, 3
    embeds = torch.arange(B * L * H, dtype=torch.float64).view(B, L, H)
    rope = torch.arange(4 * B * L).view(4, B, L)
    labels = torch.tensor([[-100, 1, 2, -100, 4, 5], [-100, 7, -100, -100, -100, -100]])
    lay = cp_layout([3, 3, 2, 4], cp=2, rank=1)  # the loader's segments: two packs, the second with a padding tail
    share = cp_shard(inputs_embeds=embeds, position_ids=rope, labels=labels, layout=lay)
    src = lay.source[lay.index]
    flat = embeds.reshape(B * L, H)
    assert torch.equal(share.inputs_embeds[0][src >= 0], flat[src[src >= 0]])
    assert (share.inputs_embeds[0][src < 0] == 0).all()
    assert share.position_ids.shape == (4, 1, lay.index.numel())
    assert torch.equal(share.position_ids[:, 0, src >= 0], rope.reshape(4, B * L)[:, src[src >= 0]])
    shifted = shift_labels(labels).reshape(-1)
    assert torch.equal(share.labels[0][src >= 0], shifted[src[src >= 0]])
    assert (share.labels[0][src < 0] == -100).all()
    # the targets of all ranks together are the batch's, each once
    targets = sorted(itertools.chain.from_iterable(
        cp_shard(inputs_embeds=embeds, labels=labels, layout=cp_layout([3, 3, 2, 4], cp=2, rank=r)).labels[0]
        .tolist() for r in range(2)))
    assert [t for t in targets if t != -100] == sorted(t for t in labels.reshape(-1).tolist() if t != -100)


def test_split_carries_the_gradient_back():
    x = torch.randn(1, 13, 2, dtype=torch.float64, requires_grad=True)
    lay = cp_layout([5, 8], cp=2, rank=0)
    split_tokens(x, lay).sum().backward()
    src = lay.source[lay.index]
    assert x.grad[0, src[src >= 0], :].eq(1).all() and x.grad.sum() == 2 * int((src >= 0).sum())


def test_a_tensor_of_another_batch_is_refused():
    with pytest.raises(ConfigError, match="13 tokens along dim 1, but the layout's segments hold 12"):
        split_tokens(torch.zeros(1, 13), cp_layout([4, 8], cp=2, rank=0))


def _ranks_in_one_process(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: list[int], *, cp: int,
                          window: int | None, kernel) -> torch.Tensor:
    """Every CP rank's :func:`attend_gathered` on one device (the all-gather is the concatenation of the ranks'
    shares, rank after rank); the real tokens' outputs ``[N, H, D]`` back in the unsplit order."""
    out = torch.zeros_like(q)
    layouts = [cp_layout(lens, cp=cp, rank=r) for r in range(cp)]
    key, value = (torch.cat([split_tokens(t.transpose(0, 1)[None], lay, dim=2) for lay in layouts], dim=2)
                  for t in (k, v))  # [1, Hkv, N_pad, D], rank after rank: the same on every rank
    for lay in layouts:
        share = split_tokens(q.transpose(0, 1)[None], lay, dim=2)  # [1, H, n, D]
        got = attend_gathered(share, key, value, layout=lay, scale=0.3, window=window, kernel=kernel)[0]
        src = lay.source[lay.index].to(q.device)
        out = out.index_put((src[src >= 0],), got[src >= 0])
    return out


def _unsplit(q, k, v, lens, *, window, kernel=reference_varlen_attn) -> torch.Tensor:
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=q.device)
    return kernel(q, k, v, cu, cu, max(lens), max(lens), scale=0.3, enable_gqa=True,
                  window_size=(-1, 0) if window is None else (window - 1, 0))


#: Segments of a batch: some shorter than 2·cp (3, 1, 7), an empty one, and some that do not divide
LENS = [3, 13, 1, 0, 7, 16, 2]


@pytest.mark.parametrize(("cp", "window"), [(2, None), (4, 5)])
def test_varlen_path_across_ranks_equals_the_mask_path_and_unsplit_attention(cp, window):
    """Each rank's two chunks of every segment as query sequences over their key prefix (``cu_seqlens_q`` ≠
    ``cu_seqlens_k``), through the reference varlen kernel: the same outputs and gradients as SDPA with the mask
    and as the unsplit segments' causal attention, in float64."""
    gen = torch.Generator().manual_seed(cp)
    leaves = [torch.randn(sum(LENS), h, 8, generator=gen, dtype=torch.float64) for h in (4, 2, 2)]
    weight = torch.randn(sum(LENS), 4, 8, generator=gen, dtype=torch.float64)
    results = []
    for kernel in (reference_varlen_attn, None, "unsplit"):
        qkv = [t.clone().requires_grad_() for t in leaves]
        out = (_unsplit(*qkv, LENS, window=window) if kernel == "unsplit" else
               _ranks_in_one_process(*qkv, LENS, cp=cp, window=window, kernel=kernel))
        (out * weight).sum().backward()
        results.append([out.detach(), *(t.grad for t in qkv)])
    for other in results[1:]:
        for got, want, name in zip(results[0], other, ("out", "dq", "dk", "dv")):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-13, msg=lambda m, name=name: f"{name}: {m}")
    assert results[0][0].abs().sum() > 0


def test_the_varlen_view_of_a_rank():
    """cp = 2, segments of 5 and 8 (padded to 8 and 8): rank 0's chunks 0 and 3 of each see keys up to their end."""
    lay = cp_layout([5, 8], cp=2, rank=0)
    plan = lay.varlen()
    assert plan.cu_seqlens_q.tolist() == [0, 2, 4, 6, 8] and plan.cu_seqlens_k.tolist() == [0, 2, 10, 12, 20]
    assert (plan.max_seqlen_q, plan.max_seqlen_k) == (2, 8)
    assert lay.all_index[plan.key_index].tolist() == [0, 1, *range(8), 8, 9, *range(8, 16)]
    assert lay.varlen() is plan, "built once"


@pytest.mark.gpu
@pytest.mark.parametrize(("cp", "window"), [(2, None), (4, None), (4, 24)])
def test_cuda_varlen_kernel_across_ranks_equals_unsplit_attention(cp, window):
    """On one GPU, bfloat16: PyTorch's varlen FlashAttention kernel over every simulated rank's chunks (what
    :func:`cp_attention` runs on CUDA) against the same kernel on the unsplit segments, both measured against
    float32 attention of the same inputs: the CP path's error is at most twice the unsplit kernel's
    (FlashAttention's own criterion), the key and value gradients with a bfloat16 rounding of their largest
    entry more (each key's gradient is a sum over the query sequences that see it, as a reduce-scatter sums it)."""
    from wdspack.models.varlen import torch_varlen_kernel

    kernel = torch_varlen_kernel()
    lens = [3, 200, 1, 7, 131, 64, 2, 517]
    gen = torch.Generator().manual_seed(cp)
    leaves = [torch.randn(sum(lens), h, 64, generator=gen).cuda() for h in (8, 2, 2)]
    weight = torch.randn(sum(lens), 8, 64, generator=gen).cuda()
    assert auto_kernel(leaves[0].bfloat16()) is kernel and auto_kernel(leaves[0]) is None
    results = []
    for dtype, how in ((torch.bfloat16, kernel), (torch.bfloat16, "unsplit"), (torch.float32, None)):
        qkv = [t.clone().requires_grad_() for t in leaves]  # float32 leaves, cast in the graph
        q, k, v = (t.to(dtype) for t in qkv)
        if how is kernel:
            out = _ranks_in_one_process(q, k, v, lens, cp=cp, window=window, kernel=kernel)
        else:
            out = _unsplit(q, k, v, lens, window=window, **({"kernel": kernel} if how == "unsplit" else {}))
        (out.float() * weight).sum().backward()
        results.append([out.detach().float(), *(t.grad for t in qkv)])
    got, unsplit, want = results
    for g, u, w, name in zip(got, unsplit, want, ("out", "dq", "dk", "dv")):
        err, base = (g - w).abs().max(), (u - w).abs().max()
        slack = 1e-3 + (2**-8 * w.abs().max() if name in ("dk", "dv") else 0)
        assert err <= 2 * base + slack, f"{name}: the CP path is {err} off float32 attention, the unsplit kernel {base}"
