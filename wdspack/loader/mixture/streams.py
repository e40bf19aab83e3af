"""One source's stream on a rank, and where a rank stands in it (pure functions over integers).

    pass p of a source ─► shards in a seeded order (seed, source key, p) ─► one run per rank
    rank's stream:  share of pass 0 │ share of pass 1 │ ...   handed out in blocks
    block:          ceil(share / workers) reading positions ─► ranged reads ─► shuffle-buffer order

Holds: every pack of a pass goes to exactly one rank, none read by two workers of a rank; every
pack of a pass is handed out before the next pass starts; a :class:`SourceCursor` is computed from
integers alone, the same on every worker of the rank, and does not depend on the weights.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError
from ..plan import PackRange

_GOLDEN = 0.6180339887498949

__all__ = ["SlotRead", "SourceCursor", "SourceLayout", "pass_share", "share_order", "slot_stream", "source_key",
           "source_layout"]


@dataclass(frozen=True, slots=True, repr=False)
class SourceCursor:
    """Where a rank stands in one source's stream (the same on every worker of the rank).

    The plain form (``held`` empty, ``frontier`` False; always so with one worker per rank): the first
    ``pos`` packs of the rank's share of pass ``pass_no``, as one block, are emitted. The block form
    (several workers): ``pos`` is the first reading position of that share not handed out yet, and
    ``held`` the blocks handed out and not finished, each ``(worker, pass_no, start, stop, emitted)``:
    reading positions ``[start, stop)`` of that pass's share, the first ``emitted`` of them (in the
    block's emission order) emitted; the worker finishes its block first in the next epoch.
    """

    pass_no: int = 0
    pos: int = 0
    held: tuple[tuple[int, int, int, int, int], ...] = ()
    frontier: bool = False

    def __repr__(self) -> str:
        more = f", held={self.held}, frontier=True" if self.frontier or self.held else ""
        return f"SourceCursor(pass_no={self.pass_no}, pos={self.pos}{more})"


@dataclass(frozen=True, slots=True, eq=False)
class SourceLayout:
    """One source as the schedule sees it: packs per shard (manifest order), each pack's units, its key."""

    counts: tuple[int, ...]
    #: ``[packs]`` int64: each pack's value in the mixture's unit, in manifest order
    units: np.ndarray
    #: seeds the source's shard orders: from its name, so adding a source leaves the others' orders alone
    key: int
    #: after an elastic resume: per pass, the rows left of it (in the pass's reading order), split over
    #: ``rest_ranks`` ranks instead of the whole pass (:mod:`.rest`); None: every pass whole
    rest: Mapping[int, np.ndarray] | None = None
    rest_ranks: int = 0
    #: ``balance="cost"``: each pack's cost; a pass is then dealt to the ranks by cost in runs of ``run``
    #: packs (:func:`dealt_share`) instead of cut into consecutive runs
    costs: np.ndarray | None = None
    run: int = 1

    @property
    def packs(self) -> int:
        return len(self.units)

    @property
    def mean_units(self) -> float:
        return float(self.units.sum()) / max(len(self.units), 1)


@dataclass(frozen=True, slots=True)
class SlotRead:
    """One ranged read: packs ``[start, stop)`` of shard ``shard`` of source ``source``, for pass ``pass_no``."""

    source: int
    pass_no: int
    shard: int
    start: int
    stop: int


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
# One source's share of a pass on a rank


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
    """Slot ``slot``'s share of pass ``pass_no`` of one source, as ranges in reading order (the
    schedule splits a pass over the ranks: ``slots`` ranks, ``slot`` the rank).

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
    """The order a block of ``n`` packs is emitted in (``slot`` tells blocks apart; a rank's whole share
    is ``slot=rank``): :func:`~wdspack.loader.plan.shuffle_order`'s, computed without a Python loop (the same array
    for the same seed).

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


# ---------------------------------------------------------------------------------------------
# A rank's blocks


@dataclass(slots=True, eq=False)
class Block:
    """Reading positions ``[start, stop)`` of a rank's share of pass ``pass_no``, emitted in the block's
    own shuffle-buffer order (``order``: emission -> reading position); ``done`` of them emitted."""

    owner: int
    pass_no: int
    start: int
    stop: int
    ranges: tuple[PackRange, ...]  # the rank's share of the pass, in reading order
    order: np.ndarray
    rows: np.ndarray  # emission -> row in the source
    units: np.ndarray  # emission -> units
    unit: list[int]  # the same, for the merge's loop (several workers)
    done: int
    origin: str = "frontier"  # where take() found it: "own", "queue" or "frontier"


class RankStream:
    """One source's stream on a rank, handed out in blocks: the cursor's ``held`` blocks first (each to
    its worker; those of workers this layout lacks to whoever needs the source next, oldest first),
    then from the frontier ``(pass_no, pos)`` on, ``ceil(share / workers)`` reading positions at a time.
    Every worker of the rank builds the same one, and the merge hands blocks out for all of them."""

    def __init__(self, layout: SourceLayout, cursor: SourceCursor, *, rank: int, ranks: int, workers: int,
                 seed: int, shuffle: bool, shuffle_buffer: int) -> None:
        self.layout, self.rank, self.ranks, self.workers = layout, rank, ranks, workers
        self.seed, self.shuffle, self.buffer = seed, shuffle, shuffle_buffer
        self.shares: dict[int, tuple[tuple[PackRange, ...], np.ndarray]] = {}
        self.own: dict[int, Block] = {}
        self.queue: list[Block] = []
        self.next: Block | None = None
        self.pass_no, self.pos = cursor.pass_no, cursor.pos
        if self.pos > len(self.share(self.pass_no)[1]):
            raise ConfigError(f"cursor {cursor} is past the end of rank {rank}'s share of pass {self.pass_no} "
                              f"({len(self.share(self.pass_no)[1])} packs of {ranks} ranks): the cursor was saved "
                              "under another layout of ranks")
        held, n = list(cursor.held), len(self.shares[self.pass_no][1])
        if not (cursor.frontier or held) and 0 < self.pos < n:  # the plain form: the whole share, one block
            held, self.pass_no, self.pos = [(0, self.pass_no, 0, n, self.pos)], self.pass_no + 1, 0
        for owner, p, a, b, done in sorted(held, key=lambda h: h[1:]):
            n = len(self.share(p)[1])
            if not (0 <= a < b <= n and 0 <= done < b - a):
                raise ConfigError(f"held block {(p, a, b, done)} of cursor {cursor} is not within rank {rank}'s share "
                                  f"of pass {p} ({n} packs of {ranks} ranks): the cursor was saved under another "
                                  "layout of ranks")
            block = self.block(p, a, b, owner=owner, done=done)
            if owner < workers and owner not in self.own:
                self.own[owner], block.origin = block, "own"
            else:
                self.queue.append(block)
                block.origin = "queue"

    def share(self, pass_no: int) -> tuple[tuple[PackRange, ...], np.ndarray]:
        """The rank's share of a pass: its ranges, and the row of each reading position."""
        if pass_no not in self.shares and self.layout.rest is not None and pass_no in self.layout.rest:
            if self.ranks != self.layout.rest_ranks:
                raise ConfigError(f"the rest of pass {pass_no} was split over {self.layout.rest_ranks} ranks, not "
                                  f"{self.ranks}; this is a wdspack bug")
            left = np.asarray(self.layout.rest[pass_no], np.int64)
            if self.layout.costs is not None:
                mine = dealt_share(left, self.layout.costs, slots=self.ranks, slot=self.rank, pass_no=pass_no,
                                   run=self.layout.run, seed=self.seed, key=self.layout.key, shuffle=self.shuffle)
            else:
                start, stop = _share_bounds(len(left), slots=self.ranks, slot=self.rank, pass_no=pass_no)
                mine = left[start:stop]
            self.shares[pass_no] = row_ranges(mine, self.layout.counts), mine
        if pass_no not in self.shares and self.layout.costs is not None:
            ranges = pass_share(self.layout.counts, slots=1, slot=0, pass_no=pass_no, seed=self.seed,
                                key=self.layout.key, shuffle=self.shuffle)
            starts = np.cumsum((0, *self.layout.counts))
            whole = np.concatenate([starts[r.shard] + np.arange(r.start, r.stop) for r in ranges])
            mine = dealt_share(whole, self.layout.costs, slots=self.ranks, slot=self.rank, pass_no=pass_no,
                               run=self.layout.run, seed=self.seed, key=self.layout.key, shuffle=self.shuffle)
            self.shares[pass_no] = row_ranges(mine, self.layout.counts), mine
        if pass_no not in self.shares:
            ranges = pass_share(self.layout.counts, slots=self.ranks, slot=self.rank, pass_no=pass_no, seed=self.seed,
                                key=self.layout.key, shuffle=self.shuffle)
            starts = np.cumsum((0, *self.layout.counts))
            rows = [starts[r.shard] + np.arange(r.start, r.stop) for r in ranges]
            self.shares[pass_no] = ranges, np.concatenate(rows) if rows else np.zeros(0, np.int64)
        return self.shares[pass_no]

    def block(self, pass_no: int, start: int, stop: int, *, owner: int, done: int = 0) -> Block:
        ranges, reading = self.share(pass_no)
        slot = self.rank if start == 0 else self.ranks * start + self.rank  # a whole share: a one-worker slot's order
        order = start + share_order(stop - start, buffer_size=self.buffer, seed=self.seed, key=self.layout.key,
                                    pass_no=pass_no, slot=slot, shuffle=self.shuffle)
        rows = reading[order]
        units = self.layout.units[rows]
        return Block(owner, pass_no, start, stop, ranges, order, rows, units,
                     units.tolist() if self.workers > 1 else [], done)

    def frontier(self, pass_no: int, pos: int) -> tuple[int, int]:
        """``(pass_no, pos)`` moved past the ends of shares (and empty shares)."""
        empty = 0
        while pos >= len(self.share(pass_no)[1]):
            # a pass's rest after an elastic resume may be empty, many in a row: not the source's fault
            kept = self.layout.rest is not None and pass_no in self.layout.rest
            empty = empty + 1 if not (len(self.shares[pass_no][1]) or kept) else 0
            if empty > self.ranks + 1:  # every rank gets a pack within `ranks` passes when the source has any
                raise ConfigError(f"rank {self.rank} of {self.ranks} gets no pack of a source of {self.layout.packs} "
                                  "packs")
            pass_no, pos = pass_no + 1, 0
        return pass_no, pos

    def peek(self, owner: int) -> Block:
        """The block ``owner`` takes when it next needs the source: the older of its own and the first left
        by a worker this layout lacks, else the next one from the frontier."""
        mine = self.own.get(owner)
        if self.queue and (mine is None or (self.queue[0].pass_no, self.queue[0].start) < (mine.pass_no, mine.start)):
            return self.queue[0]
        if mine is not None:
            return mine
        if self.next is None:
            self.pass_no, self.pos = self.frontier(self.pass_no, self.pos)
            n = len(self.shares[self.pass_no][1])
            self.next = self.block(self.pass_no, self.pos, min(self.pos - (-n // self.workers), n), owner=-1)
        return self.next

    def take(self, owner: int) -> Block:
        block = self.peek(owner)
        if block.origin == "own":
            del self.own[owner]
        elif block.origin == "queue":
            self.queue.pop(0)
        else:
            self.pos, self.next = block.stop, None
        block.owner = owner
        return block

    def untake(self, block: Block) -> None:
        """Give back the block last taken, unread."""
        if block.origin == "own":
            self.own[block.owner] = block
        elif block.origin == "queue":
            self.queue.insert(0, block)
        else:
            self.pass_no, self.pos, self.next = block.pass_no, block.start, block

    def cursor(self, held: Sequence[Block]) -> SourceCursor:
        """The cursor after the epoch, ``held`` the workers' unfinished blocks: plain where it can be."""
        pass_no, pos = self.frontier(self.pass_no, self.pos)
        blocks = sorted([*held, *self.own.values(), *self.queue], key=lambda b: (b.pass_no, b.start))
        if not blocks and pos == 0:
            return SourceCursor(pass_no, 0)
        if len(blocks) == 1:
            b = blocks[0]
            if b.start == 0 and b.stop == len(self.shares[b.pass_no][1]) and (pass_no, pos) == self.frontier(
                    b.pass_no + 1, 0):
                return SourceCursor(b.pass_no, b.done)
        return SourceCursor(pass_no, pos, tuple((b.owner, b.pass_no, b.start, b.stop, b.done) for b in blocks), True)


def dealt_share(rows: np.ndarray, costs: np.ndarray, *, slots: int, slot: int, pass_no: int, run: int, seed: int,
                key: int, shuffle: bool = True) -> np.ndarray:
    """Slot ``slot``'s rows of a pass under ``balance="cost"``, in its reading order.

    The pass's ``rows`` (in reading order) are cut into runs of ``run`` consecutive rows, and the runs
    dealt costliest first in *rounds* of one run per slot, in a snake (0, 1, ..., ``slots - 1``, then
    back; turned by the pass): a slot's ``g``-th run comes from round ``g``, so every slot holds a
    stratified sample of the pass's costs and about as many packs. A slot reads its runs in a
    low-discrepancy order of the rounds, offset by a phase seeded by ``(seed, key, pass_no)`` alone, the
    same on every slot: at every reading position the slots hold runs of about the same cost, and any
    stretch of positions spans the costs evenly. Every row goes to exactly one slot.

    Example:
        >>> rows, costs = np.arange(6), np.array([5, 1, 9, 3, 8, 2])
        >>> [dealt_share(rows, costs, slots=2, slot=s, pass_no=0, run=1, seed=0, key=1, shuffle=False).tolist()
        ...  for s in range(2)]  # rounds {9, 8} {5, 3} {2, 1}: each slot one of each
        [[2, 5, 3], [4, 1, 0]]
    """
    rows = np.asarray(rows, np.int64)
    if not len(rows):
        return rows
    starts = np.arange(0, len(rows), max(int(run), 1))
    order = np.argsort(-np.add.reduceat(np.asarray(costs)[rows], starts), kind="stable")  # costliest run first
    k = np.arange(len(order))
    owner = np.where(k // slots % 2 == 0, k % slots, slots - 1 - k % slots)
    mine = order[(owner + pass_no) % slots == slot]  # by round
    rounds = -(-len(order) // slots)
    # reading position p takes the round ranked like frac(p·φ + u) (u seeded): any stretch of positions,
    # a worker's block or a balance window, spans the cost strata evenly, alike on every slot
    u = np.random.default_rng([seed, key, pass_no, 0xDEA1]).random() if shuffle else 0.0
    perm = np.argsort(np.argsort((np.arange(rounds) * _GOLDEN + u) % 1.0, kind="stable"), kind="stable")
    mine = mine[perm[perm < len(mine)]]
    ends = np.r_[starts[1:], len(rows)]
    return np.concatenate([rows[starts[j]:ends[j]] for j in mine]) if len(mine) else rows[:0]


def row_ranges(rows: np.ndarray, counts: Sequence[int]) -> tuple[PackRange, ...]:
    """Rows of a source (in reading order) as ranges: a new one wherever the next row is not the one after
    in the same shard.

    Example:
        >>> [(r.shard, r.start, r.stop) for r in row_ranges(np.array([1, 2, 4, 5, 0]), [3, 3])]
        [(0, 1, 3), (1, 1, 3), (0, 0, 1)]
    """
    starts = np.cumsum((0, *counts))
    rows = np.asarray(rows, np.int64)
    if not len(rows):
        return ()
    shard = np.searchsorted(starts, rows, side="right") - 1
    cut = np.flatnonzero((np.diff(rows) != 1) | (np.diff(shard) != 0)) + 1
    bounds = [0, *cut.tolist(), len(rows)]
    return tuple(PackRange(int(shard[a]), int(rows[a] - starts[shard[a]]), int(rows[b - 1] - starts[shard[a]]) + 1)
                 for a, b in itertools.pairwise(bounds))


def block_reads(block: Block, a: int, b: int, source: int) -> Iterator[SlotRead]:
    """The ranged reads that emitting ``[a, b)`` of a block needs: from the first reading position they
    take to the last (a shard split only where the rank's share is)."""
    lo, hi = int(block.order[a:b].min()), int(block.order[a:b].max()) + 1
    pos = 0
    for r in block.ranges:
        if pos + len(r) > lo and pos < hi:
            yield SlotRead(source, block.pass_no, r.shard, r.start + max(lo - pos, 0), r.start + min(hi - pos, len(r)))
        pos += len(r)


def slot_stream(layout: SourceLayout, *, slot: int, slots: int, seed: int, packs: int,
                start: SourceCursor = SourceCursor(), shuffle: bool = True,
                shuffle_buffer: int = 256) -> tuple[np.ndarray, np.ndarray, SourceCursor]:
    """The next ``packs`` packs of one source on one slot of one worker per rank (a slot is a rank), from
    ``start``: ``(pass_no, row, end)``. ``row`` is the pack's row in the source (the pack index's row).

    Example:
        >>> a = source_layout("a", [2, 2], np.ones(4, np.int64))
        >>> passes, rows, end = slot_stream(a, slot=0, slots=2, seed=0, packs=3, shuffle=False)
        >>> passes.tolist(), rows.tolist(), end
        ([0, 0, 1], [0, 1, 0], SourceCursor(pass_no=1, pos=1))
    """
    s = RankStream(layout, start, rank=slot, ranks=slots, workers=1, seed=seed, shuffle=shuffle,
                   shuffle_buffer=shuffle_buffer)
    passes: list[int] = []
    rows: list[int] = []
    held = []
    while len(rows) < packs:
        b = s.take(0)
        m = min(packs - len(rows), len(b.rows) - b.done)
        passes += [b.pass_no] * m
        rows += b.rows[b.done:b.done + m].tolist()
        b.done += m
        held = [b] if b.done < len(b.rows) else []
    return np.array(passes, np.int64), np.array(rows, np.int64), s.cursor(held)
