"""Gemma 4: images of any aspect ratio as a variable number of soft tokens, videos as timestamped frames of them,
audio at 40 ms a token; sliding layers let an image's (or a frame's) soft tokens see each other.

The template renders ``<|image|>``, ``<|video|>``, ``<|audio|>`` per item; the processor expands them::

    <|image|>  ──►  <|image> <|image|> × n <image|>     n = patches of the resize that keeps the aspect ratio in
                                                        max_soft_tokens·k² patches, pooled k × k (from the header size)
    <|video|>  ──►  "MM:SS <|image> <|video|> × n <image|>" per sampled frame, joined by spaces (n as an image's)
    <|audio|>  ──►  <|audio> <|audio|> × t <audio|>     t = ceil(ceil(L/2)/2), L valid mel frames (30 s cut)

Images are ``max_images`` slots of ``[max_soft_tokens·k², 3·p²]`` patch rows with ``image_position_ids`` (``-1`` on
padding), as the image processor pads one; videos ``max_video_tokens·k²`` patch rows a pack, padded frame by frame
by ``model_inputs`` as the video processor pads them; audio ``max_images`` slots of mel frames with
``input_features_mask``. The masks (per layer type, from ``seq_idx`` and ``mm_token_type_ids``) are, per sub-sample,
the model's own: full layers causal, sliding layers causal within the window or within one image's or frame's soft
tokens (both ways). Text positions restart per sub-sample.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError, FormatError, SampleError
from ...media.audio.tokens import AudioRule, gemma4_audio_frames, gemma4_audio_tokens
from ...media.video.plan import MAX_PLAN_FRAMES, VideoHeader, VideoPlan
from ..compat import call_private, private
from ..family import AudioSide, Budgets, Family, ImageSide, Rows, VideoSide, take_rows

__all__ = ["FAMILIES", "GEMMA4", "GEMMA4_VIDEO", "Gemma4VideoSampling", "packed_masks", "plan_gemma4"]

_RATE, _FRAME, _HOP, _WINDOW = 16_000, 320, 160, 480_000
#: Attention implementations whose mask transformers builds from a mask function.
_MASKED = ("sdpa", "eager", "flex_attention")


def _image_token(processor: Any) -> str:
    return str(processor.image_token)


def _replacements(processor: Any, sizes: Sequence[tuple[int, int]]) -> list[str]:
    if not getattr(processor.image_processor, "do_resize", True):
        raise ConfigError("the Gemma 4 image processor has do_resize off; its soft tokens then depend on the pixels' "
                          "exact size, so pack with it on (the default)")
    counts = processor._get_num_multimodal_tokens(image_sizes=[list(s) for s in sizes])["num_image_tokens"]
    given = {"num_soft_tokens_per_image": counts}
    return [processor.replace_image_token(given, image_idx=i) for i in range(len(sizes))]


def _pad_pixels(out: Mapping[str, torch.Tensor], processor: Any, budgets: Budgets,
                image_tokens: Sequence[int]) -> dict[str, torch.Tensor]:
    ip = processor.image_processor
    k2 = int(ip.pooling_kernel_size) ** 2
    patches, width = int(ip.max_soft_tokens) * k2, 3 * int(ip.patch_size) ** 2
    k, M = len(image_tokens), budgets.max_images
    pixels = torch.zeros(M, patches, width, dtype=torch.float32)
    positions = torch.full((M, patches, 2), -1, dtype=torch.int64)
    if k:
        pv, pos = out["pixel_values"], out["image_position_ids"]
        if tuple(pv.shape) != (k, patches, width):
            raise ConfigError(f"the image processor gave pixel_values {tuple(pv.shape)} for {k} images of {patches} "
                              f"patches of {width}; load with the processor the dataset was packed with")
        got = ((pos != -1).all(-1).sum(-1) // k2).tolist()
        if got != list(image_tokens):
            raise FormatError(f"the images give {got} soft tokens but the pack reserved {list(image_tokens)}; load "
                              "with the processor (and settings) the dataset was packed with")
        pixels[:k], positions[:k] = pv, pos
    return {"pixel_values": pixels, "image_position_ids": positions}


def _audio_token(processor: Any) -> str:
    return str(processor.audio_token)


def _audio_rule(processor: Any, settings: Mapping[str, Any] | None) -> AudioRule:
    s = dict(settings or {})
    rate = int(s.get("sampling_rate") or _RATE)
    frame = round(rate * float(s.get("frame_length_ms") or 20.0) / 1000)
    hop = round(rate * float(s.get("hop_length_ms") or 10.0) / 1000)
    if (rate, frame, hop) != (_RATE, _FRAME, _HOP):
        raise ConfigError(f"the feature extractor takes {rate} Hz with frames of {frame} and a hop of {hop}; wdspack "
                          f"plans Gemma 4 audio at {_RATE} Hz, frames of {_FRAME}, a hop of {_HOP} (the published "
                          "settings): pack with the model's own processor folder")
    # The processor counts tokens from the feature mask (no cap past the 30-s cut, where the count is 750).
    return AudioRule("gemma4", gemma4_audio_frames, gemma4_audio_tokens, max_samples=_WINDOW, min_samples=161)


def _audio_replacement(processor: Any, tokens: int) -> str:
    # The processor's own text, from a feature mask of 4t - 3 valid frames (which gives t tokens).
    return str(processor.replace_audio_token({"input_features_mask": [np.ones(4 * tokens - 3, dtype=bool)]},
                                             audio_idx=0))


def _audio_features(processor: Any, waves: Sequence[Any]) -> dict[str, torch.Tensor]:
    """The feature extractor as ``Gemma4Processor`` calls it (its defaults: the longest, padded to 128 samples)."""
    fe = processor.feature_extractor
    out = fe([np.asarray(w, dtype=np.float32) for w in waves], sampling_rate=fe.sampling_rate, return_tensors="pt")
    return {"input_features": out["input_features"], "input_features_mask": out["input_features_mask"]}


def _tokens_of(frames: int) -> int:
    for _ in range(2):
        frames = -(-frames // 2)
    return frames


def _pad_audio(out: Mapping[str, Any], processor: Any, budgets: Budgets, audio_tokens: Sequence[int]
               ) -> dict[str, torch.Tensor]:
    bins = int(processor.feature_extractor.feature_size)
    M, k = budgets.max_images, len(audio_tokens)
    most: int = budgets.max_audio_tokens or 0  # a single audio has at most the pack's audio tokens
    frames = min(4 * most, gemma4_audio_frames(_WINDOW))
    features = torch.zeros(M, frames, bins, dtype=torch.float32)
    mask = torch.zeros(M, frames, dtype=torch.bool)
    if k:
        got, real = out["input_features"], out["input_features_mask"].to(torch.bool)
        valid = real.sum(-1).tolist()
        tokens = [_tokens_of(int(n)) for n in valid]
        if tokens != list(audio_tokens):
            raise FormatError(f"the audio features give {tokens} tokens but the pack reserved {list(audio_tokens)}; "
                              "load with the processor (and settings) the dataset was packed with")
        if k > M or max(valid) > frames or got.shape[-1] != bins:
            raise FormatError(f"{k} audios of {valid} valid frames of {got.shape[-1]} bins do not fit the {M} slots of "
                              f"{frames} frames of {bins} the dataset's manifest and the feature extractor give a pack")
        n = min(frames, got.shape[1])  # past the longest audio's valid frames the rows are padding (zero, masked)
        features[:k, :n], mask[:k, :n] = got[:, :n], real[:, :n]
    return {"input_features": features, "input_features_mask": mask, "audio_mask": torch.arange(M) < k}


def _token_rows(input_ids: torch.Tensor, seq_lens: Sequence[int], pixels: Mapping[str, torch.Tensor],
                processor: Any) -> dict[str, torch.Tensor]:
    types = processor.create_mm_token_type_ids([input_ids.tolist()])[0]  # the processor's own key and values
    return {"mm_token_type_ids": torch.tensor(types, dtype=torch.int64)}


def packed_masks(mm_token_type_ids: torch.Tensor, seq_idx: torch.Tensor, *, sliding_window: int, implementation: str,
                 dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """The per-layer-type masks of packed rows, as Gemma 4 takes them in ``attention_mask``.

    Each sub-sample (``seq_idx``) sees only itself: causally on full layers; on sliding layers causally within
    ``sliding_window`` tokens back, and each image's (or video frame's) soft tokens see each other both ways.
    That is, per sub-sample, the model's own ``create_masks_for_vision_model``.

    Args:
        mm_token_type_ids: ``[B, L]``, the processor's modality of each token (1 image, 2 video, 3 audio).
        seq_idx: ``[B, L]``, the sub-sample of each token (padding is a sub-sample of its own).
        sliding_window: the text config's ``sliding_window``.
        implementation: the text model's attention implementation (``sdpa``, ``eager``, ``flex_attention``).
        dtype: the model's float dtype (the additive eager mask).

    Returns:
        ``{"full_attention": mask, "sliding_attention": mask}``, each ``[B, 1, L, L]`` (bool for SDPA, 0 / dtype-min
        float for eager) or a flex ``BlockMask``.

    Raises:
        ConfigError: an attention implementation that takes no such mask (FlashAttention).
    """
    (build_functions, and_masks, blockwise_overlay, causal_mask_function, or_masks, packed_sequence_mask_function,
     sliding_window_overlay) = private("transformers.masking_utils", "ALL_MASK_ATTENTION_FUNCTIONS", "and_masks",
                                       "blockwise_overlay", "causal_mask_function", "or_masks",
                                       "packed_sequence_mask_function", "sliding_window_overlay")
    block_ids = private("transformers.models.gemma4.modeling_gemma4", "get_block_sequence_ids_for_mask")
    if implementation not in _MASKED:
        raise ConfigError(f"Gemma 4 packs need a 4-D attention mask (bidirectional image spans), which "
                          f"attn_implementation {implementation!r} does not take; use one of {', '.join(_MASKED)}")
    blocks = call_private(block_ids, mm_token_type_ids=mm_token_type_ids, device=mm_token_type_ids.device)
    own = call_private(packed_sequence_mask_function, packed_sequence_mask=seq_idx)
    full = and_masks(own, causal_mask_function)
    sliding = and_masks(own, or_masks(causal_mask_function, call_private(blockwise_overlay, block_sequence_ids=blocks)),
                        call_private(sliding_window_overlay, sliding_window=sliding_window))
    build = build_functions[implementation]
    B, L = mm_token_type_ids.shape
    return {name: call_private(build, batch_size=B, q_length=L, kv_length=L, mask_function=fn,
                               allow_is_causal_skip=False, dtype=dtype, device=mm_token_type_ids.device)
            for name, fn in (("full_attention", full), ("sliding_attention", sliding))}


# ---- video --------------------------------------------------------------------------------------------------------
#
# ``Gemma4VideoProcessor`` samples ``num_frames`` frames at ``arange(n) · N // n`` (or ``int(N / f · fps)`` of them),
# resizes each as an image (aspect ratio kept, within ``max_soft_tokens·k²`` patches), and the processor writes each
# frame's time before it:
#
#     <|video|>  ──►  "00:00 <|image><|video|>×n<image|> 00:01 <|image><|video|>×n<image|> ..."
#     pixels        pixel_values_videos [B·P, 3·p²] (P = max_video_tokens·k² patch rows a pack, each frame's real
#                   patches only) + video_position_ids [B·P, 2] + video_patch_mask [B·P]; video_grid (frames, h, w)
#                   and video_frame_patches in max_images slots; model_inputs pads each frame to those patches.

#: The soft tokens per frame ``Gemma4VideoProcessor`` takes (``max_soft_tokens``).
_SOFT_TOKENS = (70, 140, 280, 560, 1120)


@dataclass(frozen=True)
class Gemma4VideoSampling:
    """A ``Gemma4VideoProcessor``'s settings (transformers' defaults unless its config says). ``max_frames``,
    ``min_pixels`` and ``max_pixels`` are :class:`~wdspack.media.video.plan.VideoSettings`' fields, which this
    processor has no counterpart of: a plan refuses them."""

    do_sample_frames: bool = True
    fps: float | None = None
    num_frames: int | None = 32
    patch_size: int = 16
    pooling_kernel_size: int = 3
    max_soft_tokens: int = 70
    image_mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    image_std: tuple[float, ...] = (1.0, 1.0, 1.0)
    rescale_factor: float = 1 / 255
    max_frames: int | None = None
    min_pixels: int = 0
    max_pixels: int | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Gemma4VideoSampling:
        """From the video processor's settings as a dict (what it leaves out keeps the class's value).

        Raises:
            ConfigError: a setting of the wrong type, a ``max_soft_tokens`` the class refuses, or a step wdspack
                does not repeat (no resize, no rescale or normalisation, another resampling than bicubic).

        Example:
            >>> Gemma4VideoSampling.from_config({"num_frames": 8, "patch_size": 4}).num_frames
            8
        """
        for key in ("do_resize", "do_rescale", "do_normalize"):
            if config.get(key) is False:
                raise ConfigError(f"the Gemma 4 video processor has {key} off; wdspack plans and normalises frames "
                                  "as the class does by default: set it to true")
        if config.get("resample") not in (None, 3):  # PIL's BICUBIC: the resize wdspack does
            raise ConfigError(f"the Gemma 4 video processor resamples with {config['resample']!r}; only bicubic (3), "
                              "its default, is supported")
        out: dict[str, Any] = {}
        if config.get("do_sample_frames") is not None:
            out["do_sample_frames"] = _setting(config, "do_sample_frames", bool)
        for key in ("fps", "num_frames"):
            if key in config:  # null is a value here: num_frames null lets fps sample
                out[key] = None if config[key] is None else _setting(config, key, float if key == "fps" else int)
        for key in ("patch_size", "pooling_kernel_size", "max_soft_tokens"):
            if config.get(key) is not None:
                out[key] = _setting(config, key, int)
        for key in ("image_mean", "image_std"):
            if config.get(key) is not None:
                value = config[key]
                value = [value] * 3 if isinstance(value, (int, float)) and not isinstance(value, bool) else value
                if not isinstance(value, (list, tuple)) or len(value) != 3 or \
                        not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
                    raise ConfigError(f"the video processor's {key} {config[key]!r} is not three numbers; fix its "
                                      "settings")
                out[key] = tuple(float(v) for v in value)
        if config.get("rescale_factor") is not None:
            out["rescale_factor"] = _setting(config, "rescale_factor", float)
        s = replace(cls(), **out)
        if s.max_soft_tokens not in _SOFT_TOKENS:
            raise ConfigError(f"the video processor's max_soft_tokens {s.max_soft_tokens} is not one of "
                              f"{_SOFT_TOKENS}, which Gemma4VideoProcessor refuses; fix its settings")
        return s


def _setting(config: Mapping[str, Any], key: str, kind: type) -> Any:
    value = config[key]
    ok = isinstance(value, bool) if kind is bool else \
        not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0 and \
        (kind is float or value == int(value))
    if not ok:
        what = {bool: "true or false", int: "a whole number >= 1", float: "a positive number"}[kind]
        raise ConfigError(f"the video processor's {key} {value!r} is not {what}; fix its settings")
    return kind(value)


def _video_token(processor: Any) -> str:
    return str(getattr(processor, "video_token", None) or "<|video|>")


def _video_sampling(processor: Any, config: Mapping[str, Any] | None) -> Gemma4VideoSampling:
    """The video processor's settings (``config``: as :func:`~wdspack.media.settings.read_settings` finds them;
    None, as for a processor in memory without its video processor: the class's defaults with the image processor's
    patch size and pooling). The vision tower takes one patch size and pooling: they must be the image processor's."""
    ip = processor.image_processor
    tower = {key: int(getattr(ip, key)) for key in ("patch_size", "pooling_kernel_size") if hasattr(ip, key)}
    s = Gemma4VideoSampling.from_config(tower if config is None else config)
    for key, theirs in tower.items():
        if getattr(s, key) != theirs:
            raise ConfigError(f"the video processor's {key} {getattr(s, key)} differs from the image processor's "
                              f"{theirs}, but the vision tower takes one; fix the processor's video settings")
    return s


def plan_gemma4(header: VideoHeader, s: Gemma4VideoSampling) -> VideoPlan:
    """What ``Gemma4VideoProcessor`` makes of this video, from its header: the frames it samples (transformers'
    ``default_sample_indices_fn``), each resized as an image (``get_aspect_ratio_preserving_size``), ``grid``
    ``(frames, H'/p, W'/p)``, ``frames · H'W'/(p·k)²`` tokens, and each frame's second (``index / fps``), which the
    processor writes before it.

    Raises:
        ConfigError: ``max_frames`` or ``max_pixels`` set (the processor has neither), or both ``fps`` and
            ``num_frames`` (it refuses them together).
        SampleError: ``video_too_short`` when the video has fewer frames than are sampled.

    Example:
        >>> plan = plan_gemma4(VideoHeader(frames=12, fps=5.0, width=40, height=30),
        ...                    Gemma4VideoSampling(num_frames=2, patch_size=4, pooling_kernel_size=2))
        >>> plan.indices, plan.grid, plan.tokens, plan.timestamps
        ((0, 6), (2, 14, 18), 126, (0.0, 1.2))
    """
    from transformers.models.gemma4.processing_gemma4 import get_aspect_ratio_preserving_size

    for value, flag in ((s.max_frames, "--video-max-frames"), (s.max_pixels, "--video-max-pixels")):
        if value is not None:
            raise ConfigError(f"{flag} {value}: Gemma 4 samples --video-num-frames frames (or --video-fps), each "
                              f"resized within its max_soft_tokens {s.max_soft_tokens}; leave {flag} out")
    total = header.frames
    count = total
    if s.do_sample_frames:
        if s.fps is not None and s.num_frames is not None:
            raise ConfigError(f"the video processor sets both fps {s.fps} and num_frames {s.num_frames}, which it "
                              "refuses; pass --video-fps or --video-num-frames alone")
        if s.num_frames is not None:
            count = s.num_frames
        elif s.fps is not None:
            count = max(1, int(total / header.fps * s.fps))
    if count > MAX_PLAN_FRAMES:
        raise SampleError("video_too_large", f"{count} frames to sample > the {MAX_PLAN_FRAMES} a plan may name; "
                          "sample fewer (--video-num-frames, --video-fps)")
    if count > total:
        raise SampleError("video_too_short", f"{total} frames < the {count} frames the processor samples (it "
                          "refuses it); lower --video-num-frames or --video-fps")
    indices = np.arange(count, dtype=np.int64) * total // count
    k, p = s.pooling_kernel_size, s.patch_size
    try:
        height, width = get_aspect_ratio_preserving_size(height=header.height, width=header.width, patch_size=p,
                                                         max_patches=s.max_soft_tokens * k * k, pooling_kernel_size=k)
    except ValueError as e:
        raise SampleError("video_too_large", f"a {header.width}x{header.height} frame: {e}") from None
    grid = (count, height // p, width // p)
    return VideoPlan(indices=tuple(int(i) for i in indices), height=height, width=width, grid=grid,
                     tokens=count * (grid[1] * grid[2] // (k * k)),
                     second_per_grid_t=float(np.float32(total / (count * header.fps))),
                     timestamps=tuple(int(i) / header.fps for i in indices))


def _video_replacement(processor: Any, plan: VideoPlan) -> str:
    """The processor's own ``replace_video_token`` text, from the plan's soft tokens per frame and seconds."""
    stand_in = SimpleNamespace(fps=1.0, timestamps=list(plan.timestamps))  # what it reads of VideoMetadata
    return str(processor.replace_video_token({"num_soft_tokens_per_video": [plan.tokens // len(plan.indices)],
                                              "video_metadata": [stand_in]}, video_idx=0))


def _loaded_sampling(processor: Any) -> Gemma4VideoSampling:
    """In the loader: the video processor's settings as the pack job read them (the processor's own where it loaded
    one, else those in the folder the processor was loaded from, else the class's defaults)."""
    own = getattr(processor, "video_processor", None)
    if own is not None and hasattr(own, "to_dict"):
        return _video_sampling(processor, own.to_dict())
    name = str(getattr(getattr(processor, "tokenizer", None), "name_or_path", "") or "")
    return _video_sampling(processor, _folder_settings(name))


@functools.lru_cache(maxsize=16)
def _folder_settings(name: str) -> Mapping[str, Any] | None:
    from ...media.settings import read_settings

    return read_settings(name, "video_processor").values if name else None


def _video_pixels(processor: Any, videos: Sequence[bytes], plans: Sequence[Any], *,
                  max_pixels: int = 64_000_000) -> dict[str, Any]:
    """A pack's videos as uint8 patch rows ``[frames·h·w, 3·p²]`` (only the planned frames decoded, resized as the
    video processor does on CPU, patchified channels last; normalised by :func:`_pad_videos`' ``finish``) and
    their grids."""
    from ...media.video.pixels import decode_frames, resize_frames

    p = _loaded_sampling(processor).patch_size
    blocks = []
    for k, (data, plan) in enumerate(zip(videos, plans)):
        t, h, w = plan.grid
        if plan.size != (h * p, w * p) or t != len(plan.frames):
            raise FormatError(f"a video's plan of {len(plan.frames)} frames at {plan.size} does not give its grid "
                              f"{plan.grid} with {p}-pixel patches; load with the processor the dataset was packed "
                              "with")
        frames = resize_frames(decode_frames(data, plan.frames, max_pixels=max_pixels, index=k), *plan.size)
        blocks.append(frames.reshape(t, 3, h, p, w, p).permute(0, 2, 4, 3, 5, 1).reshape(t * h * w, 3 * p * p))
    return {"pixel_values_videos": tuple(blocks),
            "video_grid": torch.tensor([list(p.grid) for p in plans], dtype=torch.int64).reshape(-1, 3)}


def _positions(grid: torch.Tensor) -> torch.Tensor:
    """Each patch row's ``(x, y)`` in its frame, frame after frame, as the video processor gives them."""
    rows = []
    for t, h, w in grid.tolist():
        x, y = torch.arange(w).repeat(h), torch.arange(h).repeat_interleave(w)
        rows.append(torch.stack([x, y], dim=-1).repeat(t, 1))
    return torch.cat(rows) if rows else torch.zeros(0, 2, dtype=torch.int64)


def _normalize_rows(rows: torch.Tensor, *, mean: Sequence[float], std: Sequence[float],
                    rescale_factor: float) -> torch.Tensor:
    """uint8 values in float32 patch rows (channels last) → the video processor's float32, in place: its fused
    ``(x - mean/rescale_factor) / (std/rescale_factor)``."""
    scale = 1.0 / rescale_factor
    m, s = (torch.tensor(list(v)) * scale for v in (mean, std))
    rows.view(rows.shape[0], -1, m.shape[0]).sub_(m.to(rows.device)).div_(s.to(rows.device))
    return rows


def _pad_videos(out: Mapping[str, Any], processor: Any, budgets: Budgets,
                video_tokens: Sequence[int]) -> dict[str, torch.Tensor | Rows]:
    """Patch rows as :class:`Rows` (``max_video_tokens·k²`` a pack: a soft token pools k² patches) with their
    positions and ``video_patch_mask``; ``video_grid``, ``video_frame_patches`` and ``video_mask`` in ``max_images``
    slots."""
    s = _loaded_sampling(processor)
    k2, width = s.pooling_kernel_size ** 2, 3 * s.patch_size ** 2
    rows, M = budgets.max_video_tokens * k2, budgets.max_images
    grid = out["video_grid"]
    k = grid.shape[0]
    tokens = (grid.prod(dim=1) // k2).tolist()
    if tokens != list(video_tokens):
        raise FormatError(f"the videos' plans give {tokens} tokens but the pack reserved {list(video_tokens)}")
    if k and int((grid[:, 1] * grid[:, 2]).max()) > s.max_soft_tokens * k2:
        raise ConfigError(f"video frames of up to {int((grid[:, 1] * grid[:, 2]).max()) // k2} soft tokens, but the "
                          f"video processor's max_soft_tokens is {s.max_soft_tokens}; load with the processor (folder) "
                          "the dataset was packed with")
    blocks = tuple(out["pixel_values_videos"])
    n = sum(int(b.shape[0]) for b in blocks)
    if n > rows or k > M:  # a pack unlike the manifest says: corrupt (counted and skipped by the loader)
        raise FormatError(f"{k} videos of {n} patches > the {M} slots and {rows} patch rows the dataset's manifest "
                          "gives a pack")
    positions = torch.full((rows, 2), -1, dtype=torch.int64)
    positions[:n] = _positions(grid)
    grids, patches = torch.zeros(M, 3, dtype=torch.int64), torch.zeros(M, dtype=torch.int64)
    grids[:k], patches[:k] = grid, s.max_soft_tokens * k2
    real = blocks if n else (torch.zeros(0, width, dtype=torch.uint8),)
    finish = functools.partial(_normalize_rows, mean=s.image_mean, std=s.image_std, rescale_factor=s.rescale_factor)
    return {"pixel_values_videos": Rows(real, rows, torch.float32, finish), "video_position_ids": positions,
            "video_patch_mask": torch.arange(rows) < n, "video_grid": grids, "video_frame_patches": patches,
            "video_mask": torch.arange(M) < k}


def _video_kwargs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The batch's real frames as ``Gemma4VideoProcessor`` gives them: ``[frames, patches, 3·p²]``, each frame's
    patch rows then zeros (positions ``-1``) up to its ``video_frame_patches``, and ``num_frames_per_video``."""
    grid = take_rows(batch["video_grid"], batch["video_mask"]).cpu()
    most = set(take_rows(batch["video_frame_patches"], batch["video_mask"]).tolist())
    if len(most) != 1:
        raise ConfigError(f"this batch's videos are padded to {sorted(most)} patches a frame; pack every dataset of a "
                          "mixture with the same video processor settings (max_soft_tokens)")
    rows = take_rows(batch["pixel_values_videos"], batch["video_patch_mask"])
    positions = take_rows(batch["video_position_ids"], batch["video_patch_mask"])
    counts = (grid[:, 1] * grid[:, 2]).repeat_interleave(grid[:, 0])  # real patches of each frame
    frame = torch.arange(len(counts)).repeat_interleave(counts)
    column = torch.arange(int(counts.sum())) - (counts.cumsum(0) - counts).repeat_interleave(counts)
    where = (frame.to(rows.device), column.to(rows.device))
    pixels = rows.new_zeros(len(counts), most.pop(), rows.shape[-1])
    pixels[where] = rows
    padded = positions.new_full((*pixels.shape[:2], 2), -1)
    padded[where] = positions
    return {"pixel_values_videos": pixels, "video_position_ids": padded, "num_frames_per_video": grid[:, 0]}


#: Gemma 4: per sampled frame ``MM:SS`` and the frame's soft tokens between ``<|image>`` and ``<image|>``.
GEMMA4_VIDEO = VideoSide(placeholder=_video_token, feature_token=_video_token, sampling=_video_sampling,
                         plan=plan_gemma4, replacement=_video_replacement, pixels=_video_pixels, pad=_pad_videos)


def _model_kwargs(batch: Mapping[str, Any], model: Any) -> dict[str, Any]:
    text = model.config.get_text_config()
    param = next(model.parameters())
    masks = packed_masks(batch["mm_token_type_ids"].to(param.device), batch["seq_idx"].to(param.device),
                         sliding_window=int(text.sliding_window), implementation=text._attn_implementation,
                         dtype=param.dtype if param.is_floating_point() else torch.float32)
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"],
                              "attention_mask": masks}
    if "image_mask" in batch and "pixel_values" in batch and bool(batch["image_mask"].any()):
        kwargs["pixel_values"] = take_rows(batch["pixel_values"], batch["image_mask"])
        kwargs["image_position_ids"] = take_rows(batch["image_position_ids"], batch["image_mask"])
    if "audio_mask" in batch and bool(batch["audio_mask"].any()):
        kwargs["input_features"] = take_rows(batch["input_features"], batch["audio_mask"])
        kwargs["input_features_mask"] = take_rows(batch["input_features_mask"], batch["audio_mask"])
    if "video_mask" in batch and bool(batch["video_mask"].any()):
        kwargs.update(_video_kwargs(batch))
    return kwargs


GEMMA4 = Family(
    name="gemma4", processors=("Gemma4Processor",), model_types=("gemma4",),
    image=ImageSide(replacements=_replacements, feature_token=_image_token, placeholder=_image_token, pad=_pad_pixels),
    audio=AudioSide(placeholder=_audio_token, feature_token=_audio_token, rule=_audio_rule,
                    replacement=_audio_replacement, features=_audio_features, pad=_pad_audio),
    video=GEMMA4_VIDEO, token_rows=_token_rows, token_keys=("mm_token_type_ids",), model_kwargs=_model_kwargs,
    notes="pixel_values [B·M, max_soft_tokens·k², 3·p²] + image_position_ids; input_features [B·M, F, 128] + "
          "input_features_mask; videos: num_frames frames (or fps), each an MM:SS timestamp and its own soft "
          "tokens, pixel_values_videos [frames, max_soft_tokens·k², 3·p²] + video_position_ids + "
          "num_frames_per_video; mm_token_type_ids; attention_mask = per-layer-type dict of packed masks "
          "(bidirectional image and frame spans on sliding layers)",
    no_varlen="its sliding layers let an image's soft tokens attend to each other both ways, which a causal varlen "
              "kernel cannot express; use attn_implementation 'sdpa' or 'flex_attention' (packed masks built by "
              "model_inputs)",
)

FAMILIES = (GEMMA4,)
