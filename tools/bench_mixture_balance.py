"""``balance="cost"`` with a mixture: how long the slowest rank makes a step wait, and what it does to
the mixture's shares. An image-heavy source (LLaVA-like packs: 4096 tokens, up to 16 images) and a
text-only one (the same text, no images), 50/50 in tokens:

    python -m tools.bench_mixture_balance
    python -m tools.bench_mixture_balance --json docs/benchmarks/data/bench_mixture_balance.json

For each layout (ranks × workers, packs per step) it plans one mixture epoch with the loader's own
functions (:func:`~wdspack.loader.mixture.merge.plan_slot` per slot, then, balanced, each worker's windows
in cost bands by :func:`~wdspack.loader.balance.band_order`, as ``MixedSources.schedule`` does; no pack
is read) and prints, without and with the balance:

- slowest/mean: ``Σ_t max_rank cost / Σ_t mean_rank cost`` under the default CostModel (1.0: no wait);
- the image source's token share error, in points, over every window of 100 global steps (the max),
  over spans of whole balance windows (aligned; as few as make 100 steps or more), and over the epoch.

The balanced passes are dealt in runs of 1 pack (local files: the default) and of 8 (one request per
8 packs over a network).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from tools.bench_packing import llava_like  # noqa: E402
from wdspack import CostModel, plan_packs  # noqa: E402
from wdspack.format.pack_index import COLUMNS  # noqa: E402
from wdspack.loader.balance import band_order, waiting  # noqa: E402
from wdspack.loader.mixture.merge import plan_slot  # noqa: E402
from wdspack.loader.mixture.spec import Mixture, MixtureSource, mixture_epoch  # noqa: E402
from wdspack.loader.mixture.streams import source_layout  # noqa: E402


def source_rows(n: int, *, images: bool, seed: int) -> np.ndarray:
    """Pack index rows of ``n`` LLaVA-like samples packed by bfd (without their images when not ``images``)."""
    w = llava_like(n, seed)
    img = w.images if images else np.zeros_like(w.images)
    tokens = w.tokens if images else w.tokens - 64 * w.images
    packs = plan_packs(tokens, img, seq_len=w.seq_len, max_images=w.max_images, algorithm="bfd", seed=seed)
    packs = [packs[k] for k in np.random.default_rng(seed).permutation(len(packs))]
    rows = np.zeros((len(packs), len(COLUMNS)), np.int64)
    for i, p in enumerate(packs):
        t = tokens[p]
        rows[i, 1:6] = [t.sum(), (t * t).sum(), len(p), img[p].sum(), 64 * img[p].sum()]
    return rows


def plan(rows: list[np.ndarray], *, ranks: int, workers: int, batch_size: int, seed: int, balanced: bool,
         run: int = 1, window: int = 256, buffer: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """``[steps, ranks]`` costs and tokens of the image source, as the loader emits epoch 0."""
    model = CostModel()
    costs = [model.costs(r) for r in rows]
    tokens = [r[:, COLUMNS.index("tokens")] for r in rows]
    shard = 1000
    layouts = [source_layout(name, [min(shard, len(r) - a) for a in range(0, len(r), shard)], t)
               for name, r, t in zip(("images", "text"), rows, tokens)]
    if balanced:
        layouts = [dataclasses.replace(lay, costs=c, run=run) for lay, c in zip(layouts, costs)]
    mix = Mixture((MixtureSource("images", 1), MixtureSource("text", 1)))
    per = mixture_epoch(mix, [int(t.sum()) for t in tokens], [len(t) for t in tokens]).per_slot(ranks * workers,
                                                                                               batch_size)
    steps = per // batch_size * workers
    cost = np.zeros((steps, ranks), np.int64)
    image_tokens = np.zeros((steps, ranks), np.int64)
    all_tokens = np.zeros((steps, ranks), np.int64)
    for r in range(ranks):
        for w in range(workers):
            p = plan_slot(layouts, mix.shares, slot=r * workers + w, slots=ranks * workers, per_slot=per, seed=seed,
                          shuffle_buffer=1 if balanced else buffer, workers=workers, batch_size=batch_size,
                          own_shares=balanced)
            c = np.where(p.source == 0, costs[0][np.where(p.source == 0, p.row, 0)],
                         costs[1][np.where(p.source == 1, p.row, 0)])
            order = (band_order(c, limit=per, window=window, batch_size=batch_size, seed=seed, epoch=0)
                     if balanced else np.arange(per))
            c, src, units = c[order], p.source[order], p.units[order]
            cost[w::workers, r] = c.reshape(-1, batch_size).sum(1)
            image_tokens[w::workers, r] = np.where(src == 0, units, 0).reshape(-1, batch_size).sum(1)
            all_tokens[w::workers, r] = units.reshape(-1, batch_size).sum(1)
    return cost, np.stack([image_tokens.sum(1), all_tokens.sum(1)], 1)


def share_error(tokens: np.ndarray, *, window: int, aligned: int) -> dict:
    """Max |image share - 0.5| in points over every ``window`` of global steps, over spans of whole
    balance windows (``aligned`` steps each) of ``window`` steps or more, and over the epoch."""
    img, total = np.cumsum(np.r_[[[0, 0]], tokens], axis=0).T
    n = len(tokens)
    sliding = max((abs((img[t + window] - img[t]) / (total[t + window] - total[t]) - 0.5)
                   for t in range(n - window + 1)), default=0.0)
    aligned *= -(-window // aligned)  # whole balance windows, ``window`` steps or more
    cuts = list(range(0, n, aligned)) + [n]
    blocks = max((abs((img[b] - img[a]) / (total[b] - total[a]) - 0.5) for a, b in itertools.pairwise(cuts)
                  if b - a >= min(window, n)), default=0.0)  # a window of the guarantee's length at least
    return {"every_100_steps": 100 * sliding, "balance_windows": 100 * blocks,
            "epoch": 100 * abs(img[-1] / total[-1] - 0.5)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=60_000, help="samples per source")
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--window", type=int, default=256, help="the balance window, packs per worker")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    rows = [source_rows(args.samples, images=True, seed=args.seed),
            source_rows(args.samples, images=False, seed=args.seed + 1)]
    model = CostModel()
    print(f"images: {len(rows[0])} packs, mean cost {model.costs(rows[0]).mean():.0f}; text: {len(rows[1])} packs, "
          f"mean cost {model.costs(rows[1]).mean():.0f} (CostModel(); 50/50 in tokens)")
    print(f"{'ranks':>5} {'K':>2} {'B':>2} {'steps':>6}  {'slowest/mean':>24}   share error, points "
          "(every 100 steps / per balance window / epoch)")
    print(f"{'':>19}  {'off':>6} {'run 1':>7} {'run 8':>7}   {'off':>20}   {'run 1':>20}")
    results = []
    for ranks in args.ranks:
        for workers in args.workers:
            for b in args.batch_sizes:
                kw = dict(ranks=ranks, workers=workers, batch_size=b, seed=args.seed, window=args.window)
                t0 = time.perf_counter()
                off, off_tokens = plan(rows, balanced=False, **kw)
                on, on_tokens = plan(rows, balanced=True, run=1, **kw)
                on8, _ = plan(rows, balanced=True, run=8, **kw)
                aligned = args.window // b * workers  # global steps per balance window
                r = {"ranks": ranks, "workers": workers, "batch_size": b, "steps": len(on),
                     "slowest_over_mean": {"off": waiting(off), "run_1": waiting(on), "run_8": waiting(on8)},
                     "share_error_points": {"off": share_error(off_tokens, window=100, aligned=aligned),
                                            "run_1": share_error(on_tokens, window=100, aligned=aligned)},
                     "plan_seconds": time.perf_counter() - t0}
                results.append(r)
                s, e = r["slowest_over_mean"], r["share_error_points"]
                fmt = "{every_100_steps:5.2f} / {balance_windows:5.2f} / {epoch:5.3f}"
                print(f"{ranks:>5} {workers:>2} {b:>2} {len(on):>6}  {s['off']:>6.3f} {s['run_1']:>7.3f} "
                      f"{s['run_8']:>7.3f}   {fmt.format(**e['off'])}   {fmt.format(**e['run_1'])}", flush=True)
    if args.json:
        doc = {"workload": {"samples_per_source": args.samples, "packs": [len(r) for r in rows], "seq_len": 4096,
                            "window": args.window}, "cost_model": vars(model), "results": results}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
