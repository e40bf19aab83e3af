"""The audio kind: found in a record's ``audios`` list and audio parts, read as bytes (:mod:`.source`), probed
at pack time for its exact sample count (:mod:`.header`), counted in each family's tokens (:mod:`.tokens`),
stored with its plan (:mod:`.record`) and decoded to 16 kHz mono in the loader (:mod:`.decode`)."""

from __future__ import annotations

from ..kind import MediaKind, calling, imported
from .header import MAX_AUDIO_BYTES, MAX_AUDIO_CHANNELS, MAX_PROBE_SECONDS
from .record import MAX_AUDIO_RATE, MAX_AUDIO_SECONDS, AudioPlanRecord, check_audios

__all__ = ["AUDIO", "AUDIO_DROP_REASONS"]

#: The audio kind's drop reasons, each with what it means (registered by :data:`AUDIO`'s declaration).
AUDIO_DROP_REASONS: dict[str, str] = {
    "missing_audio": "an audio file named by the record does not exist",
    "audio_path_escape": "an audio path points outside the image root (which serves audio too)",
    "unreadable_audio": "the audio file is empty, not audio PyAV can open (an image, a file with no audio or video "
                        "stream), does not decode, or holds fewer samples than its header gives (cut short, as by an "
                        "interrupted download)",
    "audio_too_large": f"the audio file is over {MAX_AUDIO_BYTES >> 30} GiB, over {MAX_AUDIO_SECONDS:,} s long, over "
                       f"{MAX_AUDIO_RATE:,} Hz or {MAX_AUDIO_CHANNELS} channels, or reading it went past "
                       f"{MAX_PROBE_SECONDS:g} s",
    "no_audio_track": "a video given for its sound has no audio stream",
    "audio_too_short": "the audio is too short for the model's processor to give it a token (or to take it)",
}


def _check_item(data: bytes, plan: AudioPlanRecord, *, sample_id: str) -> None:
    from ...errors import SampleError
    from .header import probe_audio

    probe = probe_audio(data, sample_id=sample_id)
    if (probe.rate, probe.frames) != (plan.rate, plan.frames):
        raise SampleError("unreadable_audio", f"the plan names {plan.frames:,} samples at {plan.rate} Hz but the file "
                          f"holds {probe.frames:,} at {probe.rate} Hz (the audio is not the one planned: pack the "
                          "sample again from a whole copy)", sample_id)


#: Audio: its keys are in a pack only when it holds one; ``max_audio_tokens_per_pack`` bounds them.
AUDIO = MediaKind(
    name="audio", plural="audios", record_fields=("audios", "audio"),
    part_types=("audio", "audio_url", "input_audio"), ref_keys=("audio", "audio_url", "input_audio", "path", "url",
                                                                "value"),
    extensions=("wav", "flac", "mp3", "opus", "ogg", "m4a", "aac"), settings_part="feature_extractor",
    load=calling(f"{__name__}.source", "load_audio"), describe=calling(f"{__name__}.source", "audio_name"),
    max_bytes=imported(f"{__name__}.header", "MAX_AUDIO_BYTES"), plan_record=AudioPlanRecord, check=check_audios,
    budget="max_audio_tokens_per_pack",
    drop_reasons=AUDIO_DROP_REASONS, load_drop_reasons=("unreadable_audio",),
    decode_errors=lambda: (imported(f"{__name__}.decode", "AudioDecodeError")(),), placeholder="<audio>",
    check_item=_check_item, prepare=imported(f"{__name__}.prepare"), batch=imported(f"{__name__}.batch"))
