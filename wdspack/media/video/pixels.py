"""A video's pixels in the loader's workers, bit-identical to the transformers video processors on CPU
(issue #40, the pixel half).

    video bytes + plan.indices ─► decode_frames ─► uint8 RGB [T, H, W, 3]   (PyAV; only the planned frames
                   │                                                        converted; seek or decode on)
    plan.height, plan.width ───► resize_frames ─► uint8 [T, 3, H', W']      (bicubic, antialiased, on uint8)
                                      qwen_video_patches ─► pixel_values_videos rows [t·h·w, 3·tps·p·p]
                                      (normalize=False: uint8 rows; normalize_video_rows finishes them)

Holds: frame ``i`` is the ``i``-th frame the decoder gives from the start (transformers' numbering);
seeking gives exactly those frames. Decoding is bounded in pixels, frames and seconds, and every
failure is a one-line :class:`VideoDecodeError`. ``tests/models/test_video_pixels.py`` checks the
pixels against ``Qwen2VLVideoProcessor`` and ``Qwen3VLVideoProcessor`` with ``torch.equal``.
"""

from __future__ import annotations

import bisect
import functools
import io
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError
from ..kind import DecodeError
from .header import _NO_AV, MAX_VIDEO_PIXELS

__all__ = ["MAX_DECODE_SECONDS", "MAX_VIDEO_PIXELS", "VideoDecodeError", "decode_frames", "normalize_video_rows",
           "normalize_video_rows_", "qwen_video_patches", "resize_frames", "row_normalizer"]

#: Seek to the keyframe before the next wanted frame when that skips at least this many frames; else decode on
#: (a seek costs a decoder flush; it never decodes a frame twice, since it only goes forward past decoded ones).
SEEK_MIN_FRAMES = 4
#: The most seconds one video's decoding may take (the default of ``decode_frames``' ``max_seconds``).
MAX_DECODE_SECONDS = 60.0


class VideoDecodeError(DecodeError):
    """Video bytes in a pack that cannot (or must not) be decoded: the message says why, in one line;
    ``index`` is the video's place in its pack, where the caller gave it."""


class _Fallback(Exception):
    """The packet index does not say which frame the decoder gave: decode from the start instead."""


class _Clock:
    def __init__(self, max_seconds: float) -> None:
        self.max_seconds, self.start = max_seconds, time.monotonic()

    def check(self, done: int) -> None:
        if time.monotonic() - self.start > self.max_seconds:
            raise VideoDecodeError(f"decoding stopped after {self.max_seconds:g} s (max_seconds) with {done} frames "
                                   "decoded; raise max_seconds if such videos are expected")


def decode_frames(data: bytes, indices: Sequence[int], *, max_pixels: int = 64_000_000,
                  max_seconds: float | None = None, max_frames: int = 4096,
                  max_video_pixels: int | None = None, index: int | None = None) -> np.ndarray:
    """The video's frames at ``indices`` (sorted, 0-based in the decoder's output order, repeats allowed)
    as uint8 RGB ``[T, H, W, 3]``, as PyAV's ``frame.to_ndarray(format="rgb24")`` gives them.

    Seeks to the keyframe before a wanted frame when that skips :data:`SEEK_MIN_FRAMES` frames or more,
    else decodes on. ``index``: the video's place in its pack, which an error then starts with and carries.

    Raises:
        VideoDecodeError: over ``max_pixels`` per frame, ``max_frames`` asked for or ``max_video_pixels``
            (frames × width × height; default :data:`MAX_VIDEO_PIXELS`) in all (nothing decoded), over
            ``max_seconds`` (default :data:`MAX_DECODE_SECONDS`), an index past the frames the video has, or
            bytes PyAV cannot decode.

    Example:
        >>> decode_frames(mp4_bytes, [0, 15, 30]).shape  # doctest: +SKIP
        (3, 48, 64, 3)
    """
    try:
        return _decode_frames(data, [int(i) for i in indices], max_pixels=max_pixels, max_seconds=max_seconds,
                              max_frames=max_frames, max_video_pixels=max_video_pixels)
    except VideoDecodeError as e:
        if index is None:
            raise
        raise VideoDecodeError(f"video {index}: {e}", index=index) from None


def _decode_frames(data: bytes, wanted: list[int], *, max_pixels: int, max_seconds: float | None, max_frames: int,
                   max_video_pixels: int | None) -> np.ndarray:
    if len(wanted) > max_frames:
        raise VideoDecodeError(f"{len(wanted)} frames asked for > max_frames {max_frames}; raise max_frames or "
                               "sample fewer frames")
    if any(i < 0 for i in wanted) or wanted != sorted(wanted):
        raise ValueError(f"frame indices must be sorted and >= 0, got {wanted[:8]}")
    try:
        import av
    except ImportError:
        raise ConfigError(_NO_AV) from None
    clock = _Clock(MAX_DECODE_SECONDS if max_seconds is None else max_seconds)
    bound = _Bound(max_pixels, MAX_VIDEO_PIXELS if max_video_pixels is None else max_video_pixels)
    try:
        with av.open(io.BytesIO(data)) as container:
            stream = _video_stream(container)
            bound.check_header(int(stream.codec_context.width), int(stream.codec_context.height), len(wanted))
            if not wanted:
                return np.zeros((0, stream.codec_context.height, stream.codec_context.width, 3), np.uint8)
            index = _PacketIndex.read(container, stream, clock)
            if index.seekable and wanted[-1] >= index.frames:
                raise VideoDecodeError(f"frame {wanted[-1]} asked for, but the video has {index.frames} frames")
            got = None
            targets = sorted(set(wanted))
            if index.seekable and _worth_seeking(index, targets):
                try:
                    got = _decode_seeking(container, stream, index, targets, clock, bound)
                except _Fallback:
                    got = None
        if got is None:  # from the start, in a fresh container: frame k is the k-th the decoder gives
            with av.open(io.BytesIO(data)) as container:
                bound.kept = 0
                got = _decode_sequential(container, _video_stream(container), set(wanted), clock, bound)
    except (VideoDecodeError, ConfigError):
        raise
    except Exception as e:  # PyAV's own errors (and any other) for damaged or hostile bytes: one line, no traceback
        raise VideoDecodeError(f"cannot decode the video ({_one_line(e)})") from None
    missing = [i for i in wanted if i not in got]
    if missing:
        why = f"; decoding failed after them ({got.failure})" if got.failure else ""
        raise VideoDecodeError(f"frame {missing[0]} asked for, but the video has {got.frames_seen} frames{why}")
    shapes = {a.shape for a in got.values()}
    if len(shapes) > 1:
        raise VideoDecodeError(f"the video's frames change size ({sorted(shapes)[:2]}); re-encode it at one size")
    return np.stack([got[i] for i in wanted])


def _one_line(e: BaseException) -> str:
    message = " ".join(str(e).replace(": '<none>'", "").split())  # '<none>': PyAV's name for in-memory bytes
    return f"{type(e).__name__}: {message}"


def _video_stream(container: Any) -> Any:
    if not container.streams.video:
        raise VideoDecodeError("the container holds no video stream")
    return container.streams.video[0]


class _Bound:
    """The pixels a frame may have, and the pixels one video's kept frames may hold together."""

    def __init__(self, max_pixels: int, max_video_pixels: int) -> None:
        self.max_pixels, self.max_video_pixels, self.kept = max_pixels, max_video_pixels, 0

    def check_header(self, width: int, height: int, frames: int) -> None:
        self._check_frame(width, height)
        if frames * width * height > self.max_video_pixels:
            raise VideoDecodeError(f"{frames} frames of {width}x{height} = {frames * width * height} pixels > "
                                   f"max_video_pixels {self.max_video_pixels}; sample fewer frames or smaller ones "
                                   "(--video-max-frames, --video-fps), or raise max_video_pixels")

    def keep(self, frame: Any) -> np.ndarray:
        """The frame as RGB, once its size (and the video's pixels so far) are in bounds."""
        self._check_frame(frame.width, frame.height)
        self.kept += frame.width * frame.height
        if self.kept > self.max_video_pixels:
            raise VideoDecodeError(f"the frames decoded so far hold {self.kept} pixels > max_video_pixels "
                                   f"{self.max_video_pixels} (the frames grew past the header's size); re-encode the "
                                   "video at one size")
        return frame.to_ndarray(format="rgb24")

    def _check_frame(self, width: int, height: int) -> None:
        if width * height > self.max_pixels:
            raise VideoDecodeError(f"a {width}x{height} video has {width * height} pixels a frame > max_pixels "
                                   f"{self.max_pixels}; raise max_pixels or downscale the video")


class _Frames(dict):
    """Converted frames by index; how many frames the decoder gave, and the error that stopped it."""

    frames_seen = 0
    failure = ""


class _PacketIndex:
    """The video packets' timestamps in output order, and which of them start at a keyframe."""

    def __init__(self, pts: list[int], keyframes: list[int], seekable: bool) -> None:
        self.frames, self.pts, self.keyframes, self.seekable = len(pts), pts, keyframes, seekable
        self.by_pts = {p: i for i, p in enumerate(pts)}

    @classmethod
    def read(cls, container: Any, stream: Any, clock: _Clock) -> _PacketIndex:
        """One pass over the demuxed packets (none decoded); ``seekable`` where their timestamps name every
        frame once and nothing is flagged to be discarded, so a timestamp tells the frame's number."""
        rows = []
        seekable = True
        for packet in container.demux(stream):
            if not packet.size:
                continue
            if packet.pts is None or packet.is_discard or packet.is_corrupt:
                seekable = False
            rows.append((packet.pts, packet.is_keyframe))
            if len(rows) % 256 == 0:
                clock.check(0)
        if not seekable or not rows or not rows[0][1]:
            return cls([], [], False)
        pts = sorted(p for p, _ in rows)
        if len(set(pts)) != len(pts) or (stream.frames and stream.frames != len(pts)):
            return cls([], [], False)
        order = {p: i for i, p in enumerate(pts)}
        return cls(pts, sorted(order[p] for p, key in rows if key), True)

    def keyframe_before(self, i: int) -> int:
        """The last keyframe at or before frame ``i`` (in output order)."""
        return self.keyframes[bisect.bisect_right(self.keyframes, i) - 1]


def _worth_seeking(index: _PacketIndex, targets: list[int]) -> bool:
    at = -1
    for i in targets:
        if index.keyframe_before(i) - at - 1 >= SEEK_MIN_FRAMES:
            return True
        at = i
    return False


def _decode_sequential(container: Any, stream: Any, wanted: set[int], clock: _Clock, bound: _Bound) -> _Frames:
    got = _Frames()
    last = max(wanted)
    frames = container.decode(stream)
    for k in range(last + 1):
        try:
            frame = next(frames, None)
        except Exception as e:  # damaged or cut bytes: the frames before them stand
            got.failure = _one_line(e)
            break
        if frame is None:
            break
        got.frames_seen = k + 1
        if k in wanted:
            got[k] = bound.keep(frame)
        clock.check(k + 1)
    return got


def _decode_seeking(container: Any, stream: Any, index: _PacketIndex, targets: list[int], clock: _Clock,
                    bound: _Bound) -> _Frames:
    """Each target from the keyframe before it when that skips :data:`SEEK_MIN_FRAMES` frames or more;
    a frame is known by its timestamp. Raises :class:`_Fallback` where the index proves wrong."""
    got = _Frames()
    frames = None
    at = -1  # the last frame the decoder gave
    decoded = 0
    for target in targets:
        key = index.keyframe_before(target)
        if frames is None or key - at - 1 >= SEEK_MIN_FRAMES:
            container.seek(index.pts[key], stream=stream, backward=True, any_frame=False)
            frames = _decode_from(container, stream, index.pts[key])
        while target not in got:
            try:
                frame = next(frames, None)
            except _Fallback:
                raise
            except Exception:  # damaged bytes: decoding from the start tells how many frames stand
                raise _Fallback from None
            if frame is None:
                raise _Fallback
            decoded += 1
            clock.check(decoded)
            i = index.by_pts.get(frame.pts)
            if i is None or i > target:  # a timestamp the index lacks, or a frame missed
                raise _Fallback
            at = max(at, i)
            if i == target:
                got[i] = bound.keep(frame)
    got.frames_seen = index.frames
    return got


def _decode_from(container: Any, stream: Any, key_pts: int) -> Any:
    """The frames decoded after a seek, which must land on the keyframe whose timestamp is ``key_pts``."""
    first = True
    for packet in container.demux(stream):
        if first and packet.size:
            if packet.pts != key_pts or not packet.is_keyframe:
                raise _Fallback
            first = False
        yield from packet.decode()


def resize_frames(frames: np.ndarray, height: int, width: int) -> torch.Tensor:
    """``[T, H, W, 3]`` uint8 frames → ``[T, 3, height, width]`` uint8, as the Qwen-VL video processors
    resize on CPU (torchvision's bicubic resize: ``interpolate`` on uint8, antialiased; unchanged where the
    size already fits).

    Example:
        >>> resize_frames(np.zeros((2, 50, 67, 3), np.uint8), 56, 84).shape
        torch.Size([2, 3, 56, 84])
    """
    # channels-last, as the frames come from the decoder: torch's uint8 kernel for that layout is the faster
    # one, and gives the same bytes (tests/models/test_video_pixels.py, test_video_families.py)
    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)
    if video.numel() == 0:
        return video.new_zeros((video.shape[0], 3, height, width))
    if tuple(video.shape[-2:]) == (height, width):  # torchvision returns it as it is
        return video
    return torch.nn.functional.interpolate(video, size=[height, width], mode="bicubic", align_corners=False,
                                           antialias=True)


def qwen_video_patches(frames: torch.Tensor, *, temporal_patch_size: int, patch_size: int, merge_size: int,
                       mean: Sequence[float], std: Sequence[float], rescale_factor: float,
                       normalize: bool = True) -> torch.Tensor:
    """One video's ``pixel_values_videos`` rows ``[t·h·w, 3·tps·p·p]`` from its resized uint8 frames
    ``[T, 3, H, W]``, as Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's video processors lay them out (an odd
    ``T`` padded with the last frame). float32 rescaled and normalised, or (``normalize=False``) the
    uint8 values, which :func:`normalize_video_rows` turns into exactly the float32 rows.

    Example:
        >>> rows = qwen_video_patches(torch.zeros(3, 3, 56, 84, dtype=torch.uint8), temporal_patch_size=2,
        ...                           patch_size=14, merge_size=2, mean=[0.5] * 3, std=[0.5] * 3,
        ...                           rescale_factor=1 / 255)
        >>> rows.shape
        torch.Size([48, 1176])
    """
    count, channels, height, width = frames.shape
    if pad := -count % temporal_patch_size:
        frames = torch.cat([frames, frames[-1:].expand(pad, -1, -1, -1)])
    gt, gh, gw = frames.shape[0] // temporal_patch_size, height // patch_size, width // patch_size
    if normalize:
        frames = _normalize(frames, mean, std, rescale_factor)
    patches = frames.reshape(gt, temporal_patch_size, channels, gh // merge_size, merge_size, patch_size,
                             gw // merge_size, merge_size, patch_size)
    patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return patches.reshape(gt * gh * gw, channels * temporal_patch_size * patch_size * patch_size)


def _fused(mean: Sequence[float], std: Sequence[float], rescale_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    # the processors fold the rescale into mean and std (float32), then subtract and divide
    scale = 1.0 / rescale_factor
    return torch.tensor(list(mean)) * scale, torch.tensor(list(std)) * scale


def _normalize(frames: torch.Tensor, mean: Sequence[float], std: Sequence[float],
               rescale_factor: float) -> torch.Tensor:
    m, s = _fused(mean, std, rescale_factor)
    return frames.to(torch.float32).sub_(m.view(-1, 1, 1)).div_(s.view(-1, 1, 1))


def normalize_video_rows(rows: torch.Tensor, *, mean: Sequence[float], std: Sequence[float],
                         rescale_factor: float) -> torch.Tensor:
    """uint8 ``pixel_values_videos`` rows (``normalize=False``) → the float32 rows the processor gives,
    bit for bit, on their device: ``(x - mean/rescale_factor) / (std/rescale_factor)`` per channel, the
    video processors' fused form (``x · rescale_factor`` first, as images are, can differ in the last bit).

    Example:
        >>> normalize_video_rows(torch.full((1, 12), 255, dtype=torch.uint8), mean=[0.5] * 3, std=[0.5] * 3,
        ...                      rescale_factor=1 / 255)[0, 0].item()
        1.0
    """
    return normalize_video_rows_(rows.to(torch.float32, copy=True), mean=mean, std=std, rescale_factor=rescale_factor)


def normalize_video_rows_(rows: torch.Tensor, *, mean: Sequence[float], std: Sequence[float],
                          rescale_factor: float) -> torch.Tensor:
    """:func:`normalize_video_rows` in place, on float32 rows holding the uint8 values (where the loader
    wrote them into the batch: one float write per value, no float copy per pack); returns ``rows``."""
    m, s = _fused(mean, std, rescale_factor)
    m, s = m.to(rows.device)[:, None], s.to(rows.device)[:, None]
    rows.view(rows.shape[0], m.shape[0], -1).sub_(m).div_(s)  # channel-major rows
    return rows


def row_normalizer(image_processor: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """:func:`normalize_video_rows_` with a processor's mean, std and rescale factor (a :class:`Rows` ``finish``)."""
    return functools.partial(normalize_video_rows_, mean=tuple(image_processor.image_mean),
                             std=tuple(image_processor.image_std),
                             rescale_factor=float(image_processor.rescale_factor))
