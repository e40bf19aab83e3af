"""MiniCPM-V 4.6: an overview image plus a grid of slices, each its own NaViT patch sequence.

The image processor picks the slice grid from the image size (``get_sliced_grid``: about
``area / scale_resolution²`` slices, at most ``max_slice_nums``, the grid closest to the aspect
ratio), resizes the overview to about ``scale_resolution²`` and the slices to a refined size, in
``patch_size · 4`` steps. A slice of ``h × w`` patches is ``h·w / 16`` tokens (``"16x"``; ``"4x"``: / 4).
The processor writes, per image (``I`` the image token; ``use_image_id``: its index in the sample)::

    <image_id>0</image_id><image>I I I I</image><slice>I</slice><slice>I</slice>\\n
                                                 <slice>I</slice><slice>I</slice>     grid 2 × 2
    an image within scale_resolution²:  <image_id>0</image_id><image>I I I I</image>

The count comes from the image size alone, through the image processor's own methods. The loader
keeps each pack's patches as rows (``pixel_values`` ``[R, 3, P, P]``, ``patch_mask``) and each
slice's ``target_sizes`` ``[S, 2]`` (``slice_mask``); ``model_kwargs`` hands the model the real ones
in NaViT form (``[1, 3, P, n·P]``). The tower attends within each slice, so packing changes nothing
there. The text model (Qwen3.5) takes the restarting ``position_ids``; its linear-attention (Gated
DeltaNet) layers carry a recurrent state along the row, so wdspack runs them per sub-sample
(:func:`~wdspack.models.linear_attention.segment_linear_attention`; transformers' CPU path ignores
``cu_seqlens``). Under ``torch.compile`` (:func:`wdspack.models.compile.compile_decoder_layers`) those layers are
split instead (:func:`~wdspack.models.linear_attention.traceable_linear_attention`): their per-token work traced on
the whole rows, the per-segment core one custom op.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError, FormatError, SampleError
from ...media.video.pixels import row_normalizer
from ...media.video.plan import MAX_PLAN_FRAMES, VideoHeader
from ..family import Budgets, Family, ImageSide, Rows, VideoSide, take_rows
from ..linear_attention import segment_linear_attention
from ..varlen import CU_SEQLENS_KEY

__all__ = ["MINICPMV4_6", "MiniCPMVideoPlan", "MiniCPMVideoSampling", "image_layout", "plan_minicpmv"]


def _divisor(part: Any) -> int:
    """Patches per token: 16 (``"16x"``: the tower's window merger and the MLP merger, 2 × 2 each), or 4."""
    return 4 if getattr(part, "downsample_mode", "16x") == "4x" else 16


def image_layout(part: Any, height: int, width: int) -> tuple[list[int], list[list[int]]]:
    """``(grid, target_sizes)`` the image (or video) processor ``part`` gives an image of ``height × width``:
    the slice grid ``[rows, cols]`` (``[0, 0]``: the overview alone) and ``[h, w]`` in patches of the overview
    then each slice, by the processor's own methods (its ``_preprocess`` step by step).

    Example:
        >>> image_layout(MiniCPMV4_6ImageProcessorPil(scale_resolution=56), 56, 96)  # doctest: +SKIP
        ([1, 2], [[4, 4], [4, 4], [4, 4]])
    """
    if not getattr(part, "do_resize", True):
        raise ConfigError(f"{type(part).__name__} with do_resize false keeps each image's own size; wdspack plans "
                          "MiniCPM-V's resized slices only: set do_resize true")
    res, patch, mode = int(part.scale_resolution), int(part.patch_size), str(part.downsample_mode)
    grid = part.get_sliced_grid((height, width), int(part.max_slice_nums), res) if part.slice_mode else None
    src_h, src_w = part.find_best_resize((height, width), res, patch, downsample_mode=mode,
                                         allow_upscale=grid is None)
    sizes = [[src_h // patch, src_w // patch]]
    if grid is None:
        return [0, 0], sizes
    ref_h, ref_w = part.get_refine_size((height, width), grid, res, patch, downsample_mode=mode, allow_upscale=True)
    rows, cols = int(grid[0]), int(grid[1])
    sizes += [[ref_h // rows // patch, ref_w // cols // patch]] * (rows * cols)
    return [rows, cols], sizes


def _id_prefix(processor: Any, index: int) -> str:
    use = getattr(processor, "default_use_image_id", None)
    if use is None:
        use = getattr(processor.image_processor, "use_image_id", True)
    return f"{processor.image_id_start_token}{index}{processor.image_id_end_token}" if use else ""


def _replacements(processor: Any, sizes: Sequence[tuple[int, int]]) -> list[str]:
    ip, out = processor.image_processor, []
    for k, (height, width) in enumerate(sizes):
        grid, targets = image_layout(ip, int(height), int(width))
        inputs = {"grids": [grid], "num_patches_per_image": [len(targets)],
                  "target_sizes": np.array(targets, dtype=np.int32)}
        text = processor.replace_image_token(inputs, image_idx=0, image_token_divisor=_divisor(ip))
        out.append(_id_prefix(processor, k) + text)
    return out


def _patch_rows(pixel_values: torch.Tensor, patch: int) -> torch.Tensor:
    """NaViT ``[1, 3, P, n·P]`` as ``n`` patch rows ``[n, 3, P, P]`` (row-major patches of each slice in turn)."""
    channels = pixel_values.shape[1]
    return pixel_values[0].reshape(channels, patch, -1, patch).permute(2, 0, 1, 3)


def _navit(rows: torch.Tensor) -> torch.Tensor:
    """Patch rows ``[n, 3, P, P]`` back in the NaViT form the tower takes, ``[1, 3, P, n·P]``."""
    n, channels, patch, _ = rows.shape
    return rows.permute(1, 2, 0, 3).reshape(1, channels, patch, n * patch)


def _pixels(processor: Any, images: Sequence[Any]) -> dict[str, torch.Tensor]:
    ip = processor.image_processor
    out = ip(list(images), return_tensors="pt")
    return {"pixel_values": _patch_rows(out["pixel_values"], int(ip.patch_size)).to(torch.float32),
            "target_sizes": out["target_sizes"].to(torch.int64),
            "image_slices": torch.tensor(out["num_patches_per_image"], dtype=torch.int64)}


def _slots(part: Any, budgets: Budgets, tokens: int) -> tuple[int, int]:
    """``(patch rows, slice slots)`` per pack: ``divisor`` patches a token; a slice holds a token at least,
    and an image ``max_slice_nums + 1`` slices at most."""
    if not budgets.max_images:
        return 0, 0
    slices = min(tokens, budgets.max_images * (int(part.max_slice_nums) + 1))
    return tokens * _divisor(part), slices


def _pad(out: Mapping[str, torch.Tensor], processor: Any, budgets: Budgets,
         image_tokens: Sequence[int]) -> dict[str, torch.Tensor | Rows]:
    ip = processor.image_processor
    rows, slots = _slots(ip, budgets, budgets.image_tokens)
    patch, k = int(ip.patch_size), len(image_tokens)
    pv = out["pixel_values"] if k else torch.zeros(0, 3, patch, patch)
    sizes = out["target_sizes"] if k else torch.zeros(0, 2, dtype=torch.int64)
    if k:
        per_slice = (sizes.prod(dim=1) // _divisor(ip)).tolist()
        bounds = [0, *itertools.accumulate(out["image_slices"].tolist())]
        tokens = [sum(per_slice[a:b]) for a, b in itertools.pairwise(bounds)]
        if tokens != list(image_tokens):
            raise ConfigError(f"the image processor gives {tokens} image tokens for these images but the pack "
                              f"reserved {list(image_tokens)}; load with the processor (and settings) the dataset "
                              "was packed with")
    n, s = int(pv.shape[0]), int(sizes.shape[0])
    if n > rows or s > slots:
        raise ConfigError(f"{n} image patches in {s} slices > the {rows} patch rows and {slots} slice slots a pack "
                          "has room for; the dataset's manifest and the processor disagree: load with the processor "
                          "it was packed with")
    return {"pixel_values": Rows(pv, rows), "patch_mask": torch.arange(rows) < n,
            "target_sizes": Rows(sizes, slots), "slice_mask": torch.arange(slots) < s}


# ---- videos: each sampled frame laid out as an image -------------------------------------------
#
#     tokens   <image_id>k</image_id> then per frame <image>V…V</image><slice>V…V</slice>…   (k: the video's
#              index among its sample's videos; V the video token; the frame's slices as an image's)
#     pixels   pixel_values_videos [B·R, 3, P, P] patch rows + video_patch_mask, target_sizes_videos
#              [B·S, 2] + video_slice_mask (each frame's overview then its slices), video_mask [B·M]


@dataclass(frozen=True)
class MiniCPMVideoSampling:
    """``MiniCPMV4_6VideoProcessor``'s settings (its class defaults unless its config says): one frame a second
    (``fps`` is that rule, not a setting: only 1 is taken), at most ``max_frames`` (its ``max_num_frames``), each
    frame sliced as an image by ``scale_resolution`` / ``max_slice_nums``. ``num_frames``, ``max_pixels`` and
    ``min_pixels`` are :class:`~wdspack.media.video.plan.VideoSettings`' fields, which this family refuses.

    Example:
        >>> MiniCPMVideoSampling.from_config({"max_num_frames": 8, "scale_resolution": 56}).max_frames
        8
    """

    do_sample_frames: bool = True
    fps: float | None = 1.0
    min_frames: int = 1
    max_frames: int = 128
    stack_frames: int = 1
    scale_resolution: int = 448
    max_slice_nums: int = 9
    patch_size: int = 14
    slice_mode: bool = True
    downsample_mode: str = "16x"
    num_frames: int | None = None
    max_pixels: int | None = None
    min_pixels: int = 0

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> MiniCPMVideoSampling:
        """From the video processor's settings as a dict (``to_dict()``, or its saved file's).

        Raises:
            ConfigError: a setting of the wrong type, ``do_resize`` false, or ``stack_frames`` over 1.
        """
        out: dict[str, Any] = {}
        names = {"max_num_frames": "max_frames"}
        for key in ("do_sample_frames", "slice_mode", "do_resize"):
            if config.get(key) is not None and not isinstance(config[key], bool):
                raise ConfigError(f"the video processor's {key} {config[key]!r} is not true or false; fix its settings")
        for key in ("max_num_frames", "stack_frames", "scale_resolution", "max_slice_nums", "patch_size"):
            value = config.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"the video processor's {key} {value!r} is not a whole number >= 1; fix its "
                                  "settings")
            out[names.get(key, key)] = value
        for key in ("do_sample_frames", "slice_mode"):
            if config.get(key) is not None:
                out[key] = config[key]
        mode = config.get("downsample_mode")
        if mode is not None:
            if mode not in ("16x", "4x"):
                raise ConfigError(f"the video processor's downsample_mode {mode!r} is not '16x' or '4x'; fix its "
                                  "settings")
            out["downsample_mode"] = mode
        if config.get("do_resize") is False:
            raise ConfigError("the video processor has do_resize false, which keeps each frame's own size; wdspack "
                              "plans MiniCPM-V's resized slices only: set do_resize true")
        if out.get("stack_frames", 1) > 1:
            raise ConfigError(f"the video processor stacks {out['stack_frames']} sub-frames a second into composite "
                              "images (stack_frames), which wdspack does not plan; set stack_frames to 1")
        return cls(**out)


def _video_part(s: MiniCPMVideoSampling) -> Any:
    """The real ``MiniCPMV4_6VideoProcessor`` with ``s``' settings (built once per settings): its own methods
    sample the frames and lay each one out (no pixels: it needs torchvision only to resize)."""
    return _built_part(s.max_frames, s.scale_resolution, s.max_slice_nums, s.patch_size, s.slice_mode,
                       s.downsample_mode)


@functools.lru_cache(maxsize=8)
def _built_part(max_frames: int, scale_resolution: int, max_slice_nums: int, patch_size: int, slice_mode: bool,
                downsample_mode: str) -> Any:
    from transformers.models.minicpmv4_6.video_processing_minicpmv4_6 import MiniCPMV4_6VideoProcessor

    return MiniCPMV4_6VideoProcessor(max_num_frames=max_frames, stack_frames=1, scale_resolution=scale_resolution,
                                     max_slice_nums=max_slice_nums, patch_size=patch_size, slice_mode=slice_mode,
                                     downsample_mode=downsample_mode)


@dataclass(frozen=True)
class MiniCPMVideoPlan:
    """A :class:`~wdspack.media.video.plan.VideoPlan` (the same fields, read the same way) that also keeps each
    frame's layout for the text: its slice grid ``frame_grid`` (``(0, 0)``: the overview alone) and the
    ``frame_sizes`` in patches of its overview then each slice."""

    indices: tuple[int, ...]
    height: int
    width: int
    grid: tuple[int, int, int]
    tokens: int
    second_per_grid_t: float
    timestamps: tuple[float, ...] = ()
    frame_grid: tuple[int, int] = (0, 0)
    frame_sizes: tuple[tuple[int, int], ...] = ()


def plan_minicpmv(header: VideoHeader, s: MiniCPMVideoSampling) -> MiniCPMVideoPlan:
    """What MiniCPM-V 4.6's video processor makes of this video, from its header: the frames its
    ``sample_frames`` picks (one a second from frame 0, ``int(i · fps)``; a video longer than ``max_frames``
    seconds: every 0.1 s, thinned to ``max_frames``), or every frame; each frame laid out as an image of the
    header's size (:func:`image_layout`). ``size`` is the overview's, ``grid`` ``(frames, h, w)`` its patches;
    ``tokens`` all the frames' features; ``second_per_grid_t`` the seconds between sampled frames.

    Raises:
        ConfigError: ``--video-fps`` other than 1, ``--video-num-frames`` or ``--video-max-pixels`` (the
            processor has no such settings).

    Example:
        >>> plan_minicpmv(VideoHeader(frames=25, fps=10.0, width=66, height=50),
        ...               MiniCPMVideoSampling(scale_resolution=56, max_slice_nums=4)).indices
        (0, 10, 20)
    """
    for value, flag in ((s.num_frames, "--video-num-frames"), (s.max_pixels, "--video-max-pixels")):
        if value is not None:
            raise ConfigError(f"{flag} {value}: MiniCPM-V's video processor samples one frame a second and slices "
                              "each as an image (scale_resolution, max_slice_nums); leave it out (--video-max-frames "
                              "bounds the frames)")
    if s.fps != 1.0:
        raise ConfigError(f"--video-fps {s.fps}: MiniCPM-V's video processor samples one frame a second, which has "
                          "no setting; leave --video-fps out (--video-max-frames bounds the frames)")
    part = _video_part(s)
    if s.do_sample_frames:
        from transformers.video_utils import VideoMetadata

        meta = VideoMetadata(total_num_frames=header.frames, fps=header.fps, width=header.width,
                             height=header.height, duration=header.frames / header.fps)
        indices = [int(i) for i in part.sample_frames(meta, max_num_frames=s.max_frames, stack_frames=1)]
    else:
        indices = list(range(header.frames))
    if not indices or len(indices) > MAX_PLAN_FRAMES:
        raise SampleError("video_too_large" if indices else "video_too_short",
                          f"the plan names {len(indices)} frames of {header.frames}; a plan names 1 to "
                          f"{MAX_PLAN_FRAMES} (--video-max-frames bounds them)")
    grid, sizes = image_layout(part, header.height, header.width)
    per_frame = sum(h * w for h, w in sizes) // _divisor(part)
    count = len(indices)
    return MiniCPMVideoPlan(indices=tuple(indices), height=sizes[0][0] * s.patch_size,
                            width=sizes[0][1] * s.patch_size, grid=(count, sizes[0][0], sizes[0][1]),
                            tokens=count * per_frame,
                            second_per_grid_t=float(np.float32(header.frames / header.fps / count)),
                            frame_grid=(grid[0], grid[1]), frame_sizes=tuple((h, w) for h, w in sizes))


def _video_token(processor: Any) -> str:
    return str(processor.video_token)


def _video_sampling(processor: Any, config: Mapping[str, Any] | None) -> MiniCPMVideoSampling:
    """The video processor's settings (None: the loaded video processor's, else the class defaults); its mean, std
    and rescale must be the image processor's (the loader normalises video rows with those)."""
    if config is None:
        own = getattr(processor, "video_processor", None)
        config = own.to_dict() if own is not None and hasattr(own, "to_dict") else {}
    ip = processor.image_processor
    for key in ("image_mean", "image_std", "rescale_factor"):
        mine, theirs = config.get(key), getattr(ip, key, None)
        if mine is not None and theirs is not None and not np.array_equal(np.asarray(mine), np.asarray(theirs)):
            raise ConfigError(f"the video processor's {key} {mine} differs from the image processor's {theirs}; "
                              "the loader normalises video frames with the image processor's")
    return MiniCPMVideoSampling.from_config(config)


def _video_replacement(processor: Any, plan: MiniCPMVideoPlan, index: int) -> str:
    """The processor's own ``replace_video_token`` fed the plan's layout (every frame the header's size), after
    ``<image_id>index</image_id>`` (``index``: the video's place among its sample's videos)."""
    frames = len(plan.indices)
    inputs = {"target_sizes_videos": np.array(list(plan.frame_sizes) * frames, dtype=np.int32).reshape(-1, 2),
              "grids_videos": np.array([plan.frame_grid] * frames, dtype=np.int32),
              "num_frames_per_video": [frames]}
    text = processor.replace_video_token(inputs, video_idx=0, video_token_divisor=_divisor(processor.video_processor))
    return _id_prefix(processor, index) + text


def _video_pixels(processor: Any, videos: Sequence[bytes], plans: Sequence[Any], *,
                  max_pixels: int = 64_000_000) -> dict[str, Any]:
    """A pack's videos: only the planned frames decoded, each resized and cut as the video processor does (its
    overview, its slices; bicubic on uint8, antialiased) into uint8 patch rows (normalised where they land), and
    each unit's ``target_sizes_videos``."""
    from ...media.video.pixels import decode_frames, resize_frames

    part = processor.video_processor
    patch = int(part.patch_size)
    blocks, sizes, tokens = [], [], []
    for k, (data, plan) in enumerate(zip(videos, plans)):
        frames = decode_frames(data, plan.frames, max_pixels=max_pixels, index=k)
        height, width = int(frames.shape[1]), int(frames.shape[2])
        grid, targets = image_layout(part, height, width)
        if [targets[0][0] * patch, targets[0][1] * patch] != list(plan.size):
            raise FormatError(f"video {k}'s frames of {width}x{height} give an overview of {targets[0]} patches, "
                              f"but its plan says {list(plan.size)} pixels; load with the processor it was packed with")
        units = [resize_frames(frames, targets[0][0] * patch, targets[0][1] * patch)[:, None]]
        if grid != [0, 0]:
            rows, cols = grid
            sh, sw = targets[1][0] * patch, targets[1][1] * patch
            refined = resize_frames(frames, rows * sh, cols * sw)
            units += [refined[:, None, :, r * sh:(r + 1) * sh, c * sw:(c + 1) * sw]
                      for r in range(rows) for c in range(cols)]
        for t in range(len(plan.frames)):  # frame by frame: its overview, then its slices row by row
            blocks += [_uint8_rows(unit[t, 0], patch) for unit in units]
        sizes += targets * len(plan.frames)
        tokens.append(sum(h * w for h, w in targets) // _divisor(part) * len(plan.frames))
    return {"pixel_values_videos": tuple(blocks),
            "target_sizes_videos": torch.tensor(sizes, dtype=torch.int64).reshape(-1, 2),
            "video_tokens": torch.tensor(tokens, dtype=torch.int64)}


def _uint8_rows(unit: torch.Tensor, patch: int) -> torch.Tensor:
    """One resized unit ``[3, H, W]`` as its patch rows ``[H/P · W/P, 3, P, P]``, row-major (the NaViT order)."""
    channels, height, width = unit.shape
    rows = unit.reshape(channels, height // patch, patch, width // patch, patch).permute(1, 3, 0, 2, 4)
    return rows.reshape(-1, channels, patch, patch)


def _pad_videos(out: Mapping[str, Any], processor: Any, budgets: Budgets,
                video_tokens: Sequence[int]) -> dict[str, torch.Tensor | Rows]:
    """Patch rows as :class:`Rows` (``divisor`` a token, the pack's most video tokens), ``video_patch_mask``,
    ``target_sizes_videos`` in one slot a token (a unit holds one at least) with ``video_slice_mask``, and
    ``video_mask`` in ``max_images`` slots (the budget counts images and videos)."""
    part = processor.video_processor
    patch, most, M = int(part.patch_size), int(budgets.max_video_tokens or 0), budgets.max_images
    rows, slots = most * _divisor(part), most
    got = out["video_tokens"].tolist()
    if got != list(video_tokens):
        raise FormatError(f"the videos' frames give {got} tokens but the pack reserved {list(video_tokens)}")
    blocks, sizes = tuple(out["pixel_values_videos"]), out["target_sizes_videos"]
    n, s, k = sum(int(b.shape[0]) for b in blocks), int(sizes.shape[0]), len(got)
    if n > rows or s > slots or k > M:  # a pack unlike the manifest says: corrupt (counted and skipped)
        raise FormatError(f"{k} videos of {n} patches in {s} frames and slices > the {M} slots, {rows} patch rows "
                          f"and {slots} slice slots the dataset's manifest gives a pack")
    real = blocks if n else (torch.zeros(0, 3, patch, patch, dtype=torch.uint8),)
    finish = row_normalizer(processor.image_processor)  # channel-major rows: the video processor's fused form
    return {"pixel_values_videos": Rows(real, rows, torch.float32, finish), "video_patch_mask": torch.arange(rows) < n,
            "target_sizes_videos": Rows(sizes, slots), "video_slice_mask": torch.arange(slots) < s,
            "video_mask": torch.arange(M) < k}


def _model_kwargs(batch: Mapping[str, Any], model: Any) -> dict[str, Any]:
    segment_linear_attention(model)
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"],
                              CU_SEQLENS_KEY: batch["cu_seqlens"]}
    if bool(batch["image_mask"].any()):
        kwargs["pixel_values"] = _navit(take_rows(batch["pixel_values"], batch["patch_mask"]))
        kwargs["target_sizes"] = take_rows(batch["target_sizes"], batch["slice_mask"]).to(torch.int32)
    if "video_mask" in batch and bool(batch["video_mask"].any()):
        kwargs["pixel_values_videos"] = _navit(take_rows(batch["pixel_values_videos"], batch["video_patch_mask"]))
        kwargs["target_sizes_videos"] = take_rows(batch["target_sizes_videos"], batch["video_slice_mask"]).to(
            torch.int32)
    return kwargs


def _image_token(processor: Any) -> str:
    return str(processor.image_token)


MINICPMV4_6 = Family(
    name="minicpmv4_6", processors=("MiniCPMV4_6Processor",), model_types=("minicpmv4_6",),
    image=ImageSide(replacements=_replacements, pixels=_pixels, pad=_pad, feature_token=_image_token,
                    placeholder=_image_token),
    model_kwargs=_model_kwargs,
    notes="an overview + a grid of slices (<image>…</image><slice>…</slice> rows, <image_id>k</image_id>); NaViT "
          "patch rows + target_sizes [B·S, 2]; videos one frame a second, each frame laid out as an image; "
          "linear-attention layers run per sub-sample",
    video=VideoSide(placeholder=_video_token, feature_token=_video_token, sampling=_video_sampling,
                    plan=plan_minicpmv, replacement=_video_replacement, pixels=_video_pixels, pad=_pad_videos,
                    numbered=True),
)

FAMILIES = (MINICPMV4_6,)
