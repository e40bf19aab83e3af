"""Audio clips made here with PyAV, once per session: every container and codec the audio kind reads, rates
8 kHz to 96 kHz, mono to 5.1, videos with and without sound.

- ``tone(n, rate, channels)``: channel ``c`` is ``0.3·sin(2π·(440 + 220c)·t)``, float32 ``[C, n]`` (all in band
  at 8 kHz, so a resampling of it can be checked against the same sines at the new rate).
- ``encode(signal, rate, fmt=, codec=)``: the signal encoded as a file's bytes (the ``encode`` fixture).
- ``clips``: ``{name: Clip}`` (its bytes, the source's samples, rate and channels), built once per session.
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import NamedTuple

import numpy as np
import pytest

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


def _clip(n: int, rate: int, channels: int, *, fmt: str, codec: str, **options) -> Clip:
    return Clip(encode(tone(n, rate, channels), rate, fmt=fmt, codec=codec, **options), n, rate, channels)


@pytest.fixture(scope="session")
def clips() -> dict[str, Clip]:
    """Every clip the audio tests read, each under a second, encoded once per session (about a second in all)."""
    if av is None:
        pytest.skip("PyAV is not installed (pip install av)")
    made = {
        "wav_16k_mono": _clip(16_001, 16_000, 1, fmt="wav", codec="pcm_s16le"),
        "wav_16k_stereo": _clip(12_345, 16_000, 2, fmt="wav", codec="pcm_s16le"),
        "wav_8k_mono": _clip(8_001, 8_000, 1, fmt="wav", codec="pcm_s16le"),
        "wav_22k_stereo": _clip(22_051, 22_050, 2, fmt="wav", codec="pcm_s16le"),
        "wav_44k_stereo": _clip(32_394, 44_100, 2, fmt="wav", codec="pcm_s16le"),
        "wav_96k_mono": _clip(48_017, 96_000, 1, fmt="wav", codec="pcm_s24le"),
        "wav_48k_51": _clip(9_601, 48_000, 6, fmt="wav", codec="pcm_f32le"),
        "flac_44k_stereo": _clip(30_001, 44_100, 2, fmt="flac", codec="flac"),
        "flac_96k_mono": _clip(40_000, 96_000, 1, fmt="flac", codec="flac"),
        "mp3_44k_stereo": _clip(32_394, 44_100, 2, fmt="mp3", codec="libmp3lame"),
        "mp3_22k_mono": _clip(16_001, 22_050, 1, fmt="mp3", codec="libmp3lame"),
        "mp3_notag_44k_stereo": _clip(32_394, 44_100, 2, fmt="mp3", codec="libmp3lame",
                                      container_options={"write_xing": "0"}),
        "opus_48k_stereo": _clip(24_081, 48_000, 2, fmt="ogg", codec="libopus"),
        "opus_16k_mono": _clip(16_001, 16_000, 1, fmt="ogg", codec="libopus"),
        "aac_m4a_44k_stereo": _clip(32_394, 44_100, 2, fmt="ipod", codec="aac"),
        "aac_mkv_48k_mono": _clip(24_000, 48_000, 1, fmt="matroska", codec="aac"),
        "opus_webm_48k_mono": _clip(24_000, 48_000, 1, fmt="webm", codec="libopus"),
        "silent_wav": Clip(encode(np.zeros((1, 4_000), np.float32), 16_000, fmt="wav", codec="pcm_s16le"),
                           4_000, 16_000, 1),
    }
    made["video_mp4_aac"] = Clip(encode_video(seconds=1.0, audio=tone(48_000, 48_000, 2)), 48_000, 48_000, 2)
    made["video_webm_opus"] = Clip(encode_video(seconds=1.0, audio=tone(48_000, 48_000, 1), fmt="webm",
                                                vcodec="libvpx-vp9", acodec="libopus"), 48_000, 48_000, 1)
    made["video_mp4_silent"] = Clip(encode_video(seconds=1.0, audio=None), 0, 0, 0)
    return made


@pytest.fixture(scope="session")
def encoder():
    """:func:`encode` and :func:`tone`, for a test that makes a clip of its own."""
    if av is None:
        pytest.skip("PyAV is not installed (pip install av)")
    return encode, tone
