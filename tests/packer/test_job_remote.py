"""The pack job with its inputs and output on object storage: a real S3 API (moto) on loopback.

Every test compares against packing the same files on local disk: a job reading ``s3://`` or
writing ``s3://`` (in-process, a spawn pool, or Ray) gives the same shard bytes, and resumes.
"""

from __future__ import annotations

import json
import logging
import sys

import pytest

from tests.support.demo import demo_sources, read_files
from tests.support.s3server import running_s3, upload_folder
from wdspack.errors import ConfigError, OutputError, SourceError, TooManyDropsError
from wdspack.format.manifest import Manifest
from wdspack.packer import job
from wdspack.packer.config import PackConfig, RunOptions
from wdspack.packer.job import pack_dataset
from wdspack.packer.sources import iter_records, list_partitions
from wdspack.storage.location import Location

pytest.importorskip("s3fs")
BUCKET = "wds"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with running_s3(tmp_path_factory.mktemp("s3"), BUCKET) as server_and_fs:
        yield server_and_fs


def _config(run=None, **kw) -> PackConfig:
    run = run or {}
    # conftest's DEMO_PACK, which packed ``local``. 150 demo records hold its 6 deliberately bad ones, and a few
    # are too long: accept the drops
    base = dict(seq_len=2048, max_images=6, shard_max_bytes=150_000, records_per_partition=40)
    base.update(kw, run=RunOptions(max_drop_fraction=1.0, **run))
    return PackConfig(**base)


@pytest.fixture(scope="module")
def local(demo_packed):
    out, summary = demo_packed  # conftest packs the demo once per session
    assert summary.shards >= 3 and summary.samples_dropped > 0
    return out, read_files(out)


@pytest.fixture(scope="module")
def remote_demo(s3, demo_data) -> str:
    _, fs = s3
    upload_folder(fs, demo_data, f"s3://{BUCKET}/demo")
    return f"s3://{BUCKET}/demo"


def _remote_files(fs, url: str) -> dict[str, bytes]:
    """``name -> bytes`` of every object under ``url`` (names relative to it)."""
    prefix = url[len("s3://"):].rstrip("/") + "/"
    fs.invalidate_cache()
    return {p[len(prefix):]: fs.cat_file(p) for p in sorted(fs.find(prefix))}


@pytest.mark.parametrize("workers", [1, 2])
def test_output_on_s3_equals_local(s3, local, demo_data, sample_config, workers):
    _, fs = s3
    url = f"s3://{BUCKET}/out-{workers}"
    summary = pack_dataset(demo_sources(demo_data), url, sample_config=sample_config,
                           config=_config({"workers": workers}))
    assert summary.output == url
    files = _remote_files(fs, url)
    assert files == local[1]  # every shard, the manifest and the dropped list; no work folder, no temp names


def test_inputs_on_s3_equal_local(s3, local, remote_demo, sample_config, tmp_path):
    sources = [f"{remote_demo}/llava.jsonl", f"{remote_demo}/messages.jsonl"]
    out = tmp_path / "from-s3"
    pack_dataset(sources, out, sample_config=sample_config, config=_config())
    files, expected = read_files(out), local[1]
    shards = [n for n in expected if n.endswith(".tar")]
    assert [n for n in files if n.endswith(".tar")] == shards
    assert all(files[n] == expected[n] for n in shards)  # same ids, tokens and image bytes
    got, want = Manifest.from_json(files["manifest.json"]), Manifest.from_json(expected["manifest.json"])
    assert got.shards == want.shards and got.totals == want.totals
    assert got.sources == tuple(sources)

    def drops(data: bytes) -> list[tuple[str, str]]:
        return [(d["id"], d["reason"]) for d in map(json.loads, data.decode().splitlines())]

    assert drops(files["dropped.jsonl"]) == drops(expected["dropped.jsonl"])
    assert "s3://wds/demo/images/does-not-exist.jpg" in files["dropped.jsonl"].decode()  # names the URL it tried


def test_glob_and_folder_urls_list_like_local_paths(s3, tmp_path):
    """A folder tree (JSONL, a JSON array, Parquet, a save_to_disk folder, hidden files) listed
    and read from S3 gives the partitions and records of the same tree on disk."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Dataset

    _, fs = s3
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / ".hidden").mkdir()
    chat = lambda i: [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": f"a{i}"}]  # noqa: E731
    (tree / "a.jsonl").write_text("".join(json.dumps({"conversations": chat(i)}) + "\n" for i in range(25)))
    (tree / "sub" / "b.json").write_text(json.dumps([{"conversations": chat(i)} for i in range(13)]))
    pq.write_table(pa.table({"conversations": [chat(i) for i in range(30)]}), tree / "sub" / "c.parquet",
                   row_group_size=7)
    Dataset.from_dict({"conversations": [chat(i) for i in range(9)]}).save_to_disk(str(tree / "saved"))
    (tree / ".hidden" / "x.jsonl").write_text(json.dumps({"conversations": chat(0)}) + "\n")
    (tree / "dataset_info.json").write_text("{}")
    upload_folder(fs, tree, f"s3://{BUCKET}/tree")

    def listing(sources):
        parts = list_partitions(sources, records_per_partition=10)
        return ([(p.name, p.kind, p.start, p.stop, p.first_row) for p in parts],
                [(r.sample_id, r.messages) for p in parts for r in iter_records(p)])

    for local_source, url in [(str(tree), f"s3://{BUCKET}/tree"), (str(tree / "sub" / "*"), f"s3://{BUCKET}/tree/sub/*")]:
        want, got = listing([local_source]), listing([url])
        assert got == want and len(want[1]) > 0, url
    assert len(listing([str(tree)])[1]) == 25 + 13 + 30 + 9


def test_resume_on_s3_after_a_crash_while_writing(s3, local, remote_demo, sample_config, monkeypatch):
    _, fs = s3
    url = f"s3://{BUCKET}/crashy"
    sources = [f"{remote_demo}/llava.jsonl", f"{remote_demo}/messages.jsonl"]
    real, calls = job._write_shard, []

    def crash_on_third(*args):
        calls.append(args[0])
        if len(calls) == 3:
            raise RuntimeError("killed")
        return real(*args)

    monkeypatch.setattr(job, "_write_shard", crash_on_third)
    with pytest.raises(RuntimeError, match="killed"):
        pack_dataset(sources, url, sample_config=sample_config, config=_config())
    left = _remote_files(fs, url)
    assert "manifest.json" not in left and not [n for n in left if n.endswith(".tmp")]
    assert sum(n.endswith(".tar") for n in left) == 2
    with pytest.raises(OutputError, match="--resume"):
        pack_dataset(sources, url, sample_config=sample_config, config=_config())
    monkeypatch.setattr(job, "_write_shard", real)
    summary = pack_dataset(sources, url, sample_config=sample_config, config=_config(), resume=True)
    assert summary.resumed_shards == 2
    files = _remote_files(fs, url)
    expected = local[1]
    tars = {n: b for n, b in expected.items() if n.endswith(".tar")}
    assert {n: files[n] for n in files if n.endswith(".tar")} == tars
    again = pack_dataset(sources, url, sample_config=sample_config, config=_config(), resume=True)
    assert again.packs == summary.packs  # complete: nothing redone
    with pytest.raises(OutputError, match="already holds"):
        pack_dataset(sources, url, sample_config=sample_config, config=_config())


@pytest.fixture(scope="module")
def ray_cluster(s3, tmp_path_factory):
    """A fresh 2-CPU Ray cluster for this module's Ray jobs, started once (its workers, separate processes, stay
    warm from one job to the next) and shut down after them."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=str(tmp_path_factory.mktemp("ray")),
             log_to_driver=False, logging_level=logging.ERROR, object_store_memory=100 * 2**20)
    try:
        yield ray
    finally:
        ray.shutdown()


def _pack_on_ray(remote_demo: str, url: str, sample_config, config: PackConfig) -> None:
    """Pack the demo's two sources on S3 into ``url`` on the module's Ray cluster."""
    sources = [f"{remote_demo}/llava.jsonl", f"{remote_demo}/messages.jsonl"]
    pack_dataset(sources, url, sample_config=sample_config, config=config)


def test_ray_reads_and_writes_s3_like_local(s3, local, remote_demo, sample_config, ray_cluster):
    """Ray workers (separate processes, as on other machines) read the inputs and write the
    spool and shards on S3; the output equals the local executor's on local disk."""
    _, fs = s3
    url = f"s3://{BUCKET}/ray"
    _pack_on_ray(remote_demo, url, sample_config, _config({"executor": "ray"}))
    files, expected = _remote_files(fs, url), local[1]
    assert [n for n in files if n.endswith(".tar")] == [n for n in expected if n.endswith(".tar")]
    assert all(files[n] == expected[n] for n in expected if n.endswith(".tar"))


def test_partitioned_job_on_ray_and_s3_equals_local(s3, remote_demo, demo_data, sample_config, ray_cluster,
                                                   tmp_path_factory):
    """Planning in groups (``plan_group_partitions``) with Ray workers reading and writing S3: the
    bucket, duplicate, select and plan tasks share the work folder on S3 (``plan/*``), and the shards
    and drops equal the same grouped job run by the local executor on local disk."""
    _, fs = s3
    grouped = dict(plan_group_partitions=2, records_per_partition=20)
    local_out = tmp_path_factory.mktemp("grouped-local") / "ds"
    pack_dataset(demo_sources(demo_data), local_out, sample_config=sample_config, config=_config(**grouped))
    url = f"s3://{BUCKET}/ray-grouped"
    _pack_on_ray(remote_demo, url, sample_config, _config({"executor": "ray"}, **grouped))
    files, expected = _remote_files(fs, url), read_files(local_out)
    tars = [n for n in expected if n.endswith(".tar")]
    assert len({n.split("-")[1] for n in tars}) > 1, "several groups wrote shards"
    assert [n for n in files if n.endswith(".tar")] == tars
    assert all(files[n] == expected[n] for n in tars)

    def drops(data: bytes) -> list[tuple[str, str]]:  # the details name the file where it is (a path, a URL)
        return [(d["id"], d["reason"]) for d in map(json.loads, data.splitlines())]
    assert drops(files["dropped.jsonl"]) == drops(expected["dropped.jsonl"]) and drops(expected["dropped.jsonl"])
    assert not any(n.startswith(".wdspack") or "/" in n for n in files), "the work folder is removed"


def test_remote_errors_name_the_url_and_the_fix(s3, remote_demo, sample_config, tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        list_partitions([f"s3://{BUCKET}/nothing-here.jsonl"])
    with pytest.raises(SourceError, match="matches nothing"):
        list_partitions([f"s3://{BUCKET}/demo/*.parquet"])
    with pytest.raises(ConfigError, match="upload"):
        Location("hf://datasets/org/name")
    with pytest.raises(ConfigError, match="fsspec backend"):
        pack_dataset([f"{remote_demo}/llava.jsonl"], "nosuchscheme://x/y", sample_config=sample_config,
                     config=_config())
    # an image path that climbs out of a URL image root is dropped, as it is on disk
    src = tmp_path / "escape.jsonl"
    src.write_text(json.dumps({"id": "esc", "image": "../secret.png",
                               "conversations": [{"from": "human", "value": "<image>\nhi"},
                                                 {"from": "gpt", "value": "ok"}]}) + "\n")
    _, fs = s3
    fs.put_file(str(src), f"s3://{BUCKET}/esc/data/escape.jsonl")
    out = tmp_path / "esc-out"
    with pytest.raises(TooManyDropsError, match="nothing was packed: all 1 samples"):  # its only record
        pack_dataset([f"s3://{BUCKET}/esc/data/escape.jsonl"], out, sample_config=sample_config, config=_config())
    assert [json.loads(line)["reason"] for line in (out / "dropped.jsonl").read_text().splitlines()] == \
        ["image_path_escape"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
