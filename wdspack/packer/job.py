"""The pack job: measure → plan → write, resumable, in a process pool or on a Ray cluster.

::

    sources ──list_partitions──► partitions ──measure (pool)──► spool files + per-partition meta
                                                                        │ integer arrays only
                                                                        ▼
                                              plan_packs (one process) → packs → shards
                                                                        │
                                                write (pool) ◄──────────┘ one task per shard
                                                    ▼
                                   train-000000.tar … + dropped.jsonl + manifest.json (last)

Measuring tokenizes each sample once and spools it (tokens, mask, image bytes) under
``OUTPUT/.wdspack-work/``; the driver keeps only integers and ids. Tasks return only their index
(measure) or a :class:`ShardInfo` (write); the driver reads each partition's ``.meta`` file (ids
and integer columns, never payloads) and keeps, per measured sample, six int64 columns (48 B),
a keep flag, its place in the plan (~10 B) and its id (a ``str``: about 50 B + its length, in a
list). Joining the columns and building the plan (the planner's lists, the de-duplication set)
add transient peaks: measured, the driver grows by about 190 B + the id per sample at its peak
(:data:`DRIVER_BYTES_PER_SAMPLE` is the bound tested), some 7 GB for 25 M samples with 30-byte ids.
Tasks run through :mod:`wdspack.packer.executors` (``executor="local"``: this process or
a spawn pool of ``workers``; ``"ray"``: a Ray cluster), and the output does not depend on which.
Sources and the output may be local paths or fsspec URLs (:mod:`wdspack.storage`); the work
folder sits inside the output, so on a cluster an output every node can reach (shared disk,
``s3://…``) is all the tasks need. Every finished unit of work is visible under its final name
only when complete (temp name, then a rename), so a job killed at any point and re-run with
``resume=True`` redoes only what was unfinished, and the result is byte-identical to an
uninterrupted run.

The pieces: :mod:`.config` (what the job is asked, what it did), :mod:`.output` (the output folder's
state before a job, its work folder, a failure recorded), :mod:`.spool` (the private format of the
measured samples), :mod:`.selection` (the driver's integers: drops, plan, shards), :mod:`.summary`
(the manifest written last, the summary printed).

With ``PackConfig(plan_group_partitions=N)`` (``wdspack pack --plan-groups N``) everything after
measuring runs as tasks over groups of ``N`` partitions (:mod:`.partitioned`): the driver keeps
per-group and per-shard state only, never ids or per-sample integers, so its memory does not grow
with the sample count (``tests/packer/test_driver_memory.py``). Left to choose (None),
:func:`pack_dataset` plans in groups a job of more records than ``WDSPACK_PLAN_GROUPS_ABOVE`` (10 M).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import ConfigError, Dropped, SampleError, WdspackError, suggest_keywords
from ..format.manifest import DROPPED_NAME, MANIFEST_NAME, Manifest, ShardInfo
from ..format.pack import encode_pack
from ..format.pack_index import INDEX_NAME, build_index, encode_index, index_entry
from ..format.tar import ShardWriter, shard_name
from ..media import KINDS
from ..storage.location import Location
from .config import PackConfig, PackSummary
from .executors import (
    ProgressLog,
    check_executor,
    live_bar,
    progress_interval,
    report,
    reported,
    run_tasks,
    shared_pool,
)
from .output import (
    WORK_DIR,
    check_output,
    fingerprint,
    mark_failed,
    prepare_output,
    read_shard,
    record_shard,
    recorded_shards,
)
from .partitioned import choose_plan_groups, plan_groups_above, plan_partitioned
from .precheck import precheck
from .samples import SampleConfig, get_builder
from .selection import (
    Measured,
    assign_shards,
    check_drops,
    cp_padding,
    plan_selected,
    select_samples,
    write_dropped,
)
from .sources import Partition, Source, TextRecord, iter_records, list_partitions
from .spool import SpoolReader, SpoolWriter, assemble_pack, meta_name, pack_counts, read_meta
from .summary import build_manifest, finish, records_behind, summary_of
from .text import build_samples

__all__ = ["DRIVER_BYTES_PER_SAMPLE", "WORK_DIR", "pack_dataset", "run_job"]

logger = logging.getLogger(__name__)

#: The driver's peak memory per sample, besides the sample's id (a ``str``: ~50 B + its length, and
#: an 8 B list slot): the integer columns, twice while they are joined, and the plan while it is
#: built. Measured by ``tests/packer/test_driver_memory.py`` (about 210 B on CPython 3.11).
DRIVER_BYTES_PER_SAMPLE = 250


@suggest_keywords
def pack_dataset(
    sources: Sequence[str | Source],
    output: str | os.PathLike[str],
    *,
    sample_config: SampleConfig,
    config: PackConfig,
    image_root: str | None = None,
    resume: bool = False,
    progress: bool = False,
    media_root: str | None = None,
) -> PackSummary:
    """Pack chat data into shards: the library call behind ``wdspack pack``.

    Args:
        sources: files, folders or globs (JSON/JSONL/Parquet/``save_to_disk`` folders), local or
            fsspec URLs (``s3://…``, ``hf://datasets/ORG/NAME@REV/…``); ``"PATH::ROOT"`` (or a
            :class:`~wdspack.packer.sources.Source`) with its own image root; InternVL meta files, LLaMA-Factory
            ``dataset_info.json`` and LLaVA-NeXT data YAMLs for the datasets they list. An id that
            two sources share is packed as ``{source}/{id}`` (see :mod:`wdspack.packer.sources.meta`).
        output: the dataset folder to create (a path, or an fsspec URL such as ``s3://bucket/ds``).
        sample_config: tokenizer, chat template and image-token policy.
        config: budgets, algorithm, seed, shard size, error policy, and where tasks run
            (``workers``, ``executor``, ``ray_address``).
        image_root: folder (or URL) media paths (images, videos, audio) are relative to, for the sources
            without their own (default: each source file's folder).
        media_root: the same, by its kind-neutral name (give one of the two).
        resume: continue an interrupted job in ``output`` (same arguments), keeping finished work.
        progress: show progress bars on stderr.

    Returns:
        A :class:`PackSummary`.

    Example:
        >>> pack_dataset(["data/llava.jsonl"], "out", sample_config=SampleConfig("tok/", tokens_per_image=64),
        ...              config=PackConfig(seq_len=4096, max_images=16))  # doctest: +SKIP
    """
    if media_root is not None:
        if image_root is not None and image_root != media_root:
            raise ConfigError(f"image_root={image_root!r} and media_root={media_root!r} name the same folder; give one")
        image_root = media_root
    start = time.perf_counter()
    with shared_pool(config.run.workers if config.run.executor == "local" else 1):
        return _pack(sources, output, sample_config, config, image_root=image_root, resume=resume,
                     progress=progress, start=start)


def _pack(sources: Sequence[str | Source], output: str | os.PathLike[str], sample_config: SampleConfig,
          config: PackConfig, *, image_root: str | None, resume: bool, progress: bool, start: float) -> PackSummary:
    """:func:`pack_dataset` inside its job's pool: the files listed in tasks (a job of many files,
    e.g. caption shards, does not read every tar's headers in the driver), then :func:`run_job`."""
    def map_files(fn: Callable[..., Any], tasks: list[tuple]) -> Iterable[Any]:
        return run_tasks(fn, tasks, executor=config.run.executor, workers=config.run.workers,
                         ray_address=config.run.ray_address)

    partitions = list_partitions(list(sources), image_root=image_root,
                                 records_per_partition=config.records_per_partition, map_files=map_files)
    config, plan = _choose_plan(partitions, config)  # before the fingerprint: a resumed job keeps the choice
    key = fingerprint(partitions, sample_config, config)
    tasks = [(i, p, sample_config, config.on_error, config.seq_len, config.max_images)
             for i, p in enumerate(partitions)]
    provenance = {"image_root": image_root, "max_image_side": sample_config.max_image_side,
                  "max_image_pixels": sample_config.max_image_pixels}
    summary = run_job(Location(output), key, _measure_partition, tasks, config,
                      describe=lambda: _describe_samples(sample_config, partitions),
                      sources=[str(s) for s in sources], provenance=provenance, resume=resume, progress=progress,
                      start=start, source_names=[p.source for p in partitions])
    return replace(summary, plan=plan) if plan else summary


def _choose_plan(partitions: Sequence[Partition], config: PackConfig) -> tuple[PackConfig, str]:
    """``config`` with the plan the job's size asks for, when it left the choice (``plan_group_partitions``
    None), and the summary's line when it chose groups. Decided from the records the listing finds
    (:func:`_records_of`; a partition it cannot count counts ``records_per_partition``): the inputs alone."""
    if config.plan_group_partitions is not None:
        return config, ""
    per = config.records_per_partition
    counts = _records_of(partitions, per=per)[0]
    records = sum(per if c is None else c for c in counts)
    above = plan_groups_above()
    group = choose_plan_groups(records, records_per_partition=per, above=above)
    if group is None:
        return config, ""
    return replace(config, plan_group_partitions=group), (
        f"in groups of {group} partitions: the job has {'up to' if None in counts else 'about'} {records:,} "
        f"records, over {above:,} (WDSPACK_PLAN_GROUPS_ABOVE); --plan-groups off forces one global plan")


def _describe_samples(sample_config: SampleConfig, partitions: Sequence[Partition]) -> dict[str, Any]:
    """The tokenizer and image policy for the manifest; what is wrong with the template for training
    (no end-of-turn target) is logged here, once per job, in the driver. What the tokenizer's files
    tell is checked first, before it loads (:func:`~.precheck.precheck`)."""
    precheck(sample_config, lambda: _first_is_chat(partitions))
    builder = get_builder(sample_config)
    for warning in builder.template_warnings():
        logger.warning(warning)
    return builder.describe()


def _first_is_chat(partitions: Sequence[Partition]) -> bool:
    """Whether the first record of the data is a chat (not a caption or a document)."""
    for p in partitions[:1]:
        for item in iter_records(p):
            if not isinstance(item, Dropped):
                return not hasattr(item, "segments")
    return False


def run_job(out: Location, fingerprint: str, measure: Callable[..., Any], tasks: list[tuple], config: PackConfig, *,
            describe: Callable[[], dict[str, Any]], sources: Sequence[str], provenance: dict[str, Any],
            resume: bool, progress: bool, start: float, carried: Sequence[Dropped] = (),
            samples_read: int | None = None, source_names: Sequence[str] = (),
            records_read: int | None = None, reshard: bool = False) -> PackSummary:
    """Spool samples with ``measure(*task, work)``, then plan, write shards and the manifest.

    Shared by :func:`pack_dataset` (tasks read and tokenize source partitions) and
    :func:`wdspack.packer.reshard.reshard_dataset` (tasks split existing packs back into samples).
    ``carried`` are drops inherited from an earlier job; ``samples_read`` and ``records_read`` override
    the counts (the records: a document cut into pieces is one record of several samples); ``reshard``: the
    tasks split a packed dataset (its drops are answered as a reshard's). ``source_names[i]`` names the source
    of task ``i`` (ids two sources share are prefixed with it).

    Everything that can be checked without reading the records is checked before the output is
    touched: the executor, the output folder's state (before anything loads), and ``describe()``, which
    builds the tokenizer, processor and chat template (a path that does not load fails here, leaving no
    work folder to block the corrected re-run).
    """
    check_executor(config.run.executor)  # before touching the output: a missing Ray is a usage error
    if progress and not sys.stderr.isatty():
        progress_interval()  # a bad WDSPACK_PROGRESS_INTERVAL is a usage error too
    state = check_output(out, fingerprint, resume=resume)  # in a second, before a tokenizer or processor loads
    info = describe()
    work = prepare_output(out, fingerprint, state)
    if work is None:  # already complete
        done = Manifest.from_json(out.read_bytes(MANIFEST_NAME))
        return summary_of(out, done, seconds=time.perf_counter() - start, resumed_shards=len(done.shards))
    try:  # one local pool for every stage: each worker imports and loads the tokenizer once per job
        with shared_pool(config.run.workers if config.run.executor == "local" else 1):
            if config.plan_group_partitions:  # 0 and None: one global plan (pack_dataset chose by size)
                return _run_partitioned(out, work, measure, tasks, config, info=info, sources=sources,
                                        provenance=provenance, progress=progress, start=start, carried=carried,
                                        samples_read=samples_read, source_names=source_names,
                                        records_read=records_read, reshard=reshard)
            return _run_global(out, work, measure, tasks, config, info=info, sources=sources,
                               provenance=provenance, progress=progress, start=start, carried=carried,
                               samples_read=samples_read, source_names=source_names, records_read=records_read,
                               reshard=reshard)
    except WdspackError as e:  # deterministic: the same command fails the same way; its fix is another command
        mark_failed(work, fingerprint, e)
        raise


def _run_global(out: Location, work: Location, measure: Callable[..., Any], tasks: list[tuple],
                config: PackConfig, *, info: dict[str, Any], sources: Sequence[str],
                provenance: dict[str, Any], progress: bool, start: float, carried: Sequence[Dropped],
                samples_read: int | None, source_names: Sequence[str], records_read: int | None,
                reshard: bool) -> PackSummary:
    """:func:`run_job` with one global plan: measure, select, plan, write, manifest."""
    measured = _measure(measure, tasks, work, config, progress=progress)
    info = measured.describe or info
    table = select_samples(measured, config, source_names=source_names)
    check_drops(out, measured, table, config, carried=carried, reshard=reshard)
    plan = plan_selected(table, config)
    shard_plans = assign_shards(plan, table, config, token_itemsize=_itemsize(info))
    infos, offsets, kept = _write_shards(shard_plans, table, work, out, info, config, progress=progress)
    index = encode_index(build_index(shard_plans, offsets, table))
    out.write_atomic(INDEX_NAME, index)

    dropped = list(carried) + measured.dropped + table["dropped"]
    write_dropped(out, dropped)
    read = measured.records if samples_read is None else samples_read
    kept_tokens = table["tokens"][table["keep"]]
    manifest = build_manifest(sources, config, info, infos, read, dropped, provenance,
                               pack_index=index_entry(index),
                               records_read=records_behind(measured.source_records, samples_read, records_read),
                               min_sample_tokens=int(kept_tokens.min()) if kept_tokens.size else None,
                               max_samples_per_pack=max((len(p) for p in plan), default=0),
                               max_media_per_pack=max((int(table["media"][p].sum()) for p in plan), default=0),
                               max_media_tokens_per_pack=max((int(table["media_tokens"][p].sum()) for p in plan),
                                                             default=0),
                               cp_padding=cp_padding(table, config))
    return finish(out, manifest, start=start, resumed_shards=kept)


def _run_partitioned(out: Location, work: Location, measure: Callable[..., Any], tasks: list[tuple],
                     config: PackConfig, *, info: dict[str, Any], sources: Sequence[str],
                     provenance: dict[str, Any], progress: bool, start: float, carried: Sequence[Dropped],
                     samples_read: int | None, source_names: Sequence[str],
                     records_read: int | None, reshard: bool) -> PackSummary:
    """:func:`run_job` with ``plan_group_partitions``: measure, then plan and write in groups
    (:mod:`.partitioned`); the driver holds per-group and per-shard state only."""
    _spool(measure, tasks, work, config, progress=progress)
    if tasks:
        info = read_meta(work, 0)["describe"] or info

    def run(fn: Callable[..., Any], group_tasks: list[tuple], desc: str, samples: int | None = None) -> Iterable[Any]:
        if samples is None:  # counted in tasks
            return _run(fn, group_tasks, config, total=len(group_tasks), desc=desc, unit="task", progress=progress)
        return _run(fn, group_tasks, config, total=samples, desc=desc, unit="sample", progress=progress, live=True)

    def check(new: list[Dropped], records: int, packed: int) -> None:
        check_drops(out, Measured(dropped=new, records=records), {"dropped": [], "keep": np.ones(packed, bool)},
                    config, carried=carried, reshard=reshard)

    result, records, n_dropped, entry = plan_partitioned(
        out, work, len(tasks), config, token_dtype=info["tokenizer"]["token_dtype"], run=run, carried=carried,
        check=check, source_names=source_names)
    read = records if samples_read is None else samples_read
    dropped_counts = Counter(json.loads(line)["reason"] for line in _lines(out, DROPPED_NAME))
    manifest = build_manifest(sources, config, info, list(result.shards), read, [], provenance,
                               pack_index=entry, max_samples_per_pack=result.max_samples_per_pack,
                               records_read=records_behind(result.source_records, samples_read, records_read),
                               min_sample_tokens=result.min_sample_tokens,
                               max_media_per_pack=result.max_media_per_pack,
                               max_media_tokens_per_pack=result.max_media_tokens_per_pack,
                               dropped_counts=(n_dropped, dict(sorted(dropped_counts.items()))),
                               cp_padding=result.cp_padding)
    return finish(out, manifest, start=start)


def _lines(out: Location, name: str) -> Iterable[bytes]:
    """The lines of ``name``, read as a stream (``dropped.jsonl`` may be large)."""
    with out.open_read(name) as f:
        yield from f


# ---------------------------------------------------------------------------------------------
# Measure: tokenize each partition once, spool samples, keep integers


def _spool(fn: Callable[..., Any], tasks: list[tuple], work: Location, config: PackConfig, *,
           progress: bool) -> None:
    """Run the measure tasks not yet done; progress counts records (:func:`_measure_partition` reports
    each one as it goes), against the total the partitions give (:func:`_records_of`)."""
    done = work.listdir("spool")  # one listing, not a request per task
    todo = [t + (str(work),) for t in tasks if meta_name(t[0]) not in done]
    if fn is not _measure_partition:  # resharding: its tasks are shards, counted as they finish
        for _ in _run(fn, todo, config, total=len(todo), desc="measure", unit="part", progress=progress):
            pass
        return
    counts, guessed = _records_of([t[1] for t in tasks], per=config.records_per_partition)
    left = [t[0] for t in todo]
    known = [counts[i] for i in left]
    total = sum(c for c in known if c is not None) if None not in known else None
    for _ in _run(fn, todo, config, total=total, desc="measure", unit="record", progress=progress, live=True,
                  estimated=not guessed.isdisjoint(left)):
        pass


def _records_of(partitions: Sequence[Partition], *, per: int) -> tuple[list[int | None], set[int]]:
    """Each partition's records, from what listing them found, and which of them are estimates: exact from
    the next partition's first row (or an Arrow slice's rows); a file's last slice estimated from the
    records per byte (row group) of the job's other slices of its kind, at most ``per``; None where
    nothing tells."""
    counts: list[int | None] = [None] * len(partitions)
    per_size: dict[str, list[int]] = {}  # kind -> [records, size] of the slices counted exactly
    for k, p in enumerate(partitions):
        nxt = partitions[k + 1] if k + 1 < len(partitions) else None
        if p.kind == "arrow":
            counts[k] = p.stop - p.start
        elif nxt is not None and nxt.path == p.path and nxt.first_row > p.first_row:
            counts[k] = nxt.first_row - p.first_row
        else:
            continue
        seen = per_size.setdefault(p.kind, [0, 0])
        seen[0] += counts[k] or 0
        seen[1] += p.stop - p.start
    guessed = set()
    for k, p in enumerate(partitions):
        records, size = per_size.get(p.kind, [0, 0])
        if counts[k] is None and size:
            counts[k] = min(per, max(1, round((p.stop - p.start) * records / size)))
            guessed.add(k)
    return counts, guessed


def _measure(fn: Callable[..., Any], tasks: list[tuple], work: Location, config: PackConfig, *,
             progress: bool) -> Measured:
    _spool(fn, tasks, work, config, progress=progress)
    m = Measured()
    for i in range(len(tasks)):
        meta = read_meta(work, i)
        n = len(meta["ids"])
        m.ids.extend(meta["ids"])
        m.tokens.append(np.frombuffer(meta["tokens"], np.int64))
        m.media.append(np.frombuffer(meta["media"], np.int64))
        m.media_bytes.append(np.frombuffer(meta["media_bytes"], np.int64))
        m.media_tokens.append(np.frombuffer(meta["media_tokens"], np.int64))
        m.targets.append(np.frombuffer(meta["targets"], np.int64))
        m.offset.append(np.frombuffer(meta["offsets"], np.int64))
        m.length.append(np.frombuffer(meta["lengths"], np.int64))
        m.part.append(np.full(n, i, np.int64))
        m.dropped.extend(Dropped(*d) for d in meta["dropped"])
        m.dropped_part.extend([i] * len(meta["dropped"]))
        m.records += meta["records"]
        m.source_records += meta.get("source_records", meta["records"])  # a spool from before the key
        m.describe = m.describe or meta["describe"]
    return m


def _measure_partition(i: int, partition: Partition, sample_config: SampleConfig, on_error: str, seq_len: int,
                       max_images: int | None, work: str) -> int:
    """Tokenize one partition into the spool (a document split by ``split_long_documents``: one sample per piece)."""
    builder = get_builder(sample_config)
    with SpoolWriter(work, i) as spool:
        records = 0  # the records, apart from the samples (pieces) made of them
        for item, built in _built(builder, iter_records(partition)):
            records += 1
            report()  # one record read: progress (counted, sent to the driver now and then)
            if isinstance(item, Dropped):
                _on_drop(item, on_error)
                spool.drop(item)
                continue
            try:
                if isinstance(built, Exception):
                    raise built
                samples = [built] if built is not None else build_samples(builder, item, seq_len=seq_len,
                                                                           max_images=max_images)
            except SampleError as e:
                d = e.to_dropped(item.sample_id)
                _on_drop(d, on_error)
                spool.drop(d)
                continue
            for s in samples:
                over = _whole_document_over_budget(item, s, seq_len=seq_len, max_images=max_images) \
                    or _kind_over_budget(builder, s, seq_len=seq_len)
                if over is not None:
                    _on_drop(over, on_error)
                    spool.drop(over)
                    continue
                spool.add(s.sample_id, s.input_ids, s.loss_mask, s.media)
        spool.source_records = records
        spool.finish(builder.describe())
    return i


def _built(builder: Any, items: Iterable[Any], chunk: int = 128) -> Iterator[tuple[Any, Any]]:
    """Each item with its chat record's sample or error (built in stages, ``chunk`` records at a
    time: :meth:`~.samples.SampleBuilder.build_chats`), in order; None for drops and pre-training
    records (captions, documents), which :func:`~.text.build_samples` builds one by one."""
    it = iter(items)
    while batch := tuple(itertools.islice(it, chunk)):
        chat = [not isinstance(x, Dropped) and not hasattr(x, "segments") for x in batch]  # as build() tells
        built = iter(builder.build_chats([x for x, c in zip(batch, chat) if c]))
        for x, c in zip(batch, chat):
            yield x, (next(built) if c else None)


def _whole_document_over_budget(record: Any, sample: Any, *, seq_len: int, max_images: int | None) -> Dropped | None:
    """A document left whole (no ``--split-long-documents``) that is over a budget, dropped here because
    its fix differs: it could be cut into pieces. :func:`~.selection.select_samples` drops every other
    sample over a budget."""
    if not (isinstance(record, TextRecord) and record.kind == "document"):
        return None
    if sample.token_count > seq_len:
        return Dropped(sample.sample_id, "too_long", f"{sample.token_count} tokens > seq_len {seq_len}; raise "
                       "--seq-len or pass --split-long-documents to cut it into pieces")
    if max_images is not None and sample.media_count > max_images:
        return Dropped(sample.sample_id, "too_many_images", f"{sample.media_count} images > max_images "
                       f"{max_images}; raise --max-images or pass --split-long-documents to cut it into pieces")
    return None


def _kind_over_budget(builder: Any, sample: Any, *, seq_len: int) -> Dropped | None:
    """A sample over ``seq_len`` for a kind whose fix is also its own settings (a video's sampling): dropped here,
    with the levers and the settings it was planned with (each kind's ``prepare.over_budget``)."""
    for kind in KINDS:
        if kind.prepare is not None and (why := kind.prepare().over_budget(builder, sample, seq_len=seq_len)):
            return Dropped(sample.sample_id, "too_long", why)
    return None


def _on_drop(d: Dropped, on_error: str) -> None:
    if on_error == "raise":
        raise SampleError(d.reason, f"{d.detail} (pass --on-error skip to drop such samples and go on)",
                          sample_id=d.sample_id)


def _itemsize(describe: dict[str, Any]) -> int:
    return np.dtype(describe["tokenizer"]["token_dtype"]).itemsize


# ---------------------------------------------------------------------------------------------
# Write: one task per shard, reading samples back from the spool


def _write_shards(shard_plans, table, work: Location, out: Location, describe, config: PackConfig, *,
                  progress: bool) -> tuple[list[ShardInfo], list[list[int]], int]:
    """Write the shards not yet present; returns every shard's info, its packs' offsets, and how many were kept."""
    token_dtype = describe["tokenizer"]["token_dtype"]
    infos: dict[int, ShardInfo] = {}
    offsets: dict[int, list[int]] = {}
    todo = []
    present = out.listdir("")  # one listing, not a request per shard
    work.makedirs("shards")
    recorded = recorded_shards(work)
    for j in range(len(shard_plans)):
        name = shard_name(config.split, j)
        if name in present and name in recorded:  # recorded, then renamed into place when complete; the same plan
            infos[j], offsets[j] = read_shard(work, name)
        else:
            todo.append((j, out.join(name)))
    kept = len(infos)
    # Built lazily: the executor holds the sample refs of the shards in flight, not of all of them.
    # Each ref carries the sample's id as the table has it (an id two sources share is namespaced).
    tasks = ((j, [[(int(table["part"][s]), int(table["offset"][s]), int(table["length"][s]), table["ids"][s])
                   for s in pack] for pack in shard_plans[j]], str(work), path, token_dtype) for j, path in todo)
    samples = sum(len(pack) for j, _ in todo for pack in shard_plans[j])
    for j, info, where in _run(_write_shard, tasks, config, total=samples, desc="write", unit="sample",
                               progress=progress, live=True):
        infos[j], offsets[j] = info, where
    return [infos[j] for j in range(len(shard_plans))], [offsets[j] for j in range(len(shard_plans))], kept


def _write_shard(j: int, refs, work: str, path: str, token_dtype: str) -> tuple[int, ShardInfo, list[int]]:
    """Assemble and write one shard; keys are ``{shard:06d}{pack:06d}``."""
    with SpoolReader(work) as spool, ShardWriter(path) as writer:
        for k, pack_refs in enumerate(refs):
            samples = spool.read(pack_refs)
            for sample, ref in zip(samples, pack_refs):
                sample[0] = ref[3]  # the id the job gave it (the spool holds the source's own)
            pack = assemble_pack(samples)
            writer.add(f"{j:06d}{k:06d}", encode_pack(pack, token_dtype=token_dtype),
                       samples=pack.num_samples, tokens=pack.num_tokens, **pack_counts(pack))
            report(pack.num_samples)
        # what it wrote, kept in the work folder before the shard takes its name: a resumed job reads it back
        info = writer.close(record=lambda info: record_shard(Location(work), info, writer.offsets))
        return j, info, writer.offsets


# ---------------------------------------------------------------------------------------------
# Execution


def _run(fn: Callable[..., Any], tasks: Iterable[tuple], config: PackConfig, *, total: int | None, desc: str,
         unit: str, progress: bool, live: bool = False, estimated: bool = False) -> Iterable[Any]:
    """Run ``fn(*task)`` for each task where ``config`` says, yielding results in order, with progress: a
    bar on a terminal, elsewhere (Slurm, nohup, CI) a plain line every ``WDSPACK_PROGRESS_INTERVAL``
    seconds (:class:`~wdspack.packer.executors.ProgressLog`). ``live``: the count is the units of work
    the tasks :func:`~wdspack.packer.executors.report` (records, samples), moving while a task runs;
    else the tasks done. ``total`` None: not known (count and rate, no share); ``estimated``: about."""
    terminal = sys.stderr.isatty()
    finished = [0]
    base = reported()

    def count() -> int:
        return reported() - base if live else finished[0]

    def done() -> None:
        finished[0] += 1

    shown = live_bar(desc, unit, total=total, count=count) if progress and terminal else nullcontext()
    log = (ProgressLog(desc, unit, total=total, interval=progress_interval(), count=count, estimated=estimated)
           if progress and not terminal else None)
    complete = False
    try:
        with shown:
            yield from run_tasks(fn, tasks, executor=config.run.executor, workers=config.run.workers,
                                 ray_address=config.run.ray_address, on_done=done)
        complete = True
    finally:
        if log is not None:
            log.close(finished=complete)
