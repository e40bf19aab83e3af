"""Where a mixture's stream continues from after a resume under another mixture or layout.

    epoch e:  ... worker w yielded before[w] packs ─┬─ the rest: this mixture's schedule from the
                                                    │  rank's cursors ``start``, roles rotated by ``shift``
    epoch e+1, ...                                  └─ chained from where the continuation ends

Holds: a frozen record; :meth:`Continuation.to_json` writes, and :meth:`Continuation.from_json`
reads, the plain JSON loader states keep under ``"stage"`` (keys ``epoch names start before shift
length buffer workers anchor`` and, after an elastic resume, ``rest``), so states saved before load.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError
from .cursors import cursor_from_json, cursor_to_json
from .streams import SourceCursor

__all__ = ["Continuation", "mid_continuation"]

logger = logging.getLogger(__name__)

_KEYS = ("anchor", "before", "buffer", "epoch", "length", "names", "shift", "start", "workers")


@dataclass(frozen=True, slots=True)
class Continuation:
    """From the point of ``epoch`` where worker ``w`` had yielded ``before[w]`` packs, the rest of the epoch.

    Example:
        >>> c = Continuation(epoch=1, names=("a", "b"), start=(SourceCursor(0, 4), SourceCursor()), before=(2, 2),
        ...                  shift=0, length=8, buffer=4, workers=2)
        >>> Continuation.from_json(c.to_json()) == c, c.to_json()["start"]
        (True, [[0, 4, [], False], [0, 0, [], False]])
    """

    #: the epoch it begins in, and the sources (by name) its cursors are for
    epoch: int
    names: tuple[str, ...]
    #: the rank's cursor per source where it begins (workers numbered as in the epoch)
    start: tuple[SourceCursor, ...]
    #: packs each worker yielded before it; its schedule counts from there
    before: tuple[int, ...]
    #: the workers' roles rotated by this (the worker whose batch came next is role 0)
    shift: int
    #: packs per worker the epoch keeps (None: the mixture's ``per_slot``)
    length: int | None
    #: each source's shuffle buffer, kept from the first mixture (a cursor's blocks follow its order)
    buffer: int
    workers: int
    #: an anchor begins at the epoch's start (``before`` all 0, ``shift`` 0, ``length`` None) and only
    #: saves replanning the epochs before it
    anchor: bool = False
    #: after an elastic resume: the rest of the passes the saved ranks left (:mod:`.rest`'s JSON)
    rest: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON, keys sorted (as the loader state has always held it)."""
        value: dict[str, Any] = {"anchor": self.anchor, "before": list(self.before), "buffer": self.buffer,
                                 "epoch": self.epoch, "length": self.length, "names": list(self.names)}
        if self.rest is not None:
            value["rest"] = self.rest
        value.update(shift=self.shift, start=[cursor_to_json(c) for c in self.start], workers=self.workers)
        return value

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Continuation:
        """The inverse of :meth:`to_json`."""
        missing = [k for k in _KEYS if k not in value]
        if missing:
            raise ConfigError(f"the mixture's continuation in the loader state lacks {missing}; the state is damaged")
        length = value["length"]
        return cls(epoch=int(value["epoch"]), names=tuple(str(n) for n in value["names"]),
                   start=tuple(cursor_from_json(c) for c in value["start"]),
                   before=tuple(int(b) for b in value["before"]), shift=int(value["shift"]),
                   length=None if length is None else int(length), buffer=int(value["buffer"]),
                   workers=int(value["workers"]), anchor=bool(value["anchor"]), rest=value.get("rest"))


def mid_continuation(continuation: Continuation | None, epoch: int) -> bool:
    """Whether ``continuation`` began inside ``epoch`` (not at its start, as an anchor does)."""
    return continuation is not None and continuation.epoch == epoch and not continuation.anchor
