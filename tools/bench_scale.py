"""How the pack job scales: samples/s for the local pool (1 and 2 processes) and for Ray (2 CPUs)
on the same generated data, and a paper estimate for 25 M samples on 64 CPUs.

    python -m tools.bench_scale [--records 3000] [--out docs/benchmarks/data/bench_scale.md]

Data: ``examples/make_demo_data.py`` (Pillow images, long-tailed chats), tokenized with the real
Pixtral tokenizer shipped in ``mistral_common`` (as ``examples/demo.py`` does), seq_len 4096,
16 images, 64 tokens per image. Each setting packs the data twice and reports the second run, so
the Ray workers and the in-process tokenizer are warm; the local pool starts fresh processes for
every stage (as it does in a real job) and pays that inside its time.

Stage times come from wrapping the pipeline's own steps: ``measure``/``write`` are the task
stages (the tasks plus waiting on them), ``plan`` is planning alone, ``driver`` the rest of the
driver's work (reading the per-partition integers, selection, shard assignment, manifest).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from wdspack.packer import job  # noqa: E402
from wdspack.packer.config import PackConfig, RunOptions  # noqa: E402
from wdspack.packer.job import pack_dataset  # noqa: E402
from wdspack.packer.planner import plan_packs  # noqa: E402
from wdspack.packer.samples import SampleConfig  # noqa: E402

SEQ_LEN, MAX_IMAGES, TOKENS_PER_IMAGE = 4096, 16, 64
TARGET_SAMPLES, TARGET_CPUS = 25_000_000, 64


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class StageTimer:
    """Times the pipeline's stages by wrapping its module-level steps (driver side only)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.arrays: dict[str, np.ndarray] = {}
        self._saved: dict[str, object] = {}

    def __enter__(self) -> StageTimer:
        for name, key in (("plan_selected", "plan"), ("select_samples", "select"), ("assign_shards", "assign_shards")):
            self._wrap(name, key)
        original_run = job._run

        def timed_run(fn, tasks, config, *, desc, **kw):
            t = time.perf_counter()
            yield from original_run(fn, tasks, config, desc=desc, **kw)
            self.seconds[desc] = self.seconds.get(desc, 0.0) + time.perf_counter() - t

        self._saved["_run"] = original_run
        job._run = timed_run
        return self

    def _wrap(self, name: str, key: str) -> None:
        original = getattr(job, name)
        self._saved[name] = original

        def timed(*args, **kw):
            t = time.perf_counter()
            result = original(*args, **kw)
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t
            if key == "select":
                keep = result["keep"]
                self.arrays = {"tokens": result["tokens"][keep], "media": result["media"][keep]}
            return result

        setattr(job, name, timed)

    def __exit__(self, *exc) -> None:
        for name, fn in self._saved.items():
            setattr(job, name, fn)


def run_setting(sources, sample_config, work: Path, *, executor: str, workers: int, label: str) -> dict:
    config = PackConfig(seq_len=SEQ_LEN, max_images=MAX_IMAGES, shard_max_bytes=8 * 10**6,
                        records_per_partition=100, run=RunOptions(workers=workers, executor=executor))
    for attempt in range(2):  # the first run warms up; the second is measured
        out = work / f"{label}-{attempt}"
        with StageTimer() as timer:
            t = time.perf_counter()
            summary = pack_dataset(sources, out, sample_config=sample_config, config=config)
            wall = time.perf_counter() - t
    s = timer.seconds
    driver = wall - s.get("measure", 0) - s.get("write", 0) - s.get("plan", 0)
    return {"label": label, "wall": wall, "samples": summary.samples_read, "measure": s.get("measure", 0.0),
            "write": s.get("write", 0.0), "plan": s.get("plan", 0.0), "driver": driver,
            "digest": _digest(out), "arrays": timer.arrays}


def _digest(out: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    for p in sorted(out.iterdir()):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()[:16]


def plan_seconds_at(arrays: dict[str, np.ndarray], n: int, seed: int = 0) -> float:
    """bfd planning time for ``n`` samples resampled from the measured (tokens, images)."""
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, arrays["tokens"].size, n)
    tokens, images = arrays["tokens"][pick], arrays["media"][pick]
    plan_packs(tokens[:1000], images[:1000], seq_len=SEQ_LEN, max_images=MAX_IMAGES, algorithm="bfd")  # JIT
    t = time.perf_counter()
    plan_packs(tokens, images, seq_len=SEQ_LEN, max_images=MAX_IMAGES, algorithm="bfd", seed=seed)
    return time.perf_counter() - t


def report(rows: list[dict], *, plan_n: int, plan_s: float, cpus_here: int) -> str:
    base = rows[0]["samples"] / rows[0]["wall"]
    lines = [
        f"Pack job (measure + plan + write), {rows[0]['samples']} demo records, Pixtral tokenizer, seq_len "
        f"{SEQ_LEN}, {MAX_IMAGES} images, {TOKENS_PER_IMAGE} tokens/image; machine: {cpus_here} CPUs. "
        "Second (warm) run of each setting; stage seconds are wall time.",
        "",
        "| setting | samples/s | vs local-1 | wall s | measure s | write s | plan s | driver s | output sha256 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        rate = r["samples"] / r["wall"]
        lines.append(f"| {r['label']} | {rate:.0f} | {rate / base:.2f}× | {r['wall']:.2f} | {r['measure']:.2f} | "
                     f"{r['write']:.2f} | {r['plan']:.3f} | {r['driver']:.2f} | `{r['digest']}` |")
    same = len({r["digest"] for r in rows}) == 1
    lines += ["", f"Output identical across settings: {'yes' if same else 'NO'}.", ""]

    one = rows[0]
    n = one["samples"]
    measure_cost, write_cost = one["measure"] / n, one["write"] / n  # CPU-seconds per sample, one process
    driver_cost = one["driver"] / n
    plan_25m = plan_s * TARGET_SAMPLES / plan_n  # bfd is close to linear here (bucketed best fit)
    tasks_25m = TARGET_SAMPLES * (measure_cost + write_cost) / TARGET_CPUS
    driver_25m = TARGET_SAMPLES * driver_cost
    total = tasks_25m + plan_25m + driver_25m
    lines += [
        f"**Paper estimate: {TARGET_SAMPLES / 1e6:.0f} M samples on {TARGET_CPUS} CPUs** (from local-1's "
        "per-sample costs; assumes the tasks scale linearly over the cluster and shared storage keeps up):",
        "",
        "| part | per sample | 25 M samples |",
        "|---|---:|---:|",
        f"| measure (read + tokenize + spool), on {TARGET_CPUS} CPUs | {measure_cost * 1e3:.2f} ms CPU | "
        f"{TARGET_SAMPLES * measure_cost / TARGET_CPUS / 60:.1f} min |",
        f"| write (assemble + encode + tar), on {TARGET_CPUS} CPUs | {write_cost * 1e3:.2f} ms CPU | "
        f"{TARGET_SAMPLES * write_cost / TARGET_CPUS / 60:.1f} min |",
        f"| plan (bfd, one process; {plan_n / 1e6:.0f} M resampled in {plan_s:.2f} s, scaled linearly) | "
        f"{plan_s / plan_n * 1e6:.2f} µs | {plan_25m / 60:.1f} min |",
        f"| driver bookkeeping (one process) | {driver_cost * 1e6:.0f} µs | {driver_25m / 60:.1f} min |",
        f"| **total** | | **{total / 60:.0f} min ({total / 3600:.1f} h)** |",
        "",
        f"At 3000 records the driver term is mostly fixed start-up cost (tokenizer load, shard list), so "
        "its per-sample figure overstates it; the task stages dominate either way. The driver's memory "
        "peaks at ~190 B + the id per sample (tests/packer/test_driver_memory.py): "
        f"~{TARGET_SAMPLES * (190 + 80) / 1e9:.0f} GB for 25 M samples with 30-byte ids.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=3000)
    ap.add_argument("--plan-samples", type=int, default=2_000_000, help="samples for the planning timing")
    ap.add_argument("--workdir", help="keep data and outputs here (default: a temp folder)")
    ap.add_argument("--out", help="also write the markdown here")
    args = ap.parse_args(argv)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-scale-"))
    shutil.rmtree(work / "runs", ignore_errors=True)
    data = work / "data"
    if not (data / "llava.jsonl").exists():
        _load("make_demo_data", ROOT / "examples" / "make_demo_data.py").main([str(data), "--records",
                                                                                str(args.records)])
    tokenizer = _load("demo", ROOT / "examples" / "demo.py").prepare_tokenizer(work / "tokenizer")
    sample_config = SampleConfig(
        tokenizer=str(tokenizer), tokens_per_image=TOKENS_PER_IMAGE, image_token="[IMG]",
        chat_template=(ROOT / "examples" / "chat_templates" / "pixtral.jinja").read_text(encoding="utf-8"))
    sources = [str(data / "llava.jsonl"), str(data / "messages.jsonl")]

    rows = [run_setting(sources, sample_config, work / "runs", executor="local", workers=1, label="local-1"),
            run_setting(sources, sample_config, work / "runs", executor="local", workers=2, label="local-2")]
    try:
        import ray
    except ImportError:
        print("ray is not installed (pip install wdspack[ray]): skipping the Ray row", file=sys.stderr)
    else:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        try:
            rows.append(run_setting(sources, sample_config, work / "runs", executor="ray", workers=1,
                                    label="ray, 2 CPUs"))
        finally:
            ray.shutdown()
    plan_s = plan_seconds_at(rows[0]["arrays"], args.plan_samples)
    text = report(rows, plan_n=args.plan_samples, plan_s=plan_s, cpus_here=os.cpu_count() or 0)
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
