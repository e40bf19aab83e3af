"""A tokenized sample: what the builders return (:mod:`.samples` for chats, :mod:`.text` for
captions and documents) and the pack job measures and spools."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..media.video.record import VideoPlanRecord

__all__ = ["Sample"]


@dataclass(frozen=True, slots=True)
class Sample:
    """One tokenized sample: ids, loss mask, image (and video) bytes and the tokens each occupies."""

    sample_id: str
    input_ids: np.ndarray
    loss_mask: np.ndarray
    images: tuple[bytes, ...] = ()
    image_tokens: tuple[int, ...] = ()
    #: videos (their files' bytes), the tokens each occupies, and each one's plan (frames, size, grid)
    videos: tuple[bytes, ...] = ()
    video_tokens: tuple[int, ...] = ()
    video_plans: tuple[VideoPlanRecord, ...] = ()

    @property
    def token_count(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def image_count(self) -> int:
        """The visual inputs the ``max_images`` budget counts: images and videos."""
        return len(self.images) + len(self.videos)
