"""Train on a mixture of packed datasets with Hugging Face ``Trainer``, logging the loss per source.

    # mix.yaml:  sources: [{path: captions/, weight: 0.5, name: captions}, {path: chats/, weight: 0.5, name: chats}]
    torchrun --nproc-per-node 8 examples/train_mixture.py mix.yaml --processor Qwen/Qwen2.5-VL-3B-Instruct \\
        --model Qwen/Qwen2.5-VL-3B-Instruct --steps 1000 --accumulation 4 --log-every 10

    # offline, on CPU, with a tiny random-init Qwen2.5-VL (what tests/train/test_mixture.py runs):
    python examples/train_mixture.py mix.yaml --processor proc/ --tiny --device cpu --steps 4
    torchrun --nproc-per-node 2 examples/train_mixture.py mix.yaml --processor proc/ --tiny --device cpu

``make_loader`` reads the mixture file (DESIGN.md section 8): each step's packs come from the
sources by the exact token schedule, and every batch names each pack's source (``source_idx``).
``wdspack.train.trainers.PackedTrainer`` then logs, next to Trainer's ``loss``, the loss and the
target tokens of each source since the last log: ``loss/<name>`` is the exact token mean over
every micro-batch of every step on every rank, ``tokens/<name>`` the targets it is the mean of.
Every log is printed as one line::

    step 2: loss 11.9321 | captions: loss 11.9133 over 412 target tokens | chats: loss 11.9712 over 97 ...

and lands in ``trainer.state.log_history`` (and in TensorBoard / W&B with ``--report-to``). The
sources must have been packed with the same processor (``wdspack pack ... --processor P``).
"""

from __future__ import annotations

import argparse
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


def log_line(step: int, logs: dict[str, float], names: tuple[str, ...]) -> str:
    """One training log as a line: Trainer's loss, then each source's loss and target tokens.

    Example:
        >>> log_line(3, {"loss": 2.5, "loss/a": 2.0, "tokens/a": 10, "tokens/b": 0}, ("a", "b"))
        'step 3: loss 2.5000 | a: loss 2.0000 over 10 target tokens | b: no target tokens'
    """
    parts = [f"step {step}: loss {logs['loss']:.4f}"]
    for name in names:
        tokens = int(logs[f"tokens/{name}"])
        parts.append(f"{name}: loss {logs[f'loss/{name}']:.4f} over {tokens} target tokens" if tokens
                     else f"{name}: no target tokens")
    return " | ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mixture", help="a mixture file (YAML or JSON: sources: [{path, weight, name}], unit)")
    ap.add_argument("--processor", required=True, help="the processor the sources were packed with")
    ap.add_argument("--model", help="a checkpoint to train (from_pretrained)")
    ap.add_argument("--tiny", action="store_true", help="a tiny random-init Qwen2.5-VL instead (examples/tiny_vlm)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None,
                    help="cuda (NCCL between ranks) or cpu (gloo); default: cuda where there is one")
    ap.add_argument("--batch-size", type=int, default=1, help="packs per micro-batch per rank")
    ap.add_argument("--accumulation", type=int, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--log-every", type=int, default=1, help="optimizer steps per log")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--output", default="mixture-out", help="Trainer's output_dir")
    ap.add_argument("--report-to", default="none", help="Trainer's report_to: none, tensorboard, wandb, ...")
    args = ap.parse_args(argv)
    if not args.tiny and not args.model:
        ap.error("give --model CHECKPOINT or --tiny")

    import torch
    import torch.distributed as dist
    from transformers import PrinterCallback, TrainerCallback, TrainingArguments

    import wdspack
    from wdspack.train.trainers import PackedTrainer

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:  # before make_loader, which reads rank and world size from it
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    processor = wdspack.load_processor(args.processor)
    if args.tiny:
        from tiny_vlm import qwen2_5_vl

        model = qwen2_5_vl.model(processor, seed=0)
    else:
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(args.model)
    loader = wdspack.make_loader(args.mixture, batch_size=args.batch_size, num_workers=args.workers,
                                 processor=processor, seed=0)
    training = TrainingArguments(
        output_dir=args.output, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.accumulation, learning_rate=args.lr, lr_scheduler_type="constant",
        logging_steps=args.log_every, save_strategy="no", ignore_data_skip=True, use_cpu=device == "cpu",
        # A micro-batch of text-only packs leaves the vision tower unused: DDP must look for such parameters.
        ddp_find_unused_parameters=True if distributed else None, report_to=args.report_to, disable_tqdm=True,
        seed=0)

    class Print(TrainerCallback):
        def on_log(self, _args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and logs and "loss" in logs:
                say(log_line(state.global_step, logs, loader.source_names))

    trainer = PackedTrainer(model=model, args=training, loader=loader, callbacks=[Print()])
    trainer.remove_callback(PrinterCallback)  # Print writes the lines instead
    if trainer.is_world_process_zero():
        say(f"sources {', '.join(loader.source_names)}; {len(loader)} batches per epoch on each rank")
    trainer.train()
    say(f"rank {trainer.args.process_index} finished {trainer.state.global_step} steps")
    if distributed:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
