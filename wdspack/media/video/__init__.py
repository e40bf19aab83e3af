"""The video kind: found in a record's ``videos`` list and video parts, read as bytes (:mod:`.source`),
planned from the container's header at pack time (:mod:`.header`, :mod:`.plan`), stored with its plan
(:mod:`.record`) and decoded at the planned frames only in the loader (:mod:`.pixels`)."""

from __future__ import annotations

from typing import Any

from ..kind import MediaKind
from .record import VideoPlanRecord, check_videos

__all__ = ["VIDEO"]


def _load(ref: Any, root: str, *, absolute_ok: bool = False) -> bytes:
    from .source import load_video

    return load_video(ref, root, absolute_ok=absolute_ok)


def _describe(ref: Any) -> str:
    from .source import video_name

    return video_name(ref)


def _decode_errors() -> tuple[type[BaseException], ...]:
    from .pixels import VideoDecodeError

    return (VideoDecodeError,)



def _prepare() -> Any:
    from . import prepare

    return prepare


def _check_item(data: bytes, plan: VideoPlanRecord, *, sample_id: str) -> None:
    from .header import check_planned_frames

    check_planned_frames(data, plan.frames, sample_id=sample_id)


def _batch() -> Any:
    from . import batch

    return batch

#: Videos: their keys are in a pack only when it holds one; ``max_video_tokens_per_pack`` bounds them.
VIDEO = MediaKind(
    name="video", plural="videos", record_fields=("videos", "video"),
    part_types=("video", "video_url", "input_video"), ref_keys=("video", "video_url", "input_video", "path", "url",
                                                                "value"),
    extensions=("mp4", "webm", "mkv", "mov", "avi"), settings_part="video_processor", load=_load,
    describe=_describe, plan_record=VideoPlanRecord, check=check_videos, budget="max_video_tokens_per_pack",
    drop_reasons=("missing_video", "video_path_escape", "unreadable_video", "video_too_short", "video_too_large"),
    load_drop_reasons=("unreadable_video",), decode_errors=_decode_errors, placeholder="<video>",
    prepare=_prepare, batch=_batch, check_item=_check_item)
