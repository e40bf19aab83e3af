"""Media wdspack does not pack yet: audio and grounding objects (videos are read: :mod:`wdspack.media.video.source`).

A record with a non-empty ``audios``, ``audio`` or ``objects`` field (ms-swift, LLaMA-Factory),
an ``<audio>`` placeholder in a prompt, or an audio content part is dropped as
``unsupported_media``, with what a user can do today; it is never packed as text around a
literal ``<audio>``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ...errors import SampleError
from .toolcalls import Turn

__all__ = ["MEDIA_FIELDS", "MEDIA_PART_TYPES", "check_media_fields", "check_media_placeholders", "media_part_error"]

#: Fields of media wdspack does not pack yet, with what each holds: a record that fills one is dropped.
MEDIA_FIELDS = {"audios": "audio", "audio": "audio", "objects": "grounding objects"}

#: Content part types of media wdspack does not pack yet, with what each holds.
MEDIA_PART_TYPES = {"audio": "audio", "audio_url": "audio", "input_audio": "audio"}
_MEDIA_PLACEHOLDER_RE = re.compile(r"<(audio)>")
_MEDIA_FIX = {  # what a user can do today; the record itself is dropped and counted
    "audio": "leave audio records out of this job",
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
                              f"images and videos); {_MEDIA_FIX[what]}")


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


def check_media_placeholders(turns: list[Turn]) -> None:
    """An ``<audio>`` placeholder in a prompt (user or system turn) with no field behind it (a
    renamed column, say) is dropped too: packed, it would teach the model to answer a literal tag."""
    for i, (role, parts, _) in enumerate(turns):
        if role not in ("user", "system"):
            continue
        for kind, value in parts:
            found = _MEDIA_PLACEHOLDER_RE.search(value) if kind == "text" else None
            if found:
                raise SampleError("unsupported_media", f"turn {i} holds the placeholder {found.group(0)!r}: "
                                  f"{found.group(1)} is not supported yet (wdspack packs text, images and videos; "
                                  f"a literal HTML {found.group(0)} tag in a prompt reads the same); "
                                  f"{_MEDIA_FIX[found.group(1)]}")


def media_part_error(kind: str, i: int) -> SampleError:
    """The ``unsupported_media`` drop of turn ``i``'s content part of type ``kind`` (in :data:`MEDIA_PART_TYPES`)."""
    what = MEDIA_PART_TYPES[kind]
    return SampleError("unsupported_media", f"turn {i} has a {kind!r} part: {what} is not supported yet "
                       f"(wdspack packs text, images and videos); {_MEDIA_FIX[what]}")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
