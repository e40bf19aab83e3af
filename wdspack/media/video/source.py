"""Turn a video reference from a record into the video file's bytes, undecoded.

A video is referred to as an image is (:mod:`.images`): bytes, a path relative to the image root
(``--image-root`` serves videos too), an absolute path only when no root was given, ``file://``,
a ``{"bytes", "path"}`` struct, a ``video_url`` dict or a ``data:video/...;base64,`` URL; remote
URLs are refused. What holds of what comes back:

- a file that does not exist is ``missing_video``, a path out of its root ``video_path_escape``;
- an empty file, or one over :data:`MAX_VIDEO_BYTES` (not read at all), is ``unreadable_video``;
- nothing is decoded or probed here: the sample builder reads the container header.
"""

from __future__ import annotations

from typing import Any

from ...errors import SampleError
from ..source import image_name, load_media

__all__ = ["MAX_VIDEO_BYTES", "load_video", "video_name"]

#: The largest video file read, in bytes; a larger one is dropped as ``unreadable_video`` unread.
MAX_VIDEO_BYTES = 2 << 30


def load_video(ref: Any, image_root: str, *, absolute_ok: bool = False) -> bytes:
    """The bytes of the video file ``ref`` stands for, as stored.

    Raises:
        SampleError: ``missing_video``, ``video_path_escape``, ``unreadable_video`` (empty, or over
            :data:`MAX_VIDEO_BYTES`) or ``malformed_record``.

    Example:
        >>> load_video({"bytes": b"\\x1aE\\xdf\\xa3...", "path": "clip.webm"}, "/data")
        b'\\x1aE\\xdf\\xa3...'
    """
    if isinstance(ref, (list, tuple)):
        raise SampleError("malformed_record", f"a video is given as a list of {len(ref)} frames; give the video "
                          "file (a path or its bytes), or the frames as images ('images' with one <image> each)")
    data = load_media(ref, image_root, what="video", absolute_ok=absolute_ok, max_bytes=MAX_VIDEO_BYTES)
    if not data:
        shown = video_name(ref)
        raise SampleError("unreadable_video", f"video {shown!r} is empty (0 bytes); re-export the file or leave "
                          "the record out" if shown else "a video given as inline bytes is empty (0 bytes); give "
                          "the file's bytes or leave the record out")
    return data


def video_name(ref: Any) -> str:
    """How a drop detail names a video: its path, or ``""`` for inline bytes.

    Example:
        >>> video_name("clips/a.mp4"), video_name({"video_url": {"url": "b.mp4"}}), video_name(b"...")
        ('clips/a.mp4', 'b.mp4', '')
    """
    return image_name(ref)
