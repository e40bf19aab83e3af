"""Audio clips made with PyAV for the tests: every container and codec the audio kind reads.

- ``tone(n, rate, channels)``: channel ``c`` is ``0.3·sin(2π·(440 + 220c)·t)``, float32 ``[C, n]`` (all in band
  at 8 kHz, so a resampling of it can be checked against the same sines at the new rate).
- ``encode(signal, rate, fmt=, codec=)``: the signal encoded as a file's bytes.
- ``encode_video(seconds=, audio=)``: a tiny video with that sound track (or none).
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import NamedTuple

import numpy as np

try:
    import av
except ImportError:  # the video extra: the tests that read clips skip without it
    av = None

LAYOUTS = {1: "mono", 2: "stereo", 6: "5.1"}


class Clip(NamedTuple):
    data: bytes
    samples: int  #: the source signal's samples per channel (before the encoder's delay and padding)
    rate: int
    channels: int


def tone(n: int, rate: int, channels: int = 1) -> np.ndarray:
    t = np.arange(n) / rate
    return np.stack([0.3 * np.sin(2 * np.pi * (440 + 220 * c) * t) for c in range(channels)]).astype(np.float32)


def encode(signal: np.ndarray, rate: int, *, fmt: str, codec: str, sample_format: str | None = None,
           container_options: dict[str, str] | None = None) -> bytes:
    """``signal`` (float32 ``[C, n]``) encoded with ``codec`` in the ``fmt`` container, as bytes."""
    layout = LAYOUTS[signal.shape[0]]
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt, container_options=container_options or {}) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        stream.format = sample_format or stream.codec_context.codec.audio_formats[0].name
        _write_audio(out, stream, signal, rate)
    return buf.getvalue()


def encode_video(*, seconds: float, audio: np.ndarray | None, rate: int = 48_000, fmt: str = "mp4",
                 vcodec: str = "h264", acodec: str = "aac") -> bytes:
    """A tiny video (32x24, 10 fps) of ``seconds``, with ``audio`` (float32 ``[C, n]``) as its sound track or none."""
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as out:
        video = out.add_stream(vcodec, rate=10)
        video.width, video.height, video.pix_fmt = 32, 24, "yuv420p"
        sound = None
        if audio is not None:
            sound = out.add_stream(acodec, rate=rate, layout=LAYOUTS[audio.shape[0]])
            sound.format = sound.codec_context.codec.audio_formats[0].name
        for k in range(round(seconds * 10)):
            pixels = np.full((24, 32, 3), k * 9 % 256, np.uint8)
            for packet in video.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in video.encode():
            out.mux(packet)
        if sound is not None and audio is not None:
            _write_audio(out, sound, audio, rate)
    return buf.getvalue()


def _write_audio(out, stream, signal: np.ndarray, rate: int) -> None:
    layout = LAYOUTS[signal.shape[0]]
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(signal), format="fltp", layout=layout)
    frame.sample_rate, frame.pts, frame.time_base = rate, 0, Fraction(1, rate)
    resampler = av.AudioResampler(format=stream.format.name, layout=layout, rate=rate,
                                  frame_size=stream.codec_context.frame_size or 1024)
    for piece in resampler.resample(frame) + resampler.resample(None):
        for packet in stream.encode(piece):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)


