"""The pack job's output folder: what it holds before a job starts, and its work folder.

    check_output (read only, before anything loads) ─► "new" | "done" | "resume" | "stale" | "failed"
        ─► prepare_output: the work folder OUTPUT/.wdspack-work/ (job.json: the fingerprint, and
           "failed" once a job failed with an error of wdspack's: mark_failed)

Holds: a finished dataset or an interrupted job with finished work is never overwritten; a job that
wrote nothing, or failed before writing a shard, blocks nothing; ``--resume`` continues only the job
whose fingerprint (:func:`fingerprint`: inputs, sample and pack settings, wdspack's version) matches.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import msgpack

from .._version import __version__
from ..errors import OutputError
from ..format.manifest import DROPPED_NAME, MANIFEST_NAME, ShardInfo
from ..storage.location import Location, stat_tag
from .config import PackConfig
from .samples import SampleConfig
from .sources import Partition

__all__ = ["WORK_DIR", "check_output", "fingerprint", "info_row", "mark_failed", "prepare_output", "read_shard",
           "record_shard", "recorded_shards"]

logger = logging.getLogger(__name__)

WORK_DIR = ".wdspack-work"


def fingerprint(partitions: Sequence[Partition], sample_config: SampleConfig, config: PackConfig) -> str:
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


def check_output(out: Location, fingerprint: str, *, resume: bool) -> str:
    """What the output folder holds, read only, before anything loads; the refusals raise ``OutputError``.

    ``"done"``: a complete dataset, kept under ``--resume``; ``"stale"``: an unfinished job that wrote nothing
    (no tokenized unit of work, no shard: it was stopped at once), started over whatever its arguments;
    ``"failed"``: a job that failed (an error of wdspack's: drop tolerance, nothing packed, a usage error met
    in a record) before writing a shard, started over unless ``--resume`` names the same job (then its
    tokenized samples are kept) — so a corrected re-run needs no ``--resume`` and no deleting; ``"resume"``:
    an interrupted or crashed job with finished work, kept for ``--resume`` with the same arguments;
    ``"new"``: an empty or missing folder.
    """
    work = out.child(WORK_DIR)
    job = json.loads(work.read_bytes("job.json")) if work.exists("job.json") else None
    if out.exists(MANIFEST_NAME):
        if resume and (job is None or job["fingerprint"] == fingerprint):
            return "done"
        raise OutputError(f"{out} already holds a packed dataset; choose another --output or delete it")
    unfinished = work.exists() and (job is not None or not out.remote)
    if unfinished and (job or {}).get("failed") and not _wrote_shard(out):
        return "resume" if resume and (job or {}).get("fingerprint") == fingerprint else "failed"
    if unfinished and not _wrote_anything(out, work):
        return "stale"
    if unfinished:
        if not resume:
            raise OutputError(f"{out} holds an unfinished pack job; pass --resume to continue it, "
                              "or delete the folder to start over")
        if (job or {}).get("fingerprint") != fingerprint:
            raise OutputError(f"--resume: the unfinished job in {out} was started with other inputs or "
                              "arguments; re-run it with the same ones, or delete the folder to start over")
        return "resume"
    if not out.is_empty():
        raise OutputError(f"{out} exists and is not empty; choose a new --output folder")
    return "new"


def prepare_output(out: Location, fingerprint: str, state: str) -> Location | None:
    """Set the output folder up for its ``state`` (:func:`check_output`'s answer); return the work folder,
    or None if already complete."""
    work = out.child(WORK_DIR)
    if state == "done":
        out.remove(WORK_DIR)
        return None
    if state == "stale":
        logger.warning("wdspack: %s holds an unfinished pack job that wrote nothing yet (no tokenized partition, "
                       "no shard); starting it over", out)
    elif state == "failed":
        logger.warning("wdspack: %s holds what a failed pack job left (no shard); starting over (--resume with "
                       "the failed command's arguments keeps its tokenized samples)", out)
    if state in ("stale", "failed"):
        out.remove(WORK_DIR)
        out.remove(DROPPED_NAME)
    work.makedirs("spool")
    work.write_atomic("job.json", json.dumps({"fingerprint": fingerprint}).encode())  # a resumed failure: cleared
    return work


def mark_failed(work: Location, fingerprint: str, error: Exception) -> None:
    """Record in ``job.json`` that the job failed with an error of wdspack's (not interrupted, not crashed):
    the next command in this folder starts over unless it resumes this job (:func:`check_output`)."""
    try:
        reason = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
        work.write_atomic("job.json", json.dumps({"fingerprint": fingerprint, "failed": reason}).encode())
    except OSError:  # the folder is gone or read-only: the failure itself is what the user must see
        logger.debug("could not record the failure in %s", work, exc_info=True)


def _wrote_shard(out: Location) -> bool:
    """Whether the job renamed a shard into place (the only output worth keeping across arguments)."""
    return any(name.endswith(".tar") for name in out.listdir(""))


def _wrote_anything(out: Location, work: Location) -> bool:
    """Whether an unfinished job left work worth resuming: a finished spool unit (its ``.meta`` appears
    last) or anything in the output besides the work folder (shards, ``dropped.jsonl``)."""
    return (any(name.endswith(".meta") for name in work.listdir("spool"))
            or bool(out.listdir("") - {WORK_DIR}))


def info_row(info: ShardInfo) -> list[Any]:
    """A shard's manifest entry as the work folder keeps it: its fields in order (``ShardInfo(*row)``)."""
    return info.row()


def record_shard(work: Location, info: ShardInfo, offsets: Sequence[int]) -> None:
    """``shards/{name}.info``: a shard's manifest entry and its packs' offsets as its writer counted them, written
    before the shard takes its final name (:meth:`~wdspack.format.tar.ShardWriter.close`), so a resumed job
    knows every shard it finds from what it wrote, without reading the shard again."""
    work.write_atomic(f"shards/{info.name}.info", msgpack.packb([info_row(info), [int(o) for o in offsets]],
                                                           use_bin_type=True))


def recorded_shards(work: Location) -> set[str]:
    """The shards whose entries :func:`record_shard` wrote."""
    return {name.removesuffix(".info") for name in work.listdir("shards") if name.endswith(".info")}


def read_shard(work: Location, name: str) -> tuple[ShardInfo, list[int]]:
    """The entry and offsets :func:`record_shard` wrote for shard ``name``."""
    row, offsets = msgpack.unpackb(work.read_bytes("shards", f"{name}.info"), raw=False)
    return ShardInfo(*row), offsets
