"""Partitioned planning: the pack job's plan made by tasks, the driver holding no per-sample state.

With ``PackConfig(plan_group_partitions=G)`` the measured partitions are cut into groups of ``G``
consecutive partitions, and every step after measuring runs as tasks of the job's executor::

    spool/*.meta ──bucket (one task per group)──► plan/ids-{g}-{b}   ids hashed into B buckets
    plan/ids-*-{b} ──duplicates (one task per bucket)──► plan/dup-{b}   (part, row) of each repeat
    spool + plan/dup-* ──select (one task per group)──► plan/drop-{g}.jsonl, counts
                       (the driver checks the drop tolerance from the counts)
    spool + plan/dup-* ──plan and write (one task per group)──► {split}-{g:06d}-{s:04d}.tar, plan/done-{g}

The driver keeps per-group counts and per-shard :class:`~wdspack.format.manifest.ShardInfo` only;
sample ids never reach it. Duplicate ids are found across the whole job: every id goes to bucket
``crc32(id) % B``, so all copies of an id meet in one bucket task, which keeps the first in input
order (lowest partition, then row), the rule :func:`~.selection.select_samples` applies, and drops
the others. Each group is planned on its own (``plan_packs`` on its kept samples, the packs shuffled
by a generator seeded with ``(seed, group)``) and cut into shards named by the group, so the output
is the same bytes for the same inputs, seed and ``plan_group_partitions``, wherever the tasks run;
it differs from the global plan's (other shard names and pack order), which is why the field is an
output-deciding one. A group's shards and ``plan/done-{g}`` appear only when it is complete, so a
killed job resumed redoes only unfinished groups.

Several sources: an id that two sources share becomes ``{source}/{id}`` in both, as the global plan
names it. The ids (and the ids of records the measure stage dropped) are bucketed by their collision
key (a split document's pieces ``{id}#{k}`` count as ``id``), so a bucket task sees every source an id
comes from; it writes the renames with the repeats, and the select and plan tasks apply them. Which
source each partition reads is one small file, ``plan/sources`` (the names and an index per partition).
``dropped.jsonl`` lists drops group by group.

A pack job left to choose (``plan_group_partitions`` None) plans in groups when the records its
listing finds are more than ``WDSPACK_PLAN_GROUPS_ABOVE`` (:func:`choose_plan_groups`).
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from ..errors import ConfigError, Dropped, SampleError
from ..format.manifest import DROPPED_NAME, ShardInfo
from ..format.pack import encode_pack
from ..format.pack_index import COLUMNS as INDEX_COLUMNS
from ..format.pack_index import INDEX_NAME, build_index
from ..format.tar import ShardWriter
from ..storage.location import Location
from .config import PackConfig
from .executors import report
from .output import info_row
from .selection import assign_shards, cp_padding, plan_selected, too_long
from .sources.meta import collision_key, namespaced
from .spool import COLUMNS, SpoolReader, assemble_pack, pack_counts, read_meta

__all__ = ["BUCKETS", "GROUP_RECORDS", "PLAN_GROUPS_ABOVE", "GroupResult", "choose_plan_groups", "group_shard_name",
           "plan_groups_above", "plan_partitioned"]

#: Buckets the ids are hashed into: one duplicate-check task each.
BUCKETS = 64
#: A job of more records than this plans in groups unless told (``WDSPACK_PLAN_GROUPS_ABOVE``): the global
#: plan's driver holds ``DRIVER_BYTES_PER_SAMPLE`` (250 B) + the id (~80 B) per sample, ~3.3 GB here.
PLAN_GROUPS_ABOVE = 10_000_000
#: The records of a group chosen by size: fill stays within 0.1 % of the global plan from 100 k.
GROUP_RECORDS = 200_000


def group_shard_name(split: str, group: int, shard: int) -> str:
    """``{split}-{group:06d}-{shard:04d}.tar``: a partitioned job's shard, named by its group.

    Example:
        >>> group_shard_name("train", 3, 1)
        'train-000003-0001.tar'
    """
    return f"{split}-{group:06d}-{shard:04d}.tar"


@dataclass(frozen=True, slots=True)
class GroupResult:
    """What one group's plan-and-write task leaves for the driver (per shard, never per sample)."""

    shards: tuple[ShardInfo, ...]
    max_samples_per_pack: int
    #: the most media items of every kind in one pack (what ``max_images`` counts), and their tokens
    max_media_per_pack: int
    max_media_tokens_per_pack: int
    #: the source records the samples came from (a document cut into pieces is one)
    source_records: int = 0
    #: the shortest packed sample's tokens (None: no sample, or a group written before it was recorded)
    min_sample_tokens: int | None = None
    #: the tokens the ``2·cp`` padding adds (None: not planned for CP)
    cp_padding: int | None = None


def plan_groups_above() -> int:
    """The records above which a job plans in groups by itself: ``$WDSPACK_PLAN_GROUPS_ABOVE``, else
    :data:`PLAN_GROUPS_ABOVE`.

    Example:
        >>> plan_groups_above()  # doctest: +SKIP
        10000000
    """
    text = os.environ.get("WDSPACK_PLAN_GROUPS_ABOVE", "").strip().replace("_", "")
    if not text:
        return PLAN_GROUPS_ABOVE
    if not text.isdigit():
        raise ConfigError(f"WDSPACK_PLAN_GROUPS_ABOVE={text!r}: give the records above which a job plans in groups, "
                          f"a whole number (default {PLAN_GROUPS_ABOVE:_}), or pass --plan-groups N|off")
    return int(text)


def choose_plan_groups(records: int, *, records_per_partition: int, above: int) -> int | None:
    """The partitions per group for a job of ``records`` records, None for one global plan: groups of
    about :data:`GROUP_RECORDS` records once ``records > above``. A rule of the inputs only (not of the
    memory free at the time), so a resumed job makes the same choice.

    Example:
        >>> choose_plan_groups(25_000_000, records_per_partition=1000, above=10_000_000)
        200
        >>> choose_plan_groups(5_000, records_per_partition=1000, above=10_000_000) is None
        True
    """
    if records <= above:
        return None
    return max(1, -(-GROUP_RECORDS // records_per_partition))


def _groups(parts: int, size: int) -> list[list[int]]:
    return [list(range(a, min(parts, a + size))) for a in range(0, parts, size)]


def _bucket_of(sample_id: str) -> int:
    return zlib.crc32(sample_id.encode()) % BUCKETS


def _write_sources(work: Location, source_names: Sequence[str]) -> bool:
    """``plan/sources`` for a job of several sources (the distinct names, each partition's index);
    False, and no file, for one source."""
    names = sorted(set(source_names))
    if len(names) < 2:
        return False
    at = {n: k for k, n in enumerate(names)}
    index = np.fromiter((at[n] for n in source_names), np.uint32, count=len(source_names))
    work.write_atomic("plan/sources", msgpack.packb({"names": names, "index": index.tobytes()}, use_bin_type=True))
    return True


def _read_sources(loc: Location) -> Callable[[int], str] | None:
    """Partition -> its source's name, in a job of several sources; None in a job of one."""
    if not loc.exists("plan/sources"):
        return None
    data = msgpack.unpackb(loc.read_bytes("plan/sources"), raw=False)
    names, index = data["names"], np.frombuffer(data["index"], np.uint32)
    return lambda part: names[int(index[part])]


def _bucket_task(g: int, parts: Sequence[int], work: str) -> int:
    """Write the group's ``(id, part, row)`` triples into one file per bucket, by collision key; with
    several sources the measure drops too (row ``-1 - k`` for the part's ``k``-th drop): an id a
    dropped record holds in one source is namespaced in the other as well, as the global plan does."""
    loc = Location(work)
    several = loc.exists("plan/sources")
    buckets: list[list[list[Any]]] = [[[], [], []] for _ in range(BUCKETS)]
    for i in parts:
        meta = read_meta(loc, i)
        rows = enumerate(meta["ids"])
        drops = ((-1 - k, d[0]) for k, d in enumerate(meta["dropped"])) if several else ()
        for row, sid in itertools.chain(rows, drops):
            cols = buckets[_bucket_of(collision_key(sid))]
            cols[0].append(sid)
            cols[1].append(i)
            cols[2].append(row)
    for b, bucket in enumerate(buckets):
        loc.write_atomic(f"plan/ids-{g:06d}-{b:04d}", msgpack.packb(bucket, use_bin_type=True))
    return g


def _duplicate_task(b: int, groups: int, work: str) -> int:
    """Bucket ``b``'s renames (with several sources: every copy of an id two sources share, as
    ``{source}/{id}``) and repeats (every copy of an id, renamed, but the first in input order)."""
    loc = Location(work)
    source_of = _read_sources(loc)
    entries: list[tuple[str, int, int]] = []
    for g in range(groups):  # groups, parts and rows ascend: the first seen is the first in input order
        ids, parts, rows = msgpack.unpackb(loc.read_bytes(f"plan/ids-{g:06d}-{b:04d}"), raw=False)
        entries.extend(zip(ids, parts, rows))
    renames: list[tuple[int, int, str]] = []
    if source_of is not None:
        owner: dict[str, str | None] = {}  # collision key -> its one source, or None once a second is seen
        for sid, p, _ in entries:
            key, source = collision_key(sid), source_of(p)
            if owner.setdefault(key, source) not in (source, None):
                owner[key] = None
        for k, (sid, p, r) in enumerate(entries):
            if owner[collision_key(sid)] is None:
                entries[k] = (namespaced(source_of(p), sid), p, r)
                renames.append((p, r, entries[k][0]))
    first: set[str] = set()
    repeats: list[tuple[int, int]] = []
    for sid, p, r in entries:
        if r < 0:  # a measure drop: named above, never a repeat
            continue
        if sid in first:
            repeats.append((p, r))
        else:
            first.add(sid)
    loc.write_atomic(f"plan/dup-{b:04d}", msgpack.packb({"repeats": repeats, "renames": renames}, use_bin_type=True))
    return len(repeats)


def _group_table(loc: Location, parts: Sequence[int], seq_len: int, max_images: int | None,
                 cp: int | None = None) -> tuple[dict[str, Any], list[Dropped]]:
    """The group's samples as a table (ids, integer columns, keep), and its drops in input order:
    the measure drops, then duplicates and samples over a budget, as :func:`select_samples` gives them."""
    repeats: set[tuple[int, int]] = set()
    renames: dict[tuple[int, int], str] = {}
    first, last = parts[0], parts[-1]
    for b in range(BUCKETS):
        dup = msgpack.unpackb(loc.read_bytes(f"plan/dup-{b:04d}"), raw=False)
        repeats.update((p, r) for p, r in dup["repeats"] if first <= p <= last)
        renames.update(((p, r), sid) for p, r, sid in dup["renames"] if first <= p <= last)
    source_of = _read_sources(loc)
    ids: list[str] = []
    cols: dict[str, list[np.ndarray]] = {c: [] for c in (*COLUMNS, "part")}
    dropped: list[Dropped] = []
    for i in parts:
        meta = read_meta(loc, i)
        ids.extend(renames.get((i, r), sid) for r, sid in enumerate(meta["ids"]))
        for c in COLUMNS:
            cols[c].append(np.frombuffer(meta[c], np.int64))
        cols["part"].append(np.full(len(meta["ids"]), i, np.int64))
        dropped.extend(Dropped(renames.get((i, -1 - k), d[0]), *d[1:]) for k, d in enumerate(meta["dropped"]))
    cat = {c: np.concatenate(v) if v else np.zeros(0, np.int64) for c, v in cols.items()}
    keep = np.ones(len(ids), bool)
    budgets = PackConfig(seq_len=seq_len, max_images=max_images, cp=cp)
    planned = budgets.planned_tokens(cat["tokens"])
    rows = np.concatenate([np.arange(len(x)) for x in cols["tokens"]]) if ids else np.zeros(0, np.int64)
    for j, sid in enumerate(ids):
        if (int(cat["part"][j]), int(rows[j])) in repeats:
            keep[j] = False
            where = f" of source {source_of(int(cat['part'][j]))!r}" if source_of is not None else ""
            dropped.append(Dropped(sid, "duplicate_id", f"id {sid!r} is used by more than one record{where}; the "
                                   "first is kept: give every record its own 'id' (or remove the 'id' fields to "
                                   "name records '{file}:{row}')"))
        elif planned[j] > seq_len:
            keep[j] = False
            dropped.append(too_long(sid, int(cat["tokens"][j]), budgets))
        elif max_images is not None and cat["media"][j] > max_images:
            keep[j] = False
            dropped.append(Dropped(sid, "too_many_images", f"{int(cat['media'][j])} images > max_images "
                                   f"{max_images}; raise --max-images to keep it"))
    table = {"ids": ids, "tokens": cat["tokens"], "media": cat["media"], "part": cat["part"],
             "offset": cat["offsets"], "length": cat["lengths"], "media_bytes": cat["media_bytes"],
             "media_tokens": cat["media_tokens"], "targets": cat["targets"], "keep": keep}
    return table, dropped


def _select_task(g: int, parts: Sequence[int], work: str, seq_len: int, max_images: int | None,
                 on_error: str, cp: int | None = None) -> list[int]:
    """Write the group's drops (``plan/drop-{g}.jsonl``); return [records, drops, packed]."""
    loc = Location(work)
    table, dropped = _group_table(loc, parts, seq_len, max_images, cp)
    _raise_first(dropped, on_error)
    records = sum(read_meta(loc, i)["records"] for i in parts)
    text = "".join(json.dumps(d.to_json(), ensure_ascii=False) + "\n" for d in dropped)
    loc.write_atomic(f"plan/drop-{g:06d}.jsonl", text.encode())
    return [records, len(dropped), int(table["keep"].sum())]


def _plan_task(g: int, parts: Sequence[int], work: str, out: str, config: PackConfig, token_dtype: str,
               itemsize: int) -> int:
    """Plan the group's kept samples, write its shards and ``plan/done-{g}`` (infos, index rows)."""
    loc, dest = Location(work), Location(out)
    table, _ = _group_table(loc, parts, config.seq_len, config.max_images, config.cp)
    plan = plan_selected(table, config)
    order = np.random.default_rng([config.seed, g]).permutation(len(plan))  # each group its own pack order
    plan = [plan[k] for k in order]
    shard_plans = assign_shards(plan, table, config, token_itemsize=itemsize)
    infos, offsets = [], []
    with SpoolReader(work) as spool:
        for s, packs in enumerate(shard_plans):
            with ShardWriter(dest.join(group_shard_name(config.split, g, s))) as writer:
                for k, pack in enumerate(packs):
                    samples = spool.read([(int(table["part"][j]), int(table["offset"][j]), int(table["length"][j]))
                                          for j in pack])
                    for sample, j in zip(samples, pack):
                        sample[0] = table["ids"][j]
                    p = assemble_pack(samples)
                    writer.add(f"{g:06d}{s:04d}{k:06d}", encode_pack(p, token_dtype=token_dtype),
                               samples=p.num_samples, tokens=p.num_tokens, **pack_counts(p))
                    report(p.num_samples)
                infos.append(writer.close())
                offsets.append(writer.offsets)
    index = build_index(shard_plans, offsets, table)
    records = source_records = 0
    for i in parts:
        meta = read_meta(loc, i)
        records += meta["records"]
        source_records += meta.get("source_records", meta["records"])  # a spool from before the key
    kept = table["tokens"][table["keep"]]
    result = {"records": records, "source_records": source_records,
              "min_sample_tokens": int(kept.min()) if kept.size else None,
              "shards": [info_row(i) for i in infos], "index": index.astype("<i8").tobytes(),
              "max": [max((len(p) for p in plan), default=0),
                      max((int(table["media"][p].sum()) for p in plan), default=0),
                      max((int(table["media_tokens"][p].sum()) for p in plan), default=0)]}
    if config.cp:
        result["cp_padding"] = cp_padding(table, config)
    loc.write_atomic(f"plan/done-{g:06d}", msgpack.packb(result, use_bin_type=True))
    return g


def _iter_drops(work: Location, groups: int) -> Iterator[Dropped]:
    for g in range(groups):
        for line in work.read_bytes(f"plan/drop-{g:06d}.jsonl").splitlines():
            d = json.loads(line)
            yield Dropped(d["id"], d["reason"], d["detail"])


def _read_done(work: Location, g: int) -> dict[str, Any]:
    return msgpack.unpackb(work.read_bytes(f"plan/done-{g:06d}"), raw=False)


def plan_partitioned(out: Location, work: Location, parts: int, config: PackConfig, *, token_dtype: str,
                     run: Callable[..., Iterable[Any]], carried: Sequence[Dropped],
                     check: Callable[[list[Dropped], int, int], None],
                     source_names: Sequence[str] = ()) -> tuple[GroupResult, int, int, dict[str, Any]]:
    """Plan and write ``parts`` measured partitions in groups; write ``dropped.jsonl`` and the pack index.

    ``run(fn, tasks, desc, samples=None)`` runs tasks on the job's executor (results in order; progress
    in tasks, or in the ``samples`` they :func:`~.executors.report`); ``check(drops,
    records, packed)`` is the drop tolerance (it raises; ``drops`` are loaded only when over it).
    Returns ``(result, records, drops, index_entry)``: the job's shards and maxima, the records
    read, the drops listed, and the manifest's ``pack_index`` entry (the index is written, streamed).

    Example:
        >>> plan_partitioned(out, work, 120, PackConfig(seq_len=4096, plan_group_partitions=10), token_dtype="<u4",
        ...                  run=run, carried=(), check=check)  # doctest: +SKIP
    """
    size = config.plan_group_partitions
    if size is None:
        raise ConfigError("plan_partitioned needs PackConfig(plan_group_partitions=N), N >= 1")
    groups = _groups(parts, size)
    work.makedirs("plan")
    present = work.listdir("plan")
    todo = [g for g in range(len(groups)) if f"done-{g:06d}" not in present]
    if todo:  # a job whose groups are all written needs no selection again
        _write_sources(work, source_names)
        for _ in run(_bucket_task, [(g, p, str(work)) for g, p in enumerate(groups)], "bucket"):
            pass
        for _ in run(_duplicate_task, [(b, len(groups), str(work)) for b in range(BUCKETS)], "duplicates"):
            pass
        counts = list(run(_select_task, [(g, p, str(work), config.seq_len, config.max_images, config.on_error,
                                          config.cp) for g, p in enumerate(groups)], "select"))
        records, drops, packed = (sum(c[k] for c in counts) for k in range(3))
        limit = config.run.max_drop_fraction
        if not packed or (limit is not None and records and drops / records > limit):
            check(list(_iter_drops(work, len(groups))), records, packed)
        itemsize = np.dtype(token_dtype).itemsize
        for _ in run(_plan_task, [(g, groups[g], str(work), str(out), config, token_dtype, itemsize)
                                  for g in todo], "plan+write", sum(counts[g][2] for g in todo)):
            pass
    with out.open_write(f".{DROPPED_NAME}.tmp") as f:  # streamed: the drops never sit in the driver
        for d in carried:
            f.write((json.dumps(d.to_json(), ensure_ascii=False) + "\n").encode())
        drops = len(carried)
        for g in range(len(groups)):
            data = work.read_bytes(f"plan/drop-{g:06d}.jsonl")
            drops += data.count(b"\n")
            f.write(data)
    out.commit(f".{DROPPED_NAME}.tmp", DROPPED_NAME)
    shards: list[ShardInfo] = []
    maxima, records, packs, source_records, shortest, padding = [0, 0, 0], 0, 0, 0, [], 0
    for g in range(len(groups)):  # per-shard state only: the index rows are streamed below
        done = _read_done(work, g)
        shards.extend(ShardInfo(*s) for s in done["shards"])
        maxima = [max(a, b) for a, b in zip(maxima, done["max"])]
        records += done["records"]
        source_records += done.get("source_records", done["records"])  # a group written before the key
        shortest += [done["min_sample_tokens"]] if done.get("min_sample_tokens") is not None else []
        padding += done.get("cp_padding", 0)
        packs += len(done["index"]) // (8 * len(INDEX_COLUMNS))
    digest = hashlib.sha256()
    with out.open_write(f".{INDEX_NAME}.tmp") as f:  # the .npy header, then each group's rows
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(head, {"descr": "<i8", "fortran_order": False,
                                                    "shape": (packs, len(INDEX_COLUMNS))})
        size = 0
        for data in itertools.chain([head.getvalue()], (_read_done(work, g)["index"] for g in range(len(groups)))):
            digest.update(data)
            f.write(data)
            size += len(data)
    out.commit(f".{INDEX_NAME}.tmp", INDEX_NAME)
    entry = {"file": INDEX_NAME, "columns": list(INDEX_COLUMNS), "bytes": size, "sha256": digest.hexdigest()}
    result = GroupResult(tuple(shards), maxima[0], maxima[1], maxima[2], source_records=source_records,
                         min_sample_tokens=min(shortest) if shortest else None,
                         cp_padding=padding if config.cp else None)
    return result, records, drops, entry


def _raise_first(dropped: list[Dropped], on_error: str) -> None:
    """``on_error='raise'``: the first drop stops the job, as in the global plan."""
    if on_error == "raise" and dropped:
        d = dropped[0]
        skip = "" if d.reason == "duplicate_id" else " (or pass --on-error skip)"
        raise SampleError(d.reason, f"{d.detail}{skip}", sample_id=d.sample_id)
