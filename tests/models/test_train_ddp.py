"""``examples/train_ddp.py`` under ``torchrun``: 2 CPU ranks (gloo) train a tiny real Qwen2.5-VL on
processor-exact packs, with gradient accumulation and the exact token mean; a run stopped at a
checkpoint and resumed ends with the same parameters as an uninterrupted one."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest
import vlm_harness as h

SCRIPT = h.ROOT / "examples" / "train_ddp.py"


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    from tiny_vlm import qwen2_5_vl

    folder = tmp_path_factory.mktemp("ddp")
    processor = qwen2_5_vl.processor(folder / "tok")
    dataset = h.pack_chats(folder, processor, seq_len=96)
    return dataset, folder / "processor"


def _torchrun(dataset, processor, *extra) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(h.ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(port), str(SCRIPT), str(dataset), "--processor", str(processor), "--tiny",
           "--backend", "gloo", "--accumulation", "2", "--workers", "0", *extra]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def _digests(out: str) -> dict[int, str]:
    return {int(r): d for r, d in re.findall(r"rank (\d) finished \d+ steps; parameters sha256 (\w+)", out)}


def test_ddp_recipe_trains_and_resumes_exactly(packed, tmp_path):
    dataset, processor = packed
    whole = _torchrun(dataset, processor, "--steps", "4")
    losses = [float(x) for x in re.findall(r"step \d+: loss ([\d.]+)", whole)]
    assert len(losses) == 4 and all(0 < x < 20 for x in losses), whole
    digests = _digests(whole)
    assert len(digests) == 2 and digests[0] == digests[1], "DDP keeps the ranks' parameters identical"

    ckpt = tmp_path / "ckpt"
    first = _torchrun(dataset, processor, "--steps", "2", "--save-every", "2", "--checkpoint", str(ckpt))
    assert re.findall(r"step \d+: loss ([\d.]+)", first) == [f"{x:.4f}" for x in losses[:2]]
    resumed = _torchrun(dataset, processor, "--steps", "4", "--checkpoint", str(ckpt), "--resume")
    assert re.findall(r"step \d+: loss ([\d.]+)", resumed) == [f"{x:.4f}" for x in losses[2:]]
    assert _digests(resumed) == digests, "stopped at step 2 and resumed = uninterrupted"
