"""What a pack stores of an audio: its plan record (msgpack both ways, strict on the way in) and the bounds an
untrusted pack's audio plans must keep; the resampled length, as transformers computes it."""

from __future__ import annotations

import math

import msgpack
import pytest

from wdspack.errors import FormatError
from wdspack.media.audio.record import (
    MAX_AUDIO_RATE,
    MAX_AUDIO_SECONDS,
    AudioPlanRecord,
    check_audios,
    resampled_length,
)
from wdspack.media.kind import Media

PLAN = AudioPlanRecord(rate=44100, frames=323940, target_rate=16000, samples=117530, kept=117530)


def test_the_resampled_length_is_load_audio_s_ceil():
    for frames in (0, 1, 2, 159, 160, 161, 323_940, 44_099, 44_100, 44_101, MAX_AUDIO_SECONDS * 96_000):
        for src in (8000, 11025, 16000, 22050, 44100, 48000, 96000, MAX_AUDIO_RATE):
            # transformers: math.ceil(waveform.shape[-1] * sampling_rate / src_sampling_rate)
            assert resampled_length(frames, src, 16000) == math.ceil(frames * 16000 / src), (frames, src)
    assert resampled_length(323_940, 44_100, 16_000) == 117_530  # AUDIO.md's trap: PyAV alone gives 117,529
    with pytest.raises(ValueError):
        resampled_length(10, 0, 16000)


def test_a_plan_round_trips_through_msgpack_and_refuses_anything_else():
    packed = msgpack.packb(PLAN.to_msgpack())
    assert AudioPlanRecord.from_msgpack(msgpack.unpackb(packed)) == PLAN
    assert msgpack.unpackb(packed) == {"rate": 44100, "frames": 323940, "target_rate": 16000, "samples": 117530,
                                       "kept": 117530}
    good = PLAN.to_msgpack()
    bad = [None, [44100], {**good, "extra": 1}, {k: v for k, v in good.items() if k != "kept"},
           {**good, "rate": 44100.0}, {**good, "kept": True}, {**good, "frames": "1"}]
    for value in bad:
        with pytest.raises(TypeError):
            AudioPlanRecord.from_msgpack(value)


def _check(plan: AudioPlanRecord, tokens: int = 25, num_tokens: int = 1000) -> None:
    check_audios(Media((b"x",), (0,), (tokens,), (plan,)), num_tokens)


def test_plans_in_bounds_pass():
    _check(PLAN)
    _check(AudioPlanRecord(16000, 1, 16000, 1, 1), tokens=0)  # one sample, no token: the bounds allow it
    _check(AudioPlanRecord(48000, MAX_AUDIO_SECONDS * 48000, 16000, MAX_AUDIO_SECONDS * 16000, 480_000))


@pytest.mark.parametrize(("plan", "tokens", "message"), [
    (AudioPlanRecord(0, 100, 16000, 0, 1), 1, "rates 0 -> 16000 Hz"),
    (AudioPlanRecord(16000, 100, MAX_AUDIO_RATE + 1, 2401, 1), 1, "rates 16000 -> 384001 Hz"),
    (AudioPlanRecord(16000, 0, 16000, 0, 0), 1, "names 0 samples"),
    (AudioPlanRecord(16000, MAX_AUDIO_SECONDS * 16000 + 1, 16000, MAX_AUDIO_SECONDS * 16000 + 1, 1), 1,
     "a plan names 1 to 7200 s"),
    (AudioPlanRecord(44100, 323940, 16000, 117529, 117529), 1, "resampling gives 117530"),
    (AudioPlanRecord(16000, 100, 16000, 100, 101), 1, "keeps 101 of its 100"),
    (AudioPlanRecord(16000, 100, 16000, 100, 0), 1, "keeps 0 of its 100"),
    (AudioPlanRecord(16000, 100, 16000, 100, 100), -1, "has -1 tokens"),
])
def test_plans_out_of_bounds_are_format_errors(plan, tokens, message):
    with pytest.raises(FormatError, match=message):
        _check(plan, tokens)


def test_the_audios_tokens_must_fit_the_pack():
    with pytest.raises(FormatError, match="the audios take 1001 tokens of a pack of 1000"):
        _check(PLAN, tokens=1001)


def test_a_videos_own_sound_names_its_video_and_only_then_adds_a_key():
    """A linked audio's plan stores ``"video"`` (its video among its sub-sample's); every other plan keeps the bytes
    it had before links existed."""
    linked = AudioPlanRecord(44100, 323940, 16000, 117530, 117530, video=1)
    assert msgpack.packb(PLAN.to_msgpack()) == msgpack.packb(
        {"rate": 44100, "frames": 323940, "target_rate": 16000, "samples": 117530, "kept": 117530})
    assert AudioPlanRecord.from_msgpack(msgpack.unpackb(msgpack.packb(linked.to_msgpack()))) == linked
    assert AudioPlanRecord.from_msgpack(PLAN.to_msgpack()).video is None
    with pytest.raises(TypeError):
        AudioPlanRecord.from_msgpack({**PLAN.to_msgpack(), "video": "0"})
    with pytest.raises(FormatError, match="names video -1"):
        check_audios(Media((b"x",), (0,), (25,), (AudioPlanRecord(16000, 16000, 16000, 16000, 16000, video=-1),)), 64)
