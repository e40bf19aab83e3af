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
Tasks run through :mod:`wdspack.executors` (``executor="local"``: this process or
a spawn pool of ``workers``; ``"ray"``: a Ray cluster), and the output does not depend on which.
Sources and the output may be local paths or fsspec URLs (:mod:`wdspack.storage`); the work
folder sits inside the output, so on a cluster an output every node can reach (shared disk,
``s3://…``) is all the tasks need. Every finished unit of work is visible under its final name
only when complete (temp name, then a rename), so a job killed at any point and re-run with
``resume=True`` redoes only what was unfinished, and the result is byte-identical to an
uninterrupted run.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import msgpack
import numpy as np

from ._version import __version__
from .format.pack import Pack, encode_pack
from .errors import ConfigError, Dropped, OutputError, SampleError, TooManyDropsError
from .executors import EXECUTORS, ProgressLog, check_executor, progress_interval, run_tasks
from .format.manifest import DROPPED_NAME, MANIFEST_NAME, Manifest, ShardInfo
from .format.pack_index import INDEX_NAME, build_index, encode_index, index_entry, member_offsets
from .packing import ALGORITHMS, plan_packs
from .samples import SampleConfig, get_builder
from .sources import Partition, Source, iter_records, list_partitions
from .sources.meta import collision_key, namespaced
from .storage.location import Location, stat_tag
from .format.tar import ShardWriter, shard_name

__all__ = ["DEFAULT_MAX_DROP_FRACTION", "PackConfig", "PackSummary", "SpoolWriter", "pack_dataset", "run_job"]

logger = logging.getLogger("wdspack.pipeline")

WORK_DIR = ".wdspack-work"
_PACK_OVERHEAD = 64  # msgpack framing per pack, bytes (for shard size estimates)
_SAMPLE_OVERHEAD = 48  # per sub-sample: its id, length and image lists
# Where tasks run, and whether the job may go on after its drops: never changes the output bytes (a
# job stopped by the drop tolerance resumes with a new max_drop_fraction, its tokenized samples kept).
_EXECUTION_FIELDS = ("workers", "executor", "ray_address", "max_drop_fraction")
#: A job that drops more than this fraction of the samples it read fails (after writing dropped.jsonl).
DEFAULT_MAX_DROP_FRACTION = 0.05
_DROP_EXAMPLES = 5  # reasons shown, one example each, when a job fails on its drops
#: The driver's peak memory per sample, besides the sample's id (a ``str``: ~50 B + its length, and
#: an 8 B list slot): the integer columns, twice while they are joined, and the plan while it is
#: built. Measured by ``tests/test_driver_memory.py`` (about 210 B on CPython 3.11).
DRIVER_BYTES_PER_SAMPLE = 250


@dataclass(frozen=True, slots=True)
class PackConfig:
    """How to plan and write (everything but the tokenizer, which is :class:`SampleConfig`).

    ``workers``, ``executor`` (``"local"`` or ``"ray"``) and ``ray_address`` say where the tasks
    run; they change nothing in the output, so a job may be resumed under other values.
    ``max_drop_fraction``: the job fails, after writing ``dropped.jsonl`` and before planning, when
    it drops more than this fraction of the samples it read (``1`` or ``None``: any); a job that would
    pack nothing always fails. Resume it with a higher value to accept the drops.
    """

    seq_len: int
    max_images: int | None = None
    algorithm: str = "bfd"
    seed: int = 0
    shard_max_bytes: int = 512 * 10**6
    shard_max_packs: int | None = None
    workers: int = 1
    on_error: str = "skip"
    max_drop_fraction: float | None = DEFAULT_MAX_DROP_FRACTION
    split: str = "train"
    records_per_partition: int = 1000
    executor: str = "local"
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if self.seq_len <= 0:
            raise ConfigError(f"seq_len must be positive, got {self.seq_len}")
        if self.max_images is not None and self.max_images < 0:
            raise ConfigError(f"max_images must be >= 0, got {self.max_images}")
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"unknown --algorithm {self.algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
        if self.on_error not in ("skip", "raise"):
            raise ConfigError(f"--on-error must be 'skip' or 'raise', got {self.on_error!r}")
        if self.shard_max_bytes <= 0 or (self.shard_max_packs is not None and self.shard_max_packs <= 0):
            raise ConfigError("shard size limits must be positive")
        if self.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.workers}")
        if self.executor not in EXECUTORS:
            raise ConfigError(f"unknown --executor {self.executor!r}; choose one of {', '.join(EXECUTORS)}")
        if self.ray_address is not None and self.executor != "ray":
            raise ConfigError("--ray-address needs --executor ray")
        if self.max_drop_fraction is not None and not 0 <= self.max_drop_fraction <= 1:
            raise ConfigError(f"--max-drop-fraction must be in [0, 1] (0.05 = 5 %; 1 accepts any drops), "
                              f"got {self.max_drop_fraction}")

    def output_fields(self) -> dict[str, Any]:
        """The fields that decide the output (for resume fingerprints): all but where tasks run."""
        return {k: v for k, v in asdict(self).items() if k not in _EXECUTION_FIELDS}


@dataclass(frozen=True, slots=True)
class PackSummary:
    """What a pack job did; :meth:`lines` is what the CLI prints."""

    output: str
    samples_read: int
    samples_packed: int
    dropped_by_reason: dict[str, int]
    packs: int
    tokens: int
    images: int
    fill_ratio: float
    shards: int
    bytes: int
    seconds: float
    resumed_shards: int = 0
    #: how image tokens were counted (the manifest's ``image_policy``)
    image_policy: dict[str, Any] | None = None

    @property
    def samples_dropped(self) -> int:
        return sum(self.dropped_by_reason.values())

    def lines(self) -> list[str]:
        dropped = ", ".join(f"{k} {v}" for k, v in sorted(self.dropped_by_reason.items())) or "none"
        rate = self.samples_read / self.seconds if self.seconds > 0 else 0.0
        return [
            f"samples  read {self.samples_read}  packed {self.samples_packed}  dropped {self.samples_dropped} ({dropped})",
            f"packs    {self.packs}  fill {self.fill_ratio:.2%}  tokens {self.tokens}  images {self.images}",
            *([f"images   {_policy_text(self.image_policy)}"] if self.image_policy else []),
            f"shards   {self.shards}  {_human_bytes(self.bytes)}  in {self.output}",
            f"time     {self.seconds:.1f} s  ({rate:.0f} samples/s)"
            + (f"  resumed: {self.resumed_shards} shards kept" if self.resumed_shards else ""),
        ]


def _policy_text(policy: dict[str, Any]) -> str:
    """``fixed 64 tokens each`` or ``processor qwen2_5_vl (Qwen2_5_VLProcessor), tokens from each image's size``."""
    if policy.get("kind") == "fixed":
        return f"fixed {policy['tokens_per_image']} tokens each (--tokens-per-image)"
    if policy.get("family"):
        return f"processor {policy['family']} ({policy.get('processor_class')}), tokens from each image's size"
    return f"image processor {policy.get('name')}, tokens from each image's size"


@dataclass(slots=True)
class _Measured:
    """Integer arrays over all measured samples, in input order (the driver's whole state)."""

    ids: list[str] = field(default_factory=list)
    tokens: list[np.ndarray] = field(default_factory=list)
    images: list[np.ndarray] = field(default_factory=list)
    part: list[np.ndarray] = field(default_factory=list)
    offset: list[np.ndarray] = field(default_factory=list)
    length: list[np.ndarray] = field(default_factory=list)
    image_bytes: list[np.ndarray] = field(default_factory=list)
    image_tokens: list[np.ndarray] = field(default_factory=list)
    targets: list[np.ndarray] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    dropped_part: list[int] = field(default_factory=list)  # the task each drop came from
    records: int = 0
    describe: dict[str, Any] | None = None


def pack_dataset(
    sources: Sequence[str | Source],
    output: str | os.PathLike[str],
    *,
    sample_config: SampleConfig,
    config: PackConfig,
    image_root: str | None = None,
    resume: bool = False,
    progress: bool = False,
) -> PackSummary:
    """Pack chat data into shards: the library call behind ``wdspack pack``.

    Args:
        sources: files, folders or globs (JSON/JSONL/Parquet/``save_to_disk`` folders), local or
            fsspec URLs (``s3://…``, ``hf://datasets/ORG/NAME@REV/…``); ``"PATH::ROOT"`` (or a
            :class:`~wdspack.sources.Source`) with its own image root; InternVL meta files, LLaMA-Factory
            ``dataset_info.json`` and LLaVA-NeXT data YAMLs for the datasets they list. An id that
            two sources share is packed as ``{source}/{id}`` (see :mod:`wdspack.sources.meta`).
        output: the dataset folder to create (a path, or an fsspec URL such as ``s3://bucket/ds``).
        sample_config: tokenizer, chat template and image-token policy.
        config: budgets, algorithm, seed, shard size, error policy, and where tasks run
            (``workers``, ``executor``, ``ray_address``).
        image_root: folder (or URL) image paths are relative to, for the sources without their own
            (default: each source file's folder).
        resume: continue an interrupted job in ``output`` (same arguments), keeping finished work.
        progress: show progress bars on stderr.

    Returns:
        A :class:`PackSummary`.

    Example:
        >>> pack_dataset(["data/llava.jsonl"], "out", sample_config=SampleConfig("tok/", tokens_per_image=64),
        ...              config=PackConfig(seq_len=4096, max_images=16))  # doctest: +SKIP
    """
    start = time.perf_counter()
    partitions = list_partitions(list(sources), image_root=image_root,
                                 records_per_partition=config.records_per_partition)
    fingerprint = _fingerprint(partitions, sample_config, config)
    tasks = [(i, p, sample_config, config.on_error, config.seq_len, config.max_images)
             for i, p in enumerate(partitions)]
    provenance = {"image_root": image_root, "max_image_side": sample_config.max_image_side,
                  "max_image_pixels": sample_config.max_image_pixels}
    return run_job(Location(output), fingerprint, _measure_partition, tasks, config,
                   describe=lambda: _describe_samples(sample_config), sources=[str(s) for s in sources],
                   provenance=provenance, resume=resume, progress=progress, start=start,
                   source_names=[p.source for p in partitions])


def _describe_samples(sample_config: SampleConfig) -> dict[str, Any]:
    """The tokenizer and image policy for the manifest; what is wrong with the template for training
    (no end-of-turn target) is logged here, once per job, in the driver."""
    builder = get_builder(sample_config)
    for warning in builder.template_warnings():
        logger.warning(warning)
    return builder.describe()


def run_job(out: Location, fingerprint: str, measure: Callable[..., Any], tasks: list[tuple], config: PackConfig, *,
            describe: Callable[[], dict[str, Any]], sources: Sequence[str], provenance: dict[str, Any],
            resume: bool, progress: bool, start: float, carried: Sequence[Dropped] = (),
            samples_read: int | None = None, source_names: Sequence[str] = ()) -> PackSummary:
    """Spool samples with ``measure(*task, work)``, then plan, write shards and the manifest.

    Shared by :func:`pack_dataset` (tasks read and tokenize source partitions) and
    :func:`wdspack.reshard.reshard_dataset` (tasks split existing packs back into samples).
    ``carried`` are drops inherited from an earlier job; ``samples_read`` overrides the count.
    ``source_names[i]`` names the source of task ``i`` (ids two sources share are prefixed with it).

    Everything that can be checked without reading the records is checked before the output is
    touched: the executor, and ``describe()``, which builds the tokenizer, processor and chat
    template (a path that does not load fails here, leaving no work folder to block the corrected
    re-run).
    """
    check_executor(config.executor)  # before touching the output: a missing Ray is a usage error
    if progress and not sys.stderr.isatty():
        progress_interval()  # a bad WDSPACK_PROGRESS_INTERVAL is a usage error too
    info = describe()
    work = _prepare_output(out, fingerprint, resume=resume)
    if work is None:  # already complete
        return _summary_from_manifest(out, time.perf_counter() - start)
    measured = _measure(measure, tasks, work, config, progress=progress)
    info = measured.describe or info
    table = _select(measured, config, source_names=source_names)
    _check_drops(out, measured, table, config, carried=carried)
    plan = _plan(table, config)
    shard_plans = _assign_shards(plan, table, config, token_itemsize=_itemsize(info))
    infos, offsets, kept = _write_shards(shard_plans, table, work, out, info, config, progress=progress)
    index = encode_index(build_index(shard_plans, offsets, table))
    out.write_atomic(INDEX_NAME, index)

    dropped = list(carried) + measured.dropped + table["dropped"]
    _write_dropped(out, dropped)
    read = measured.records if samples_read is None else samples_read
    manifest = _build_manifest(sources, config, info, infos, read, dropped, provenance,
                               pack_index=index_entry(index), max_samples_per_pack=max((len(p) for p in plan), default=0),
                               max_images_per_pack=max((int(table["images"][p].sum()) for p in plan), default=0),
                               max_image_tokens_per_pack=max((int(table["image_tokens"][p].sum()) for p in plan),
                                                             default=0))
    out.write_atomic(MANIFEST_NAME, manifest.to_json().encode())
    out.remove(WORK_DIR)
    totals = manifest.totals
    return PackSummary(
        output=str(out), samples_read=totals["samples_read"], samples_packed=totals["samples_packed"],
        dropped_by_reason=totals["dropped_by_reason"], packs=totals["packs"], tokens=totals["tokens"],
        images=totals["images"], fill_ratio=totals["fill_ratio"], shards=len(infos),
        bytes=sum(i.bytes for i in infos), seconds=time.perf_counter() - start, resumed_shards=kept,
        image_policy=manifest.image_policy,
    )


# ---------------------------------------------------------------------------------------------
# Output folder and resume


def _fingerprint(partitions: Sequence[Partition], sample_config: SampleConfig, config: PackConfig) -> str:
    """A hash of everything that decides the output (not where tasks run: that changes nothing)."""
    inputs = []
    tags: dict[str, list[Any]] = {}  # one stat per file, not per partition (remote stats are requests)
    for p in partitions:
        if p.path not in tags:
            tags[p.path] = stat_tag(p.path)
        inputs.append([p.path, p.kind, p.start, p.stop, p.first_row, p.image_root, *tags[p.path]]
                      + ([p.source, repr(p.row_map)] if p.source or p.row_map else []))  # ids, renames
    blob = json.dumps({"inputs": inputs, "samples": asdict(sample_config), "config": config.output_fields(),
                       "version": __version__}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _prepare_output(out: Location, fingerprint: str, *, resume: bool) -> Location | None:
    """Create or check the output folder; return the work folder, or None if already complete.

    An unfinished job that wrote nothing (no tokenized unit of work, no shard: it failed on its first
    record, or was stopped at once) holds nothing to keep, so it is started over, whatever its
    arguments: its corrected re-run needs no ``--resume`` and no deleting. One with finished work is
    kept for ``--resume`` with the same arguments.
    """
    work = out.child(WORK_DIR)
    job = json.loads(work.read_bytes("job.json")) if work.exists("job.json") else None
    if out.exists(MANIFEST_NAME):
        if resume and (job is None or job["fingerprint"] == fingerprint):
            out.remove(WORK_DIR)
            return None
        raise OutputError(f"{out} already holds a packed dataset; choose another --output or delete it")
    unfinished = work.exists() and (job is not None or not out.remote)
    if unfinished and not _wrote_anything(out, work):
        logger.warning("wdspack: %s holds an unfinished pack job that wrote nothing yet (no tokenized partition, "
                       "no shard); starting it over", out)
        out.remove(WORK_DIR)
        unfinished, job = False, None
    if unfinished:
        if not resume:
            raise OutputError(f"{out} holds an unfinished pack job; pass --resume to continue it, "
                              "or delete the folder to start over")
        if (job or {}).get("fingerprint") != fingerprint:
            raise OutputError(f"--resume: the unfinished job in {out} was started with other inputs or "
                              "arguments; re-run it with the same ones, or delete the folder to start over")
    elif not out.is_empty():
        raise OutputError(f"{out} exists and is not empty; choose a new --output folder")
    work.makedirs("spool")
    if job is None:
        work.write_atomic("job.json", json.dumps({"fingerprint": fingerprint}).encode())
    return work


def _wrote_anything(out: Location, work: Location) -> bool:
    """Whether an unfinished job left work worth resuming: a finished spool unit (its ``.meta`` appears
    last) or anything in the output besides the work folder (shards, ``dropped.jsonl``)."""
    return (any(name.endswith(".meta") for name in work.listdir("spool"))
            or bool(out.listdir("") - {WORK_DIR}))


# ---------------------------------------------------------------------------------------------
# Measure: tokenize each partition once, spool samples, keep integers


def _measure(fn: Callable[..., Any], tasks: list[tuple], work: Location, config: PackConfig, *,
             progress: bool) -> _Measured:
    done = work.listdir("spool")  # one listing, not a request per task
    todo = [t + (str(work),) for t in tasks if _meta_name(t[0]) not in done]
    for _ in _run(fn, todo, config, total=len(todo), desc="measure", unit="part", progress=progress):
        pass
    m = _Measured()
    for i in range(len(tasks)):
        meta = msgpack.unpackb(work.read_bytes("spool", _meta_name(i)), raw=False)
        n = len(meta["ids"])
        m.ids.extend(meta["ids"])
        m.tokens.append(np.frombuffer(meta["tokens"], np.int64))
        m.images.append(np.frombuffer(meta["images"], np.int64))
        m.image_bytes.append(np.frombuffer(meta["image_bytes"], np.int64))
        m.image_tokens.append(np.frombuffer(meta["image_tokens"], np.int64))
        m.targets.append(np.frombuffer(meta["targets"], np.int64))
        m.offset.append(np.frombuffer(meta["offsets"], np.int64))
        m.length.append(np.frombuffer(meta["lengths"], np.int64))
        m.part.append(np.full(n, i, np.int64))
        m.dropped.extend(Dropped(*d) for d in meta["dropped"])
        m.dropped_part.extend([i] * len(meta["dropped"]))
        m.records += meta["records"]
        m.describe = m.describe or meta["describe"]
    return m


def _meta_name(i: int) -> str:
    return f"{i:06d}.meta"


def _bin_name(i: int) -> str:
    return f"{i:06d}.bin"


def _measure_partition(i: int, partition: Partition, sample_config: SampleConfig, on_error: str, seq_len: int,
                       max_images: int | None, work: str) -> int:
    """Tokenize one partition into the spool (a document split by ``split_long_documents``: one sample per piece)."""
    from .pretrain import build_samples

    builder = get_builder(sample_config)
    with SpoolWriter(work, i) as spool:
        for item in iter_records(partition):
            if isinstance(item, Dropped):
                _on_drop(item, on_error)
                spool.drop(item)
                continue
            try:
                samples = build_samples(builder, item, seq_len=seq_len, max_images=max_images)
            except SampleError as e:
                d = e.to_dropped(item.sample_id)
                _on_drop(d, on_error)
                spool.drop(d)
                continue
            for s in samples:
                over = _whole_document_over_budget(item, s, seq_len=seq_len, max_images=max_images)
                if over is not None:
                    _on_drop(over, on_error)
                    spool.drop(over)
                    continue
                spool.add(s.sample_id, s.input_ids, s.loss_mask, s.images, s.image_tokens)
        spool.finish(builder.describe())
    return i


def _whole_document_over_budget(record: Any, sample: Any, *, seq_len: int, max_images: int | None) -> Dropped | None:
    """A document left whole (no ``--split-long-documents``) that is over a budget, dropped here because
    its fix differs: it could be cut into pieces. :func:`_select` drops every other sample over a budget."""
    from .sources import TextRecord

    if not (isinstance(record, TextRecord) and record.kind == "document"):
        return None
    if sample.token_count > seq_len:
        return Dropped(sample.sample_id, "too_long", f"{sample.token_count} tokens > seq_len {seq_len}; raise "
                       "--seq-len or pass --split-long-documents to cut it into pieces")
    if max_images is not None and sample.image_count > max_images:
        return Dropped(sample.sample_id, "too_many_images", f"{sample.image_count} images > max_images "
                       f"{max_images}; raise --max-images or pass --split-long-documents to cut it into pieces")
    return None


class SpoolWriter:
    """Samples of one unit of work, appended to ``spool/{i}.bin``; ``spool/{i}.meta`` (the
    integers the driver plans with) appears only when :meth:`finish` completes.

    ``work`` is the job's work folder, a path or URL; a remote ``.bin`` is uploaded as it is
    written and appears when closed.
    """

    def __init__(self, work: str, i: int) -> None:
        self._work, self._i = Location(work), i
        self._f = self._work.open_write("spool", _bin_name(i))
        self._pos = 0
        self._ids: list[str] = []
        # tokens, images, image bytes, offset, length, image tokens, targets
        self._ints: list[tuple[int, ...]] = []
        self._dropped: list[Dropped] = []
        self.records = 0

    def add(self, sample_id: str, input_ids: np.ndarray, loss_mask: np.ndarray, images: Sequence[bytes],
            image_tokens: Sequence[int]) -> None:
        self.records += 1
        blob = msgpack.packb([sample_id, np.asarray(input_ids).astype("<u4").tobytes(),
                              np.asarray(loss_mask).astype(np.uint8).tobytes(), list(images),
                              [int(t) for t in image_tokens]], use_bin_type=True)
        mask = np.asarray(loss_mask)
        targets = int(mask[1:].sum()) if mask.size else 0  # a sub-sample's first token is never a target
        self._ints.append((len(input_ids), len(images), sum(len(b) for b in images), self._pos, len(blob),
                           sum(int(t) for t in image_tokens), targets))
        self._f.write(blob)
        self._pos += len(blob)
        self._ids.append(sample_id)

    def drop(self, d: Dropped) -> None:
        self.records += 1
        self._dropped.append(d)

    def finish(self, describe: dict[str, Any]) -> None:
        if not self._work.remote:
            self._f.flush()
            os.fsync(self._f.fileno())
        self._f.close()
        cols = np.asarray(self._ints, np.int64).reshape(-1, 7).T
        meta = {
            "ids": self._ids, "records": self.records, "describe": describe,
            "tokens": cols[0].tobytes(), "images": cols[1].tobytes(), "image_bytes": cols[2].tobytes(),
            "offsets": cols[3].tobytes(), "lengths": cols[4].tobytes(), "image_tokens": cols[5].tobytes(),
            "targets": cols[6].tobytes(),
            "dropped": [[d.sample_id, d.reason, d.detail] for d in self._dropped],
        }
        self._work.write_atomic(f"spool/{_meta_name(self._i)}", msgpack.packb(meta, use_bin_type=True))

    def __enter__(self) -> SpoolWriter:
        return self

    def __exit__(self, *exc) -> None:
        if not self._f.closed:
            self._f.close()


def _on_drop(d: Dropped, on_error: str) -> None:
    if on_error == "raise":
        raise SampleError(d.reason, f"{d.detail} (pass --on-error skip to drop such samples and go on)",
                          sample_id=d.sample_id)


# ---------------------------------------------------------------------------------------------
# Select and plan: integers only


def _namespace(m: _Measured, part: np.ndarray, source_names: Sequence[str]) -> None:
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


def _select(m: _Measured, config: PackConfig, *, source_names: Sequence[str] = ()) -> dict[str, Any]:
    """Concatenate the arrays, name ids that collide across sources by their source, drop
    duplicates and samples over a budget (with reasons)."""
    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64)  # noqa: E731
    tok, img, part = cat(m.tokens), cat(m.images), cat(m.part)
    _namespace(m, part, source_names)
    several = len(set(source_names)) > 1
    keep = np.ones(tok.size, bool)
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
        if tok[j] > config.seq_len:
            keep[j] = False
            dropped.append(Dropped(sid, "too_long", f"{int(tok[j])} tokens > seq_len {config.seq_len}; "
                                   "raise --seq-len to keep it"))
        elif config.max_images is not None and img[j] > config.max_images:
            keep[j] = False
            dropped.append(Dropped(sid, "too_many_images", f"{int(img[j])} images > max_images "
                                   f"{config.max_images}; raise --max-images to keep it"))
    if config.on_error == "raise" and dropped:
        d = dropped[0]
        # a duplicate is fixed in the ids: dropping it would lose a record silently
        skip = "" if d.reason == "duplicate_id" else " (or pass --on-error skip)"
        raise SampleError(d.reason, f"{d.detail}{skip}", sample_id=d.sample_id)
    table = {"ids": m.ids, "tokens": tok, "images": img, "part": part, "offset": cat(m.offset),
             "length": cat(m.length), "image_bytes": cat(m.image_bytes), "image_tokens": cat(m.image_tokens),
             "targets": cat(m.targets), "keep": keep, "dropped": dropped}
    for column in (m.tokens, m.images, m.part, m.offset, m.length, m.image_bytes, m.image_tokens, m.targets):
        column.clear()  # the per-partition pieces: the table holds them now, once
    return table


def _check_drops(out: Location, m: _Measured, table: dict[str, Any], config: PackConfig, *,
                 carried: Sequence[Dropped]) -> None:
    """Fail a job that packs nothing or drops more than its tolerance, after writing ``dropped.jsonl``.

    Drops inherited from an earlier job (``carried``, reshard) were accepted there and do not count.
    The work folder is kept: the same command with ``--resume`` and a higher ``--max-drop-fraction``
    plans and writes from the samples already tokenized.
    """
    new = m.dropped + table["dropped"]
    total, packed = m.records, int(table["keep"].sum())
    limit = config.max_drop_fraction
    fraction = len(new) / total if total else 0.0
    if packed and (limit is None or fraction <= limit):
        return
    _write_dropped(out, [*carried, *new])
    listing = out.join(DROPPED_NAME)
    if not total:
        raise TooManyDropsError("no samples were read from the sources, so nothing was packed; check the "
                                "SOURCE paths or globs (and that the files are not empty)")
    counts = Counter(d.reason for d in new)
    example = {}
    for d in new:
        example.setdefault(d.reason, d)
    top = counts.most_common(_DROP_EXAMPLES)
    width = max(len(reason) for reason, _ in top)
    lines = [f"  {reason:<{width}} {n:>7}  e.g. {example[reason].sample_id!r}: {example[reason].detail}"
             for reason, n in top]
    if len(counts) > _DROP_EXAMPLES:
        lines.append(f"  ... and {len(counts) - _DROP_EXAMPLES} more reasons")
    if not packed:
        head = f"nothing was packed: all {total} samples read were dropped (listed in {listing}):"
        fix = ("fix the inputs: a layout wdspack does not read (see the Sources table in the README), a wrong "
               "--image-root, or a --seq-len / --max-images too small for every sample")
    else:
        accept = min(1.0, math.ceil(fraction * 100) / 100)
        head = (f"{len(new)} of {total} samples read ({fraction:.1%}) were dropped, over the tolerance "
                f"--max-drop-fraction {limit:g}; nothing was written but {listing}:")
        fix = (f"fix the inputs (a wrong --image-root? a layout wdspack does not read?), or accept these drops: "
               f"run the same command with --resume --max-drop-fraction {accept:g} (the tokenized samples are kept)")
        if counts["duplicate_id"]:  # never accepted by a tolerance: each one is a record lost
            fix = (f"{counts['duplicate_id']} records reuse the id of an earlier record of their own source "
                   "(duplicate_id): fix the ids, not the tolerance: give every record its own 'id', or remove "
                   "the 'id' fields (records without one are named '{file}:{row}'). The same id in two sources "
                   "needs no fix: each is packed as '{source}/{id}'. Then pack again into a new --output"
                   + (" (and fix the inputs of the other drops)" if len(counts) > 1 else ""))
    raise TooManyDropsError("\n".join([head, *lines, fix]))


def _plan(table: dict[str, Any], config: PackConfig) -> list[np.ndarray]:
    """Packs as arrays of sample indices (into the table), in a seeded shuffled order."""
    keep = np.flatnonzero(table["keep"])
    packs = plan_packs(table["tokens"][keep], table["images"][keep], seq_len=config.seq_len,
                       max_images=config.max_images, algorithm=config.algorithm, seed=config.seed)
    # Shuffle packs so each shard mixes long and short samples (planners emit them sorted).
    order = np.random.default_rng(config.seed).permutation(len(packs))
    return [keep[np.asarray(packs[k], np.int64)] for k in order]


def _assign_shards(plan, table, config: PackConfig, *, token_itemsize: int) -> list[list[np.ndarray]]:
    """Cut the pack sequence into shards by estimated bytes and/or pack count."""
    shards: list[list[np.ndarray]] = []
    current: list[np.ndarray] = []
    size = 0
    for pack in plan:
        est = (_PACK_OVERHEAD + int(table["tokens"][pack].sum()) * (token_itemsize + 1)
               + int(table["image_bytes"][pack].sum()) + _SAMPLE_OVERHEAD * pack.size)
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
    for j, packs in enumerate(shard_plans):
        name = shard_name(config.split, j)
        if name in present:  # renamed into place only when complete, and the plan is the same
            infos[j], offsets[j] = _info_of_existing(out, name, packs, table)
        else:
            todo.append((j, out.join(name)))
    kept = len(infos)
    # Built lazily: the executor holds the sample refs of the shards in flight, not of all of them.
    # Each ref carries the sample's id as the table has it (an id two sources share is namespaced).
    tasks = ((j, [[(int(table["part"][s]), int(table["offset"][s]), int(table["length"][s]), table["ids"][s])
                   for s in pack] for pack in shard_plans[j]], str(work), path, token_dtype) for j, path in todo)
    for j, info, where in _run(_write_shard, tasks, config, total=len(todo), desc="write", unit="shard",
                               progress=progress):
        infos[j], offsets[j] = info, where
    return [infos[j] for j in range(len(shard_plans))], [offsets[j] for j in range(len(shard_plans))], kept


def _write_shard(j: int, refs, work: str, path: str, token_dtype: str) -> tuple[int, ShardInfo, list[int]]:
    """Assemble and write one shard; keys are ``{shard:06d}{pack:06d}``."""
    with _SpoolReader(work) as spool, ShardWriter(path) as writer:
        for k, pack_refs in enumerate(refs):
            samples = spool.read(pack_refs)
            for sample, ref in zip(samples, pack_refs):
                sample[0] = ref[3]  # the id the job gave it (the spool holds the source's own)
            pack = _assemble(samples)
            writer.add(f"{j:06d}{k:06d}", encode_pack(pack, token_dtype=token_dtype),
                       samples=pack.num_samples, tokens=pack.num_tokens, images=pack.num_images)
        return j, writer.close(), writer.offsets


class _SpoolReader:
    """Spooled samples read back by ``(part, offset, length)``: local spool files stay open; the
    samples of one pack in a remote spool are fetched together (concurrent ranged reads)."""

    def __init__(self, work: str) -> None:
        self._work = Location(work)
        self._files: dict[int, Any] = {}

    def read(self, refs: Sequence[tuple[int, int, int]]) -> list[list[Any]]:
        if self._work.remote:
            blobs = self._work.read_ranges([f"spool/{_bin_name(r[0])}" for r in refs],
                                           [r[1] for r in refs], [r[1] + r[2] for r in refs])
        else:
            blobs = []
            for part, offset, length, *_ in refs:
                f = self._files.get(part)
                if f is None:
                    f = self._files[part] = open(self._work.join("spool", _bin_name(part)), "rb")
                f.seek(offset)
                blobs.append(f.read(length))
        return [msgpack.unpackb(b, raw=False) for b in blobs]

    def __enter__(self) -> _SpoolReader:
        return self

    def __exit__(self, *exc) -> None:
        for f in self._files.values():
            f.close()


def _assemble(samples: Sequence[list[Any]]) -> Pack:
    """Concatenate spooled samples ``[id, ids, mask, images, image_tokens]`` into one pack."""
    ids = [np.frombuffer(s[1], "<u4") for s in samples]
    images, image_sample, image_tokens = [], [], []
    for k, s in enumerate(samples):
        images.extend(s[3])
        image_sample.extend([k] * len(s[3]))
        image_tokens.extend(s[4])
    return Pack(
        input_ids=np.concatenate(ids), loss_mask=np.concatenate([np.frombuffer(s[2], np.uint8) for s in samples]),
        seq_lens=tuple(len(x) for x in ids), sample_ids=tuple(s[0] for s in samples),
        images=tuple(images), image_sample=tuple(image_sample), image_tokens=tuple(image_tokens),
    )


def _info_of_existing(out: Location, name: str, packs, table) -> tuple[ShardInfo, list[int]]:
    h = hashlib.sha256()
    with out.open_read(name) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    with out.open_read(name) as f:
        offsets = member_offsets(f, where=str(out.join(name)))
    idx = np.concatenate(packs)
    info = ShardInfo(name=name, packs=len(packs), samples=int(idx.size),
                     tokens=int(table["tokens"][idx].sum()), images=int(table["images"][idx].sum()),
                     bytes=out.size(name), sha256=h.hexdigest())
    return info, offsets


# ---------------------------------------------------------------------------------------------
# Manifest


def _write_dropped(out: Location, dropped: Iterable[Dropped]) -> None:
    text = "".join(json.dumps(d.to_json(), ensure_ascii=False) + "\n" for d in dropped)
    out.write_atomic(DROPPED_NAME, text.encode())


def _build_manifest(sources, config: PackConfig, describe, infos, records: int, dropped: list[Dropped],
                    extra: dict[str, Any], *, pack_index: dict[str, Any], max_samples_per_pack: int,
                    max_images_per_pack: int, max_image_tokens_per_pack: int) -> Manifest:
    packs = sum(i.packs for i in infos)
    tokens = sum(i.tokens for i in infos)
    by_reason = dict(sorted(Counter(d.reason for d in dropped).items()))
    totals = {
        "samples_read": records, "samples_packed": sum(i.samples for i in infos),
        "samples_dropped": len(dropped), "dropped_by_reason": by_reason, "packs": packs,
        "tokens": tokens, "images": sum(i.images for i in infos),
        "fill_ratio": round(tokens / (packs * config.seq_len), 6) if packs else 0.0,
        "bytes": sum(i.bytes for i in infos),
        # the loader sizes cu_seqlens from it (static shapes): B × (this + 1) segments at most
        "max_samples_per_pack": max_samples_per_pack,
        # the loader's image slots when packed without --max-images (max_images None): no limit, no waste
        "max_images_per_pack": max_images_per_pack,
        # model-ready loaders size their pixel tensors from it (static shapes, no more than needed)
        "max_image_tokens_per_pack": max_image_tokens_per_pack,
    }
    provenance = {"shard_max_bytes": config.shard_max_bytes, "shard_max_packs": config.shard_max_packs,
                  "on_error": config.on_error, **extra}
    return Manifest(
        seq_len=config.seq_len, max_images=config.max_images, algorithm=config.algorithm, seed=config.seed,
        tokenizer=describe["tokenizer"], image_policy=describe["image_policy"], shards=tuple(infos),
        totals=totals, split=config.split, sources=tuple(str(s) for s in sources), provenance=provenance,
        wdspack_version=__version__, pack_index=pack_index,
    )


def _summary_from_manifest(out: Location, seconds: float) -> PackSummary:
    m = Manifest.from_json(out.read_bytes(MANIFEST_NAME))
    t = m.totals
    return PackSummary(output=str(out), samples_read=t["samples_read"], samples_packed=t["samples_packed"],
                       dropped_by_reason=t["dropped_by_reason"], packs=t["packs"], tokens=t["tokens"],
                       images=t["images"], fill_ratio=t["fill_ratio"], shards=len(m.shards),
                       bytes=sum(s.bytes for s in m.shards), seconds=seconds, resumed_shards=len(m.shards),
                       image_policy=m.image_policy)


# ---------------------------------------------------------------------------------------------
# Execution


def _run(fn: Callable[..., Any], tasks: Iterable[tuple], config: PackConfig, *, total: int, desc: str,
         unit: str, progress: bool) -> Iterable[Any]:
    """Run ``fn(*task)`` for each task where ``config`` says, yielding results in order; progress moves
    as tasks complete: a bar on a terminal, elsewhere (Slurm, nohup, CI) a plain line every
    ``WDSPACK_PROGRESS_INTERVAL`` seconds (:class:`~wdspack.executors.ProgressLog`)."""
    from tqdm import tqdm

    terminal = sys.stderr.isatty()
    bar = tqdm(total=total, desc=desc, unit=unit, disable=not (progress and terminal), leave=False)
    log = ProgressLog(desc, unit, total=total, interval=progress_interval()) if progress and not terminal else None

    def done() -> None:
        bar.update()
        if log is not None:
            log.update()

    try:
        yield from run_tasks(fn, tasks, executor=config.executor, workers=config.workers,
                             ray_address=config.ray_address, on_done=done)
    finally:
        bar.close()
        if log is not None:
            log.close()


def _human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"
