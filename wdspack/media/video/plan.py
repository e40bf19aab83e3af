"""A video's plan from its container header alone: which frames a model's video processor samples,
their size, grid and token count, with no pixel decoded (issue #40, the planning half).

    video bytes ─► read_header (PyAV: frame count, or the packets counted where the header has none;
                   │            frame rate; width, height; one demux pass finds the frames' data whole)
    video settings (media.settings: processor_config.json's "video_processor", else
                   │ video_preprocessor_config.json, else the image processor's; read as files: the
                   │ class needs torchvision) ─► QwenVideoSampling.from_config
                   ▼
    plan_qwen2_vl / plan_qwen3_vl ─► VideoPlan(indices, height, width, grid (t, h, w), tokens,
                                               second_per_grid_t, timestamps)

Holds: the rules are transformers 5.24's. ``Qwen2VLVideoProcessor`` (Qwen2-VL, Qwen2.5-VL): frames
sampled by ``fps`` (or ``num_frames``) within ``min_frames``/``max_frames``, rounded down to the
temporal patch, or every frame where the config does not sample; each frame resized by the image
rule (``smart_resize``). ``Qwen3VLVideoProcessor``: ``int(N / f · fps)`` frames at
``round(linspace(0, N - 1, T))``, resized under a pixel budget for the whole clip, and a timestamp
per temporal patch in the prompt. An odd frame count is padded with the last frame.
``LlavaOnevisionVideoProcessor`` (``plan_llava_onevision``): ``num_frames`` frames at
``arange(n) · N // n``, each resized to the tower's square, ``n · pooled² + 1`` tokens.
``tests/models/test_video.py`` checks them against transformers' own functions.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConfigError, SampleError
from .header import (  # noqa: F401  (the header's names, where they were first imported from)
    MAX_COUNT_SECONDS,
    MAX_COUNTED_FRAMES,
    MAX_FRAME_PIXELS,
    MAX_PLAN_FRAMES,
    MAX_VIDEO_PIXELS,
    VideoHeader,
    check_planned_frames,
    read_header,
)

__all__ = ["MAX_FRAME_PIXELS", "MAX_PLAN_FRAMES", "MAX_VIDEO_PIXELS", "QWEN3_VL_VIDEO", "LlavaVideoSampling",
           "QwenVideoSampling", "VideoHeader", "VideoPlan", "VideoSettings", "check_decode_size",
           "check_planned_frames", "plan_llava_onevision", "plan_qwen2_vl", "plan_qwen3_vl", "qwen3_vl_prompt",
           "read_header", "smart_resize"]

@dataclass(frozen=True)
class QwenVideoSampling:
    """A Qwen2-VL / Qwen2.5-VL video processor's settings (transformers' defaults unless a config says)."""

    do_sample_frames: bool = False
    fps: float | None = None
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
    def from_config(cls, config: Mapping[str, Any] | str | os.PathLike[str],
                    base: QwenVideoSampling | None = None, *, pixels_at_top: bool = True) -> QwenVideoSampling:
        """From the video processor's settings (a dict; a ``video_preprocessor_config.json`` or a processor folder,
        read as :func:`~wdspack.media.settings.read_settings` does); what they leave out keeps ``base``'s value
        (default: Qwen2-VL's class defaults).

        The pixel bounds are ``size``'s, in either spelling (``shortest_edge``/``longest_edge``, or 4.x's
        ``min_pixels``/``max_pixels``); a ``size`` replaces the class's whole, as the class does. ``pixels_at_top``:
        top-level ``min_pixels``/``max_pixels`` override it (``Qwen2VLVideoProcessor``; ``Qwen3VLVideoProcessor``
        ignores them).

        Raises:
            ConfigError: a setting of the wrong type, or a ``size`` without both bounds.

        Example:
            >>> QwenVideoSampling.from_config({"fps": 2.0, "do_sample_frames": True,
            ...                                "size": {"shortest_edge": 6272, "longest_edge": 50176}}).max_pixels
            50176
        """
        if not isinstance(config, Mapping):
            path = Path(config)
            if path.is_dir():
                from ..settings import read_settings

                found = read_settings(path, "video_processor").values
                return replace(base or cls()) if found is None else cls.from_config(found, base,
                                                                                    pixels_at_top=pixels_at_top)
            try:
                config = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise ConfigError(f"cannot read the video processor's settings from {path}: {e}") from None
            if not isinstance(config, Mapping):
                raise ConfigError(f"{path} holds a JSON {type(config).__name__}, not the video processor's settings")
        assert isinstance(config, Mapping)
        base = base or cls()
        out: dict[str, Any] = {}
        for key in ("do_sample_frames", "cap_pixels_per_frame"):
            if config.get(key) is not None:
                out[key] = _flag(config, key)
        if config.get("fps") is not None:
            out["fps"] = _number(config, "fps")
        for key in ("num_frames", "min_frames", "max_frames", "patch_size", "temporal_patch_size", "merge_size",
                    "max_video_tokens"):
            if config.get(key) is not None:
                out[key] = _whole(config, key, least=0 if key == "min_frames" else 1)
        bounds = {"min_pixels": base.min_pixels, "max_pixels": base.max_pixels}
        size = config.get("size")
        if size is not None:
            if not isinstance(size, Mapping):
                raise ConfigError(f"the video processor's size {size!r} is not a mapping; give "
                                  "{'shortest_edge': MIN_PIXELS, 'longest_edge': MAX_PIXELS}")
            bounds = {"min_pixels": _first(size, "shortest_edge", "min_pixels"),
                      "max_pixels": _first(size, "longest_edge", "max_pixels")}
        if pixels_at_top:  # Qwen2VLVideoProcessor.__init__: min_pixels / max_pixels over size
            bounds.update({k: config[k] for k in bounds if config.get(k) is not None})
        for key, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
            if bounds[key] is None:
                raise ConfigError(f"the video processor's size {dict(size or {})} has no {edge} (or {key}), which "
                                  f"it needs; give both: {{'shortest_edge': MIN_PIXELS, 'longest_edge': MAX_PIXELS}}")
            out[key] = _whole(bounds, key, least=1, name=f"size {edge}")
        return replace(base, **out)


def _flag(config: Mapping[str, Any], key: str) -> bool:
    value = config[key]
    if not isinstance(value, bool):
        raise ConfigError(f"the video processor's {key} {value!r} is not true or false; fix its settings")
    return value


def _number(config: Mapping[str, Any], key: str) -> float:
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"the video processor's {key} {value!r} is not a positive number; fix its settings")
    return float(value)


def _whole(config: Mapping[str, Any], key: str, *, least: int, name: str = "") -> int:
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < least:
        raise ConfigError(f"the video processor's {name or key} {value!r} is not a whole number >= {least}; fix its "
                          "settings")
    return int(value)


def _first(size: Mapping[str, Any], *keys: str) -> Any:
    return next((size[k] for k in keys if size.get(k) is not None), None)


@dataclass(frozen=True)
class VideoSettings:
    """The video sampling a user sets, over the processor's own (``wdspack pack --video-fps 2
    --video-max-frames 64 --video-max-pixels 200704``): None keeps the processor's value. Setting
    ``fps`` samples frames at that rate (the processor's ``do_sample_frames``), as LLaMA-Factory's
    ``video_fps`` and qwen-vl-utils do; ``max_pixels`` bounds each frame's resized area.

    Example:
        >>> VideoSettings(fps=1.0).apply(QwenVideoSampling()).do_sample_frames
        True
    """

    fps: float | None = None
    max_frames: int | None = None
    max_pixels: int | None = None
    #: a fixed count of frames per video instead of a rate (LLaVA-OneVision's ``num_frames``)
    num_frames: int | None = None

    def __post_init__(self) -> None:
        if self.fps is not None and self.num_frames is not None:
            raise ConfigError(f"--video-fps {self.fps} and --video-num-frames {self.num_frames}: give one (a rate or a "
                              "count of frames per video)")
        for name, flag in (("fps", "--video-fps"), ("max_frames", "--video-max-frames"),
                           ("max_pixels", "--video-max-pixels"), ("num_frames", "--video-num-frames")):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not value > 0):
                raise ConfigError(f"{flag} {value!r}: give a positive number (or leave it out for the processor's)")

    def apply(self, s: QwenVideoSampling) -> QwenVideoSampling:
        """``s`` with these settings over it."""
        out: dict[str, Any] = {}
        if self.fps is not None:
            out.update(fps=float(self.fps), do_sample_frames=True, num_frames=None)
        if self.num_frames is not None:
            out.update(num_frames=int(self.num_frames), do_sample_frames=True, fps=None)
        if self.max_frames is not None:
            out.update(max_frames=int(self.max_frames))
        if self.max_pixels is not None:
            factor = getattr(s, "patch_size", 0) * getattr(s, "merge_size", 0)
            if int(self.max_pixels) < factor * factor:
                raise ConfigError(f"--video-max-pixels {self.max_pixels} is less than one {factor}x{factor} block of "
                                  f"merged patches, the smallest a frame is resized to; give at least "
                                  f"{factor * factor}")
            out.update(max_pixels=int(self.max_pixels), min_pixels=min(s.min_pixels, int(self.max_pixels)))
        return replace(s, **out)


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
        raise SampleError("video_too_large", f"a {width}x{height} frame: the processor refuses an aspect ratio over "
                          "200; crop or pad the video")
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
        return np.arange(_every_frame(total), dtype=np.int64)
    if s.num_frames is not None:
        count = round(s.num_frames / tps) * tps
    else:
        if s.fps is None:
            raise ConfigError("the video processor samples frames but sets neither fps nor num_frames")
        top = math.floor(min(s.max_frames, total) / tps) * tps
        wanted = min(max(total / header.fps * s.fps, s.min_frames), top, total)
        count = math.floor(wanted / tps) * tps
    if count <= 0:
        raise SampleError("video_too_short", f"{total} frame(s): the processor samples frames in temporal patches of "
                          f"{tps}, so a video needs at least {tps}")
    if count > total:
        raise SampleError("video_too_short", f"{total} frames cannot give the {count} frames the processor samples "
                          "(lower --video-num-frames)")
    # transformers: torch.arange(0, total, total / count).int(): float32 steps, truncated
    step = np.float32(total) / np.float32(count)
    return (np.arange(count, dtype=np.float32) * step).astype(np.int64)


def check_decode_size(header: VideoHeader, plan: VideoPlan, *, max_pixels: int | None = None) -> VideoPlan:
    """``plan``, where decoding its frames holds at most ``max_pixels`` (default :data:`MAX_VIDEO_PIXELS`, the
    loader's bound) pixels: frames × width × height, from the header.

    Raises:
        SampleError: ``video_too_large``, naming the frames, their size and the settings that sample fewer.

    Example:
        >>> check_decode_size(VideoHeader(frames=90, fps=30.0, width=64, height=48),
        ...                   plan_qwen2_vl(VideoHeader(frames=90, fps=30.0, width=64, height=48),
        ...                                 QwenVideoSampling(do_sample_frames=True, fps=2.0))).grid
        (3, 20, 28)
    """
    limit = MAX_VIDEO_PIXELS if max_pixels is None else max_pixels
    pixels = len(plan.indices) * header.width * header.height
    if pixels > limit:
        raise SampleError("video_too_large", f"{len(plan.indices)} frames of {header.width}x{header.height} = {pixels} "
                          f"pixels to decode > the {limit} the loader decodes of one video; sample fewer frames "
                          "(--video-fps, --video-max-frames) or downscale the video")
    return plan


def _every_frame(total: int) -> int:
    """``total``, where a plan may name every frame (a processor that does not sample takes them all)."""
    if total > MAX_PLAN_FRAMES:
        raise SampleError("video_too_large", f"the header gives {total} frames and the video processor takes every "
                          f"frame (it does not sample) > the {MAX_PLAN_FRAMES} a plan may name; pass --video-fps or "
                          "--video-num-frames to sample fewer")
    return total


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
    return VideoPlan(indices=tuple(int(i) for i in indices), height=height, width=width, grid=grid, tokens=tokens,
                     second_per_grid_t=_second_per_grid_t(tps, count, header))


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
        raise SampleError("video_too_large", f"a {width}x{height} frame: the processor refuses an aspect ratio over "
                          "200; crop or pad the video")
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
        indices = np.arange(_every_frame(total), dtype=np.int64)
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
    return VideoPlan(indices=tuple(int(i) for i in indices), height=height, width=width, grid=grid,
                     tokens=grid[0] * grid[1] * grid[2] // (s.merge_size ** 2),
                     second_per_grid_t=_second_per_grid_t(tps, count, header), timestamps=stamps)


def _second_per_grid_t(tps: int, count: int, header: VideoHeader) -> float:
    """``tps / sampled_fps`` as the processor computes it (Python floats: ``VideoMetadata.sampled_fps`` is
    ``frames sampled / total · fps``), rounded to float32 as its tensor holds it."""
    return float(np.float32(tps / (count / header.frames * header.fps)))


def qwen3_vl_prompt(plan: VideoPlan, *, video_token: str = "<|video_pad|>", start: str = "<|vision_start|>",
                    end: str = "<|vision_end|>", merge_size: int = 2) -> str:
    """The text Qwen3-VL's processor puts in a video's place: per temporal patch its timestamp, then
    the vision start token, the patch's video tokens, the vision end token."""
    per_patch = plan.grid[1] * plan.grid[2] // (merge_size ** 2) if merge_size else plan.tokens // plan.grid[0]
    return "".join(f"<{t:.1f} seconds>{start}{video_token * per_patch}{end}" for t in plan.timestamps)



@dataclass(frozen=True)
class LlavaVideoSampling:
    """A LLaVA-OneVision video processor's settings: its frame sampling, the fixed frame size (the vision
    tower's), and the pooled features per frame (``ceil(sqrt(num_image_tokens) / 2)²``, the processor's).
    ``max_frames`` and ``max_pixels`` are :class:`VideoSettings`' fields, which this family does not take."""

    do_sample_frames: bool = False
    fps: float | None = None
    num_frames: int | None = None
    height: int = 384
    width: int = 384
    tokens_per_frame: int = 196
    max_frames: int | None = None
    min_pixels: int = 0
    max_pixels: int | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, num_image_tokens: int) -> LlavaVideoSampling:
        """From the video processor's settings as a dict (or the image processor's, which transformers
        falls back to) and the processor's ``num_image_tokens``.

        Raises:
            ConfigError: a setting of the wrong type, a size that is not a height and width, a crop, or
                another resampling than bicubic.

        Example:
            >>> s = LlavaVideoSampling.from_config({"size": {"height": 32, "width": 32}}, num_image_tokens=16)
            >>> s.height, s.tokens_per_frame
            (32, 4)
        """
        size = config.get("size") or {"height": cls.height, "width": cls.width}  # the class's 384 × 384
        if not isinstance(size, Mapping) or not (size.get("height") and size.get("width")):
            raise ConfigError(f"the LLaVA-OneVision video processor's size {size!r} is not a height and width; "
                              "its frames must be the vision tower's square size (e.g. {'height': 384, 'width': 384})")
        if config.get("do_center_crop"):
            raise ConfigError("the LLaVA-OneVision video processor crops its frames (do_center_crop): not supported; "
                              "set do_center_crop to false in its settings")
        if config.get("resample") not in (None, 3):  # PIL's BICUBIC: the resize wdspack does
            raise ConfigError(f"the LLaVA-OneVision video processor resamples with {config['resample']!r}; only "
                              "bicubic (3), its default, is supported")
        pooled = math.ceil(int(math.sqrt(num_image_tokens)) / 2)
        return cls(do_sample_frames=_flag(config, "do_sample_frames") if config.get("do_sample_frames") is not None
                   else False,
                   fps=_number(config, "fps") if config.get("fps") is not None else None,
                   num_frames=_whole(config, "num_frames", least=1) if config.get("num_frames") is not None else None,
                   height=_whole(size, "height", least=1, name="size height"),
                   width=_whole(size, "width", least=1, name="size width"), tokens_per_frame=pooled * pooled)


def plan_llava_onevision(header: VideoHeader, s: LlavaVideoSampling) -> VideoPlan:
    """What LLaVA-OneVision's video processor makes of this video, from its header: ``num_frames``
    frames at ``arange(n) · N // n`` (transformers' ``default_sample_indices_fn``), each resized to
    ``height × width``; ``tokens = n · tokens_per_frame + 1`` (one newline feature per video). ``grid``
    is ``(n, pooled, pooled)``, the pooled features per frame; ``second_per_grid_t`` the seconds between
    sampled frames (the model does not use it).

    Raises:
        ConfigError: sampling that gives videos different frame counts (``fps``, or every frame): the
            model takes one ``[videos, frames, 3, H, W]`` tensor per forward, so a batch needs one count.
        SampleError: ``video_too_short`` when the video has fewer frames than ``num_frames``.

    Example:
        >>> plan = plan_llava_onevision(VideoHeader(frames=10, fps=5.0, width=64, height=48),
        ...                             LlavaVideoSampling(do_sample_frames=True, num_frames=4))
        >>> plan.indices, plan.grid, plan.tokens
        ((0, 2, 5, 7), (4, 14, 14), 785)
    """
    for value, flag in ((s.max_frames, "--video-max-frames"), (s.max_pixels, "--video-max-pixels")):
        if value is not None:
            raise ConfigError(f"{flag} {value}: LLaVA-OneVision samples a fixed count of frames, each resized to "
                              f"{s.height}x{s.width}; leave {flag} out and give --video-num-frames")
    if not s.do_sample_frames or s.num_frames is None:
        how = f"at {s.fps} fps" if s.do_sample_frames and s.fps is not None else "every frame (do_sample_frames false)"
        raise ConfigError(f"LLaVA-OneVision's video processor samples {how}, so videos differ in frame count, but the "
                          "model takes one count per batch ([videos, frames, 3, H, W]); pass --video-num-frames N "
                          "(VideoSettings(num_frames=N))")
    if s.fps is not None:
        raise ConfigError(f"the video processor sets both fps {s.fps} and num_frames {s.num_frames}, which it refuses; "
                          "pass --video-num-frames N alone")
    total, count = header.frames, int(s.num_frames)
    if count > MAX_PLAN_FRAMES:
        raise ConfigError(f"--video-num-frames {count} > the {MAX_PLAN_FRAMES} frames a plan may name; lower it")
    if count > total:
        raise SampleError("video_too_short", f"{total} frames < the {count} frames --video-num-frames samples "
                          "(the processor refuses it); lower --video-num-frames")
    indices = np.arange(count, dtype=np.int64) * total // count
    side = math.isqrt(s.tokens_per_frame)
    return VideoPlan(indices=tuple(int(i) for i in indices), height=s.height, width=s.width, grid=(count, side, side),
                     tokens=count * s.tokens_per_frame + 1, second_per_grid_t=_second_per_grid_t(1, count, header))
