"""What a pack stores of one audio beyond its bytes: the plan (source rate and samples, target rate, the
resampled length and the samples kept after a family's cut), and its bounds.

The plan is made at pack time from the probe (:mod:`.header`) and checked on every untrusted pack
(:func:`check_audios`) before the loader decodes a sample, so a pack cannot make it allocate without bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import FormatError
from ..kind import Media

__all__ = ["MAX_AUDIO_RATE", "MAX_AUDIO_SECONDS", "AudioPlanRecord", "check_audios", "resampled_length"]

#: The longest audio taken, in seconds of its source (two hours): a longer one is ``audio_too_large``, and no
#: plan may name more (what the loader decodes and allocates per audio).
MAX_AUDIO_SECONDS = 7200
#: The highest sample rate taken, source or target (Hz); a file at a higher rate is ``audio_too_large``.
MAX_AUDIO_RATE = 384_000
_PLAN_KEYS = ("rate", "frames", "target_rate", "samples", "kept")


def resampled_length(frames: int, src_rate: int, rate: int) -> int:
    """The samples ``frames`` source samples at ``src_rate`` give at ``rate``: ``ceil(frames * rate / src_rate)``,
    the length transformers' ``load_audio`` (and ``librosa.load``) pad or trim the resampler's output to.

    Example:
        >>> resampled_length(323940, 44100, 16000)
        117530
    """
    if frames < 0 or src_rate <= 0 or rate <= 0:
        raise ValueError(f"resampled_length needs frames >= 0 and positive rates, got {frames}, {src_rate}, {rate}")
    return -(-frames * rate // src_rate)


@dataclass(frozen=True, slots=True)
class AudioPlanRecord:
    """What a pack stores of one audio's plan: the source's sample ``rate`` and its ``frames`` (samples per
    channel a full decode gives), the ``target_rate`` the family takes, the ``samples`` a resampling to it gives
    (:func:`resampled_length`), and the samples ``kept`` after the family's cut (``samples`` where it cuts none).
    An audio that is a video's own sound track, interleaved with it (:mod:`.link`), names that ``video``: its
    index among its sub-sample's videos (stored as ``"video"`` only then, so other plans keep their bytes).

    Example:
        >>> AudioPlanRecord(44100, 323940, 16000, 117530, 117530).kept
        117530
    """

    rate: int
    frames: int
    target_rate: int
    samples: int
    kept: int
    video: int | None = None

    @staticmethod
    def pack_totals(plans: tuple[AudioPlanRecord, ...]) -> dict[str, float]:
        """What ``wdspack inspect --deep`` counts of a pack's audio beyond its tokens: the seconds the family reads
        (after its cut).

        Example:
            >>> AudioPlanRecord.pack_totals((AudioPlanRecord(44100, 44100, 16000, 16000, 16000),))
            {'audio_seconds': 1.0}
        """
        return {"audio_seconds": round(sum(plan.kept / plan.target_rate for plan in plans), 3)}

    def to_msgpack(self) -> dict:
        out = {key: int(getattr(self, key)) for key in _PLAN_KEYS}
        if self.video is not None:
            out["video"] = int(self.video)
        return out

    @classmethod
    def from_msgpack(cls, d: object) -> AudioPlanRecord:
        if not isinstance(d, dict) or set(d) - {"video"} != set(_PLAN_KEYS):
            raise TypeError(f"an audio plan must be a map of {', '.join(_PLAN_KEYS)} (and video), got {d!r:.80}")
        rate, frames, target_rate, samples, kept = (_as_int(d[key]) for key in _PLAN_KEYS)
        return cls(rate, frames, target_rate, samples, kept, _as_int(d["video"]) if "video" in d else None)


def check_audios(media: Media, num_tokens: int) -> None:
    """The bounds on a pack's audio plans (:class:`~wdspack.errors.FormatError` if one is out of them): rates
    up to :data:`MAX_AUDIO_RATE`, at most :data:`MAX_AUDIO_SECONDS` of source, a resampled length that is the
    source's, at least one sample kept and none past it, and tokens within the pack.

    Example:
        >>> check_audios(Media((b"RIFF",), (0,), (25,), (AudioPlanRecord(16000, 16000, 16000, 16000, 16000),)), 64)
    """
    for k, (plan, tokens) in enumerate(zip(media.plans, media.tokens)):
        if not (0 < plan.rate <= MAX_AUDIO_RATE and 0 < plan.target_rate <= MAX_AUDIO_RATE):
            raise FormatError(f"audio {k}'s plan has rates {plan.rate} -> {plan.target_rate} Hz; a plan's rates are 1 "
                              f"to {MAX_AUDIO_RATE} Hz")
        if not 0 < plan.frames <= MAX_AUDIO_SECONDS * plan.rate:
            raise FormatError(f"audio {k}'s plan names {plan.frames} samples at {plan.rate} Hz; a plan names 1 to "
                              f"{MAX_AUDIO_SECONDS} s of audio")
        if plan.samples != resampled_length(plan.frames, plan.rate, plan.target_rate):
            raise FormatError(f"audio {k}'s plan gives {plan.samples} samples at {plan.target_rate} Hz for "
                              f"{plan.frames} at {plan.rate} Hz; resampling gives "
                              f"{resampled_length(plan.frames, plan.rate, plan.target_rate)}")
        if not 0 < plan.kept <= plan.samples:
            raise FormatError(f"audio {k}'s plan keeps {plan.kept} of its {plan.samples} samples; a plan keeps 1 to "
                              "all of them")
        if tokens < 0:
            raise FormatError(f"audio {k} has {tokens} tokens")
        if plan.video is not None and plan.video < 0:
            raise FormatError(f"audio {k}'s plan names video {plan.video} of its sub-sample as its own")
    if sum(media.tokens) > num_tokens:
        raise FormatError(f"the audios take {sum(media.tokens)} tokens of a pack of {num_tokens}")


def _as_int(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected int, got {type(v).__name__}")
    return v
