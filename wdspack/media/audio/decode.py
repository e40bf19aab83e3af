"""An audio's waveform in the loader's workers, as transformers' ``load_audio`` makes it: float32 mono at the
family's rate, of exactly the planned length.

    bytes ─► PyAV decode (first audio stream) ─► float32 [N, C] ─► mean over C ─► mono at the source rate
          ─► PyAV's resampler to ``rate``, a block of RESAMPLE_BLOCK samples at a time (flushed)
          ─► cut or zero-padded to ceil(frames · rate / src_rate)

Holds: the channels are averaged in float32 as ``load_audio`` averages them (FFmpeg's own downmix to mono
weighs them otherwise), the source is read up to the planned ``frames`` only, and decoding stops once the
``keep`` samples a family's cut leaves are out. Every failure is a one-line :class:`AudioDecodeError`.

The resampler is fed blocks, not the codec's frames: it keeps its filter's state across calls, so the samples are
the same bit for bit, but one call per frame (1,500 for 20 s of MP3) cost more than the decode itself
(``docs/benchmarks/audio.md``).
"""

from __future__ import annotations

import time
from fractions import Fraction
from typing import Any

import numpy as np

from ...errors import ConfigError
from ..kind import DecodeError
from .header import _NO_AV, _av_error, open_audio
from .record import MAX_AUDIO_RATE, MAX_AUDIO_SECONDS, resampled_length

__all__ = ["MAX_DECODE_SECONDS", "RESAMPLE_BLOCK", "AudioDecodeError", "decode_audio", "decode_track",
           "resampled_length"]

#: The most seconds one audio's decoding may take (the default of ``decode_audio``'s ``max_seconds``).
MAX_DECODE_SECONDS = 60.0

#: Source samples handed to the resampler at once (half a second at 48 kHz).
RESAMPLE_BLOCK = 24_000


class AudioDecodeError(DecodeError):
    """Audio bytes in a pack that cannot be decoded as planned (the loader drops the sample as
    ``unreadable_audio``): the message says why, in one line; ``index`` is the audio's place in its pack."""


def decode_audio(data: bytes, *, rate: int, frames: int, sample_id: str, name: str = "",
                 source_rate: int | None = None, keep: int | None = None, max_seconds: float | None = None,
                 index: int | None = None) -> np.ndarray:
    """The first audio stream of ``data`` as float32 mono at ``rate``: exactly
    ``resampled_length(frames, src_rate, rate)`` samples, or the first ``keep`` of them.

    Args:
        data: the audio (or video) file's bytes.
        rate: the rate the family takes (16000).
        frames: the source samples per channel the plan counted (:func:`~.header.probe_audio`).
        sample_id, name: who owns the audio and its path, for the message.
        source_rate: the source rate the plan was made at; a file at another rate does not decode.
        keep: decode only the first ``keep`` output samples (a family's cut); None: all of them.
        max_seconds: the wall-clock bound (default :data:`MAX_DECODE_SECONDS`).
        index: the audio's place in its pack, which the error carries.

    Raises:
        AudioDecodeError: bytes PyAV cannot decode, no audio stream, another source rate, fewer source samples
            than ``frames`` (the file changed after packing, or was cut), over :data:`~.record.MAX_AUDIO_SECONDS`
            or over ``max_seconds``.

    Example:
        >>> decode_audio(wav_44k_bytes, rate=16000, frames=323940, sample_id="a").shape  # doctest: +SKIP
        (117530,)
    """
    if not 0 < rate <= MAX_AUDIO_RATE or frames < 0 or (keep is not None and keep < 0):
        raise ValueError(f"decode_audio needs 0 < rate <= {MAX_AUDIO_RATE}, frames >= 0 and keep >= 0, got "
                         f"rate={rate}, frames={frames}, keep={keep}")
    subject = f"sample {sample_id!r}: " if sample_id else ""
    subject += "audio" + (f" {index}" if index is not None else "") + (f" {name!r}" if name else "")
    try:
        import av
    except ImportError:
        raise ConfigError(_NO_AV) from None
    limit = MAX_DECODE_SECONDS if max_seconds is None else max_seconds
    start = time.monotonic()
    sink: _MonoSink | None = None
    try:
        with open_audio(av, data) as container:
            if not container.streams.audio:
                raise AudioDecodeError(f"{subject} holds no audio stream", index=index)
            for frame in container.decode(container.streams.audio[0]):
                if sink is None:
                    if not 0 < frame.sample_rate <= MAX_AUDIO_RATE:
                        raise AudioDecodeError(f"{subject} is at {frame.sample_rate} Hz; a rate is 1 to "
                                               f"{MAX_AUDIO_RATE} Hz", index=index)
                    src_rate = int(frame.sample_rate)
                    if source_rate is not None and src_rate != source_rate:
                        raise AudioDecodeError(f"{subject} is at {src_rate} Hz but was planned at {source_rate} Hz "
                                               "(the file changed after packing: pack the sample again)", index=index)
                    planned = resampled_length(frames, src_rate, rate)
                    want = planned if keep is None else min(keep, planned)
                    if want > MAX_AUDIO_SECONDS * rate:  # before the buffer is allocated
                        raise AudioDecodeError(f"{subject}'s plan names {want:,} samples at {rate} Hz, over "
                                               f"{MAX_AUDIO_SECONDS} s", index=index)
                    sink = _MonoSink(src_rate, rate, frames=frames, want=want, av=av)
                if sink.push(frame):
                    break
                if time.monotonic() - start > limit:
                    raise AudioDecodeError(f"{subject}: decoding stopped after {limit:g} s (max_seconds); raise "
                                           "max_seconds if such audio is expected", index=index)
            if sink is None:
                raise AudioDecodeError(f"{subject} decodes to no samples", index=index)
            out = sink.finish()
    except AudioDecodeError:
        raise
    except Exception as e:  # PyAV's errors for damaged or unknown data
        raise AudioDecodeError(f"{subject} does not decode ({_av_error(e)})", index=index) from None
    if sink.fed < frames and sink.filled < sink.want:
        raise AudioDecodeError(f"{subject} decodes to {sink.fed:,} samples at {sink.src_rate} Hz of the {frames:,} "
                               "planned (the file changed after packing, or was cut: pack the sample again)",
                               index=index)
    return out


#: A video's sound track decodes as any audio file does: its first audio stream.
decode_track = decode_audio


class _MonoSink:
    """Decoded frames in, float32 mono at the target rate out, into a buffer of the planned length. Frames are
    kept planar (``[C, n]``, as most codecs decode) and averaged and resampled a block at a time."""

    def __init__(self, src_rate: int, rate: int, *, frames: int, want: int, av: Any) -> None:
        self.src_rate, self.rate, self.frames, self.want, self.av = src_rate, rate, frames, want, av
        self.fed = self.filled = 0
        self.out = np.zeros(self.want, np.float32)
        self.block: list[np.ndarray] = []  # planar source samples not yet out, from source sample ``self.at``
        self.at = 0
        self.converter: Any = None  # to planar float32, same rate and layout (FFmpeg's sample conversion)
        self.resampler: Any = None if src_rate == rate else av.AudioResampler(format="flt", layout="mono", rate=rate)

    def push(self, frame: Any) -> bool:
        """Take one decoded frame; True once nothing more is needed (the planned source read, or ``keep`` out)."""
        if frame.format.name == "fltp":  # already planar float32: FFmpeg's conversion would only copy it
            self._take(frame.to_ndarray())
        else:
            if self.converter is None:
                self.converter = self.av.AudioResampler(format="fltp", layout=frame.layout, rate=self.src_rate)
            for converted in self.converter.resample(frame):
                self._take(converted.to_ndarray())
        return self.fed >= self.frames or self.filled >= self.want

    def finish(self) -> np.ndarray:
        """Flush what the converter and the resampler hold; the buffer, zero-padded where they end short."""
        if self.converter is not None and self.fed < self.frames and self.filled < self.want:
            for converted in self.converter.resample(None):
                self._take(converted.to_ndarray())
        self._flush()
        if self.resampler is not None and self.filled < self.want:
            for out in self.resampler.resample(None):
                self._put(out.to_ndarray().reshape(-1))
        return self.out

    def _take(self, planar: np.ndarray) -> None:
        x = planar[:, : max(0, self.frames - self.fed)]
        if not x.shape[1] or self.filled >= self.want:
            return
        self.fed += x.shape[1]
        self.block.append(x)
        if self.fed - self.at >= RESAMPLE_BLOCK:
            self._flush()

    def _flush(self) -> None:
        """The block so far averaged to mono (``load_audio``'s downmix, in float32) and through the resampler,
        which carries its filter's state to the next block."""
        if not self.block:
            return
        x = self.block[0] if len(self.block) == 1 else np.concatenate(self.block, axis=1)
        mono = np.ascontiguousarray(x[0]) if len(x) == 1 else x.mean(axis=0, dtype=np.float32)
        self.block, at, self.at = [], self.at, self.at + len(mono)
        if self.resampler is None:
            self._put(mono)
            return
        frame = self.av.AudioFrame.from_ndarray(mono[None, :], format="flt", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = self.src_rate, at, Fraction(1, self.src_rate)
        for out in self.resampler.resample(frame):
            self._put(out.to_ndarray().reshape(-1))

    def _put(self, y: np.ndarray) -> None:
        k = min(len(y), self.want - self.filled)
        self.out[self.filled:self.filled + k] = y[:k]
        self.filled += k
