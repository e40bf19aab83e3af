"""Data-parallel training on packed, model-ready batches: a plain PyTorch loop under ``torchrun``.

    torchrun --nproc-per-node 8 examples/train_ddp.py packed/ --processor Qwen/Qwen2.5-VL-3B-Instruct \\
        --model Qwen/Qwen2.5-VL-3B-Instruct --steps 1000 --accumulation 4

    # offline, on CPU, with a tiny random-init Qwen2.5-VL (what tests/train/test_trainers.py runs):
    torchrun --nproc-per-node 2 examples/train_ddp.py packed/ --processor proc/ --tiny --backend gloo

Each rank streams its own share of the packs (``make_loader`` reads rank and world size from
``torch.distributed``; every rank gets the same number of batches, so no collective hangs). The
loss of every optimizer step is the exact token mean over all its micro-batches on all ranks
(``wdspack.num_items_in_batch``; DDP averages gradients, so the loss is scaled by the world size).
Every ``--save-every`` steps each rank saves its loader state next to the model: a restart with
``--resume`` continues with exactly the next packs.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def say(line: str) -> None:
    """One write per line: the ranks share torchrun's stdout, and ``print`` writes the text and the
    newline separately, so two ranks' lines could interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--processor", required=True, help="the processor the dataset was packed with")
    ap.add_argument("--model", help="a checkpoint to train (from_pretrained)")
    ap.add_argument("--tiny", action="store_true", help="a tiny random-init Qwen2.5-VL instead (examples/tiny_vlm)")
    ap.add_argument("--backend", default="nccl", help="nccl on GPUs, gloo on CPU")
    ap.add_argument("--batch-size", type=int, default=1, help="packs per micro-batch per rank")
    ap.add_argument("--accumulation", type=int, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--save-every", type=int, default=0, help="save model + loader state every N steps (0: never)")
    ap.add_argument("--checkpoint", default="ckpt", help="folder for the checkpoints")
    ap.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import wdspack

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local_rank}") if args.backend == "nccl" else torch.device("cpu")
    if args.tiny:
        from tiny_vlm import qwen2_5_vl

        model = qwen2_5_vl.model(wdspack.load_processor(args.processor), seed=0)
    else:
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(args.model)
    model.to(device).train()
    # A micro-batch of text-only packs leaves the vision tower unused: DDP must look for such parameters.
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, find_unused_parameters=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = wdspack.make_loader(args.dataset, batch_size=args.batch_size, num_workers=args.workers,
                                 processor=args.processor, seed=0)
    ckpt = Path(args.checkpoint)
    step = 0
    if args.resume:
        # torch.load of our own checkpoint (model and optimizer state), never of dataset bytes.
        state = torch.load(ckpt / "model.pt", map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = int(state["step"])
        loader.load_state_dict(json.loads((ckpt / f"loader-rank{rank}.json").read_text()))
    batches = iter(())
    while step < args.steps:
        micro = []
        while len(micro) < args.accumulation:
            batch = next(batches, None)
            if batch is None:
                batches = iter(loader)  # the next epoch
                continue
            micro.append(batch)
        n = wdspack.num_items_in_batch(micro)
        total = 0.0
        for i, batch in enumerate(micro):
            sync = contextlib.nullcontext() if i == len(micro) - 1 else ddp.no_sync()
            with sync:
                loss = ddp(**wdspack.model_inputs(batch, model), num_items_in_batch=n).loss
                (loss * world).backward()
            total += float(loss.detach())
        opt.step()
        opt.zero_grad()
        step += 1
        mean = torch.tensor(total, dtype=torch.float64)
        dist.all_reduce(mean)  # Σ over ranks of (this rank's loss sum / n): the step's exact token mean, for the log
        if rank == 0:
            say(f"step {step}: loss {mean.item():.4f} ({int(n)} target tokens over {world} ranks)")
        if args.save_every and step % args.save_every == 0:
            ckpt.mkdir(parents=True, exist_ok=True)
            (ckpt / f"loader-rank{rank}.json").write_text(json.dumps(loader.state_dict()))
            if rank == 0:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step},
                           ckpt / "model.pt")
            dist.barrier()
    digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()
    say(f"rank {rank} finished {step} steps; parameters sha256 {digest[:16]}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
