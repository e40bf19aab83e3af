"""Where a rank stands in a mixture's merge at any point, as plain JSON.

    plan_slot(...).end          the rank's cursors after whole rounds of its workers' batches
    rank_cursors(..., counts)   after any prefix of each worker's positions (the merge replayed)
    cursor_to_json(c)           [pass_no, pos, [[worker, pass_no, start, stop, emitted], ...], frontier]

Holds: the cursors are the same on every worker of a rank; :func:`cursor_from_json` inverts
:func:`cursor_to_json`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .merge import SlotSchedule, plan_slot
from .streams import RankStream, SourceCursor, SourceLayout

__all__ = ["concat_plans", "cursor_from_json", "cursor_to_json", "rank_cursors", "renumber", "shifted",
           "take_positions"]


def cursor_to_json(c: SourceCursor) -> list:
    """A cursor as plain JSON: ``[pass_no, pos, [[worker, pass_no, start, stop, emitted], ...], frontier]``.

    Example:
        >>> cursor_to_json(SourceCursor(2, 5))
        [2, 5, [], False]
    """
    return [int(c.pass_no), int(c.pos), [[int(v) for v in h] for h in c.held], bool(c.frontier)]


def cursor_from_json(value: Sequence[Any]) -> SourceCursor:
    """The inverse of :func:`cursor_to_json`.

    Example:
        >>> cursor_from_json([2, 5, [], False])
        SourceCursor(pass_no=2, pos=5)
    """
    pass_no, pos, held, frontier = value
    return SourceCursor(int(pass_no), int(pos), tuple(tuple(int(v) for v in h) for h in held),  # type: ignore[misc]
                        bool(frontier))


def shifted(by: int, workers: int) -> Callable[[int], int]:
    """Worker ``w`` -> ``(w + by) % workers``."""
    return lambda w: (w + by) % workers


def renumber(c: SourceCursor, owner: Callable[[int], int]) -> SourceCursor:
    """``c`` with its held blocks' workers renumbered."""
    if not c.held:
        return c
    return SourceCursor(c.pass_no, c.pos, tuple((owner(h[0]), *h[1:]) for h in c.held), c.frontier)


def take_positions(plan: SlotSchedule, order: np.ndarray) -> SlotSchedule:
    """``plan``'s positions ``order`` (a balanced window's cost order, or a prefix); its cursors and reads
    are kept."""
    picked = {name: getattr(plan, name)[order] for name in ("source", "pass_no", "shard", "pack", "row", "units")}
    return SlotSchedule(start=plan.start, end=plan.end, reads=plan.reads, **picked)


def concat_plans(parts: Sequence[SlotSchedule]) -> SlotSchedule:
    """Segments' plans of one slot, one after the other."""
    cat = {name: np.concatenate([getattr(p, name) for p in parts])
           for name in ("source", "pass_no", "shard", "pack", "row", "units")}
    return SlotSchedule(start=parts[0].start, end=parts[-1].end, reads=tuple(r for p in parts for r in p.reads),
                        **cat)


def rank_cursors(layouts: Sequence[SourceLayout], shares: Sequence[float], start: Sequence[SourceCursor],
                 counts: Sequence[int], *, rank: int, ranks: int, workers: int, batch_size: int, seed: int,
                 shuffle: bool, shuffle_buffer: int, own_shares: bool = False) -> tuple[SourceCursor, ...]:
    """The rank's cursors once worker ``w`` has emitted the first ``counts[w]`` positions of its plan from
    ``start`` (:func:`~.merge.plan_slot`), which need not be whole rounds of the workers' batches.

    ``plan_slot(...).end`` gives the cursors after whole rounds; here the rank's merge is replayed from
    the workers' plans in the DataLoader's order, each position taking its pack from its worker's block
    (a worker takes the next block where the merge does), and a block's emitted packs are those among
    its worker's first ``counts[w]`` (a block taken and not emitted from is held with 0 emitted).

    Example:
        >>> from wdspack.loader.mixture.streams import source_layout
        >>> a = source_layout("a", [6], np.full(6, 10))
        >>> rank_cursors([a], [1.0], [SourceCursor()], [2], rank=0, ranks=1, workers=1, batch_size=1, seed=0,
        ...              shuffle=False, shuffle_buffer=1)
        (SourceCursor(pass_no=0, pos=2),)
    """
    kw = dict(seed=seed, cursors=start, shuffle=shuffle, shuffle_buffer=shuffle_buffer, workers=workers,
              batch_size=batch_size, own_shares=own_shares)
    if workers == 1:
        return plan_slot(layouts, shares, slot=rank, slots=ranks, per_slot=int(counts[0]), **kw).end  # type: ignore[arg-type]
    if len(set(counts)) == 1 and counts[0] % batch_size == 0:  # whole rounds: the plan's own end
        return plan_slot(layouts, shares, slot=rank * workers, slots=ranks * workers, per_slot=int(counts[0]),
                         **kw).end  # type: ignore[arg-type]
    n = -(-max(counts) // batch_size) * batch_size
    plans = [plan_slot(layouts, shares, slot=rank * workers + w, slots=ranks * workers, per_slot=n, **kw)  # type: ignore[arg-type]
             for w in range(workers)]
    streams = [RankStream(layout, c, rank=rank, ranks=ranks, workers=workers, seed=seed, shuffle=shuffle,
                          shuffle_buffer=shuffle_buffer) for layout, c in zip(layouts, start)]
    cur: list[list[Any]] = [[None] * len(layouts) for _ in range(workers)]
    taken: list[tuple[int, Any]] = []
    emitted: dict[int, int] = {}
    last = max(((c - 1) // batch_size * workers + w for w, c in enumerate(counts) if c > 0), default=-1)
    for t in range(last + 1):  # the rank's batches in the DataLoader's order, up to the last one emitted from
        v, j = t % workers, t // workers
        plan = plans[v]
        for p in range(j * batch_size, (j + 1) * batch_size):
            i = int(plan.source[p])
            b = cur[v][i]
            if b is None:
                b = cur[v][i] = streams[i].take(v)
                taken.append((i, b))
                emitted[id(b)] = b.done
            if int(b.rows[b.done]) != int(plan.row[p]) or b.pass_no != int(plan.pass_no[p]):
                raise RuntimeError(f"replaying rank {rank}'s merge: worker {v} position {p} is not its block's next "
                                   "pack; this is a wdspack bug")
            b.done += 1
            if p < counts[v]:
                emitted[id(b)] = b.done
            if b.done == len(b.rows):
                cur[v][i] = None
    held: list[list[Any]] = [[] for _ in layouts]
    for i, b in taken:
        b.done = emitted[id(b)]
        if b.done < len(b.rows):
            held[i].append(b)
    return tuple(s.cursor(h) for s, h in zip(streams, held))
