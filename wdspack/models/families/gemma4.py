"""Gemma 4: images of any aspect ratio as a variable number of soft tokens, audio at 40 ms a token, a text stack of
sliding and full layers whose sliding layers let an image's soft tokens see each other.

The template renders ``<|image|>`` per image and ``<|audio|>`` per audio; the processor expands them::

    <|image|>  ──►  <|image> <|image|> × n <image|>     n = patches of the resize that keeps the aspect ratio in
                                                        max_soft_tokens·k² patches, pooled k × k (from the header size)
    <|audio|>  ──►  <|audio> <|audio|> × t <audio|>     t = ceil(ceil(L/2)/2), L valid mel frames (30 s cut)

Pixels are ``max_images`` slots of ``[max_soft_tokens·k², 3·p²]`` patch rows with their ``image_position_ids``
(``-1`` on padding), as the image processor pads one image; audio is ``max_images`` slots of mel frames
(``[F, bins]``, ``F = min(4·max_audio_tokens, 30 s)``) with ``input_features_mask``; ``image_mask`` and
``audio_mask`` mark the real slots. The masks (per layer type, built here from ``seq_idx`` and
``mm_token_type_ids``) are, per sub-sample, the model's own: full layers causal, sliding layers causal within the
window or within one image's soft tokens (both ways). Text positions restart per sub-sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError, FormatError
from ...media.audio.tokens import AudioRule, gemma4_audio_frames, gemma4_audio_tokens
from ..compat import call_private, private
from ..family import AudioSide, Budgets, Family, ImageSide, take_rows

__all__ = ["FAMILIES", "GEMMA4", "packed_masks"]

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
    return kwargs


GEMMA4 = Family(
    name="gemma4", processors=("Gemma4Processor",), model_types=("gemma4",),
    image=ImageSide(replacements=_replacements, feature_token=_image_token, placeholder=_image_token, pad=_pad_pixels),
    audio=AudioSide(placeholder=_audio_token, feature_token=_audio_token, rule=_audio_rule,
                    replacement=_audio_replacement, features=_audio_features, pad=_pad_audio),
    token_rows=_token_rows, token_keys=("mm_token_type_ids",), model_kwargs=_model_kwargs,
    notes="pixel_values [B·M, max_soft_tokens·k², 3·p²] + image_position_ids; input_features [B·M, F, 128] + "
          "input_features_mask; mm_token_type_ids; attention_mask = per-layer-type dict of packed masks "
          "(bidirectional image spans on sliding layers); no video yet",
    no_varlen="its sliding layers let an image's soft tokens attend to each other both ways, which a causal varlen "
              "kernel cannot express; use attn_implementation 'sdpa' or 'flex_attention' (packed masks built by "
              "model_inputs)",
)

FAMILIES = (GEMMA4,)
