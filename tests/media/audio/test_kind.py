"""The audio kind's declaration (its keys, drop reasons and decode errors, not yet among the package's kinds)
and its source: an audio reference read as bytes under the image root, with each way it can fail."""

from __future__ import annotations

import base64

import pytest

from wdspack.errors import DROP_REASONS, SampleError
from wdspack.media import KINDS
from wdspack.media.audio import AUDIO, AUDIO_DROP_REASONS, source
from wdspack.media.audio.decode import AudioDecodeError
from wdspack.media.audio.record import AudioPlanRecord
from wdspack.media.audio.source import audio_name, load_audio


def test_the_kind_declares_its_keys_reasons_and_errors():
    assert AUDIO.keys == ("audios", "audio_sample", "audio_tokens", "audio_plans")
    assert set(AUDIO_DROP_REASONS) == {"missing_audio", "audio_path_escape", "unreadable_audio", "audio_too_large",
                                       "no_audio_track", "audio_too_short"}
    assert all(DROP_REASONS[r] == meaning for r, meaning in AUDIO_DROP_REASONS.items())  # registered as declared
    assert set(AUDIO.load_drop_reasons) <= set(AUDIO.drop_reasons)
    assert AUDIO.decode_errors() == (AudioDecodeError,) and AUDIO.plan_record is AudioPlanRecord
    assert (AUDIO.placeholder, AUDIO.settings_part, AUDIO.budget) == ("<audio>", "feature_extractor",
                                                                      "max_audio_tokens_per_pack")
    assert "7,200 s" in AUDIO_DROP_REASONS["audio_too_large"]
    assert KINDS[-1] is AUDIO  # after the v1 kinds: packs without audio keep their bytes


def test_verify_checks_a_stored_audio_against_its_plan(clips):
    data = clips["wav_44k_stereo"].data
    AUDIO.check_item(data, AudioPlanRecord(44100, 32394, 16000, 11753, 11753), sample_id="s")
    with pytest.raises(SampleError, match="the plan names 40,000 samples at 44100 Hz but the file holds 32,394"):
        AUDIO.check_item(data, AudioPlanRecord(44100, 40000, 16000, 14513, 14513), sample_id="s")


def test_an_audio_is_read_as_bytes_in_every_spelling_a_record_uses(tmp_path, clips):
    wav = clips["wav_16k_mono"].data
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.wav").write_bytes(wav)
    b64 = base64.b64encode(wav).decode()
    for ref in ("a/x.wav", {"path": "a/x.wav"}, {"audio_url": {"url": "a/x.wav"}}, {"audio_url": "a/x.wav"},
                {"bytes": wav, "path": "x.wav"}, wav, f"data:audio/wav;base64,{b64}",
                {"data": b64, "format": "wav"}, {"input_audio": {"data": b64, "format": "wav"}},
                f"file://{tmp_path}/a/x.wav"):
        assert load_audio(ref, str(tmp_path)) == wav, ref
    assert AUDIO.load("a/x.wav", str(tmp_path), absolute_ok=False) == wav


def test_each_way_a_reference_fails_has_its_reason(tmp_path, monkeypatch):
    (tmp_path / "empty.wav").write_bytes(b"")
    (tmp_path / "big.wav").write_bytes(b"RIFF" + bytes(100))
    monkeypatch.setattr(source, "MAX_AUDIO_BYTES", 50)
    cases = [
        ("gone.wav", "missing_audio"),
        ("../outside.wav", "audio_path_escape"),
        ("https://example.com/a.wav", "missing_audio"),
        ("empty.wav", "unreadable_audio"),
        (b"", "unreadable_audio"),
        ("big.wav", "audio_too_large"),  # not read: its size is over the limit
        (bytes(51), "audio_too_large"),
        ({"data": base64.b64encode(bytes(51)).decode(), "format": "wav"}, "audio_too_large"),
        ({"array": [0.0, 0.1], "sampling_rate": 16000}, "malformed_record"),
        ([0.0, 0.1], "malformed_record"),
        ({"data": "not base64!", "format": "wav"}, "malformed_record"),
        ({"format": "wav"}, "malformed_record"),
    ]
    for ref, reason in cases:
        with pytest.raises(SampleError) as e:
            load_audio(ref, str(tmp_path))
        assert e.value.reason == reason, (ref, e.value)


def test_a_drop_detail_names_the_audio_by_its_path():
    assert audio_name("clips/a.wav") == "clips/a.wav"
    assert audio_name({"audio_url": {"url": "b.mp3"}}) == "b.mp3"
    assert audio_name({"input_audio": {"data": "UklGRg==", "format": "wav"}}) == ""
    assert audio_name({"bytes": b"...", "path": "c.flac"}) == "c.flac"
    assert audio_name(b"...") == "" and audio_name("data:audio/wav;base64,UklGRg==") == "a data: URL"
    assert AUDIO.describe({"audio": "d.ogg"}) == "d.ogg"
