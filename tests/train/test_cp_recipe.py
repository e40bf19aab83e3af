"""``examples/train_cp.py`` under ``torchrun``: 2 CPU ranks (gloo, one CP group) train a tiny real Qwen2.5-VL for 2
steps on packs planned with ``--cp 2``, and each step's loss equals the unsplit run's in one process, fed the
packs as stored (no ``2·cp`` padding): the split, the loader's padding and the exact loss together."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support import vlm_harness as h
from tests.support.ranks import free_port

pytestmark = pytest.mark.cp  # make gpu-check runs these too (tools/gpu_check.py)

SCRIPT = h.ROOT / "examples" / "train_cp.py"
STEPS = 2


@pytest.fixture(scope="module")
def planned(vlm_family, tiny_processors, tmp_path_factory):
    """The session's Qwen2.5-VL chats (``vlm_family``'s, packed at 96 tokens) resharded for ``cp = 2``, and the
    session's saved processor."""
    from wdspack.packer.config import PackConfig
    from wdspack.packer.reshard import reshard_dataset

    folder = tmp_path_factory.mktemp("cp-recipe")
    processor, _, dataset = vlm_family("qwen2_5_vl")
    reshard_dataset(str(dataset), folder / "cp2", config=PackConfig(seq_len=96, max_images=4, cp=2))
    return folder / "cp2", tiny_processors.folder(processor)


def _reference(dataset, processor_dir) -> list[float]:
    """The same steps unsplit in this process, on the packs as stored (the manifest's ``cp`` ignored)."""
    import torch

    import wdspack
    from tiny_vlm import qwen2_5_vl

    proc = wdspack.load_processor(processor_dir)
    model = qwen2_5_vl.model(proc, seed=0).to(torch.float64).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, processor=proc, seed=0)
    assert loader.dataset.cp == 2
    loader.dataset.cp = None
    losses = []
    for _, batch in zip(range(STEPS), loader):
        n = wdspack.num_items_in_batch([batch])
        kwargs = wdspack.model_inputs(batch, model)
        loss = wdspack.token_losses(model(**kwargs).logits, kwargs["labels"]).sum()
        (loss / n).backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item() / int(n))
    return losses


def test_cp_recipe_trains_with_the_unsplit_loss(planned):
    dataset, processor = planned
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(h.ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(SCRIPT), str(dataset), "--cp", "2", "--processor", str(processor),
           "--tiny", "--dtype", "float64", "--backend", "gloo", "--workers", "0", "--steps", str(STEPS)]
    run = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        want = _reference(dataset, processor)  # while the ranks run
        stdout, stderr = run.communicate(timeout=300)
    finally:
        run.kill()
    assert run.returncode == 0, stderr[-3000:]
    line = r"step \d+: loss (\S+) \((\d+) target tokens, 1 DP × 2 CP, 2·cp padding (\d+) tokens"
    found = re.findall(line, stdout)
    assert len(found) == STEPS, stdout
    assert found[-1][2] == "0", "packs planned for cp 2 split with no padding of their own"
    assert "attention: wdspack_cp (SDPA with each rank's mask on cpu)" in stdout, stdout
    got = [float(loss) for loss, _, _ in found]
    assert got == pytest.approx(want, rel=1e-9), (got, want)
