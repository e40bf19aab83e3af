"""The audio kind in the loader, with a processor: a pack's audio decoded to the family's rate and cut to the
plan (:func:`~.decode.decode_audio`), through the family's audio side to its feature keys, padded to the
budgets' static shapes. Audio features are float rows the model takes as they are: no pixel rows to ship as
bytes or normalise (``ROWS_KEY`` None).

``batcher`` is the loader's ``wdspack.loader.batch.model.ModelBatcher`` (processor, family, budgets).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..kind import Media
from .decode import decode_audio

__all__ = ["MASK_KEY", "ROWS_KEY", "active", "normalize", "outputs", "pad"]

#: No pixel rows: the audio's features travel as float32 (``pixel_dtype`` leaves them alone).
ROWS_KEY: str | None = None
MASK_KEY: str | None = None


def active(batcher: Any) -> bool:
    """A batch has the audio keys where the dataset's budgets have audio tokens (and the family an audio side)."""
    return bool(batcher.budgets.max_audio_tokens) and batcher.family.audio is not None


def outputs(batcher: Any, items: Media, raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pack's audio through the family's feature extractor, each decoded to exactly the samples its plan
    keeps (an audio that does not decode as planned raises ``AudioDecodeError`` with its ``index``; the loader
    names its sample)."""
    if not items:
        return {}
    waves: list[Any] = [decode_audio(data, rate=plan.target_rate, frames=plan.frames, source_rate=plan.rate,
                                     keep=plan.kept, sample_id="", index=k)
                        for k, (data, plan) in enumerate(zip(items.data, items.plans))]
    if batcher.family.audio.features_per_sample:  # one chat's audios in one call, as the processor takes them
        owners = list(items.sample)
        waves = [[w for w, o in zip(waves, owners) if o == s] for s in dict.fromkeys(owners)]
    return batcher.family.audio.features(batcher.processor, waves)


def pad(batcher: Any, out: Mapping[str, Any], tokens: tuple[int, ...]) -> Mapping[str, Any]:
    """The outputs padded to the budgets' static shapes (the family's audio side)."""
    return batcher.family.audio.pad(out, batcher.processor, batcher.budgets, tokens)


def normalize(batcher: Any, rows: torch.Tensor) -> torch.Tensor:
    """Nothing to do: audio features are float rows as the feature extractor made them."""
    return rows
