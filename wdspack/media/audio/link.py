"""Which audio of a chat is a video's own sound track, decided once at pack time, and its tokens laid inside the
video's (the Qwen Omni processors' ``use_audio_in_video``)::

    record     "<video><audio>What is said?"   videos: [clip.mp4]   audios: [clip.mp4]
    linked     video 0 <- audio 0              the audio's part leaves the chat: the template renders the video
    expanded   <|vision_bos|><|audio_bos|> [V×a][A×b] [V×c][A×d] ... <|audio_eos|><|vision_eos|>   (family's text)
    stored     audio 0's plan names ``video: 0`` (its index among its sub-sample's videos)

An audio is a video's sound where the family interleaves the two (its video side's ``with_audio``) and either
the record says so itself (the audio part right after the video's, the same file: LLaMA-Factory's
``<video><audio>`` naming the video twice) or the processor's own setting asks for it (``use_audio_in_video``, as
LLaMA-Factory sets it on the processor, or transformers' ``load_audio_from_video``): then each video takes the next
audio of its turn, as LLaMA-Factory's Qwen2-Omni plugin does. A chat whose videos are some linked and some not is
dropped: the thinker computes its positions for one chat with or without the link, never both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ...errors import SampleError
from ..kind import Prepared

__all__ = ["link_parts", "sound_links", "uses_audio_in_video", "without_linked"]


def uses_audio_in_video(processor: Any) -> bool:
    """The processor's own setting that every video's next audio is its sound: LLaMA-Factory's
    ``use_audio_in_video`` attribute, or transformers' ``load_audio_from_video``.

    Example:
        >>> uses_audio_in_video(object())
        False
    """
    return bool(getattr(processor, "use_audio_in_video", False) or getattr(processor, "load_audio_from_video", False))


def _candidates(messages: Sequence[dict]) -> list[tuple[int, int | None, bool]]:
    """Per video, in order: ``(video, audio, adjacent)``, the next audio part of its turn before another video (None:
    none), and whether only blank text stands between them."""
    out: list[tuple[int, int | None, bool]] = []
    videos = audios = 0
    for message in messages:
        open_video: int | None = None  # the video of this turn still waiting for its audio
        blank = True
        content = message.get("content")
        for part in content if isinstance(content, (list, tuple)) else ():
            kind = part.get("type")
            if kind == "video":
                if open_video is not None:
                    out.append((open_video, None, False))
                open_video, blank = videos, True
                videos += 1
            elif kind == "audio":
                if open_video is not None:
                    out.append((open_video, audios, blank))
                    open_video = None
                audios += 1
            elif str(part.get("text", "")).strip():
                blank = False
        if open_video is not None:
            out.append((open_video, None, False))
    return out


def sound_links(builder: Any, record: Any) -> tuple[tuple[int, int], ...]:
    """``(video, audio)`` for each audio of ``record`` that is a video's own sound, under the builder's family and
    processor (empty where the family does not interleave, or the chat has no such pair).

    Raises:
        SampleError: ``placeholder_mismatch`` where the processor's setting links every video and one has no
            audio after it in its turn (LLaMA-Factory's rule); ``unsupported_media`` for a chat whose videos are
            some linked and some not.
    """
    family = builder.family
    if family is None or family.video is None or family.video.with_audio is None:
        return ()
    videos, audios = record.media.get("video", ()), record.media.get("audio", ())
    if not videos or not audios:
        return ()
    every = uses_audio_in_video(builder.processor)
    found = _candidates(record.messages)
    links = tuple((v, a) for v, a, adjacent in found if a is not None
                  and (every or (adjacent and audios[a] == videos[v])))
    if not links:
        return ()
    if every and len(links) < len(found):
        v = next(v for v, a, _ in found if a is None)
        raise SampleError("placeholder_mismatch", f"video {v} has no <audio> after it in its turn, but the processor's "
                          "use_audio_in_video reads each video's sound from the audio that follows it; write "
                          "<video><audio> for each video, or unset use_audio_in_video", record.sample_id)
    if len(links) < len(videos):
        raise SampleError("unsupported_media", f"{len(links)} of the chat's {len(videos)} videos come with their own "
                          f"sound and the rest do not; the {family.name} thinker lays out one chat's videos all with "
                          "their sound or all without (its use_audio_in_video): split the chat, or give every video "
                          "its sound", record.sample_id)
    return links


def without_linked(messages: Sequence[dict], links: Sequence[tuple[int, int]]) -> list[dict]:
    """The messages without the parts of the linked audio (their tokens go inside their videos' text)."""
    if not links:
        return list(messages)
    gone = {a for _, a in links}
    out, k = [], 0
    for message in messages:
        content = message.get("content")
        if not isinstance(content, (list, tuple)):
            out.append(message)
            continue
        kept = []
        for part in content:
            if part.get("type") == "audio":
                k += 1
                if k - 1 in gone:
                    continue
            kept.append(part)
        out.append({**message, "content": kept or [{"type": "text", "text": ""}]})
    return out


def link_parts(builder: Any, parts: Sequence[Prepared], links: Sequence[tuple[int, int]]) -> list[Prepared]:
    """The chat's prepared kinds with each linked video's text the family's interleaved one (from its plan and its
    audio's tokens) and each linked audio inside its video's text, its plan naming the video."""
    if not links:
        return list(parts)
    by_kind = {part.kind: n for n, part in enumerate(parts)}
    video, audio = parts[by_kind["video"]], parts[by_kind["audio"]]
    sound = dict(links)  # video -> audio
    tokens = [t for t, _ in audio.planned]
    plans = video.plans  # each video's stored plan: its grid and seconds per temporal patch
    side = builder.family.video
    texts = video.texts

    def linked_texts() -> list[str]:
        own = texts()
        return [side.with_audio(builder.processor, plans[v], tokens[sound[v]]) if v in sound else own[v]
                for v in range(len(own))]

    of = {a: v for v, a in links}
    out = list(parts)
    out[by_kind["video"]] = video._replace(texts=linked_texts)
    out[by_kind["audio"]] = audio._replace(
        inside=tuple(("video", of[a]) if a in of else None for a in range(len(audio.data))),
        plans=tuple(replace(p, video=of[a]) if a in of else p for a, p in enumerate(audio.plans)))
    return out
