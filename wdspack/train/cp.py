"""Context parallelism for packed batches: each CP rank's share of every sub-sample, as
TransformerEngine lays it out.

Every segment of the flattened batch (a sub-sample, or a pack's padding tail) is padded to a
multiple of ``2·cp`` and cut into ``2·cp`` chunks; rank ``r`` keeps chunks ``r`` and ``2·cp−1−r``
(an early and a late chunk, so causal work is balanced). ``cp = 2``, segments of 5 and 8 tokens::

    padded segment     a0 a1 a2 a3 a4 ·  ·  ·  | b0 b1 b2 b3 b4 b5 b6 b7     (· = 2·cp padding)
    chunk              0     1     2     3     | 0     1     2     3
    rank 0 keeps       a0 a1             ·  ·  | b0 b1             b6 b7
    rank 1 keeps             a2 a3 a4 ·        |       b2 b3 b4 b5

The split runs on the text model's input embeddings (images, frames and audio already merged), with
positions computed on the whole pack and labels shifted before it, so no span is cut before its
encoder and every token keeps its own position and target. Padding has no target.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..loader.batch.collate import IGNORE_INDEX

__all__ = ["CPLayout", "CPShare", "CPVarlen", "cp_layout", "cp_shard", "padded_lengths", "partitioned_indices",
           "shift_labels", "split_tokens"]


def padded_lengths(seq_lens: Sequence[int], *, cp: int) -> tuple[int, ...]:
    """Each length rounded up to a multiple of ``2·cp`` (TransformerEngine's requirement; 0 stays 0).

    Example:
        >>> padded_lengths([5, 8, 1], cp=2)
        (8, 8, 4)
    """
    _check_cp(cp)
    step = 2 * cp
    return tuple(-(-int(n) // step) * step for n in seq_lens)


def partitioned_indices(cu_seqlens_padded: Sequence[int] | torch.Tensor, *, cp: int, rank: int) -> torch.Tensor:
    """The positions of the padded layout that CP rank ``rank`` keeps, in order: chunks ``rank`` and
    ``2·cp−1−rank`` of every segment (TransformerEngine's ``thd_get_partitioned_indices``).

    Raises:
        ConfigError: a segment's length does not divide by ``2·cp`` (pad with :func:`padded_lengths`).

    Example:
        >>> partitioned_indices([0, 8, 16], cp=2, rank=0).tolist()
        [0, 1, 6, 7, 8, 9, 14, 15]
    """
    _check_cp(cp)
    if not 0 <= rank < cp:
        raise ConfigError(f"CP rank {rank} is outside 0..{cp - 1} (cp = {cp})")
    bounds = [int(x) for x in (cu_seqlens_padded.tolist() if isinstance(cu_seqlens_padded, torch.Tensor)
                               else cu_seqlens_padded)]
    parts: list[torch.Tensor] = []
    for start, end in itertools.pairwise(bounds):
        if (end - start) % (2 * cp):
            raise ConfigError(f"segment [{start}, {end}) has {end - start} tokens, not a multiple of 2·cp = {2 * cp}: "
                              "pad every segment with wdspack.train.cp.padded_lengths (cp_layout does)")
        c = (end - start) // (2 * cp)
        parts += [torch.arange(start + rank * c, start + (rank + 1) * c),
                  torch.arange(start + (2 * cp - 1 - rank) * c, start + (2 * cp - rank) * c)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)


@dataclass(frozen=True, slots=True)
class CPLayout:
    """One CP rank's view of a batch: which tokens it holds, and where every token sits.

    Positions are of the padded layout (every segment padded to a multiple of ``2·cp``).
    """

    #: The CP degree and this rank in its group.
    cp: int
    rank: int
    #: Each segment's tokens, and padded to a multiple of ``2·cp``.
    seq_lens: tuple[int, ...]
    padded_lens: tuple[int, ...]
    #: ``[N_pad / cp]``: the padded positions this rank holds (:func:`partitioned_indices`).
    index: torch.Tensor
    #: ``[N_pad]``: every rank's ``index``, rank after rank (the order of all-gathered keys).
    all_index: torch.Tensor
    #: ``[N_pad]``: the batch token at each padded position (flattened), ``-1`` for padding.
    source: torch.Tensor
    #: ``[N_pad]``: each padded position's segment and its offset within it.
    segment: torch.Tensor
    offset: torch.Tensor
    #: The CP process group (``None``: the default group, or no ``torch.distributed`` at all).
    group: Any = None
    _masks: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def cu_seqlens(self) -> torch.Tensor:
        """The segments' offsets in the unpadded batch, int32 (TransformerEngine's ``cu_seqlens``)."""
        return _cumulative(self.seq_lens)

    @property
    def cu_seqlens_padded(self) -> torch.Tensor:
        """The segments' offsets in the padded layout, int32 (TransformerEngine's ``cu_seqlens_padded``)."""
        return _cumulative(self.padded_lens)

    @property
    def local_cu_seqlens(self) -> torch.Tensor:
        """The segments' offsets in this rank's share (the padded ones divided by ``cp``), int32."""
        return _cumulative([n // self.cp for n in self.padded_lens])

    @property
    def padding(self) -> int:
        """Tokens the ``2·cp`` padding adds to the batch (all ranks together)."""
        return sum(self.padded_lens) - sum(self.seq_lens)

    def mask(self, window: int | None = None, device: torch.device | None = None) -> torch.Tensor:
        """``[N_pad / cp, N_pad]`` which all-gathered key each of this rank's queries sees: its own
        segment, causally (and within ``window`` tokens, the token itself included, where given)."""
        key = (window, str(device))
        if key not in self._masks:
            q, k = self.index, self.all_index
            qo, ko = self.offset[q][:, None], self.offset[k][None, :]
            allowed = (self.segment[q][:, None] == self.segment[k][None, :]) & (ko <= qo)
            if window is not None:
                allowed &= qo - ko < window
            self._masks[key] = allowed.to(device) if device is not None else allowed
        return self._masks[key]

    def varlen(self, device: torch.device | None = None) -> CPVarlen:
        """The varlen kernel's view of this rank's queries (built once per device, no host sync after):
        each of its two chunks of every segment a query sequence of its own, attending to its segment's
        key prefix up to the chunk's end (bottom-right-aligned causal, Llama 3's all-gather CP)::

            segment of 8, cp = 2, rank 0: chunks 0 and 3   q: [k0 k1]      keys: k0 k1
                                                            q: [k6 k7]      keys: k0 .. k7
        """
        key = ("varlen", str(device))
        if key not in self._masks:
            gathered = torch.argsort(self.all_index)  # padded position -> its row in the all-gathered keys
            keys: list[torch.Tensor] = []
            q_lens: list[int] = []
            k_lens: list[int] = []
            start = 0
            for n in self.padded_lens:
                c = n // (2 * self.cp)
                if c:
                    for upto in ((self.rank + 1) * c, (2 * self.cp - self.rank) * c):
                        keys.append(gathered[start:start + upto])
                        q_lens.append(c)
                        k_lens.append(upto)
                start += n
            key_index = torch.cat(keys) if keys else torch.zeros(0, dtype=torch.int64)
            self._masks[key] = CPVarlen(key_index=key_index.to(device),
                                        cu_seqlens_q=_cumulative(q_lens).to(device),
                                        cu_seqlens_k=_cumulative(k_lens).to(device),
                                        max_seqlen_q=max(q_lens, default=0), max_seqlen_k=max(k_lens, default=0))
        return self._masks[key]


class CPVarlen(NamedTuple):
    """This rank's queries as the varlen kernel takes them (:meth:`CPLayout.varlen`): ``key_index`` picks,
    from the all-gathered keys, every query sequence's key prefix in turn; ``cu_seqlens_q`` ≠ ``cu_seqlens_k``."""

    key_index: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int


def cp_layout(seq_lens: Sequence[int] | torch.Tensor, *, cp: int, rank: int, group: Any = None,
              cu_seqlens: bool = False) -> CPLayout:
    """The layout of a batch whose flattened tokens are segments of ``seq_lens`` (or, with
    ``cu_seqlens=True``, whose segments' offsets are given: the loader's ``batch["cu_seqlens"]``).

    Example:
        >>> lay = cp_layout([5, 8], cp=2, rank=1)
        >>> lay.index.tolist(), lay.source[lay.index].tolist(), lay.padding
        ([2, 3, 4, 5, 10, 11, 12, 13], [2, 3, 4, -1, 7, 8, 9, 10], 3)
    """
    lens = [int(x) for x in (seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else seq_lens)]
    if cu_seqlens:
        lens = [b - a for a, b in itertools.pairwise(lens)]
    if any(n < 0 for n in lens):
        raise ConfigError(f"segment lengths {lens} hold a negative one; pass lengths, or offsets with cu_seqlens=True")
    padded = padded_lengths(lens, cp=cp)
    starts = torch.tensor([0, *itertools.accumulate(lens)][:-1], dtype=torch.int64) if lens else torch.zeros(0)
    segment = torch.repeat_interleave(torch.arange(len(padded)), torch.tensor(padded, dtype=torch.int64))
    offset = torch.cat([torch.arange(n) for n in padded]) if padded else torch.zeros(0, dtype=torch.int64)
    real = offset < torch.tensor(lens, dtype=torch.int64)[segment]
    source = torch.where(real, starts.to(torch.int64)[segment] + offset, -1)
    cu_pad = _cumulative(padded)
    index = partitioned_indices(cu_pad, cp=cp, rank=rank)
    all_index = torch.cat([partitioned_indices(cu_pad, cp=cp, rank=r) for r in range(cp)])
    return CPLayout(cp=cp, rank=rank, seq_lens=tuple(lens), padded_lens=padded, index=index, all_index=all_index,
                    source=source, segment=segment, offset=offset, group=group)


def split_tokens(x: torch.Tensor, layout: CPLayout, *, dim: int = 1, pad: float | int = 0) -> torch.Tensor:
    """This rank's share of ``x``, whose ``dim`` holds the batch's flattened tokens (``[1, N, ...]`` for
    ``dim=1``); padding positions hold ``pad``. Differentiable: the gradient flows back to ``x``.

    Example:
        >>> split_tokens(torch.arange(13)[None], cp_layout([5, 8], cp=2, rank=1), pad=-1).tolist()
        [[2, 3, 4, -1, 7, 8, 9, 10]]
    """
    dim = dim % x.dim()
    if x.shape[dim] != sum(layout.seq_lens):
        raise ConfigError(f"a tensor of {x.shape[dim]} tokens along dim {dim}, but the layout's segments hold "
                          f"{sum(layout.seq_lens)}: build the layout from this batch's cu_seqlens")
    src = layout.source[layout.index].to(x.device)
    out = x.index_select(dim, src.clamp(min=0))
    is_pad = (src < 0).view([-1 if d == dim else 1 for d in range(x.dim())])
    return torch.where(is_pad, torch.as_tensor(pad, dtype=x.dtype, device=x.device), out)


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """``[B, L]`` labels moved one left per row (position ``i`` holds the target it predicts, ``labels[i + 1]``;
    the last is ``-100``): the shift the loss makes, done before a split can separate ``i`` from ``i + 1``."""
    return F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)


@dataclass(frozen=True, slots=True)
class CPShare:
    """This rank's share of a model-ready batch (flattened to one row)."""

    #: ``[1, N_pad / cp, H]`` input embeddings (padding: zeros).
    inputs_embeds: torch.Tensor
    #: ``[1, n]`` or ``[k, 1, n]`` (mRoPE rows) positions computed on the whole pack (padding: 0).
    position_ids: torch.Tensor | None
    #: ``[1, n]`` the targets, already shifted (padding: ``-100``): the loss is ``CE(logits[0], labels[0])``.
    labels: torch.Tensor | None
    layout: CPLayout


def flatten_rows(x: torch.Tensor, *, dim: int) -> torch.Tensor:
    """``x`` with its batch dim (``dim``) and the next one (tokens) merged into one row of tokens."""
    shape = list(x.shape)
    return x.reshape(*shape[:dim], 1, shape[dim] * shape[dim + 1], *shape[dim + 2:])


def cp_shard(*, inputs_embeds: torch.Tensor, layout: CPLayout, position_ids: torch.Tensor | None = None,
             labels: torch.Tensor | None = None) -> CPShare:
    """This rank's share of a batch, after the encoders' features are merged into ``inputs_embeds``.

    Args:
        inputs_embeds: ``[B, L, H]`` the text model's input embeddings of the whole batch.
        layout: :func:`cp_layout` of the batch's segments (``batch["cu_seqlens"]``).
        position_ids: ``[B, L]`` or ``[k, B, L]`` (3-D mRoPE rows, a text row first where the family has one),
            computed on the whole pack.
        labels: ``[B, L]`` the loader's (unshifted) labels; shifted here before the split.
    """
    share_pos = None
    if position_ids is not None:
        dim = position_ids.dim() - 2
        share_pos = split_tokens(flatten_rows(position_ids, dim=dim), layout, dim=dim + 1, pad=0)
    share_labels = None
    if labels is not None:
        share_labels = split_tokens(flatten_rows(shift_labels(labels), dim=0), layout, pad=IGNORE_INDEX)
    return CPShare(inputs_embeds=split_tokens(flatten_rows(inputs_embeds, dim=0), layout),
                   position_ids=share_pos, labels=share_labels, layout=layout)


def _cumulative(lens: Sequence[int]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)


def _check_cp(cp: int) -> None:
    if int(cp) < 1:
        raise ConfigError(f"cp = {cp}: the context-parallel degree is a positive number of ranks")
