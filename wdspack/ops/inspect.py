"""What a packed dataset holds, in numbers and a picture (``wdspack inspect``).

From the manifest (and the pack index, when there is one): fill ratio, packs, samples, images,
videos, tokens, dropped counts by reason, and which budget closed the packs (tokens or ``--max-images``).
The fill counts real tokens only (``tokens / (packs · seq_len)``); a dataset planned for context parallelism
(``--cp N``) also gives the ``2·N`` padding's share of that budget and the fill the packs load at, the two
added (``cp_fill``).
With ``deep=True`` (reads every pack): distributions of tokens, samples and images per pack (and of
videos, the frames the loader will decode and the video tokens, for a dataset with videos), and
the padding a naive pad-to-longest loader would have wasted on the same samples. A mixture (a
``.yaml``/``.json`` file of sources and weights) is answered by :mod:`.mixture`: what an epoch
takes from each source, and the mix over the first steps.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..format.dataset import iter_dataset_packs, open_dataset
from ..format.manifest import Manifest
from ..media import IMAGE, KINDS, Media, MediaKind
from ..packer.config import dataset_budget_use, read_text

__all__ = ["cp_fill", "dataset_stats", "format_stats", "is_mixture", "naive_padding_waste", "plot_stats"]

#: The kinds only some packs hold (videos): the manifest counts them where there are any.
_SOMETIMES = tuple(kind for kind in KINDS if not kind.always_stored)


def naive_padding_waste(lengths: np.ndarray, *, batch_size: int = 8, seed: int = 0) -> float:
    """Fraction of tokens that are padding when samples are batched in random order and each
    batch is padded to its longest sample.

    Example:
        >>> naive_padding_waste(np.array([10, 10, 5, 5]), batch_size=4, seed=0)
        0.25
    """
    if lengths.size == 0:
        return 0.0
    order = np.random.default_rng(seed).permutation(lengths.size)
    shuffled = lengths[order]
    padded = 0
    for start in range(0, shuffled.size, batch_size):
        chunk = shuffled[start:start + batch_size]
        padded += int(chunk.max()) * batch_size if chunk.size == batch_size else int(chunk.max()) * chunk.size
    return 1.0 - float(lengths.sum()) / padded


def cp_fill(*, tokens: int, padding: int, packs: int, seq_len: int) -> dict[str, float]:
    """The fill of a dataset planned for context parallelism, told apart: its real tokens' share of the packs'
    budget (``packs · seq_len``, the manifest's ``fill_ratio``), the ``2·cp`` padding's share, and the fill the
    packs load at (the two added).

    Example:
        >>> cp_fill(tokens=900, padding=30, packs=1, seq_len=1000)
        {'real': 0.9, 'cp_padding': 0.03, 'loaded': 0.93}
    """
    budget = packs * seq_len
    if not budget:
        return {"real": 0.0, "cp_padding": 0.0, "loaded": 0.0}
    return {"real": round(tokens / budget, 6), "cp_padding": round(padding / budget, 6),
            "loaded": round((tokens + padding) / budget, 6)}


def is_mixture(source: Any) -> bool:
    """True when ``source`` names a mixture, not one dataset (a folder or URL is answered without
    importing the loader).

    Example:
        >>> is_mixture("packed/"), is_mixture([("a/", 1), ("b/", 1)])
        (False, True)
    """
    if isinstance(source, (str, os.PathLike)):
        lower = os.fspath(source).lower()
        if not lower.endswith((".yaml", ".yml", ".json")) or lower.endswith("manifest.json"):
            return False
    from ..loader.mixture.spec import is_mixture_spec

    return is_mixture_spec(source)


def dataset_stats(source: str, *, deep: bool = False, batch_size: int = 8,
                  samples_per_step: int | None = None, ranks: int | None = None) -> dict[str, Any]:
    """Numbers about a packed dataset (see the module docstring); JSON-serialisable.

    A mixture (:func:`is_mixture`) gives :func:`~.mixture.mixture_stats` over ``ranks`` ranks (1
    by default), one pack per rank per step; ``deep``, ``batch_size`` and ``samples_per_step``
    apply to one dataset only.

    ``samples_per_step``: a per-sample global batch size (as a padded recipe states it); the stats
    then give the global batch in packs that matches it: that many samples divided by the mean
    samples per pack (NeVA's rule), rounded to the nearest pack.
    ``ranks``: how long the slowest of that many ranks makes each step wait (one pack per rank
    per step, the default :class:`~wdspack.CostModel`, from the pack index), with the loader's
    default order and with ``balance="cost"``.
    """
    if is_mixture(source):
        from .mixture import mixture_stats

        return mixture_stats(source, ranks=ranks or 1)
    manifest, root = open_dataset(source)
    t = manifest.totals
    stats: dict[str, Any] = {
        "source": source, "seq_len": manifest.seq_len, "max_images": manifest.max_images,
        "max_images_per_pack": manifest.max_images_per_pack,
        "algorithm": manifest.algorithm, "shards": len(manifest.shards), "packs": t["packs"],
        "samples": t["samples_packed"], "samples_read": t["samples_read"], "tokens": t["tokens"],
        "images": t["images"], "fill_ratio": t["fill_ratio"], "bytes": sum(s.bytes for s in manifest.shards),
        "dropped_by_reason": t["dropped_by_reason"], "tokenizer": manifest.tokenizer.get("name"),
        "mean_samples_per_pack": round(t["samples_packed"] / t["packs"], 4) if t["packs"] else 0.0,
    }
    if "records_read" in t:  # documents cut into pieces: fewer records than samples
        stats["records_read"] = t["records_read"]
    if manifest.cp:  # planned for context parallelism: the 2·cp padding the loader inserts, counted in the plan
        stats["cp"] = manifest.cp
        stats["cp_padding"] = int(t.get("cp_padding") or 0)
        stats["cp_fill"] = cp_fill(tokens=int(t["tokens"]), padding=stats["cp_padding"], packs=int(t["packs"]),
                                   seq_len=int(manifest.seq_len))
    for kind in _SOMETIMES:  # a kind that some packs hold (videos): how many, and the most of its tokens one pack holds
        if t.get(kind.plural):
            stats[kind.plural] = int(t[kind.plural])
            stats[kind.budget] = int(t.get(kind.budget) or 0)
    if manifest.pack_index:
        from ..format.pack_index import read_index

        budget = dataset_budget_use(manifest, read_index(root, manifest))
        stats["budget"] = {**asdict(budget), "line": budget.line()}
    if samples_per_step is not None:
        if samples_per_step < 1:
            raise ConfigError(f"samples_per_step={samples_per_step} must be >= 1")
        mean = stats["mean_samples_per_pack"] or 1.0
        stats["samples_per_step"] = int(samples_per_step)
        stats["packs_per_step"] = max(1, round(samples_per_step / mean))
    if ranks is not None:
        stats["balance"] = _balance_stats(manifest, root, ranks)
    if not deep:
        return stats
    tokens: list[int] = []
    samples: list[int] = []
    lengths: list[int] = []
    columns: dict[str, dict[str, list[float]]] = {kind.name: {} for kind in KINDS}
    padding: list[int] = []
    for _, pack in iter_dataset_packs(manifest, root):
        tokens.append(pack.num_tokens)
        samples.append(pack.num_samples)
        lengths.extend(pack.seq_lens)
        if manifest.cp:
            step = 2 * manifest.cp
            padding.append(sum(-n % step for n in pack.seq_lens))
        for kind in KINDS:
            for key, value in _per_pack(kind, pack.media[kind.name]).items():
                columns[kind.name].setdefault(key, []).append(value)
    lens = np.asarray(lengths, np.int64)
    stats["per_pack"] = {"tokens": _describe(np.asarray(tokens)), "samples": _describe(np.asarray(samples))}
    if manifest.cp:
        stats["per_pack"]["cp_padding"] = _describe(np.asarray(padding, np.int64))
    for kind in KINDS:  # a kind in every pack always; another (videos, their frames, their tokens) where a pack has one
        per_pack = columns[kind.name] or {kind.plural: []}  # no packs: none of it
        if kind.always_stored or any(per_pack[kind.plural]):
            stats["per_pack"].update({key: _describe(np.asarray(v)) for key, v in per_pack.items()})
    stats["per_sample_tokens"] = _describe(lens)
    stats["padding_waste"] = 1.0 - t["fill_ratio"]
    stats["naive_padding_waste"] = naive_padding_waste(lens, batch_size=batch_size)
    stats["naive_batch_size"] = batch_size
    stats["_arrays"] = {"tokens": tokens, "samples": samples, "images": columns[IMAGE.name].get(IMAGE.plural, [])}
    if manifest.cp:
        stats["_arrays"]["cp_padding"] = padding
    return stats


def _balance_stats(manifest: Manifest, root: str, ranks: int) -> dict[str, Any]:
    from ..format.pack_index import CostModel, read_index
    from ..loader.balance import plan_epoch_balanced, step_costs
    from ..loader.plan import plan_epoch

    if ranks < 1:
        raise ConfigError(f"ranks={ranks} must be >= 1")
    if not manifest.pack_index:
        return {"ranks": ranks, "error": "no pack index; add one with `wdspack index DATASET`"}
    index = read_index(root, manifest)
    counts = [s.packs for s in manifest.shards]
    if sum(counts) < ranks:
        return {"ranks": ranks, "error": f"{sum(counts)} packs are too few for {ranks} ranks"}
    costs = np.split(CostModel().costs(index), np.cumsum(counts)[:-1])
    kw: dict[str, Any] = dict(epoch=0, seed=0, shuffle=True, remainder="drop")
    plans = {"shuffle_buffer": plan_epoch(counts, slots=ranks, **kw),
             "balanced": plan_epoch_balanced(counts, costs, ranks=ranks, workers=1, **kw)}
    out: dict[str, Any] = {"ranks": ranks, "cost_model": asdict(CostModel())}
    for key, plan in plans.items():
        steps = step_costs(plan, costs, ranks=ranks, workers=1, batch_size=1, seed=0)
        out[key] = round(float(steps.max(1).sum() / steps.mean(1).sum()), 4) if len(steps) else 1.0
    return out


def _per_pack(kind: MediaKind, items: Media) -> dict[str, float]:
    """One pack's numbers of a kind, as ``--deep`` describes them: its items; for a kind planned at pack time,
    what its plan record counts (a video's frames decoded, audio's seconds); for a kind not in every pack, the
    tokens they take."""
    out: dict[str, float] = {kind.plural: len(items)}
    if kind.plan_record is not None:
        out.update(kind.plan_record.pack_totals(items.plans))
    if not kind.always_stored:
        out[f"{kind.name}_tokens"] = sum(items.tokens)
    return out


def _describe(x: np.ndarray) -> dict[str, float]:
    if x.size == 0:
        return {"min": 0, "mean": 0.0, "max": 0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    whole = np.issubdtype(x.dtype, np.integer)  # counts; seconds keep their fraction
    return {"min": int(x.min()) if whole else round(float(x.min()), 3), "mean": round(float(x.mean()), 3),
            "max": int(x.max()) if whole else round(float(x.max()), 3),
            "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def format_stats(stats: dict[str, Any]) -> list[str]:
    """Human-readable lines for ``wdspack inspect``."""
    if "mixture" in stats:
        from .mixture import format_mixture_stats

        return format_mixture_stats(stats)
    dropped = ", ".join(f"{k} {v}" for k, v in stats["dropped_by_reason"].items()) or "none"
    limit = "unlimited" if stats["max_images"] is None else stats["max_images"]
    fullest = stats.get("max_images_per_pack")
    lines = [
        f"dataset   {stats['source']}  (seq_len {stats['seq_len']}, max_images {limit}"
        f"{'' if fullest is None else f' (fullest pack {fullest})'}, {stats['algorithm']})",
        f"packs     {stats['packs']} in {stats['shards']} shards, {stats['bytes'] / 1e6:.1f} MB",
        f"samples   {stats['samples']} packed of {read_text(stats['samples_read'], stats.get('records_read'))} "
        f"read; dropped: {dropped}",
        f"tokens    {stats['tokens']}  images {stats['images']}  fill {stats['fill_ratio']:.2%}" + _cp_fill(stats)
        + "".join(f"  {kind.plural} {stats[kind.plural]} (at most {stats[kind.budget]} {kind.name} tokens a pack)"
                  for kind in _SOMETIMES if stats.get(kind.plural)),
        *([f"budget    {stats['budget']['line']}"] if stats.get("budget", {}).get("line") else []),
        *([_cp_line(stats)] if stats.get("cp") else []),
        f"samples per pack  mean {stats['mean_samples_per_pack']:.2f}",
    ]
    if "packs_per_step" in stats:
        lines.append(f"global batch  {stats['samples_per_step']} samples per step ≈ {stats['packs_per_step']} "
                     f"packs per step ({stats['samples_per_step']} / {stats['mean_samples_per_pack']:.2f} samples "
                     "per pack); "
                     "normalise the loss with wdspack.num_items_in_batch")
    if "balance" in stats:
        b = stats["balance"]
        lines.append(f"balance   {b['ranks']} ranks: {b['error']}" if "error" in b else
                     f"balance   {b['ranks']} ranks, 1 pack per rank per step, default cost model: the slowest rank "
                     f"costs {b['shuffle_buffer']:.3f}× the mean; with balance='cost' {b['balanced']:.3f}×")
    if "per_pack" in stats:
        for key, d in stats["per_pack"].items():
            lines.append(f"{key + '/pack':<13} min {d['min']}  mean {d['mean']:.1f}  p50 {d['p50']:.0f}  "
                         f"p90 {d['p90']:.0f}  p99 {d['p99']:.0f}  max {d['max']}")
        cp = ""
        if stats.get("cp"):  # planned for CP: the padding told apart from the packs' tails
            pad = stats["cp_fill"]["cp_padding"]
            cp = f": {pad:.1%} the 2·cp padding, {stats['padding_waste'] - pad:.1%} the packs' tails"
        lines.append(f"padding   packed {stats['padding_waste']:.1%} of tokens{cp}; a pad-to-longest loader "
                     f"(batches of {stats['naive_batch_size']}, random order) would waste "
                     f"{stats['naive_padding_waste']:.1%}")
    return lines


def _cp_fill(stats: dict[str, Any]) -> str:
    """After the fill (real tokens), for a dataset planned for CP: the padding's share and the fill it loads at."""
    if not stats.get("cp"):
        return ""
    f = stats["cp_fill"]
    return f" real + {f['cp_padding']:.2%} CP padding = {f['loaded']:.2%} loaded"


def _cp_line(stats: dict[str, Any]) -> str:
    """The ``2·cp`` padding of a dataset planned for context parallelism, in all (per pack: ``--deep``)."""
    cp, pad = stats["cp"], stats["cp_padding"]
    return (f"cp        planned for {cp} CP ranks: each sub-sample padded to a multiple of {2 * cp} when it loads, "
            f"{pad} padding tokens in all ({stats['cp_fill']['cp_padding']:.2%} of the packs' seq_len budget, "
            "counted in the plan)")


def plot_stats(stats: dict[str, Any], path: str) -> None:
    """Per-pack bars of real tokens vs padding, and histograms of samples and images per pack.

    Needs ``deep`` stats and matplotlib (``pip install wdspack[plot]``). A mixture's stats give
    :func:`~.mixture.plot_mixture_stats`.
    """
    if "mixture" in stats:
        from .mixture import plot_mixture_stats

        plot_mixture_stats(stats, path)
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arrays = stats["_arrays"]
    tokens = np.asarray(arrays["tokens"])
    L = stats["seq_len"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), gridspec_kw={"width_ratios": [2.2, 1, 1]})
    ax = axes[0]
    order = np.argsort(-tokens, kind="stable")[:400]
    shown = tokens[order]
    cp = np.asarray(arrays.get("cp_padding", np.zeros(tokens.size, np.int64)))[order]  # planned for CP: its padding
    x = np.arange(shown.size)
    ax.bar(x, shown, width=1.0, color="#2b7bba", label="real tokens")
    if cp.any():
        ax.bar(x, cp, bottom=shown, width=1.0, color="#92c5de", label="CP padding (2·cp)")
    ax.bar(x, L - shown - cp, bottom=shown + cp, width=1.0, color="#f4a582", label="padding")
    ax.set_xlim(-0.5, shown.size - 0.5)
    ax.set_ylim(0, L)
    ax.set_xlabel(f"pack (sorted; {shown.size} of {tokens.size} shown)")
    ax.set_ylabel("tokens")
    cp_fill = f" real + {stats['cp_fill']['cp_padding']:.1%} CP padding" if stats.get("cp") else ""
    ax.set_title(f"fill {stats['fill_ratio']:.1%}{cp_fill} vs pad-to-longest "
                 f"{1 - stats['naive_padding_waste']:.1%}")
    ax.legend(loc="lower left")
    for ax, key, color in ((axes[1], "samples", "#4dac26"), (axes[2], "images", "#8073ac")):
        values = np.asarray(arrays[key])
        bins = np.arange(values.min(), values.max() + 2) - 0.5 if values.size else 10
        ax.hist(values, bins=bins, color=color)
        ax.set_xlabel(f"{key} per pack")
        ax.set_ylabel("packs")
        ax.set_title(f"{key} per pack (mean {values.mean():.1f})" if values.size else key)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
