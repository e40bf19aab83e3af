"""GLM-4.1V, GLM-4.5V and GLM-4.6V: Qwen2-VL's patches and grids, every frame of a video an image of its own.

GLM-4.5V (``Glm4vMoeForConditionalGeneration``, model type ``glm4v_moe``) is GLM-4.1V's processor (``Glm4vProcessor``)
in front of a mixture-of-experts text model with GLM-4.1V's ``get_rope_index``: the same tokens, pixels and
positions, so the same family. Inside the model its text rope turns each rotated dimension with the one half the
rotary width away (NeoX's pairs; GLM-4.1V's pairs neighbours), and each token goes to its own experts.

An image becomes ``t·h·w / merge²`` ``<|image|>`` tokens between the template's ``<|begin_of_image|>`` and
``<|end_of_image|>`` (the image processor's ``smart_resize`` counts the image as two frames). A video's
``<|video|>`` becomes, per temporal patch (two sampled frames), an image of ``<|image|>`` tokens and that patch's
time: ``<|begin_of_image|>`` + pads + ``<|end_of_image|>`` + ``3`` (GLM-4.1V) or ``3.0 seconds`` (GLM-4.6V),
all inside the template's ``<|begin_of_video|>`` … ``<|end_of_video|>``; video tokens are ``<|image|>`` too.

Positions per sub-sample (the model's ``get_rope_index`` on it alone): text counts on; each image and each frame
sits on its ``1 × h/merge × w/merge`` grid at the next position, text after it resumes at ``start + max(h, w)/merge``
(Qwen2-VL's rows, with a video split into one-frame grids as Qwen3-VL's)::

    tokens    <sop> <boi> [P] [P] [P] [P] <eoi>  0  <boi> [P] [P] [P] [P] <eoi>  1    (a video: two 1×2×2 frames)
    row 0       0     1    2   3   4   5    6    7    8    9  10  11  12   13   14   restarts per sub-sample
    temporal    0     1    2   2   2   2    4    5    6    7   7   7   7    9   10
    height      0     1    2   2   3   3    4    5    6    7   7   8   8    9   10
    width       0     1    2   3   2   3    4    5    6    7   8   7   8    9   10

``position_ids`` is ``[4, B, L]`` (the restarting text row, then the three rows); ``mm_token_type_ids`` is 1 on an
image's tokens, 2 on a video's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError, SampleError
from ...media.video.plan import VideoHeader, VideoPlan, smart_resize_clip
from ..family import Family, ImageSide, VideoSide, take_rows
from ..vision_meta import precomputed_vision_kwargs
from .qwen_vl import (
    _finish,
    _frame_grids,
    _pad_pixels,
    _pad_videos,
    _pixels,
    _replacements,
    _video_pixels,
    mrope_positions,
)

__all__ = ["GLM46V", "GLM4V", "GlmVideoSampling", "glm_positions", "plan_glm46v", "plan_glm4v"]


@dataclass(frozen=True)
class GlmVideoSampling:
    """A GLM video processor's settings (``Glm4vVideoProcessor``'s class defaults unless a config says).

    ``num_frames`` and ``max_frames`` have no counterpart in either class (they stay None: set by the user, the plan
    refuses them); GLM-4.6V's class ignores ``fps`` (it picks a rate from each video's length: None here)."""

    do_sample_frames: bool = True
    fps: float | None = 2.0
    max_duration: int = 300
    min_pixels: int = 112 * 112
    max_pixels: int = 28 * 28 * 2 * 30000
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    num_frames: int | None = None
    max_frames: int | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None, base: GlmVideoSampling) -> GlmVideoSampling:
        """``base`` with the settings ``config`` gives (a video processor's, or the image processor's it is built
        from); ``size`` replaces the pixel bounds whole, as the class takes it.

        Example:
            >>> GlmVideoSampling.from_config({"fps": 1, "size": {"shortest_edge": 3136, "longest_edge": 50176}},
            ...                              GlmVideoSampling()).max_pixels
            50176
        """
        if config is None:
            return base
        out: dict[str, Any] = {}
        if config.get("do_sample_frames") is not None:
            if not isinstance(config["do_sample_frames"], bool):
                raise ConfigError(f"the video processor's do_sample_frames {config['do_sample_frames']!r} is not true "
                                  "or false; fix its settings")
            out["do_sample_frames"] = config["do_sample_frames"]
        if config.get("fps") is not None and base.fps is not None:
            out["fps"] = _positive(config, "fps")
        for key in ("max_duration", "patch_size", "temporal_patch_size", "merge_size"):
            if config.get(key) is not None:
                out[key] = int(_positive(config, key, whole=True))
        size = config.get("size")
        if size is not None:
            if not isinstance(size, Mapping) or size.get("shortest_edge") is None or size.get("longest_edge") is None:
                raise ConfigError(f"the video processor's size {size!r} is not {{'shortest_edge': MIN_PIXELS, "
                                  "'longest_edge': MAX_PIXELS}}, which GLM's needs; fix its settings")
            out["min_pixels"] = int(_positive(size, "shortest_edge", whole=True))
            out["max_pixels"] = int(_positive(size, "longest_edge", whole=True))
        return replace(base, **out)


def _positive(config: Mapping[str, Any], key: str, *, whole: bool = False) -> float:
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or \
            (whole and value != int(value)):
        raise ConfigError(f"the video processor's {key} {value!r} is not a positive {'whole ' if whole else ''}"
                          "number; fix its settings")
    return float(value)


#: GLM-4.1V's video processor's defaults; GLM-4.6V's are the same but for the rate, which it picks itself.
GLM4V_VIDEO = GlmVideoSampling()
GLM46V_VIDEO = GlmVideoSampling(fps=None)


def _check(s: GlmVideoSampling, *, dynamic: bool) -> None:
    """Settings the class has no counterpart for, refused (the tokens would not be the processor's)."""
    who = "GLM-4.6V" if dynamic else "GLM-4.1V"
    if not s.do_sample_frames:
        raise ConfigError(f"{who}'s processor writes each frame's time, which its video processor gives only for the "
                          "frames it samples; set do_sample_frames true in the processor's video settings")
    if s.num_frames is not None or s.max_frames is not None:
        flag = "--video-num-frames" if s.num_frames is not None else "--video-max-frames"
        fix = "leave it out" if dynamic else "lower --video-fps (it samples at most max_duration · fps frames)"
        raise ConfigError(f"{flag} {s.num_frames or s.max_frames}: {who}'s video processor has no such setting; {fix}")
    if dynamic and s.fps is not None:
        raise ConfigError(f"--video-fps {s.fps:g}: GLM-4.6V's video processor picks the rate from each video's length "
                          "(3, 1 or 0.5 frames a second, two frames a temporal patch) and ignores fps; leave it out")


def _glm4v_indices(frames: int, fps: float, s: GlmVideoSampling) -> list[int]:
    """``Glm4vVideoProcessor.sample_frames``: ``fps`` frames a second (at least one), at most ``max_duration · fps``
    spread over a longer video."""
    assert s.fps is not None
    last, duration = frames - 1, frames / fps  # transformers' video loaders give duration = frames / fps
    if duration <= s.max_duration:
        n = max(math.floor(duration * s.fps), 1)
        return [min(last, math.ceil(i * fps / s.fps)) for i in range(n)]
    samples = int(s.max_duration * s.fps)
    if samples >= frames:
        return list(range(frames))
    return [min(last, math.ceil(t * fps)) for t in np.linspace(0, duration, samples, endpoint=True)]


def _glm46v_indices(frames: int, fps: float, s: GlmVideoSampling) -> list[int]:
    """``Glm46VVideoProcessor.sample_frames``: 3, 1 or 0.5 temporal patches a second by the video's length (up to
    30 s, 300 s, 2400 s seen), at most 640 frames, evened out where the walk finds too few or too many."""
    duration = frames / fps
    seen = min(duration, 2400)
    rate = 3 if seen <= 30 else 1 if seen <= 300 else 0.5
    wanted = min(int(seen * rate * s.temporal_patch_size), 640)
    if frames < wanted:
        picked = np.linspace(0, frames - 1, wanted, dtype=int).tolist()
    else:
        picked, second, step, top = [], 0.0, 1 / (s.temporal_patch_size * rate), int(duration)
        for k in range(frames):
            if k * (1 / fps) >= second:
                second += step
                picked.append(k)
                if second >= top:
                    break
    if len(picked) < wanted:
        start, end = (picked[0], picked[-1]) if picked else (0, max(frames - 1, 0))
        picked = np.linspace(start, end, wanted, dtype=int).tolist()
    elif len(picked) > wanted:
        picked = np.linspace(0, frames - 1, wanted, dtype=int).tolist()
    return picked


def _plan(header: VideoHeader, s: GlmVideoSampling, *, dynamic: bool) -> VideoPlan:
    _check(s, dynamic=dynamic)
    picked = (_glm46v_indices if dynamic else _glm4v_indices)(header.frames, header.fps, s)
    indices = list(dict.fromkeys(int(i) for i in picked))  # first of each, in order
    if not indices:
        raise SampleError("video_too_short", f"{header.frames} frame(s) at {header.fps:g} fps: GLM-4.6V's video "
                          "processor samples no frame of a video this short")
    if len(indices) % 2:
        indices.append(indices[-1])
    tps, factor = s.temporal_patch_size, s.patch_size * s.merge_size
    height, width = smart_resize_clip(len(indices), header.height, header.width, temporal_factor=tps, factor=factor,
                                      min_pixels=s.min_pixels, max_pixels=s.max_pixels)
    grid = (-(-len(indices) // tps), height // s.patch_size, width // s.patch_size)
    stamps = tuple(i / header.fps for i in indices[::2])[:grid[0]]  # VideoMetadata.timestamps[::2]
    return VideoPlan(indices=tuple(indices), height=height, width=width, grid=grid,
                     tokens=grid[0] * grid[1] * grid[2] // s.merge_size ** 2,
                     second_per_grid_t=float(np.float32(tps / (len(indices) / header.frames * header.fps))),
                     timestamps=stamps)


def plan_glm4v(header: VideoHeader, s: GlmVideoSampling = GLM4V_VIDEO) -> VideoPlan:
    """What GLM-4.1V's video processor makes of this video, from its header.

    Example:
        >>> plan = plan_glm4v(VideoHeader(frames=30, fps=10.0, width=64, height=48))
        >>> plan.indices, plan.grid, plan.timestamps
        ((0, 5, 10, 15, 20, 25), (3, 4, 4), (0.0, 1.0, 2.0))
    """
    return _plan(header, s, dynamic=False)


def plan_glm46v(header: VideoHeader, s: GlmVideoSampling = GLM46V_VIDEO) -> VideoPlan:
    """What GLM-4.6V's video processor makes of this video, from its header (its own rate by the length)."""
    return _plan(header, s, dynamic=True)


def _frame_text(plan: VideoPlan, processor: Any, stamp: Any) -> str:
    per_frame = plan.grid[1] * plan.grid[2] // int(processor.image_processor.merge_size) ** 2
    return "".join(f"<|begin_of_image|>{processor.image_token * per_frame}<|end_of_image|>{stamp(t)}"
                   for t in plan.timestamps)


def _sampling(base: GlmVideoSampling) -> Any:
    return lambda processor, config: GlmVideoSampling.from_config(config, base)


def glm_positions(input_ids: torch.Tensor, seq_lens: Sequence[int], pixels: Mapping[str, torch.Tensor],
                  processor: Any) -> dict[str, torch.Tensor]:
    """The family's ``token_rows``: ``[3, L]`` positions (:func:`~.qwen_vl.mrope_positions`, a video's frames as
    one-frame grids) and token types, a video's ``<|image|>`` told apart from an image's as the processor does (inside
    ``<|begin_of_video|>`` … ``<|end_of_video|>``)."""
    image_id = int(processor.image_token_id)
    merge = int(processor.image_processor.merge_size)
    grids = pixels.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.int64))
    is_media = input_ids == image_id
    opened = torch.cumsum(input_ids == int(processor.video_start_id), 0)
    in_video = opened > torch.cumsum(input_ids == int(processor.video_end_id), 0)
    is_video = is_media & in_video
    types = is_media.to(torch.int64) + is_video.to(torch.int64)
    if "video_grid_thw" not in pixels:
        rope = mrope_positions(input_ids, seq_lens, grids, image_token_id=image_id, merge_size=merge)
        return {"mrope_position_ids": rope, "mm_token_type_ids": types}
    marked = torch.where(is_video, torch.full_like(input_ids, -1), input_ids)  # frames apart from images
    rope = mrope_positions(marked, seq_lens, grids, image_token_id=image_id, merge_size=merge,
                           video_grids=_frame_grids(pixels["video_grid_thw"]), video_token_id=-1)
    return {"mrope_position_ids": rope, "mm_token_type_ids": types}


def _model_kwargs(batch: Mapping[str, Any], model: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"],
                              "mm_token_type_ids": batch["mm_token_type_ids"]}
    images = bool(batch["image_mask"].any())
    videos = "video_mask" in batch and bool(batch["video_mask"].any())
    if images and videos:  # the model takes one kind per call (both fill <|image|>): the frames go as images
        pixels, grid = _as_images(batch)
    elif images:
        pixels, grid = take_rows(batch["pixel_values"], batch["patch_mask"]), \
            take_rows(batch["image_grid_thw"], batch["image_mask"])
    if images:
        kwargs.update(pixel_values=pixels, image_grid_thw=grid)
        if grid.device.type == "cpu":  # the tower's bookkeeping, worked out here instead of on the GPU
            kwargs.update(precomputed_vision_kwargs(model, grid))
    elif videos:
        kwargs["pixel_values_videos"] = take_rows(batch["pixel_values_videos"], batch["video_patch_mask"])
        kwargs["video_grid_thw"] = take_rows(batch["video_grid_thw"], batch["video_mask"])
    return kwargs


def _as_images(batch: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's images and video frames as one list of images in the order their tokens come (the model fills
    ``<|image|>`` tokens in order): their patch rows and ``(1, h, w)`` grids. The tower sees each frame as
    ``get_video_features`` shows it one (a one-frame grid), so the features are the same."""
    image_grid = take_rows(batch["image_grid_thw"], batch["image_mask"]).cpu()
    frame_grid = _frame_grids(take_rows(batch["video_grid_thw"], batch["video_mask"]).cpu())
    types = batch["mm_token_type_ids"].cpu()
    starts = types.clone()
    starts[:, 1:] *= types[:, 1:] != types[:, :-1]  # the kind of each run of media tokens, at its first token
    kinds = starts[starts > 0].tolist()
    if kinds.count(1) != len(image_grid) or kinds.count(2) != len(frame_grid):
        raise ConfigError(f"the batch has {kinds.count(1)} images and {kinds.count(2)} video frames in its tokens but "
                          f"{len(image_grid)} and {len(frame_grid)} in its grids; load with the processor the dataset "
                          "was packed with")
    sizes = torch.cat([image_grid.prod(dim=1), frame_grid.prod(dim=1)])
    firsts = torch.cumsum(sizes, 0) - sizes  # each item's first row in [image rows; frame rows]
    which = iter(range(len(image_grid))), iter(range(len(image_grid), len(sizes)))
    order = torch.tensor([next(which[kind - 1]) for kind in kinds], dtype=torch.int64)
    rows = torch.cat([torch.arange(int(firsts[k]), int(firsts[k] + sizes[k])) for k in order.tolist()])
    pixels = torch.cat([take_rows(batch["pixel_values"], batch["patch_mask"]),
                        take_rows(batch["pixel_values_videos"], batch["video_patch_mask"])])
    return pixels.index_select(0, rows.to(pixels.device, non_blocking=True)), torch.cat([image_grid, frame_grid])[order]


def _image_processor() -> Any:
    from transformers import Glm4vImageProcessorPil

    return Glm4vImageProcessorPil()


def _video_side(base: GlmVideoSampling, plan: Any, stamp: Any) -> VideoSide:
    return VideoSide(placeholder=lambda processor: str(processor.video_token),
                     feature_token=lambda processor: str(processor.image_token), sampling=_sampling(base), plan=plan,
                     replacement=lambda processor, p: _frame_text(p, processor, stamp), pixels=_video_pixels,
                     pad=_pad_videos)


def _family(name: str, processor: str, model_types: tuple[str, ...], video: VideoSide, frame: str) -> Family:
    return Family(
        name=name, processors=(processor,), model_types=model_types,
        image=ImageSide(replacements=_replacements, pixels=_pixels, pad=_pad_pixels, uint8_pixels=True),
        token_rows=glm_positions, token_keys=("mrope_position_ids", "mm_token_type_ids"), finish_batch=_finish,
        model_kwargs=_model_kwargs, video=video,
        notes=f"flattened patches + image_grid_thw; position_ids [4, B, L] (text row + 3-D rows, a video's frames "
              f"one grid each); mm_token_type_ids; video frames fill <|image|>, each followed by {frame}",
    )


GLM4V = replace(_family("glm4v", "Glm4vProcessor", ("glm4v", "glm4v_moe"),
                        _video_side(GLM4V_VIDEO, plan_glm4v, lambda t: int(t)), "its second (3)"),
                aliases=("glm4v", "glm-4.1v", "glm-4.5v"), image_processor=_image_processor)
GLM46V = _family("glm46v", "Glm46VProcessor", ("glm46v",),
                 _video_side(GLM46V_VIDEO, plan_glm46v, lambda t: f"{t:.1f} seconds"), "its time (3.0 seconds)")

FAMILIES = (GLM4V, GLM46V)
