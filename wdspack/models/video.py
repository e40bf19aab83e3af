"""A video's plan from its container header alone: which frames a model's video processor samples,
their size, grid and token count, with no pixel decoded (issue #40, the planning half).

    video bytes ─► read_header (PyAV: frame count, or the packets counted where the header has none;
                   │            frame rate; width, height)
    video_preprocessor_config.json ─► QwenVideoSampling.from_config (read as a file: the processor
                   │                  class needs torchvision, which most data-prep machines lack)
                   ▼
    plan_qwen2_vl / plan_qwen3_vl ─► VideoPlan(indices, height, width, grid (t, h, w), tokens,
                                               second_per_grid_t, timestamps)

Holds: the rules are transformers 5.24's. ``Qwen2VLVideoProcessor`` (Qwen2-VL, Qwen2.5-VL): frames
sampled by ``fps`` (or ``num_frames``) within ``min_frames``/``max_frames``, rounded down to the
temporal patch, or every frame where the config does not sample; each frame resized by the image
rule (``smart_resize``). ``Qwen3VLVideoProcessor``: ``int(N / f · fps)`` frames at
``round(linspace(0, N - 1, T))``, resized under a pixel budget for the whole clip, and a timestamp
per temporal patch in the prompt. An odd frame count is padded with the last frame.
``tests/models/test_video.py`` checks them against transformers' own functions.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, SampleError

__all__ = ["QwenVideoSampling", "VideoHeader", "VideoPlan", "plan_qwen2_vl", "plan_qwen3_vl", "qwen3_vl_prompt",
           "read_header", "smart_resize"]

_NO_AV = "reading videos needs PyAV, which is not installed: pip install 'wdspack[video]'  (or pip install av)"


@dataclass(frozen=True)
class VideoHeader:
    """What a video's container says: its frames, their rate (per second) and size."""

    frames: int
    fps: float
    width: int
    height: int


def read_header(data: bytes | str | os.PathLike[str], *, sample_id: str = "") -> VideoHeader:
    """The first video stream's frame count, rate and size, from the container (no frame decoded).

    A container whose header holds no frame count (WebM/Matroska) has its video packets counted: one
    pass over the demuxed packets, no decoding.

    Raises:
        SampleError: ``unreadable_video`` when the bytes are not a video PyAV can open.
    """
    try:
        import av
    except ImportError:
        raise ConfigError(_NO_AV) from None
    source: Any = io.BytesIO(data) if isinstance(data, bytes) else os.fspath(data)
    try:
        with av.open(source) as container:
            if not container.streams.video:
                raise SampleError("unreadable_video", "the container holds no video stream", sample_id)
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            frames = int(stream.frames or 0)
            if frames <= 0:  # WebM/Matroska: no count in the header; count the stream's packets
                frames = sum(1 for packet in container.demux(stream) if packet.size)
            width, height = int(stream.codec_context.width), int(stream.codec_context.height)
    except SampleError:
        raise
    except Exception as e:  # PyAV raises its own error types for damaged or unknown containers
        raise SampleError("unreadable_video", f"cannot read the video's header ({type(e).__name__}: {e})",
                          sample_id) from None
    if not rate or frames <= 0 or width <= 0 or height <= 0:
        raise SampleError("unreadable_video", f"the header gives {frames} frames at {rate} fps of {width}x{height}",
                          sample_id)
    return VideoHeader(frames=frames, fps=float(rate), width=width, height=height)


@dataclass(frozen=True)
class QwenVideoSampling:
    """A Qwen2-VL / Qwen2.5-VL video processor's settings (transformers' defaults unless a config says)."""

    do_sample_frames: bool = False
    fps: float | None = 2.0
    num_frames: int | None = None
    min_frames: int = 4
    max_frames: int = 768
    min_pixels: int = 128 * 28 * 28
    max_pixels: int = 28 * 28 * 768
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 128_000

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | str | os.PathLike[str]) -> QwenVideoSampling:
        """From a ``video_preprocessor_config.json`` (a path, a folder holding it, or its dict)."""
        if not isinstance(config, Mapping):
            path = Path(config)
            if path.is_dir():
                path = path / "video_preprocessor_config.json"
            try:
                config = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise ConfigError(f"cannot read the video processor's settings from {path}: {e}") from None
        assert isinstance(config, Mapping)
        size = config.get("size") or {}
        out: dict[str, Any] = {}
        for key in ("do_sample_frames", "fps", "num_frames", "min_frames", "max_frames", "patch_size",
                    "temporal_patch_size", "merge_size", "cap_pixels_per_frame", "max_video_tokens"):
            if config.get(key) is not None:
                out[key] = config[key]
        pixels = {"min_pixels": config.get("min_pixels", size.get("shortest_edge")),
                  "max_pixels": config.get("max_pixels", size.get("longest_edge"))}
        out.update({k: int(v) for k, v in pixels.items() if v is not None})
        return cls(**out)


@dataclass(frozen=True)
class VideoPlan:
    """The frames to decode (``indices``, in the video's numbering), the size they are resized to,
    the vision grid ``(t, h, w)`` in patches, the tokens the video takes, and the seconds one
    temporal patch spans (Qwen2.5-VL's ``second_per_grid_ts``); Qwen3-VL's timestamps."""

    indices: tuple[int, ...]
    height: int
    width: int
    grid: tuple[int, int, int]
    tokens: int
    second_per_grid_t: float
    #: Qwen3-VL: the seconds written before each temporal patch (the mean time of its frames)
    timestamps: tuple[float, ...] = ()


def smart_resize(height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The Qwen-VL resize rule: both sides multiples of ``factor``, the area within the pixel bounds,
    the aspect ratio kept as closely as that allows.

    Example:
        >>> smart_resize(48, 64, factor=28, min_pixels=128 * 28 * 28, max_pixels=28 * 28 * 768)
        (280, 392)
    """
    if max(height, width) / min(height, width) > 200:
        raise ConfigError(f"a {width}x{height} frame: the aspect ratio must be under 200")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def sample_indices(header: VideoHeader, s: QwenVideoSampling) -> np.ndarray:
    """The frames the processor samples (every frame where it does not sample)."""
    total, tps = header.frames, s.temporal_patch_size
    if not s.do_sample_frames:
        return np.arange(total, dtype=np.int64)
    if s.num_frames is not None:
        count = round(s.num_frames / tps) * tps
    else:
        if s.fps is None:
            raise ConfigError("the video processor samples frames but sets neither fps nor num_frames")
        top = math.floor(min(s.max_frames, total) / tps) * tps
        wanted = min(max(total / header.fps * s.fps, s.min_frames), top, total)
        count = math.floor(wanted / tps) * tps
    if count > total or count <= 0:
        raise SampleError("video_too_short", f"{total} frames cannot give the {count} frames the processor samples "
                          "(lower fps or num_frames)")
    # transformers: torch.arange(0, total, total / count).int(): float32 steps, truncated
    step = np.float32(total) / np.float32(count)
    return (np.arange(count, dtype=np.float32) * step).astype(np.int64)


def plan_qwen2_vl(header: VideoHeader, s: QwenVideoSampling) -> VideoPlan:
    """What Qwen2-VL's and Qwen2.5-VL's video processor makes of this video, from its header.

    Example:
        >>> plan = plan_qwen2_vl(VideoHeader(frames=90, fps=30.0, width=64, height=48),
        ...                      QwenVideoSampling(do_sample_frames=True, fps=2.0))
        >>> plan.indices, plan.grid, plan.tokens
        ((0, 15, 30, 45, 60, 75), (3, 20, 28), 420)
    """
    indices = sample_indices(header, s)
    count, tps = len(indices), s.temporal_patch_size
    factor = s.patch_size * s.merge_size
    max_pixels = s.max_pixels
    if s.cap_pixels_per_frame:  # the per-frame cap bounded by an even share of max_video_tokens
        total_pixels = int(s.max_video_tokens * factor * factor * 0.9)
        max_pixels = max(min(max_pixels, total_pixels * tps // count), int(s.min_pixels * 1.05))
    height, width = smart_resize(header.height, header.width, factor=factor, min_pixels=s.min_pixels,
                                 max_pixels=max_pixels)
    grid = (-(-count // tps), height // s.patch_size, width // s.patch_size)
    tokens = grid[0] * grid[1] * grid[2] // (s.merge_size ** 2)
    sampled_fps = np.float32(count) / np.float32(header.frames) * np.float32(header.fps)
    return VideoPlan(indices=tuple(int(i) for i in indices), height=height, width=width, grid=grid, tokens=tokens,
                     second_per_grid_t=float(np.float32(tps) / sampled_fps))


#: Qwen3-VL's video processor's own defaults (patch 16, merge 2: a factor of 32 pixels; 2 frames a second)
QWEN3_VL_VIDEO = QwenVideoSampling(do_sample_frames=True, fps=2.0, min_pixels=128 * 32 * 32,
                                   max_pixels=32 * 32 * 768, patch_size=16)


def smart_resize_clip(frames: int, height: int, width: int, *, temporal_factor: int, factor: int, min_pixels: int,
                      max_pixels: int) -> tuple[int, int]:
    """Qwen3-VL's resize rule: as :func:`smart_resize`, with the pixel bounds over the whole clip."""
    if frames < temporal_factor:
        raise SampleError("video_too_short", f"{frames} frames: Qwen3-VL's video processor needs at least "
                          f"{temporal_factor}")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ConfigError(f"a {width}x{height} frame: the aspect ratio must be under 200")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    t = round(frames / temporal_factor) * temporal_factor
    if t * h * w > max_pixels:
        beta = math.sqrt((frames * height * width) / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif t * h * w < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def plan_qwen3_vl(header: VideoHeader, s: QwenVideoSampling = QWEN3_VL_VIDEO) -> VideoPlan:
    """What Qwen3-VL's video processor makes of this video, from its header; ``timestamps`` are the
    seconds its processor writes before each temporal patch.

    Example:
        >>> plan = plan_qwen3_vl(VideoHeader(frames=90, fps=30.0, width=64, height=48))
        >>> plan.indices, plan.grid, plan.timestamps
        ((0, 18, 36, 53, 71, 89), (3, 8, 12), (0.3, 1.4833333333333334, 2.666666666666667))
    """
    total, tps = header.frames, s.temporal_patch_size
    if not s.do_sample_frames:
        indices = np.arange(total, dtype=np.int64)
    else:
        if s.num_frames is not None:
            count = s.num_frames
        elif s.fps is not None:
            count = min(max(int(total / header.fps * s.fps), s.min_frames), s.max_frames, total)
        else:
            count = min(max(total, s.min_frames), s.max_frames)
        indices = np.linspace(0, total - 1, count).round().astype(np.int64)
    count = len(indices)
    factor = s.patch_size * s.merge_size
    max_pixels = s.max_pixels
    if s.cap_pixels_per_frame:  # per frame: at most max_video_tokens patches, or an even share of the budget
        per_frame = max(min(s.max_video_tokens * factor * factor, s.max_pixels // count), int(s.min_pixels * 1.05))
        max_pixels = per_frame * count
    height, width = smart_resize_clip(count, header.height, header.width, temporal_factor=tps, factor=factor,
                                      min_pixels=s.min_pixels, max_pixels=max_pixels)
    grid = (-(-count // tps), height // s.patch_size, width // s.patch_size)
    padded = [int(i) for i in indices] + [int(indices[-1])] * (-count % tps)
    seconds = [i / header.fps for i in padded]
    stamps = tuple((seconds[k] + seconds[k + tps - 1]) / 2 for k in range(0, len(seconds), tps))
    sampled_fps = np.float32(count) / np.float32(total) * np.float32(header.fps)
    return VideoPlan(indices=tuple(int(i) for i in indices), height=height, width=width, grid=grid,
                     tokens=grid[0] * grid[1] * grid[2] // (s.merge_size ** 2),
                     second_per_grid_t=float(np.float32(tps) / sampled_fps), timestamps=stamps)


def qwen3_vl_prompt(plan: VideoPlan, *, video_token: str = "<|video_pad|>", start: str = "<|vision_start|>",
                    end: str = "<|vision_end|>", merge_size: int = 2) -> str:
    """The text Qwen3-VL's processor puts in a video's place: per temporal patch its timestamp, then
    the vision start token, the patch's video tokens, the vision end token."""
    per_patch = plan.grid[1] * plan.grid[2] // (merge_size ** 2)
    return "".join(f"<{t:.1f} seconds>{start}{video_token * per_patch}{end}" for t in plan.timestamps)
