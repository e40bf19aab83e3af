"""Qwen2-VL and Qwen2.5-VL: flattened patches, ``image_grid_thw`` and 3-D (mRoPE) positions.

One image of ``t × h × w`` patches becomes ``t·h·w / merge²`` ``<|image_pad|>`` tokens between
``<|vision_start|>`` and ``<|vision_end|>`` (the chat template writes those two and one pad; the
processor repeats the pad). The count comes from the image size alone (``smart_resize``).

Positions, per sub-sample of a pack (what the model's ``get_rope_index`` gives that sub-sample alone)::

    tokens       <s>  hi  <vs> [P] [P] [P] [P] <ve>  ok      (one image, grid 1×4×4, merge 2 → 2×2)
    row 0 (text)  0   1    2    3   4   5   6   7     8      restarts at 0 per sub-sample
    temporal      0   1    2    3   3   3   3   5     6
    height        0   1    2    3   3   4   4   5     6
    width         0   1    2    3   4   3   4   5     6

The loader's ``position_ids`` is ``[4, B, L]``: row 0 is the batch contract's restarting positions
(the model finds the sub-sample boundaries in it and builds the block-causal mask), rows 1-3 the
3-D positions. ``mm_token_type_ids`` is 1 on image tokens.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError, FormatError
from ...media.video.pixels import row_normalizer
from ...media.video.plan import QWEN3_VL_VIDEO, QwenVideoSampling, plan_qwen2_vl, plan_qwen3_vl, qwen3_vl_prompt
from ..family import Budgets, Family, ImageSide, Rows, VideoSide, run_image_processor, take_rows
from ..vision_meta import precomputed_vision_kwargs

__all__ = ["PUBLISHED_TOKENS_PER_SECOND", "QWEN2_5_VL", "QWEN2_VIDEO", "QWEN2_VL", "QWEN3_VIDEO", "mrope_positions",
           "qwen3_token_rows", "tokens_per_second"]

logger = logging.getLogger(__name__)


def _replacements(processor: Any, sizes: Sequence[tuple[int, int]]) -> list[str]:
    ip = processor.image_processor
    patches = [ip.get_number_of_image_patches(h, w, {}) for h, w in sizes]
    grids = {"image_grid_thw": torch.tensor([[1, p, 1] for p in patches], dtype=torch.int64)}
    return [processor.replace_image_token(grids, image_idx=i) for i in range(len(sizes))]


def _pixels(processor: Any, images: Sequence[Any], **kwargs: Any) -> dict[str, Any]:
    """The image processor image by image: the same bytes as one call over the list (each image's
    patches are independent), and about a tenth faster than the batched call. ``pixel_values`` stays
    a tuple of the images' patch blocks (the batch writes each once, no concatenated copy).
    ``kwargs`` go to the image processor (``do_rescale=False, do_normalize=False`` for uint8 pixels)."""
    outs = [run_image_processor(processor, [image], **kwargs) for image in images]
    return {"pixel_values": tuple(o["pixel_values"] for o in outs),
            "image_grid_thw": torch.cat([o["image_grid_thw"] for o in outs])}


def patch_rows(processor: Any, budgets: Budgets) -> int:
    """Patch rows per pack: what the pack's image tokens can fill (``merge²`` patches each; the
    manifest's largest pack, else ``seq_len``), capped by ``max_images`` of the processor's largest image."""
    ip = processor.image_processor
    merge, patch = int(ip.merge_size), int(ip.patch_size)
    by_tokens = budgets.image_tokens * merge * merge
    largest = int(ip.size["longest_edge"]) // (patch * patch)
    return min(by_tokens, budgets.max_images * largest) if budgets.max_images else 0


def _pad_pixels(out: Mapping[str, torch.Tensor], processor: Any, budgets: Budgets,
                image_tokens: Sequence[int]) -> dict[str, torch.Tensor | Rows]:
    rows, M = patch_rows(processor, budgets), budgets.max_images
    k = len(image_tokens)
    merge = int(processor.image_processor.merge_size)
    pv = out.get("pixel_values")
    grid = out.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.int64))
    if k:
        tokens = (grid.prod(dim=1) // (merge * merge)).tolist()
        if tokens != list(image_tokens):
            raise ConfigError(f"the image processor gives {tokens} tokens for these images but the pack reserved "
                              f"{list(image_tokens)}; load with the processor (and settings) the dataset was "
                              "packed with")
    blocks = tuple(pv or ())  # one patch block per image (``_pixels``)
    n = sum(int(b.shape[0]) for b in blocks) if k else 0
    if n > rows:
        raise ConfigError(f"{n} image patches > the {rows} patch rows a pack has room for; the dataset's manifest "
                          "and the processor disagree: load with the processor it was packed with")
    real = tuple(b.to(torch.float32) for b in blocks) if n else torch.zeros(0, _patch_width(processor))
    grids = torch.zeros(M, 3, dtype=torch.int64)
    grids[:k] = grid[:k]
    return {"pixel_values": Rows(real, rows), "patch_mask": torch.arange(rows) < n, "image_grid_thw": grids}


def _patch_width(processor: Any) -> int:
    ip = processor.image_processor
    return 3 * int(ip.temporal_patch_size) * int(ip.patch_size) ** 2


def mrope_positions(input_ids: torch.Tensor, seq_lens: Sequence[int], grids: torch.Tensor, *, image_token_id: int,
                    merge_size: int, video_grids: torch.Tensor | None = None,
                    video_token_id: int | None = None) -> torch.Tensor:
    """``[3, L]`` 3-D positions of one pack, each sub-sample on its own.

    Text tokens count on from the largest position so far; an image's (or a video's) tokens sit on a
    ``t × h/merge × w/merge`` grid starting at the next position, and text after it continues at
    ``start + max(h, w) / merge``. A video's temporal patch ``k`` sits at ``start + k`` (Qwen2-VL's
    rule; Qwen2.5-VL's token rows add its scaled time, ``tokens_per_second``). Padding after the
    sub-samples counts ``0, 1, 2, …``.
    """
    L = input_ids.shape[0]
    lens = np.asarray(seq_lens, dtype=np.int64)
    real = int(lens.sum())
    ids = input_ids[:real].numpy()
    where = np.flatnonzero(ids == image_token_id)  # image tokens, in image order
    g = grids.numpy().astype(np.int64).reshape(-1, 3)
    if video_grids is not None and video_token_id is not None and video_grids.numel():
        films = np.flatnonzero(ids == video_token_id)
        vg = video_grids.numpy().astype(np.int64).reshape(-1, 3)
        if int((vg.prod(axis=1) // merge_size ** 2).sum()) != len(films):
            raise ConfigError(f"the pack has {len(films)} video tokens but its video grids {vg.tolist()} give "
                              f"{int((vg.prod(axis=1) // merge_size ** 2).sum())}; load with the processor the "
                              "dataset was packed with")
        # images and videos in the order their tokens come (each one's tokens are one run)
        image_sizes, video_sizes = _sizes(g, merge_size), _sizes(vg, merge_size)
        starts = np.concatenate([where[np.cumsum(image_sizes) - image_sizes] if len(g) else np.zeros(0, np.int64),
                                 films[np.cumsum(video_sizes) - video_sizes]])
        order = np.argsort(starts, kind="stable")
        where, g = np.sort(np.concatenate([where, films])), np.concatenate([g, vg])[order]
    t, h, w = g[:, 0], g[:, 1] // merge_size, g[:, 2] // merge_size
    sizes = t * h * w
    if int(sizes.sum()) != len(where):
        raise ConfigError(f"the pack has {len(where)} image tokens but its grids give {int(sizes.sum())}; load with "
                          "the processor the dataset was packed with")
    # Each text token advances the position by 1, each image by max(h, w) (counted at its first token);
    # a token's base is what the units before it in its own sub-sample advanced.
    offsets = np.cumsum(sizes) - sizes  # each image's first token among the image tokens
    firsts = where[offsets]
    width = np.ones(real, np.int64)
    width[where] = 0
    width[firsts] = np.maximum(h, w)
    before = np.cumsum(width) - width
    base = before - np.repeat(before[np.cumsum(lens) - lens], lens)
    base[where] = base[np.repeat(firsts, sizes)]  # an image's tokens all start where the image does
    out = np.empty((3, L), np.int64)
    out[:, :real] = base
    image = np.repeat(np.arange(len(sizes)), sizes)  # each image token's image, and its index inside it
    j = np.arange(len(where)) - np.repeat(offsets, sizes)
    out[0, where] += j // (h * w)[image]
    out[1, where] += (j // w[image]) % h[image]
    out[2, where] += j % w[image]
    out[:, real:] = np.arange(L - real)
    return torch.from_numpy(out)


def _sizes(g: np.ndarray, merge_size: int) -> np.ndarray:
    return g[:, 0] * (g[:, 1] // merge_size) * (g[:, 2] // merge_size)


def _frame_grids(grids: torch.Tensor) -> torch.Tensor:
    """Qwen3-VL: each video's grid as one ``(1, h, w)`` grid per temporal patch (its timestamps split them)."""
    return torch.repeat_interleave(grids, grids[:, 0], dim=0).index_fill_(1, torch.tensor([0]), 1) \
        if grids.numel() else grids


def _token_rows_for(split_frames: bool, scaled_time: bool):
    """The family's ``token_rows``: 3-D positions and token types (1 image, 2 video). ``split_frames``:
    Qwen3-VL's one grid per temporal patch; ``scaled_time``: Qwen2.5-VL, whose video tokens' time axis is
    ``start + trunc(k · tokens_per_second · second_per_grid_t)`` (:func:`tokens_per_second`); rows
    ``video_time_patch``, ``video_seconds`` and ``video_time_shift`` let ``model_kwargs`` move it to a model
    whose ``tokens_per_second`` differs."""

    def token_rows(input_ids: torch.Tensor, seq_lens: Sequence[int], pixels: Mapping[str, torch.Tensor],
                   processor: Any) -> dict[str, torch.Tensor]:
        image_id = int(processor.image_token_id)
        merge = int(processor.image_processor.merge_size)
        grids = pixels.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.int64))
        if "video_grid_thw" not in pixels:  # a dataset without video: the rows it always had
            rope = mrope_positions(input_ids, seq_lens, grids, image_token_id=image_id, merge_size=merge)
            return {"mrope_position_ids": rope, "mm_token_type_ids": (input_ids == image_id).to(torch.int64)}
        video_id = int(processor.video_token_id)
        videos = pixels["video_grid_thw"]
        rope = mrope_positions(input_ids, seq_lens, grids, image_token_id=image_id, merge_size=merge,
                               video_grids=_frame_grids(videos) if split_frames else videos, video_token_id=video_id)
        is_video = input_ids == video_id
        out = {"mrope_position_ids": rope,
               "mm_token_type_ids": (input_ids == image_id).to(torch.int64) + 2 * is_video.to(torch.int64)}
        if scaled_time:
            per_frame = (videos[:, 1] * videos[:, 2]) // (merge * merge)  # tokens per temporal patch
            counts = videos.prod(dim=1) // merge ** 2
            k = torch.cat([torch.arange(int(n)) // int(f) for n, f in zip(counts, per_frame)]) \
                if videos.numel() else torch.zeros(0, dtype=torch.int64)
            seconds = pixels["second_per_grid_ts"].to(torch.float32)
            time_patch = torch.zeros_like(input_ids, dtype=torch.int64)
            time_patch[is_video] = k
            per_token = torch.zeros(input_ids.shape, dtype=torch.float32)
            per_token[is_video] = torch.repeat_interleave(seconds, videos.prod(dim=1) // merge ** 2)
            shift = _time_shift(time_patch, per_token, tokens_per_second(processor)[0])
            rope[0] += shift  # the model's own time axis: the batch's positions are get_rope_index's
            out.update(video_time_patch=time_patch, video_seconds=per_token, video_time_shift=shift)
        return out

    return token_rows


#: Qwen3-VL's token rows: each video's temporal patches as one-frame grids (its timestamps part them).
qwen3_token_rows = _token_rows_for(split_frames=True, scaled_time=False)


def _finish(batch: dict[str, Any]) -> dict[str, Any]:
    rope = batch.pop("mrope_position_ids")
    batch["position_ids"] = torch.cat([batch["position_ids"][None], rope])
    return batch


def _model_kwargs(batch: Mapping[str, Any], model: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"],
                              "mm_token_type_ids": batch["mm_token_type_ids"]}
    if bool(batch["image_mask"].any()):
        kwargs["pixel_values"] = take_rows(batch["pixel_values"], batch["patch_mask"])
        kwargs["image_grid_thw"] = grid = take_rows(batch["image_grid_thw"], batch["image_mask"])
        if grid.device.type == "cpu":  # the tower's bookkeeping, worked out here instead of on the GPU
            kwargs.update(precomputed_vision_kwargs(model, grid))
    if "video_mask" in batch and bool(batch["video_mask"].any()):
        kwargs["pixel_values_videos"] = take_rows(batch["pixel_values_videos"], batch["video_patch_mask"])
        kwargs["video_grid_thw"] = take_rows(batch["video_grid_thw"], batch["video_mask"])
        if "video_time_shift" in batch:
            kwargs["position_ids"] = _rescaled_time(batch, model)
    return kwargs


def _time_shift(k: torch.Tensor, seconds: torch.Tensor, per_second: float) -> torch.Tensor:
    """Qwen2.5-VL's video time axis over Qwen2-VL's: ``trunc(k · tokens_per_second · second_per_grid_t) - k``
    for temporal patch ``k``, in float32 as ``get_rope_index`` computes it (0 off the video tokens)."""
    interval = per_second * seconds.to(torch.float32)
    return (k.to(torch.float32) * interval).long() - k


def _rescaled_time(batch: Mapping[str, Any], model: Any) -> torch.Tensor:
    """``position_ids`` for ``model``: the batch's as they are where the model's ``tokens_per_second`` is the
    one the loader found; else each video token's time moved to the model's value."""
    per_second = getattr(model.config.vision_config, "tokens_per_second", None)
    if per_second is None:
        raise ConfigError(f"{type(model).__name__}'s vision config has no tokens_per_second, which Qwen2.5-VL's "
                          "video positions need; load a Qwen2.5-VL model")
    shift = _time_shift(batch["video_time_patch"], batch["video_seconds"], per_second)
    applied = batch["video_time_shift"]
    if torch.equal(shift, applied.to(shift.device)):
        return batch["position_ids"]
    position_ids = batch["position_ids"].clone()
    position_ids[1] += (shift - applied).to(position_ids.device)
    return position_ids


#: Every published Qwen2.5-VL checkpoint's ``vision_config.tokens_per_second`` (transformers' class default is 4).
PUBLISHED_TOKENS_PER_SECOND = 2


def tokens_per_second(processor: Any) -> tuple[float, str]:
    """Qwen2.5-VL's ``vision_config.tokens_per_second`` and where it was read: the model's ``config.json`` beside
    the processor (its folder, or the cached model its tokenizer was loaded from, as on the Hub), else
    :data:`PUBLISHED_TOKENS_PER_SECOND`, said once in the log (``wdspack.model_inputs`` moves the times to
    the model's own value either way)."""
    name = str(getattr(getattr(processor, "tokenizer", None), "name_or_path", "") or "")
    return _tokens_per_second(name)


@functools.lru_cache(maxsize=16)
def _tokens_per_second(name: str) -> tuple[float, str]:
    from ..processors import _read_json

    try:
        config = _read_json(name, "config.json") if name else {}
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {name}/config.json for Qwen2.5-VL's tokens_per_second: {e}") from None
    vision = config.get("vision_config") or {}
    value = vision.get("tokens_per_second") if isinstance(vision, Mapping) else None
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{name}/config.json: vision_config.tokens_per_second {value!r} is not a positive "
                              "number; fix the model's config")
        return float(value), f"{name}/config.json"
    logger.warning("Qwen2.5-VL video positions: no config.json with vision_config.tokens_per_second beside the "
                   "processor %r; the batch's position_ids use %d (every published checkpoint's); put the model's "
                   "config.json in the processor's folder for its own (wdspack.model_inputs applies the model's)",
                   name or "(in memory)", PUBLISHED_TOKENS_PER_SECOND)
    return float(PUBLISHED_TOKENS_PER_SECOND), "the published checkpoints' default"


def _video_pixels(processor: Any, videos: Sequence[bytes], plans: Sequence[Any], *,
                  max_pixels: int = 64_000_000) -> dict[str, Any]:
    """A pack's videos as uint8 ``pixel_values_videos`` row blocks (one per video: only its planned frames
    decoded, resized and patchified as the processor's video processor does; normalised by
    :func:`_pad_videos`' ``finish`` where they land), ``video_grid_thw`` and ``second_per_grid_ts``."""
    from ...media.video.pixels import decode_frames, qwen_video_patches, resize_frames

    ip = processor.image_processor
    blocks = []
    patch, tps = int(ip.patch_size), int(ip.temporal_patch_size)
    for k, (data, plan) in enumerate(zip(videos, plans)):
        if plan.size != (plan.grid[1] * patch, plan.grid[2] * patch) or plan.grid[0] != -(-len(plan.frames) // tps):
            raise FormatError(f"a video's plan of {len(plan.frames)} frames at {plan.size} does not give its grid "
                              f"{plan.grid} with {patch}-pixel patches")
        frames = resize_frames(decode_frames(data, plan.frames, max_pixels=max_pixels, index=k), *plan.size)
        rows = qwen_video_patches(frames, temporal_patch_size=int(ip.temporal_patch_size),
                                  patch_size=int(ip.patch_size), merge_size=int(ip.merge_size), mean=ip.image_mean,
                                  std=ip.image_std, rescale_factor=float(ip.rescale_factor), normalize=False)
        if rows.shape[0] != int(np.prod(plan.grid)):
            raise ConfigError(f"a video planned as grid {plan.grid} gives {rows.shape[0]} patches with "
                              f"{type(ip).__name__}'s patch sizes; load with the processor the dataset was packed with")
        blocks.append(rows)
    return {"pixel_values_videos": tuple(blocks),
            "video_grid_thw": torch.tensor([list(p.grid) for p in plans], dtype=torch.int64).reshape(-1, 3),
            "second_per_grid_ts": torch.tensor([p.second_per_grid_t for p in plans], dtype=torch.float32)}


def _pad_videos(out: Mapping[str, Any], processor: Any, budgets: Budgets,
                video_tokens: Sequence[int]) -> dict[str, torch.Tensor | Rows]:
    """``pixel_values_videos`` as :class:`Rows` (the manifest's most video tokens in a pack, × merge²),
    ``video_patch_mask``, and ``video_grid_thw`` / ``second_per_grid_ts`` / ``video_mask`` in
    ``max_images`` slots (the budget counts images and videos)."""
    merge = int(processor.image_processor.merge_size)
    rows, M = budgets.max_video_tokens * merge * merge, budgets.max_images
    grid = out["video_grid_thw"]
    k = grid.shape[0]
    tokens = (grid.prod(dim=1) // (merge * merge)).tolist()
    if tokens != list(video_tokens):
        raise FormatError(f"the videos' plans give {tokens} tokens but the pack reserved {list(video_tokens)}")
    blocks = tuple(out["pixel_values_videos"])
    n = sum(int(b.shape[0]) for b in blocks)
    if n > rows or k > M:  # a pack unlike the manifest says: corrupt (counted and skipped by the loader)
        raise FormatError(f"{k} videos of {n} patches > the {M} slots and {rows} patch rows the dataset's manifest "
                          "gives a pack")
    real = blocks if n else (torch.zeros(0, _patch_width(processor), dtype=torch.uint8),)
    grids = torch.zeros(M, 3, dtype=torch.int64)
    grids[:k] = grid
    seconds = torch.zeros(M, dtype=torch.float32)
    seconds[:k] = out["second_per_grid_ts"]
    # normalised where the rows land in the batch: the same float32 bits as the processor's, written once
    finish = row_normalizer(processor.image_processor)
    return {"pixel_values_videos": Rows(real, rows, torch.float32, finish), "video_patch_mask": torch.arange(rows) < n,
            "video_grid_thw": grids, "second_per_grid_ts": seconds, "video_mask": torch.arange(M) < k}


def _video_token(processor: Any) -> str:
    return str(getattr(processor, "video_token", None) or "<|video_pad|>")


def _qwen2_sampling(processor: Any, config: Mapping[str, Any] | None) -> QwenVideoSampling:
    """``Qwen2VLVideoProcessor``'s settings (None: its class defaults); top-level ``min_pixels``/``max_pixels``
    over ``size``, as its ``__init__`` takes them."""
    return QwenVideoSampling() if config is None else QwenVideoSampling.from_config(config)


def _qwen3_sampling(processor: Any, config: Mapping[str, Any] | None) -> QwenVideoSampling:
    """``Qwen3VLVideoProcessor``'s settings (None: its class defaults); ``size`` alone bounds the pixels (the
    class ignores top-level ``min_pixels``/``max_pixels``)."""
    return QWEN3_VL_VIDEO if config is None else QwenVideoSampling.from_config(config, base=QWEN3_VL_VIDEO,
                                                                               pixels_at_top=False)


#: Qwen2-VL, Qwen2.5-VL: ``<|video_pad|>`` repeated once per video token (``t·h·w / merge²``).
QWEN2_VIDEO = VideoSide(placeholder=_video_token, feature_token=_video_token, sampling=_qwen2_sampling,
                        plan=plan_qwen2_vl, replacement=lambda processor, plan: _video_token(processor) * plan.tokens,
                        pixels=_video_pixels, pad=_pad_videos)
#: Qwen3-VL: per temporal patch ``<t seconds>`` + ``<|vision_start|>`` + its pads + ``<|vision_end|>``.
QWEN3_VIDEO = VideoSide(
    placeholder=_video_token, feature_token=_video_token, sampling=_qwen3_sampling, plan=plan_qwen3_vl,
    replacement=lambda processor, plan: qwen3_vl_prompt(
        plan, video_token=_video_token(processor), merge_size=0,
        start=str(getattr(processor, "vision_start_token", "<|vision_start|>")),
        end=str(getattr(processor, "vision_end_token", "<|vision_end|>"))),
    pixels=_video_pixels, pad=_pad_videos)


def _family(name: str, processor: str, model_type: str, *, scaled_time: bool = False) -> Family:
    return Family(
        name=name, processors=(processor,), model_types=(model_type,),
        image=ImageSide(replacements=_replacements, pixels=_pixels, pad=_pad_pixels, uint8_pixels=True),
        token_rows=_token_rows_for(split_frames=False, scaled_time=scaled_time),
        token_keys=("mrope_position_ids", "mm_token_type_ids"), finish_batch=_finish, model_kwargs=_model_kwargs,
        notes="flattened patches + image_grid_thw; position_ids [4, B, L] (text row + 3-D mRoPE rows); "
              "mm_token_type_ids",
        video=QWEN2_VIDEO,
    )


def _image_processor() -> Any:
    from transformers import Qwen2VLImageProcessor

    return Qwen2VLImageProcessor()


QWEN2_VL = replace(_family("qwen2_vl", "Qwen2VLProcessor", "qwen2_vl"), aliases=("qwen2vl", "qwen2-vl"),
                   image_processor=_image_processor)
QWEN2_5_VL = _family("qwen2_5_vl", "Qwen2_5_VLProcessor", "qwen2_5_vl", scaled_time=True)

FAMILIES = (QWEN2_VL, QWEN2_5_VL)
