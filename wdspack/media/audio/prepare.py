"""The audio kind at pack time: the processor's feature-extractor settings read once, each audio's exact sample
count found from its file (:func:`~.header.probe_audio`: the header where it is exact, a decode where it is not),
and the family's arithmetic turning it into tokens (:mod:`.tokens`); the family's audio side writes the text.

``builder`` is the pack job's sample builder (``wdspack.packer.samples.SampleBuilder``): these functions read its
processor, family and config, and keep the kind's state on it (``audio_side``, ``audio_token``,
``audio_token_id``, ``audio_rule``).
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from ...errors import ConfigError, SampleError
from ..kind import Prepared
from ..settings import read_settings
from . import AUDIO
from .header import AudioProbe, probe_audio
from .record import AudioPlanRecord, resampled_length

__all__ = ["AudioPlan", "over_budget", "part", "plan", "policy", "probe", "settings_text", "setup"]


class AudioPlan(NamedTuple):
    """One audio planned for a family: what the pack stores (``record``) and the tokens it fills."""

    record: AudioPlanRecord
    tokens: int

    @property
    def shown(self) -> str:
        """How ``wdspack show`` and the drop messages name it: ``3.00 s``, ``cut at 30.00 s of 42.10 s``."""
        r = self.record
        if r.kept < r.samples:
            return f"cut at {r.kept / r.target_rate:.2f} s of {r.samples / r.target_rate:.2f} s"
        return f"{r.samples / r.target_rate:.2f} s"


def setup(builder: Any) -> None:
    """The family's audio side, with its arithmetic under the processor's feature-extractor settings (read where
    transformers reads them: a file that does not parse stops the job here, before anything packs); what the
    manifest records of them and where they were read."""
    side = builder.family.audio if builder.family is not None else None
    builder.audio_side, builder.audio_token, builder.audio_rule, builder.audio_token_id = side, None, None, None
    if side is None:
        return
    spec = builder.config.processor
    builder.audio_token = builder.holders[AUDIO.name] = side.placeholder(builder.processor)
    found = read_settings(spec, AUDIO.settings_part, builder.processor)
    try:
        builder.audio_rule = side.rule(builder.processor, found.values)
    except ConfigError as e:
        raise (ConfigError(f"{found.where}: {e}") if found.values is not None else e) from None
    source = found.source
    if found.values is None and isinstance(spec, (str, os.PathLike)):  # said in the summary, never silently
        source += (f" ({os.fspath(spec)} has no feature_extractor in processor_config.json and no "
                   "preprocessor_config.json)")
    builder.settings_used[AUDIO.name] = {"settings_from": source}
    builder.audio_token_id = builder._token_id(side.feature_token(builder.processor))


def policy(builder: Any) -> dict[str, Any] | None:
    """What the manifest's ``image_policy`` keeps of the audio settings (where the family has an audio side)."""
    rule = builder.audio_rule
    if rule is None:
        return None
    return {"token": builder.audio_token, "token_id": builder.audio_token_id, "rate": rule.rate,
            "max_samples": rule.max_samples, "min_samples": rule.min_samples, **builder.settings_used[AUDIO.name]}


def plan(rule: Any, found: AudioProbe) -> AudioPlan:
    """An audio's plan under a family's ``rule``: its samples at the rule's rate (:func:`~.record.resampled_length`,
    the length transformers' ``load_audio`` forces), the samples the processor keeps (its cut) and the tokens.

    Example:
        >>> from wdspack.media.audio.tokens import AUDIO_RULES
        >>> p = plan(AUDIO_RULES["qwen2_audio"], AudioProbe(44100, 2, 44100 * 3, "pcm_s16le", "wav", "header"))
        >>> p.tokens, p.record.samples, p.shown
        (75, 48000, '3.00 s')
    """
    samples = resampled_length(found.frames, found.rate, rule.rate)
    record = AudioPlanRecord(found.rate, found.frames, rule.rate, samples, rule.kept(samples))
    return AudioPlan(record, int(rule.tokens(samples)))


def probe(builder: Any, audios: tuple[bytes, ...], sid: str,
          names: tuple[str, ...] = ()) -> tuple[tuple[bytes, ...], tuple[AudioPlan, ...]]:
    """The audio, and each one's plan from its exact sample count (:func:`~.header.probe_audio`)."""
    rule = builder.audio_rule
    if builder.audio_side is None or rule is None:
        have = ", ".join(builder.families_taking(AUDIO.name)) or "none"
        why = (f"the {builder.family.name} family has no audio path" if builder.family is not None
               else "audio needs --processor (the model's own processor; with --tokenizer there is no audio layout)")
        raise SampleError("unsupported_media", f"the record has {len(audios)} audio(s) but {why}; families with "
                          f"one: {have}", sid)
    if builder.typed_parts and not builder.typed[AUDIO.name]:
        raise ConfigError(f"the chat template of {builder.name!r} renders media parts but no audio part "
                          "({'type': 'audio'}); pass --chat-template with the model's own template, which renders "
                          f"{builder.audio_token!r} for each audio")
    plans = []
    for k, data in enumerate(audios):
        name = names[k] if k < len(names) else ""
        which = f"audio {k} ({name!r})" if name else f"audio {k}"
        found = probe_audio(data, sample_id=sid, name=name)
        planned = plan(rule, found)
        if found.frames == 0 or resampled_length(found.frames, found.rate, rule.rate) < rule.min_samples \
                or planned.tokens < 1:
            raise SampleError("audio_too_short", f"{which} has {found.frames:,} samples at {found.rate:,} Hz "
                              f"({found.seconds:.4f} s), too short for the {builder.family.name} processor to give it "
                              f"a token (it takes at least {rule.min_samples} samples at {rule.rate:,} Hz); drop the "
                              "sample or lengthen the clip", sid)
        plans.append(planned)
    together = builder.audio_side.sample_tokens
    if together is not None and len(plans) > 1:  # the processor counts a chat's audios together
        counted = together(rule, [p.record.kept for p in plans])
        plans = [p._replace(tokens=int(t)) for p, t in zip(plans, counted)]
    return audios, tuple(plans)


def part(builder: Any, sid: str, audios: tuple[bytes, ...], plans: tuple[AudioPlan, ...]) -> Prepared:
    """A chat's audio as the family expands it: from each one's token count."""
    assert builder.audio_side is not None and builder.audio_token is not None  # probe checked
    return Prepared(AUDIO.name, builder.audio_token, builder.audio_token_id, tuple(audios),
                    lambda: [builder.audio_side.replacement(builder.processor, p.tokens) for p in plans],
                    tuple((p.tokens, p.shown) for p in plans), tuple(p.record for p in plans))


def over_budget(builder: Any, sample: Any, *, seq_len: int) -> str | None:
    """Why a sample whose audio takes it over ``seq_len`` is dropped (None: it is not): the audio's share, and
    that the family's processor, not wdspack, decides its tokens (a shorter clip is the lever)."""
    audios = sample.media[AUDIO.name]
    if not audios or sample.token_count <= seq_len:
        return None
    count = len(audios)
    rule = builder.audio_rule
    rate = f"{rule.tokens(rule.rate):g} tokens a second" if rule is not None else "its tokens"
    return (f"{sample.token_count} tokens > seq_len {seq_len}, {sum(audios.tokens)} of them for its {count} "
            f"audio{'s' if count > 1 else ''} (the {builder.family.name} processor gives {rate}); raise --seq-len, "
            "or cut the clips shorter")


def settings_text(policy: dict[str, Any]) -> str:
    """``16000 Hz mono, cut at 30 s, tokens from each file's sample count; settings from processor_config.json``."""
    a = policy.get(AUDIO.name) or {}
    most = a.get("max_samples")
    rate = int(a.get("rate") or 16000)
    cut = f"cut at {most / rate:g} s" if most else "never cut"
    text = f"{rate} Hz mono, {cut}, tokens from each file's sample count"
    if a.get("settings_from"):
        text += f"; settings from {a['settings_from']}"
    return text
