"""``examples/train_ddp.py`` under ``torchrun``: 2 CPU ranks (gloo) train a tiny real Qwen2.5-VL on
processor-exact packs, with gradient accumulation and the exact token mean; a run stopped at a
checkpoint and resumed ends with the same parameters as an uninterrupted one."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support import vlm_harness as h
from tests.support.ranks import free_port, run_all

SCRIPT = h.ROOT / "examples" / "train_ddp.py"


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    from tiny_vlm import qwen2_5_vl

    folder = tmp_path_factory.mktemp("ddp")
    processor = qwen2_5_vl.processor(folder / "tok")
    dataset = h.pack_chats(folder, processor, seq_len=96)
    return dataset, folder / "processor"


def _torchrun(dataset, processor, *extra) -> str:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(h.ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(port), str(SCRIPT), str(dataset), "--processor", str(processor), "--tiny",
           "--backend", "gloo", "--accumulation", "2", "--workers", "0", *extra]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def _digests(out: str) -> dict[int, str]:
    pattern = r"rank (\d) finished \d+ steps; parameters sha256 ([0-9a-f]{16})$"
    return {int(r): d for r, d in re.findall(pattern, out, re.M)}


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


RANK_SCRIPT = r"""
import sys
from contextlib import nullcontext
import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import wdspack
from tiny_vlm import qwen2_5_vl

dataset, processor, port, rank, out = sys.argv[1:6]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=int(rank), world_size=2)
proc = wdspack.load_processor(processor)
model = qwen2_5_vl.model(proc, seed=0).double()
ddp = DDP(model, find_unused_parameters=True)
micro = list(wdspack.make_loader(dataset, batch_size=1, num_workers=0, shuffle=False, processor=proc))[:2]
n = wdspack.num_items_in_batch(micro)
for i, b in enumerate(micro):
    with ddp.no_sync() if i == 0 else nullcontext():
        kwargs = wdspack.model_inputs(b, model)
        loss = wdspack.token_losses(ddp(**kwargs).logits, kwargs["labels"]).sum() / n
        (loss * 2).backward()
np.savez(out, images=np.array([int(b["image_mask"].sum()) for b in micro]),
         **{f"grad{k}": (p.grad if p.grad is not None else torch.zeros_like(p)).numpy()
            for k, p in enumerate(model.parameters())})
dist.destroy_process_group()
"""


def test_ddp_with_text_only_micro_batches_equals_one_process(packed, tmp_path):
    """Vision parameters unused in some micro-batches (text-only packs): DDP with
    find_unused_parameters still gives the gradients of one process over the same 4 batches."""
    import numpy as np
    import torch

    import wdspack
    from tiny_vlm import qwen2_5_vl

    dataset, processor = packed
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(h.ROOT), str(h.ROOT / "examples"),
                                                         os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    outs = [tmp_path / f"rank{r}.npz" for r in range(2)]
    run_all([[sys.executable, "-c", RANK_SCRIPT, str(dataset), str(processor), str(port), str(r), str(outs[r])]
             for r in range(2)], env=env, timeout=400)
    ranks = [dict(np.load(o)) for o in outs]
    assert 0 in np.concatenate([r["images"] for r in ranks]), "some micro-batch is text-only"

    proc = wdspack.load_processor(processor)
    model = qwen2_5_vl.model(proc, seed=0).double()
    batches = [b for r in range(2) for b in list(wdspack.make_loader(str(dataset), batch_size=1, num_workers=0,
                                                                     shuffle=False, processor=proc, rank=r,
                                                                     world_size=2))[:2]]
    model.zero_grad()
    n = sum(int((b["labels"] != -100).sum()) for b in batches)
    for b in batches:
        kwargs = wdspack.model_inputs(b, model)
        (wdspack.token_losses(model(**kwargs).logits, kwargs["labels"]).sum() / n).backward()
    for k, p in enumerate(model.parameters()):
        want = p.grad if p.grad is not None else torch.zeros_like(p)
        for r in ranks:
            np.testing.assert_allclose(r[f"grad{k}"], want.numpy(), rtol=1e-9, atol=1e-12)
