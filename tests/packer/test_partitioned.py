"""Partitioned planning (``PackConfig(plan_group_partitions=N)``): groups planned and written by tasks.

The demo job packed in groups holds the same samples as the global plan, passes ``verify --source``,
is byte-identical across runs and after a crash + resume; duplicate ids across groups are dropped as
the global plan drops them; on a moderate synthetic job the fill is within 0.1 % of the global plan.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from tests.support.demo import demo_sources, read_files
from tests.support.driver_memory import DESCRIBE, spool
from wdspack.errors import ConfigError, Dropped, TooManyDropsError
from wdspack.format.manifest import read_manifest
from wdspack.format.pack import decode_pack
from wdspack.ops.verify import verify_dataset
from wdspack.packer import partitioned
from wdspack.packer.config import PackConfig, RunOptions
from wdspack.packer.job import WORK_DIR, pack_dataset, run_job
from wdspack.packer.spool import SpoolWriter
from wdspack.storage.location import Location


def _config(**kw):
    base = dict(seq_len=2048, max_images=6, shard_max_bytes=150_000, records_per_partition=40)
    return PackConfig(**{**base, **kw})


def _read_packs(root: Path):
    for shard in read_manifest(root).shards:
        with tarfile.open(root / shard.name) as tar:
            for m in tar.getmembers():
                yield decode_pack(tar.extractfile(m).read())


def _grouped(**kw):
    return _config(plan_group_partitions=2, records_per_partition=10, **kw)


@pytest.fixture(scope="module")
def grouped(demo_data, sample_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("grouped") / "ds"
    return out, pack_dataset(demo_sources(demo_data)[:1], out, sample_config=sample_config, config=_grouped())


@pytest.fixture(scope="module")
def global_plan(demo_data, sample_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("global") / "ds"
    return out, pack_dataset(demo_sources(demo_data)[:1], out, sample_config=sample_config,
                             config=_config(records_per_partition=10))


def _samples(root: Path) -> dict[str, tuple]:
    got = {}
    for pack in _read_packs(root):
        starts = np.cumsum((0,) + pack.seq_lens)
        for k, sid in enumerate(pack.sample_ids):
            owned = [i for i, owner in enumerate(pack.image_sample) if owner == k]
            got[sid] = (pack.input_ids[starts[k]:starts[k + 1]].tobytes(),
                        pack.loss_mask[starts[k]:starts[k + 1]].tobytes(), tuple(pack.images[i] for i in owned))
    return got


def test_groups_hold_the_global_plans_samples_and_verify(grouped, global_plan, demo_data):
    (out, summary), (ref, ref_summary) = grouped, global_plan
    manifest = read_manifest(out)
    assert len({s.name.split("-")[1] for s in manifest.shards}) > 1, "several groups wrote shards"
    assert all(s.name.startswith("train-") and s.name.endswith(".tar") for s in manifest.shards)
    assert _samples(out) == _samples(ref)
    dropped = sorted(json.loads(line)["id"] for line in (out / "dropped.jsonl").read_text().splitlines())
    ref_dropped = sorted(json.loads(line)["id"] for line in (ref / "dropped.jsonl").read_text().splitlines())
    assert dropped == ref_dropped and dropped
    t, rt = manifest.totals, read_manifest(ref).totals
    for key in ("samples_read", "samples_packed", "samples_dropped", "dropped_by_reason", "tokens", "images"):
        assert t[key] == rt[key], key
    assert summary.samples_read == ref_summary.samples_read
    assert not (out / WORK_DIR).exists()
    assert verify_dataset(str(out), sources=demo_sources(demo_data)[:1]) == []


def test_same_inputs_same_bytes_and_resume_after_a_crash(grouped, demo_data, sample_config, tmp_path, monkeypatch):
    out, _ = grouped
    again = tmp_path / "again"
    pack_dataset(demo_sources(demo_data)[:1], again, sample_config=sample_config, config=_grouped())
    assert read_files(again) == read_files(out)

    crashy, real, calls = tmp_path / "crashy", partitioned._plan_task, []

    def crash_on_second(*args):
        calls.append(args[0])
        if len(calls) == 2:
            raise RuntimeError("killed")
        return real(*args)

    monkeypatch.setattr(partitioned, "_plan_task", crash_on_second)
    with pytest.raises(RuntimeError, match="killed"):
        pack_dataset(demo_sources(demo_data)[:1], crashy, sample_config=sample_config, config=_grouped())
    assert not (crashy / "manifest.json").exists()
    monkeypatch.setattr(partitioned, "_plan_task", real)
    pack_dataset(demo_sources(demo_data)[:1], crashy, sample_config=sample_config, config=_grouped(), resume=True)
    assert read_files(crashy) == read_files(out)


def test_drop_tolerance_and_several_sources(demo_data, sample_config, tmp_path):
    with pytest.raises(TooManyDropsError, match=r"over the tolerance --max-drop-fraction 0\.001"):
        pack_dataset(demo_sources(demo_data)[:1], tmp_path / "ds", sample_config=sample_config,
                     config=_grouped(run=RunOptions(max_drop_fraction=0.001)))
    assert (tmp_path / "ds" / "dropped.jsonl").read_text().count("\n") >= 3
    assert not list((tmp_path / "ds").glob("*.tar")) and not (tmp_path / "ds" / "manifest.json").exists()
    with pytest.raises(ConfigError, match="plan_group_partitions"):
        PackConfig(seq_len=64, plan_group_partitions=-1)


def _spool_ids(out: Location, ids_per_part: list[list[str]], lens: list[list[int]],
              drops: dict[int, list[str]] | None = None) -> None:
    work = out.child(WORK_DIR)
    work.makedirs("spool")
    work.write_atomic("job.json", json.dumps({"fingerprint": "synthetic"}).encode())
    tokens, mask = np.arange(400, dtype=np.uint32), np.ones(400, np.uint8)
    for i, (ids, ns) in enumerate(zip(ids_per_part, lens)):
        with SpoolWriter(str(work), i) as w:
            for sid, n in zip(ids, ns):
                w.add(sid, tokens[:n], mask[:n])
            for sid in (drops or {}).get(i, []):
                w.drop(Dropped(sid, "unreadable_image", "image 0 cannot be decoded"))
            w.finish(DESCRIBE)


def _job(folder: Path, parts: int, config: PackConfig, fingerprint: str = "synthetic", source_names=()):
    return run_job(Location(folder), fingerprint, lambda *a: None, [(i,) for i in range(parts)], config,
                   describe=lambda: DESCRIBE, sources=["synthetic"], provenance={}, resume=True, progress=False,
                   start=0.0, source_names=source_names)


def test_duplicate_ids_across_groups_are_dropped_like_the_global_plan(tmp_path):
    # ids repeat within a partition, across partitions of one group and across groups
    ids = [["a", "b", "a"], ["c", "b"], ["d", "a"], ["c", "e"], ["f", "d"]]
    lens = [[10, 20, 30], [40, 50], [60, 70], [80, 90], [100, 110]]
    results = {}
    for name, group in (("global", None), ("grouped", 2)):
        _spool_ids(Location(tmp_path / name), ids, lens)
        config = PackConfig(seq_len=256, plan_group_partitions=group, run=RunOptions(max_drop_fraction=1))
        _job(tmp_path / name, len(ids), config)
        lines = (tmp_path / name / "dropped.jsonl").read_text().splitlines()
        results[name] = sorted((d["id"], d["reason"]) for d in map(json.loads, lines))
        results[name + "_kept"] = sorted(s for p in _read_packs(tmp_path / name) for s in p.sample_ids)
        results[name + "_tokens"] = read_manifest(tmp_path / name).totals["tokens"]
    assert results["grouped"] == results["global"] == [("a", "duplicate_id")] * 2 + [
        ("b", "duplicate_id"), ("c", "duplicate_id"), ("d", "duplicate_id")]
    assert results["grouped_kept"] == results["global_kept"] == ["a", "b", "c", "d", "e", "f"]
    # the first copy is kept: a(10) b(20) c(40) d(60) e(90) f(100)
    assert results["grouped_tokens"] == results["global_tokens"] == 10 + 20 + 40 + 60 + 90 + 100


def test_ids_two_sources_share_are_namespaced_like_the_global_plan(tmp_path):
    # x: in A twice and in B; y: a sample in A, a measure drop in B; doc: pieces in A and B;
    # w: in B and C; z: twice in A only (a plain duplicate)
    ids = [["x", "y", "x"], ["z", "doc#0", "doc#1"], ["x", "w"], ["doc#0", "v"], ["w", "u"], ["u2", "z"]]
    lens = [[10] * len(p) for p in ids]
    sources = ["A", "A", "B", "B", "C", "A"]
    results = {}
    for name, group in (("global", None), ("grouped", 2)):
        _spool_ids(Location(tmp_path / name), ids, lens, drops={3: ["y"]})
        config = PackConfig(seq_len=256, plan_group_partitions=group, run=RunOptions(max_drop_fraction=1))
        _job(tmp_path / name, len(ids), config, source_names=sources)
        lines = (tmp_path / name / "dropped.jsonl").read_text().splitlines()
        results[name] = sorted((d["id"], d["reason"], d["detail"]) for d in map(json.loads, lines))
        results[name + "_kept"] = sorted(s for p in _read_packs(tmp_path / name) for s in p.sample_ids)
    assert results["grouped_kept"] == results["global_kept"] == sorted(
        ["A/x", "A/y", "z", "A/doc#0", "A/doc#1", "B/x", "B/w", "B/doc#0", "v", "C/w", "u", "u2"])
    assert [d[:2] for d in results["grouped"]] == [("A/x", "duplicate_id"), ("B/y", "unreadable_image"),
                                                   ("z", "duplicate_id")]
    assert results["grouped"] == results["global"]
    assert "id 'A/x' is used by more than one record of source 'A'" in results["grouped"][0][2]
    # one source: nothing is renamed, and no sources file is written
    _spool_ids(Location(tmp_path / "one"), ids, lens)
    _job(tmp_path / "one", len(ids), PackConfig(seq_len=256, plan_group_partitions=2,
                                                run=RunOptions(max_drop_fraction=1)), source_names=["A"] * len(ids))
    assert sorted(s for p in _read_packs(tmp_path / "one") for s in p.sample_ids) == [
        "doc#0", "doc#1", "u", "u2", "v", "w", "x", "y", "z"]


@pytest.mark.slow  # two 200 k-sample jobs
def test_fill_within_a_tenth_of_a_percent_of_the_global_plan(tmp_path):
    n = 200_000
    fills = {}
    for name, group in (("global", None), ("grouped", 10)):
        spool(Location(tmp_path / name), n)  # 50 partitions of 4 000 samples, 20-400 tokens each
        config = PackConfig(seq_len=4096, shard_max_bytes=20_000_000, plan_group_partitions=group)
        fills[name] = _job(tmp_path / name, 50, config, "driver-memory").fill_ratio
    assert fills["global"] > 0.99
    assert fills["global"] - fills["grouped"] <= 0.001, fills


def test_cli_plan_groups(demo_data, tekken_dir, tmp_path):
    from wdspack.cli import main

    template = Path(__file__).resolve().parents[2] / "examples" / "chat_templates" / "pixtral.jinja"
    out = tmp_path / "cli"
    assert main(["pack", demo_sources(demo_data)[0], "--output", str(out), "--tokenizer", str(tekken_dir),
                 "--chat-template", str(template), "--image-token", "[IMG]", "--tokens-per-image", "16",
                 "--seq-len", "2048", "--max-images", "6", "--plan-groups", "1", "--quiet"]) == 0
    names = [s.name for s in read_manifest(out).shards]
    assert names and all(n.startswith("train-000000-") for n in names), names
    assert verify_dataset(str(out), sources=demo_sources(demo_data)[:1]) == []


def test_reshard_into_groups_keeps_every_sample_and_drop(global_plan, tmp_path):
    from wdspack.packer.reshard import reshard_dataset

    ref, _ = global_plan
    out = tmp_path / "resharded"
    summary = reshard_dataset(str(ref), out, config=PackConfig(seq_len=4096, max_images=12, plan_group_partitions=1))
    assert len({s.name.split("-")[1] for s in read_manifest(out).shards}) > 1
    assert _samples(out) == _samples(ref)
    t, rt = read_manifest(out).totals, read_manifest(ref).totals
    assert (t["samples_read"], t["samples_dropped"], t["dropped_by_reason"]) == (
        rt["samples_read"], rt["samples_dropped"], rt["dropped_by_reason"])
    assert summary.samples_packed == rt["samples_packed"]
    assert (out / "dropped.jsonl").read_text() == (ref / "dropped.jsonl").read_text()


def test_several_real_sources_sharing_ids_pack_as_the_global_plan(demo_data, sample_config, tmp_path):
    """The demo's two sources plus a copy of one under another name (every id shared with it):
    grouped, the job packs and drops the global plan's samples under the same names, and verifies."""
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "images").symlink_to(demo_data / "images")
    (copy / "again.jsonl").write_bytes((demo_data / "llava.jsonl").read_bytes())
    sources = [*demo_sources(demo_data), str(copy / "again.jsonl")]
    runs = {}
    for name, config in (("grouped", _grouped()), ("global", _config(records_per_partition=10))):
        pack_dataset(sources, tmp_path / name, sample_config=sample_config, config=config)
        drops = [json.loads(line) for line in (tmp_path / name / "dropped.jsonl").read_text().splitlines()]
        runs[name] = (_samples(tmp_path / name), sorted((d["id"], d["reason"]) for d in drops))
    assert runs["grouped"] == runs["global"]
    ids = set(runs["grouped"][0])
    shared = sorted(i for i in ids if i.endswith("/llava-00000"))  # one per source that holds it
    assert len(shared) == 2 and shared[0] != shared[1] and not any(i.startswith("llava-") for i in ids)
    assert any(i.startswith("msg-") for i in ids)  # ids of one source only keep their name
    assert verify_dataset(str(tmp_path / "grouped"), sources=sources) == []
