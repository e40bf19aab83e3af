"""A video's plan from its container header alone: which frames a model's video processor samples,
their size, grid and token count, with no pixel decoded (issue #40, the planning half).

    video bytes ─► read_header (PyAV: frame count, or the packets counted where the header has none;
                   │            frame rate; width, height)
    video_preprocessor_config.json ─► QwenVideoSampling.from_config (read as a file: the processor
                   │                  class needs torchvision, which most data-prep machines lack)
                   ▼
    plan_qwen2_vl ─► VideoPlan(indices, height, width, grid (t, h, w), tokens, second_per_grid_t)

Holds: the rules are transformers 5.24's ``Qwen2VLVideoProcessor`` (Qwen2-VL and Qwen2.5-VL): frames
sampled by ``fps`` (or ``num_frames``) within ``min_frames``/``max_frames`` and rounded to the
temporal patch, or every frame where the config does not sample; each frame resized by the
image rule (``smart_resize``) under ``min_pixels``/``max_pixels``; an odd frame count padded with
the last frame. ``tests/models/test_video.py`` checks them against transformers' own functions.
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

__all__ = ["QwenVideoSampling", "VideoHeader", "VideoPlan", "plan_qwen2_vl", "read_header", "smart_resize"]

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
    temporal patch spans (Qwen2.5-VL's ``second_per_grid_ts``)."""

    indices: tuple[int, ...]
    height: int
    width: int
    grid: tuple[int, int, int]
    tokens: int
    second_per_grid_t: float


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
