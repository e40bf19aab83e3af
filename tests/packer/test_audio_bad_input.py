"""Bad audio loses nothing (issue #50, item 5), through the pack job with a real audio family's processor
(Qwen2-Audio, its window shrunk to 4 s in its folder): what the file shows is dropped at pack time with its own
reason naming the file; silent, multi-channel and odd-rate audio and audio past the family's window pack (cut as
its processor cuts, said in the plan); a file changed after packing costs only its sample at load time, counted,
and the rest streams.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import wdspack
from tests.support.audio_clips import av, encode, encode_video, tone
from wdspack.packer.config import PackConfig, RunOptions
from wdspack.packer.job import pack_dataset
from wdspack.packer.samples import SampleConfig

if av is None:
    pytest.skip("PyAV is not installed (pip install av)", allow_module_level=True)

SEQ_LEN, MAX_ITEMS = 160, 2


def _chat(sid: str, audio: str, *, question: str = "<audio>What is it?") -> dict:
    return {"id": sid, "audios": [audio],
            "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": "A sound."}]}


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-audio")
    clips = root / "clips"
    clips.mkdir()
    whole = encode(tone(16_000, 16_000), 16_000, fmt="wav", codec="pcm_s16le")
    files = {
        "good.wav": whole,
        "silent.wav": encode(np.zeros((1, 8_000), np.float32), 16_000, fmt="wav", codec="pcm_s16le"),
        "surround_96k.flac": encode(tone(48_000, 96_000, 6), 96_000, fmt="flac", codec="flac"),
        "phone_8k.wav": encode(tone(8_000, 8_000), 8_000, fmt="wav", codec="pcm_s16le"),
        "long.wav": encode(tone(16_000 * 6, 16_000), 16_000, fmt="wav", codec="pcm_s16le"),  # past the 4 s window
        "truncated.wav": whole[: len(whole) // 2],
        "corrupt.mp3": b"ID3" + bytes(range(256)) * 8,
        "empty.wav": b"",
        "blip.wav": encode(tone(100, 16_000), 16_000, fmt="wav", codec="pcm_s16le"),  # 100 samples: no token
        "mute_video.mp4": encode_video(seconds=0.5, audio=None),
    }
    for name, data in files.items():
        (clips / name).write_bytes(data)
    rows = [_chat("good", "clips/good.wav"), _chat("silent", "clips/silent.wav"),
            _chat("surround", "clips/surround_96k.flac"), _chat("phone", "clips/phone_8k.wav"),
            _chat("long", "clips/long.wav"), _chat("truncated", "clips/truncated.wav"),
            _chat("corrupt", "clips/corrupt.mp3"), _chat("empty", "clips/empty.wav"), _chat("blip", "clips/blip.wav"),
            _chat("mute", "clips/mute_video.mp4"), _chat("missing", "clips/nope.wav"),
            _chat("escape", "../outside.wav"),
            {"id": "image", "messages": [{"role": "user", "content": "<image>What is it?"},
                                         {"role": "assistant", "content": "A dot."}], "images": ["clips/good.wav"]}]
    (root / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from tiny_vlm import qwen2_audio

    folder = tmp_path_factory.mktemp("qwen2-audio")
    processor = qwen2_audio.processor(folder / "tok", chunk_length=4)
    processor.save_pretrained(folder / "processor")
    return str(folder / "processor")


@pytest.fixture(scope="module")
def packed(src, qwen, tmp_path_factory):
    out = tmp_path_factory.mktemp("packed") / "ds"
    summary = pack_dataset([str(src / "chats.jsonl")], str(out), sample_config=SampleConfig(processor=qwen),
                           config=PackConfig(seq_len=SEQ_LEN, max_images=MAX_ITEMS,
                                             run=RunOptions(max_drop_fraction=1.0)), progress=False)
    dropped = {d["id"]: (d["reason"], d["detail"])
               for d in map(json.loads, (out / "dropped.jsonl").read_text().splitlines())}
    return out, summary, dropped


def test_what_the_file_shows_is_dropped_with_its_own_reason_naming_the_file(packed):
    _, summary, dropped = packed
    reasons = {sid.rpartition(":")[2] if ":" in sid else sid: reason for sid, (reason, _) in dropped.items()}
    assert reasons == {"truncated": "unreadable_audio", "corrupt": "unreadable_audio", "empty": "unreadable_audio",
                       "blip": "audio_too_short", "mute": "no_audio_track", "missing": "missing_audio",
                       "escape": "audio_path_escape", "image": "unsupported_media"}
    for sid, (reason, detail) in dropped.items():
        if reason != "unsupported_media":
            assert "clips/" in detail or "../outside.wav" in detail, (sid, detail)  # names the file
    assert "the qwen2_audio family has no image path" in dropped["image"][1]
    assert "100 samples at 16,000 Hz" in dropped["blip"][1] and "at least 321 samples" in dropped["blip"][1]
    assert summary.samples_packed == 5  # good, silent, surround (96 kHz, 6 channels), phone (8 kHz), long (cut)


def _plans(out) -> dict[str, tuple[int, object]]:
    """``sample id -> (tokens, plan)`` of every audio in the dataset."""
    import tarfile

    from wdspack.format.pack import decode_pack

    plans = {}
    for shard in sorted(out.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                pack = decode_pack(tar.extractfile(m).read())
                audio = pack.media["audio"]
                for owner, n, plan in zip(audio.sample, audio.tokens, audio.plans):
                    plans[pack.sample_ids[owner]] = (n, plan)
    return plans


def test_audio_past_the_window_is_cut_as_the_processor_cuts_it(packed):
    plans = _plans(packed[0])
    n, plan = plans["long"]
    assert (n, plan.samples, plan.kept) == (100, 96_000, 64_000)  # 6 s cut at the 4 s window: 100 tokens
    n, plan = plans["surround"]
    assert (plan.rate, plan.frames, plan.samples, n) == (96_000, 48_000, 8_000, 12)
    n, plan = plans["phone"]
    assert (plan.rate, plan.samples, n) == (8_000, 16_000, 25)


def test_a_header_that_lies_costs_only_its_sample_at_load_and_the_rest_streams(src, qwen, tmp_path, monkeypatch,
                                                                              caplog):
    """An audio planned from more samples than its file holds (a header that lies, or a file changed after
    packing): the loader's decode finds fewer, drops that one sample from its pack, counted with its reason and
    named in one line, and every other sample streams."""
    from wdspack.media.audio import prepare

    real = prepare.probe_audio

    def lying(data, *, sample_id, name=""):
        found = real(data, sample_id=sample_id, name=name)
        return found._replace(frames=found.frames + 8_000) if name == "clips/silent.wav" else found

    monkeypatch.setattr(prepare, "probe_audio", lying)
    out = tmp_path / "older"
    rows = [r for r in map(json.loads, (src / "chats.jsonl").read_text().splitlines())
            if r["id"] in ("good", "silent", "phone")]
    (tmp_path / "older.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = pack_dataset([str(tmp_path / "older.jsonl")], str(out), sample_config=SampleConfig(processor=qwen),
                           config=PackConfig(seq_len=SEQ_LEN, max_images=MAX_ITEMS), image_root=str(src),
                           progress=False)
    assert summary.samples_packed == 3
    monkeypatch.undo()
    loader = wdspack.make_loader(str(out), batch_size=1, num_workers=0, shuffle=False, processor=qwen)
    with caplog.at_level("WARNING", logger="wdspack"):
        batches = list(loader)
    assert loader.stats["dropped_samples"] == 1, loader.stats
    assert any(k.endswith("/unreadable_audio") and v == 1 for k, v in loader.stats.items()), loader.stats
    said = [r.getMessage() for r in caplog.records if "silent" in r.getMessage()]
    assert said and all("\n" not in m for m in said), caplog.text
    assert sum(int(b["num_samples"].sum()) for b in batches) == 2, "the other samples stream"
    assert all(torch.isfinite(b["input_features"]).all() for b in batches)
