"""A video's header, read without decoding: its frame count, rate and size, once the file is found to hold
the frames' data (one demux pass over the packets; a file cut short, as by an interrupted download, is
``unreadable_video``). :func:`check_planned_frames` is the same check against a pack's plan (``wdspack verify``).
``tests/packer/test_video_bad_input.py`` covers cut, lying and hostile files.
"""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError, SampleError
from .record import MAX_VIDEO_FRAMES

__all__ = ["MAX_COUNTED_FRAMES", "MAX_COUNT_SECONDS", "MAX_FRAME_PIXELS", "MAX_PLAN_FRAMES", "MAX_VIDEO_PIXELS",
           "VideoHeader", "check_planned_frames", "read_header"]

#: The most pixels a video frame may have (width × height, from the header): the images' decompression-bomb guard.
MAX_FRAME_PIXELS = 64_000_000
#: The most pixels one video's decoded frames may hold together (frames × width × height, 3 bytes each as RGB): a
#: memory bound per video, above the Qwen processors' defaults on 1080p (768 frames × 1920 × 1080 = 1.6e9).
MAX_VIDEO_PIXELS = 1 << 31
#: The most frames a plan may name: what a pack stores and the loader decodes per video.
MAX_PLAN_FRAMES = MAX_VIDEO_FRAMES
#: Where a container has no frame count (WebM/Matroska) the probe counts the video packets: at most this many
#: (ten hours at 60 fps) and for at most this many seconds; a video past either is ``video_too_large``.
MAX_COUNTED_FRAMES = 2_160_000
MAX_COUNT_SECONDS = 30.0

_NO_AV = "reading videos needs PyAV, which is not installed: pip install 'wdspack[video]'  (or pip install av)"


@dataclass(frozen=True)
class VideoHeader:
    """What a video's container says: its frames, their rate (per second) and size."""

    frames: int
    fps: float
    width: int
    height: int


def read_header(data: bytes | str | os.PathLike[str], *, sample_id: str = "",
                max_pixels: int = MAX_FRAME_PIXELS) -> VideoHeader:
    """The first video stream's frame count, rate and size, from the container, once the file is found
    to hold those frames' data (no frame decoded).

    One pass over the demuxed video packets, nothing decoded, finds the frames whose data is whole in the
    file: where the header gives a frame count, that many must be there; where it gives none
    (WebM/Matroska), the packets are counted and must reach the duration the header gives. Nothing is
    allocated per frame the header claims.

    Raises:
        SampleError: ``unreadable_video`` when the bytes are not a video PyAV can open (or hold no video
            stream), or hold the data of fewer frames than the header gives (a file cut short, as by an
            interrupted download); ``video_too_large`` when a frame has more than ``max_pixels`` pixels (a
            hostile header), or the pass goes past :data:`MAX_COUNT_SECONDS` (or, counting, past
            :data:`MAX_COUNTED_FRAMES`).
    """
    try:
        import av
    except ImportError:
        raise ConfigError(_NO_AV) from None
    source: Any = io.BytesIO(data) if isinstance(data, bytes) else os.fspath(data)
    try:
        with av.open(source) as container:
            if not container.streams.video:
                raise SampleError("unreadable_video", "the container holds no video stream", sample_id)
            _refuse_still_image(container.format.name, sample_id)
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            claimed = int(stream.frames or 0)  # 0: WebM/Matroska give no count; the packets are counted
            width, height = int(stream.codec_context.width), int(stream.codec_context.height)
            held = _count_packets(container, stream, sample_id, claimed=claimed)
            seconds = None if claimed > 0 else _header_seconds(container, stream)
    except SampleError:
        raise
    except Exception as e:  # PyAV raises its own error types for damaged or unknown containers
        raise SampleError("unreadable_video", f"cannot read the video's header ({_av_error(e)})", sample_id) from None
    frames = claimed if claimed > 0 else held.frames
    if not rate or frames <= 0 or width <= 0 or height <= 0:
        raise SampleError("unreadable_video", f"the header gives {frames} frames at {rate} fps of {width}x{height}",
                          sample_id)
    if width * height > max_pixels:
        raise SampleError("video_too_large", f"the header gives {width}x{height} = {width * height} pixels a frame > "
                          f"the limit {max_pixels} (a decompression-bomb guard); downscale the video (or raise "
                          "SampleConfig.max_image_pixels)", sample_id)
    _check_held(held, claimed=claimed, seconds=seconds, fps=float(rate), sample_id=sample_id)
    return VideoHeader(frames=frames, fps=float(rate), width=width, height=height)


def check_planned_frames(data: bytes | str | os.PathLike[str], frames: Sequence[int], *,
                         sample_id: str = "") -> VideoHeader:
    """The video's header, once the file is found to hold the data of every frame in ``frames`` (a pack's
    plan): :func:`read_header`'s check, then the plan's last frame against the frames held. What
    ``wdspack verify`` runs on each packed video; no pixel limit (the pack job applied its own).

    Raises:
        SampleError: as :func:`read_header`; ``unreadable_video`` when the plan names a frame past those.

    Example:
        >>> check_planned_frames("clip.mp4", (0, 15, 30, 45), sample_id="a")  # doctest: +SKIP
        VideoHeader(frames=90, fps=30.0, width=64, height=48)
    """
    header = read_header(data, sample_id=sample_id, max_pixels=sys.maxsize)
    last = max(frames, default=-1)
    if last >= header.frames:
        raise SampleError("unreadable_video", f"the plan names frame {last} but the file holds the data of "
                          f"{header.frames} frames (the video is not the one planned, or was cut short: pack the "
                          "sample again from a whole copy)", sample_id)
    return header


@dataclass(frozen=True)
class _Held:
    """What one pass over a video's packets found of its frames' data in the file."""

    frames: int  #: packets whose data is whole (a frame each)
    cut: str  #: how the data stops before the end ("" where it does not)
    end: float | None  #: seconds at which the last whole packet ends (counted containers only; None: not known)


def _refuse_still_image(format_name: str, sample_id: str) -> None:
    """A still image under a video's name (a JPEG saved as ``.mp4``): FFmpeg reads it as a one-frame stream of
    its image demuxers (``image2``, ``jpeg_pipe``, ``png_pipe``, ...), which no video processor takes as a video."""
    if format_name == "image2" or format_name.endswith("_pipe"):
        kind = format_name.removesuffix("_pipe").upper() if format_name != "image2" else "still"
        raise SampleError("unreadable_video", f"not a video: the file is a {kind} image (FFmpeg reads it as "
                          f"{format_name!r}); list it under the record's images, or give the video file", sample_id)


def _count_packets(container: Any, stream: Any, sample_id: str, *, claimed: int = 0) -> _Held:
    """The stream's video packets whose data is whole (one a frame; nothing decoded), up to the ``claimed``
    frames where the header gives a count, within :data:`MAX_COUNT_SECONDS` (and, counting, within
    :data:`MAX_COUNTED_FRAMES`). A packet cut short (PyAV marks it corrupt) or a demuxing error ends the pass."""
    start, count, cut = time.monotonic(), 0, ""
    first: int | None = None
    last: int | None = None
    try:
        for packet in container.demux(stream):
            if not packet.size:  # the flush packet at the end of the data
                continue
            if packet.is_corrupt:  # the demuxer read fewer bytes than the packet has: the file stops inside it
                cut = "a frame's data stops short"
                break
            count += 1
            if claimed <= 0:  # where the data ends, against the duration the header gives
                at = packet.pts if packet.pts is not None else packet.dts
                if at is not None:
                    first = at if first is None else min(first, at)
                    last = max(last if last is not None else at, at + (packet.duration or 0))
            elif count >= claimed:  # every frame the header gives is there
                break
            if count > MAX_COUNTED_FRAMES and claimed <= 0:  # a count stops the pass at itself
                raise SampleError("video_too_large", f"over {MAX_COUNTED_FRAMES:,} frames counted (its container "
                                  "gives no count); split the video into shorter clips", sample_id)
            if time.monotonic() - start > MAX_COUNT_SECONDS:
                what = f"checking the data of the {claimed:,} frames its header gives" if claimed > 0 else \
                    "counting its frames (its container gives no count)"
                raise SampleError("video_too_large", f"{what} took over {MAX_COUNT_SECONDS:g} s at {count:,} frames; "
                                  "split the video" + (" or remux it as MP4" if claimed <= 0 else ""), sample_id)
    except SampleError:
        raise
    except Exception as e:  # PyAV's error for data it cannot read: the frames' data ends here
        cut = f"reading on fails with {_av_error(e)}"
    end = None
    if last is not None and first is not None and stream.time_base:
        end = float((last - min(first, 0)) * stream.time_base)  # a negative start counts towards the span
    return _Held(frames=count, cut=cut, end=end)


def _header_seconds(container: Any, stream: Any) -> tuple[float, bool] | None:
    """The video's duration as its header gives it, in seconds, and whether that is the video track's own
    (Matroska's ``DURATION`` tag, the stream's duration) or the whole container's (its longest track's)."""
    for key, value in stream.metadata.items():
        if key.upper().startswith("DURATION"):  # Matroska: "00:00:20.000000000" (FFmpeg, mkvmerge)
            hours, _, rest = str(value).partition(":")
            minutes, _, secs = rest.partition(":")
            try:
                return int(hours) * 3600 + int(minutes) * 60 + float(secs), True
            except ValueError:
                break
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base), True
    if container.duration:
        return container.duration / 1_000_000, False  # microseconds (FFmpeg's AV_TIME_BASE)
    return None


def _check_held(held: _Held, *, claimed: int, seconds: tuple[float, bool] | None, fps: float,
                sample_id: str) -> None:
    """Raise ``unreadable_video`` where the file holds the data of fewer frames than its header gives: with
    a count, fewer whole packets; without one, a packet cut short, or packets ending over two frames and
    half a second before the header's duration (a second more where that duration is the container's: another
    track may run longer). The slack keeps a last frame shown longer than the rest from reading as a cut."""
    damaged = held.cut.startswith("reading")  # a demuxing error, not a packet cut short
    fix = f"the file {'is damaged or' if damaged else 'was'} cut short: download it again"
    if claimed > 0:
        if held.frames >= claimed:
            return
        if not held.cut:  # every packet the sample table lists is whole: the count or the data is short
            fix = "the file was cut short, or its header is wrong: download it again"
        raise SampleError("unreadable_video", f"the header gives {claimed} frames but the file holds the data of "
                          f"{held.frames}{f', then {held.cut}' if damaged else ''} ({fix})", sample_id)
    if held.cut:
        raise SampleError("unreadable_video", f"the file holds the data of {held.frames} frames, then {held.cut} "
                          f"({fix})", sample_id)
    if seconds is not None and held.end is not None:
        total, own = seconds
        if held.end < total - 2 / fps - (0.5 if own else 1.5):
            raise SampleError("unreadable_video", f"the header gives {total:.2f} s but the file holds the data of "
                              f"{held.frames} frames, {held.end:.2f} s ({fix})", sample_id)


def _av_error(e: Exception) -> str:
    """PyAV's error in one line, without its name for in-memory bytes (``'<none>'``)."""
    message = " ".join(str(e).replace(": '<none>'", "").split())
    return f"{type(e).__name__}: {message}"
