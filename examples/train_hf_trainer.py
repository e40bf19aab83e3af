"""Hugging Face ``Trainer`` on packed, model-ready batches, under ``torchrun``.

    torchrun --nproc-per-node 8 examples/train_hf_trainer.py packed/ --processor Qwen/Qwen2.5-VL-3B-Instruct \\
        --model Qwen/Qwen2.5-VL-3B-Instruct --steps 1000 --accumulation 4 --save-every 100

    # offline, on CPU, with a tiny random-init Qwen2.5-VL (what tests/train/test_trainers.py runs):
    torchrun --nproc-per-node 2 examples/train_hf_trainer.py packed/ --processor proc/ --tiny --backend gloo

``wdspack.train.trainers.PackedTrainer`` trains from ``make_loader`` as is: each rank streams its own
packs (accelerate does not split them again), the loss of every optimizer step is the exact token
mean over all its micro-batches on all ranks, and each checkpoint holds every rank's loader state,
so ``--resume`` continues with exactly the next packs. The optimizer and schedule are those of
``examples/train_ddp.py`` (AdamW on all parameters, constant learning rate, no clipping): the two
recipes train the same parameters, bit for bit.

Resume with the ``--steps`` the run started with. The constant learning rate here does not depend
on it, so a larger ``--steps`` continues exactly too; a schedule Trainer computes from ``max_steps``
(``linear``, ``cosine``) would not, and ``PackedTrainer`` refuses such a resume
(docs/guides/train.md, "Resuming a Trainer run").
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
    ap.add_argument("--checkpoint", default="ckpt", help="Trainer's output_dir: checkpoint-<step> folders go here")
    ap.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --checkpoint")
    ap.add_argument("--log-batches", action="store_true", help="log a digest of every micro-batch's input_ids")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist
    from transformers import PrinterCallback, TrainerCallback, TrainingArguments

    import wdspack
    from wdspack.train.trainers import PackedTrainer

    dist.init_process_group(args.backend)  # before make_loader, which reads rank and world size from it
    rank = dist.get_rank()
    if args.tiny:
        from tiny_vlm import qwen2_5_vl

        model = qwen2_5_vl.model(wdspack.load_processor(args.processor), seed=0)
    else:
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(args.model)
    loader = wdspack.make_loader(args.dataset, batch_size=args.batch_size, num_workers=args.workers,
                                 processor=args.processor, seed=0)
    training = TrainingArguments(
        output_dir=args.checkpoint, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.accumulation, learning_rate=args.lr, lr_scheduler_type="constant",
        max_grad_norm=0.0, logging_steps=1, save_strategy="steps" if args.save_every else "no",
        save_steps=args.save_every or 500, ignore_data_skip=True, use_cpu=args.backend != "nccl",
        # A micro-batch of text-only packs leaves the vision tower unused: DDP must look for such parameters.
        ddp_backend=args.backend, ddp_find_unused_parameters=True, report_to="none", disable_tqdm=True, seed=0)

    class Log(TrainerCallback):
        def on_log(self, _args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and logs and "loss" in logs:
                say(f"step {state.global_step}: loss {logs['loss']:.4f} (epoch {state.epoch:.2f})")

    class Trainer(PackedTrainer):
        def compute_loss(self, model, inputs, *a, **kw):
            if args.log_batches:
                ids = hashlib.sha256(inputs["input_ids"].cpu().numpy().tobytes()).hexdigest()[:12]
                say(f"rank {rank} step {self.state.global_step + 1} batch input_ids {ids}")
            return super().compute_loss(model, inputs, *a, **kw)

    # train_ddp.py's optimizer: weight decay on every parameter (Trainer's own groups out biases and norms).
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    trainer = Trainer(model=model, args=training, loader=loader, optimizers=(optimizer, None), callbacks=[Log()])
    trainer.remove_callback(PrinterCallback)  # Log writes the lines instead
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    params = trainer.accelerator.unwrap_model(trainer.model).parameters()
    digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in params)).hexdigest()
    say(f"rank {rank} finished {trainer.state.global_step} steps; parameters sha256 {digest[:16]}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
