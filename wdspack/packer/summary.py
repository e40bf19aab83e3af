"""The pack job's last word: its manifest, and the summary it prints.

    shards' infos + the plan's maxima + drops ─► build_manifest ─► finish: manifest.json written last,
    the work folder dropped ─► summary_of (also for a dataset found complete under --resume)

Holds: ``manifest.json`` appears only when every shard, the pack index and ``dropped.jsonl`` are in
place; the summary is read from the manifest, so a resumed and an uninterrupted job print the same.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from .._version import __version__
from ..errors import Dropped
from ..format.manifest import MANIFEST_NAME, Manifest
from ..format.pack_index import decode_index
from ..media import KINDS
from ..storage.location import Location
from .config import BudgetUse, PackConfig, PackSummary, dataset_budget_use
from .output import WORK_DIR

__all__ = ["build_manifest", "finish", "records_behind", "summary_of"]


def build_manifest(sources, config: PackConfig, describe, infos, records: int, dropped: list[Dropped],
                    extra: dict[str, Any], *, pack_index: dict[str, Any], max_samples_per_pack: int,
                    max_media_per_pack: int, max_media_tokens_per_pack: int,
                    dropped_counts: tuple[int, dict[str, int]] | None = None, records_read: int | None = None,
                    min_sample_tokens: int | None = None, cp_padding: int | None = None) -> Manifest:
    """The manifest of a job's shards (``infos``). ``max_media_per_pack``: the most media items of every kind
    in one pack (what ``max_images`` bounds; the manifest's ``max_images_per_pack``), ``max_media_tokens_per_pack``
    their tokens (its ``max_image_tokens_per_pack``); ``cp_padding``: the tokens the ``2·cp`` padding adds, for a
    job planned for context parallelism (``config.cp``; the manifest's ``cp`` and ``totals["cp_padding"]``)."""
    packs = sum(i.packs for i in infos)
    tokens = sum(i.tokens for i in infos)
    n_dropped, by_reason = dropped_counts or (len(dropped), dict(sorted(Counter(d.reason for d in dropped).items())))
    totals = {
        "samples_read": records, "samples_packed": sum(i.samples for i in infos),
        "samples_dropped": n_dropped, "dropped_by_reason": by_reason, "packs": packs,
        "tokens": tokens, "images": sum(i.images for i in infos),
        "fill_ratio": round(tokens / (packs * config.seq_len), 6) if packs else 0.0,
        "bytes": sum(i.bytes for i in infos),
        # the loader sizes cu_seqlens from it (static shapes): B × (this + 1) segments at most
        "max_samples_per_pack": max_samples_per_pack,
        # the loader's image slots when packed without --max-images (max_images None): no limit, no waste
        "max_images_per_pack": max_media_per_pack,
        # model-ready loaders size their pixel tensors from it (static shapes, no more than needed)
        "max_image_tokens_per_pack": max_media_tokens_per_pack,
    }
    held = set()  # the kinds not in every pack that the dataset holds
    for kind in KINDS:
        count = 0 if kind.always_stored else sum(getattr(i, kind.plural) for i in infos)
        if count:  # what the loader sizes the kind's pixels from (static shapes); absent: no keys of the kind
            held.add(kind.name)
            totals[kind.plural] = count
            totals[kind.budget] = max(getattr(i, f"max_{kind.name}_tokens") for i in infos)
    if records_read is not None and records_read != records:  # documents cut into pieces: records < samples
        totals["records_read"] = records_read
    if min_sample_tokens is not None:  # what `budget` lines measure "full of tokens" against
        totals["min_sample_tokens"] = min_sample_tokens
    if config.cp:  # planned for context parallelism: the padding the loader inserts, counted in the plan
        totals["cp_padding"] = int(cp_padding or 0)
    provenance = {"shard_max_bytes": config.shard_max_bytes, "shard_max_packs": config.shard_max_packs,
                  "on_error": config.on_error, **extra}
    policy = describe["image_policy"]
    unused = {kind.name for kind in KINDS if not kind.always_stored} - held
    if unused & set(policy):  # the settings of a kind the dataset does not hold, never used
        policy = {k: v for k, v in policy.items() if k not in unused}
    return Manifest(
        seq_len=config.seq_len, max_images=config.max_images, algorithm=config.algorithm, seed=config.seed,
        tokenizer=describe["tokenizer"], image_policy=policy, shards=tuple(infos),
        totals=totals, split=config.split, sources=tuple(str(s) for s in sources), provenance=provenance,
        wdspack_version=__version__, pack_index=pack_index, cp=config.cp,
    )


def records_behind(measured: int, samples_read: int | None, records_read: int | None) -> int:
    """The records behind the samples: as measured, unless overridden (a reshard's are its source's)."""
    if records_read is not None:
        return records_read
    return measured if samples_read is None else samples_read


def finish(out: Location, manifest: Manifest, *, start: float, resumed_shards: int = 0) -> PackSummary:
    """Write the manifest (the job's last word: a dataset without it is unfinished), drop the work
    folder, and say what the job did."""
    out.write_atomic(MANIFEST_NAME, manifest.to_json().encode())
    out.remove(WORK_DIR)
    return summary_of(out, manifest, seconds=time.perf_counter() - start, resumed_shards=resumed_shards)


def summary_of(out: Location, manifest: Manifest, *, seconds: float, resumed_shards: int) -> PackSummary:
    """What a job did, as its manifest says it (a finished job, or one found complete under ``--resume``)."""
    t = manifest.totals
    return PackSummary(output=str(out), samples_read=t["samples_read"], samples_packed=t["samples_packed"],
                       dropped_by_reason=t["dropped_by_reason"], packs=t["packs"], tokens=t["tokens"],
                       images=t["images"], fill_ratio=t["fill_ratio"], shards=len(manifest.shards),
                       bytes=sum(s.bytes for s in manifest.shards), seconds=seconds, resumed_shards=resumed_shards,
                       image_policy=manifest.image_policy, records_read=t.get("records_read"),
                       budget=_budget(out, manifest),
                       media={kind.name: int(t.get(kind.plural) or 0) for kind in KINDS
                              if not kind.always_stored and t.get(kind.plural)})


def _budget(out: Location, manifest: Manifest) -> BudgetUse | None:
    """Which budget closed the packs, from the pack index (None: the dataset has none)."""
    if not manifest.pack_index:
        return None
    name = manifest.pack_index["file"]
    return dataset_budget_use(manifest, decode_index(out.read_bytes(name), manifest.pack_index,
                                                     packs=manifest.num_packs, where=name))
