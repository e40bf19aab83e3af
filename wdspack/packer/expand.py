"""Processor mode's text: each image and video placeholder expanded as the model's processor expands it,
and each video planned from its container's header (:mod:`wdspack.media.video.plan`); split out of
:class:`~.samples.SampleBuilder`, whose state these functions read (``b``).

    rendered   ...<|vision_start|><|image_pad|><|vision_end|>...<|vision_start|><|video_pad|><|vision_end|>...
    expanded   ...<|image_pad|> × 6 ...                         ...<|video_pad|> × 16 ...
               (placeholders replaced in the order they appear, each kind from its own list)
    tokenized  ids, loss mask (placeholders never targets), tokens per image and per video
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..errors import ConfigError, SampleError
from ..media import Media
from ..media.image.check import error_text as _error_text
from ..media.video.plan import VideoPlan, check_decode_size, read_header
from ..media.video.record import VideoPlanRecord
from .fastpath import span_mask
from .tokenized import Sample

__all__ = ["Prepared", "build_expanded", "image_part", "plan_record", "plan_videos", "video_part"]


class Prepared(NamedTuple):
    """One kind's items of a chat, probed from their headers, as the family's side for the kind expands them."""

    kind: str  #: the kind's name (``"video"``), for messages
    holder: str  #: the placeholder the chat template renders per item
    token_id: int | None  #: the feature token each item's replacement fills
    data: tuple[bytes, ...]  #: each item's bytes, as the pack stores them
    texts: Callable[[], list[str]]  #: each item's replacement text (the processor's own)
    planned: tuple[tuple[int, str], ...] = ()  #: per item, the tokens its plan gives and the plan shown; () unplanned
    plans: tuple[Any, ...] = ()  #: what the pack stores of each item's plan


def build_expanded(b: Any, sid: str, text: str, spans: list[tuple[int, int]], parts: Sequence[Prepared]) -> Sample:
    """Processor mode: expand each placeholder in the text as the processor does, then tokenize.
    The items of every kind are replaced in the order their placeholders appear, each kind from its own list."""
    assert b.family is not None  # processor mode
    slots: list[tuple[int, int, str]] = []  # (where, part, replacement), in the order they appear
    for n, part in enumerate(parts):
        found = [m.start() for m in re.finditer(re.escape(part.holder), text)]
        if len(found) != len(part.data):
            raise SampleError("placeholder_mismatch", f"{len(found)} {part.kind} placeholders {part.holder!r} in the "
                              f"rendered text for {len(part.data)} {part.kind}s", sid)
        slots += zip(found, [n] * len(found), part.texts() if part.data else [])
    slots.sort(key=lambda slot: slot[0])
    pieces, regions, last, shift = [], [], 0, 0
    for at, n, rep in slots:
        holder = parts[n].holder
        pieces += [text[last:at], rep]
        regions.append((n, at + shift, at + shift + len(rep)))
        shift += len(rep) - len(holder)
        last = at + len(holder)
    pieces.append(text[last:])
    expanded = "".join(pieces)

    def moved(p: int) -> int:  # where character p of the rendered text lands in the expanded one
        return p + sum(len(rep) - len(parts[n].holder) for at, n, rep in slots if at + len(parts[n].holder) <= p)

    bos = b.tokenizer.bos_token
    ids, offsets = b._encoder(expanded, add_special_tokens=not (bos and expanded.startswith(bos)))
    mask = span_mask(offsets, [(moved(start), moved(end)) for start, end in spans])
    real = offsets[:, 1] > offsets[:, 0]
    feature = [ids == part.token_id for part in parts]
    counts: list[list[int]] = [[] for _ in parts]
    for n, start, end in regions:
        inside = (offsets[:, 0] >= start) & (offsets[:, 1] <= end) & real
        mask[inside] = 0
        counts[n].append(int((inside & feature[n]).sum()))
    for part, each, own in zip(parts, counts, feature):
        if sum(each) != int(own.sum()):
            raise SampleError("placeholder_mismatch", f"the text holds {int(own.sum()) - sum(each)} {part.kind} tokens "
                              f"{part.holder!r} of its own besides the {len(each)} {part.kind}s'", sid)
        for k, ((tokens, shown), taken) in enumerate(zip(part.planned, each)):
            if taken != tokens:
                raise SampleError("placeholder_mismatch", f"{part.kind} {k} takes {taken} tokens in the text but its "
                                  f"plan {shown} gives {tokens}", sid)
    if not mask.any():
        raise SampleError("no_assistant_turn", "no token is a training target after templating", sid)
    media = {part.kind: Media(part.data, (), tuple(each), part.plans) for part, each in zip(parts, counts)}
    return Sample(sid, ids.astype(np.uint32), mask, media=media)


def image_part(b: Any, sid: str, images: Sequence[bytes], sizes: list) -> Prepared:
    """A chat's images as the family expands them: from their ``(height, width)`` (header sizes, no pixels)."""

    def texts() -> list[str]:
        try:
            return b.family.image.replacements(b.processor, sizes)
        except ConfigError:
            raise  # the processor's settings, not this sample: every sample would fail the same way
        except Exception as e:  # the processor's own code refusing a size
            raise SampleError("unreadable_image", f"the processor cannot lay out images of sizes {sizes}: "
                              f"{_error_text(e)}", sid) from None

    return Prepared("image", b.image_token, b.image_token_id, tuple(images), texts)


def video_part(b: Any, sid: str, videos: tuple[bytes, ...], plans: tuple[VideoPlan, ...]) -> Prepared:
    """A chat's videos as the family expands them: from each one's plan (made from its header)."""
    assert b.video_side is not None and b.video_token is not None  # plan_videos checked
    return Prepared("video", b.video_token, b.video_token_id, tuple(videos),
                    lambda: [b.video_side.replacement(b.processor, plan) for plan in plans],
                    tuple((plan.tokens, str(plan.grid)) for plan in plans), tuple(plan_record(plan) for plan in plans))


def plan_videos(b: Any, videos: tuple[bytes, ...], sid: str, names: tuple[str, ...] = ()) -> tuple[VideoPlan, ...]:
    """Each video's plan, from its container's header alone (:mod:`wdspack.media.video.plan`)."""
    if b.video_side is None or b.video_sampling is None:
        have = ", ".join(f.name for f in _video_families())
        why = (f"the {b.family.name} family has no video path" if b.family is not None
               else "videos need --processor (the model's own processor; with --tokenizer there is no video "
                    "layout)")
        raise SampleError("unsupported_media", f"the record has {len(videos)} video(s) but {why}; families with "
                          f"one: {have}", sid)
    if b.typed_images and not b.typed_videos:
        raise ConfigError(f"the chat template of {b.name!r} renders images but no video part "
                          "({'type': 'video'}); pass --chat-template with the model's own template, which renders "
                          f"{b.video_token!r} for each video")
    plans = []
    for k, data in enumerate(videos):
        which = f"video {k} ({names[k]!r})" if k < len(names) and names[k] else f"video {k}"
        try:
            header = read_header(data, sample_id=sid, max_pixels=b.config.max_image_pixels)
            plans.append(check_decode_size(header, b.video_side.plan(header, b.video_sampling)))
        except SampleError as e:
            raise SampleError(e.reason, f"{which}: {e.detail}", sid) from None
    return tuple(plans)


def plan_record(plan: VideoPlan) -> VideoPlanRecord:
    """What a pack stores of a video's plan (:class:`~wdspack.format.pack.VideoPlanRecord`)."""
    return VideoPlanRecord(frames=plan.indices, size=(plan.height, plan.width), grid=plan.grid,
                           second_per_grid_t=plan.second_per_grid_t)


def _video_families() -> tuple[Any, ...]:
    from ..models import known_families

    return tuple(f for f in known_families() if f.video is not None)
