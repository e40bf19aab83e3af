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
from typing import Any

import numpy as np

from ..errors import ConfigError, SampleError
from ..media.image.check import error_text as _error_text
from ..media.video.plan import VideoPlan, check_decode_size, read_header
from ..media.video.record import VideoPlanRecord
from .fastpath import span_mask
from .tokenized import Sample

__all__ = ["build_expanded", "plan_record", "plan_videos"]


def build_expanded(b: Any, sid: str, text: str, spans: list[tuple[int, int]], images: list[bytes],
                    sizes: list, videos: tuple[bytes, ...] = (), plans: tuple[VideoPlan, ...] = ()) -> Sample:
    """Processor mode: expand each placeholder in the text as the processor does, then tokenize.
    Images and videos are replaced in the order their placeholders appear, each from its own list."""
    ph = b.image_token
    assert ph is not None and b.family is not None  # processor mode: the family's placeholder
    found = [(m.start(), ph) for m in re.finditer(re.escape(ph), text)]
    if len(found) != len(images):
        raise SampleError("placeholder_mismatch", f"{len(found)} image placeholders {ph!r} in the rendered text "
                          f"for {len(images)} images", sid)
    try:
        reps = b.family.replacements(b.processor, sizes) if images else []
    except ConfigError:
        raise  # the processor's settings, not this sample: every sample would fail the same way
    except Exception as e:  # the processor's own code refusing a size
        raise SampleError("unreadable_image", f"the processor cannot lay out images of sizes {sizes}: "
                          f"{_error_text(e)}", sid) from None
    slots = list(zip(found, reps))
    if videos:
        assert b.video_side is not None and b.video_token is not None  # _plan_videos checked
        vph = b.video_token
        seen = [(m.start(), vph) for m in re.finditer(re.escape(vph), text)]
        if len(seen) != len(videos):
            raise SampleError("placeholder_mismatch", f"{len(seen)} video placeholders {vph!r} in the rendered "
                              f"text for {len(videos)} videos", sid)
        slots += zip(seen, (b.video_side.replacement(b.processor, plan) for plan in plans))
        slots.sort(key=lambda slot: slot[0][0])
    pieces, regions, last, shift = [], [], 0, 0
    for (at, holder), rep in slots:
        pieces += [text[last:at], rep]
        regions.append((holder, at + shift, at + shift + len(rep)))
        shift += len(rep) - len(holder)
        last = at + len(holder)
    pieces.append(text[last:])
    expanded = "".join(pieces)

    def moved(p: int) -> int:  # where character p of the rendered text lands in the expanded one
        return p + sum(len(r) - len(h) for (at, h), r in slots if at + len(h) <= p)

    bos = b.tokenizer.bos_token
    ids, offsets = b._encoder(expanded, add_special_tokens=not (bos and expanded.startswith(bos)))
    mask = span_mask(offsets, [(moved(start), moved(end)) for start, end in spans])
    real = offsets[:, 1] > offsets[:, 0]
    feature = {ph: ids == b.image_token_id}
    if videos:
        feature[b.video_token] = ids == b.video_token_id
    counts: list[int] = []
    video_counts: list[int] = []
    for holder, start, end in regions:
        inside = (offsets[:, 0] >= start) & (offsets[:, 1] <= end) & real
        mask[inside] = 0
        (counts if holder == ph else video_counts).append(int((inside & feature[holder]).sum()))
    for token, each, what in ((ph, counts, "image"), (b.video_token or "", video_counts, "video")):
        if token in feature and sum(each) != int(feature[token].sum()):
            raise SampleError("placeholder_mismatch", f"the text holds {int(feature[token].sum()) - sum(each)} "
                              f"{what} tokens {token!r} of its own besides the {len(each)} {what}s'", sid)
    for k, (plan, taken) in enumerate(zip(plans, video_counts)):
        if taken != plan.tokens:
            raise SampleError("placeholder_mismatch", f"video {k} takes {taken} tokens in the text but its plan "
                              f"{plan.grid} gives {plan.tokens}", sid)
    if not mask.any():
        raise SampleError("no_assistant_turn", "no token is a training target after templating", sid)
    return Sample(sid, ids.astype(np.uint32), mask, tuple(images), tuple(counts), tuple(videos),
                  tuple(video_counts), tuple(plan_record(plan) for plan in plans))


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
