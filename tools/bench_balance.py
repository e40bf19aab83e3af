"""How long the slowest rank makes every step wait: the loader's plans with and without ``balance="cost"``.

    python -m tools.bench_balance                       # 200k LLaVA-like samples, 8 and 64 ranks
    python -m tools.bench_balance --json docs/benchmarks/data/bench_balance.json --plot docs/balance.png

Small datasets too (``small``): about 660 packs in shards of 100 over 8 ranks, 2 packs a step, where
a fixed run of 32 packs per request leaves few runs to deal; the run length the loader chooses by
default (:func:`~wdspack.loader.balance.choose_run`: 1 for local files, over a network the longest
run that keeps the slowest rank within 5 %) against fixed runs of 32 and 1, with their requests.

The workload is the packing benchmark's LLaVA-like mix (``tools/bench_packing.py``: seq_len 4096,
16 images per pack, bfd), with the packs in the seeded shuffled order ``wdspack pack`` writes and
cut into shards of 1,000 packs. Each pack's index row (tokens, Σ length², images, ...) is computed
as ``wdspack pack`` computes it; no tar is written, since only the plans are compared: the exact
functions the loader runs (:func:`plan_epoch` + the shuffle buffer, and :func:`plan_epoch_balanced`).

For each step ``t`` every rank runs ``batch_size`` packs (worker ``t % workers`` of each rank
serves it); the step takes as long as its costliest rank. The figure is

    Σ_t max_rank cost(rank, t) / Σ_t mean_rank cost(rank, t)

(1.0: nobody waits), under the default :class:`~wdspack.CostModel`, and also per single component
(images only, Σ length² only) under the same balanced plan. Requests are the ranged reads a plan
needs in an epoch (one per range a slot reads).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from tools.bench_packing import llava_like  # noqa: E402
from wdspack import CostModel, plan_packs  # noqa: E402
from wdspack.format.pack_index import COLUMNS  # noqa: E402
from wdspack.loader.balance import choose_run, plan_epoch_balanced, step_costs  # noqa: E402
from wdspack.loader.plan import plan_epoch  # noqa: E402


def workload(n: int, shard_packs: int, seed: int = 0) -> list[np.ndarray]:
    """Pack index rows per shard for ``n`` LLaVA-like samples (offsets left at 0)."""
    w = llava_like(n, seed)
    packs = plan_packs(w.tokens, w.images, seq_len=w.seq_len, max_images=w.max_images, algorithm="bfd", seed=seed)
    packs = [packs[k] for k in np.random.default_rng(seed).permutation(len(packs))]  # as the pipeline writes them
    rows = np.zeros((len(packs), len(COLUMNS)), np.int64)
    for i, p in enumerate(packs):
        t = w.tokens[p]
        rows[i, 1:6] = [t.sum(), (t * t).sum(), len(p), w.images[p].sum(), 64 * w.images[p].sum()]
    return [rows[a:a + shard_packs] for a in range(0, len(rows), shard_packs)]


def waiting(steps: np.ndarray) -> float:
    return float(steps.max(1).sum() / steps.mean(1).sum())


def requests(plan) -> int:
    return sum(len(s) for s in plan.slots)


def run(index: list[np.ndarray], *, ranks: int, workers: int, batch_size: int, seed: int) -> dict:
    model = CostModel()
    counts = [len(x) for x in index]
    costs = [model.costs(x) for x in index]
    components = {"images": [x[:, COLUMNS.index("images")] for x in index],
                  "attention": [x[:, COLUMNS.index("attention")] for x in index]}
    t0 = time.perf_counter()
    base = plan_epoch(counts, slots=ranks * workers, epoch=0, seed=seed, shuffle=True, remainder="drop",
                      batch_size=batch_size)
    t1 = time.perf_counter()
    bal = plan_epoch_balanced(counts, costs, ranks=ranks, workers=workers, epoch=0, seed=seed, shuffle=True,
                              remainder="drop", batch_size=batch_size)
    t2 = time.perf_counter()
    heavy = plan_epoch_balanced(counts, costs, ranks=ranks, workers=workers, epoch=0, seed=seed, shuffle=True,
                                remainder="drop", batch_size=batch_size, heaviest_first=True)
    kw = dict(ranks=ranks, workers=workers, batch_size=batch_size, seed=seed)
    heavy_steps = step_costs(heavy, costs, **kw)
    out = {
        "ranks": ranks, "workers": workers, "batch_size": batch_size, "steps": len(heavy_steps),
        "slowest_over_mean": {"shuffle_buffer": waiting(step_costs(base, costs, **kw)),
                              "balanced": waiting(step_costs(bal, costs, **kw)),
                              "balanced_heaviest_first": waiting(heavy_steps)},
        "balanced_components": {k: waiting(step_costs(bal, c, **kw)) for k, c in components.items()},
        "shuffle_buffer_components": {k: waiting(step_costs(base, c, **kw)) for k, c in components.items()},
        "first_step_is_costliest": bool(heavy_steps[0].max() == heavy_steps.max(1).max()),
        "requests_per_epoch": {"shuffle_buffer": requests(base), "balanced": requests(bal)},
        "plan_seconds": {"shuffle_buffer": t1 - t0, "balanced": t2 - t1},
    }
    return out


def small(index: list[np.ndarray], *, ranks: int, workers: int, batch_size: int, seed: int) -> dict:
    """Waiting and requests with fixed runs of 32 and 1 and with the run the loader chooses."""
    costs = [CostModel().costs(x) for x in index]
    counts = [len(x) for x in index]
    kw = dict(ranks=ranks, workers=workers, epoch=0, seed=seed, shuffle=True, remainder="drop",
              batch_size=batch_size, window=256, heaviest_first=False)
    choose = {k: v for k, v in kw.items() if k != "epoch"}
    runs = {"run 32 (fixed)": 32, "run 1 (fixed)": 1,
            "chosen, local files": choose_run(counts, costs, remote=False, **choose),  # type: ignore[arg-type]
            "chosen, over a network": choose_run(counts, costs, remote=True, **choose)}  # type: ignore[arg-type]
    out = {"packs": sum(counts), "shards": len(counts), "ranks": ranks, "workers": workers,
           "batch_size": batch_size, "runs": {}}
    for name, run_length in runs.items():
        plan = plan_epoch_balanced(counts, costs, run=run_length, **kw)  # type: ignore[arg-type]
        steps = step_costs(plan, costs, ranks=ranks, workers=workers, batch_size=batch_size, seed=seed)
        out["runs"][name] = {"run": run_length, "slowest_over_mean": waiting(steps), "requests": requests(plan)}
    return out


def plot(index: list[np.ndarray], path: str, *, ranks: int, workers: int, seed: int, steps: int = 200) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    costs = [CostModel().costs(x) for x in index]
    counts = [len(x) for x in index]
    kw = dict(ranks=ranks, workers=workers, batch_size=1, seed=seed)
    plans = {"shuffle buffer (today)": plan_epoch(counts, slots=ranks * workers, epoch=0, seed=seed, shuffle=True,
                                                  remainder="drop"),
             'balance="cost", heaviest_first': plan_epoch_balanced(counts, costs, ranks=ranks, workers=workers,
                                                                   epoch=0, seed=seed, shuffle=True, remainder="drop",
                                                                   heaviest_first=True)}
    fig, ax = plt.subplots(figsize=(9, 3.6), dpi=110)
    for (name, plan), color in zip(plans.items(), ("#d62728", "#1f77b4")):
        s = step_costs(plan, costs, **kw)[:steps]
        ax.plot(np.arange(len(s)), s.max(1) / s.mean(1), color=color, lw=1.2,
                label=f"{name}: Σ slowest / Σ mean = {waiting(step_costs(plan, costs, **kw)):.3f}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel(f"step (first {steps} of the epoch)")
    ax.set_ylabel("slowest rank / mean rank")
    ax.set_title(f"{ranks} ranks × {workers} workers, 1 pack per rank per step, LLaVA-like packs at 4096 tokens")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--shard-packs", type=int, default=1000)
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--small-samples", type=int, default=5000, help="the small dataset (about 750 packs)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plot", help="a PNG of each step's slowest rank over the mean, 64 ranks, batch 1")
    args = ap.parse_args(argv)

    index = workload(args.samples, args.shard_packs, args.seed)
    packs = sum(len(x) for x in index)
    print(f"{args.samples} LLaVA-like samples -> {packs} packs in {len(index)} shards; cost model {CostModel()}")
    print(f"{'ranks':>5} {'B':>2} {'steps':>6}  {'shuffle buffer':>14} {'balanced':>9} {'+heaviest':>9}   "
          f"{'images':>13} {'Σlen²':>13}   requests/epoch   plan s")
    results = []
    for ranks in args.ranks:
        for b in args.batch_sizes:
            r = run(index, ranks=ranks, workers=args.workers, batch_size=b, seed=args.seed)
            results.append(r)
            s, c, sc = r["slowest_over_mean"], r["balanced_components"], r["shuffle_buffer_components"]
            q, t = r["requests_per_epoch"], r["plan_seconds"]
            print(f"{ranks:>5} {b:>2} {r['steps']:>6}  {s['shuffle_buffer']:>14.3f} {s['balanced']:>9.3f} "
                  f"{s['balanced_heaviest_first']:>9.3f}   {sc['images']:.2f}->{c['images']:.3f} "
                  f"{sc['attention']:.2f}->{c['attention']:.3f}   {q['shuffle_buffer']:>5} -> {q['balanced']:<6} "
                  f"{t['shuffle_buffer']:.3f} / {t['balanced']:.2f}"
                  + ("" if r["first_step_is_costliest"] else "   (first step NOT the costliest)"))
    small_index = workload(args.small_samples, 100, args.seed)
    sm = small(small_index, ranks=8, workers=1, batch_size=2, seed=args.seed)
    print(f"\nsmall dataset: {sm['packs']} packs in {sm['shards']} shards, 8 ranks x 1 worker, 2 packs a step")
    for name, r in sm["runs"].items():
        print(f"  {name:<24} run {r['run']:>2}   slowest/mean {r['slowest_over_mean']:.3f}   "
              f"requests/epoch {r['requests']}")
    if args.plot:
        plot(index, args.plot, ranks=max(args.ranks), workers=args.workers, seed=args.seed)
    if args.json:
        doc = {"workload": {"samples": args.samples, "packs": packs, "shards": len(index), "seq_len": 4096,
                            "max_images": 16, "algorithm": "bfd"},
               "cost_model": vars(CostModel()), "results": results, "small": sm}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
