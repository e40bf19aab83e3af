"""A tokenized sample: what the builders return (:mod:`.samples` for chats, :mod:`.text` for
captions and documents) and the pack job measures and spools."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..media import KINDS, Media, by_kind, by_name, read_spelled, spelled

__all__ = ["Sample"]

#: A kind's fields of a sample by their v1 spelling (``images``, ``image_tokens``, ``video_plans``), in order.
_FIELD_OF = spelled("data", "tokens", "plans")


@dataclass(frozen=True, slots=True, init=False)
class Sample:
    """One tokenized sample: ids, loss mask, and its ``media`` by kind (each item's bytes, the tokens it
    occupies and, for a kind planned at pack time, its plan). A kind's fields also read and construct by
    their v1 spelling (``sample.images``, ``Sample(sid, ids, mask, images=..., image_tokens=...)``, or by
    position after the mask in that order: images, image_tokens, videos, video_tokens, video_plans).

    Example:
        >>> s = Sample("a", np.array([1, 9, 2]), np.array([0, 0, 1]), (b"png",), (1,))
        >>> s.media["image"].tokens, s.media_count, s.token_count
        ((1,), 1, 3)
    """

    sample_id: str
    input_ids: np.ndarray
    loss_mask: np.ndarray
    media: Mapping[str, Media] = field(default_factory=dict)

    def __init__(self, sample_id: str, input_ids: np.ndarray, loss_mask: np.ndarray, *by_position: Any,
                 media: Mapping[str, Media] | None = None, **by_key: Any) -> None:
        by_key = by_name("Sample", list(_FIELD_OF), by_position, by_key, fixed=3)
        for name, value in (("sample_id", sample_id), ("input_ids", input_ids), ("loss_mask", loss_mask),
                            ("media", by_kind(media, _FIELD_OF, by_key, owner="Sample"))):
            object.__setattr__(self, name, value)

    def __getattr__(self, key: str) -> Any:  # a kind's field by its v1 spelling (sample.images)
        return read_spelled(self, key, _FIELD_OF)

    @property
    def token_count(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def media_count(self) -> int:
        """The media items of every kind: what the ``max_images`` budget counts (it bounds a pack's media)."""
        return sum(len(self.media[kind.name]) for kind in KINDS)

    @property
    def image_count(self) -> int:
        """:attr:`media_count` under its first name (it counted videos too; kept for code written against it)."""
        return self.media_count
