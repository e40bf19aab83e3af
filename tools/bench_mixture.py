"""The token mix a run gets from a 50/50 mixture: wdspack's pack schedule against the peers' sample blend.

    python -m tools.bench_mixture                               # 2 × 100 M tokens, 8 ranks × 2 packs a step
    python -m tools.bench_mixture --json docs/benchmarks/data/bench_mixture.json
    python -m tools.bench_mixture --quick                       # seconds (tests/tools/test_bench_mixture.py)

Two sources with very different sample lengths, 50/50 in tokens: ``long`` (answers of 300-2,000
tokens, uniform) and ``short`` (captions of 20-120 tokens), the same number of tokens each. Only
token lengths are generated: what is measured is which tokens each step trains on.

**wdspack**: each source packed on its own into ``seq_len`` packs (``plan_packs``, bfd), written
in the seeded shuffled order ``wdspack pack`` writes and cut into shards of 1,000 packs; the mixture
(weights 1:1 in tokens) read as the loader reads it: each rank's packs from
:func:`~wdspack.loader.mixture.merge.plan_slot` (through :func:`wdspack.ops.mixture.step_mix`, what
``wdspack inspect`` shows and ``PackedDataset`` yields), 8 ranks × 1 worker × 2 packs: a global step
is 16 packs.

**The peers' way** (Megatron-Energon ``blend``, MosaicML ``Stream(proportion=)``, HF
``interleave_datasets(probabilities=)``, webdataset ``RandomMix``): every rank draws each *sample*'s
source at random (seeded, per rank), reads it from its shard of that source (seeded order,
repeated when exhausted), and packs the drawn stream into the same ``seq_len``:

* first-fit, streaming: each sample into the first of at most 8 open packs with room, the oldest
  open pack sent when none has (a streaming packer);
* bfd over chunks: every 1,024 drawn samples packed by wdspack's own bfd, as a packing buffer does
  (Energon's ``select_samples_to_pack``), the packs sent in the order the planner gives them (largest
  sample first), and again shuffled within the chunk (a shuffle buffer after the packer).

To give them their best chance the sample weights are set for 50/50 in *tokens* in expectation
(``p_i ∝ w_i / mean length_i``); the same draw with the weights as users write them (50/50 in
samples) gives the token share of Energon issue #212, measured too (packed first-fit). For every method the achieved
token share of ``long`` is taken over every window of 10, 100 and 1,000 consecutive global steps
(worst and mean |share - 50 %|, in points), per rank over windows of 100 steps, and over the
epoch (the steps wdspack's mixture epoch makes, the same for all).

Not measured here: requests and batches/s of the mixture loader against one dataset (that needs
shards written and read; ``tools/bench_loader.py`` measures one dataset).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from wdspack import plan_packs
from wdspack.loader.mixture.spec import Mixture, mixture_epoch
from wdspack.loader.mixture.streams import source_layout
from wdspack.ops.mixture import step_mix

WINDOWS = (10, 100, 1000)
LONG, SHORT = (300, 2000), (20, 120)


def lengths(kind: tuple[int, int], tokens: int, seed: int) -> np.ndarray:
    """Sample lengths uniform in ``kind`` (inclusive) summing to about ``tokens``."""
    n = int(tokens / ((kind[0] + kind[1]) / 2))
    return np.random.default_rng(seed).integers(kind[0], kind[1] + 1, n).astype(np.int64)


def pack_source(lens: np.ndarray, *, seq_len: int, shard_packs: int, seed: int) -> tuple[list[int], np.ndarray]:
    """``(packs per shard, tokens per pack)``: bfd packs in the seeded order ``wdspack pack`` writes them."""
    packs = plan_packs(lens, seq_len=seq_len, algorithm="bfd", seed=seed)
    tokens = np.array([lens[p].sum() for p in packs], np.int64)[np.random.default_rng(seed).permutation(len(packs))]
    counts = [min(shard_packs, len(tokens) - a) for a in range(0, len(tokens), shard_packs)]
    return counts, tokens


# ---------------------------------------------------------------------------------------------
# The peers' way: a per-sample weighted draw, then packing


def draw(sources: list[np.ndarray], p_first: float, *, slot: int, slots: int, seed: int,
         block: int = 1 << 16) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Endless blocks of ``(source, length)`` of one rank's drawn samples: each sample's source is 0 with
    probability ``p_first``, its sample the next of the rank's shard of that source (seeded order, again
    when exhausted)."""
    rng = np.random.default_rng([seed, slot, 0xB1E])
    shards = [rng.permutation(x)[slot::slots] for x in sources]
    pos = [0, 0]
    while True:
        src = (rng.random(block) >= p_first).astype(np.int64)
        out = np.empty(block, np.int64)
        for i, shard in enumerate(shards):
            k = int((src == i).sum())
            idx = (pos[i] + np.arange(k)) % len(shard)
            out[src == i] = shard[idx]
            pos[i] += k
        yield src, out


def first_fit_stream(blocks: Iterator[tuple[np.ndarray, np.ndarray]], *, seq_len: int, packs: int,
                     open_packs: int = 8, seed: int = 0) -> np.ndarray:
    """``[packs, 2]`` tokens of source 0 and of source 1 in each pack, in the order sent: each sample into
    the first open pack with room, else a new one, the oldest sent when ``open_packs`` are open (``seed``:
    unused, the order is the draw's)."""
    out: list[list[int]] = []
    bins: list[list[int]] = []  # [tokens used, tokens of source 0, tokens of source 1]
    for src, lens in blocks:
        for s, n in zip(src.tolist(), lens.tolist()):
            for b in bins:
                if b[0] + n <= seq_len:
                    b[0] += n
                    b[1 + s] += n
                    break
            else:
                if len(bins) == open_packs:
                    out.append(bins.pop(0)[1:])
                    if len(out) == packs:
                        return np.array(out, np.int64)
                new = [n, 0, 0]
                new[1 + s] = n
                bins.append(new)
    raise AssertionError("unreachable: the draw is endless")


def bfd_chunks(blocks: Iterator[tuple[np.ndarray, np.ndarray]], *, seq_len: int, packs: int, chunk: int = 1024,
               shuffle: bool = False, seed: int = 0) -> np.ndarray:
    """``[packs, 2]`` as :func:`first_fit_stream`, each ``chunk`` drawn samples packed by bfd, its packs sent
    in the planner's order (largest sample first) or, with ``shuffle``, in a seeded random order."""
    out: list[np.ndarray] = []
    have = 0
    rng = np.random.default_rng([seed, 0x5F])
    for src, lens in blocks:
        for a in range(0, len(src), chunk):
            s, n = src[a:a + chunk], lens[a:a + chunk]
            plan = plan_packs(n, seq_len=seq_len, algorithm="bfd", seed=seed)
            rows = np.array([[n[p][s[p] == 0].sum(), n[p][s[p] == 1].sum()] for p in plan], np.int64)
            if shuffle:
                rows = rows[rng.permutation(len(rows))]
            out.append(rows)
            have += len(rows)
            if have >= packs:
                return np.concatenate(out)[:packs]
    raise AssertionError("unreachable: the draw is endless")


# ---------------------------------------------------------------------------------------------
# Measuring


def window_errors(first: np.ndarray, total: np.ndarray, share: float, width: int) -> dict[str, float] | None:
    """Worst and mean |share of ``first`` - ``share``| (points) over every window of ``width`` steps.

    Example:
        >>> window_errors(np.array([1, 3, 1, 3]), np.array([4, 4, 4, 4]), 0.5, 2)
        {'worst': 0.0, 'mean': 0.0, 'windows': 3}
    """
    if width > len(first):
        return None
    cf = np.concatenate([[0], np.cumsum(first)]).astype(np.float64)
    ct = np.concatenate([[0], np.cumsum(total)]).astype(np.float64)
    err = 100 * np.abs((cf[width:] - cf[:-width]) / (ct[width:] - ct[:-width]) - share)
    return {"worst": round(float(err.max()), 4), "mean": round(float(err.mean()), 4), "windows": int(err.size)}


def measure(first: np.ndarray, second: np.ndarray, *, share: float, seq_len: int) -> dict:
    """``first``, ``second``: ``[steps, ranks, packs per rank]`` tokens of each source in each pack."""
    per_step_first, per_step_total = first.sum((1, 2)), (first + second).sum((1, 2))
    epoch_share = float(per_step_first.sum() / per_step_total.sum())
    rank = [window_errors(first[:, r].sum(1), (first + second)[:, r].sum(1), share, 100)
            for r in range(first.shape[1])]
    return {
        "windows": {str(w): window_errors(per_step_first, per_step_total, share, w) for w in WINDOWS},
        "per_rank_100": None if rank[0] is None else max(x["worst"] for x in rank if x is not None),
        "epoch_share": round(epoch_share, 6), "epoch_error": round(100 * abs(epoch_share - share), 4),
        "fill": round(float((first + second).mean() / seq_len), 4),
    }


def run(*, tokens: int, seq_len: int, ranks: int, batch_size: int, shard_packs: int, seed: int) -> dict:
    t0 = time.perf_counter()
    raw = [lengths(LONG, tokens, seed), lengths(SHORT, tokens, seed + 1)]
    packed = [pack_source(x, seq_len=seq_len, shard_packs=shard_packs, seed=seed + k) for k, x in enumerate(raw)]
    t1 = time.perf_counter()
    names = ("long", "short")
    mixture = Mixture.of([(n, 1) for n in names])
    epoch = mixture_epoch(mixture, [int(t.sum()) for _, t in packed], [len(t) for _, t in packed])
    per_slot = epoch.per_slot(ranks, batch_size)
    steps = per_slot // batch_size
    layouts = [source_layout(n, counts, t) for n, (counts, t) in zip(names, packed)]
    source, row = step_mix(layouts, mixture.shares, steps=steps, ranks=ranks, workers=1, batch_size=batch_size,
                           seed=seed, per_slot=per_slot)
    t2 = time.perf_counter()
    units = np.where(source == 0, packed[0][1][np.where(source == 0, row, 0)], packed[1][1][np.where(source == 1,
                                                                                                     row, 0)])
    shape = (steps, ranks, batch_size)
    wds = measure(np.where(source == 0, units, 0).reshape(shape), np.where(source == 1, units, 0).reshape(shape),
                  share=0.5, seq_len=seq_len)
    wds["plan_seconds"] = round(t2 - t1, 3)

    means = [float(x.mean()) for x in raw]
    p_tokens = (0.5 / means[0]) / (0.5 / means[0] + 0.5 / means[1])  # 50/50 in tokens, in expectation
    methods = {"wdspack": wds}
    peers = {"peer_first_fit": first_fit_stream, "peer_bfd_chunks": bfd_chunks,
             "peer_bfd_chunks_shuffled": functools.partial(bfd_chunks, shuffle=True)}
    for key, packer in peers.items():
        t3 = time.perf_counter()
        per_rank = [packer(draw(raw, p_tokens, slot=r, slots=ranks, seed=seed), seq_len=seq_len, packs=per_slot,
                           seed=seed + r) for r in range(ranks)]
        rows = np.stack([x.reshape(steps, batch_size, 2) for x in per_rank], 1)  # [steps, ranks, batch, 2]
        methods[key] = measure(rows[..., 0], rows[..., 1], share=0.5, seq_len=seq_len)
        methods[key]["seconds"] = round(time.perf_counter() - t3, 3)
    # Energon #212: the weights as written (1:1 in samples), the same draw, packed in the draw's order
    naive = np.concatenate([first_fit_stream(draw(raw, 0.5, slot=r, slots=ranks, seed=seed), seq_len=seq_len,
                                             packs=per_slot) for r in range(ranks)])
    naive_share = float(naive[:, 0].sum() / naive.sum())
    return {
        "workload": {
            "seq_len": seq_len, "ranks": ranks, "workers": 1, "batch_size": batch_size,
            "packs_per_step": ranks * batch_size, "steps": steps, "seed": seed, "shard_packs": shard_packs,
            "sources": {n: {"samples": len(x), "tokens": int(x.sum()), "lengths": list(k), "mean_length":
                            round(float(x.mean()), 2), "packs": len(t), "fill": round(float(t.mean() / seq_len), 4)}
                        for n, x, k, (_, t) in zip(names, raw, (LONG, SHORT), packed)},
            "passes": list(epoch.passes), "pack_seconds": round(t1 - t0, 3),
        },
        "peer_sample_weights": {"long": round(p_tokens, 6), "short": round(1 - p_tokens, 6)},
        "methods": methods,
        "sample_weighted_blend": {
            "weights": "1:1 in samples", "long_token_share": round(naive_share, 4),
            "tokens_long_per_short": round(naive_share / (1 - naive_share), 2),
            "expected_long_token_share": round(means[0] / (means[0] + means[1]), 4),
        },
    }


LABELS = {"wdspack": "wdspack (plan_slot, pack level)", "peer_first_fit": "peers: draw + first-fit (8 open)",
          "peer_bfd_chunks": "peers: draw + bfd per 1,024",
          "peer_bfd_chunks_shuffled": "peers: bfd per 1,024, shuffled"}


def table(result: dict) -> list[str]:
    w = result["workload"]
    lines = [f"long {w['sources']['long']['samples']} samples ({w['sources']['long']['packs']} packs), short "
             f"{w['sources']['short']['samples']} samples ({w['sources']['short']['packs']} packs), 50/50 in tokens; "
             f"{w['steps']} global steps of {w['ranks']} ranks × {w['batch_size']} packs of {w['seq_len']}",
             f"|share of long tokens - 50 %| in points, worst / mean over every window of N global steps; "
             f"peers' sample weights {result['peer_sample_weights']['long']:.4f} / "
             f"{result['peer_sample_weights']['short']:.4f} (50/50 in tokens in expectation)",
             f"{'method':<34} {'fill':>6}  " + "  ".join(f"{f'{n} steps':>15}" for n in WINDOWS)
             + f"  {'rank, 100':>9}  {'epoch':>7}"]
    for key, m in result["methods"].items():
        cells = ["—" if m["windows"][str(n)] is None else
                 f"{m['windows'][str(n)]['worst']:.2f} / {m['windows'][str(n)]['mean']:.2f}" for n in WINDOWS]
        rank = "—" if m["per_rank_100"] is None else f"{m['per_rank_100']:.2f}"
        lines.append(f"{LABELS[key]:<34} {m['fill']:>6.1%}  " + "  ".join(f"{c:>15}" for c in cells)
                     + f"  {rank:>9}  {m['epoch_error']:>7.3f}")
    b = result["sample_weighted_blend"]
    lines.append(f"weights as written, 1:1 in samples (Energon #212): long gets {b['long_token_share']:.1%} of the "
                 f"tokens, {b['tokens_long_per_short']:.1f}:1 (expected {b['expected_long_token_share']:.1%})")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=100_000_000, help="tokens of each source (default 100 M)")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=2, help="packs per rank per step")
    ap.add_argument("--shard-packs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="4.5 M tokens a source (about 140 steps): for the tests")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    tokens = 4_500_000 if args.quick else args.tokens
    result = run(tokens=tokens, seq_len=args.seq_len, ranks=args.ranks, batch_size=args.batch_size,
                 shard_packs=args.shard_packs, seed=args.seed)
    print("\n".join(table(result)))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
