"""Two real ranks (torch.distributed, gloo, on loopback): coverage, equal steps, no hang.

Each rank runs in its own process, takes rank and world size from the initialised process
group (no arguments), and does an ``all_reduce`` every step the way a training loop would: if
one rank had fewer batches than the other, the collective would hang (the test's timeout
would fire) instead of passing.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.support.ranks import free_port, run_all
from tests.support.synthetic import write_dataset

ROOT = Path(__file__).resolve().parents[2]

RANK_SCRIPT = r"""
import json, sys
import torch
import torch.distributed as dist
from tests.support.synthetic import pack_numbers
from wdspack.loader import make_loader

root, port, rank, out, remainder, workers = sys.argv[1:7]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=int(rank), world_size=2)
loader = make_loader(root, batch_size=2, num_workers=int(workers), seed=3, shuffle_buffer=4, remainder=remainder)
epochs = []
for epoch in range(2):
    seen, steps = [], 0
    for batch in loader:
        seen += pack_numbers(batch["input_ids"])
        steps += 1
        flag = torch.ones(1)
        dist.all_reduce(flag)  # every rank must reach every step
        assert flag.item() == 2
    epochs.append({"steps": steps, "len": len(loader), "packs": seen})
gathered = [None, None]
dist.all_gather_object(gathered, epochs)
dist.destroy_process_group()
json.dump({"rank": int(rank), "mine": epochs, "all": gathered}, open(out, "w"))
"""


@pytest.fixture(scope="module")
def uneven(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("uneven-dist")
    write_dataset(root, shards=5, packs_per_shard=[9, 3, 7, 2, 5], seed=2)  # 26 packs
    return root


def _run_ranks(root: Path, tmp_path: Path, remainder: str, workers: int) -> list[dict]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    run_all([[sys.executable, "-c", RANK_SCRIPT, str(root), str(port), str(r), str(outs[r]), remainder, str(workers)]
             for r in range(2)], env=env, timeout=180)
    return [json.loads(o.read_text()) for o in outs]


@pytest.mark.parametrize("remainder,workers", [("drop", 0), ("wrap", 2)])
def test_two_ranks_equal_steps_disjoint_and_complete(uneven, tmp_path, remainder, workers):
    results = _run_ranks(uneven, tmp_path, remainder, workers)
    assert results[0]["all"] == results[1]["all"]  # both ranks saw the same gathered record
    per_rank = results[0]["all"]
    slots = 2 * max(workers, 1)
    for epoch in range(2):
        steps = {r[epoch]["steps"] for r in per_rank}
        assert len(steps) == 1 and steps == {per_rank[0][epoch]["len"]}  # same number of steps on both ranks
        seen = Counter(n for r in per_rank for n in r[epoch]["packs"])
        if remainder == "drop":
            # every pack at most once; only the remainder (< slots × batch) is left out
            assert max(seen.values()) == 1
            assert len(seen) == slots * (26 // slots // 2 * 2) and 26 - len(seen) < slots * 2
        else:
            # every pack at least once; the extra reads only fill the last batches
            assert set(seen) == set(range(26))
            assert sum(seen.values()) - 26 < slots * 2
    # the shuffle changes between epochs, the coverage does not
    e0 = [n for r in per_rank for n in r[0]["packs"]]
    e1 = [n for r in per_rank for n in r[1]["packs"]]
    assert e0 != e1
