"""The pack job's driver keeps integers and ids, never payloads: its memory per sample is measured;
with partitioned planning it keeps no per-sample state, and its peak stays flat as the job grows.

``wdspack.packer.job.DRIVER_BYTES_PER_SAMPLE`` (plus each id's own ``str``) is the bound the docs state. Two
runs of :mod:`driver_memory` (100 k and 300 k samples, fresh processes) give the driver's memory
growth; the slope between them, per sample, must stay within it. A payload leaking into the driver
(the tokens alone are 20–400 × 4 bytes per sample here) would break it many times over.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT
from wdspack.packer.job import DRIVER_BYTES_PER_SAMPLE

SCRIPT = ROOT / "tests" / "support" / "driver_memory.py"


def _growth(n: int, folder: Path, *partitioned: int) -> dict:
    done = subprocess.run([sys.executable, str(SCRIPT), str(n), str(folder),
                           *(str(a) for a in partitioned)],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0 and "clear_refs" in done.stderr:
        pytest.skip("cannot reset the peak RSS here (/proc/self/clear_refs)")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
def test_driver_memory_per_sample_stays_within_the_stated_bound(tmp_path):
    small, large = _growth(100_000, tmp_path / "small"), _growth(300_000, tmp_path / "large")
    assert large["packs"] > 2 * small["packs"] and large["shards"] > 40  # a real job: many shards
    per_sample = (large["growth_bytes"] - small["growth_bytes"]) / (large["samples"] - small["samples"])
    id_bytes = sys.getsizeof("source-000.jsonl:123456") + 8  # the id's str and its list slot
    assert 0 < per_sample <= DRIVER_BYTES_PER_SAMPLE + id_bytes, per_sample


@pytest.mark.slow
def test_partitioned_driver_memory_stays_flat_when_the_job_grows_ten_times(tmp_path):
    """``plan_group_partitions``: 50 k samples (10 partitions of 5 000) and 500 k (100 partitions), planned
    in groups of 5 partitions by a 2-process pool: the driver's peak grows by a few MB, not the ~150 MB
    that 450 k more samples cost the global plan."""
    small = _growth(50_000, tmp_path / "small", 5, 10)
    large = _growth(500_000, tmp_path / "large", 5, 100)
    assert large["packs"] > 9 * small["packs"] and large["shards"] > 200
    assert large["growth_bytes"] - small["growth_bytes"] < 20 * 2**20, (small, large)
    assert large["growth_bytes"] < 40 * 2**20, large
