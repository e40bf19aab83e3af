"""The video kind: found in a record's ``videos`` list and video parts, read as bytes (:mod:`.source`),
planned from the container's header at pack time (:mod:`.header`, :mod:`.plan`), stored with its plan
(:mod:`.record`) and decoded at the planned frames only in the loader (:mod:`.pixels`)."""

from __future__ import annotations

from ..kind import MediaKind, calling, imported
from .record import VideoPlanRecord, check_videos

__all__ = ["VIDEO"]


def _check_item(data: bytes, plan: VideoPlanRecord, *, sample_id: str) -> None:
    from .header import check_planned_frames

    check_planned_frames(data, plan.frames, sample_id=sample_id)


#: Videos: their keys are in a pack only when it holds one; ``max_video_tokens_per_pack`` bounds them.
VIDEO = MediaKind(
    name="video", plural="videos", record_fields=("videos", "video"),
    part_types=("video", "video_url", "input_video"), ref_keys=("video", "video_url", "input_video", "path", "url",
                                                                "value"),
    extensions=("mp4", "webm", "mkv", "mov", "avi"), settings_part="video_processor",
    load=calling(f"{__name__}.source", "load_video"), describe=calling(f"{__name__}.source", "video_name"),
    max_bytes=imported(f"{__name__}.source", "MAX_VIDEO_BYTES"), plan_record=VideoPlanRecord, check=check_videos,
    budget="max_video_tokens_per_pack",
    drop_reasons={
        "missing_video": "a video file named by the record does not exist",
        "video_path_escape": "a video path points outside the image root (which serves videos too)",
        "unreadable_video": "the video file is empty or over the size limit, not a video PyAV can open (or a still "
                            "image under a video's name), its header gives no frames, or it holds the data of fewer "
                            "frames than its header gives (cut short, as by an interrupted download)",
        "video_too_short": "the video has fewer frames than the model's video processor samples from it",
        "video_too_large": "the video's frames are over the decompression-bomb limit or of an aspect ratio over 200, "
                           "or it has more frames than a plan may name where its processor takes every frame, or "
                           "reading its packets went past 30 s (or, a container without a frame count, past "
                           "2,160,000 frames)"},
    load_drop_reasons=("unreadable_video",),
    decode_errors=lambda: (imported(f"{__name__}.pixels", "VideoDecodeError")(),), placeholder="<video>",
    written_as_image="LLaVA-Video",
    prepare=imported(f"{__name__}.prepare"), batch=imported(f"{__name__}.batch"), check_item=_check_item)
