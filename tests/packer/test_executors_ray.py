"""The pack job on Ray: byte-identical to the local executor, survives a killed worker, and a
clear usage error when Ray is not installed.

A local two-CPU Ray cluster is started once for the module, with its temp folder under pytest's
and its worker logs kept out of the test output. Test helpers that run inside Ray workers are
shipped by value (this file is not importable there).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import pytest

from tests.support.demo import demo_sources, generate_demo, read_files
from wdspack.cli import main
from wdspack.errors import ConfigError, SampleError
from wdspack.packer import job
from wdspack.packer.config import PackConfig, RunOptions
from wdspack.packer.executors import run_tasks
from wdspack.packer.job import pack_dataset

ROOT = Path(__file__).resolve().parents[2]
VICTIM_PART, VICTIM_SHARD = 3, 1  # the measure task and the write task whose first worker dies


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    ray = pytest.importorskip("ray")
    from ray import cloudpickle

    if ray.is_initialized():
        ray.shutdown()
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=str(tmp_path_factory.mktemp("ray")),
             log_to_driver=False, logging_level=logging.ERROR, object_store_memory=100 * 2**20,
             configure_logging=True)
    yield ray
    ray.shutdown()
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory):
    return generate_demo(tmp_path_factory.mktemp("demo"), records=240, seed=5)


def _config(**kw) -> PackConfig:
    base = dict(seq_len=2048, max_images=6, shard_max_bytes=150_000, records_per_partition=30)
    base.update(kw)
    return PackConfig(**base)


RAY = _config(run=RunOptions(executor="ray"))


@pytest.fixture(scope="module")
def local_files(tmp_path_factory, demo_data, sample_config):
    out = tmp_path_factory.mktemp("local") / "ds"
    summary = pack_dataset(demo_sources(demo_data), out, sample_config=sample_config, config=_config())
    assert summary.shards >= 3 and summary.samples_dropped > 0  # several shards, and drops to compare
    return read_files(out)


def test_ray_equals_local_byte_for_byte(ray_cluster, local_files, demo_data, sample_config, tmp_path):
    out = tmp_path / "ds"
    pack_dataset(demo_sources(demo_data), out, sample_config=sample_config, config=RAY)
    files = read_files(out)
    assert {"manifest.json", "dropped.jsonl"} <= files.keys()
    assert files.keys() == local_files.keys()
    for name, data in local_files.items():
        assert files[name] == data, name
    assert not (out / job.WORK_DIR).exists()


def test_ray_packs_video_chats_as_the_local_executor(ray_cluster, tmp_path):
    """Video chats (LLaMA-Factory's layout) with a Qwen2.5-VL processor folder: the Ray tasks plan each video
    from its header as the local executor does, and the shards are byte for byte the same."""
    from examples.make_demo_data import generate_videos
    from examples.tiny_vlm import qwen2_5_vl
    from wdspack.media.video.plan import VideoSettings
    from wdspack.models import save_processor
    from wdspack.packer.samples import SampleConfig

    generate_videos(tmp_path / "data", clips=8, seed=1)
    folder = save_processor(qwen2_5_vl.processor(tmp_path / "tok"), tmp_path / "processor")
    sample_config = SampleConfig(processor=str(folder), video=VideoSettings(fps=2.0, max_pixels=28 * 28 * 16))
    files = {}
    for executor in ("local", "ray"):
        summary = pack_dataset([str(tmp_path / "data" / "videos.jsonl")], tmp_path / executor,
                               sample_config=sample_config, progress=False,
                               config=_config(seq_len=512, records_per_partition=3, run=RunOptions(executor=executor)))
        assert summary.samples_packed == 8 and summary.samples_dropped == 0, summary.lines()
        files[executor] = read_files(tmp_path / executor)
    assert files["ray"] == files["local"]
    assert b'"videos": 8' in files["ray"]["manifest.json"]


def test_ray_packs_audio_chats_as_the_local_executor(ray_cluster, tmp_path):
    """Sound chats (LLaMA-Factory's ``mllm_audio_demo.json`` layout: WAV, FLAC and MP3 at 8 to 44.1 kHz) with a
    Qwen2-Audio processor folder: the Ray tasks probe each audio and plan its tokens as the local executor does,
    and the shards are byte for byte the same."""
    from examples.make_demo_data import generate_audio
    from examples.tiny_vlm import qwen2_audio
    from wdspack.models import save_processor
    from wdspack.packer.samples import SampleConfig

    generate_audio(tmp_path / "data", clips=6, seed=2)
    folder = save_processor(qwen2_audio.processor(tmp_path / "tok", chunk_length=4), tmp_path / "processor")
    sample_config = SampleConfig(processor=str(folder))
    files = {}
    for executor in ("local", "ray"):
        summary = pack_dataset([str(tmp_path / "data" / "audios.jsonl")], tmp_path / executor,
                               sample_config=sample_config, progress=False,
                               config=_config(seq_len=256, max_images=3, records_per_partition=2,
                                              run=RunOptions(executor=executor)))
        assert summary.samples_packed == 6 and summary.samples_dropped == 0, summary.lines()
        files[executor] = read_files(tmp_path / executor)
    assert files["ray"] == files["local"]
    assert b'"audios": 6' in files["ray"]["manifest.json"]


# --- a worker dies mid-job ------------------------------------------------------------------------


def _measure_dies_once(i, partition, sample_config, on_error, seq_len, max_images, work):
    """Measure, except that the first attempt at VICTIM_PART spools half a sample and dies."""
    marker = Path(work).parents[1] / f"measure-{i}.died"
    if i == VICTIM_PART and not marker.exists():
        marker.write_text(str(os.getpid()))
        (Path(work) / "spool" / f"{i:06d}.bin").write_bytes(b"\x95\xa9half a sample")
        os._exit(1)
    return job._measure_partition(i, partition, sample_config, on_error, seq_len, max_images,
                                       work)  # the real one, in a worker


def _write_dies_once(j, refs, work, path, token_dtype):
    """Write, except that the first attempt at VICTIM_SHARD leaves a partial temp file and dies."""
    marker = Path(work).parents[1] / f"write-{j}.died"
    if j == VICTIM_SHARD and not marker.exists():
        marker.write_text(str(os.getpid()))
        Path(path).with_name(f".{Path(path).name}.tmp").write_bytes(b"partial tar")  # ShardWriter's temp name
        os._exit(1)
    return job._write_shard(j, refs, work, path, token_dtype)


def test_killed_worker_is_retried_with_identical_output(ray_cluster, local_files, demo_data, sample_config,
                                                        tmp_path, monkeypatch):
    monkeypatch.setattr(job, "_measure_partition", _measure_dies_once)
    monkeypatch.setattr(job, "_write_shard", _write_dies_once)
    out = tmp_path / "ds"
    pack_dataset(demo_sources(demo_data), out, sample_config=sample_config, config=RAY)
    for stage, k in (("measure", VICTIM_PART), ("write", VICTIM_SHARD)):
        marker = tmp_path / f"{stage}-{k}.died"
        assert marker.exists(), f"the {stage} task {k} never ran its dying first attempt"
        assert int(marker.read_text()) != os.getpid()  # it was a Ray worker that died, not the driver
    files = read_files(out)
    assert files.keys() == local_files.keys()
    for name, data in local_files.items():
        assert files[name] == data, name


# --- errors and ordering ------------------------------------------------------------------------


def _fail_once_per_attempt(marker: str) -> None:
    """Count the attempt, then raise one of wdspack's errors."""
    with open(marker, "a") as f:
        f.write("attempt\n")
    raise SampleError("too_long", "9000 tokens > seq_len 8192; raise --seq-len", sample_id="s1")


def test_task_error_is_not_retried_and_arrives_unwrapped(ray_cluster, tmp_path):
    marker = tmp_path / "attempts"
    with pytest.raises(SampleError) as info:
        list(run_tasks(_fail_once_per_attempt, [(str(marker),)], executor="ray"))
    assert type(info.value) is SampleError and info.value.reason == "too_long"
    assert "RayTaskError" not in str(info.value) and info.value.sample_id == "s1"
    assert marker.read_text() == "attempt\n"  # retry_exceptions=False: a deterministic error runs once


def _sleep_then_square(x: int, seconds: float) -> int:
    time.sleep(seconds)
    return x * x


def test_results_in_task_order_progress_on_completion(ray_cluster):
    done = []
    tasks = [(k, 3.0 if k == 0 else 0.0) for k in range(12)]  # task 0 finishes last
    results = []
    for r in run_tasks(_sleep_then_square, tasks, executor="ray", on_done=lambda: done.append(1)):
        results.append((r, len(done)))
    assert [r for r, _ in results] == [k * k for k in range(12)]
    assert len(done) == 12
    assert results[0][1] > 1  # other tasks were counted before task 0's result came


# --- without Ray ----------------------------------------------------------------------------------


def test_cli_without_ray_names_the_extra(monkeypatch, demo_data, tekken_dir, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if not installed
    out = tmp_path / "ds"
    rc = main(["pack", *demo_sources(demo_data), "--output", str(out), "--tokenizer", str(tekken_dir),
               "--tokens-per-image", "16", "--seq-len", "2048", "--executor", "ray", "--ray-address", "auto", "-q"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "pip install wdspack[ray]" in err and "--executor ray" in err
    assert not out.exists()  # refused before touching the output


def test_executor_flags_are_checked():
    with pytest.raises(ConfigError, match="unknown --executor 'spark'"):
        RunOptions(executor="spark")
    with pytest.raises(ConfigError, match="--ray-address needs --executor ray"):
        RunOptions(ray_address="auto")
    assert main(["pack", "x.jsonl", "-o", "out", "--tokenizer", "t", "--seq-len", "8", "--executor", "dask"]) == 2
