"""The merge: which source's pack each position of a slot's epoch holds (pure functions).

    tag of source i's k-th pack = (U_i(k) + u_ik / 2) / w_i + φ_i;  each position takes the smallest
    three sources at 1/2, 1/4, 1/4, equal packs:
    tags        a: 1 3 5 7 ...   b: 2 6 10 ...   c: 2 6 10 ...
    emitted     a b c a a b c a a b c a ...

Holds: computed from integers alone before any byte is read, once per rank over its workers'
batches in the DataLoader's order; at any cut each source has given ``w_i · τ`` units to within
half a pack of its own (every window's share within about one pack's units, on every rank);
ties go to the lowest source; tags restart every epoch from the cursors the one before left.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError
from .streams import Block, RankStream, SlotRead, SourceCursor, SourceLayout, block_reads

__all__ = ["SlotSchedule", "merge_sources", "plan_slot", "slot_phase"]

_GOLDEN = 0.6180339887498949  # spreads the sources' phases on a rank (an irrational step never repeats)


# ---------------------------------------------------------------------------------------------
# The merge


def slot_phase(slot: int, slots: int, source: int) -> float:
    """The phase of ``source`` on ``slot``, in mean packs, in ``[-0.5, 0.5)``: stratified over the slots.

    Example:
        >>> [round(slot_phase(s, 4, 0), 3) for s in range(4)]
        [-0.375, -0.125, 0.125, 0.375]
    """
    return ((slot + 0.5) / slots + source * _GOLDEN) % 1.0 - 0.5


def _tags(units: np.ndarray, share: float, offset: float) -> np.ndarray:
    u = np.asarray(units, np.int64)
    before = np.cumsum(u) - u
    return offset + (2 * before + u).astype(np.float64) / (2.0 * share)


def _check_shares(shares: Sequence[float], k: int) -> np.ndarray:
    w = np.asarray(shares, np.float64)
    if k < 1:
        raise ConfigError("a mixture needs at least one source")
    if w.shape != (k,) or not (np.isfinite(w).all() and (w > 0).all()):
        raise ConfigError(f"shares {list(shares)} must be {k} finite numbers > 0, one per source")
    return w / math.fsum(w.tolist())


def merge_sources(units: Sequence[np.ndarray], shares: Sequence[float], n: int, *,
                  offsets: Sequence[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` positions of the merge of finite unit streams (see the module docstring).

    Args:
        units: per source, the unit values of its next packs, in the order it gives them.
        shares: the weights (normalised here).
        n: positions wanted (at most the packs given).
        offsets: per source, a tag offset (:func:`plan_slot` gives each slot its phase); 0 by default.

    Returns:
        ``(source, taken)``: ``[n]`` the source of each position, and the packs taken from each.

    Example:
        >>> src, taken = merge_sources([np.full(8, 10), np.full(8, 10), np.full(8, 10)], [2, 1, 1], 8)
        >>> src.tolist(), taken.tolist()
        ([0, 1, 2, 0, 0, 1, 2, 0], [4, 2, 2])
    """
    w = _check_shares(shares, len(units))
    offs = np.zeros(len(units)) if offsets is None else np.asarray(offsets, np.float64)
    lengths = [len(u) for u in units]
    if n > sum(lengths):
        raise ConfigError(f"{n} positions wanted from streams of {sum(lengths)} packs")
    tags = np.concatenate([_tags(u, wi, o) for u, wi, o in zip(units, w, offs)]) if units else np.zeros(0)
    picked = np.argsort(tags, kind="stable")[:n]  # ties: the lower source (earlier in the concatenation)
    source = np.repeat(np.arange(len(units)), lengths)[picked]
    return source, np.bincount(source, minlength=len(units))


@dataclass(frozen=True, slots=True, eq=False)
class SlotSchedule:
    """One slot's epoch: per position (``per_slot`` of them, in emission order) its source, pass, shard,
    pack within the shard and within the source, and units; the rank's cursors it starts and ends at
    (the same on every worker of the rank); the ranged reads it needs (each source's blocks read in
    order, each from the first pack it emits to the last, for its shuffle buffer)."""

    source: np.ndarray
    pass_no: np.ndarray
    shard: np.ndarray
    pack: np.ndarray
    row: np.ndarray
    units: np.ndarray
    start: tuple[SourceCursor, ...]
    end: tuple[SourceCursor, ...]
    reads: tuple[SlotRead, ...]

    @property
    def taken(self) -> np.ndarray:
        """Packs taken from each source."""
        return np.bincount(self.source, minlength=len(self.start))


def plan_slot(layouts: Sequence[SourceLayout], shares: Sequence[float], *, slot: int, slots: int, per_slot: int,
              seed: int, cursors: Sequence[SourceCursor] | None = None, shuffle: bool = True,
              shuffle_buffer: int = 256, workers: int = 1, batch_size: int = 1,
              own_shares: bool = False) -> SlotSchedule:
    """Slot ``slot``'s ``per_slot`` packs of one mixture epoch, from each source's cursor on.

    ``per_slot`` is :meth:`~.spec.MixtureEpoch.per_slot` (the same on every slot); the next epoch
    starts from ``plan.end``. Deterministic: a function of its arguments alone.

    Args:
        slot: ``rank * workers + worker``.
        slots: ``ranks * workers``.
        workers: DataLoader workers per rank. With more than one, the rank's sources are merged once,
            over the rank's batches in the order the DataLoader yields them (worker ``w`` gives the
            rank's batches ``w, w + workers, ...``), and this slot gets its batches' positions; every
            worker of a rank computes the same rank plan, and ``start`` / ``end`` are the rank's cursors
            (see the module docstring). ``1`` (the default): the slot is the rank.
        batch_size: packs per batch; decides which positions of the rank's merge are this worker's
            (unused with one worker). ``per_slot`` need not be a multiple of it: the rank plan then
            runs to the end of the last batch, and ``end`` is the rank's cursor there.
        own_shares: with several workers, give every worker the weights in its own positions (each
            position's tags from what its worker took) rather than the rank's: each worker's stream is
            then as exact as a rank's, and the rank's within a pack per worker (``balance="cost"``
            needs it: a worker's windows then hold alike sources on every rank).

    Example:
        >>> from wdspack.loader.mixture.streams import source_layout
        >>> a = source_layout("a", [4, 4], np.full(8, 100))
        >>> b = source_layout("b", [4], np.full(4, 50))
        >>> p = plan_slot([a, b], [0.5, 0.5], slot=0, slots=2, per_slot=6, seed=0, shuffle=False)
        >>> p.source.tolist(), p.units.tolist()
        ([0, 1, 1, 0, 1, 1], [100, 50, 50, 100, 50, 50])
        >>> p.end  # b (2 packs a pass on this slot) made two passes, a is 2 packs into its first
        (SourceCursor(pass_no=0, pos=2), SourceCursor(pass_no=2, pos=0))
    """
    k = len(layouts)
    w = _check_shares(shares, k)
    cursors = tuple(cursors) if cursors is not None else (SourceCursor(),) * k
    if len(cursors) != k:
        raise ConfigError(f"{len(cursors)} cursors for {k} sources")
    if per_slot < 0:
        raise ConfigError(f"per_slot={per_slot} must be >= 0")
    if workers < 1 or batch_size < 1 or slots % workers:
        raise ConfigError(f"slots={slots} must be ranks × workers with workers={workers} >= 1 dividing it, "
                          f"and batch_size={batch_size} >= 1")
    if not 0 <= slot < slots:
        raise ConfigError(f"slot {slot} is not one of {slots} slots")
    rank, ranks, worker = slot // workers, slots // workers, slot % workers
    src = [RankStream(layout, c, rank=rank, ranks=ranks, workers=workers, seed=seed, shuffle=shuffle,
                      shuffle_buffer=shuffle_buffer) for layout, c in zip(layouts, cursors)]
    means = np.array([max(layout.mean_units, 1e-9) for layout in layouts])
    offsets = np.array([slot_phase(rank, ranks, i) for i in range(k)]) * means / w
    if workers == 1:
        source, runs, held = _merge_one(src, w, offsets, per_slot)
    else:
        source, runs, held = _merge_workers(src, w, offsets, per_slot, workers=workers, worker=worker,
                                            batch_size=batch_size, own=own_shares)
    out = {name: np.empty(len(source), np.int64) for name in ("pass_no", "shard", "pack", "row", "units")}
    reads: list[SlotRead] = []
    for i, layout in enumerate(layouts):
        mask = source == i
        rows = np.concatenate([b.rows[a:e] for b, a, e in runs[i]]) if runs[i] else np.zeros(0, np.int64)
        starts = np.cumsum((0, *layout.counts))
        shard = np.searchsorted(starts, rows, side="right") - 1
        out["row"][mask], out["shard"][mask], out["pack"][mask] = rows, shard, rows - starts[shard]
        if runs[i]:
            out["units"][mask] = np.concatenate([b.units[a:e] for b, a, e in runs[i]])
            out["pass_no"][mask] = np.repeat([b.pass_no for b, _, _ in runs[i]], [e - a for _, a, e in runs[i]])
        reads.extend(r for b, a, e in runs[i] for r in block_reads(b, a, e, i))
    return SlotSchedule(source=source, start=cursors, end=tuple(s.cursor(h) for s, h in zip(src, held)),
                        reads=tuple(reads), **out)


_Runs = list[list[list]]  # per source, the slot's runs [block, first, stop) of emission positions, in order


def _merge_one(src: list[RankStream], w: np.ndarray, offsets: np.ndarray,
               n: int) -> tuple[np.ndarray, _Runs, list[list[Block]]]:
    """One worker: each source's stream is known ahead, so the merge is one sort of the tags."""
    k = len(src)
    means = np.array([max(s.layout.mean_units, 1e-9) for s in src])
    expected = w / means / (w / means).sum()  # fraction of packs each source gives
    got: list[list[Block]] = [[] for _ in range(k)]
    have = [0] * k
    want = [min(n, math.ceil(n * f * 1.05) + 64) for f in expected]
    while True:
        for i in range(k):
            while have[i] < want[i]:
                got[i].append(src[i].take(0))
                have[i] += len(got[i][-1].rows) - got[i][-1].done
        tags = [_tags(np.concatenate([b.units[b.done:] for b in got[i]]) if got[i] else np.zeros(0, np.int64),
                      w[i], offsets[i]) for i in range(k)]
        flat = np.concatenate(tags)
        picked = np.argsort(flat, kind="stable")[:n]
        tau = flat[picked[-1]] if n else -np.inf
        short = [i for i in range(k) if have[i] < n and (not len(tags[i]) or tags[i][-1] <= tau)]
        if not short:
            break
        for i in short:  # a source gave more than expected: its stream must reach past the cut
            want[i] = min(n, 2 * want[i])
    source = np.repeat(np.arange(k), [len(t) for t in tags])[picked]
    runs: _Runs = [[] for _ in range(k)]
    held: list[list[Block]] = [[] for _ in range(k)]
    for i, left in enumerate(np.bincount(source, minlength=k).tolist()):
        for b in got[i]:
            m = min(left, len(b.rows) - b.done)
            if m:
                runs[i].append([b, b.done, b.done + m])
                b.done += m
                left -= m
                if b.done < len(b.rows):
                    held[i].append(b)
        for b in reversed(got[i][len(runs[i]):]):  # taken to look ahead, not read
            src[i].untake(b)
    return source.astype(np.int64), runs, held


def _merge_workers(src: list[RankStream], w: np.ndarray, offsets: np.ndarray, n: int, *, workers: int,
                   worker: int, batch_size: int, own: bool = False) -> tuple[np.ndarray, _Runs, list[list[Block]]]:
    """Several workers: the rank's positions one at a time, in the DataLoader's order (the workers'
    batches in turn), each given the source of smallest tag among the packs the sources would give
    that position's worker next (its block's next, or the first of the block it would take)."""
    k = len(src)
    off, d2 = offsets.tolist(), (2.0 * w).tolist()
    cur: list[list[Block | None]] = [[None] * k for _ in range(workers)]
    cand = [[s.peek(v).unit[s.peek(v).done] for s in src] for v in range(workers)]  # each worker's next packs
    # the units each worker's tags count: the rank's (one list for all), or its own (``own``)
    usage = [[0] * k for _ in range(workers)] if own else [[0] * k] * workers
    # _tags, one pack at a time: tags[v][i] is the tag of the pack source i would give worker v next
    tags = [[off[i] + cand[v][i] / d2[i] for i in range(k)] for v in range(workers)]
    source: list[int] = []
    runs: _Runs = [[] for _ in range(k)]
    mine = 0
    log: list[int] = []  # the source of every position so far
    seen = [0] * workers  # log entries each worker's tags account for
    for t in range(-(-n // batch_size) * workers):
        v = t % workers
        cv, curv, tv, used = cand[v], cur[v], tags[v], usage[v]
        for j in set(log[seen[v]:]):  # the sources the other workers took from since this one's last batch
            tv[j] = off[j] + (2 * used[j] + cv[j]) / d2[j]
        for _ in range(batch_size):
            i = tv.index(min(tv))  # ties: the lower source
            s, b = src[i], curv[i]
            if b is None:
                b = curv[i] = s.take(v)
                for x in range(workers):  # the others now take the block after it
                    if cur[x][i] is None:
                        nxt = s.peek(x)
                        cand[x][i] = nxt.unit[nxt.done]
            a = b.done
            used[i] += b.unit[a]
            if v == worker and mine < n:
                mine += 1
                source.append(i)
                if runs[i] and runs[i][-1][0] is b:
                    runs[i][-1][2] = a + 1
                else:
                    runs[i].append([b, a, a + 1])
            b.done = a + 1
            if b.done == len(b.unit):
                curv[i] = None
                nxt = s.peek(v)
                cv[i] = nxt.unit[nxt.done]
            else:
                cv[i] = b.unit[a + 1]
            tv[i] = off[i] + (2 * used[i] + cv[i]) / d2[i]
            log.append(i)
        seen[v] = len(log)
    held = [[b for c in cur for b in (c[i],) if b is not None] for i in range(k)]
    return np.array(source, np.int64), runs, held


