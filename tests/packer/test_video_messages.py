"""What a user reads when a video job goes wrong or is video-only (issue #47, item 4): each answer points at the
levers that fix it. Packed with the demo's video chats (LLaMA-Factory's ``mllm_video_demo`` layout) and the tiny
Qwen2.5-VL processor, through ``wdspack.cli.main`` as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import vlm_harness as h
from wdspack import cli
from wdspack.models import save_processor

pytest.importorskip("av")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, Path]:
    """``videos.jsonl`` with 3 clips (the demo's generator) and the processor folder."""
    from make_demo_data import generate_videos
    from tiny_vlm import qwen2_5_vl

    root = tmp_path_factory.mktemp("messages")
    generate_videos(root / "data", clips=3, seed=1)
    folder = save_processor(qwen2_5_vl.processor(root / "tok"), root / "processor")
    return root / "data", folder


def _pack(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(["pack", *args, "--quiet"])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_chat_too_long_for_its_video_names_the_video_levers_and_the_settings(data, tmp_path, capsys):
    src, folder = data
    code, text = _pack(capsys, str(src / "videos.jsonl"), "-o", str(tmp_path / "out"), "--processor", str(folder),
                       "--seq-len", "48", "--video-fps", "2")
    assert code != 0
    line = next(t for t in text.splitlines() if t.strip().startswith("too_long"))
    assert "tokens > seq_len 48, " in line and " of them for its 1 video; raise --seq-len, or sample fewer or " \
        "smaller frames (--video-fps, --video-max-frames, --video-max-pixels); planned with frames at 2 fps" in line
    assert "fix the inputs: a --seq-len / --max-images too small for every sample" in text
    assert "--image-root" not in text and "layout" not in text


def test_a_job_of_audio_records_is_not_told_about_layouts_or_image_roots(data, tmp_path, capsys):
    """Audio records packed with a family that takes no audio (Qwen2.5-VL): each is dropped as unsupported_media
    naming the families that take audio, and the fix speaks of the processor, not of layouts or roots."""
    import wave

    _, folder = data
    for k in range(3):
        with wave.open(str(tmp_path / f"a{k}.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(16_000)
            w.writeframes(b"\0\0" * 1600)
    rows = [{"id": f"a{k}", "messages": [{"role": "user", "content": "<audio>What is said?"},
                                         {"role": "assistant", "content": "Hello."}], "audios": [f"a{k}.wav"]}
            for k in range(3)]
    (tmp_path / "audio.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, text = _pack(capsys, str(tmp_path / "audio.jsonl"), "-o", str(tmp_path / "out"), "--processor", str(folder),
                       "--seq-len", "512")
    assert code != 0 and "unsupported_media" in text
    fix = text.strip().splitlines()[-1]
    assert fix == ("fix the inputs: records with media this job's model does not take, or grounding objects (pack them "
                   "with a processor whose family takes them, or leave them out of this job)"), fix
    said = json.loads((tmp_path / "out" / "dropped.jsonl").read_text().splitlines()[0])["detail"]
    assert "the qwen2_5_vl family has no audio path; families with one: " in said and "qwen2_audio" in said


def test_video_max_pixels_below_one_block_of_patches_is_refused_before_packing(data, tmp_path, capsys):
    src, folder = data
    code, text = _pack(capsys, str(src / "videos.jsonl"), "-o", str(tmp_path / "out"), "--processor", str(folder),
                       "--seq-len", "512", "--video-max-pixels", "700")
    assert code != 0 and not (tmp_path / "out").exists()
    assert "--video-max-pixels 700 is less than one 28x28 block of merged patches, the smallest a frame is resized " \
        "to; give at least 784" in text and "Traceback" not in text


def test_a_reshard_over_the_tolerance_speaks_of_resharding(data, tmp_path, capsys):
    src, folder = data
    code, _ = _pack(capsys, str(src / "videos.jsonl"), "-o", str(tmp_path / "out"), "--processor", str(folder),
                    "--seq-len", "4096", "--video-fps", "2", "--video-max-pixels", "12544")
    assert code == 0
    lens = sorted(len(ids) for ids, *_ in h.dataset_sub_samples(tmp_path / "out").values())
    assert lens[0] < lens[1]
    capsys.readouterr()
    code = cli.main(["reshard", str(tmp_path / "out"), str(tmp_path / "small"), "--seq-len", str(lens[0]), "--quiet"])
    text = capsys.readouterr().err
    assert code != 0
    assert "2 of 3 samples (66.7%) are over the new budgets, over the tolerance --max-drop-fraction 0.05" in text
    assert text.strip().splitlines()[-1] == ("reshard with a larger --seq-len (or --max-images) to keep them, or "
                                             "accept these drops: run the same command with --resume "
                                             "--max-drop-fraction 0.67")
    assert "layout" not in text and "--image-root" not in text and "fix the inputs" not in text


def test_a_video_only_dataset_streams_no_image_rows(data, tmp_path, capsys):
    """``max_image_tokens_per_pack`` counts a pack's video tokens with its images; a dataset without images
    sizes no ``pixel_values`` rows from it (before: a zero block as large as the videos' tokens)."""
    import wdspack

    src, folder = data
    code, text = _pack(capsys, str(src / "videos.jsonl"), "-o", str(tmp_path / "out"), "--processor", str(folder),
                       "--seq-len", "4096", "--video-fps", "2", "--video-max-pixels", "12544")
    assert code == 0
    lines = {line[:9].strip(): line[9:] for line in text.splitlines() if line[:9].strip()}
    assert "images" not in lines, text  # nothing about images in a job of videos alone
    assert lines["samples"].startswith("read 3  packed 3  dropped 0") and "images 0  videos 3" in lines["packs"]
    assert lines["videos"].startswith("processor qwen2_5_vl (Qwen2_5_VLProcessor), frames at 2 fps")
    rate = lines["time"].split("(")[1].split()[0]
    assert float(rate) > 0, lines["time"]
    totals = wdspack.read_manifest(tmp_path / "out" / "manifest.json").totals
    assert totals["images"] == 0 and totals["max_image_tokens_per_pack"] > 0
    (batch,) = wdspack.make_loader(str(tmp_path / "out"), batch_size=1, num_workers=0, processor=str(folder))
    assert batch["pixel_values"].shape[0] == 0 and not batch["image_mask"].any()
    assert batch["pixel_values_videos"].shape[0] > 0 and int(batch["video_mask"].sum()) == 3


def test_a_jpeg_named_mp4_is_not_a_video(data, tmp_path, capsys):
    from PIL import Image

    _, folder = data
    Image.new("RGB", (40, 30), "red").save(tmp_path / "photo.mp4", format="JPEG")
    (tmp_path / "r.jsonl").write_text(json.dumps({"id": "photo", "videos": ["photo.mp4"], "messages": [
        {"role": "user", "content": "<video>What is it?"}, {"role": "assistant", "content": "A red square."}]}) + "\n")
    code, text = _pack(capsys, str(tmp_path / "r.jsonl"), "-o", str(tmp_path / "out"), "--processor", str(folder),
                       "--seq-len", "512", "--on-error", "raise")
    assert code != 0 and "video_too_short" not in text
    assert "video 0 ('photo.mp4'): not a video: the file is a JPEG image (FFmpeg reads it as 'jpeg_pipe'); list it " \
        "under the record's images, or give the video file (pass --on-error skip" in text
