"""DDP over 2 CPU ranks (gloo) on a tiny real Qwen2.5-VL and processor-exact packs: text-only micro-batches leave
the vision parameters unused, and the ranks' gradients are still one process's. ``examples/train_ddp.py`` under
``torchrun`` (gradient accumulation, the exact token mean, a run stopped at a checkpoint and resumed) is
``tests/train/test_trainers.py``'s, beside the recipes it is the reference of."""

from __future__ import annotations

import os
import sys

import pytest

from tests.support import vlm_harness as h
from tests.support.ranks import free_port, run_all


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    from tiny_vlm import qwen2_5_vl

    folder = tmp_path_factory.mktemp("ddp")
    processor = qwen2_5_vl.processor(folder / "tok")
    dataset = h.pack_chats(folder, processor, seq_len=96)
    return dataset, folder / "processor"


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
