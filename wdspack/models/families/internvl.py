"""InternVL (InternVL3, 3.5 ``-hf``): images cut into square tiles plus a thumbnail, video frames as tiles.

An image of ``h × w`` is resized onto the grid of ``c × r`` tiles (``min_patches ≤ c·r ≤ max_patches``) whose
aspect ratio is closest to its own (the image processor's ``get_optimal_tiled_canvas``), plus a thumbnail
where the grid has more than one tile; each tile fills ``image_seq_length`` (256) ``<IMG_CONTEXT>`` tokens.
A video's sampled frames are one tile each, with their own text. The chat template writes ``<IMG_CONTEXT>``
per image and ``<video>`` per video; the processor expands them (tiles of 16 px, 4 tokens each shown)::

    image 60×44, tiles 2 × 2 + thumbnail    <img><IMG_CONTEXT> × 5·4</img>
    video of 2 sampled frames               Frame1: <img><IMG_CONTEXT> × 4</img>\\nFrame2: <img><IMG_CONTEXT> × 4</img>

The model takes every tile of the batch, image tiles and video frames alike, as one ``pixel_values``
``[tiles, 3, S, S]`` in the order their tokens come. The loader keeps the two apart (``pixel_values`` +
``patch_mask``, ``pixel_values_videos`` + ``video_patch_mask``, rows sized by the budgets) and a token row
(``mm_token_type_ids``: 1 image, 2 video) says which tile comes where; ``model_kwargs`` interleaves them.
Positions are the batch contract's restarting ``position_ids`` (the text model builds its block-causal mask
from them); each tile is one batch row of the vision tower, attending within itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError, FormatError, SampleError
from ...media.video.pixels import row_normalizer
from ...media.video.plan import MAX_PLAN_FRAMES, VideoPlan
from ..family import Budgets, Family, ImageSide, Rows, VideoSide, run_image_processor, take_rows

__all__ = ["INTERNVL", "InternVLVideoSampling", "plan_internvl", "tile_kinds"]


def _tile_side(processor: Any) -> tuple[int, int]:
    size = processor.image_processor.size
    h, w = (size.get(k) if isinstance(size, Mapping) else getattr(size, k, None) for k in ("height", "width"))
    if not (h and w):
        raise ConfigError(f"the image processor's size {size} is not a height and width; InternVL's tiles are the "
                          "vision tower's square (e.g. {'height': 448, 'width': 448})")
    return int(h), int(w)


def _per_tile(processor: Any) -> int:
    return int(processor.image_seq_length)


def _images_kwargs(processor: Any) -> dict[str, Any]:
    """What the processor passes its image processor over the latter's own settings: ``InternVLProcessor``'s
    ``images_kwargs`` (``crop_to_patches=True``, whatever the image processor's file says)."""
    return dict(getattr(processor, "images_kwargs", None) or {})


def _tiles(processor: Any, height: int, width: int) -> int:
    """Tiles of one image (with its thumbnail), by the image processor's own rule."""
    return int(processor.image_processor.get_number_of_image_patches(height, width, _images_kwargs(processor)))


def _most_tiles(processor: Any) -> int:
    ip, kwargs = processor.image_processor, _images_kwargs(processor)
    crop = kwargs.get("crop_to_patches", getattr(ip, "crop_to_patches", False))
    most = int(kwargs.get("max_patches", getattr(ip, "max_patches", 1)))
    return most + 1 if crop and most > 1 else 1


def _replacements(processor: Any, sizes: Sequence[tuple[int, int]]) -> list[str]:
    tiles = {"num_patches": [_tiles(processor, h, w) for h, w in sizes]}
    return [processor.replace_image_token(tiles, image_idx=i) for i in range(len(sizes))]


def _pixels(processor: Any, images: Sequence[Any], **kwargs: Any) -> dict[str, Any]:
    out = run_image_processor(processor, images, **{**_images_kwargs(processor), **kwargs})
    return {"pixel_values": out["pixel_values"], "num_patches": out["num_patches"].reshape(-1).to(torch.int64)}


def _pad_pixels(out: Mapping[str, Any], processor: Any, budgets: Budgets,
                image_tokens: Sequence[int]) -> dict[str, torch.Tensor | Rows]:
    """Tiles as :class:`Rows` (what the pack's image tokens can fill, at most ``max_images`` of the largest
    grid) with ``patch_mask``, and ``image_tiles`` per slot."""
    (h, w), per_tile, M, k = _tile_side(processor), _per_tile(processor), budgets.max_images, len(image_tokens)
    rows = min(budgets.image_tokens // per_tile, M * _most_tiles(processor)) if M else 0
    tiles = out["num_patches"] if k else torch.zeros(0, dtype=torch.int64)
    if [int(t) * per_tile for t in tiles] != list(image_tokens):
        raise ConfigError(f"the image processor gives {[int(t) * per_tile for t in tiles]} tokens for these images "
                          f"but the pack reserved {list(image_tokens)}; load with the processor (and settings) the "
                          "dataset was packed with")
    n = int(tiles.sum())
    if n > rows:
        raise ConfigError(f"{n} image tiles > the {rows} tile rows a pack has room for; the dataset's manifest and the "
                          "processor disagree: load with the processor it was packed with")
    real = out["pixel_values"].to(torch.float32) if n else torch.zeros(0, 3, h, w)
    counts = torch.zeros(M, dtype=torch.int64)
    counts[:k] = tiles
    return {"pixel_values": Rows(real, rows), "patch_mask": torch.arange(rows) < n, "image_tiles": counts}


# ---- video ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class InternVLVideoSampling:
    """``InternVLVideoProcessor``'s settings: its frame sampling (every frame unless ``do_sample_frames``; then
    ``num_frames``, or ``fps`` frames a second, spaced ``N / n`` apart from ``initial_shift``: half a step where
    true), at most ``max_frames`` (a cap wdspack adds: ``--video-max-frames``, as sampling that many), and the
    frame size (the tiles'). ``min_pixels``/``max_pixels`` are :class:`~wdspack.media.video.plan.VideoSettings`'
    fields, which a fixed tile size does not take."""

    do_sample_frames: bool = False
    fps: float | None = None
    num_frames: int | None = None
    initial_shift: bool | float = True
    min_frames: int = 1
    max_frames: int = MAX_PLAN_FRAMES
    height: int = 384
    width: int = 384
    tokens_per_frame: int = 256
    min_pixels: int = 0
    max_pixels: int | None = None


def _video_sampling(processor: Any, config: Mapping[str, Any] | None) -> InternVLVideoSampling:
    """The video processor's settings (``config``: as :func:`~wdspack.media.settings.read_settings` finds them;
    None: the image processor's tile size). Its frames must be the tiles' size and normalised as they are."""
    ip, side = processor.image_processor, _tile_side(processor)
    config = dict(config or {})
    size = config.get("size") or {"height": side[0], "width": side[1]}
    if not isinstance(size, Mapping) or not (size.get("height") and size.get("width")):
        raise ConfigError(f"the InternVL video processor's size {size!r} is not a height and width; give the tiles' "
                          f"{{'height': {side[0]}, 'width': {side[1]}}}")
    if (int(size["height"]), int(size["width"])) != side:
        raise ConfigError(f"the video processor resizes frames to {size['height']}x{size['width']} but the image "
                          f"tiles are {side[0]}x{side[1]}; the vision tower takes one size: set the video processor's "
                          "size to the image processor's")
    if config.get("do_center_crop"):
        raise ConfigError("the InternVL video processor crops its frames (do_center_crop): not supported; set "
                          "do_center_crop to false in its settings")
    if config.get("resample") not in (None, 3):  # PIL's BICUBIC: the resize wdspack does
        raise ConfigError(f"the InternVL video processor resamples with {config['resample']!r}; only bicubic (3), its "
                          "default, is supported")
    for key in ("image_mean", "image_std", "rescale_factor"):
        mine, theirs = config.get(key), getattr(ip, key, None)
        if mine is not None and theirs is not None and not np.array_equal(np.asarray(mine), np.asarray(theirs)):
            raise ConfigError(f"the video processor's {key} {mine} differs from the image processor's {theirs}; "
                              "the loader normalises video frames with the image processor's")
    out: dict[str, Any] = {"height": side[0], "width": side[1], "tokens_per_frame": _per_tile(processor)}
    for key in ("do_sample_frames", "fps", "num_frames", "initial_shift"):
        value = config.get(key)
        if value is not None:
            out[key] = _setting(key, value)
    return InternVLVideoSampling(**out)


def _setting(key: str, value: Any) -> Any:
    """One sampling setting, checked: a flag, a positive rate, a whole count, a shift (a flag or frames)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = {"do_sample_frames": isinstance(value, bool), "fps": number and value > 0,
          "num_frames": number and value >= 1 and value == int(value),
          "initial_shift": isinstance(value, bool) or (number and value >= 0)}[key]
    if not ok:
        want = {"do_sample_frames": "true or false", "fps": "a positive number", "num_frames": "a whole number >= 1",
                "initial_shift": "true, false or a number of frames >= 0"}[key]
        raise ConfigError(f"the video processor's {key} {value!r} is not {want}; fix its settings")
    return int(value) if key == "num_frames" else value


def plan_internvl(header: Any, s: InternVLVideoSampling) -> VideoPlan:
    """What InternVL's video processor makes of this video, from its header: ``n`` frames at
    ``arange(shift, N, N / n)`` (``shift`` half a step where ``initial_shift`` is true), each one tile of
    ``tokens_per_frame``; ``grid`` ``(n, 1, 1)``.

    Raises:
        ConfigError: ``--video-max-pixels`` (frames are the tiles' fixed size), or sampling without a count or rate.
        SampleError: ``video_too_short``: fewer frames than sampled, or a rate that samples none.

    Example:
        >>> plan = plan_internvl(VideoHeader(frames=10, fps=5.0, width=64, height=48),
        ...                      InternVLVideoSampling(do_sample_frames=True, num_frames=4, height=16, width=16,
        ...                                            tokens_per_frame=4))  # doctest: +SKIP
        >>> plan.indices, plan.tokens  # doctest: +SKIP
        ((1, 3, 6, 8), 16)
    """
    if s.max_pixels is not None:
        raise ConfigError(f"--video-max-pixels {s.max_pixels}: InternVL resizes every frame to its "
                          f"{s.height}x{s.width} tile; leave --video-max-pixels out")
    total = int(header.frames)
    if not s.do_sample_frames:
        if total > MAX_PLAN_FRAMES:
            raise SampleError("video_too_large", f"the header gives {total} frames and the video processor takes "
                              f"every frame (it does not sample) > the {MAX_PLAN_FRAMES} a plan may name; pass "
                              "--video-fps or --video-num-frames to sample fewer")
        indices = list(range(total))
    else:
        if s.num_frames is not None:
            count = int(s.num_frames)
        elif s.fps is not None:
            count = int(total / header.fps * s.fps)
        else:
            raise ConfigError("the InternVL video processor samples frames (do_sample_frames) but sets neither "
                              "num_frames nor fps; pass --video-num-frames N or --video-fps F")
        count = min(count, int(s.max_frames))
        if count <= 0:
            raise SampleError("video_too_short", f"{total} frames at {header.fps:g} fps sample no frame at "
                              f"{s.fps} fps; raise --video-fps or pass --video-num-frames")
        if count > total:
            raise SampleError("video_too_short", f"{total} frames < the {count} frames sampled (the processor "
                              "refuses it); lower --video-num-frames or --video-fps")
        shift = total / count / 2 if s.initial_shift is True else float(s.initial_shift or 0)
        # transformers: torch.arange(initial_shift, total, total / num_frames).int()
        indices = torch.arange(shift, total, total / count).int().tolist()
    n = len(indices)
    if n == 0:
        raise SampleError("video_too_short", "the video has no frame to sample")
    return VideoPlan(indices=tuple(int(i) for i in indices), height=s.height, width=s.width, grid=(n, 1, 1),
                     tokens=n * s.tokens_per_frame,
                     second_per_grid_t=float(np.float32(1 / (n / total * header.fps))))


def _stand_in(*shape: int) -> np.ndarray:
    """A zero array of ``shape`` that takes no memory: the processor reads only its shape."""
    return np.broadcast_to(np.zeros((), np.float32), shape)


def _video_replacement(processor: Any, plan: VideoPlan) -> str:
    return processor.replace_video_token({"pixel_values_videos": [_stand_in(len(plan.indices), 3, plan.height,
                                                                            plan.width)]}, video_idx=0)


def _video_pixels(processor: Any, videos: Sequence[bytes], plans: Sequence[Any], *,
                  max_pixels: int = 64_000_000) -> dict[str, Any]:
    """A pack's videos as uint8 ``[n, 3, S, S]`` frame blocks (only the planned frames decoded and resized as
    ``InternVLVideoProcessor`` does on CPU; normalised where they land) and their frame counts."""
    from ...media.video.pixels import decode_frames, resize_frames

    blocks = [resize_frames(decode_frames(data, plan.frames, max_pixels=max_pixels, index=k), *plan.size)
              for k, (data, plan) in enumerate(zip(videos, plans))]
    return {"pixel_values_videos": tuple(blocks),
            "video_frames": torch.tensor([len(p.frames) for p in plans], dtype=torch.int64)}


def _pad_videos(out: Mapping[str, Any], processor: Any, budgets: Budgets,
                video_tokens: Sequence[int]) -> dict[str, torch.Tensor | Rows]:
    """Frames as :class:`Rows` (``max_video_tokens // image_seq_length`` per pack) with ``video_patch_mask``, and
    ``video_frames`` / ``video_mask`` in ``max_images`` slots."""
    per_tile, M, (h, w) = _per_tile(processor), budgets.max_images, _tile_side(processor)
    rows = budgets.max_video_tokens // per_tile
    blocks = tuple(out["pixel_values_videos"])
    frames = [int(b.shape[0]) for b in blocks]
    if [n * per_tile for n in frames] != list(video_tokens):
        raise FormatError(f"videos of {frames} frames give {[n * per_tile for n in frames]} tokens but the pack "
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
    finish = row_normalizer(processor.image_processor)  # the video processor's fused normalisation, where they land
    return {"pixel_values_videos": Rows(real, rows, torch.float32, finish), "video_patch_mask": torch.arange(rows) < n,
            "video_frames": counts, "video_mask": torch.arange(M) < k}


def _video_token(processor: Any) -> str:
    return str(getattr(processor, "video_token", None) or "<video>")


INTERNVL_VIDEO = VideoSide(placeholder=_video_token, feature_token=lambda processor: processor.image_token,
                           sampling=_video_sampling, plan=plan_internvl, replacement=_video_replacement,
                           pixels=_video_pixels, pad=_pad_videos)


# ---- which tile is where ----------------------------------------------------------------------------------------


def tile_kinds(input_ids: torch.Tensor, seq_lens: Sequence[int], tiles: Sequence[int], frames: Sequence[int], *,
               context_id: int, start_id: int, per_tile: int, frame_text: Any) -> torch.Tensor:
    """``[L]``: 1 on the ``<IMG_CONTEXT>`` tokens of images, 2 on those of video frames, 0 elsewhere.

    Images and video frames fill the same token, so each run of it (one image's tiles, or one frame) is
    matched to the next image (``tiles[i] · per_tile`` tokens) or the next frame of the next video
    (``per_tile`` tokens, after the processor's ``FrameK: `` text: ``frame_text(ids before <img>, K)``).

    Raises:
        ConfigError: a run neither fits (the pack and the processor disagree).
    """
    real = int(sum(seq_lens))
    ids = input_ids[:real]
    out = torch.zeros_like(input_ids)
    context = (ids == context_id).to(torch.int8)
    edges = torch.diff(torch.cat([torch.zeros(1, dtype=torch.int8), context, torch.zeros(1, dtype=torch.int8)]))
    starts, ends = (edges == 1).nonzero().squeeze(1).tolist(), (edges == -1).nonzero().squeeze(1).tolist()
    images, videos, frame = list(tiles), list(frames), 0
    for a, b in zip(starts, ends):
        if videos and b - a == per_tile and a > 0 and int(ids[a - 1]) == start_id and \
                frame_text(ids[max(0, a - 9):a - 1], frame + 1):
            out[a:b], frame = 2, frame + 1
            if frame == videos[0]:
                videos.pop(0)
                frame = 0
        elif images and b - a == images[0] * per_tile:
            out[a:b] = 1
            images.pop(0)
        else:
            raise ConfigError(f"a run of {b - a} image context tokens is neither the next image ({images[:1]} tiles) "
                              f"nor the next video frame ({per_tile} tokens); load with the processor the dataset was "
                              "packed with")
    if images or videos:
        raise ConfigError(f"the pack's tokens hold fewer images or video frames than its pixels ({len(images)} images "
                          f"and {len(videos)} videos left); load with the processor the dataset was packed with")
    return out


def _token_rows(input_ids: torch.Tensor, seq_lens: Sequence[int], pixels: Mapping[str, Any],
                processor: Any) -> dict[str, torch.Tensor]:
    tiles = pixels.get("num_patches", torch.zeros(0, dtype=torch.int64)).tolist()
    frames = pixels.get("video_frames", torch.zeros(0, dtype=torch.int64)).tolist()
    decode = processor.tokenizer.decode

    def frame_text(ids: torch.Tensor, k: int) -> bool:
        return str(decode(ids.tolist())).endswith(f"Frame{k}: ")

    kinds = tile_kinds(input_ids, seq_lens, tiles, frames, context_id=int(processor.image_token_id),
                       start_id=int(processor.start_image_token_id), per_tile=_per_tile(processor),
                       frame_text=frame_text)
    return {"mm_token_type_ids": kinds}


def _model_kwargs(batch: Mapping[str, Any], model: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
    images = bool(batch["image_mask"].any())
    videos = "video_mask" in batch and bool(batch["video_mask"].any())
    tiles = take_rows(batch["pixel_values"], batch["patch_mask"]) if images else None
    frames = take_rows(batch["pixel_values_videos"], batch["video_patch_mask"]) if videos else None
    if tiles is not None and frames is not None:  # one tensor, in the order the tokens come
        per_tile = int(model.config.image_seq_length)
        kinds = batch["mm_token_type_ids"]
        order = kinds[kinds > 0][::per_tile].to(tiles.device)
        merged = tiles.new_empty((len(order), *tiles.shape[1:]))
        merged[order == 1], merged[order == 2] = tiles, frames.to(tiles.dtype)
        kwargs["pixel_values"] = merged
    elif tiles is not None or frames is not None:
        kwargs["pixel_values"] = tiles if tiles is not None else frames
    return kwargs


INTERNVL = Family(
    name="internvl", processors=("InternVLProcessor",), model_types=("internvl",),
    image=ImageSide(replacements=_replacements, pixels=_pixels, pad=_pad_pixels), model_kwargs=_model_kwargs,
    token_rows=_token_rows, token_keys=("mm_token_type_ids",),
    notes="square tiles by the closest aspect ratio (min_patches to max_patches) + a thumbnail, image_seq_length "
          "<IMG_CONTEXT> each; videos: each sampled frame one tile with its 'FrameK: ' text (--video-num-frames / "
          "--video-fps); image tiles and frames as one pixel_values [tiles, 3, S, S] in token order",
    video=INTERNVL_VIDEO,
)

FAMILIES = (INTERNVL,)
