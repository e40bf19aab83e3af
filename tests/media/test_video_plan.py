"""A video planned from its header alone (issue #40, planning): the header read by PyAV on clips made
here (MP4 with a frame count, WebM without one); Qwen2-VL's and Qwen3-VL's frame sampling, resize,
grid and timestamps compared with transformers' own code on the same headers (one process computes
them: transformers' video modules import torchvision at the top, which the CPU torch here cannot
load, so that process alone gives them an empty module to import; the functions called use torch
and numpy only)."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from wdspack.errors import SampleError
from wdspack.media.video.plan import QwenVideoSampling, VideoHeader, plan_qwen2_vl, read_header

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


_REFERENCE2 = r"""
import types, importlib.util
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
for header, s in CASES2:
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
OUT2 = out
"""


def _cases2(clips) -> list:
    headers = [read_header(clips["mp4"]), read_header(clips["webm"]),
               VideoHeader(frames=600, fps=29.97, width=640, height=360),
               VideoHeader(frames=7, fps=10.0, width=30, height=2000),
               VideoHeader(frames=1801, fps=59.94, width=1920, height=1080)]
    settings = [QwenVideoSampling(do_sample_frames=True, fps=2.0), QwenVideoSampling(do_sample_frames=True, fps=0.5),
                QwenVideoSampling(do_sample_frames=True, fps=None, num_frames=9),
                QwenVideoSampling(do_sample_frames=True, fps=2.0, min_frames=2, max_frames=6,
                                  max_pixels=64 * 28 * 28),
                QwenVideoSampling(do_sample_frames=False, min_pixels=4 * 28 * 28)]
    return [(h, s) for h in headers for s in settings if s.do_sample_frames or h.frames < 100]


def _cases3(clips) -> list:
    from wdspack.media.video.plan import QWEN3_VL_VIDEO

    headers = [read_header(clips["mp4"]), read_header(clips["webm"]),
               VideoHeader(frames=600, fps=29.97, width=640, height=360),
               VideoHeader(frames=3, fps=1.0, width=20, height=700),
               VideoHeader(frames=1, fps=1.0, width=64, height=64),
               VideoHeader(frames=1801, fps=59.94, width=1920, height=1080)]
    settings = [QWEN3_VL_VIDEO, QwenVideoSampling(**{**QWEN3_VL_VIDEO.__dict__, "fps": 0.5}),
                QwenVideoSampling(**{**QWEN3_VL_VIDEO.__dict__, "fps": None, "num_frames": 9}),
                QwenVideoSampling(**{**QWEN3_VL_VIDEO.__dict__, "min_frames": 1, "max_frames": 7,
                                     "max_pixels": 64 * 32 * 32})]
    return [(h, s) for h in headers for s in settings if not (s.num_frames and s.num_frames > h.frames)]


@pytest.fixture(scope="module")
def references(clips) -> tuple[list, list]:
    return _references(_cases2(clips), _cases3(clips))


def test_qwen2_vl_plans_as_the_processor_samples_and_lays_out(clips, references):
    cases, reference = _cases2(clips), references[0]
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


_REFERENCE3 = r"""
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor as P, smart_resize
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.video_utils import VideoMetadata
out = []
for header, s in CASES3:
    meta = VideoMetadata(total_num_frames=header["frames"], fps=header["fps"], width=header["width"],
                         height=header["height"])
    me = types.SimpleNamespace(fps=s["fps"], min_frames=s["min_frames"], max_frames=s["max_frames"])
    indices = P.sample_frames(me, meta, num_frames=s["num_frames"], fps=None if s["num_frames"] else s["fps"])
    factor = s["patch_size"] * s["merge_size"]
    try:
        h, w = smart_resize(len(indices), header["height"], header["width"], temporal_factor=s["temporal_patch_size"],
                            factor=factor, min_pixels=s["min_pixels"], max_pixels=s["max_pixels"])
    except ValueError as e:
        out.append({"error": str(e)})
        continue
    video = torch.zeros(1, len(indices), 3, h, w, device="meta")  # shapes only: no memory
    _, t, gh, gw = P.patchify(None, video, s["patch_size"], s["merge_size"], s["temporal_patch_size"])
    stamps = Qwen3VLProcessor._calculate_timestamps(None, indices, header["fps"], s["temporal_patch_size"])
    out.append({"indices": indices.tolist(), "size": [h, w], "grid": [t, gh, gw], "stamps": stamps})
OUT3 = out
"""


def _references(cases2: list, cases3: list) -> tuple[list, list]:
    """transformers' own answers for both families, from one process (importing transformers takes seconds)."""
    script = ("import json, sys\nCASES2, CASES3 = json.loads(sys.stdin.read())\n" + _REFERENCE2 + _REFERENCE3
              + "\nprint(json.dumps([OUT2, OUT3]))\n")
    payload = json.dumps([[[h.__dict__, s.__dict__] for h, s in cases] for cases in (cases2, cases3)])
    done = subprocess.run([sys.executable, "-c", script], input=payload, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out2, out3 = json.loads(done.stdout)
    return out2, out3


def test_qwen3_vl_plans_frames_size_and_timestamps_as_its_processor(clips, references):
    from wdspack.media.video.plan import plan_qwen3_vl, qwen3_vl_prompt

    cases = _cases3(clips)
    refused = 0
    for (header, s), ref in zip(cases, references[1], strict=True):
        where = f"{header} {s}"
        if "error" in ref:
            with pytest.raises(SampleError, match="video_too_short"):
                plan_qwen3_vl(header, s)
            refused += 1
            continue
        plan = plan_qwen3_vl(header, s)
        assert (list(plan.indices), [plan.height, plan.width], list(plan.grid)) == (
            ref["indices"], ref["size"], ref["grid"]), where
        assert list(plan.timestamps) == ref["stamps"], where
        text = qwen3_vl_prompt(plan)
        assert text.count("<|video_pad|>") == plan.tokens and text.count(" seconds>") == plan.grid[0]
    assert 0 < refused < len(cases) - 10
