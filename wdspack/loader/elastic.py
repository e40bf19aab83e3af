"""Elastic resume: an epoch saved under one layout (ranks × workers) finished under another.

A loader state holds each worker's position ``(lap, emitted, yielded)``. Restored under the layout
that saved it, the positions are used as they are. Under another (other ranks or ``num_workers``),
the rest of the epoch is every pack the saved layout has not read yet (:func:`consumed_packs`,
replaying each saved slot's plan and order), split over the new layout
(:func:`~.plan.plan_remainder`); later epochs follow the new layout. Where every slot of the old
layout stood (the *basis*, with the basis before it for a resume inside a resumed epoch) reaches
the workers, persistent ones too, through shared memory (:class:`SharedBasis`), and stays in the
loader state until the epoch ends. One rank's state alone is enough when no pack was skipped as
corrupt: every rank consumed the same batches (:func:`lockstep_positions`).
"""

from __future__ import annotations

import bisect
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError
from .plan import EpochPlan, slot_order

__all__ = ["SharedBasis", "consumed_packs", "lockstep_positions"]

logger = logging.getLogger(__name__)

_ELASTIC_BYTES = 1 << 20  # shared buffer for the elastic basis (JSON): the layout a resumed epoch came from


class SharedBasis:
    """``{"epoch", "basis"}`` of an elastically resumed epoch, as JSON in shared memory: the main process
    sets it, the DataLoader workers (persistent ones too) read it at the start of each iteration."""

    def __init__(self) -> None:
        self._buf = torch.zeros(_ELASTIC_BYTES, dtype=torch.uint8).share_memory_()

    def get(self) -> dict[str, Any] | None:
        """The elastic state, or None when the current epoch follows the layout it started with."""
        n = int.from_bytes(bytes(self._buf[:4].tolist()), "little")
        return None if n == 0 else json.loads(bytes(self._buf[4:4 + n].numpy()))

    def set(self, elastic: Mapping[str, Any] | None) -> None:
        """Publish ``elastic`` (None: no elastic rest)."""
        data = b"" if elastic is None else json.dumps(elastic, sort_keys=True).encode()
        if len(data) + 4 > _ELASTIC_BYTES:
            raise ConfigError(f"the elastic resume state is {len(data)} bytes, over {_ELASTIC_BYTES}; resume with "
                              "the layout the checkpoint was taken with, or at an epoch boundary")
        self._buf[:4] = torch.tensor(list(len(data).to_bytes(4, "little")), dtype=torch.uint8)
        if data:
            self._buf[4:4 + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)


def consumed_packs(epoch: int, basis: Mapping[str, Any], *, counts: Sequence[int],
                   layout_plan: Callable[[int, int, int, list[np.ndarray] | None], EpochPlan], seed: int,
                   shuffle: bool, shuffle_buffer: int) -> list[np.ndarray]:
    """Per shard, the packs of ``epoch`` that the layout in ``basis`` has read, or never reads.

    ``basis`` is ``{"world_size", "num_workers", "ranks": [[[lap, emitted, yielded] per worker] per
    rank], "basis": the basis before it or None}``; ``counts`` are the shards' pack counts and
    ``layout_plan(world_size, workers, epoch, consumed)`` the dataset's plan of the epoch under a
    layout (of its rest, when ``consumed`` is given).
    """
    prior = (consumed_packs(epoch, basis["basis"], counts=counts, layout_plan=layout_plan, seed=seed, shuffle=shuffle,
                             shuffle_buffer=shuffle_buffer) if basis.get("basis") else None)
    world, workers = int(basis["world_size"]), max(1, int(basis["num_workers"]))
    plan = layout_plan(world, workers, epoch, prior)
    mask = [p.copy() for p in prior] if prior is not None else [np.zeros(n, bool) for n in counts]
    if prior is None:  # what this epoch never reads (remainder="drop") counts as done
        for m in mask:
            m[:] = True
        for ranges in plan.slots:
            for r in ranges:
                mask[r.shard][r.start:r.stop] = False
    for rank, positions in enumerate(basis["ranks"]):
        for worker, (lap, emitted, _) in enumerate(positions):
            slot = rank * workers + worker
            ranges = plan.slots[slot]
            if lap > 0:
                done = np.arange(plan.assigned(slot))
            else:
                order = slot_order(plan, slot, seed=seed, epoch=epoch, lap=0, shuffle=shuffle,
                                   shuffle_buffer=shuffle_buffer)
                done = order[:int(emitted)]
            starts = np.cumsum([0] + [len(r) for r in ranges])
            for p in done.tolist():
                i = bisect.bisect_right(starts, p) - 1
                mask[ranges[i].shard][ranges[i].start + p - int(starts[i])] = True
    return mask


def lockstep_positions(state: Mapping[str, Any], plan: EpochPlan, *, world: int, workers: int) -> list[list[tuple]]:
    """Every saved rank's worker positions from one rank's ``state``: they all consumed the same batches.

    ``plan`` is the saved layout's plan of the epoch (``world`` ranks × ``workers``).
    """
    own = [tuple(int(v) for v in p) for p in state["workers"]]
    rank = int(state["config"]["rank"])
    out: list[list[tuple]] = []
    for r in range(world):
        if r == rank:
            out.append(own)
            continue
        positions = []
        for w, (_, _, yielded) in enumerate(own):
            size = plan.assigned(r * workers + w)
            lap = yielded // size if size else 0
            positions.append((lap, yielded - lap * size, yielded))
        out.append(positions)
    skipped = any(e != y - lap * plan.assigned(rank * workers + w) for w, (lap, e, y) in enumerate(own))
    if skipped:
        logger.warning("the saved rank skipped corrupt packs, so the other ranks may have too; their positions "
                       "are inferred without skips. Pass every rank's state to load_state_dict for an exact rest")
    return out
