"""The one read loop of a slot, for one dataset and for a mixture alike.

    a slot's rounds ─► Round.items: (position k, pack bytes | None) in the slot's order
      one dataset: a lap of its packs (PackedDataset._rounds); a mixture: a schedule (mixture.read.rounds)
        ─► decode_packs ─► to_example (+ source_idx for a mixture) ─► (example, the slot's position)

Holds: a slot yields exactly ``per_slot`` examples; a corrupt pack is counted and skipped, never
yielded; a sub-sample whose image or video does not decode is dropped from its pack (``on_drop``),
which is yielded with the rest; a loader set up unlike the data (:class:`~wdspack.errors.ConfigError`)
stops the loop; a round's streams are closed when it ends; after each round the round generator learns
what it gave (:attr:`Round.got`, :attr:`Round.end`) and decides the next one, or that the slot is damaged.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError, FormatError, WdspackError
from ..format.pack import Pack, drop_sample
from ..format.tar import Handler
from .batch.collate import SOURCE_KEY, failed_sample
from .stages import decode_packs

__all__ = ["OnDrop", "Round", "read_slot"]

Position = tuple[int, int, int]
#: ``on_drop(where, source, sample_id, reason, error)``: a sub-sample of the pack at ``where`` (of mixture source
#: ``source``; 0 for one dataset) is dropped, its image or video not decoding; counts it, or raises to stop.
OnDrop = Callable[[str, int, str, str, Exception], None]


@dataclass(eq=False)
class Round:
    """One round of a slot's reading: the packs from position ``start`` on, in the slot's order.

    ``position(emitted, yielded)`` is the slot's position to report after an example; ``source[k]``,
    for a mixture, the source of position ``k``. The loop sets ``got`` (examples yielded) and ``end``
    (positions consumed) when the round ends.
    """

    start: int
    items: Generator[tuple[int, bytes | None], None, None]
    where: Callable[[int], str]
    position: Callable[[int, int], Position]
    source: np.ndarray | None = None
    streams: tuple[Generator[Any, None, None], ...] = ()
    got: int = field(default=0, init=False)
    end: int = field(default=0, init=False)

    def close(self) -> None:
        self.items.close()
        for s in self.streams:
            s.close()


def read_slot(rounds: Iterator[Round], *, yielded: int, per_slot: int, seq_len: int, max_images: int,
              handler: Handler, to_example: Callable[[Any], dict[str, Any]], on_drop: OnDrop
              ) -> Iterator[tuple[dict[str, Any], Position]]:
    """Yield ``(example, position)`` from ``rounds`` until ``per_slot`` examples were yielded in all
    (``yielded`` of them before this call, in the rounds' own count). A pack whose sub-samples all
    fail to decode still yields, as padding: it was served."""
    while yielded < per_slot:
        rnd = next(rounds)
        emitted = rnd.start
        try:
            for k, pack in decode_packs(rnd.items, seq_len=seq_len, max_images=max_images, handler=handler,
                                        where=rnd.where):
                emitted = k + 1
                if pack is None:
                    continue
                example = _example(pack, k, rnd, to_example=to_example, handler=handler, on_drop=on_drop)
                if example is None:
                    continue
                if rnd.source is not None:
                    example[SOURCE_KEY] = torch.tensor(int(rnd.source[k]), dtype=torch.int64)
                rnd.got += 1
                yielded += 1
                yield example, rnd.position(emitted, yielded)
                if yielded >= per_slot:
                    return
        finally:
            rnd.close()
        rnd.end = emitted


def _example(pack: Pack, k: int, rnd: Round, *, to_example: Callable[[Any], dict[str, Any]], handler: Handler,
             on_drop: OnDrop) -> dict[str, Any] | None:
    """Position ``k``'s example. A sub-sample whose image or video does not decode is dropped (``on_drop``) and
    the rest made again: exactly the example of the pack packed without it (of none: padding). None for a
    corrupt pack, after ``handler``."""
    while True:
        try:
            return to_example(pack)
        except ConfigError:
            raise  # a loader set up unlike the dataset (e.g. another processor): not the pack's fault
        except (WdspackError, OSError, ValueError) as e:
            failed = failed_sample(pack, e)
            if failed is None:
                handler("corrupt_packs", FormatError(f"{rnd.where(k)}: {type(e).__name__}: {e}"))
                return None
            source = 0 if rnd.source is None else int(rnd.source[k])
            on_drop(rnd.where(k), source, pack.sample_ids[failed[0]], failed[1], e)
        pack = drop_sample(pack, failed[0])
