"""tools/bench_audio.py at tiny sizes (``--small``): the probe's count is the decode's for every format, from the
header where the header is exact (WAV, FLAC, MP3 with its Xing/LAME tag) and from a decode where it is not (MP3
without the tag, Opus, AAC in M4A); the loader and the plain processes make features for the same audio seconds,
and the two decodes give the same samples; every stored audio is its source's bytes, with a small plan record
besides. Speed is the tool's to measure, not asserted."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest

pytest.importorskip("av")


def _tool():
    return importlib.import_module("tools.bench_audio")


@pytest.fixture(scope="module")
def small(tmp_path_factory, tools_tiny_vlm) -> dict:
    """The whole tool at toy sizes; the tiny Qwen2-Audio processor on the session's tekken tokenizer."""
    out = tmp_path_factory.mktemp("bench-audio") / "bench.json"
    assert _tool().main(["--small", "--repeats", "1", "--rounds", "1", "--chats", "4", "--max-audios", "2",
                         "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_the_probe_counts_what_a_full_decode_gives_for_every_format(small):
    assert small["command"].startswith("python -m tools.bench_audio --small") and small["machine"]["cpus"] >= 1
    probe = small["probe"]
    assert set(probe) == set(small["clips"]) == {"wav", "flac", "mp3", "mp3_notag", "opus", "m4a"}
    for kind, row in probe.items():
        assert row["exact"] is True and row["header_or_probe_frames"] == row["decoded_frames"], kind
        assert row["decode_over_probe"] == round(row["decode_ms"] / row["probe_ms"], 1)
        assert all(row[k] > 0 for k in ("probe_ms", "decode_ms", "decode_resample_ms", "open_ms",
                                        "open_probesize_32_ms"))
        assert row["bytes"] > 0 and row["seconds"] == 1.0
    assert {k for k, row in probe.items() if row["measured"] == "header"} == {"wav", "flac", "mp3"}
    # 1 s of source: the exact formats give 16000 samples at 16 kHz, 25 Qwen2-Audio tokens; the encoder's delay
    # and padding make MP3 without its tag and AAC decode longer
    for kind in ("wav", "flac", "mp3", "opus"):
        assert probe[kind]["samples_16k"] == 16_000 and probe[kind]["tokens"] == 25, kind
    for kind in ("mp3_notag", "m4a"):
        assert probe[kind]["samples_16k"] > 16_000 and probe[kind]["tokens"] >= 25, kind


def test_the_loader_and_the_plain_processes_make_the_same_audio(small):
    data, loader = small["dataset"], small["loader"]
    assert data["samples_packed"] == data["audios"] == 4 and data["packs"] == 2  # two audios a pack at most
    for n in ("1w", "2w"):
        row = loader[n]
        assert row["audios"] == 4 and row["audio_seconds"] == row["plain_audio_seconds"] == data["audio_seconds"]
        rates = row["loader_audio_s_per_s"] / row["plain_audio_s_per_s"]  # rounded to 0.1 s/s
        assert row["of_plain"] == pytest.approx(rates, rel=0.02) and len(row["of_plain_runs"]) == 1
        assert row["of_plain_cpu"] == row["of_plain_cpu_runs"][0] > 0
    steps = loader["steps_ms"]
    # wdspack's decode (the planned length) and the plain one (load_audio's forced length) give the same samples,
    # and so the same features
    assert steps["audios"] == 4 and steps["same_lengths"] is True and steps["max_feature_diff"] == 0.0
    assert all(steps[k] > 0 for k in ("wdspack_decode_resample", "plain_decode_resample", "features"))
    profile = loader["profile_1w"]
    ms = profile["cumulative_ms"]
    assert profile["audios"] == 4 and profile["epoch_ms"] >= ms["pack_parts"] >= ms["decode_audio"] > 0
    assert ms["pack_parts"] >= ms["feature_extractor"] >= ms["fbank"] > 0


def test_each_stored_audio_is_its_source_plus_a_small_plan(small):
    store = small["storage"]
    assert store["audios"] == 4 and store["packs"] == 2 and store["same_bytes"] is True
    assert store["stored_audio_bytes"] == store["source_bytes"]
    # what a pack adds per audio besides its bytes: the plan (five ints), its tokens and owner, msgpack framing
    extra = store["pack_bytes_for_audio"] - store["stored_audio_bytes"]
    assert 0 < extra / store["audios"] < 200 and store["extra_bytes_per_audio"] == round(extra / 4, 1)
    assert store["shard_bytes"] > store["source_bytes"]


def test_the_plain_decode_forces_load_audios_length():
    tool = _tool()
    data = tool.make_clip("mp3", seconds=0.5)
    found = tool.probe_audio(data, sample_id="t")
    wave = tool.plain_decode(data)
    assert wave.dtype == np.float32 and len(wave) == tool.resampled_length(found.frames, found.rate, 16_000) == 8000
    same = tool.decode_audio(data, rate=16_000, frames=found.frames, source_rate=found.rate, sample_id="t")
    assert np.array_equal(wave, same)


def test_audio_chats_are_written_in_llama_factorys_layout(tmp_path):
    path, clips = _tool().write_audio_chats(tmp_path, 7, small=True)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["audios"][0].rsplit(".", 1)[1] for r in rows] == ["wav", "flac", "mp3", "mp3", "opus", "m4a", "wav"]
    assert all(r["messages"][0]["content"].startswith("<audio>") and r["messages"][1]["role"] == "assistant"
               for r in rows)
    assert [(tmp_path / r["audios"][0]).read_bytes() for r in rows] == clips
