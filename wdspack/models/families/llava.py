"""LLaVA-1.5 (one fixed-size image, fixed token count) and LLaVA-OneVision (any-resolution tiles).

LLaVA-1.5: each image is resized and cropped to one ``S × S`` picture; the processor repeats
``<image>`` once per vision feature: ``(S / patch)²``, plus one for CLS unless the
``vision_feature_select_strategy`` is ``"default"`` (which drops it)::

    tokens   USER: <image> × 576 \\n What is it? ASSISTANT: A cat.      (336 px, patch 14, "default")
    pixels   pixel_values [M, 3, S, S] per pack, zero in empty slots

LLaVA-OneVision: a sample's lone image is a base tile (the whole image at ``S × S``) plus the
tiles of the grid pinpoint that fits its size best; the grid's features are cropped to the image's
aspect ratio (and pooled when larger than ``anyres_max_N`` tiles), one newline feature ends each
row. Two or more images in one sample are one padded square tile each, plus a newline. ``I`` is
one ``<image>`` token, ``N`` the one a newline feature fills (tiles of 2 × 2 features)::

    one image 96 px wide, 56 high: grid 2 × 3 tiles = 4 × 6 features, pooled to 3 × 4
    <|im_start|>user\n  I I I I   I I I I N  I I I I N  I I I I N  \nWhat is it?<|im_end|>\n
                        └ base ┘  └ the grid row by row, + N each ┘
    two images in one sample:     I I I I N   I I I I N     (one padded square tile each)
    pixels   pixel_values [M, P, 3, S, S] (P: the largest pinpoint's tiles + the base), image_sizes [M, 2]

The counts come from header sizes alone: the processor's own ``replace_image_token`` is fed the
sizes (and a shape-only stand-in for the processed tile). The loader runs the image processor per
sub-sample (``pixels_per_sample``), as ``apply_chat_template`` does, so each image gets the layout
its sample gives it; the model gets ``batch_num_images`` (images per sub-sample) to match.

LLaVA-OneVision's videos: ``num_frames`` frames each (one count per dataset: the model takes one
``[videos, n, 3, S, S]`` tensor per forward), ``n · pooled² + 1`` ``<video>`` tokens (the section below).

Both text models (Llama, Qwen2) build the block-causal mask from the restarting ``position_ids``;
the image features are scattered into the ``<image>`` tokens, so no other key is needed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError, FormatError
from ...media.video.pixels import row_normalizer
from ...media.video.plan import LlavaVideoSampling, plan_llava_onevision
from ..family import Budgets, Family, ImageSide, Rows, VideoSide, take_rows

__all__ = ["LLAVA", "LLAVA_ONEVISION"]


def _size(d: Any, key: str) -> int | None:
    """``d[key]`` of a ``SizeDict`` or a plain dict (image processors hold either)."""
    if d is None:
        return None
    value = d.get(key) if isinstance(d, Mapping) else getattr(d, key, None)
    return int(value) if value else None


def _output_side(ip: Any, *, square_input: bool) -> tuple[int, int]:
    """``(height, width)`` of the image processor's output picture (or tile), from its settings.

    Raises:
        ConfigError: the output size depends on the image (``shortest_edge`` resizing of a
            non-square input with no center crop); the vision tower needs one fixed size.
    """
    crop = getattr(ip, "crop_size", None)
    if getattr(ip, "do_center_crop", False) and (h := _size(crop, "height")) and (w := _size(crop, "width")):
        return h, w
    size = getattr(ip, "size", None)
    if (h := _size(size, "height")) and (w := _size(size, "width")):
        return h, w
    if square_input and (side := _size(size, "shortest_edge")):
        return side, side
    crops = getattr(ip, "do_center_crop", None)
    raise ConfigError(f"{type(ip).__name__} with size={size} and do_center_crop={crops} gives images of varying "
                      "sizes; set do_center_crop with crop_size (or size height/width) to the vision tower's "
                      "image size")


def _stand_in(*shape: int) -> np.ndarray:
    """A zero array of ``shape`` that takes no memory: the processor reads only its shape."""
    return np.broadcast_to(np.zeros((), np.float32), shape)


def _count(processor: Any, text: str) -> int:
    return len(text) // len(processor.image_token)


def _check_tokens(processor: Any, out: Mapping[str, torch.Tensor], image_tokens: Sequence[int]) -> None:
    """The processor's own count from the pixel outputs must be what the pack reserved."""
    tokens = [_count(processor, processor.replace_image_token(dict(out), image_idx=i))
              for i in range(len(image_tokens))]
    if tokens != list(image_tokens):
        raise ConfigError(f"the processor gives {tokens} image tokens for these images but the pack reserved "
                          f"{list(image_tokens)}; load with the processor (and settings) the dataset was packed with")


def _fit(value: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``value`` in the leading corner of a zero tensor of ``shape``."""
    out = torch.zeros(shape, dtype=dtype)
    if value is not None and value.numel():
        if any(a > b for a, b in zip(value.shape, shape)):
            raise ConfigError(f"pixel output of shape {tuple(value.shape)} does not fit the pack's {shape}; load "
                              "with the processor (and settings) the dataset was packed with")
        out[tuple(slice(0, n) for n in value.shape)] = value
    return out


# ---- LLaVA-1.5 ----------------------------------------------------------------------------------


def _llava_side(ip: Any) -> tuple[int, int]:
    # LlavaImageProcessor's do_pad pads to a square before resizing; CLIPImageProcessor has no such step.
    return _output_side(ip, square_input=bool(getattr(ip, "do_pad", False)))


def _llava_replacements(processor: Any, sizes: Sequence[tuple[int, int]]) -> list[str]:
    h, w = _llava_side(processor.image_processor)
    if not sizes:
        return []
    text = processor.replace_image_token({"pixel_values": _stand_in(1, 3, h, w)}, image_idx=0)
    return [text] * len(sizes)  # every image is resized to the same picture


def _llava_pad(out: Mapping[str, torch.Tensor], processor: Any, budgets: Budgets,
               image_tokens: Sequence[int]) -> dict[str, torch.Tensor | Rows]:
    k, (h, w) = len(image_tokens), _llava_side(processor.image_processor)
    if k:
        _check_tokens(processor, out, image_tokens)
    real = _fit(out.get("pixel_values") if k else None, (k, 3, h, w), torch.float32)
    return {"pixel_values": Rows(real, budgets.max_images)}  # the batch pads each pack to max_images slots


def _llava_kwargs(batch: Mapping[str, Any], model: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
    if bool(batch["image_mask"].any()):
        kwargs["pixel_values"] = take_rows(batch["pixel_values"], batch["image_mask"])
    return kwargs


# ---- LLaVA-OneVision ----------------------------------------------------------------------------


def _tile_cut(ip: Any) -> int:
    """The side of the tiles the image is cut into (as ``LlavaOnevisionImageProcessor`` picks it)."""
    for d, key in ((getattr(ip, "crop_size", None), "height"), (ip.size, "height"), (ip.size, "shortest_edge")):
        if side := _size(d, key):
            return side
    raise ConfigError(f"{type(ip).__name__} has no tile size (size={ip.size}); set size height/width")


def max_patches(ip: Any) -> int:
    """Patches of the largest grid pinpoint, plus the base tile: the patch rows of one image slot."""
    cut = _tile_cut(ip)
    return 1 + max(math.ceil(h / cut) * math.ceil(w / cut) for h, w in ip.image_grid_pinpoints)


def _onevision_replacements(processor: Any, sizes: Sequence[tuple[int, int]]) -> list[str]:
    h, w = _output_side(processor.image_processor, square_input=True)
    inputs = {"batch_num_images": [len(sizes)], "image_sizes": [[int(a), int(b)] for a, b in sizes],
              "pixel_values": [_stand_in(1, 3, h, w)]}
    return [processor.replace_image_token(inputs, image_idx=i) for i in range(len(sizes))]


def _onevision_pad(out: Mapping[str, torch.Tensor], processor: Any, budgets: Budgets,
                   image_tokens: Sequence[int]) -> dict[str, torch.Tensor | Rows]:
    ip, M, k = processor.image_processor, budgets.max_images, len(image_tokens)
    h, w = _output_side(ip, square_input=True)
    if k:
        _check_tokens(processor, out, image_tokens)
    real = _fit(out.get("pixel_values") if k else None, (k, max_patches(ip), 3, h, w), torch.float32)
    sizes = _fit(out.get("image_sizes") if k else None, (M, 2), torch.int64)
    video_only = bool(budgets.max_video_tokens) and budgets.max_image_tokens == 0  # no image slot to pad
    # pixels: the batch pads each pack to M slots
    return {"pixel_values": Rows(real, 0 if video_only else M), "image_sizes": sizes}


def images_per_sample(batch: Mapping[str, Any]) -> torch.Tensor:
    """``batch_num_images``: the real images of each sub-sample that has any, in order."""
    real = batch["image_mask"]
    owners = torch.stack([batch["image_pack_idx"][real], batch["image_sample_idx"][real]], dim=1)
    return torch.unique_consecutive(owners, dim=0, return_counts=True)[1]


def _onevision_kwargs(batch: Mapping[str, Any], model: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
    if bool(batch["image_mask"].any()):
        real = batch["image_mask"]
        kwargs["pixel_values"] = batch["pixel_values"][real]  # the model keeps each image's own patches
        kwargs["image_sizes"] = batch["image_sizes"][real]
        kwargs["batch_num_images"] = images_per_sample(batch)
    if "video_mask" in batch and bool(batch["video_mask"].any()):
        kwargs["pixel_values_videos"] = _video_tensor(batch)
    return kwargs


# ---- LLaVA-OneVision video ----------------------------------------------------------------------
#
# Each video is ``n`` frames at the tower's size; the model pools each frame's features to ``pooled²``
# and adds one newline feature per video. It takes one ``[videos, n, 3, S, S]`` tensor per forward, so a
# dataset's videos all have ``num_frames`` frames (--video-num-frames; fps sampling is refused at pack time).
#
#     tokens   <|im_start|>user\n<video>×(n·pooled² + 1)\nWhat happens?<|im_end|>\n
#     pixels   pixel_values_videos [B·R, 3, S, S] (R = max_video_tokens // pooled² frame rows per pack)
#              + video_frame_mask [B·R]; video_mask, video_frames [B·M] (frames per slot; M = max_images)


def _video_token(processor: Any) -> str:
    return str(getattr(processor, "video_token", None) or "<video>")


def _tokens_per_frame(processor: Any) -> int:
    """The pooled features of one frame: ``ceil(sqrt(num_image_tokens) / 2)²``, as the processor counts them."""
    n = getattr(processor, "num_image_tokens", None)
    if not n:
        raise ConfigError(f"{type(processor).__name__} has no num_image_tokens, which sizes its video tokens; set it "
                          "(the vision tower's features per tile: (image_size / patch_size)²)")
    pooled = math.ceil(int(math.sqrt(n)) / 2)
    return pooled * pooled


def _video_sampling(processor: Any, config: Mapping[str, Any] | None) -> LlavaVideoSampling:
    """The video processor's settings (``config``: as :func:`~wdspack.media.settings.read_settings` finds them, the
    image processor's file where a folder has no video settings, as transformers reads it); None (a processor in
    memory without its video processor): the image processor's tile size. Its frames must be the image tiles' size
    (the tower's)."""
    ip = processor.image_processor
    side = _output_side(ip, square_input=True)
    _tokens_per_frame(processor)  # a processor without num_image_tokens: said here, before any video
    s = LlavaVideoSampling.from_config({"size": {"height": side[0], "width": side[1]}} if config is None else config,
                                       num_image_tokens=int(processor.num_image_tokens))
    if (s.height, s.width) != side:
        raise ConfigError(f"the video processor resizes frames to {s.height}x{s.width} but the image tiles are "
                          f"{side[0]}x{side[1]}; the vision tower takes one size: set the video processor's size "
                          "to the image processor's")
    for key in ("image_mean", "image_std", "rescale_factor"):
        mine, theirs = (config or {}).get(key), getattr(ip, key, None)
        if mine is not None and theirs is not None and not np.allclose(mine, theirs, rtol=0, atol=0):
            raise ConfigError(f"the video processor's {key} {mine} differs from the image processor's {theirs}; "
                              "the loader normalises video frames with the image processor's")
    return s


def _video_pixels(processor: Any, videos: Sequence[bytes], plans: Sequence[Any], *,
                  max_pixels: int = 64_000_000) -> dict[str, Any]:
    """A pack's videos as uint8 ``[n, 3, S, S]`` frame blocks (only the planned frames decoded and resized as
    ``LlavaOnevisionVideoProcessor`` does on CPU; normalised by :func:`_pad_videos`' ``finish`` where they land)
    and their frame counts."""
    from ...media.video.pixels import decode_frames, resize_frames

    blocks = [resize_frames(decode_frames(data, plan.frames, max_pixels=max_pixels, index=k), *plan.size)
              for k, (data, plan) in enumerate(zip(videos, plans))]
    return {"pixel_values_videos": tuple(blocks),
            "video_frames": torch.tensor([len(p.frames) for p in plans], dtype=torch.int64)}


def _pad_videos(out: Mapping[str, Any], processor: Any, budgets: Budgets,
                video_tokens: Sequence[int]) -> dict[str, torch.Tensor | Rows]:
    """Frames as :class:`Rows` (``max_video_tokens // pooled²`` per pack: the most frames a pack can hold),
    ``video_frame_mask``, and ``video_mask`` / ``video_frames`` in ``max_images`` slots."""
    per_frame, M = _tokens_per_frame(processor), budgets.max_images
    h, w = _output_side(processor.image_processor, square_input=True)
    rows = budgets.max_video_tokens // per_frame
    blocks = tuple(out["pixel_values_videos"])
    frames = [int(b.shape[0]) for b in blocks]
    if [n * per_frame + 1 for n in frames] != list(video_tokens):
        raise FormatError(f"videos of {frames} frames give {[n * per_frame + 1 for n in frames]} tokens but the pack "
                          f"reserved {list(video_tokens)}")
    if any(tuple(b.shape[1:]) != (3, h, w) for b in blocks):
        raise ConfigError(f"video frames of {[tuple(b.shape[2:]) for b in blocks]} pixels, but the image tiles are "
                          f"{h}x{w}; load with the processor the dataset was packed with")
    n, k = sum(frames), len(blocks)
    if n > rows or k > M:  # a pack unlike the manifest says: corrupt (counted and skipped by the loader)
        raise FormatError(f"{k} videos of {n} frames > the {M} slots and {rows} frame rows the dataset's manifest "
                          "gives a pack")
    counts = torch.zeros(M, dtype=torch.int64)
    counts[:k] = torch.tensor(frames, dtype=torch.int64)
    real = blocks if n else (torch.zeros(0, 3, h, w, dtype=torch.uint8),)
    # normalised where the frames land in the batch (channel-major, as the video processor's fused form)
    finish = row_normalizer(processor.image_processor)
    return {"pixel_values_videos": Rows(real, rows, torch.float32, finish), "video_frame_mask": torch.arange(rows) < n,
            "video_frames": counts, "video_mask": torch.arange(M) < k}


def _video_tensor(batch: Mapping[str, Any]) -> torch.Tensor:
    """The batch's real frames as ``[videos, n, 3, S, S]``, the one shape ``get_video_features`` takes."""
    counts = take_rows(batch["video_frames"], batch["video_mask"]).tolist()
    if len(set(counts)) != 1:
        raise ConfigError(f"this batch's videos have {sorted(set(counts))} frames, but LLaVA-OneVision takes one "
                          "count per forward; pack every dataset of a mixture with the same --video-num-frames")
    frames = take_rows(batch["pixel_values_videos"], batch["video_frame_mask"])
    return frames.view(len(counts), counts[0], *frames.shape[1:])


#: LLaVA-OneVision: ``<video>`` × ``n · pooled² + 1``, from the processor's own ``replace_video_token``.
ONEVISION_VIDEO = VideoSide(placeholder=_video_token, feature_token=_video_token, sampling=_video_sampling,
                            plan=plan_llava_onevision,
                            replacement=lambda processor, plan: processor.replace_video_token(
                                {"pixel_values_videos": [_stand_in(len(plan.indices), 3, plan.height, plan.width)]},
                                video_idx=0),
                            pixels=_video_pixels, pad=_pad_videos)


LLAVA = Family(
    name="llava", processors=("LlavaProcessor",), model_types=("llava",),
    image=ImageSide(replacements=_llava_replacements, pad=_llava_pad), model_kwargs=_llava_kwargs,
    notes="one fixed-size picture per image, (S/patch)² (+CLS) <image> tokens; pixel_values [B·M, 3, S, S]",
)

LLAVA_ONEVISION = Family(
    name="llava_onevision", processors=("LlavaOnevisionProcessor",), model_types=("llava_onevision",),
    image=ImageSide(replacements=_onevision_replacements, pixels_per_sample=True, pad=_onevision_pad),
    model_kwargs=_onevision_kwargs,
    notes="any-resolution tiles + newline features (one square tile per image when a sample has several); "
          "pixel_values [B·M, P, 3, S, S], image_sizes [B·M, 2], batch_num_images; videos: --video-num-frames n "
          "frames, n·pooled²+1 <video> tokens, pixel_values_videos [videos, n, 3, S, S]",
    video=ONEVISION_VIDEO,
)

FAMILIES = (LLAVA, LLAVA_ONEVISION)
