"""A tokenized sample: what the builders return (:mod:`.samples` for chats, :mod:`.text` for
captions and documents) and the pack job measures and spools."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Sample"]


@dataclass(frozen=True, slots=True)
class Sample:
    """One tokenized sample: ids, loss mask, image bytes and the tokens each image occupies."""

    sample_id: str
    input_ids: np.ndarray
    loss_mask: np.ndarray
    images: tuple[bytes, ...] = ()
    image_tokens: tuple[int, ...] = ()

    @property
    def token_count(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def image_count(self) -> int:
        return len(self.images)
