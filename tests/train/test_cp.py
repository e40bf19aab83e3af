"""The context-parallel split: TransformerEngine's index on its own cases, and what holds for any segments."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wdspack.errors import ConfigError
from wdspack.train.cp import cp_layout, cp_shard, padded_lengths, partitioned_indices, shift_labels, split_tokens


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
