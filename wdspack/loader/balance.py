"""Compute balance: each step's packs dealt to ranks so the slowest rank costs close to the mean.

Equal tokens are not equal compute: attention grows with Σ sub-sample length², vision cost with
images. With ``PackedDataset(balance="cost")`` the split of :mod:`.plan` is replaced by
:func:`plan_epoch_balanced`, which deals runs of packs by their cost (from the pack index,
:class:`~wdspack.format.pack_index.CostModel`) and sorts each window into shared cost bands;
:func:`step_costs` measures what any plan makes each step wait (``wdspack inspect --ranks``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import ConfigError
from .plan import EpochPlan, PackRange, epoch_shares, slot_order

__all__ = ["RUNS", "TARGET_WAITING", "band_order", "choose_run", "plan_epoch_balanced", "step_costs", "waiting"]

_GOLDEN = 0.6180339887498949

#: Run lengths :func:`choose_run` tries, longest first, where requests cost something.
RUNS = (32, 16, 8, 4, 2, 1)
#: The slowest rank may cost this much more than the mean, summed over an epoch's steps.
TARGET_WAITING = 1.05


def plan_epoch_balanced(counts: Sequence[int], costs: Sequence[np.ndarray], *, ranks: int, workers: int, epoch: int,
                        seed: int, shuffle: bool, remainder: str, batch_size: int = 1, window: int = 256,
                        run: int = 32, heaviest_first: bool = False) -> EpochPlan:
    """Split the packs over ``ranks × workers`` slots so every step's ranks cost about the same.

    ``costs[s]`` holds an integer cost per pack of shard ``s`` (:class:`~wdspack.format.pack_index.CostModel`).
    The slots, the packs per slot (``per_slot``) and the reading economy are those of
    :func:`~.plan.plan_epoch`, except that a slot reads *runs* of at most ``run`` consecutive packs
    (one ranged request each, from the pack index's offsets) instead of whole shards:

    1. The epoch's shard order (and, shuffled, its run order) is cut into *rounds*: round ``j``
       fills the next ``window`` positions of every slot.
    2. Within a round, runs are dealt costliest first to the slot with the least cost so far
       that still has room (a run longer than the room is split), so every slot's window holds
       about the same total cost.
    3. Each slot sorts its window by cost and cuts it into bands of ``batch_size`` packs; a
       permutation of the bands that is the *same on every slot* gives the step order. At any
       step, every rank runs the same cost band of its window (``worker`` ``w`` serves the steps
       ``w, w + workers, ...`` on every rank, so slots line up by their own step count).

    With ``heaviest_first``, the runs holding the epoch's ``ranks × batch_size`` costliest packs
    are dealt first, to the worker-0 slots, and every slot's costliest band leads its first
    window: the first step of the epoch is its costliest (an out-of-memory error shows at once).

    The emission order of slot ``s`` is ``plan.orders[s]`` (positions into its ranges); a slot
    never holds more than ``window`` packs waiting to be emitted.

    Example:
        >>> c = [np.array([5, 1, 9, 3]), np.array([2, 8, 4, 6])]  # two shards' pack costs
        >>> p = plan_epoch_balanced([4, 4], c, ranks=2, workers=1, epoch=0, seed=0, shuffle=False,
        ...                         remainder="drop", window=4, run=2, heaviest_first=True)
        >>> held = [[int(c[r.shard][i]) for r in ranges for i in range(r.start, r.stop)] for ranges in p.slots]
        >>> held  # runs [9, 3] (12), [2, 8] and [4, 6] (10 each), [5, 1] (6): 18 and 20
        [[5, 1, 9, 3], [2, 8, 4, 6]]
        >>> [[costs[k] for k in order] for costs, order in zip(held, p.orders)]  # step by step
        [[9, 3, 5, 1], [8, 4, 6, 2]]
    """
    workers = int(workers)
    slots = ranks * workers
    per_slot, capacity = epoch_shares(counts, slots=slots, remainder=remainder, batch_size=batch_size)
    if window < batch_size or run < 1:
        raise ConfigError(f"balance window ({window}) must be >= batch_size ({batch_size}) and run ({run}) >= 1")
    window = window // batch_size * batch_size
    rng = np.random.default_rng([seed, epoch, 0x5EED])
    shard_order = (rng.permutation(len(counts)) if shuffle else np.arange(len(counts))).tolist()
    runs = [(s, a, min(a + run, int(counts[s]))) for s in shard_order for a in range(0, int(counts[s]), run)]
    if shuffle:
        runs = [runs[i] for i in np.random.default_rng([seed, epoch, 0x2A5]).permutation(len(runs))]
    top: set[tuple[int, int]] = set()
    if heaviest_first and runs:
        flat = np.concatenate([costs[s][a:b] for s, a, b in runs])
        which = np.repeat(np.arange(len(runs)), [b - a for _, a, b in runs])
        start = np.repeat(np.cumsum([0] + [b - a for _, a, b in runs[:-1]]), [b - a for _, a, b in runs])
        best = np.argsort(-flat, kind="stable")[:ranks * batch_size]
        top = {(runs[w][0], runs[w][1] + int(k - start[k])) for k, w in zip(best.tolist(), which[best].tolist())}
        lead = set(which[best].tolist())
        runs = [r for i, r in enumerate(runs) if i in lead] + [r for i, r in enumerate(runs) if i not in lead]
    pieces: list[list[list[tuple[int, int, int]]]] = [[] for _ in range(slots)]  # slot -> round -> runs
    queue = list(reversed(runs))  # pop() takes the next run
    done = [0] * slots
    j = 0
    while any(done[s] < capacity[s] for s in range(slots)) and queue:
        room = [min(window, capacity[s] - done[s]) for s in range(slots)]
        need = sum(room)
        pool = []
        while need > 0 and queue:
            s, a, b = queue.pop()
            if b - a > need:
                queue.append((s, a + need, b))
                b = a + need
            pool.append((s, a, b))
            need -= b - a
        dealt = _deal(pool, costs, room, first=[r * workers for r in range(ranks)] if j == 0 and top else None,
                      top=top)
        for s in range(slots):
            pieces[s].append(_merge(sorted(dealt[s])))
            done[s] += sum(b - a for _, a, b in dealt[s])
        j += 1
    step_rng = np.random.default_rng([seed, epoch, 0xBA1])
    perms: list[np.ndarray] = []
    slots_out, orders = [], []
    for s in range(slots):
        ranges: list[PackRange] = []
        order: list[int] = []
        pos = 0
        for j, round_runs in enumerate(pieces[s]):
            c = np.concatenate([costs[sh][a:b] for sh, a, b in round_runs]) if round_runs else np.zeros(0, np.int64)
            ranges.extend(PackRange(sh, a, b) for sh, a, b in round_runs)
            bands = -(-len(c) // batch_size)
            while len(perms) <= j:
                perms.append(step_rng.permutation(window // batch_size))
            ranked = np.argsort(-c, kind="stable")  # costliest first
            steps = [b for b in perms[j] if b < bands] if bands else []
            if heaviest_first and j == 0 and steps:
                steps = [0] + [b for b in steps if b != 0]
            order.extend(pos + int(k) for b in steps for k in ranked[b * batch_size:(b + 1) * batch_size])
            pos += len(c)
        slots_out.append(tuple(ranges))
        orders.append(np.asarray(order, np.int64))
    return EpochPlan(slots=tuple(slots_out), per_slot=per_slot, orders=tuple(orders))


def band_order(costs: np.ndarray, *, limit: int, window: int, batch_size: int, seed: int, epoch: int,
               heaviest_first: bool = False) -> np.ndarray:
    """A slot's emission order balanced in place (a mixture's, whose packs per rank the schedule fixes).

    The first ``limit`` positions are cut into windows of ``window`` (a multiple of ``batch_size``);
    each window is sorted by cost (``costs``, one per position), cut into bands of ``batch_size``,
    and its bands are emitted in a low-discrepancy order (step ``q`` runs the band ranked like
    ``frac(q·φ + u)``, ``u`` seeded by ``(seed, epoch, window)`` alone), so every slot that holds
    about the same costs in a window runs the same band at the same step, and any stretch of steps
    spans the costs (with a mixture, the sources) evenly. Positions
    from ``limit`` on keep their order. With ``heaviest_first`` the first window's costliest band
    leads. Returns the positions in their new order.

    Example:
        >>> band_order(np.array([1, 9, 5, 7, 3, 8]), limit=6, window=4, batch_size=2, seed=0, epoch=0).tolist()
        [1, 3, 2, 0, 5, 4]

    (costs 1 9 5 7 | 3 8: the first window's bands are {9, 7} and {5, 1})
    """
    window = max(window // batch_size, 1) * batch_size
    out: list[np.ndarray] = []
    for j, a in enumerate(range(0, limit, window)):
        b = min(a + window, limit)
        ranked = a + np.argsort(-np.asarray(costs[a:b]), kind="stable")
        bands = -(-(b - a) // batch_size)
        # step q of the window runs the band ranked like frac(q·φ + u) (u seeded): any stretch of steps
        # spans the bands, hence the costs and the sources, evenly (a random order would clump them)
        u = np.random.default_rng([seed, epoch, j, 0xBA2]).random()
        steps = np.argsort(np.argsort((np.arange(bands) * _GOLDEN + u) % 1.0, kind="stable"), kind="stable").tolist()
        if heaviest_first and j == 0 and steps:
            steps = [0] + [k for k in steps if k != 0]
        out.extend(ranked[k * batch_size:(k + 1) * batch_size] for k in steps)
    out.append(np.arange(limit, len(costs)))
    return np.concatenate(out).astype(np.int64) if out else np.arange(len(costs))


def _deal(pool, costs, room: list[int], *, first: list[int] | None, top: set[tuple[int, int]]) -> list[list]:
    """Deal runs to slots: costliest first, each to the open slot with the least cost so far."""
    import heapq

    load = [0] * len(room)
    left = list(room)
    out: list[list] = [[] for _ in room]
    heap = [(-int(costs[s][a:b].sum()), k, (s, a, b)) for k, (s, a, b) in enumerate(pool)]
    if first is not None:  # heaviest first: runs with top packs go to the worker-0 slots, spread evenly
        held = [0] * len(room)
        rest = []
        for item in sorted(heap):
            s, a, b = item[2]
            n_top = sum((s, i) in top for i in range(a, b))
            roomy = [t for t in first if left[t] > 0]
            if n_top == 0 or not roomy:
                rest.append(item)
                continue
            t = min(roomy, key=lambda t: (held[t], load[t], t))
            take = min(b - a, left[t])
            out[t].append((s, a, a + take))
            load[t] += int(costs[s][a:a + take].sum())
            left[t] -= take
            held[t] += n_top
            if take < b - a:
                rest.append((-int(costs[s][a + take:b].sum()), item[1], (s, a + take, b)))
        heap = rest
    heapq.heapify(heap)
    open_ = [(load[t], t) for t in range(len(room)) if left[t] > 0]  # the slots with room, least cost first
    heapq.heapify(open_)
    serial = len(pool)
    while heap and open_:
        _, _, (s, a, b) = heapq.heappop(heap)
        _, t = heapq.heappop(open_)
        take = min(b - a, left[t])
        out[t].append((s, a, a + take))
        load[t] += int(costs[s][a:a + take].sum())
        left[t] -= take
        if left[t] > 0:
            heapq.heappush(open_, (load[t], t))
        if take < b - a:
            serial += 1
            heapq.heappush(heap, (-int(costs[s][a + take:b].sum()), serial, (s, a + take, b)))
    return out


def _merge(runs: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Join runs that continue each other in the same shard (one request instead of two)."""
    out: list[tuple[int, int, int]] = []
    for s, a, b in runs:
        if out and out[-1][0] == s and out[-1][2] == a:
            out[-1] = (s, out[-1][1], b)
        else:
            out.append((s, a, b))
    return out


def step_costs(plan: EpochPlan, costs: Sequence[np.ndarray], *, ranks: int, workers: int, batch_size: int,
               seed: int, epoch: int = 0, shuffle: bool = True, shuffle_buffer: int = 256) -> np.ndarray:
    """``[steps, ranks]``: the cost each rank runs at each step of ``plan``'s epoch (lap 0 order).

    Worker ``t % workers`` of every rank serves step ``t``; ``costs[s]`` are shard ``s``'s pack
    costs. A step takes as long as its costliest rank: ``max(1) / mean(1)`` is the waiting.
    """
    out = np.zeros((plan.per_slot // batch_size * workers, ranks), np.int64)
    for r in range(ranks):
        for w in range(workers):
            slot = r * workers + w
            if not plan.slots[slot]:
                continue
            flat = np.concatenate([costs[g.shard][g.start:g.stop] for g in plan.slots[slot]])
            order = slot_order(plan, slot, seed=seed, epoch=epoch, lap=0, shuffle=shuffle,
                               shuffle_buffer=shuffle_buffer)
            seq = flat[order]
            while len(seq) < plan.per_slot:  # remainder="wrap": the slot's next lap
                seq = np.concatenate([seq, flat[order]])
            out[w::workers, r] = seq[:plan.per_slot].reshape(-1, batch_size).sum(1)
    return out


def waiting(steps: np.ndarray) -> float:
    """``Σ_t max_r / Σ_t mean_r`` of a ``[steps, ranks]`` cost table: 1.0 when no rank ever waits."""
    if steps.size == 0:
        return 1.0
    return float(steps.max(1).sum() / max(steps.mean(1).sum(), 1e-12))


def choose_run(counts: Sequence[int], costs: Sequence[np.ndarray], *, remote: bool, ranks: int, workers: int,
               batch_size: int, seed: int, shuffle: bool, remainder: str, window: int, heaviest_first: bool,
               shuffle_buffer: int = 256, target: float = TARGET_WAITING) -> int:
    """The packs per request of ``balance="cost"`` when the user gives none.

    A run is read with one request, and a shorter run lets the dealing even out the ranks better
    (on 755 packs over 8 ranks, 2 packs a step: 1.071 at 32 packs per run, 1.004 at 1;
    tools/bench_balance.py). Local files
    make requests free, so every pack is its own run there; over a network the longest of
    :data:`RUNS` whose epoch-0 plan keeps :func:`waiting` within ``target`` is taken (the shortest
    when none does). The choice is a pure function of the integers every slot holds.

    Example:
        >>> c = [np.arange(64) % 7 + 1]
        >>> choose_run([64], c, remote=False, ranks=2, workers=1, batch_size=1, seed=0, shuffle=True,
        ...            remainder="drop", window=16, heaviest_first=False)
        1
    """
    if not remote:
        return 1
    kw = dict(ranks=ranks, workers=workers, epoch=0, seed=seed, shuffle=shuffle, remainder=remainder,
              batch_size=batch_size, window=window, heaviest_first=heaviest_first)
    for run in RUNS:
        plan = plan_epoch_balanced(counts, costs, run=run, **kw)  # type: ignore[arg-type]
        steps = step_costs(plan, costs, ranks=ranks, workers=workers, batch_size=batch_size, seed=seed,
                           shuffle=shuffle, shuffle_buffer=shuffle_buffer)
        if waiting(steps) <= target:
            return run
    return RUNS[-1]
