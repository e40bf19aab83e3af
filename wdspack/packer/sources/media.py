"""What wdspack does not pack yet: grounding objects (images, videos and audio are media kinds:
:mod:`wdspack.media`).

A record with a non-empty ``objects`` field (ms-swift, LLaMA-Factory) is dropped as ``unsupported_media``,
with what a user can do today.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import SampleError

__all__ = ["MEDIA_FIELDS", "MEDIA_PART_TYPES", "check_media_fields", "media_part_error"]

#: Fields wdspack does not pack yet, with what each holds: a record that fills one is dropped.
MEDIA_FIELDS = {"objects": "grounding objects"}

#: Content part types wdspack does not pack yet, with what each holds (none today: every media part is a kind's).
MEDIA_PART_TYPES: dict[str, str] = {}
_MEDIA_FIX = {  # what a user can do today; the record itself is dropped and counted
    "grounding objects": "to train on them now, write the boxes into the text in the model's own grounding "
                         "format (ms-swift's docs show Qwen2-VL's)",
}


def check_media_fields(row: Mapping[str, Any]) -> None:
    """Drop a record that fills a media field (:data:`MEDIA_FIELDS`) as ``unsupported_media``."""
    for key, what in MEDIA_FIELDS.items():
        if _filled(row.get(key)):
            fills = " (ms-swift fills '<ref-object>'/'<bbox>' from it)" if key == "objects" else ""
            raise SampleError("unsupported_media", f"field {key!r} holds {_short(row[key])}{fills}: {what} "
                              f"{'are' if key == 'objects' else 'is'} not supported yet (wdspack packs text, "
                              f"images, videos and audio); {_MEDIA_FIX[what]}")


def _filled(value: Any) -> bool:
    """Whether a media field holds anything (an empty list, string or ``{"ref": [], "bbox": []}`` does not)."""
    if value is None:
        return False
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, Mapping):
        return any(_filled(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_filled(v) for v in value)
    return True


def media_part_error(kind: str, i: int) -> SampleError:
    """The ``unsupported_media`` drop of turn ``i``'s content part of type ``kind`` (in :data:`MEDIA_PART_TYPES`)."""
    what = MEDIA_PART_TYPES[kind]
    return SampleError("unsupported_media", f"turn {i} has a {kind!r} part: {what} is not supported yet "
                       f"(wdspack packs text, images, videos and audio); {_MEDIA_FIX[what]}")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
