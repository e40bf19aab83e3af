"""A task for the progress tests: it reports its records one by one, slowly, from wherever it runs
(this process, a spawn pool process), as the pack job's measure tasks do."""

from __future__ import annotations

import time

from wdspack.packer.executors import report

__all__ = ["slow_records"]


def slow_records(k: int, records: int, seconds: float) -> int:
    """Report ``records`` records over about ``seconds``; return ``k``."""
    for _ in range(records):
        report()
        time.sleep(seconds / records)
    return k
