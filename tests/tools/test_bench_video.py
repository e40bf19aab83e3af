"""tools/bench_video.py at tiny sizes (``--small``): every figure present and consistent with what was
measured (frames, bytes, ratios), the stored frames read back bit-identical, both decode sides give the
same pixels, and the side-by-side worker can be swapped; the pack job and the loader on video chats (slow:
the tiny Qwen2.5-VL processor loads the tekken tokenizer) pack every chat with the floor's tokens and stream
every planned frame. Speed is the tool's to measure, not asserted."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
import torch

pytest.importorskip("av")


def _tool():
    return importlib.import_module("tools.bench_video")


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench-video") / "bench.json"
    assert _tool().main(["--small", "--repeats", "1", "--rounds", "1", "--videos", "4", "--parts",
                         "probe,storage,workers", "--json", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def chats(tmp_path_factory, tools_tiny_vlm) -> dict:
    """The pack and loader parts; the tool's tiny Qwen2.5-VL processor on the session's tekken tokenizer."""
    out = tmp_path_factory.mktemp("bench-video-chats") / "bench.json"
    assert _tool().main(["--small", "--repeats", "1", "--rounds", "1", "--chats", "4", "--small-chats", "6",
                         "--parts", "pack,loader", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_small_run_reports_the_probe_and_the_storage_per_video(small):
    assert small["command"].startswith("python -m tools.bench_video --small") and small["machine"]["cpus"] >= 1
    assert set(small["clips"]) == set(small["probe"]) == set(small["storage"]) == {"mp4", "webm"}
    for kind, clip in small["clips"].items():
        probe, store = small["probe"][kind], small["storage"][kind]
        # 3 s at 10 fps; the webm's header has no count: its packets were counted
        assert probe["header_frames"] == probe["decoded_frames"] == 30
        assert probe["decode_over_probe"] == round(probe["decode_ms"] / probe["probe_ms"], 1)
        # Qwen2.5-VL at 2 frames a second: 6 of 30 frames, upscaled to its 128-patch minimum
        assert clip["planned_frames"] == 6 and clip["planned_size"] == [280, 392] and clip["tokens"] == 420
        assert store["b_raw_bytes"] == 6 * 3 * 280 * 392
        assert store["a_original_plus_indices_bytes"] == clip["bytes"] + 4 * 6
        assert store["raw_over_original"] == round(store["b_raw_bytes"] / store["a_original_plus_indices_bytes"], 2)
        assert 0 < store["b_png_bytes"] < store["b_raw_bytes"]
        steps = ("a_decode_resize", "a_decode", "a_resize", "pyav_decode", "pyav_resize", "b_read_png")
        assert all(store[f"{step}_ms"] > 0 for step in steps) and store["b_read_raw_ms"] >= 0
    assert small["decision"]["store"] == "original" and small["decision"]["min_png_over_original"] > 1


def test_small_run_compares_workers_side_by_side_on_the_same_pixels(small):
    workers = small["workers"]
    assert workers["same_pixels"] is True and workers["videos"] == 4
    for n in ("1w", "2w"):
        assert workers[n]["frames"] == 4 * 6  # every planned frame of every video, on both sides
        rates = workers[n]["wdspack_frames_per_s"] / workers[n]["pyav_frames_per_s"]  # rounded to 0.1 frames/s
        assert workers[n]["of_pyav"] == pytest.approx(rates, rel=0.01) and workers[n]["of_pyav_runs"]
        assert workers[n]["of_pyav_cpu"] == workers[n]["of_pyav_cpu_runs"][0] > 0  # one round
    assert small["decoder"] in ("wdspack.media.video.pixels",
                                "local PyAV equivalent (wdspack.media.video.pixels missing)")


def test_stored_frames_read_back_bit_identical():
    tool = _tool()
    frames = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (3, 3, 20, 28), dtype=np.uint8))
    plan = tool.VideoPlan(indices=(0, 5, 9), height=20, width=28, grid=(2, 2, 2), tokens=2, second_per_grid_t=1.0)
    raw, pngs = tool.stored_frames(frames)
    assert len(raw) == frames.numel() and len(pngs) == 3
    assert torch.equal(tool.read_raw(raw, plan), frames) and torch.equal(tool.read_pngs(pngs), frames)


def test_the_side_by_side_worker_is_a_parameter():
    tool = _tool()
    data = tool.make_clip("mp4", seconds=2, fps=10, width=64, height=48)
    plan = tool.plan_qwen2_vl(tool.read_header(data), tool.QWEN25_VL_VIDEO)
    got = tool.pyav_worker(data, plan)
    assert got.dtype == torch.uint8 and tuple(got.shape) == (len(plan.indices), 3, plan.height, plan.width)
    assert torch.equal(got, tool.wdspack_worker(data, plan))  # the same pixels as wdspack's decode and resize

    def header_only(data: bytes, plan) -> torch.Tensor:  # a stand-in worker: no pixels decoded
        return torch.zeros(len(plan.indices), 3, 1, 1, dtype=torch.uint8)

    rate, frames, cpu_s = tool.side_by_side([(data, plan)] * 3, 2, worker=header_only)
    assert frames == 3 * len(plan.indices) and rate > 0 and cpu_s >= 0


@pytest.mark.slow  # the tiny Qwen2.5-VL processor: the tekken tokenizer (~5 s, more on a loaded host)
def test_small_run_packs_every_video_chat_with_the_floors_tokens(chats):
    assert "probe" not in chats and "workers" not in chats  # --parts pack,loader
    for name, n in (("realistic", 4), ("small", 6)):
        row = chats["pack"][name]
        assert row["records"] == row["videos"] == row["samples_packed"] == n
        # the floor rendered and tokenized exactly what the pack job packed, video tokens included
        assert row["tokens"] == row["floor_tokens"] > n * row["video_tokens"]
        assert row["pack_of_floor"] == pytest.approx(row["pack_samples_per_s"] / row["floor_samples_per_s"], rel=0.02)
        assert row["pack_of_floor_cpu"] == row["pack_of_floor_cpu_runs"][0] > 0
        assert all(row["per_record_ms"][k] > 0 for k in ("pack", "floor", "probe", "read", "write"))


@pytest.mark.slow  # as above
def test_small_run_streams_every_planned_frame_through_the_loader(chats):
    loader, clip = chats["loader"], chats["clips"]["mp4"]
    assert loader["videos"] == 4 and clip["planned_frames"] == 6
    assert loader["pixel_dtype"] == "float32" and chats["loader_uint8"]["pixel_dtype"] == "uint8"
    for n in ("1w", "2w"):
        assert loader[n]["frames"] == chats["loader_uint8"][n]["frames"] == 4 * 6  # the same frames as PyAV's
        rates = loader[n]["loader_frames_per_s"] / loader[n]["pyav_frames_per_s"]
        assert loader[n]["of_pyav"] == pytest.approx(rates, rel=0.02)
        assert loader[n]["of_pyav_cpu"] == loader[n]["of_pyav_cpu_runs"][0] > 0
    profile = loader["profile_1w"]
    steps = profile["cumulative_ms"]
    assert profile["frames"] == 4 * 6 and profile["epoch_ms"] >= steps["pack_parts"] > 0
    assert steps["pack_parts"] >= max(steps["decode_frames"], steps["resize_frames"], steps["qwen_video_patches"],
                                      steps["normalize_video_rows"]) > 0


def test_video_chats_are_written_in_llama_factorys_layout(tmp_path):
    tool = _tool()
    clips = [("mp4", b"mp4-bytes"), ("webm", b"webm-bytes")]
    path = tool.write_video_chats(tmp_path, clips, 3)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["videos"] for r in rows] == [["clips/c0000.mp4"], ["clips/c0001.webm"], ["clips/c0002.mp4"]]
    assert all(r["messages"][0]["content"].startswith("<video>") and r["messages"][1]["role"] == "assistant"
               for r in rows)
    assert (tmp_path / "clips" / "c0002.mp4").read_bytes() == b"mp4-bytes"


def test_planned_frames_count_the_real_video_slots_only():
    batch = {"video_grid_thw": torch.tensor([[[20, 26, 46], [3, 2, 2]], [[1, 2, 2], [0, 0, 0]]]),
             "video_mask": torch.tensor([[True, True], [True, False]])}
    assert _tool().planned_frames(batch) == 2 * (20 + 3 + 1)
