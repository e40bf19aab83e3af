"""A video planned from its header alone (issue #40, planning): the header read by PyAV on clips made
here (MP4 with a frame count, WebM without one), and Qwen2-VL's frame sampling, resize and grid
compared with transformers' own code on the same headers."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from wdspack.errors import SampleError
from wdspack.models.video import QwenVideoSampling, VideoHeader, plan_qwen2_vl, read_header

av = pytest.importorskip("av")


def _clip(path: Path, *, codec: str, rate: Fraction, frames: int, width: int, height: int) -> Path:
    """A small real clip: ``frames`` frames of moving colour, encoded with ``codec``."""
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for k in range(frames):
            pixels = np.full((height, width, 3), (k * 7) % 256, np.uint8)
            pixels[:, : (k % width)] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def _decoded(path: Path) -> int:
    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0))


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("clips")
    return {"mp4": _clip(folder / "a.mp4", codec="h264", rate=Fraction(30000, 1001), frames=47, width=66, height=50),
            "webm": _clip(folder / "b.webm", codec="libvpx-vp9", rate=Fraction(24), frames=31, width=64, height=36)}


def test_the_header_gives_the_frames_the_decoder_gives(clips):
    mp4 = read_header(clips["mp4"].read_bytes())
    assert (mp4.frames, mp4.width, mp4.height) == (_decoded(clips["mp4"]), 66, 50) == (47, 66, 50)
    assert mp4.fps == pytest.approx(30000 / 1001)
    webm = read_header(clips["webm"])  # its header holds no frame count: the packets are counted
    assert (webm.frames, webm.width, webm.height, webm.fps) == (_decoded(clips["webm"]), 64, 36, 24.0)


def test_bytes_that_are_not_a_video_are_a_drop_reason(tmp_path):
    with pytest.raises(SampleError, match=r"unreadable_video") as e:
        read_header(b"not a video at all" * 10, sample_id="v1")
    assert e.value.reason == "unreadable_video" and "v1" in str(e.value)


_REFERENCE = r"""
import json, sys, types, importlib.util
import torch
import transformers  # first: it finds torchvision missing, as it is
if importlib.util.find_spec("torchvision") is None:
    # this process only: transformers' Qwen2-VL video module imports torchvision's functional transforms at
    # the top; the functions called here (sample_frames, patchify, smart_resize) use torch and math alone
    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.v2",
                 "torchvision.transforms.v2.functional"):
        sys.modules[name] = types.ModuleType(name)
from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor as P
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
from transformers.video_utils import VideoMetadata
out = []
for header, s in json.loads(sys.stdin.read()):
    meta = VideoMetadata(total_num_frames=header["frames"], fps=header["fps"], width=header["width"],
                         height=header["height"])
    me = types.SimpleNamespace(num_frames=s["num_frames"], fps=s["fps"], temporal_patch_size=s["temporal_patch_size"],
                               min_frames=s["min_frames"], max_frames=s["max_frames"])
    if s["do_sample_frames"]:
        try:
            indices = P.sample_frames(me, meta).tolist()
        except ValueError as e:  # the processor refuses the video
            out.append({"error": str(e)})
            continue
    else:
        indices = list(range(header["frames"]))
    factor = s["patch_size"] * s["merge_size"]
    h, w = smart_resize(header["height"], header["width"], factor=factor, min_pixels=s["min_pixels"],
                        max_pixels=s["max_pixels"])
    video = torch.zeros(1, len(indices), 3, h, w, device="meta")  # shapes only: no memory
    _, t, gh, gw = P.patchify(None, video, s["patch_size"], s["merge_size"], s["temporal_patch_size"])
    out.append({"indices": indices, "size": [h, w], "grid": [t, gh, gw]})
print(json.dumps(out))
"""


def test_qwen2_vl_plans_as_the_processor_samples_and_lays_out(clips):
    headers = [read_header(clips["mp4"]), read_header(clips["webm"]),
               VideoHeader(frames=600, fps=29.97, width=640, height=360),
               VideoHeader(frames=7, fps=10.0, width=30, height=2000),
               VideoHeader(frames=1801, fps=59.94, width=1920, height=1080)]
    settings = [QwenVideoSampling(do_sample_frames=True), QwenVideoSampling(do_sample_frames=True, fps=0.5),
                QwenVideoSampling(do_sample_frames=True, fps=None, num_frames=9),
                QwenVideoSampling(do_sample_frames=True, min_frames=2, max_frames=6, max_pixels=64 * 28 * 28),
                QwenVideoSampling(do_sample_frames=False, min_pixels=4 * 28 * 28)]
    cases = [(h, s) for h in headers for s in settings if s.do_sample_frames or h.frames < 100]
    payload = json.dumps([[h.__dict__, s.__dict__] for h, s in cases])
    done = subprocess.run([sys.executable, "-c", _REFERENCE], input=payload, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    reference = json.loads(done.stdout)
    refused = 0
    for (header, s), ref in zip(cases, reference, strict=True):
        where = f"{header} {s}"
        if "error" in ref:  # what the processor refuses is a drop here, with the reason
            with pytest.raises(SampleError, match="video_too_short"):
                plan_qwen2_vl(header, s)
            refused += 1
            continue
        plan = plan_qwen2_vl(header, s)
        assert list(plan.indices) == ref["indices"], where
        assert [plan.height, plan.width] == ref["size"], where
        assert list(plan.grid) == ref["grid"], where
        assert plan.tokens == ref["grid"][0] * ref["grid"][1] * ref["grid"][2] // s.merge_size ** 2
    assert 0 < refused < len(cases) - 10  # both kinds of case were met


def test_settings_come_from_the_processor_folder_without_constructing_it(tmp_path):
    config = {"video_processor_type": "Qwen2VLVideoProcessor", "do_sample_frames": True, "fps": 1.0,
              "size": {"shortest_edge": 3136, "longest_edge": 200704}, "max_frames": 64, "temporal_patch_size": 2,
              "patch_size": 14, "merge_size": 2}
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(config))
    s = QwenVideoSampling.from_config(tmp_path)
    assert (s.do_sample_frames, s.fps, s.min_pixels, s.max_pixels, s.max_frames) == (True, 1.0, 3136, 200704, 64)
    plan = plan_qwen2_vl(VideoHeader(frames=300, fps=30.0, width=640, height=360), s)
    assert len(plan.indices) == 10 and plan.grid[0] == 5
    assert plan.second_per_grid_t == pytest.approx(2.0)  # 2 frames a temporal patch, sampled at 1 per second
