"""Interrupt a pack job part-way, then resume it: the step every resume test shares.

:func:`pack_interrupted_then_resumed` stops ``pack_dataset`` with a ``KeyboardInterrupt`` as it
starts measuring its ``interrupt_at``-th partition (what a Ctrl-C or a killed driver leaves behind:
some partitions measured and spooled, the rest not), checks that it did stop there, and runs the
same job again with ``resume=True``. The tests compare the resumed folder byte for byte with an
uninterrupted one (``support.demo.read_files``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from wdspack.packer.config import PackSummary
from wdspack.packer.job import pack_dataset

__all__ = ["pack_interrupted_then_resumed"]


def pack_interrupted_then_resumed(monkeypatch: pytest.MonkeyPatch, sources: Sequence[Any], out: Path, *,
                                  interrupt_at: int, **pack: Any) -> PackSummary:
    """Run ``pack_dataset(sources, out, **pack)``, interrupted at the ``interrupt_at``-th partition's
    measure, then again with ``resume=True``; the resumed run's summary.

    The interrupt is raised in this process, so ``pack`` must run its tasks here (the default
    serial executor, ``workers`` unset).

    Example:
        >>> pack_interrupted_then_resumed(monkeypatch, srcs, tmp_path / "resumed", interrupt_at=4,
        ...                               sample_config=cfg, config=PackConfig(seq_len=1024))  # doctest: +SKIP
    """
    from wdspack.packer import job

    real, calls = job._measure_partition, []

    def dies_at_the_nth(*args: Any) -> Any:
        calls.append(args[0])
        if len(calls) == interrupt_at:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(job, "_measure_partition", dies_at_the_nth)
    with pytest.raises(KeyboardInterrupt):  # fails the test when the job never reached that partition
        pack_dataset(list(sources), out, **pack)
    monkeypatch.setattr(job, "_measure_partition", real)
    return pack_dataset(list(sources), out, resume=True, **pack)
