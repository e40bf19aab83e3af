"""An audio's probe: its source rate, channels and the exact samples per channel a full decode gives.

    WAV (PCM), FLAC, MP3 with a Xing/Info tag ─► the header's count, once the file is found to hold it: WAV's
                                                data chunk all there; FLAC's, MP3's packets demuxed (nothing
                                                decoded) up to the count, the last one whole
    anything else (MP3 without a tag, Opus,   ─► one full decode of the first audio stream, counted; refused where
    AAC in MP4/M4A, Matroska/WebM, a video)     a packet is cut, an MP4's packet is missing or a Matroska track
                                                ends over 0.5 s before its duration

Holds: ``frames`` is what :func:`~.decode.decode_audio` decodes from the same bytes. A video is read for its
first audio stream (``no_audio_track`` where it has none). Bounded: :data:`MAX_AUDIO_BYTES` read,
:data:`MAX_PROBE_SECONDS` of demuxing or decoding, :data:`~.record.MAX_AUDIO_SECONDS` of audio.
"""

from __future__ import annotations

import io
import time
from fractions import Fraction
from typing import Any, NamedTuple

from ...errors import ConfigError, SampleError
from .record import MAX_AUDIO_RATE, MAX_AUDIO_SECONDS

__all__ = ["MAX_AUDIO_BYTES", "MAX_AUDIO_CHANNELS", "MAX_PROBE_SECONDS", "MAX_SHORTFALL_SECONDS", "AudioProbe",
           "probe_audio"]

#: The largest audio file probed (a video's, for its sound track, as large as a video may be), in bytes.
MAX_AUDIO_BYTES = 2 << 30
#: The most seconds one probe may spend demuxing or decoding (the video header's bound).
MAX_PROBE_SECONDS = 30.0
#: The most channels an audio may have (FFmpeg's own bound is 512; 22.2 sound has 24).
MAX_AUDIO_CHANNELS = 64
#: A decoded track shorter than its container's own duration (Matroska's) by more than this is cut short; the
#: slack covers a codec's delay (Opus: 6.5 ms) and a last block shown longer than its samples.
MAX_SHORTFALL_SECONDS = 0.5

_NO_AV = "reading audio needs PyAV, which is not installed: pip install av"
#: Matroska/WebM give no sample count: the decode is checked against the track's duration (its DURATION tag).
_DURATION_CHECKED = ("matroska,webm",)


class AudioProbe(NamedTuple):
    """What a probe found of an audio: its source ``rate`` (Hz, as decoded), ``channels``, the samples per
    channel a full decode gives (``frames``), the ``codec`` and ``container`` (FFmpeg's names) and how the
    count was ``measured`` (``"header"`` or ``"decode"``)."""

    rate: int
    channels: int
    frames: int
    codec: str
    container: str
    measured: str

    @property
    def seconds(self) -> float:
        return self.frames / self.rate


def _audio_error(reason: str, what: str, sample_id: str, name: str) -> SampleError:
    """``SampleError(reason, ...)`` whose detail starts with the audio's name (``audio 'a.wav'``)."""
    return SampleError(reason, f"{_named(name)} {what}", sample_id)


def probe_audio(data: bytes, *, sample_id: str, name: str = "") -> AudioProbe:
    """The first audio stream's rate, channels and exact sample count, from the header where the header is
    exact and the data is found whole, else from one full decode.

    Raises:
        SampleError: ``unreadable_audio`` (empty, not audio PyAV opens, undecodable, or cut short: fewer
            samples or packets than the header gives), ``audio_too_large`` (over :data:`MAX_AUDIO_BYTES`,
            :data:`~.record.MAX_AUDIO_SECONDS`, :data:`~.record.MAX_AUDIO_RATE`, :data:`MAX_AUDIO_CHANNELS` or
            :data:`MAX_PROBE_SECONDS`), ``no_audio_track`` (a video without sound).

    Example:
        >>> probe_audio(wav_bytes, sample_id="a", name="a.wav")  # doctest: +SKIP
        AudioProbe(rate=44100, channels=2, frames=323940, codec='pcm_s16le', container='wav', measured='header')
    """
    if not data:
        raise _audio_error("unreadable_audio", "is empty (0 bytes); re-export the file or leave the record out",
                          sample_id, name)
    if len(data) > MAX_AUDIO_BYTES:
        raise _audio_error("audio_too_large", f"is {len(data):,} bytes, over the {MAX_AUDIO_BYTES:,}-byte limit; cut "
                          "it into shorter clips", sample_id, name)
    try:
        import av
    except ImportError:
        raise ConfigError(_NO_AV) from None
    try:
        with open_audio(av, data) as container:
            stream = _first_audio_stream(container, sample_id, name)
            codec, fmt = str(stream.codec_context.codec.canonical_name), str(container.format.name)
            rate, channels = int(stream.codec_context.sample_rate or 0), int(stream.codec_context.channels or 0)
            if rate > 0 and channels > 0:  # else the decode finds them
                _check_shape(rate, channels, sample_id, name)
                exact = _header_frames(data, container, stream, fmt, codec, rate, sample_id, name)
                if exact is not None:
                    return AudioProbe(rate, channels, exact, codec, fmt, "header")
            rate, channels, frames = _decode_count(container, stream, fmt, sample_id, name)
            return AudioProbe(rate, channels, frames, codec, fmt, "decode")
    except SampleError:
        raise
    except Exception as e:  # PyAV raises its own error types for damaged or unknown containers
        raise _audio_error("unreadable_audio", f"cannot be read as audio ({_av_error(e)}); check that the file is "
                          "an audio or video file and whole", sample_id, name) from None


#: WAV format tags whose header says all a decoder needs: PCM, IEEE float, and WAVE_FORMAT_EXTENSIBLE.
_PLAIN_WAV = (1, 3, 0xFFFE)


def open_audio(av: Any, data: bytes) -> Any:
    """``data`` opened by PyAV. A plain WAV is opened with FFmpeg's stream-info probing held to its header: by
    default that probing reads up to 5 MB of the file (all of a 20 s clip, 78 ms of a 92 ms probe) to learn what
    the ``fmt `` chunk already says."""
    wav = data[:4] in (b"RIFF", b"RF64") and data[8:16] == b"WAVEfmt "
    plain = wav and int.from_bytes(data[20:22], "little") in _PLAIN_WAV
    return av.open(io.BytesIO(data), mode="r", options={"probesize": "32"} if plain else {})


def _first_audio_stream(container: Any, sample_id: str, name: str) -> Any:
    """The container's first audio stream; a still image is ``unreadable_audio``, a video without sound
    ``no_audio_track``."""
    fmt = str(container.format.name)
    if fmt == "image2" or fmt.endswith("_pipe"):  # a JPEG under an audio's name: FFmpeg's image demuxers
        raise _audio_error("unreadable_audio", f"is an image, not audio (FFmpeg reads it as {fmt!r}); give the audio "
                          "file", sample_id, name)
    if not container.streams.audio:
        if container.streams.video:
            raise _audio_error("no_audio_track", "is a video with no audio stream; give a video with sound, or the "
                              "audio as its own file", sample_id, name)
        raise _audio_error("unreadable_audio", "holds no audio stream; give an audio file", sample_id, name)
    return container.streams.audio[0]


def _check_shape(rate: int, channels: int, sample_id: str, name: str) -> None:
    if rate <= 0 or channels <= 0:
        raise _audio_error("unreadable_audio", f"has a header that gives {rate} Hz and {channels} channels; "
                          "re-export the file", sample_id, name)
    if rate > MAX_AUDIO_RATE or channels > MAX_AUDIO_CHANNELS:
        raise _audio_error("audio_too_large", f"has {channels} channels at {rate} Hz, over the limits "
                          f"({MAX_AUDIO_CHANNELS} channels, {MAX_AUDIO_RATE} Hz); downmix or resample it", sample_id,
                          name)


def _check_length(frames: int, rate: int, sample_id: str, name: str) -> None:
    if frames > MAX_AUDIO_SECONDS * rate:
        raise _audio_error("audio_too_large", f"has {frames / rate:,.0f} s of audio, over the {MAX_AUDIO_SECONDS:,} s "
                          "limit; cut it into shorter clips", sample_id, name)


def _header_frames(data: bytes, container: Any, stream: Any, fmt: str, codec: str, rate: int, sample_id: str,
                   name: str) -> int | None:
    """The header's sample count where it is exact (WAV's PCM, FLAC's STREAMINFO, an MP3's Xing/Info tag, as
    FFmpeg reads it), once the file is found to hold those samples; None where the header is not exact."""
    if fmt == "wav" and codec.startswith("pcm_"):
        chunk = _wav_data_chunk(data)
        if chunk is None or not chunk.block_align:
            return None
        frames = chunk.declared // chunk.block_align
        if frames <= 0:
            return None
        _check_length(frames, rate, sample_id, name)
        held = max(0, len(data) - chunk.offset) // chunk.block_align
        if held < frames:
            raise _audio_error("unreadable_audio", f"has a header that gives {frames:,} samples but holds {held:,} "
                              "(the file was cut short: download it again)", sample_id, name)
        return frames if _header_duration(stream, rate) == frames else None
    if fmt == "flac" and codec == "flac":
        total = _header_duration(stream, rate)
        if not total:
            return None  # STREAMINFO gives no total (a streamed encode)
        _check_length(total, rate, sample_id, name)
        last = _check_packets(container, stream, total, rate, sample_id, name)
        try:  # FLAC frames decode alone; one cut short fails its CRC
            whole = sum(f.samples for f in stream.codec_context.decode(last)) == last.duration
        except Exception:
            whole = False
        if not whole:
            raise _audio_error("unreadable_audio", "has a last frame that does not decode (the file was cut short: "
                              "download it again)", sample_id, name)
        return total
    if fmt == "mp3" and codec == "mp3":
        tag = _mp3_info_tag(data)
        if tag is None or _header_duration(stream, rate) != tag.samples:
            return None
        _check_length(tag.samples, rate, sample_id, name)
        last = bytes(_check_packets(container, stream, tag.frames * tag.frame_samples, rate, sample_id, name))
        if len(last) < _mp3_frame_bytes(last):  # FFmpeg's parser gives the bytes left of a frame cut short
            raise _audio_error("unreadable_audio", f"has a last frame of {len(last)} bytes of its "
                              f"{_mp3_frame_bytes(last)} (the file was cut short: download it again)", sample_id, name)
        return tag.samples
    return None


def _header_duration(stream: Any, rate: int) -> int | None:
    """The stream's duration in samples, where the header gives one that is a whole number of them."""
    if not stream.duration or not stream.time_base:
        return None
    samples = Fraction(stream.duration) * stream.time_base * rate
    return int(samples) if samples.denominator == 1 else None


def _check_packets(container: Any, stream: Any, needed: int, rate: int, sample_id: str, name: str) -> Any:
    """One demux pass (nothing decoded): the packets whose data is whole must hold ``needed`` samples; the
    packet that completes them, for its format's check (a parser gives a frame cut short as a packet)."""
    start, held = time.monotonic(), Fraction(0)
    cut = ""
    try:
        for packet in container.demux(stream):
            if not packet.size:
                continue
            if packet.is_corrupt:  # the demuxer read fewer bytes than the packet has: the file stops inside it
                cut = ", then a packet's data stops short"
                break
            held += Fraction(packet.duration or 0) * stream.time_base * rate
            if held >= needed:
                return packet
            _check_clock(start, sample_id, name)
    except SampleError:
        raise
    except Exception as e:  # PyAV's error for data it cannot read: the data ends here
        cut = f", then reading on fails with {_av_error(e)}"
    raise _audio_error("unreadable_audio", f"has a header that gives {needed:,} samples but holds the data of "
                      f"{int(held):,}{cut} (the file was cut short: download it again)", sample_id, name)


def _decode_count(container: Any, stream: Any, fmt: str, sample_id: str, name: str) -> tuple[int, int, int]:
    """``(rate, channels, frames)`` of one full decode of ``stream``, checked against what the container gives
    of it: every packet of an indexed container (MP4), the track's duration in Matroska."""
    start, packets, frames = time.monotonic(), 0, 0
    rate = channels = 0
    try:
        for packet in container.demux(stream):
            if packet.size and packet.is_corrupt:
                raise _audio_error("unreadable_audio", f"holds {frames:,} samples, then a packet's data stops short "
                                  "(the file was cut short: download it again)", sample_id, name)
            packets += bool(packet.size)
            for frame in packet.decode():  # the empty packet at the end drains the decoder
                if not rate:
                    rate, channels = int(frame.sample_rate), int(frame.layout.nb_channels)
                    _check_shape(rate, channels, sample_id, name)
                elif int(frame.sample_rate) != rate:
                    raise _audio_error("unreadable_audio", f"changes its rate from {rate} to {frame.sample_rate} Hz "
                                      "midway; re-export it at one rate", sample_id, name)
                frames += int(frame.samples)
            if rate:
                _check_length(frames, rate, sample_id, name)
            _check_clock(start, sample_id, name)
    except SampleError:
        raise
    except Exception as e:
        raise _audio_error("unreadable_audio", f"holds {frames:,} samples, then decoding fails with {_av_error(e)} "
                          "(the file is damaged or was cut short: download it again)", sample_id, name) from None
    if frames <= 0:
        raise _audio_error("unreadable_audio", "decodes to no samples; re-export the file", sample_id, name)
    if stream.frames and packets < stream.frames:  # MP4/MOV list every packet
        raise _audio_error("unreadable_audio", f"has a header that gives {stream.frames:,} packets but holds "
                          f"{packets:,} (the file was cut short: download it again)", sample_id, name)
    seconds = _track_seconds(stream) if fmt in _DURATION_CHECKED else None
    if seconds is not None and frames / rate < seconds - MAX_SHORTFALL_SECONDS:
        raise _audio_error("unreadable_audio", f"has a header that gives {seconds:.2f} s but decodes to "
                          f"{frames / rate:.2f} s (the file was cut short: download it again)", sample_id, name)
    return rate, channels, frames


def _track_seconds(stream: Any) -> float | None:
    """The track's own duration in seconds: Matroska's ``DURATION`` tag (``"00:00:20.000000000"``)."""
    for key, value in stream.metadata.items():
        if key.upper().startswith("DURATION"):
            hours, _, rest = str(value).partition(":")
            minutes, _, secs = rest.partition(":")
            try:
                return int(hours) * 3600 + int(minutes) * 60 + float(secs)
            except ValueError:
                return None
    return None


def _check_clock(start: float, sample_id: str, name: str) -> None:
    if time.monotonic() - start > MAX_PROBE_SECONDS:
        raise _audio_error("audio_too_large", f"took over {MAX_PROBE_SECONDS:g} s to read; cut it into shorter "
                          "clips", sample_id, name)


class _WavData(NamedTuple):
    offset: int  #: where the samples start
    declared: int  #: the data chunk's size, in bytes
    block_align: int  #: bytes per sample frame (all channels)


def _wav_data_chunk(data: bytes) -> _WavData | None:
    """A RIFF/WAVE file's data chunk as its header declares it; None for RF64, a streamed size (0 or
    0xFFFFFFFF) or no data chunk (the decode then counts)."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    pos, block_align = 12, 0
    while pos + 8 <= len(data):
        kind, size = data[pos:pos + 4], int.from_bytes(data[pos + 4:pos + 8], "little")
        if kind == b"fmt " and size >= 14:
            block_align = int.from_bytes(data[pos + 20:pos + 22], "little")
        elif kind == b"data":
            return None if size in (0, 0xFFFFFFFF) else _WavData(pos + 8, size, block_align)
        pos += 8 + size + (size & 1)
    return None


class _InfoTag(NamedTuple):
    frames: int  #: MPEG frames after the tag's own
    frame_samples: int  #: samples a frame (1152 for MPEG-1, 576 for MPEG-2/2.5)
    samples: int  #: what the decoder gives: the frames' samples less the encoder's delay and padding


def _mp3_info_tag(data: bytes) -> _InfoTag | None:
    """The Xing/Info tag of an MP3's first frame (after any ID3v2 tags), with its frame count, as FFmpeg reads
    it: the encoder's delay and padding (LAME, Lavf, Lavc) taken off; None where there is no such count."""
    pos = 0
    while data[pos:pos + 3] == b"ID3" and len(data) >= pos + 10:
        size = 0
        for b in data[pos + 6:pos + 10]:  # a syncsafe integer: 7 bits a byte
            size = (size << 7) | (b & 0x7F)
        pos += 10 + size + (10 if data[pos + 5] & 0x10 else 0)
    head = data[pos:pos + 4]
    if len(head) < 4 or head[0] != 0xFF or head[1] & 0xE0 != 0xE0:
        return None
    version, layer, mono = (head[1] >> 3) & 3, (head[1] >> 1) & 3, (head[3] >> 6) == 3
    if version == 1 or layer != 1:  # reserved version, or not layer III
        return None
    at = pos + 4 + ((17 if mono else 32) if version == 3 else (9 if mono else 17))  # past the side information
    if data[at:at + 4] not in (b"Xing", b"Info"):
        return None
    flags = int.from_bytes(data[at + 4:at + 8], "big")
    if not flags & 1:  # no frame count
        return None
    frames = int.from_bytes(data[at + 8:at + 12], "big")
    at += 12 + 4 * bool(flags & 2) + 100 * bool(flags & 4) + 4 * bool(flags & 8)
    spf = 1152 if version == 3 else 576
    samples = frames * spf
    if data[at:at + 4] in (b"LAME", b"Lavf", b"Lavc"):  # the encoder's delay and padding, 12 bits each
        delays = int.from_bytes(data[at + 21:at + 24], "big")
        samples -= (delays >> 12) + (delays & 0xFFF)
    return _InfoTag(frames, spf, samples) if frames > 0 and samples > 0 else None


#: MPEG audio layer III bitrates (kbit/s) by index: MPEG-1, then MPEG-2 and 2.5.
_MP3_KBPS = ((0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
             (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160))
#: Sample rates by index, for MPEG version bits 3 (MPEG-1), 2 (MPEG-2) and 0 (MPEG-2.5).
_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def _mp3_frame_bytes(frame: bytes) -> int:
    """The bytes of the layer III frame whose header starts ``frame``, as the header gives them (0: unknown,
    as a free-format frame)."""
    if len(frame) < 4 or frame[0] != 0xFF or frame[1] & 0xE0 != 0xE0:
        return 0
    version, rate_index = (frame[1] >> 3) & 3, (frame[2] >> 2) & 3
    if version not in _MP3_RATES or rate_index == 3 or frame[2] >> 4 == 15:
        return 0
    kbps = _MP3_KBPS[version != 3][frame[2] >> 4]
    return (144_000 if version == 3 else 72_000) * kbps // _MP3_RATES[version][rate_index] + ((frame[2] >> 1) & 1)


def _named(name: str) -> str:
    return f"audio {name!r}" if name else "the audio (inline bytes)"


def _av_error(e: Exception) -> str:
    """PyAV's error in one line, without its name for in-memory bytes (``'<none>'``)."""
    message = " ".join(str(e).replace(": '<none>'", "").split())
    return f"{type(e).__name__}: {message}"
