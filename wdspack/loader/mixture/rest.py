"""The rest of a mixture's passes after an elastic resume (W ranks -> W' ranks).

    saved ranks' cursors ─► per pass begun and not finished by all: the rows nobody consumed,
    in the pass's reading order ─► split over the new ranks as a whole pass is ─► later passes as usual

    {"ranks": 3, "old_ranks": 2, "seed": 3, "shuffle": true, "buffer": 3,
     "cursors": {"a": [cursor of rank 0, cursor of rank 1], ...}, "prior": an earlier rest or null}

Holds: nothing within a pass is read twice or skipped; the rest is plain JSON, small whatever the
data, and every process computes the same rows from it (:func:`rest_layouts`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import ConfigError
from .cursors import cursor_from_json
from .streams import RankStream, SourceCursor, SourceLayout

__all__ = ["first_open_pass", "passes_left", "rest_layouts"]


def _streams(layout: SourceLayout, cursors: Sequence[SourceCursor], *, seed: int, shuffle: bool,
             buffer: int) -> list[RankStream]:
    return [RankStream(layout, c, rank=r, ranks=len(cursors), workers=1, seed=seed, shuffle=shuffle,
                       shuffle_buffer=buffer) for r, c in enumerate(cursors)]


def _held(s: RankStream) -> list:
    return [*s.own.values(), *s.queue]


def first_open_pass(s: RankStream) -> int:
    """The first pass in which the rank has packs left to read."""
    share = len(s.share(s.pass_no)[1])
    first = s.pass_no if s.pos < share else s.pass_no + 1
    return min([first, *(b.pass_no for b in _held(s))])


def passes_left(layout: SourceLayout, cursors: Sequence[SourceCursor], *, seed: int, shuffle: bool,
                buffer: int) -> dict[int, np.ndarray]:
    """Per pass some rank has begun and not every rank finished, the rows nobody consumed, in the pass's
    reading order; ``cursors`` are the ranks' (rank ``r``'s at ``r``), ``layout`` as they read it.

    Example:
        >>> from wdspack.loader.mixture.streams import source_layout
        >>> a = source_layout("a", [4, 4], np.ones(8, np.int64))
        >>> left = passes_left(a, [SourceCursor(0, 3), SourceCursor(1, 1)], seed=0, shuffle=False, buffer=1)
        >>> {p: rows.tolist() for p, rows in left.items()}  # rank 0 read 3 of pass 0, rank 1 all and 1 of pass 1
        {0: [3], 1: [0, 1, 2, 3, 5, 6, 7]}
    """
    streams = _streams(layout, cursors, seed=seed, shuffle=shuffle, buffer=buffer)
    lo = min(first_open_pass(s) for s in streams)
    hi = max(max([s.pass_no if s.pos else s.pass_no - 1, *(b.pass_no for b in _held(s))]) for s in streams)
    if layout.rest is not None:  # an earlier rest's passes nobody reached yet stay rests
        hi = max([hi, *(p for p in layout.rest if p >= lo)])
    out: dict[int, np.ndarray] = {}
    for p in range(lo, hi + 1):
        parts = []
        for s in streams:
            rows = s.share(p)[1]
            done = np.zeros(len(rows), bool)
            if p < s.pass_no:
                done[:] = True
            elif p == s.pass_no:
                done[:s.pos] = True
            for b in _held(s):
                if b.pass_no == p:
                    done[b.order[b.done:]] = False
            parts.append(rows[~done])
        out[p] = np.concatenate(parts)
    return out


def rest_layouts(layouts: Sequence[SourceLayout], names: Sequence[str],
                 rest: Mapping[str, Any] | None) -> tuple[SourceLayout, ...]:
    """``layouts`` (the sources', in ``names`` order) with the passes' rests of ``rest`` (the module
    docstring's JSON, or None: unchanged); a source the saved ranks did not read keeps whole passes."""
    if rest is None:
        return tuple(layouts)
    prior = rest_layouts(layouts, names, rest.get("prior"))
    out = []
    for name, base, old in zip(names, layouts, prior):
        saved = rest["cursors"].get(name)
        if saved is None:
            out.append(base)
            continue
        if len(saved) != int(rest["old_ranks"]):
            raise ConfigError(f"the elastic rest of source {name!r} has {len(saved)} cursors for "
                              f"{rest['old_ranks']} ranks; the loader state is damaged")
        left = passes_left(old, [cursor_from_json(c) for c in saved], seed=int(rest["seed"]),
                           shuffle=bool(rest["shuffle"]), buffer=int(rest["buffer"]))
        out.append(dataclasses.replace(base, rest=left, rest_ranks=int(rest["ranks"])))
    return tuple(out)
