"""What a mixture gives, in numbers and a picture (``wdspack inspect MIXTURE.yaml``).

From each source's manifest and pack index alone (no shard is opened): what one mixture epoch
(:func:`~wdspack.loader.mixture.spec.mixture_epoch`) takes from every source, in the mixture's unit
and in packs, tokens, supervised tokens (targets), images and samples, and how many passes over
the source that is; then the mix the schedule (:func:`~wdspack.loader.mixture.merge.plan_slot`, the
loader's own function) actually gives over the first global steps of epoch 0, for a layout of
ranks × workers × packs per batch. A global step is every rank's next batch, served by worker
``step % workers`` of each rank (slot ``rank * workers + worker``), in the DataLoader's round robin;
the workers of a rank share one merge over the rank's batches in that order, as the loader's do::

    step 0   rank 0: slot 0 batch 0   rank 1: slot 2 batch 0     (2 ranks × 2 workers)
    step 1   rank 0: slot 1 batch 0   rank 1: slot 3 batch 0
    step 2   rank 0: slot 0 batch 1   rank 1: slot 2 batch 1
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..format.dataset import ResolvedSource, read_pack_index, resolve_source
from ..format.pack_index import COLUMNS
from ..loader.mixture.merge import SlotSchedule, plan_slot
from ..loader.mixture.spec import Mixture, check_compatible, mixture_epoch, unit_values
from ..loader.mixture.streams import SourceLayout, source_layout

__all__ = ["format_mixture_stats", "mixture_stats", "plot_mixture_stats", "step_mix"]

#: the pack index columns counted per source (besides packs)
COUNTED = ("tokens", "targets", "images", "samples")


def mixture_stats(mixture: Any, *, steps: int = 100, ranks: int = 1, workers: int = 1, batch_size: int = 1,
                  seed: int = 0, shuffle_buffer: int = 256) -> dict[str, Any]:
    """Numbers about a mixture (see the module docstring); JSON-serialisable. ``_steps`` holds the
    per-step arrays the plot draws (the CLI prints the rest).

    Args:
        mixture: anything :meth:`Mixture.of <wdspack.loader.mixture.spec.Mixture.of>` takes: a mixture
            file's path, a mapping, a list of ``(path, weight)``, a Mixture.
        steps: the global steps whose mix is measured (at most an epoch's).
        ranks, workers, batch_size: the layout (packs per step: ``ranks * batch_size``).
        seed, shuffle_buffer: the loader's (``PackedDataset``'s) options of the same names.

    Raises:
        ConfigError: sources that cannot share a batch, a source without a pack index, a layout too
            large for the epoch.

    Example:
        >>> s = mixture_stats("mixes/stage1.yaml", ranks=8, batch_size=2)  # doctest: +SKIP
        >>> [(x["name"], round(x["passes"], 2)) for x in s["sources"]]  # doctest: +SKIP
        [('llava', 1.0), ('captions', 0.42)]
    """
    for key, value in (("steps", steps), ("ranks", ranks), ("workers", workers), ("batch_size", batch_size),
                       ("shuffle_buffer", shuffle_buffer)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key}={value!r} must be an integer >= 1")
    m = Mixture.of(mixture)
    resolved = [resolve_source(p) for p in m.paths]
    check_compatible(m.names, [r.manifest for r in resolved])
    indexes = [_index(name, r) for name, r in zip(m.names, resolved)]
    units = [unit_values(ix, m.unit) for ix in indexes]
    epoch = mixture_epoch(m, [int(u.sum()) for u in units], [len(u) for u in units])
    slots = ranks * workers
    per_slot = epoch.per_slot(slots, batch_size)
    epoch_steps = per_slot // batch_size * workers
    layouts = [source_layout(name, [s.packs for s in r.shards], u) for name, r, u in zip(m.names, resolved, units)]
    shown = min(steps, epoch_steps)
    source, row = step_mix(layouts, m.shares, steps=shown, ranks=ranks, workers=workers, batch_size=batch_size,
                           seed=seed, per_slot=per_slot, shuffle_buffer=shuffle_buffer)
    per_step = {key: _per_step(source, row, [unit_values(ix, key) for ix in indexes])
                for key in dict.fromkeys((m.unit, "tokens"))}

    sources: list[dict[str, Any]] = []
    for i, (s, ix, r) in enumerate(zip(m.sources, indexes, resolved)):
        per_pass = {"packs": len(ix), **{key: int(unit_values(ix, key).sum()) for key in COUNTED}}
        passes = epoch.passes[i]
        sources.append({
            "name": s.name, "path": s.path, "weight": s.weight, "share": m.shares[i], "max_passes": s.max_passes,
            "shards": len(r.shards), "per_pass": per_pass, "passes": passes,
            "expected": {"units": epoch.source_units[i], **{k: v * passes for k, v in per_pass.items()}},
        })
    expected_tokens = math.fsum(x["expected"]["tokens"] for x in sources)
    for x in sources:
        x["expected"]["token_share"] = x["expected"]["tokens"] / expected_tokens if expected_tokens else 0.0
    achieved: dict[str, Any] = {"steps": shown, "ranks": ranks, "workers": workers, "batch_size": batch_size,
                                "seed": seed, "packs": int(source.size)}
    for key, name in ((m.unit, "shares"), ("tokens", "token_shares")):
        total = per_step[key].sum(0)
        achieved[name] = (total / total.sum()).tolist() if total.sum() else [0.0] * len(sources)
    achieved["max_error_points"] = 100 * max(abs(a - w) for a, w in zip(achieved["shares"], m.shares))
    manifest = resolved[0].manifest
    assert manifest is not None  # check_compatible refuses a source without one
    return {
        "mixture": os.fspath(mixture) if isinstance(mixture, (str, os.PathLike)) else f"{len(m.sources)} sources",
        "unit": m.unit, "seq_len": manifest.seq_len, "sources": sources,
        "epoch": {"units": epoch.total, "packs": epoch.epoch_packs, "tokens": expected_tokens,
                  "steps": epoch_steps, "packs_per_slot": per_slot, "capped_by": epoch.capped_by},
        "achieved": achieved,
        "_steps": {"units": per_step[m.unit].tolist(), "tokens": per_step["tokens"].tolist(),
                   "source": source.tolist(), "row": row.tolist()},
    }


def _index(name: str, r: ResolvedSource) -> np.ndarray:
    if r.manifest is None or not r.manifest.pack_index:
        raise ConfigError(f"mixture source {name!r} ({r.display}) has no pack index (pack_index.npy): a mixture "
                          f"weighs and schedules each source's packs from it; add one with `wdspack index "
                          f"{r.display}` (reads the shards once, rewrites nothing else)")
    parts = read_pack_index(r)
    return np.concatenate(parts) if parts else np.zeros((0, len(COLUMNS)), np.int64)


def step_mix(layouts: Sequence[SourceLayout], shares: Sequence[float], *, steps: int, ranks: int, workers: int,
             batch_size: int, seed: int, per_slot: int, shuffle_buffer: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """The first ``steps`` global steps of epoch 0: ``(source, row)``, each ``[steps, ranks * batch_size]``,
    the source of every pack and its row in that source's pack index, as the loader reads them.

    Each slot plans only the packs those steps take: the schedule is a stream, so the first ``n``
    positions of a slot's epoch do not depend on how many follow (``per_slot`` bounds them). Each
    slot is planned with the layout's ``workers`` and ``batch_size``, as the loader plans it (the
    rank's merge runs over its workers' batches in the DataLoader's round robin). The
    loader shares its ``shuffle_buffer`` out among the sources (:meth:`MixedSources.buffer
    <wdspack.loader.mixture.sources.MixedSources.buffer>`); so does this.

    Example:
        >>> a = source_layout("a", [8], np.full(8, 100))
        >>> b = source_layout("b", [8], np.full(8, 50))
        >>> src, _ = step_mix([a, b], [0.5, 0.5], steps=3, ranks=1, workers=1, batch_size=3, seed=0, per_slot=9)
        >>> (src == 0).sum(1).tolist()  # one pack of a for every two of b
        [1, 1, 1]
    """
    need = min(per_slot, -(-steps // workers) * batch_size)
    if steps > per_slot // batch_size * workers:
        raise ConfigError(f"{steps} steps asked of an epoch of {per_slot // batch_size * workers}")
    buffer = max(1, shuffle_buffer // len(layouts))
    plans: list[SlotSchedule] = [plan_slot(layouts, shares, slot=s, slots=ranks * workers, per_slot=need, seed=seed,
                                           shuffle_buffer=buffer, workers=workers, batch_size=batch_size)
                                 for s in range(ranks * workers)]
    source = np.empty((steps, ranks * batch_size), np.int64)
    row = np.empty_like(source)
    for r in range(ranks):
        for w in range(workers):
            batches = len(range(w, steps, workers))
            plan = plans[r * workers + w]
            cols = slice(r * batch_size, (r + 1) * batch_size)
            source[w::workers, cols] = plan.source[:batches * batch_size].reshape(batches, batch_size)
            row[w::workers, cols] = plan.row[:batches * batch_size].reshape(batches, batch_size)
    return source, row


def _per_step(source: np.ndarray, row: np.ndarray, values: Sequence[np.ndarray]) -> np.ndarray:
    """``[steps, sources]``: what each source's packs of each step hold of one column."""
    out = np.zeros((len(source), len(values)), np.int64)
    for i, v in enumerate(values):
        mask = source == i
        out[:, i] = np.where(mask, v[np.where(mask, row, 0)], 0).sum(1)
    return out


def _num(x: float) -> str:
    if abs(x) >= 1e9:
        return f"{x / 1e9:.2f}G"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.2f}M"
    return f"{x:,.0f}"


def _layout(a: dict[str, Any]) -> str:
    def n(k: int, word: str) -> str:
        return f"{k} {word}{'' if k == 1 else 's'}"

    return f"{n(a['ranks'], 'rank')} × {n(a['workers'], 'worker')} × {n(a['batch_size'], 'pack')}"


def format_mixture_stats(stats: dict[str, Any]) -> list[str]:
    """Human-readable lines for ``wdspack inspect MIXTURE``."""
    e, a, unit = stats["epoch"], stats["achieved"], stats["unit"]
    capped = f"; shortened by {e['capped_by']!r}'s max_passes" if e["capped_by"] else ""
    # each figure once: the unit's own count is not repeated as packs or tokens
    amounts = [f"{_num(e['units'])} {unit}"] + [f"{_num(e[key])} {key}" for key in ("packs", "tokens") if key != unit]
    lines = [
        f"mixture   {stats['mixture']}: {len(stats['sources'])} sources weighed in {unit}, seq_len {stats['seq_len']}",
        f"epoch     {', '.join(amounts)}{capped}; {e['steps']} global steps of {_layout(a)}",
        "per epoch (expected):",
        f"  {'source':<16} {'weight':>7} {'passes':>7} {'packs':>9} {'tokens':>9} {'targets':>9} {'images':>9} "
        f"{'samples':>9} {'tokens %':>8}",
    ]
    for s in stats["sources"]:
        x = s["expected"]
        lines.append(f"  {s['name'][:16]:<16} {s['share']:>7.1%} {s['passes']:>7.3f} {_num(x['packs']):>9} "
                     f"{_num(x['tokens']):>9} {_num(x['targets']):>9} {_num(x['images']):>9} "
                     f"{_num(x['samples']):>9} {x['token_share']:>8.1%}")
    lines.append(f"achieved over the first {a['steps']} steps ({a['packs']} packs, seed {a['seed']}):")
    for s, share, tokens in zip(stats["sources"], a["shares"], a["token_shares"]):
        tail = "" if unit == "tokens" else f"   (tokens {tokens:.2%})"
        lines.append(f"  {s['name'][:16]:<16} {share:>7.2%} of {unit} (weight {s['share']:.2%}){tail}")
    lines.append(f"  largest |achieved - weight|: {a['max_error_points']:.2f} points")
    return lines


def plot_mixture_stats(stats: dict[str, Any], path: str) -> None:
    """The share of each source over the first steps (running: solid; per step: faint) against its
    weight (dashed). Needs matplotlib (``pip install wdspack[plot]``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    per_step = np.asarray(stats["_steps"]["units"], np.float64)
    a = stats["achieved"]
    x = np.arange(1, len(per_step) + 1)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    step_total = per_step.sum(1, keepdims=True)
    step_share = np.divide(per_step, step_total, out=np.zeros_like(per_step), where=step_total > 0)
    running_total = np.cumsum(per_step, 0)
    running = np.divide(running_total, running_total.sum(1, keepdims=True), out=np.zeros_like(running_total),
                        where=running_total.sum(1, keepdims=True) > 0)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, s in enumerate(stats["sources"]):
        c = colors[i % len(colors)]
        ax.plot(x, step_share[:, i], color=c, alpha=0.25, linewidth=0.8)
        ax.plot(x, running[:, i], color=c, linewidth=2, label=f"{s['name']} (weight {s['share']:.1%})")
        ax.axhline(s["share"], color=c, linestyle="--", linewidth=1)
    ax.set_xlim(1, max(len(x), 2))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, 1)
    ax.set_xlabel("global step")
    ax.set_ylabel(f"share of {stats['unit']}")
    ax.set_title(f"achieved mix: {_layout(a)} per step "
                 f"(running: solid, per step: faint, weight: dashed)", fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
