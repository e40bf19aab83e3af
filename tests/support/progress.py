"""Tasks for the progress tests: one reports its records one by one, slowly, from wherever it runs
(this process, a spawn pool process), as the pack job's measure tasks do; one is Ctrl-C'd in its pool process."""

from __future__ import annotations

import os
import signal
import time

from wdspack.packer.executors import report

__all__ = ["ctrl_c_in_the_pool", "slow_records"]


def slow_records(k: int, records: int, seconds: float) -> int:
    """Report ``records`` records over about ``seconds``; return ``k``."""
    for _ in range(records):
        report()
        time.sleep(seconds / records)
    return k


def ctrl_c_in_the_pool(k: int) -> int:
    """Task 1 gets the Ctrl-C a terminal sends the whole process group (its pool process ends with 130), while the
    driver does not: as when the signal lands while the driver ignores it to start a pool process."""
    if k == 1:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
    return k
