"""``token_losses`` against a loss written out by hand: the shift, ``IGNORE_INDEX``, the dtypes.

The reference takes ``-log_softmax`` of each position's logits at the next position's label, one
position at a time, in float64; ``token_losses`` computes on the flat ``[R * T, V]`` layout (#20).
"""

from __future__ import annotations

import pytest
import torch

from wdspack.loader.batch.collate import IGNORE_INDEX
from wdspack.train.loss import token_losses


def _by_hand(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Position ``i`` of row ``r`` costs ``-log p(labels[r, i + 1])``; no target, no loss."""
    R, T, _ = logits.shape
    out = torch.zeros(R, T, dtype=torch.float64)
    for r in range(R):
        for i in range(T - 1):
            target = int(labels[r, i + 1])
            if target != IGNORE_INDEX:
                out[r, i] = -torch.log_softmax(logits[r, i].double(), dim=0)[target]
    return out


def _batch(R: int, T: int, V: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(R * 1000 + T)
    logits = (4 * torch.randn(R, T, V, generator=gen, dtype=torch.float64)).to(dtype)
    labels = torch.randint(0, V, (R, T), generator=gen)
    labels[:, 0] = IGNORE_INDEX  # as the collate writes every sub-sample's first label
    labels[0, T // 2] = IGNORE_INDEX  # a boundary inside a row
    return logits, labels


@pytest.mark.parametrize("R, T, V", [(1, 9, 11), (3, 17, 50), (2, 1, 5)])
def test_token_losses_equal_the_loss_written_out_in_float64(R, T, V):
    logits, labels = _batch(R, T, V, torch.float64)
    got = token_losses(logits, labels)
    assert got.shape == (R, T) and got.dtype == torch.float64
    torch.testing.assert_close(got, _by_hand(logits, labels), rtol=0, atol=1e-12)
    assert (got[:, -1] == 0).all()  # the last position has no next label


@pytest.mark.parametrize("dtype, want", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                         (torch.float16, torch.float32)])
def test_half_logits_are_lost_in_float32(dtype, want):
    """As transformers' loss does: half-precision logits are upcast before the softmax."""
    logits, labels = _batch(2, 12, 40, dtype)
    got = token_losses(logits, labels)
    assert got.dtype == want
    torch.testing.assert_close(got.double(), _by_hand(logits.float(), labels), rtol=1e-5, atol=1e-5)


def test_non_contiguous_logits_and_gradients_of_the_last_position():
    """A model's logits may be a view; the last position predicts nothing, so it gets no gradient."""
    base, labels = _batch(2, 10, 30, torch.float64)
    logits = base.transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()  # same values, other strides
    assert not logits.is_contiguous()
    token_losses(logits, labels).sum().backward()
    torch.testing.assert_close(token_losses(logits.detach(), labels), _by_hand(base, labels), rtol=0, atol=1e-12)
    assert logits.grad is not None and (logits.grad[:, -1] == 0).all() and (logits.grad[:, :-1] != 0).any()
