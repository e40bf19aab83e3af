"""Measure the pack job's driver memory for N samples; run as a script, prints one JSON line.

The samples are spooled first (``SpoolWriter``, the measure tasks' real output format, ids like
``source-007.jsonl:123456``, 20–400 tokens each), so the job that follows runs only what the
driver does: read the spool's integer columns, select, plan, cut shards and hand write tasks to a
2-process spawn pool. ``hwm_bytes - rss_before`` is the driver's growth during the job (Linux
``VmHWM``, reset just before it starts); the workers are other processes and not counted.

    python tests/support/driver_memory.py 300000 /tmp/job   →   {"samples": 300000, "growth_bytes": ..., ...}
    python tests/support/driver_memory.py 500000 /tmp/job 5 50   (partitioned: groups of 5 of 50 partitions)
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from wdspack.packer.config import PackConfig, RunOptions
from wdspack.packer.job import WORK_DIR, run_job
from wdspack.packer.spool import SpoolWriter
from wdspack.storage.location import Location

PARTITIONS = 50
DESCRIBE = {"tokenizer": {"token_dtype": "<u4", "name": "synthetic"}, "image_policy": {}}


def spool(out: Location, n: int, partitions: int = PARTITIONS) -> None:
    work = out.child(WORK_DIR)
    work.makedirs("spool")
    work.write_atomic("job.json", json.dumps({"fingerprint": "driver-memory"}).encode())
    lens = np.random.default_rng(0).integers(20, 400, n)
    ids, mask = np.arange(400, dtype=np.uint32), np.ones(400, np.uint8)
    per = -(-n // partitions)
    for i in range(partitions):
        with SpoolWriter(str(work), i) as w:
            for j in range(i * per, min(n, (i + 1) * per)):
                w.add(f"source-{i:03d}.jsonl:{j}", ids[: lens[j]], mask[: lens[j]], [], [])
            w.finish(DESCRIBE)


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def main(n: int, folder: str, group: int | None = None, partitions: int = PARTITIONS) -> dict:
    out = Location(folder)
    spool(out, n, partitions)
    with open("/proc/self/clear_refs", "w") as f:  # reset the high-water mark to the current RSS
        f.write("5")
    before = _status("VmRSS")
    start = time.perf_counter()
    # many shards: few in flight
    config = PackConfig(seq_len=4096, shard_max_bytes=2_000_000, plan_group_partitions=group,
                        run=RunOptions(workers=2))
    summary = run_job(out, "driver-memory", lambda *a: None, [(i,) for i in range(partitions)], config,
                      describe=lambda: DESCRIBE, sources=["synthetic"], provenance={}, resume=True,
                      progress=False, start=start)
    hwm = _status("VmHWM")
    return {"samples": n, "packs": summary.packs, "shards": summary.shards, "rss_before": before,
            "hwm_bytes": hwm, "growth_bytes": hwm - before, "seconds": time.perf_counter() - start}


if __name__ == "__main__":
    group = int(sys.argv[3]) if len(sys.argv) > 3 else None
    print(json.dumps(main(int(sys.argv[1]), sys.argv[2], group, *(int(a) for a in sys.argv[4:5]))))
