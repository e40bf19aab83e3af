"""Audio clips made here with PyAV, once per session: every container and codec the audio kind reads, rates
8 kHz to 96 kHz, mono to 5.1, videos with and without sound (``tests.support.audio_clips`` makes them).

- ``clips``: ``{name: Clip}`` (its bytes, the source's samples, rate and channels), built once per session.
- ``encoder``: ``(encode, tone)``, for a test that makes a clip of its own.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.audio_clips import Clip, av, encode, encode_video, tone


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
