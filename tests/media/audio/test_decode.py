"""An audio decoded for the loader: float32 mono at the family's rate, of exactly ``ceil(frames·rate/src_rate)``
samples, as transformers' ``load_audio`` gives it.

``load_audio`` needs soundfile and soxr, which are not installed here, so the references are written from the
signal itself: at 16 kHz the decode must equal the PCM's samples, averaged over channels in float32 as
``load_audio`` does, bit for bit; resampled, it must equal the same sines sampled at 16 kHz to within the PCM's
own quantisation (1e-4; measured 2.4e-5 at 8 kHz, 1.4e-5 at 44.1 kHz, 3e-6 from float PCM), away from the first
and last 32 samples, where the signal starts and stops abruptly and any resampler rings (PyAV's for about 5
samples; soxr's, a different filter, otherwise)."""

from __future__ import annotations

import io
import pickle
import re

import numpy as np
import pytest

from wdspack.errors import FormatError
from wdspack.media.audio import decode
from wdspack.media.audio.decode import AudioDecodeError, decode_audio, decode_track
from wdspack.media.audio.header import probe_audio
from wdspack.media.audio.record import resampled_length

av = pytest.importorskip("av")


def _pcm(data: bytes) -> np.ndarray:
    """A 16-bit WAV's samples as ``[N, C]`` float32, as soundfile reads them (``int16 / 32768``)."""
    with av.open(io.BytesIO(data)) as container:
        frames = [f.to_ndarray().reshape(-1, f.layout.nb_channels) for f in container.decode(audio=0)]
    return np.concatenate(frames).astype(np.float32) / np.float32(32768)


def _decode(clip, **kw) -> np.ndarray:
    probe = probe_audio(clip.data, sample_id="s")
    return decode_audio(clip.data, rate=16000, frames=probe.frames, sample_id="s", **kw)


@pytest.mark.parametrize("name", ["wav_16k_mono", "wav_16k_stereo", "silent_wav"])
def test_a_16k_wav_decodes_to_its_pcm_averaged_over_channels_bit_for_bit(clips, name):
    pcm = _pcm(clips[name].data)  # [N, C]
    expected = pcm[:, 0] if pcm.shape[1] == 1 else pcm.T.mean(axis=0)  # load_audio's soundfile path
    got = _decode(clips[name])
    assert got.dtype == np.float32 and got.shape == (clips[name].samples,)
    assert np.array_equal(got, expected)


def test_six_channels_are_averaged_not_downmixed_as_ffmpeg_would(encoder):
    encode, tone = encoder
    signal = tone(3000, 16000, 6)
    data = encode(signal, 16000, fmt="wav", codec="pcm_f32le")
    got = decode_audio(data, rate=16000, frames=3000, sample_id="s")
    assert np.array_equal(got, np.ascontiguousarray(signal.T).T.mean(axis=0))
    with av.open(io.BytesIO(data)) as container:  # FFmpeg's own 5.1 -> mono weighs front and centre, drops LFE
        ffmpeg = av.AudioResampler(format="flt", layout="mono", rate=16000)
        theirs = np.concatenate([f.to_ndarray().reshape(-1) for frame in container.decode(audio=0)
                                 for f in ffmpeg.resample(frame)])
    assert np.abs(theirs[:3000] - got).max() > 0.1


@pytest.mark.parametrize("name", ["wav_8k_mono", "wav_22k_stereo", "wav_44k_stereo", "wav_96k_mono", "wav_48k_51",
                                  "flac_44k_stereo"])
def test_a_resampled_decode_is_the_same_sines_at_16k(clips, name):
    clip = clips[name]
    got = _decode(clip)
    assert len(got) == resampled_length(clip.samples, clip.rate, 16000)
    t = np.arange(len(got)) / 16000
    ideal = np.mean([0.3 * np.sin(2 * np.pi * (440 + 220 * c) * t) for c in range(clip.channels)], axis=0)
    inner = slice(32, len(got) - 32)
    assert np.abs(got[inner] - ideal[inner]).max() < 1e-4
    assert np.corrcoef(got[inner], ideal[inner])[0, 1] > 0.99999


@pytest.mark.parametrize("name", ["wav_44k_stereo", "mp3_44k_stereo", "mp3_notag_44k_stereo", "opus_48k_stereo",
                                  "opus_16k_mono", "aac_m4a_44k_stereo", "aac_mkv_48k_mono", "opus_webm_48k_mono",
                                  "video_mp4_aac", "video_webm_opus", "flac_96k_mono", "wav_8k_mono"])
@pytest.mark.parametrize("rate", [16000, 24000])
def test_the_length_is_forced_to_the_planned_one(clips, name, rate):
    probe = probe_audio(clips[name].data, sample_id="s")
    got = decode_audio(clips[name].data, rate=rate, frames=probe.frames, sample_id="s")
    assert got.shape == (resampled_length(probe.frames, probe.rate, rate),) and got.dtype == np.float32
    assert 0.1 < np.abs(got).max() <= 1.0  # the tone is there, not silence or noise


def test_the_documented_trap_44k_323940_gives_117530_samples(encoder):
    encode, tone = encoder
    data = encode(tone(323_940, 44_100), 44_100, fmt="wav", codec="pcm_s16le")
    with av.open(io.BytesIO(data)) as container:  # PyAV's resampler alone ends one sample short
        resampler = av.AudioResampler(format="flt", layout="mono", rate=16000)
        alone = sum(f.samples for frame in container.decode(audio=0) for f in resampler.resample(frame))
        alone += sum(f.samples for f in resampler.resample(None))
    assert alone == 117_529
    assert decode_audio(data, rate=16000, frames=323_940, sample_id="s").shape == (117_530,)


@pytest.mark.parametrize("name", ["wav_44k_stereo", "wav_16k_mono", "opus_48k_stereo"])
def test_a_kept_prefix_is_the_full_decode_s_prefix(clips, name):
    full = _decode(clips[name])
    for keep in (1, 4000, len(full) - 1, len(full), len(full) + 10):
        assert np.array_equal(_decode(clips[name], keep=keep), full[:keep]), keep


def test_a_file_with_fewer_samples_than_planned_does_not_decode(clips):
    clip = clips["wav_44k_stereo"]
    with pytest.raises(AudioDecodeError, match=re.escape("sample 's': audio 3 'a.wav' decodes to 32,394 samples at "
                                                         "44100 Hz of the 40,000 planned")):
        decode_audio(clip.data, rate=16000, frames=40_000, sample_id="s", name="a.wav", index=3)
    assert _decode(clip, keep=100).shape == (100,)  # a cut that ends within the file reads no further
    more = decode_audio(clip.data, rate=16000, frames=30_000, sample_id="s")  # the plan's frames, not the file's
    assert more.shape == (resampled_length(30_000, 44_100, 16_000),)


def test_bad_bytes_and_changed_files_raise_one_line_decode_errors(clips, monkeypatch):
    clip = clips["wav_44k_stereo"]
    cases = {
        "does not decode": b"\x00" * 1000,
        "holds no audio stream": clips["video_mp4_silent"].data,
        "is at 44100 Hz but was planned at 48000 Hz": clip.data,
    }
    for message, data in cases.items():
        with pytest.raises(AudioDecodeError, match=message) as e:
            decode_audio(data, rate=16000, frames=100, sample_id="s", source_rate=48_000, index=1)
        assert e.value.index == 1 and "\n" not in str(e.value) and isinstance(e.value, FormatError)
    with pytest.raises(AudioDecodeError, match="decoding stopped after -1 s"):
        decode_audio(clip.data, rate=16000, frames=32_394, sample_id="s", max_seconds=-1)
    monkeypatch.setattr(decode, "MAX_AUDIO_SECONDS", 1)  # a plan over the bound allocates nothing
    with pytest.raises(AudioDecodeError, match="plan names 16,001 samples at 16000 Hz, over 1 s"):
        decode_audio(clips["wav_16k_mono"].data, rate=16000, frames=16_001, sample_id="s")
    back = pickle.loads(pickle.dumps(AudioDecodeError("sample 'a': audio 0 does not decode", index=0)))
    assert str(back) == "sample 'a': audio 0 does not decode"


def test_a_video_s_sound_track_decodes_as_an_audio_file_does(clips):
    clip = clips["video_mp4_aac"]
    probe = probe_audio(clip.data, sample_id="s")
    track = decode_track(clip.data, rate=16000, frames=probe.frames, sample_id="s", source_rate=probe.rate)
    assert track.shape == (resampled_length(probe.frames, 48000, 16000),)
    t = np.arange(len(track)) / 16000
    ideal = 0.5 * (0.3 * np.sin(2 * np.pi * 440 * t) + 0.3 * np.sin(2 * np.pi * 660 * t))
    # AAC is lossy and starts after its priming: the sines are there, not sample for sample
    assert np.corrcoef(track[2000:14000], ideal[2000:14000])[0, 1] > 0.99
