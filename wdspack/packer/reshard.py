"""Re-pack a packed dataset for a new sequence length or image budget, without the raw data.

Packs are split back into their sub-samples at the boundaries stored in each pack (tokens,
loss masks and image bytes carried over untouched: no tokenizer), re-planned with the new
budgets and written as a new dataset whose manifest records where it came from.

Memory: the source is streamed one shard at a time; each task holds one source pack (at most
``seq_len`` tokens and ``max_images`` images) and the driver holds about 40 bytes plus the id
per sample (integer arrays for planning), never payloads. Samples are spooled to the output's
work folder on disk (about the size of the source) and removed when the manifest is written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tarfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from .._version import __version__
from ..errors import Dropped, FormatError
from ..format.dataset import open_dataset
from ..format.pack import decode_pack
from ..storage.location import Location
from .config import PackConfig, PackSummary
from .job import run_job
from .spool import SpoolWriter

__all__ = ["reshard_dataset"]


def reshard_dataset(source: str, output: str | Path, *, config: PackConfig, resume: bool = False,
                    progress: bool = False) -> PackSummary:
    """Re-plan the samples of ``source`` (a folder, ``https://`` or ``hf://`` dataset) into ``output``.

    Samples dropped by the source job stay dropped (their entries are carried over), so the new
    manifest's counts still add up to the samples originally read; the summary's
    ``carried_by_reason`` tells them from the drops of this reshard (samples over the new budgets).

    Example:
        >>> reshard_dataset("packed-2048", "packed-4096", config=PackConfig(seq_len=4096))  # doctest: +SKIP
    """
    start = time.perf_counter()
    manifest, root = open_dataset(str(source))
    describe = {"tokenizer": manifest.tokenizer, "image_policy": manifest.image_policy}
    carried = _read_carried(root, manifest.dropped_file)
    fingerprint = hashlib.sha256(json.dumps(
        {"source": manifest.to_json(), "config": config.output_fields(), "version": __version__},
        sort_keys=True).encode()).hexdigest()
    tasks = [(i, f"{root}/{shard.name}", describe) for i, shard in enumerate(manifest.shards)]
    provenance = {"resharded_from": {"source": str(source), "seq_len": manifest.seq_len,
                                     "max_images": manifest.max_images, "algorithm": manifest.algorithm,
                                     "sources": list(manifest.sources)}}
    totals = manifest.totals
    summary = run_job(Location(output), fingerprint, _split_shard, tasks, config, describe=lambda: describe,
                      sources=manifest.sources, provenance=provenance, resume=resume, progress=progress,
                      start=start, carried=carried, samples_read=totals["samples_read"],
                      records_read=totals.get("records_read", totals["samples_read"]), reshard=True)
    return dataclasses.replace(summary, carried_by_reason=dict(sorted(Counter(d.reason for d in carried).items())))


def _split_shard(i: int, url: str, describe: dict, work: str) -> int:
    """Stream one source shard and spool each sub-sample of each pack."""
    import fsspec

    with SpoolWriter(work, i) as spool:
        with fsspec.open(url, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
            for member in tar:
                if not (member.isfile() and member.name.endswith(".mp")):
                    continue
                data = tar.extractfile(member)
                assert data is not None  # a regular file
                pack = decode_pack(data.read())
                bounds = np.cumsum((0,) + pack.seq_lens)
                for k, sid in enumerate(pack.sample_ids):
                    owned = {name: items.keep([j for j, owner in enumerate(items.sample) if owner == k])
                             for name, items in pack.media.items()}
                    span = slice(int(bounds[k]), int(bounds[k + 1]))
                    spool.add(sid, pack.input_ids[span], pack.loss_mask[span], owned)
        spool.finish(describe)
    return i


def _read_carried(root: str, name: str) -> list[Dropped]:
    import fsspec

    try:
        with fsspec.open(f"{root}/{name}", "rt", encoding="utf-8") as f:
            entries = [json.loads(line) for line in f if line.strip()]
        return [Dropped(d["id"], d["reason"], d.get("detail", "")) for d in entries]
    except FileNotFoundError:
        raise FormatError(f"{root}/{name} is missing: the source dataset is incomplete") from None
