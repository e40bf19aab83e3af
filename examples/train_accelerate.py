"""``accelerate`` on packed, model-ready batches, under ``torchrun`` (or ``accelerate launch``).

    torchrun --nproc-per-node 8 examples/train_accelerate.py packed/ --processor Qwen/Qwen2.5-VL-3B-Instruct \\
        --model Qwen/Qwen2.5-VL-3B-Instruct --steps 1000 --accumulation 4 --save-every 100

    # offline, on CPU, with a tiny random-init Qwen2.5-VL (what tests/train/test_trainers.py runs):
    torchrun --nproc-per-node 2 examples/train_accelerate.py packed/ --processor proc/ --tiny --backend gloo

``accelerator.prepare`` gets the model and the optimizer only. The loader is not prepared: it gives
each rank its own packs already, and ``prepare`` would split its batches over the ranks again
(``wdspack.model_inputs`` puts each batch on the model's device). Each optimizer step is the exact
token mean over all its micro-batches on all ranks (``wdspack.train.trainers.accumulate_gradients``).
A checkpoint is ``accelerator.save_state`` (model, optimizer, random states, the step counter)
plus every rank's loader state (``save_loader_state``: ``save_state`` keeps registered objects of
the main process only). Optimizer and schedule are those of ``examples/train_ddp.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def say(line: str) -> None:
    """One write per line: the ranks share torchrun's stdout, and ``print`` writes the text and the
    newline separately, so two ranks' lines could interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class StepCounter:
    """The optimizer steps taken: one number for all ranks, so ``register_for_checkpointing`` fits."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = int(state["step"])


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
    ap.add_argument("--save-every", type=int, default=0, help="save a checkpoint every N steps (0: never)")
    ap.add_argument("--checkpoint", default="ckpt", help="folder for the checkpoints")
    ap.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    ap.add_argument("--log-batches", action="store_true", help="log a digest of every micro-batch's input_ids")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    import wdspack
    from wdspack.train.trainers import accumulate_gradients, load_loader_state, save_loader_state, step_batches

    dist.init_process_group(args.backend)  # before make_loader, which reads rank and world size from it
    # A micro-batch of text-only packs leaves the vision tower unused: DDP must look for such parameters.
    accelerator = Accelerator(cpu=args.backend != "nccl",
                              kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    rank = accelerator.process_index
    if args.tiny:
        from tiny_vlm import qwen2_5_vl

        model = qwen2_5_vl.model(wdspack.load_processor(args.processor), seed=0)
    else:
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(args.model)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer = accelerator.prepare(model, optimizer)  # not the loader: its batches are this rank's already
    loader = wdspack.make_loader(args.dataset, batch_size=args.batch_size, num_workers=args.workers,
                                 processor=args.processor, seed=0)
    counter = StepCounter()
    accelerator.register_for_checkpointing(counter)
    ckpt = Path(args.checkpoint)
    if args.resume:
        accelerator.load_state(str(ckpt))
        load_loader_state(loader, ckpt)
    steps = step_batches(loader, args.accumulation)
    while counter.step < args.steps:
        micro = next(steps)
        if args.log_batches:
            for batch in micro:
                ids = hashlib.sha256(batch["input_ids"].numpy().tobytes()).hexdigest()[:12]
                say(f"rank {rank} step {counter.step + 1} batch input_ids {ids}")
        share = accumulate_gradients(accelerator, model, micro)
        optimizer.step()
        optimizer.zero_grad()
        counter.step += 1
        mean = accelerator.reduce(share.to(accelerator.device), "sum")  # the step's exact token mean, for the log
        if accelerator.is_main_process:
            say(f"step {counter.step}: loss {mean.item():.4f} (epoch {loader.epoch})")
        if args.save_every and counter.step % args.save_every == 0:
            accelerator.save_state(str(ckpt))
            save_loader_state(loader, ckpt)
            accelerator.wait_for_everyone()
    params = accelerator.unwrap_model(model).parameters()
    digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in params)).hexdigest()
    say(f"rank {rank} finished {counter.step} steps; parameters sha256 {digest[:16]}")
    accelerator.end_training()  # destroys the process group
    return 0


if __name__ == "__main__":
    sys.exit(main())
