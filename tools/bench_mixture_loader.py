"""The mixture loader against one dataset of the same size: batches/s and requests, same run, same server.

    python -m tools.bench_mixture_loader                          # ~1-2 min
    python -m tools.bench_mixture_loader --json docs/benchmarks/data/bench_mixture_loader.json

Three seeded synthetic packed datasets (``tests/support/synthetic.py``, with a pack index; uneven shards,
up to ``--max-images`` small images per pack) are written: ``a`` and ``b`` (the two sources, with
different seeds) and ``one`` (a single dataset with as many shards and packs as ``a`` and ``b``
together). ``tests/support/httpserver.py`` serves them on loopback and logs every request. For each of
0 and 2 workers and 1 and 2 ranks, the same loader settings read one epoch of:

- **mixture**: ``make_loader([(a, 0.5), (b, 0.5)], ...)`` (50/50 in tokens), and
- **one dataset**: ``make_loader(one, ...)``,

interleaved (``--repeats`` rounds, the best of each kept), reporting batches/s, packs/s and the
GETs the server saw per rank-epoch (with the issue's bound for a mixture: Σ over sources of
(shards + 3), plus one per split piece). Text only (``text_only=True``): the cost compared is the
reading and the schedule, not image decoding, which is the same per pack either way.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

import wdspack  # noqa: E402


def write_data(folder: Path, *, shards: int, packs: tuple[int, int], seq_len: int, max_images: int) -> dict:
    """``a``, ``b`` and ``one`` (``a`` + ``b``'s shard counts) under ``folder``; their pack counts."""
    from tests.support.synthetic import write_dataset

    rng = np.random.default_rng(0)
    counts = {name: [int(c) for c in rng.integers(packs[0], packs[1] + 1, size=shards)] for name in ("a", "b")}
    counts["one"] = counts["a"] + counts["b"]
    for seed, (name, c) in enumerate(counts.items(), start=1):
        write_dataset(folder / name, shards=len(c), packs_per_shard=c, seq_len=seq_len, max_images=max_images,
                      seed=seed, pack_index=True)
    return counts


def epoch(source, *, workers: int, batch_size: int, rank: int, ranks: int, server) -> dict:
    """One epoch of one rank: seconds, batches, packs, and the GETs the server saw."""
    before = len(server.requests())
    start = time.perf_counter()
    loader = wdspack.make_loader(source, batch_size=batch_size, num_workers=workers, rank=rank, world_size=ranks,
                                 seed=0, text_only=True, persistent_workers=False)
    batches = packs = 0
    for batch in loader:
        batches += 1
        packs += int(batch["input_ids"].shape[0])
    seconds = time.perf_counter() - start
    gets = [r for r in server.requests()[before:] if r.path.endswith(".tar")]
    return {"seconds": seconds, "batches": batches, "packs": packs, "batches_per_s": batches / seconds,
            "tar_gets": len(gets), "requests": int(loader.stats["requests"])}


def run(args: argparse.Namespace) -> dict:
    from tests.support.httpserver import serve

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        counts = write_data(root, shards=args.shards, packs=tuple(args.packs), seq_len=args.seq_len,
                            max_images=args.max_images)
        with serve(root) as server:
            mixture = wdspack.Mixture.of([(server.url + "a", 0.5), (server.url + "b", 0.5)])
            readers = {"mixture": mixture, "one dataset": server.url + "one"}
            bound = sum(len(counts[n]) + 3 for n in ("a", "b"))
            for workers in args.workers:
                for ranks in args.ranks:
                    best: dict[str, dict] = {}
                    for _ in range(args.repeats):  # interleaved: the machine's noise hits both alike
                        for name, source in readers.items():
                            per_rank = [epoch(source, workers=workers, batch_size=args.batch_size, rank=r,
                                              ranks=ranks, server=server) for r in range(ranks)]
                            secs = sum(p["seconds"] for p in per_rank)
                            row = {"seconds": secs, "batches": sum(p["batches"] for p in per_rank),
                                   "packs": sum(p["packs"] for p in per_rank),
                                   "batches_per_rank": [p["batches"] for p in per_rank],
                                   "tar_gets_per_rank": [p["tar_gets"] for p in per_rank]}
                            row["batches_per_s"] = row["batches"] / secs
                            row["packs_per_s"] = row["packs"] / secs
                            if name not in best or row["batches_per_s"] > best[name]["batches_per_s"]:
                                best[name] = row
                    results.append({"workers": workers, "ranks": ranks, "bound_per_rank_mixture": bound,
                                    "readers": best,
                                    "mixture_over_one": best["mixture"]["batches_per_s"]
                                    / best["one dataset"]["batches_per_s"]})
    return {"machine": platform.processor() or platform.machine(), "shards_per_source": args.shards,
            "packs": {k: sum(v) for k, v in counts.items()}, "batch_size": args.batch_size,
            "seq_len": args.seq_len, "results": results}


def table(doc: dict) -> list[str]:
    lines = [f"two sources of {doc['packs']['a']} and {doc['packs']['b']} packs ({doc['shards_per_source']} shards "
             f"each) vs one dataset of {doc['packs']['one']}; B = {doc['batch_size']}; over loopback HTTP",
             f"{'workers':>7} {'ranks':>5}  {'reader':<12} {'batches/s':>9} {'packs/s':>8}  {'GETs per rank':<16} "
             f"{'batches per rank':<16}"]
    for r in doc["results"]:
        for name, row in r["readers"].items():
            bound = f" (≤ {r['bound_per_rank_mixture']} + splits)" if name == "mixture" else ""
            lines.append(f"{r['workers']:>7} {r['ranks']:>5}  {name:<12} {row['batches_per_s']:>9.1f} "
                         f"{row['packs_per_s']:>8.1f}  {row['tar_gets_per_rank']!s:<16} "
                         f"{row['batches_per_rank']!s:<16}{bound}")
        lines.append(f"{'':>15}mixture / one dataset: {r['mixture_over_one']:.2f}× the batches/s")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=8, help="shards per source")
    ap.add_argument("--packs", type=int, nargs=2, default=[40, 80], help="packs per shard: low high")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--max-images", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small and once: for the tests")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.quick:
        args.shards, args.packs, args.repeats, args.workers, args.ranks = 3, [8, 12], 1, [0], [1, 2]
    doc = run(args)
    print("\n".join(table(doc)))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
