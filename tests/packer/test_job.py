"""The pack job end to end: round trip, conservation, determinism, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.demo import demo_sources, read_files
from wdspack.errors import ConfigError, Dropped, OutputError, SampleError, TooManyDropsError
from wdspack.format.manifest import read_manifest
from wdspack.format.pack import decode_pack
from wdspack.packer import job
from wdspack.packer.config import PackConfig, RunOptions
from wdspack.packer.job import pack_dataset
from wdspack.packer.samples import get_builder
from wdspack.packer.sources import iter_records, list_partitions

ROOT = Path(__file__).resolve().parents[2]
SEQ_LEN, MAX_IMAGES = 2048, 6


def _config(**kw):
    base = dict(seq_len=SEQ_LEN, max_images=MAX_IMAGES, shard_max_bytes=150_000, records_per_partition=40)
    base.update(kw)
    return PackConfig(**base)


@pytest.fixture(scope="module")
def packed(demo_packed):
    # conftest packs the demo once per session, with _config() (its drop tolerance aside: no byte depends on it)
    return demo_packed


def _read_packs(root: Path):
    for shard in read_manifest(root).shards:
        with tarfile.open(root / shard.name) as tar:
            for m in tar.getmembers():
                yield decode_pack(tar.extractfile(m).read())


def test_round_trip_byte_for_byte(packed, demo_data, sample_config):
    out, _ = packed
    builder = get_builder(sample_config)
    expected = {}
    for part in list_partitions(demo_sources(demo_data)):
        for rec in iter_records(part):
            if isinstance(rec, Dropped):
                continue
            try:
                s = builder.build(rec)
            except SampleError:
                continue
            expected[s.sample_id] = s
    got = {}
    for pack in _read_packs(out):
        assert pack.num_tokens <= SEQ_LEN and pack.num_images <= MAX_IMAGES
        starts = np.cumsum((0,) + pack.seq_lens)
        for k, sid in enumerate(pack.sample_ids):
            sl = slice(starts[k], starts[k + 1])
            owned = [i for i, owner in enumerate(pack.image_sample) if owner == k]
            got[sid] = (pack.input_ids[sl], pack.loss_mask[sl], [pack.images[i] for i in owned],
                        [pack.image_tokens[i] for i in owned])
    assert got, "nothing was packed"
    for sid, (ids, mask, images, image_tokens) in got.items():
        s = expected[sid]
        assert ids.tolist() == s.input_ids.tolist(), sid
        assert mask.tolist() == s.loss_mask.tolist(), sid
        assert images == list(s.images) and image_tokens == list(s.image_tokens), sid
    too_big = {sid for sid, s in expected.items() if s.token_count > SEQ_LEN or s.image_count > MAX_IMAGES}
    assert set(got) == set(expected) - too_big


def test_every_record_is_packed_or_dropped_once(packed, demo_data):
    out, summary = packed
    all_ids = [r.sample_id for part in list_partitions(demo_sources(demo_data)) for r in iter_records(part)]
    packed_ids = [sid for pack in _read_packs(out) for sid in pack.sample_ids]
    dropped = [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]
    dropped_ids = [d["id"] for d in dropped]
    assert len(packed_ids) == len(set(packed_ids))
    assert sorted(packed_ids + dropped_ids) == sorted(all_ids)
    m = read_manifest(out)
    t = m.totals
    assert t["samples_read"] == len(all_ids) == summary.samples_read
    assert t["samples_packed"] == len(packed_ids) and t["samples_dropped"] == len(dropped)
    assert sum(t["dropped_by_reason"].values()) == len(dropped)
    # The demo data holds one record of each bad kind; each is reported with its reason.
    for reason in ("missing_image", "unreadable_image", "too_long", "malformed_record", "unknown_role"):
        assert t["dropped_by_reason"].get(reason, 0) >= 1, (reason, t["dropped_by_reason"])
    assert all(d["detail"] for d in dropped)
    assert t["packs"] == sum(s.packs for s in m.shards) == summary.packs
    assert t["tokens"] == sum(s.tokens for s in m.shards)
    assert abs(t["fill_ratio"] - t["tokens"] / (t["packs"] * SEQ_LEN)) < 1e-6


def test_manifest_describes_the_job(packed):
    out, _ = packed
    m = read_manifest(out)
    assert (m.seq_len, m.max_images, m.algorithm, m.seed) == (SEQ_LEN, MAX_IMAGES, "bfd", 0)
    assert m.tokenizer["vocab_size"] == 131072 and m.tokenizer["token_dtype"] == "<u4"
    assert m.tokenizer["image_token_id"] == 10
    assert len(m.shards) > 1, "shard_max_bytes should roll over shards"
    for s in m.shards:
        assert (out / s.name).stat().st_size == s.bytes
    assert not (out / job.WORK_DIR).exists(), "the work folder is removed when the job is done"
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(["manifest.json", "dropped.jsonl", "pack_index.npy"] + [s.name for s in m.shards])
    assert m.pack_index["file"] == "pack_index.npy" and m.pack_index["bytes"] == (out / "pack_index.npy").stat().st_size


@pytest.mark.slow  # a process pool
def test_two_runs_and_two_workers_give_identical_bytes(packed, demo_data, sample_config, tmp_path):
    out, _ = packed
    again = tmp_path / "again"
    pack_dataset(demo_sources(demo_data), again, sample_config=sample_config, config=_config(run=RunOptions(workers=2)))
    assert read_files(again) == read_files(out)


class _Boom(RuntimeError):
    pass


def test_resume_after_a_crash_while_writing(packed, demo_data, sample_config, tmp_path, monkeypatch):
    out, _ = packed
    target = tmp_path / "crashy"
    real, calls = job._write_shard, []

    def crash_on_third(*args):
        calls.append(args[0])
        if len(calls) == 3:
            raise _Boom("killed")
        return real(*args)

    monkeypatch.setattr(job, "_write_shard", crash_on_third)
    with pytest.raises(_Boom):
        pack_dataset(demo_sources(demo_data), target, sample_config=sample_config, config=_config())
    assert not (target / "manifest.json").exists()
    assert not [p for p in target.iterdir() if p.name.endswith(".tmp")]
    with pytest.raises(OutputError, match="--resume"):
        pack_dataset(demo_sources(demo_data), target, sample_config=sample_config, config=_config())
    monkeypatch.setattr(job, "_write_shard", real)
    summary = pack_dataset(demo_sources(demo_data), target, sample_config=sample_config, config=_config(),
                           resume=True)
    assert summary.resumed_shards == 2
    assert read_files(target) == read_files(out)


def test_resume_after_a_crash_while_measuring(packed, demo_data, sample_config, tmp_path, monkeypatch):
    out, _ = packed
    target = tmp_path / "crashy"
    real, calls = job._measure_partition, []

    def crash_on_second(*args):
        calls.append(args[0])
        if len(calls) == 2:
            raise _Boom("killed")
        return real(*args)

    monkeypatch.setattr(job, "_measure_partition", crash_on_second)
    with pytest.raises(_Boom):
        pack_dataset(demo_sources(demo_data), target, sample_config=sample_config, config=_config())
    monkeypatch.setattr(job, "_measure_partition", real)
    pack_dataset(demo_sources(demo_data), target, sample_config=sample_config, config=_config(), resume=True)
    assert read_files(target) == read_files(out)


def test_resume_refuses_other_arguments(demo_data, sample_config, tmp_path, monkeypatch):
    target = tmp_path / "ds"
    monkeypatch.setattr(job, "_write_shard", lambda *a: (_ for _ in ()).throw(_Boom("killed")))
    with pytest.raises(_Boom):
        pack_dataset(demo_sources(demo_data), target, sample_config=sample_config, config=_config())
    with pytest.raises(OutputError, match="other inputs or arguments"):
        pack_dataset(demo_sources(demo_data), target, sample_config=sample_config, config=_config(seq_len=1024),
                     resume=True)


def _cli_argv(demo_data, tekken_dir, target: Path) -> list[str]:
    template = ROOT / "examples" / "chat_templates" / "pixtral.jinja"
    return [sys.executable, "-m", "wdspack", "pack", *demo_sources(demo_data), "--output", str(target),
            "--tokenizer", str(tekken_dir), "--chat-template", str(template), "--image-token", "[IMG]",
            "--tokens-per-image", "16", "--seq-len", str(SEQ_LEN), "--max-images", str(MAX_IMAGES),
            "--shard-size", "150000", "--quiet"]


@pytest.fixture(scope="module")
def cli_reference(demo_data, tekken_dir, tmp_path_factory) -> dict[str, bytes]:
    """The files of an uninterrupted CLI run (records_per_partition is not a CLI flag; the CLI's default
    partitions the same data identically to itself, so interrupted runs are compared with this). The same command
    run in this process (``wdspack.cli.main``, what ``python -m wdspack`` runs): no interpreter to start, and the
    sample builder a pack command with these settings loaded in this process (another module's) serves it."""
    from wdspack.cli import main

    reference = tmp_path_factory.mktemp("cli") / "reference"
    argv = _cli_argv(demo_data, tekken_dir, reference)
    assert argv[1:3] == ["-m", "wdspack"]
    assert main(argv[3:]) == 0
    return read_files(reference)


@pytest.mark.slow  # CLI processes killed and resumed
def test_sigkill_at_random_points_then_resume(demo_data, tekken_dir, tmp_path, cli_reference):
    """A real SIGKILL of the CLI process, then --resume: the same bytes as an uninterrupted run."""
    target = tmp_path / "killed"
    argv = _cli_argv(demo_data, tekken_dir, target)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    rng = np.random.default_rng(0)
    for attempt in range(2):
        proc = subprocess.Popen(argv + (["--resume"] if attempt else []), env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(float(rng.uniform(2.0, 7.0)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for shard in target.glob("train-*.tar") if target.exists() else []:
            with tarfile.open(shard) as tar:  # anything under a final name is complete
                for m in tar.getmembers():
                    decode_pack(tar.extractfile(m).read())
    done = subprocess.run(argv + ["--resume"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert read_files(target) == cli_reference


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux: /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.slow  # CLI processes interrupted and resumed
def test_ctrl_c_with_workers_is_one_line_and_resumes(demo_data, tekken_dir, tmp_path, cli_reference):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while 2 pool processes work: one
    line and exit 130, no worker's traceback (#38 item 5); --resume then ends with the uninterrupted bytes."""
    target = tmp_path / "interrupted"
    argv = _cli_argv(demo_data, tekken_dir, target) + ["--workers", "2"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while len(_children(proc.pid)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # until the pool's two processes run
    time.sleep(1.0)  # ... and have imported what they need and taken tasks
    assert proc.poll() is None and len(_children(proc.pid)) >= 2, "no pool to interrupt: give the job more data"
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert (out + err).strip().splitlines() == ["wdspack pack: interrupted; re-run with --resume to continue"]
    done = subprocess.run(argv + ["--resume"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert read_files(target) == cli_reference


def test_output_folder_checks(packed, demo_data, sample_config, tmp_path):
    out, _ = packed
    with pytest.raises(OutputError, match="already holds a packed dataset"):
        pack_dataset(demo_sources(demo_data), out, sample_config=sample_config, config=_config())
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="not empty"):
        pack_dataset(demo_sources(demo_data), busy, sample_config=sample_config, config=_config())


def test_on_error_raise_stops_at_the_first_bad_record(demo_data, sample_config, tmp_path):
    with pytest.raises(SampleError, match="--on-error skip"):
        pack_dataset(demo_sources(demo_data), tmp_path / "ds", sample_config=sample_config,
                     config=_config(on_error="raise"))


def test_drop_tolerance(demo_data, sample_config, tmp_path):
    """Over the tolerance: the job fails after writing dropped.jsonl, before any shard or manifest."""
    with pytest.raises(TooManyDropsError, match=r"over the tolerance --max-drop-fraction 0\.001"):
        pack_dataset(demo_sources(demo_data), tmp_path / "ds", sample_config=sample_config,
                     config=_config(run=RunOptions(max_drop_fraction=0.001)))
    assert (tmp_path / "ds" / "dropped.jsonl").read_text().count("\n") >= 6
    assert not (tmp_path / "ds" / "manifest.json").exists() and not list((tmp_path / "ds").glob("*.tar"))


@pytest.mark.parametrize("kw, match", [
    (dict(algorithm="magic"), "unknown --algorithm 'magic'"),
    (dict(on_error="ignore"), "--on-error"),
    (dict(records_per_partition=0), "records_per_partition must be >= 1"),
    (dict(run=dict(workers=4)), "pass a wdspack.RunOptions"),
])
def test_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        _config(**kw)


@pytest.mark.parametrize("kw, match", [
    (dict(workers=0), "--workers must be >= 1"),
    (dict(executor="spark"), "unknown --executor 'spark'"),
    (dict(ray_address="auto"), "--ray-address needs --executor ray"),
    (dict(max_drop_fraction=5), r"--max-drop-fraction must be in \[0, 1\]"),
])
def test_run_options_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        RunOptions(**kw)


def test_where_tasks_run_is_not_part_of_what_decides_the_output():
    busy = _config(run=RunOptions(workers=4, max_drop_fraction=1))
    assert busy.output_fields() == _config().output_fields() and "run" not in busy.output_fields()
    assert _config(seed=1).output_fields() != _config().output_fields()


def test_parquet_and_saved_dataset_sources_pack_with_a_real_tokenizer(sample_config, tmp_path):
    """The Hub's large-collection layouts: Parquet with image bytes + messages, and a
    ``save_to_disk`` folder with the_cauldron-style ``texts``."""
    import io

    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    def png(color):
        buf = io.BytesIO()
        Image.new("RGB", (32, 24), color).save(buf, format="PNG")
        return buf.getvalue()

    rows = [{"images": [{"bytes": png((i * 20, 0, 0)), "path": None}],
             "messages": [{"role": "user", "content": "<image>What color?"},
                          {"role": "assistant", "content": f"Red {i}."}]} for i in range(10)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "cauldron.parquet", row_group_size=4)
    datasets.Dataset.from_list([
        {"images": [png((0, i * 20, 0))], "texts": [{"user": "Describe.", "assistant": f"Green {i}.", "source": "x"}]}
        for i in range(6)]).save_to_disk(str(tmp_path / "saved"))
    out = tmp_path / "ds"
    summary = pack_dataset([str(tmp_path / "cauldron.parquet"), str(tmp_path / "saved")], out,
                           sample_config=sample_config, config=_config())
    assert (summary.samples_read, summary.samples_packed, summary.images) == (16, 16, 16)
    texts = []
    builder = get_builder(sample_config)
    for pack in _read_packs(out):
        starts = np.cumsum((0,) + pack.seq_lens)
        for k in range(pack.num_samples):
            ids = pack.input_ids[starts[k]:starts[k + 1]]
            mask = pack.loss_mask[starts[k]:starts[k + 1]].astype(bool)
            texts.append(builder.tokenizer.decode([int(t) for t in ids[mask]]))
            assert int((ids == 10).sum()) == 16  # one image of 16 tokens each
    assert sorted(texts) == sorted([f"Red {i}.</s>" for i in range(10)] + [f"Green {i}.</s>" for i in range(6)])
