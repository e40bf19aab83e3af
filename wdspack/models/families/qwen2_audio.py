"""Qwen2-Audio: speech and sound chats, Whisper features over a fixed window, a Qwen2 text model.

The chat template writes ``Audio N: <|audio_bos|><|AUDIO|><|audio_eos|>`` per audio; the processor repeats
``<|AUDIO|>`` once per audio token, from the audio's length at 16 kHz::

    template   ...Audio 1: <|audio_bos|><|AUDIO|><|audio_eos|>\\nWhat is it?...
    processor  ...Audio 1: <|audio_bos|><|AUDIO|> × T<|audio_eos|>\\nWhat is it?...
    T = ((L - 1) // 2 + 1 - 2) // 2 + 1,  L = min(ceil(n / 160), 3000)  (n samples; 25 tokens a second, at most 750)

The feature extractor pads (or cuts) every audio to its window (``n_samples``, 30 s) and the audio encoder runs on
the whole window, masking the frames past ``L``; the model keeps each audio's first ``T`` encoder outputs. So a
pack's audio take ``max_images`` fixed slots of ``[128, 3000]`` features (the budget counts every media item),
``feature_attention_mask`` marks each slot's frames and ``audio_mask`` the real slots. A slot with no audio keeps
one frame in its mask: the encoder then attends to it alone (no row masked whole, which would make NaN under
SDPA) and its zero outputs are never taken. Text positions restart per sub-sample (``position_ids``), as for the
other non-mRoPE families.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ...errors import ConfigError, FormatError
from ...media.audio.tokens import AudioRule, qwen2_audio_frames, qwen2_audio_tokens
from ..family import AudioSide, Budgets, Family, Rows, take_rows

__all__ = ["FAMILIES", "QWEN2_AUDIO", "whisper_rule"]

_RATE, _HOP = 16_000, 160


def _audio_token(processor: Any) -> str:
    return str(processor.audio_token)


def whisper_rule(family: str, settings: Mapping[str, Any] | None, *, frames: Any, tokens: Any,
                 min_samples: int, default_samples: int) -> AudioRule:
    """A Whisper-featured family's rule under its feature extractor's settings: the window (``n_samples``, or
    ``chunk_length`` seconds) is where the processor cuts; the rate and hop are the ones the formulas hold for.

    Example:
        >>> whisper_rule("qwen2_audio", {"chunk_length": 4}, frames=qwen2_audio_frames, tokens=qwen2_audio_tokens,
        ...              min_samples=321, default_samples=480_000).max_samples
        64000
    """
    s = dict(settings or {})
    rate, hop = int(s.get("sampling_rate") or _RATE), int(s.get("hop_length") or _HOP)
    if (rate, hop) != (_RATE, _HOP):
        raise ConfigError(f"the feature extractor takes {rate} Hz with a hop of {hop}; wdspack plans {family} audio at "
                          f"{_RATE} Hz with a hop of {_HOP} (the published settings): pack with the model's own "
                          "processor folder")
    window = int(s.get("n_samples") or (int(s["chunk_length"]) * rate if s.get("chunk_length") else default_samples))
    return AudioRule(family, functools.partial(frames, max_samples=window),
                     functools.partial(tokens, max_samples=window), max_samples=window, min_samples=min_samples)


def _rule(processor: Any, settings: Mapping[str, Any] | None) -> AudioRule:
    return whisper_rule("qwen2_audio", settings, frames=qwen2_audio_frames, tokens=qwen2_audio_tokens, min_samples=321,
                        default_samples=480_000)


def _replacement(processor: Any, tokens: int) -> str:
    return _audio_token(processor) * tokens


def _features(processor: Any, waves: Sequence[Any]) -> dict[str, torch.Tensor]:
    """The processor's own feature call (``Qwen2AudioProcessor._process_audio``: padded to the window, with the
    frame mask)."""
    fe = processor.feature_extractor
    out = fe(list(waves), sampling_rate=fe.sampling_rate, return_attention_mask=True, padding="max_length",
             return_tensors="pt")
    return {"input_features": out["input_features"], "feature_attention_mask": out["attention_mask"]}


def _pad(out: Mapping[str, Any], processor: Any, budgets: Budgets, audio_tokens: Sequence[int]
         ) -> dict[str, torch.Tensor | Rows]:
    fe = processor.feature_extractor
    M, frames, bins = budgets.max_images, int(fe.nb_max_frames), int(fe.feature_size)
    k = len(audio_tokens)
    real = torch.zeros(0, bins, frames, dtype=torch.float32)
    mask = torch.zeros(M, frames, dtype=torch.int64)
    if k:
        got, frames_mask = out["input_features"], out["feature_attention_mask"]
        if k > M or tuple(got.shape[1:]) != (bins, frames):
            raise FormatError(f"{k} audios of features {tuple(got.shape[1:])} do not fit the {M} slots of "
                              f"{(bins, frames)} the dataset's manifest and the feature extractor give a pack")
        tokens = [qwen2_audio_tokens(int(n) * _HOP, max_samples=frames * _HOP) for n in frames_mask.sum(-1).tolist()]
        if tokens != list(audio_tokens):
            raise FormatError(f"the audio features give {tokens} tokens but the pack reserved {list(audio_tokens)}; "
                              "load with the processor (and settings) the dataset was packed with")
        mask[:k] = frames_mask
        real = got.to(torch.float32)
    mask[k:, 0] = 1  # an empty slot attends to one frame (no row masked whole); it gives no token
    # the real slots as Rows: written once into the loader's recycled buffers, the empty ones zeroed there
    return {"input_features": Rows(real, M), "feature_attention_mask": mask, "audio_mask": torch.arange(M) < k}


def _kwargs(batch: Mapping[str, Any], model: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
    if "audio_mask" in batch and bool(batch["audio_mask"].any()):
        dtype = next(model.parameters()).dtype
        kwargs["input_features"] = take_rows(batch["input_features"], batch["audio_mask"]).to(dtype)
        kwargs["feature_attention_mask"] = take_rows(batch["feature_attention_mask"], batch["audio_mask"])
    return kwargs


QWEN2_AUDIO = Family(
    name="qwen2_audio", processors=("Qwen2AudioProcessor",), model_types=("qwen2_audio",), image=None,
    model_kwargs=_kwargs,
    audio=AudioSide(placeholder=_audio_token, feature_token=_audio_token, rule=_rule, replacement=_replacement,
                    features=_features, pad=_pad),
    notes="audio only: Whisper features over a 30 s window (cut past it), 25 <|AUDIO|> tokens a second (at most "
          "750); input_features [B·M, 128, 3000], feature_attention_mask [B·M, 3000], audio_mask [B·M]",
)

FAMILIES = (QWEN2_AUDIO,)
