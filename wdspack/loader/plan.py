"""Who reads which packs, in which order: pure functions over the manifest's pack counts.

    shards (epoch order)   s2:6   s0:6   s3:6   s1:6        (4 shards of 6 packs, 2 ranks × 1 worker)
    slot 0 (rank 0)        s2[0:6] s0[0:6]           12 packs
    slot 1 (rank 1)        s3[0:6] s1[0:6]           12 packs

Holds: every slot computes the same :func:`plan_epoch` from the same integers (no process talks to
another, none lists a directory); at most ``slots - 1`` shards are split, each piece one ranged
read; every slot yields exactly ``per_slot`` packs, a multiple of the batch size (``remainder``
"drop": floor, "wrap": ceil, then a new lap); with ``balance="cost"`` :mod:`.balance` gives the
split and order instead. docs/architecture.md#the-plan tells the rule and the remainders.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

__all__ = ["EpochPlan", "PackRange", "epoch_shares", "plan_epoch", "plan_remainder", "shuffle_order", "slot_order"]

REMAINDER_POLICIES = ("drop", "wrap")


@dataclass(frozen=True, slots=True)
class PackRange:
    """Packs ``[start, stop)`` of shard number ``shard`` (the index in the manifest's list)."""

    shard: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class EpochPlan:
    """One epoch's split: the ranges of every slot (in reading order) and the packs each yields."""

    slots: tuple[tuple[PackRange, ...], ...]
    per_slot: int
    #: per slot, the order its positions are emitted in (balanced plans); None: the shuffle buffer's
    orders: tuple[np.ndarray, ...] | None = None

    def assigned(self, slot: int) -> int:
        return sum(len(r) for r in self.slots[slot])


def plan_epoch(counts: Sequence[int], *, slots: int, epoch: int, seed: int, shuffle: bool, remainder: str,
               batch_size: int = 1) -> EpochPlan:
    """Split the packs of all shards over ``slots`` slots for one epoch.

    Args:
        counts: packs per shard, in manifest order.
        slots: ``world_size * workers``.
        epoch: the epoch (changes the shard order and so the split when ``shuffle``).
        seed: the shuffling seed.
        shuffle: False keeps manifest order (each slot reads its shards in order).
        remainder: ``"drop"`` or ``"wrap"`` (see the module docstring).
        batch_size: ``per_slot`` is a multiple of it, so every rank gets the same number of full batches.

    Example:
        >>> p = plan_epoch([6, 6, 6, 6], slots=2, epoch=0, seed=0, shuffle=False, remainder="drop")
        >>> p.per_slot, [[(r.shard, r.start, r.stop) for r in s] for s in p.slots]
        (12, [[(0, 0, 6), (1, 0, 6)], [(2, 0, 6), (3, 0, 6)]])
    """
    per_slot, capacities = epoch_shares(counts, slots=slots, remainder=remainder, batch_size=batch_size)
    rng = np.random.default_rng([seed, epoch, 0x5EED])
    order = rng.permutation(len(counts)) if shuffle else np.arange(len(counts))
    assignment = _assign(counts, capacities, order)
    if shuffle:
        assignment = [[ranges[i] for i in np.random.default_rng([seed, epoch, s, 0xA55]).permutation(len(ranges))]
                      for s, ranges in enumerate(assignment)]
    else:
        assignment = [sorted(ranges, key=lambda r: (r.shard, r.start)) for ranges in assignment]
    return EpochPlan(slots=tuple(tuple(r) for r in assignment), per_slot=per_slot)


def epoch_shares(counts: Sequence[int], *, slots: int, remainder: str, batch_size: int) -> tuple[int, list[int]]:
    """A whole epoch's ``per_slot`` and each slot's share; raises when the packs are too few."""
    if remainder not in REMAINDER_POLICIES:
        raise ConfigError(f"remainder={remainder!r} is not one of {REMAINDER_POLICIES}")
    if slots < 1 or batch_size < 1:
        raise ConfigError(f"slots ({slots}) and batch_size ({batch_size}) must be >= 1")
    total = int(sum(counts))
    per_slot, capacities = _shares(total, slots=slots, remainder=remainder, batch_size=batch_size)
    if per_slot == 0 or total < slots:
        need = batch_size if remainder == "drop" else 1
        raise ConfigError(f"the dataset has {total} packs, too few for {slots} rank×worker slots with batch_size "
                          f"{batch_size} (each slot needs at least {need} of its own); use fewer workers or a "
                          "smaller batch")
    return per_slot, capacities


def _shares(total: int, *, slots: int, remainder: str, batch_size: int) -> tuple[int, list[int]]:
    """``per_slot`` (a multiple of ``batch_size``) and the packs each slot is given (see the module doc)."""
    if remainder == "drop":
        per_slot = total // slots // batch_size * batch_size
        return per_slot, [per_slot] * slots
    q, extra = divmod(total, slots)
    return -(-total // (slots * batch_size)) * batch_size, [q + (1 if s < extra else 0) for s in range(slots)]


def _assign(counts: Sequence[int], capacities: list[int], order: np.ndarray) -> list[list[PackRange]]:
    """The shards in ``order``, back to back, cut into consecutive runs of ``capacities`` packs.

    McNaughton's wrap-around rule: a cut falls inside a shard only at a slot boundary, so at most
    ``slots - 1`` shards are split, and a shard no larger than a slot's share is split in two
    pieces at most (one extra ranged read); shards that divide evenly are never split. What lies
    past the last slot's capacity is not read (``remainder="drop"``).
    """
    out: list[list[PackRange]] = [[] for _ in capacities]
    slot, room = 0, capacities[0] if capacities else 0
    for s in (int(s) for s in order):
        start, n = 0, int(counts[s])
        while start < n:
            while room == 0:
                slot += 1
                if slot == len(capacities):
                    return out
                room = capacities[slot]
            take = min(room, n - start)
            out[slot].append(PackRange(s, start, start + take))
            room -= take
            start += take
    return out


def slot_order(plan: EpochPlan, slot: int, *, seed: int, epoch: int, lap: int, shuffle: bool,
               shuffle_buffer: int) -> np.ndarray:
    """The order a slot emits its positions in, on lap ``lap``: the balanced plan's, or a shuffle buffer's."""
    if plan.orders is not None:
        return plan.orders[slot]
    size = plan.assigned(slot)
    rng = np.random.default_rng([seed, epoch, slot, lap, 0xB0F])
    return shuffle_order(size, buffer_size=shuffle_buffer if shuffle else 1, rng=rng)


def shuffle_order(n: int, *, buffer_size: int, rng: np.random.Generator) -> np.ndarray:
    """The order in which a shuffle buffer of ``buffer_size`` emits items ``0..n-1`` read in order.

    The same algorithm as a streaming buffer (fill, then emit a random slot and refill it with the
    next item, then drain in random order), computed on indices up front. Because the order is a
    pure function of ``(n, buffer_size, rng)``, a reader can resume after any number of emitted
    items and rebuild the buffer exactly; and at emission ``k`` no item later than
    ``k + buffer_size`` has been needed, so a reorder stage holds at most ``buffer_size`` packs.

    Example:
        >>> shuffle_order(5, buffer_size=1, rng=np.random.default_rng(0)).tolist()
        [0, 1, 2, 3, 4]
        >>> sorted(shuffle_order(6, buffer_size=3, rng=np.random.default_rng(0)).tolist())
        [0, 1, 2, 3, 4, 5]
    """
    if buffer_size <= 1 or n <= 1:
        return np.arange(n, dtype=np.int64)
    size = min(buffer_size, n)
    buf = list(range(size))
    out = np.empty(n, dtype=np.int64)
    picks = (rng.random(n - size) * size).astype(np.int64)
    for k, i in enumerate(range(size, n)):
        j = int(picks[k])
        out[k] = buf[j]
        buf[j] = i
    out[n - size:] = np.asarray(buf, dtype=np.int64)[rng.permutation(size)]
    return out


def plan_remainder(counts: Sequence[int], consumed: Sequence[np.ndarray], *, slots: int, epoch: int, seed: int,
                   shuffle: bool, remainder: str, batch_size: int = 1) -> EpochPlan:
    """Split what is left of an epoch (the packs not in ``consumed``) over a new layout of slots.

    ``consumed[s]`` marks the packs of shard ``s`` already read this epoch, or that the epoch
    never reads (``remainder="drop"`` leaves some out). The left packs form maximal runs inside
    their shards, which :func:`plan_epoch`'s assignment gives to ``slots`` slots. Every slot
    yields ``per_slot`` packs: with ``"drop"`` fewer than ``slots × batch_size`` left packs are
    not read (as at every epoch's end; ``per_slot`` may be 0), with ``"wrap"`` all are and a slot
    short of ``per_slot`` repeats its own (fewer packs than slots: read as ``"drop"``).

    Example:
        >>> done = [np.array([True, True, False, False]), np.array([True, False, False, False])]
        >>> p = plan_remainder([4, 4], done, slots=1, epoch=0, seed=0, shuffle=False, remainder="drop")
        >>> p.per_slot, [(r.shard, r.start, r.stop) for r in p.slots[0]]
        (5, [(0, 2, 4), (1, 1, 4)])
    """
    runs: list[tuple[int, int, int]] = []
    for s, mask in enumerate(consumed):
        left = np.flatnonzero(~np.asarray(mask, bool))
        if left.size:
            breaks = np.flatnonzero(np.diff(left) > 1)
            for a, b in zip(np.r_[0, breaks + 1], np.r_[breaks, left.size - 1]):
                runs.append((s, int(left[a]), int(left[b]) + 1))
    total = sum(b - a for _, a, b in runs)
    per_slot, capacities = _shares(total, slots=slots, batch_size=batch_size,
                                   remainder="wrap" if remainder == "wrap" and total >= slots else "drop")
    rng = np.random.default_rng([seed, epoch, 0xE1A])
    order = rng.permutation(len(runs)) if shuffle else np.arange(len(runs))
    assigned = _assign([b - a for _, a, b in runs], capacities, order) if per_slot else [[] for _ in range(slots)]
    slots_out = []
    for ranges in assigned:
        mapped = [PackRange(runs[r.shard][0], runs[r.shard][1] + r.start, runs[r.shard][1] + r.stop) for r in ranges]
        slots_out.append(tuple(sorted(mapped, key=lambda r: (r.shard, r.start)) if not shuffle else mapped))
    return EpochPlan(slots=tuple(slots_out), per_slot=per_slot)


