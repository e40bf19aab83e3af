"""Who reads which packs, in which order: pure functions over the manifest's pack counts.

Every ``(rank, worker)`` slot computes the same :func:`plan_epoch` from the same integers, so
no process talks to another and none lists a directory. For 4 shards of 6 packs on 2 ranks × 1
worker with ``remainder="drop"``::

    shards (epoch order)   s2:6   s0:6   s3:6   s1:6
    slot 0 (rank 0)        s2[0:6] s3[0:6]           12 packs
    slot 1 (rank 1)        s0[0:6] s1[0:6]           12 packs

Whole shards go to the slot with the most room, largest first, so a shard is opened by one slot
only; what does not fit whole is split into pack ranges (``s4[0:57]``, ``s4[57:100]``) to fill
the last gaps. Every slot then yields exactly ``per_slot`` packs, a multiple of the batch size:

* ``remainder="drop"``: ``per_slot = floor(total / slots / batch) * batch``; the packs past the
  slots' capacity are not read this epoch (fewer than ``slots * batch``; which ones changes with
  the epoch's shard order).
* ``remainder="wrap"``: ``per_slot = ceil(total / slots / batch) * batch``; every pack is read,
  and a slot short of ``per_slot`` starts again at the beginning of its own assignment (a second
  "lap", in a new shuffled order) until it has yielded ``per_slot`` packs.

A slot also wraps when it skipped corrupt packs, so the count per slot holds either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

__all__ = ["EpochPlan", "PackRange", "plan_epoch", "shuffle_order"]

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
        (12, [[(0, 0, 6), (2, 0, 6)], [(1, 0, 6), (3, 0, 6)]])
    """
    if remainder not in REMAINDER_POLICIES:
        raise ConfigError(f"remainder={remainder!r} is not one of {REMAINDER_POLICIES}")
    if slots < 1 or batch_size < 1:
        raise ConfigError(f"slots ({slots}) and batch_size ({batch_size}) must be >= 1")
    total = int(sum(counts))
    if remainder == "drop":
        per_slot = total // slots // batch_size * batch_size
        capacities = [per_slot] * slots
    else:
        per_slot = -(-total // (slots * batch_size)) * batch_size
        q, extra = divmod(total, slots)
        capacities = [q + (1 if s < extra else 0) for s in range(slots)]
    if per_slot == 0 or total < slots:
        need = batch_size if remainder == "drop" else 1
        raise ConfigError(f"the dataset has {total} packs, too few for {slots} rank×worker slots with batch_size "
                          f"{batch_size} (each slot needs at least {need} of its own); use fewer workers or a "
                          "smaller batch")
    rng = np.random.default_rng([seed, epoch, 0x5EED])
    order = rng.permutation(len(counts)) if shuffle else np.arange(len(counts))
    assignment = _assign(counts, capacities, order)
    if shuffle:
        assignment = [[ranges[i] for i in np.random.default_rng([seed, epoch, s, 0xA55]).permutation(len(ranges))]
                      for s, ranges in enumerate(assignment)]
    else:
        assignment = [sorted(ranges, key=lambda r: (r.shard, r.start)) for ranges in assignment]
    return EpochPlan(slots=tuple(tuple(r) for r in assignment), per_slot=per_slot)


def _assign(counts: Sequence[int], capacities: list[int], order: np.ndarray) -> list[list[PackRange]]:
    """Whole shards first (largest first, into the slot with the most room), then split the rest."""
    room = list(capacities)
    out: list[list[PackRange]] = [[] for _ in room]
    deferred = []
    for s in sorted((int(s) for s in order), key=lambda s: -counts[s]):  # stable: ties keep the epoch order
        n = int(counts[s])
        if n == 0:
            continue
        best = max(range(len(room)), key=lambda i: room[i])
        if n <= room[best]:
            out[best].append(PackRange(s, 0, n))
            room[best] -= n
        else:
            deferred.append(s)
    slot = 0
    for s in deferred:
        start, n = 0, int(counts[s])
        while start < n:
            while slot < len(room) and room[slot] == 0:
                slot += 1
            if slot == len(room):
                return out  # drop: the rest of the packs are not read this epoch
            take = min(room[slot], n - start)
            out[slot].append(PackRange(s, start, start + take))
            room[slot] -= take
            start += take
    return out


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
