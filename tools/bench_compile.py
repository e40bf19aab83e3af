"""Eager vs ``torch.compile``d decoder layers, on the same packed batches in the same run (issue #41).

    python -m tools.bench_compile --quick          # a smoke run
    python -m tools.bench_compile --json out.json  # the defaults: bench_train's model and data

bench_train's data and model (the demo generator packed with the real ``Qwen2_5_VLProcessor``, a random
``Qwen2_5_VLForConditionalGeneration``), one epoch of packed batches, forward + backward:

- **eager**: the model as it is;
- **compiled**: a copy with :func:`wdspack.models.compile.compile_decoder_layers` (``--backend``,
  default Inductor; ``--mode``), the vision tower eager.

The compile time is the compiled model's first step less an eager step on the same batch. Then
``--rounds`` passes over every batch, the two models interleaved step by step (the host's drift falls
on both); the summed losses agree, and dynamo's graph count after the first step must not grow
(``recompiles_after_first_step``).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from tools.bench_train import build_model, packed_steps, read_packs, train_step

#: ``--quick``: a smoke run.
QUICK = {"records": 12, "seq_len": 512, "hidden": 64, "layers": 2, "rounds": 1}
DEFAULT = {"records": 40, "seq_len": 1024, "hidden": 256, "layers": 4, "rounds": 3}


def prepare(args: argparse.Namespace, work: Path) -> tuple[Any, list[Any]]:
    """bench_train's packed dataset and model (float32, CPU, SDPA); the model and its steps."""
    from examples.make_demo_data import generate
    from examples.tiny_vlm import qwen2_5_vl
    from wdspack.models import save_processor
    from wdspack.packer.config import PackConfig, RunOptions
    from wdspack.packer.job import pack_dataset
    from wdspack.packer.samples import SampleConfig

    generate(work / "data", records=args.records, seed=args.seed)
    sources = [str(work / "data" / "llava.jsonl"), str(work / "data" / "messages.jsonl")]
    processor = qwen2_5_vl.processor(work / "tok")
    folder = save_processor(processor, work / "processor")
    pack_dataset(sources, str(work / "packed"), sample_config=SampleConfig(processor=str(folder)),
                 config=PackConfig(seq_len=args.seq_len, max_images=16, run=RunOptions(max_drop_fraction=1.0)),
                 progress=False)
    model = build_model(processor, hidden=args.hidden, layers=args.layers).train()
    model.set_attn_implementation("sdpa")
    steps, _ = packed_steps(work / "packed", folder, model, batch_size=1, packs=read_packs(work / "packed"))
    return model, steps


def measure(model: Any, steps: list[Any], *, rounds: int, backend: str, mode: str | None) -> dict[str, Any]:
    """The compile time, and per mode the median seconds per step over ``rounds`` interleaved passes."""
    from torch._dynamo.utils import counters

    from wdspack.models.compile import compile_decoder_layers

    compiled = compile_decoder_layers(copy.deepcopy(model), backend=backend, mode=mode)
    torch._dynamo.reset()
    counters.clear()
    eager_first, _ = train_step(model, steps[0].kwargs, sync=False)
    first, _ = train_step(compiled, steps[0].kwargs, sync=False)
    graphs = counters["stats"]["unique_graphs"]
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    losses: dict[str, float] = {"eager": 0.0, "compiled": 0.0}
    for _ in range(rounds):
        for step in steps:
            for name, m in (("eager", model), ("compiled", compiled)):
                seconds, loss = train_step(m, step.kwargs, sync=False)
                times[name].append(seconds)
                losses[name] += loss
    per_step = {name: statistics.median(t) for name, t in times.items()}
    return {"compile_seconds": round(first - eager_first, 2), "first_step_seconds": round(first, 2),
            "steps": len(steps), "rounds": rounds,
            "recompiles_after_first_step": counters["stats"]["unique_graphs"] - graphs,
            "median_step_seconds": {k: round(v, 4) for k, v in per_step.items()},
            "speedup": round(per_step["eager"] / per_step["compiled"], 3),
            "loss_sum": {k: round(v, 4) for k, v in losses.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run: " + json.dumps(QUICK))
    for key, value in DEFAULT.items():
        ap.add_argument(f"--{key.replace('_', '-')}", type=int, help=f"(default {value})")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--mode", help="torch.compile's mode (default, max-autotune-no-cudagraphs, ...)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULT).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    with tempfile.TemporaryDirectory() as tmp:
        model, steps = prepare(args, Path(tmp))
        result = measure(model, steps, rounds=args.rounds, backend=args.backend, mode=args.mode)
    result.update(config={k: getattr(args, k) for k in (*DEFAULT, "backend", "mode", "seed")},
                  threads=torch.get_num_threads(), torch=torch.__version__,
                  params=sum(p.numel() for p in model.parameters()))
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
