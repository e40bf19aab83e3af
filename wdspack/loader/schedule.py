"""A mixture's schedule: which source's pack each position of a slot's epoch holds (pure functions).

Every ``(rank, worker)`` slot computes its own schedule from integers alone (the seed, each
source's packs per shard and unit values from its pack index, the weights, the cursors), before
any byte is read. Two layers:

**One stream per source.** Pass ``p`` of a source is split over the slots as :mod:`.plan` splits an
epoch: its shards in a seeded order (seeded by ``(seed, source key, p)``: each source has its own
order, reshuffled every pass), cut into consecutive runs, one per slot, that differ by at most one
pack (the slots given the extra pack rotate from pass to pass); nothing is dropped or repeated, so
every pack of a pass goes to exactly one slot. A slot reads its share as ranged reads (a shard is
split only where a share ends) and emits it in a seeded shuffle-buffer order
(:func:`~.plan.shuffle_order`). A slot's stream of source ``i`` is its share of pass 0, then of
pass 1, ...: a pass is finished, on that slot, before the next one starts. Where a slot stands in
a source is a :class:`SourceCursor` ``(pass_no, pos)``; the streams do not depend on the weights,
so a cursor stays valid when the weights change or a source is added or removed.

**The merge**, a low-discrepancy rule in the mixture's unit (weighted fair queueing, as a stride
scheduler): the ``k``-th pack of source ``i`` in the slot's stream, of ``u_ik`` units, gets the tag
``(U_i(k) + u_ik / 2) / w_i + φ_i``, with ``U_i(k)`` the units of the packs before it; the epoch
emits the ``per_slot`` packs of smallest tag (ties: lowest source index). At any cut, source
``i`` has given ``w_i · τ`` units to within half a pack of its own, so every window's share is off
by at most about one pack's units, on every slot: no random draw. For three sources at 1/2, 1/4,
1/4 with equal packs::

    tags        a: 1 3 5 7 ...   b: 2 6 10 ...   c: 2 6 10 ...
    emitted     a b c a a b c a a b c a ...

The tags are independent per source, so the merge is one sort (an epoch of a million packs per
slot plans in a fraction of a second). ``φ_i`` is a phase, spread evenly over the slots (a
fraction of a mean pack, ``slot_phase``): slots that start together do not err together, so the
global share is closer still. Tags restart at every epoch, from the cursors the epoch before left.

A pack of 0 units (a text pack under ``unit="images"``) costs nothing and rides along with its
neighbours; a source holding none of the unit is refused by :func:`~.mixture.mixture_epoch`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from .plan import PackRange

__all__ = ["SlotRead", "SlotSchedule", "SourceCursor", "SourceLayout", "merge_sources", "pass_share", "plan_slot",
           "share_order", "slot_phase", "slot_stream", "source_key", "source_layout"]

_GOLDEN = 0.6180339887498949  # spreads the sources' phases on a slot (an irrational step never repeats)


@dataclass(frozen=True, slots=True)
class SourceCursor:
    """Where a slot stands in one source: ``pos`` packs of its share of pass ``pass_no`` emitted."""

    pass_no: int = 0
    pos: int = 0


@dataclass(frozen=True, slots=True, eq=False)
class SourceLayout:
    """One source as the schedule sees it: packs per shard (manifest order), each pack's units, its key."""

    counts: tuple[int, ...]
    #: ``[packs]`` int64: each pack's value in the mixture's unit, in manifest order
    units: np.ndarray
    #: seeds the source's shard orders: from its name, so adding a source leaves the others' orders alone
    key: int

    @property
    def packs(self) -> int:
        return len(self.units)

    @property
    def mean_units(self) -> float:
        return float(self.units.sum()) / max(len(self.units), 1)


def source_key(name: str) -> int:
    """A stable 63-bit key of a source name (the same in every process and Python version).

    Example:
        >>> source_key("llava") == source_key("llava") != source_key("captions")
        True
    """
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") >> 1


def source_layout(name: str, counts: Sequence[int], units: np.ndarray) -> SourceLayout:
    """A :class:`SourceLayout`; checks that ``units`` has one value per pack.

    Example:
        >>> source_layout("a", [2, 1], np.array([5, 6, 7])).mean_units
        6.0
    """
    values = np.ascontiguousarray(units, dtype=np.int64)
    if values.ndim != 1 or len(values) != sum(int(c) for c in counts):
        raise ConfigError(f"source {name!r}: {values.shape} unit values for {sum(int(c) for c in counts)} packs")
    if len(values) == 0:
        raise ConfigError(f"source {name!r} holds no packs; drop it from the mixture")
    if (values < 0).any():
        raise ConfigError(f"source {name!r} has negative unit values; its pack index is corrupt "
                          "(re-create it with `wdspack index DATASET`)")
    return SourceLayout(tuple(int(c) for c in counts), values, source_key(name))


# ---------------------------------------------------------------------------------------------
# One source's stream on one slot


def _share_bounds(total: int, *, slots: int, slot: int, pass_no: int) -> tuple[int, int]:
    """Slot ``slot``'s run ``[start, stop)`` of a pass of ``total`` packs: ``total // slots`` packs,
    one more for ``total % slots`` slots, which rotate with the pass (no slot is always the longer)."""
    q, extra = divmod(total, slots)
    rot = pass_no * extra % slots
    longer = (np.arange(slot + 1) - rot) % slots < extra
    start = slot * q + int(longer[:slot].sum())
    return start, start + q + int(longer[slot])


def _shard_order(shards: int, *, seed: int, key: int, pass_no: int, shuffle: bool) -> np.ndarray:
    if not shuffle:
        return np.arange(shards)
    return np.random.default_rng([seed, key, pass_no, 0x5EED]).permutation(shards)


def pass_share(counts: Sequence[int], *, slots: int, slot: int, pass_no: int, seed: int, key: int,
               shuffle: bool = True) -> tuple[PackRange, ...]:
    """Slot ``slot``'s share of pass ``pass_no`` of one source, as ranges in reading order.

    Example:
        >>> [(r.shard, r.start, r.stop) for s in range(2)
        ...  for r in pass_share([3, 3], slots=2, slot=s, pass_no=0, seed=0, key=1, shuffle=False)]
        [(0, 0, 3), (1, 0, 3)]
    """
    if slots < 1 or not 0 <= slot < slots:
        raise ConfigError(f"slot {slot} is not one of {slots} slots")
    sizes = np.asarray(counts, np.int64)
    start, stop = _share_bounds(int(sizes.sum()), slots=slots, slot=slot, pass_no=pass_no)
    order = _shard_order(len(sizes), seed=seed, key=key, pass_no=pass_no, shuffle=shuffle)
    ends = np.cumsum(sizes[order])
    begins = ends - sizes[order]
    first, last = int(np.searchsorted(ends, start, side="right")), int(np.searchsorted(begins, stop, side="left"))
    out = []
    for j in range(first, last):
        a, b = max(start, int(begins[j])) - int(begins[j]), min(stop, int(ends[j])) - int(begins[j])
        if b > a:
            out.append(PackRange(int(order[j]), a, b))
    return tuple(out)


def share_order(n: int, *, buffer_size: int, seed: int, key: int, pass_no: int, slot: int,
                shuffle: bool = True) -> np.ndarray:
    """The order a slot emits its ``n`` packs of a pass in: :func:`~.plan.shuffle_order`'s, computed
    without a Python loop (the same array for the same seed).

    Example:
        >>> sorted(share_order(5, buffer_size=3, seed=0, key=1, pass_no=0, slot=0).tolist())
        [0, 1, 2, 3, 4]
    """
    if not shuffle or buffer_size <= 1 or n <= 1:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng([seed, key, pass_no, slot, 0xB0F])
    size = min(buffer_size, n)
    m = n - size
    picks = (rng.random(m) * size).astype(np.int64)
    # emission k takes the item in buffer place picks[k]: the one put there by the last earlier pick
    # of that place (item size + k'), or the place's first item
    by = np.argsort(picks.astype(np.uint16 if size <= 1 << 16 else np.int64), kind="stable")  # a radix sort
    same = picks[by[1:]] == picks[by[:-1]]
    prev = np.full(m, -1, np.int64)
    prev[by[1:][same]] = by[:-1][same]
    out = np.empty(n, np.int64)
    out[:m] = np.where(prev >= 0, size + prev, picks)
    buf = np.arange(size, dtype=np.int64)
    last = by[np.r_[~same, True]] if m else by
    buf[picks[last]] = size + last
    out[m:] = buf[rng.permutation(size)]
    return out


@dataclass(frozen=True, slots=True, eq=False)
class _Share:
    """One pass's share of a source on a slot, emission order: the rows it emits from ``first`` on."""

    pass_no: int
    ranges: tuple[PackRange, ...]
    order: np.ndarray  # emission k -> reading position
    rows: np.ndarray  # emission k -> pack row in the source (manifest order)
    first: int  # packs of the share emitted before (a cursor inside it)


def _shares(layout: SourceLayout, *, slot: int, slots: int, seed: int, start: SourceCursor, shuffle: bool,
            shuffle_buffer: int) -> Iterator[_Share]:
    """The slot's shares of passes ``start.pass_no``, ``+1``, ... (empty shares skipped), endless."""
    starts = np.cumsum((0, *layout.counts))[:-1]
    pass_no, empty = start.pass_no, 0
    while True:
        ranges = pass_share(layout.counts, slots=slots, slot=slot, pass_no=pass_no, seed=seed, key=layout.key,
                            shuffle=shuffle)
        lengths = np.fromiter((len(r) for r in ranges), np.int64, len(ranges))
        n = int(lengths.sum())
        first = start.pos if pass_no == start.pass_no else 0
        if first > n:
            raise ConfigError(f"cursor {start} is past the end of slot {slot}'s share of pass {pass_no} ({n} packs "
                              f"of {slots} slots): the cursor was saved under another layout of ranks × workers")
        if n > first:
            empty = 0
            base = np.repeat(starts[[r.shard for r in ranges]] + [r.start for r in ranges] - np.cumsum(lengths)
                             + lengths, lengths)
            reading = base + np.arange(n)
            order = share_order(n, buffer_size=shuffle_buffer, seed=seed, key=layout.key, pass_no=pass_no, slot=slot,
                                shuffle=shuffle)
            yield _Share(pass_no, ranges, order, reading[order], first)
        else:
            empty += 1
            if empty > slots + 1:  # every slot gets a pack within `slots` passes when the source has any
                raise ConfigError(f"slot {slot} of {slots} gets no pack of a source of {layout.packs} packs")
        pass_no += 1


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


# ---------------------------------------------------------------------------------------------
# One slot's epoch


@dataclass(frozen=True, slots=True)
class SlotRead:
    """One ranged read: packs ``[start, stop)`` of shard ``shard`` of source ``source``, for pass ``pass_no``."""

    source: int
    pass_no: int
    shard: int
    start: int
    stop: int


@dataclass(frozen=True, slots=True, eq=False)
class SlotSchedule:
    """One slot's epoch: per position (``per_slot`` of them, in emission order) its source, pass, shard,
    pack within the shard and within the source, and units; the cursors it starts and ends at; the
    ranged reads it needs (each source's share read in order, up to what its shuffle buffer emits)."""

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
              shuffle_buffer: int = 256) -> SlotSchedule:
    """Slot ``slot``'s ``per_slot`` packs of one mixture epoch, from each source's cursor on.

    ``per_slot`` is :meth:`~.mixture.MixtureEpoch.per_slot` (the same on every slot); the next epoch
    starts from ``plan.end``. Deterministic: a function of its arguments alone.

    Example:
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
    means = np.array([max(layout.mean_units, 1e-9) for layout in layouts])
    offsets = np.array([slot_phase(slot, slots, i) for i in range(k)]) * means / w
    expected = w / means / (w / means).sum()  # fraction of packs each source gives
    gens = [_shares(layout, slot=slot, slots=slots, seed=seed, start=c, shuffle=shuffle, shuffle_buffer=shuffle_buffer)
            for layout, c in zip(layouts, cursors)]
    got: list[list[_Share]] = [[] for _ in range(k)]
    have = [0] * k
    want = [min(per_slot, math.ceil(per_slot * f * 1.05) + 64) for f in expected]
    while True:
        for i in range(k):
            while have[i] < want[i]:
                piece = next(gens[i])
                got[i].append(piece)
                have[i] += len(piece.rows) - piece.first
        units = [layouts[i].units[_rows(got[i])] for i in range(k)]
        tags = [_tags(u, w[i], offsets[i]) for i, u in enumerate(units)]
        flat = np.concatenate(tags)
        picked = np.argsort(flat, kind="stable")[:per_slot]
        tau = flat[picked[-1]] if per_slot else -np.inf
        short = [i for i in range(k) if have[i] < per_slot and (not len(tags[i]) or tags[i][-1] <= tau)]
        if not short:
            break
        for i in short:  # a source gave more than expected: its stream must reach past the cut
            want[i] = min(per_slot, 2 * want[i])
    lengths = [len(t) for t in tags]
    source = np.repeat(np.arange(k), lengths)[picked]
    taken = np.bincount(source, minlength=k)
    out = {name: np.empty(per_slot, np.int64) for name in ("pass_no", "shard", "pack", "row", "units")}
    ends, reads = [], []
    for i, layout in enumerate(layouts):
        rows, passes = _rows(got[i]), _passes(got[i])
        t = int(taken[i])
        mask = source == i
        starts = np.cumsum((0, *layout.counts))
        shard = np.searchsorted(starts, rows[:t], side="right") - 1
        out["row"][mask], out["pass_no"][mask], out["units"][mask] = rows[:t], passes[:t], units[i][:t]
        out["shard"][mask], out["pack"][mask] = shard, rows[:t] - starts[shard]
        end, piece_reads = _end_and_reads(got[i], t, i, cursors[i])
        ends.append(end)
        reads.extend(piece_reads)
    return SlotSchedule(source=source.astype(np.int64), start=cursors, end=tuple(ends), reads=tuple(reads), **out)


def _rows(pieces: list[_Share]) -> np.ndarray:
    return np.concatenate([p.rows[p.first:] for p in pieces]) if pieces else np.zeros(0, np.int64)


def _passes(pieces: list[_Share]) -> np.ndarray:
    if not pieces:
        return np.zeros(0, np.int64)
    return np.repeat([p.pass_no for p in pieces], [len(p.rows) - p.first for p in pieces])


def _end_and_reads(pieces: list[_Share], taken: int, source: int,
                   start: SourceCursor) -> tuple[SourceCursor, list[SlotRead]]:
    """The cursor after ``taken`` packs of ``pieces``, and the ranged reads that emitting them needs."""
    reads: list[SlotRead] = []
    left = taken
    end = SourceCursor(pieces[0].pass_no, pieces[0].first) if pieces else start
    for p in pieces:
        n = min(left, len(p.rows) - p.first)
        if n <= 0:
            break
        a, b = p.first, p.first + n
        left -= n
        end = SourceCursor(p.pass_no + 1, 0) if b == len(p.rows) else SourceCursor(p.pass_no, b)
        lo, hi = int(p.order[a:b].min()), int(p.order[a:b].max()) + 1  # reading positions the emitted ones need
        pos = 0
        for r in p.ranges:
            if pos + len(r) > lo and pos < hi:
                reads.append(SlotRead(source, p.pass_no, r.shard, r.start + max(lo - pos, 0),
                                      r.start + min(hi - pos, len(r))))
            pos += len(r)
    return end, reads


def slot_stream(layout: SourceLayout, *, slot: int, slots: int, seed: int, packs: int,
                start: SourceCursor = SourceCursor(), shuffle: bool = True,
                shuffle_buffer: int = 256) -> tuple[np.ndarray, np.ndarray, SourceCursor]:
    """The next ``packs`` packs of one source on one slot, from ``start``: ``(pass_no, row, end)``.

    ``row`` is the pack's row in the source (manifest order, the pack index's row).

    Example:
        >>> a = source_layout("a", [2, 2], np.ones(4, np.int64))
        >>> passes, rows, end = slot_stream(a, slot=0, slots=2, seed=0, packs=3, shuffle=False)
        >>> passes.tolist(), rows.tolist(), end
        ([0, 0, 1], [0, 1, 0], SourceCursor(pass_no=1, pos=1))
    """
    pieces: list[_Share] = []
    have = 0
    gen = _shares(layout, slot=slot, slots=slots, seed=seed, start=start, shuffle=shuffle,
                  shuffle_buffer=shuffle_buffer)
    while have < packs:
        pieces.append(next(gen))
        have += len(pieces[-1].rows) - pieces[-1].first
    end, _ = _end_and_reads(pieces, packs, 0, start)
    return _passes(pieces)[:packs], _rows(pieces)[:packs], end
