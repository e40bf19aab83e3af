"""Packing benchmark: every algorithm and naive padding on seeded length distributions.

    python -m tools.bench_packing                 # LLaVA-like n=100k and 1M, two image-bound cases
    python -m tools.bench_packing --quick         # n=100k only
    python -m tools.bench_packing --json out.json --plot waste.png

Per workload and algorithm: packs vs the lower bound LB = max(⌈Σtokens/seq_len⌉,
⌈Σimages/max_images⌉) and vs the token lower bound, fill ratio, padding waste, samples and
images per pack, and planning time (one core; the numba kernels are compiled first, compile
time reported apart). "naive" pads each batch of 8 samples, in random order, to its longest.
Every plan is checked (each index once, no budget exceeded) while it is measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

import numpy as np

from wdspack import ALGORITHMS, plan_packs


@dataclass(frozen=True)
class Workload:
    name: str
    tokens: np.ndarray
    images: np.ndarray
    seq_len: int
    max_images: int


def llava_like(n: int, seed: int = 0, *, text_median: int = 300, name: str = "llava-like") -> Workload:
    """Most samples: one 64-token image + long-tailed text; ~4 % long text-only; ~8 % multi-image."""
    rng = np.random.default_rng(seed)
    u = rng.random(n)
    text = np.clip(rng.lognormal(np.log(text_median), 0.9, n), 10, 3000).astype(np.int64)
    images = np.where(u < 0.08, rng.integers(2, 7, n), 1)
    long = u > 0.96
    images = np.where(long, 0, images)
    tokens = np.where(long, rng.integers(1000, 4001, n), text + 64 * images)
    return Workload(f"{name} n={n}", tokens, images, 4096, 16)


def image_bound(n: int, seed: int = 0) -> Workload:
    """~75 % short single-image samples beside ~25 % longer text-only ones (seq_len 2048, 8 images)."""
    rng = np.random.default_rng(seed)
    is_img = rng.random(n) < 0.75
    tokens = np.where(is_img, 64 + rng.integers(20, 200, n), rng.integers(300, 2000, n))
    return Workload(f"image-bound n={n}", tokens, is_img.astype(np.int64), 2048, 8)


def bounds(w: Workload) -> tuple[int, int]:
    return -(-int(w.tokens.sum()) // w.seq_len), -(-int(w.images.sum()) // w.max_images)


def check(packs: list[list[int]], w: Workload) -> None:
    flat = np.concatenate([np.asarray(p, np.int64) for p in packs]) if packs else np.zeros(0, np.int64)
    fits = np.flatnonzero((w.tokens <= w.seq_len) & (w.images <= w.max_images))
    if flat.size != fits.size or not np.array_equal(np.sort(flat), fits):
        raise SystemExit(f"{w.name}: plan does not hold every fitting sample exactly once")
    for p in packs:
        if w.tokens[p].sum() > w.seq_len or w.images[p].sum() > w.max_images:
            raise SystemExit(f"{w.name}: a pack exceeds a budget")


def measure(w: Workload, algorithm: str) -> dict:
    t0 = time.perf_counter()
    packs = plan_packs(w.tokens, w.images, seq_len=w.seq_len, max_images=w.max_images, algorithm=algorithm)
    seconds = time.perf_counter() - t0
    check(packs, w)
    tok_lb, img_lb = bounds(w)
    n = len(packs)
    samples = np.array([len(p) for p in packs])
    images = np.array([int(w.images[p].sum()) for p in packs])
    fill = int(w.tokens.sum()) / (n * w.seq_len)
    return {"algorithm": algorithm, "packs": n, "vs_lb": n / max(tok_lb, img_lb), "vs_token_lb": n / tok_lb,
            "fill": fill, "waste": 1 - fill, "samples_mean": samples.mean(), "samples_std": samples.std(),
            "images_mean": images.mean(), "images_std": images.std(), "seconds": seconds}


def naive(w: Workload, batch_size: int = 8, seed: int = 0) -> dict:
    """Pad-to-longest batches of ``batch_size`` samples in random order (rows = batch_size each)."""
    order = np.random.default_rng(seed).permutation(w.tokens.size)
    t = w.tokens[order]
    m = w.images[order]
    rows = padded = 0
    for s in range(0, t.size, batch_size):
        chunk = t[s:s + batch_size]
        rows += chunk.size
        padded += int(chunk.max()) * chunk.size
    fill = int(t.sum()) / padded
    tok_lb, img_lb = bounds(w)
    return {"algorithm": "naive (pad-to-longest, B=8)", "packs": rows, "vs_lb": rows / max(tok_lb, img_lb),
            "vs_token_lb": rows / tok_lb, "fill": fill, "waste": 1 - fill, "samples_mean": 1.0,
            "samples_std": 0.0, "images_mean": float(m.mean()), "images_std": float(m.std()), "seconds": 0.0}


def table(w: Workload, rows: list[dict]) -> str:
    tok_lb, img_lb = bounds(w)
    head = (f"\n### {w.name}, seq_len {w.seq_len}, max_images {w.max_images} "
            f"(token LB {tok_lb}, image LB {img_lb}, image/token {img_lb / tok_lb:.2f})\n\n"
            "| algorithm | packs (rows) | ÷ LB | ÷ token LB | fill | padding | samples/pack | images/pack | plan s |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    body = "".join(
        f"| {r['algorithm']} | {r['packs']} | {r['vs_lb']:.4f} | {r['vs_token_lb']:.4f} | {r['fill']:.2%} | "
        f"{r['waste']:.2%} | {r['samples_mean']:.1f} ± {r['samples_std']:.1f} | "
        f"{r['images_mean']:.1f} ± {r['images_std']:.1f} | {r['seconds']:.2f} |\n" for r in rows)
    return head + body


def plot(results: dict[str, list[dict]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, (name, rows) in zip(axes[0], results.items()):
        labels = [r["algorithm"].split(" ")[0] for r in rows]
        waste = [100 * r["waste"] for r in rows]
        colors = ["#d6604d" if lab == "naive" else "#4393c3" for lab in labels]
        ax.bar(labels, waste, color=colors)
        for x, v in enumerate(waste):
            ax.text(x, v + 0.5, f"{v:.1f}%", ha="center", fontsize=8)
        ax.set_ylabel("padding (% of batch tokens)")
        ax.set_title(name, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="n = 100 000 only")
    ap.add_argument("--sizes", type=int, nargs="+", help="LLaVA-like sizes (default 100000 1000000)")
    ap.add_argument("--json", help="write the results as JSON")
    ap.add_argument("--plot", help="write a padding-waste bar chart (PNG)")
    args = ap.parse_args(argv)
    sizes = args.sizes or ([100_000] if args.quick else [100_000, 1_000_000])

    t0 = time.perf_counter()
    warm = llava_like(200)
    for a in ALGORITHMS:
        plan_packs(warm.tokens, warm.images, seq_len=warm.seq_len, max_images=warm.max_images, algorithm=a)
    print(f"numba compile / cache load: {time.perf_counter() - t0:.2f} s (excluded below)")

    workloads = ([llava_like(n) for n in sizes]
                 + [llava_like(100_000, text_median=150, name="llava-like, short answers (images bind)"),
                    image_bound(100_000)])
    results: dict[str, list[dict]] = {}
    for w in workloads:
        rows = [measure(w, a) for a in ALGORITHMS] + [naive(w)]
        results[w.name] = rows
        print(table(w, rows), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.plot:
        plot(results, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
