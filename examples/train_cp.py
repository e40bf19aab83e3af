"""Context-parallel training on packed, model-ready batches: a plain PyTorch loop under ``torchrun``.

    torchrun --nproc-per-node 8 examples/train_cp.py packed-cp4/ --cp 4 --processor Qwen/Qwen2.5-VL-3B-Instruct \\
        --model Qwen/Qwen2.5-VL-3B-Instruct --steps 1000

    # offline, on CPU, with a tiny random-init Qwen2.5-VL (what tests/train/test_cp_recipe.py runs):
    torchrun --nproc-per-node 2 examples/train_cp.py packed/ --cp 2 --processor proc/ --tiny --dtype float64

Ranks ``[k·cp, (k+1)·cp)`` form CP group ``k``; the ranks with the same CP rank form a DP group, and the
loader reads by DP rank, so the ``cp`` ranks of a group see the same packs. In every step each rank runs
the encoders on the whole batch, and the text model on its share of every sub-sample
(:func:`wdspack.train.cp_attention.context_parallel`: TransformerEngine's split, positions computed on the
whole pack, labels shifted before the split; attention all-gathers keys and values over the CP group: on CUDA
in bfloat16/float16 through PyTorch's varlen FlashAttention kernel, each rank's two chunks of every sub-sample
a query sequence over its key prefix, elsewhere through SDPA with each rank's mask; ``--kernel reference``
runs the varlen path on any device over the reference kernel).
The loss of a step is the sum over every rank's targets divided by the step's target count
(``wdspack.num_items_in_batch`` over the DP group), and the gradients are summed over all ranks
(:func:`~wdspack.train.cp_attention.all_reduce_gradients`): the unsplit step's, exactly. A dataset packed with
``--cp N`` (the same ``N``) loads with segments that split with no more padding; any other is padded here.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def say(line: str) -> None:
    """One write per line (the ranks share torchrun's stdout)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def groups(cp: int):
    """This rank's CP group (``cp`` consecutive ranks) and DP group (the same CP rank of every CP group).
    Every rank creates every group, as ``torch.distributed.new_group`` asks."""
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    if world % cp:
        raise SystemExit(f"--cp {cp} does not divide the {world} ranks; start a multiple of {cp} processes")
    cp_groups = [dist.new_group(list(range(s, s + cp))) for s in range(0, world, cp)]
    dp_groups = [dist.new_group(list(range(r, world, cp))) for r in range(cp)]
    return cp_groups[rank // cp], dp_groups[rank % cp]


def steps(loader, accumulation: int):
    """The loader's batches, ``accumulation`` at a time (one optimizer step's micro-batches), epoch after epoch."""
    while True:
        micro = []
        for batch in loader:
            micro.append(batch)
            if len(micro) == accumulation:
                yield micro
                micro = []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--cp", type=int, required=True, help="context-parallel ranks per group (divides the world)")
    ap.add_argument("--processor", required=True, help="the processor the dataset was packed with")
    ap.add_argument("--model", help="a checkpoint to train (from_pretrained)")
    ap.add_argument("--tiny", action="store_true", help="a tiny random-init Qwen2.5-VL instead (examples/tiny_vlm)")
    ap.add_argument("--backend", help="nccl where CUDA is, else gloo (default)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float64"))
    ap.add_argument("--batch-size", type=int, default=1, help="packs per micro-batch per DP rank")
    ap.add_argument("--accumulation", type=int, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--kernel", choices=("auto", "reference"), default="auto",
                    help="auto: PyTorch's varlen kernel on CUDA in bfloat16/float16, SDPA with a mask elsewhere; "
                         "reference: the varlen path over wdspack's reference kernel on any device (slow)")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import wdspack
    from wdspack.models.varlen import reference_varlen_attn
    from wdspack.train.cp import cp_layout
    from wdspack.train.cp_attention import all_reduce_gradients, auto_kernel, context_parallel, use_cp_attention

    dist.init_process_group(args.backend or ("nccl" if torch.cuda.is_available() else "gloo"))
    rank, world, cp = dist.get_rank(), dist.get_world_size(), args.cp
    cp_group, dp_group = groups(cp)
    cuda = dist.get_backend() == "nccl"
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}") if cuda else torch.device("cpu")
    processor = wdspack.load_processor(args.processor)
    if args.tiny:
        from tiny_vlm import qwen2_5_vl

        model = qwen2_5_vl.model(processor, seed=0)
    else:
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(args.model)
    model.to(device=device, dtype=getattr(torch, args.dtype)).train()
    # the text stack only; the encoders keep theirs
    name = use_cp_attention(model, kernel=reference_varlen_attn if args.kernel == "reference" else None)
    if rank == 0:
        probe = torch.empty(0, device=device, dtype=getattr(torch, args.dtype))
        varlen = args.kernel == "reference" or auto_kernel(probe) is not None
        path = "the varlen path" if varlen else "SDPA with each rank's mask"
        say(f"attention: {name} ({path} on {device.type})")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = wdspack.make_loader(args.dataset, batch_size=args.batch_size, num_workers=args.workers,
                                 processor=processor, seed=0, rank=rank // cp, world_size=world // cp)
    padded = 0
    for step, micro in zip(range(1, args.steps + 1), steps(loader, args.accumulation)):
        n = wdspack.num_items_in_batch(micro, group=dp_group)  # the step's targets, counted once per DP rank
        total = torch.zeros((), dtype=torch.float64, device=device)
        for batch in micro:
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            layout = cp_layout(batch["cu_seqlens"], cp=cp, rank=rank % cp, group=cp_group, cu_seqlens=True)
            padded += layout.padding
            with context_parallel(model, layout) as share:  # the text model runs on this rank's share
                logits = model(**wdspack.model_inputs(batch, model)).logits  # [1, n_local, V]
            loss = F.cross_entropy(logits[0].float() if args.dtype == "bfloat16" else logits[0], share.labels[0],
                                   ignore_index=-100, reduction="sum")
            (loss / n).backward()
            total += loss.detach().double()
        all_reduce_gradients(model)  # summed over DP × CP (every rank)
        opt.step()
        opt.zero_grad()
        dist.all_reduce(total)  # Σ over every rank's targets: the step's loss is total / n
        if rank == 0:
            say(f"step {step}: loss {total.item() / int(n):.12e} ({int(n)} target tokens, {world // cp} DP × {cp} CP, "
                f"2·cp padding {padded} tokens so far)")
    say(f"rank {rank} finished {args.steps} steps")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
