"""Processor mode's text: every kind's placeholders expanded as the model's processor expands them, each
kind's items prepared by its room (``wdspack.media.<kind>.prepare``: probed or planned from their headers).

    rendered   ...<|vision_start|><|image_pad|><|vision_end|>...<|vision_start|><|video_pad|><|vision_end|>...
    expanded   ...<|image_pad|> × 6 ...                         ...<|video_pad|> × 16 ...
               (placeholders replaced in the order they appear, each kind from its own list)
    tokenized  ids, loss mask (placeholders never targets), the tokens each item fills, kind by kind
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import SampleError
from ..media import Media, Prepared
from .fastpath import span_mask
from .tokenized import Sample

__all__ = ["build_expanded"]


def build_expanded(b: Any, sid: str, text: str, spans: list[tuple[int, int]], parts: Sequence[Prepared]) -> Sample:
    """Processor mode: expand each placeholder in the text as the processor does, then tokenize.
    The items of every kind are replaced in the order their placeholders appear, each kind from its own list."""
    assert b.family is not None  # processor mode
    slots: list[tuple[int, int, str]] = []  # (where, part, replacement), in the order they appear
    for n, part in enumerate(parts):
        found = [m.start() for m in re.finditer(re.escape(part.holder), text)] if part.holder else []  # none: no path
        own = [k for k in range(len(part.data)) if not part.inside or part.inside[k] is None]
        if len(found) != len(own):
            raise SampleError("placeholder_mismatch", f"{len(found)} {part.kind} placeholders {part.holder!r} in the "
                              f"rendered text for {len(own)} {part.kind}s", sid)
        texts = part.texts() if own else []
        slots += zip(found, [n] * len(found), [texts[k] for k in own])
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
    spans_of: dict[str, list[tuple[int, int]]] = {}  # each kind's items' regions, in item order
    claimed = np.zeros(len(ids), dtype=bool)  # tokens inside some item's replacement
    for n, start, end in regions:
        inside = (offsets[:, 0] >= start) & (offsets[:, 1] <= end) & real
        mask[inside] = 0
        claimed |= inside
        counts[n].append(int((inside & feature[n]).sum()))
        spans_of.setdefault(parts[n].kind, []).append((start, end))
    for n, part in enumerate(parts):  # an item inside another's text: its tokens counted in that item's region
        for k, host in enumerate(part.inside):
            if host is not None:
                start, end = spans_of[host[0]][host[1]]
                inside = (offsets[:, 0] >= start) & (offsets[:, 1] <= end) & real
                counts[n].insert(k, int((inside & feature[n]).sum()))
    for part, each, own in zip(parts, counts, feature):
        # a kind's tokens in another kind's replacement are that item's (GLM's video frames fill <|image|>,
        # InternVL's <IMG_CONTEXT>)
        stray = int((own & ~claimed).sum())
        if stray:
            raise SampleError("placeholder_mismatch", f"the text holds {stray} {part.kind} tokens "
                              f"{part.holder!r} of its own besides the {len(each)} {part.kind}s'", sid)
        for k, ((tokens, shown), taken) in enumerate(zip(part.planned, each)):
            if taken != tokens:
                raise SampleError("placeholder_mismatch", f"{part.kind} {k} takes {taken} tokens in the text but its "
                                  f"plan {shown} gives {tokens}", sid)
    if not mask.any():
        raise SampleError("no_assistant_turn", "no token is a training target after templating", sid)
    media = {part.kind: Media(part.data, (), tuple(each), part.plans) for part, each in zip(parts, counts)}
    return Sample(sid, ids.astype(np.uint32), mask, media=media)
