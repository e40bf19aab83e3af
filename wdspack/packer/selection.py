"""Select and plan: the driver's integers only (never a payload).

The measured samples of every task are joined into one table of integer columns; ids two sources
share are named by their source; duplicates and samples over a budget are dropped with their
reasons (:func:`select_samples`); a job that drops too much stops here (:func:`check_drops`); the
kept samples are planned into packs (:func:`plan_selected`, :mod:`.planner`) and the packs cut into
shards by estimated bytes (:func:`assign_shards`).
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import Dropped, SampleError, TooManyDropsError
from ..format.manifest import DROPPED_NAME
from ..media import KINDS
from ..storage.location import Location
from .config import PackConfig
from .planner import plan_packs
from .sources.meta import collision_key, namespaced

__all__ = ["Measured", "assign_shards", "check_drops", "cp_padding", "plan_selected", "select_samples", "too_long",
           "write_dropped"]

_PACK_OVERHEAD = 64  # msgpack framing per pack, bytes (for shard size estimates)
_SAMPLE_OVERHEAD = 48  # per sub-sample: its id, length and image lists
_DROP_EXAMPLES = 5  # reasons shown, one example each, when a job fails on its drops


@dataclass(slots=True)
class Measured:
    """Integer arrays over all measured samples, in input order (the driver's whole state)."""

    ids: list[str] = field(default_factory=list)
    tokens: list[np.ndarray] = field(default_factory=list)
    #: each sample's media items of every kind (what ``max_images`` counts), their bytes and their tokens
    media: list[np.ndarray] = field(default_factory=list)
    part: list[np.ndarray] = field(default_factory=list)
    offset: list[np.ndarray] = field(default_factory=list)
    length: list[np.ndarray] = field(default_factory=list)
    media_bytes: list[np.ndarray] = field(default_factory=list)
    media_tokens: list[np.ndarray] = field(default_factory=list)
    targets: list[np.ndarray] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    dropped_part: list[int] = field(default_factory=list)  # the task each drop came from
    records: int = 0
    source_records: int = 0  # the records the samples came from (a document cut into pieces is one)
    describe: dict[str, Any] | None = None


def _namespace(m: Measured, part: np.ndarray, source_names: Sequence[str]) -> None:
    """Ids that appear in more than one source become ``{source}/{id}``, packed and dropped alike
    (pieces ``{id}#{k}`` of a split document follow their document); ids unique in the job stay.

    Only a job of several sources pays for it: one dict entry per id while it runs.
    """
    if len(set(source_names)) < 2:
        return
    owner: dict[str, str | None] = {}  # collision key -> its one source, or None once a second is seen
    pairs = ((sid, source_names[int(p)]) for sid, p in zip(m.ids, part))
    drops = ((d.sample_id, source_names[p]) for d, p in zip(m.dropped, m.dropped_part))
    for sid, source in itertools.chain(pairs, drops):
        key = collision_key(sid)
        if owner.setdefault(key, source) not in (source, None):
            owner[key] = None
    if None not in owner.values():
        return
    for j, (sid, p) in enumerate(zip(m.ids, part)):
        if owner[collision_key(sid)] is None:
            m.ids[j] = namespaced(source_names[int(p)], sid)
    for k, (d, p) in enumerate(zip(m.dropped, m.dropped_part)):
        if owner[collision_key(d.sample_id)] is None:
            m.dropped[k] = Dropped(namespaced(source_names[p], d.sample_id), d.reason, d.detail)


def select_samples(m: Measured, config: PackConfig, *, source_names: Sequence[str] = ()) -> dict[str, Any]:
    """Concatenate the arrays, name ids that collide across sources by their source, drop
    duplicates and samples over a budget (with reasons)."""
    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64)  # noqa: E731
    tok, media, part = cat(m.tokens), cat(m.media), cat(m.part)
    _namespace(m, part, source_names)
    several = len(set(source_names)) > 1
    keep = np.ones(tok.size, bool)
    planned = config.planned_tokens(tok)
    dropped: list[Dropped] = []
    seen: set[str] = set()
    for j, sid in enumerate(m.ids):
        if sid in seen:
            keep[j] = False
            where = f" of source {source_names[int(part[j])]!r}" if several else ""
            dropped.append(Dropped(sid, "duplicate_id", f"id {sid!r} is used by more than one record{where}; "
                                   "the first is kept: give every record its own 'id' (or remove the 'id' "
                                   "fields to name records '{file}:{row}')"))
            continue
        seen.add(sid)
        if planned[j] > config.seq_len:
            keep[j] = False
            dropped.append(too_long(sid, int(tok[j]), config))
        elif config.max_images is not None and media[j] > config.max_images:
            keep[j] = False
            dropped.append(Dropped(sid, "too_many_images", f"{int(media[j])} images > max_images "
                                   f"{config.max_images}; raise --max-images to keep it"))
    if config.on_error == "raise" and dropped:
        d = dropped[0]
        # a duplicate is fixed in the ids: dropping it would lose a record silently
        skip = "" if d.reason == "duplicate_id" else " (or pass --on-error skip)"
        raise SampleError(d.reason, f"{d.detail}{skip}", sample_id=d.sample_id)
    table = {"ids": m.ids, "tokens": tok, "media": media, "part": part, "offset": cat(m.offset),
             "length": cat(m.length), "media_bytes": cat(m.media_bytes), "media_tokens": cat(m.media_tokens),
             "targets": cat(m.targets), "keep": keep, "dropped": dropped}
    for column in (m.tokens, m.media, m.part, m.offset, m.length, m.media_bytes, m.media_tokens, m.targets):
        column.clear()  # the per-partition pieces: the table holds them now, once
    return table


def too_long(sample_id: str, tokens: int, config: PackConfig) -> Dropped:
    """The drop of a sample over ``seq_len``, as the plan counts it (padded to ``2·cp`` when planned for CP)."""
    padded = int(config.planned_tokens(np.array([tokens]))[0])
    cp = f" (padded to {padded} for --cp {config.cp})" if padded != tokens else ""
    return Dropped(sample_id, "too_long", f"{tokens} tokens{cp} > seq_len {config.seq_len}; raise --seq-len to keep it")


def check_drops(out: Location, m: Measured, table: dict[str, Any], config: PackConfig, *,
                 carried: Sequence[Dropped], reshard: bool = False) -> None:
    """Fail a job that packs nothing or drops more than its tolerance, after writing ``dropped.jsonl``.

    Drops inherited from an earlier job (``carried``, reshard) were accepted there and do not count.
    The work folder is kept: the same command with ``--resume`` and a higher ``--max-drop-fraction``
    plans and writes from the samples already tokenized. ``reshard``: the samples came from a packed
    dataset, and only the new budgets can drop them: the message speaks of those.
    """
    new = m.dropped + table["dropped"]
    total, packed = m.records, int(table["keep"].sum())
    limit = config.run.max_drop_fraction
    fraction = len(new) / total if total else 0.0
    if packed and (limit is None or fraction <= limit):
        return
    write_dropped(out, [*carried, *new])
    listing = out.join(DROPPED_NAME)
    if not total:
        raise TooManyDropsError("no samples were read from the sources, so nothing was packed; check the "
                                "SOURCE paths or globs (and that the files are not empty)")
    counts = Counter(d.reason for d in new)
    example: dict[str, Dropped] = {}
    for d in new:
        example.setdefault(d.reason, d)
    top = counts.most_common(_DROP_EXAMPLES)
    width = max(len(reason) for reason, _ in top)
    lines = [f"  {reason:<{width}} {n:>7}  e.g. {example[reason].sample_id!r}: {example[reason].detail}"
             for reason, n in top]
    if len(counts) > _DROP_EXAMPLES:
        lines.append(f"  ... and {len(counts) - _DROP_EXAMPLES} more reasons")
    if reshard:
        raise TooManyDropsError("\n".join([_reshard_head(len(new), total, packed, limit, listing), *lines,
                                            _reshard_fix(packed, fraction)]))
    if not packed:
        head = f"nothing was packed: all {total} samples read were dropped (listed in {listing}):"
        fix = f"fix the inputs: {_causes(counts, every=True)}"
    else:
        accept = min(1.0, math.ceil(fraction * 100) / 100)
        head = (f"{len(new)} of {total} samples read ({fraction:.1%}) were dropped, over the tolerance "
                f"--max-drop-fraction {limit:g}; nothing was written but {listing}:")
        fix = (f"fix the inputs ({_causes(counts)}?), or accept these drops: "
               f"run the same command with --resume --max-drop-fraction {accept:g} (the tokenized samples are kept)")
        if counts["duplicate_id"]:  # never accepted by a tolerance: each one is a record lost
            fix = (f"{counts['duplicate_id']} records reuse the id of an earlier record of their own source "
                   "(duplicate_id): fix the ids, not the tolerance: give every record its own 'id', or remove "
                   "the 'id' fields (records without one are named '{file}:{row}'). The same id in two sources "
                   "needs no fix: each is packed as '{source}/{id}'. Then pack again into a new --output"
                   + (" (and fix the inputs of the other drops)" if len(counts) > 1 else ""))
    raise TooManyDropsError("\n".join([head, *lines, fix]))


def _reshard_head(dropped: int, total: int, packed: int, limit: float | None, listing: str) -> str:
    if not packed:
        return f"nothing was resharded: all {total} samples are over the new budgets (listed in {listing}):"
    return (f"{dropped} of {total} samples ({dropped / total:.1%}) are over the new budgets, over the tolerance "
            f"--max-drop-fraction {limit:g}; nothing was written but {listing}:")


def _reshard_fix(packed: int, fraction: float) -> str:
    fix = "reshard with a larger --seq-len (or --max-images) to keep them"
    if not packed:
        return fix
    return (f"{fix}, or accept these drops: run the same command with --resume --max-drop-fraction "
            f"{min(1.0, math.ceil(fraction * 100) / 100):g}")


#: The media drop reasons of a file not found under the root (``missing_image``, ``video_path_escape``), and of
#: a file found that is not what its record says (``unreadable_video``), every kind's.
_ROOT_REASONS = {r for kind in KINDS for r in kind.drop_reasons if r.startswith("missing_") or r.endswith("_escape")}
_FILE_REASONS = {r for kind in KINDS for r in kind.drop_reasons
                 if r not in _ROOT_REASONS and not r.startswith("too_many_")}
#: What each drop reason says of the inputs, as the fix of a job that dropped too much names it.
_CAUSES = (
    ({"malformed_record", "unknown_role", "empty_conversation", "no_assistant_turn", "placeholder_mismatch",
      "unmaskable_turn"}, "a layout wdspack does not read (see the Sources table, docs/guides/pack.md#sources)"),
    (_ROOT_REASONS, "a wrong --image-root"),
    (_FILE_REASONS, "media files that are damaged or not what their records say (dropped.jsonl names each)"),
    ({"unsupported_media"}, "records with media this job's model does not take, or grounding objects (pack them "
                            "with a processor whose family takes them, or leave them out of this job)"),
    ({"too_long", "too_many_images"}, "a --seq-len / --max-images too small for {every} sample"),
)


def _causes(counts: Counter, *, every: bool = False) -> str:
    """The likely causes of these drops, from their reasons (``a wrong --image-root, or ...``)."""
    found = [text.format(every="every" if every else "the") for reasons, text in _CAUSES
             if any(counts[r] for r in reasons)]
    if not found:
        found = [text.format(every="every" if every else "the") for _, text in _CAUSES[:2]]
    return found[0] if len(found) == 1 else ", ".join(found[:-1]) + ", or " + found[-1]


def plan_selected(table: dict[str, Any], config: PackConfig) -> list[np.ndarray]:
    """Packs as arrays of sample indices (into the table), in a seeded shuffled order."""
    keep = np.flatnonzero(table["keep"])
    packs = plan_packs(config.planned_tokens(table["tokens"][keep]), table["media"][keep], seq_len=config.seq_len,
                       max_images=config.max_images, algorithm=config.algorithm, seed=config.seed)
    # Shuffle packs so each shard mixes long and short samples (planners emit them sorted).
    order = np.random.default_rng(config.seed).permutation(len(packs))
    return [keep[np.asarray(packs[k], np.int64)] for k in order]


def cp_padding(table: dict[str, Any], config: PackConfig) -> int | None:
    """The tokens the ``2·cp`` padding adds to the kept samples (None: not planned for CP)."""
    if not config.cp:
        return None
    kept = table["tokens"][table["keep"]]
    return int(config.planned_tokens(kept).sum() - kept.sum())


def assign_shards(plan, table, config: PackConfig, *, token_itemsize: int) -> list[list[np.ndarray]]:
    """Cut the pack sequence into shards by estimated bytes and/or pack count."""
    shards: list[list[np.ndarray]] = []
    current: list[np.ndarray] = []
    size = 0
    for pack in plan:
        est = (_PACK_OVERHEAD + int(table["tokens"][pack].sum()) * (token_itemsize + 1)
               + int(table["media_bytes"][pack].sum()) + _SAMPLE_OVERHEAD * pack.size)
        full_bytes = current and size + est > config.shard_max_bytes
        full_packs = config.shard_max_packs is not None and len(current) >= config.shard_max_packs
        if full_bytes or full_packs:
            shards.append(current)
            current, size = [], 0
        current.append(pack)
        size += est
    if current:
        shards.append(current)
    return shards


def write_dropped(out: Location, dropped: Iterable[Dropped]) -> None:
    """``dropped.jsonl``: one JSON line per dropped sample (id, reason, detail), written atomically."""
    text = "".join(json.dumps(d.to_json(), ensure_ascii=False) + "\n" for d in dropped)
    out.write_atomic(DROPPED_NAME, text.encode())
