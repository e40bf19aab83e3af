"""An audio's probe: the exact samples a full decode gives, from the header where it is exact (WAV, FLAC, MP3
with a Xing/Info tag) and from a decode elsewhere; cut, damaged, hostile and soundless files refused with
their reason; every bound raised as ``audio_too_large``."""

from __future__ import annotations

import io

import numpy as np
import pytest

from wdspack.errors import SampleError
from wdspack.media.audio import header
from wdspack.media.audio.header import probe_audio

av = pytest.importorskip("av")

HEADER_EXACT = ["wav_16k_mono", "wav_16k_stereo", "wav_8k_mono", "wav_22k_stereo", "wav_44k_stereo", "wav_96k_mono",
                "wav_48k_51", "flac_44k_stereo", "flac_96k_mono", "mp3_44k_stereo", "mp3_22k_mono", "silent_wav"]
DECODED = ["mp3_notag_44k_stereo", "opus_48k_stereo", "opus_16k_mono", "aac_m4a_44k_stereo", "aac_mkv_48k_mono",
           "opus_webm_48k_mono", "video_mp4_aac", "video_webm_opus"]


def _decoded(data: bytes) -> tuple[int, int]:
    """``(samples per channel, rate)`` of PyAV's full decode of the first audio stream: the truth a probe gives."""
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(container.streams.audio[0]))
    return sum(f.samples for f in frames), frames[0].sample_rate


def _header_samples(data: bytes) -> float | None:
    with av.open(io.BytesIO(data)) as container:
        s = container.streams.audio[0]
        return float(s.duration * s.time_base * s.codec_context.sample_rate) if s.duration else None


def _reason(data: bytes, **kw) -> SampleError:
    with pytest.raises(SampleError) as e:
        probe_audio(data, sample_id="s", name="clip.x", **kw)
    return e.value


@pytest.mark.parametrize("name", HEADER_EXACT + DECODED)
def test_the_probe_gives_the_samples_a_full_decode_gives(clips, name):
    clip = clips[name]
    probe = probe_audio(clip.data, sample_id="s", name=name)
    assert (probe.frames, probe.rate) == _decoded(clip.data)
    assert probe.channels == clip.channels
    assert probe.measured == ("header" if name in HEADER_EXACT else "decode")
    assert probe.seconds == pytest.approx(probe.frames / probe.rate)


@pytest.mark.parametrize("name", HEADER_EXACT)
def test_exact_headers_give_the_source_s_own_length(clips, name):
    clip = clips[name]
    probe = probe_audio(clip.data, sample_id="s")
    assert (probe.frames, probe.rate) == (clip.samples, clip.rate)
    assert probe.codec in {"pcm_s16le", "pcm_s24le", "pcm_f32le", "flac", "mp3"} and probe.container in {"wav", "flac",
                                                                                                         "mp3"}


def test_the_headers_taken_as_inexact_are_off_by_what_the_codecs_add(clips):
    # what a probe trusting these headers would get wrong (the reason each is decoded instead)
    opus = clips["opus_48k_stereo"].data
    assert _header_samples(opus) == _decoded(opus)[0] + 312  # Opus's pre-skip, counted by the header
    m4a = clips["aac_m4a_44k_stereo"].data
    assert _decoded(m4a)[0] == 32768 != _header_samples(m4a)  # AAC's last frame: a whole 1024 samples decoded
    mp3 = clips["mp3_notag_44k_stereo"].data
    assert _decoded(mp3)[0] == 34560 and not float(_header_samples(mp3)).is_integer()  # a bitrate estimate
    assert _header_samples(clips["aac_mkv_48k_mono"].data) is None  # Matroska: no stream duration
    # Opus decodes at 48 kHz whatever rate it was encoded from
    assert probe_audio(clips["opus_16k_mono"].data, sample_id="s")[:3] == (48000, 1, 3 * 16001)


def test_an_mp3_tag_without_the_encoder_s_delays_still_counts_every_frame(clips):
    data = bytearray(clips["mp3_22k_mono"].data)
    at = data.find(b"Lavf", max(data.find(b"Info"), data.find(b"Xing")))  # the tag's encoder, not the ID3 text
    assert 0 < at < 400
    data[at:at + 4] = b"XXXX"  # a Xing tag with no LAME/Lavf delays: FFmpeg skips nothing, the decoder neither
    probe = probe_audio(bytes(data), sample_id="s")
    assert probe.measured == "header" and probe.frames == _decoded(bytes(data))[0] == 30 * 576  # the tag's frames


def test_an_id3_tag_before_the_first_frame_keeps_the_header_exact(clips):
    id3 = b"ID3\x04\x00\x00\x00\x00\x00\x0a" + bytes(10)
    probe = probe_audio(id3 + clips["mp3_44k_stereo"].data, sample_id="s")
    assert (probe.measured, probe.frames) == ("header", 32394)


@pytest.mark.parametrize("name", ["video_mp4_aac", "video_webm_opus"])
def test_a_video_is_probed_for_its_first_audio_stream(clips, name):
    probe = probe_audio(clips[name].data, sample_id="s")
    assert (probe.rate, probe.channels) == (48000, clips[name].channels)
    assert probe.seconds == pytest.approx(1, abs=0.01)


def test_a_video_without_sound_and_files_that_are_not_audio_are_refused(clips):
    e = _reason(clips["video_mp4_silent"].data)
    assert e.reason == "no_audio_track" and "'clip.x' is a video with no audio stream" in e.detail
    png = io.BytesIO()
    with av.open(png, "w", format="image2pipe") as out:
        s = out.add_stream("png", rate=1)
        s.width, s.height, s.pix_fmt = 8, 8, "rgb24"
        for p in s.encode(av.VideoFrame.from_ndarray(np.zeros((8, 8, 3), np.uint8), format="rgb24")):
            out.mux(p)
    assert _reason(png.getvalue()).reason == "unreadable_audio"
    assert "is an image" in _reason(png.getvalue()).detail
    for junk in (b"", b"\x00" * 4096, b"not audio at all" * 100):
        e = _reason(junk)
        assert e.reason == "unreadable_audio" and "clip.x" in e.detail, junk[:8]
    assert _reason(b"").detail.endswith("is empty (0 bytes); re-export the file or leave the record out")


def test_silent_audio_is_valid(clips):
    probe = probe_audio(clips["silent_wav"].data, sample_id="s")
    assert (probe.frames, probe.measured) == (4000, "header")


@pytest.mark.parametrize("name", ["wav_44k_stereo", "flac_44k_stereo", "mp3_44k_stereo"])
@pytest.mark.parametrize("keep", [0.6, 0.97])
def test_a_file_cut_short_is_unreadable_where_the_header_counts(clips, name, keep):
    data = clips[name].data
    e = _reason(data[:int(len(data) * keep)])
    assert e.reason == "unreadable_audio" and "cut short" in e.detail and "download it again" in e.detail


def test_a_wav_cut_at_a_packet_boundary_is_caught_by_its_data_chunk_size(clips):
    data = clips["wav_16k_mono"].data  # FFmpeg clamps its duration to the bytes there; the data chunk does not
    offset = data.find(b"data") + 8
    cut = data[:offset + 4096 * 2]
    with av.open(io.BytesIO(cut)) as container:
        assert container.streams.audio[0].duration == 4096  # what a header-only probe would have believed
    e = _reason(cut)
    assert e.reason == "unreadable_audio" and "gives 16,001 samples but holds 4,096" in e.detail


def test_a_file_cut_short_is_unreadable_where_the_decode_counts(clips, encoder):
    encode, tone = encoder
    mkv = encode(tone(16_000, 8_000, 1), 8_000, fmt="matroska", codec="aac")  # 2 s: DURATION tag, no count
    e = _reason(mkv[:len(mkv) // 2])
    assert e.reason == "unreadable_audio" and "gives 2.13 s but decodes to" in e.detail
    for name in ("aac_m4a_44k_stereo", "video_mp4_aac"):  # the index at the end: the cut file does not open
        assert _reason(clips[name].data[:len(clips[name].data) * 9 // 10]).reason == "unreadable_audio"


def test_a_hostile_wav_header_allocates_nothing_and_is_refused(clips):
    data = bytearray(clips["wav_16k_mono"].data)
    at = data.find(b"data")
    data[at + 4:at + 8] = (0xFFFFFFF0).to_bytes(4, "little")  # 4 GiB of samples claimed in a 32 kB file
    e = _reason(bytes(data))  # its claim is over the length bound before it is found cut
    assert e.reason == "audio_too_large" and "134,218 s of audio" in e.detail
    rate = bytearray(clips["wav_16k_mono"].data)
    fmt = rate.find(b"fmt ")
    rate[fmt + 12:fmt + 16] = (1_000_000).to_bytes(4, "little")  # a 1 MHz sample rate
    assert _reason(bytes(rate)).reason == "audio_too_large"


@pytest.mark.parametrize("name", ["wav_16k_mono", "flac_44k_stereo", "mp3_44k_stereo", "opus_48k_stereo",
                                  "video_mp4_aac"])
def test_every_bound_is_audio_too_large(clips, name, monkeypatch):
    data = clips[name].data
    monkeypatch.setattr(header, "MAX_AUDIO_SECONDS", 0.1)
    assert "over the 0.1 s limit" in _reason(data).detail
    monkeypatch.undo()
    monkeypatch.setattr(header, "MAX_AUDIO_BYTES", len(data) - 1)
    assert _reason(data).reason == "audio_too_large"
    monkeypatch.undo()
    monkeypatch.setattr(header, "MAX_AUDIO_CHANNELS", 0)
    assert _reason(data).reason == "audio_too_large"
    monkeypatch.undo()
    if probe_audio(data, sample_id="s").measured == "header" and name.startswith("wav"):
        return  # a WAV's count is its data chunk: nothing demuxed, nothing timed
    monkeypatch.setattr(header, "MAX_PROBE_SECONDS", -1.0)
    e = _reason(data)
    assert e.reason == "audio_too_large" and "took over -1 s to read" in e.detail
