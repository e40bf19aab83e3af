"""Where a record's media go: each placeholder (``<image>``, ``<video>``, MiniCPM-V's ``<image_NN>``) or
bare typed part takes the next entry of the record's own list of that kind; without any, the kind's items
go first in the first user turn (the LLaVA convention). Split out of :mod:`.records`, which reads the
turns; the rules are in its module docstring.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ...errors import SampleError
from ...media import IMAGE, MediaKind
from .toolcalls import Turn

__all__ = ["BARE", "NAMED_RE", "PLACEHOLDER", "bare_slots", "media_list", "named_images", "place", "place_named",
           "split_prompt_placeholders"]

PLACEHOLDER = IMAGE.placeholder  # "<image>": split wherever it is written (the other kinds': in prompts)
NAMED_RE = re.compile(r"<image_(\d+)>")  # MiniCPM-V: "<image_00>", keys of the record's image dict
#: A slot of a kind that takes the next entry of the record's list of that kind.
BARE = object()


# ---- MiniCPM-V's named images ------------------------------------------------------------------


# MiniCPM-V's named placeholders are the image kind's alone: its ``image`` field may be such a dict.


def named_images(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """MiniCPM-V's ``image`` dict ``{"<image_00>": path, ...}``, or None for any other ``image``."""
    value = row.get("image")
    if not isinstance(value, Mapping) or not value or not all(isinstance(k, str) for k in value):
        return None
    if not all(NAMED_RE.fullmatch(k) for k in value):
        return None  # e.g. a {"bytes", "path"} struct
    for key, ref in value.items():
        if ref is None:
            raise SampleError("malformed_record", f"image[{key!r}] is null; give the image's path or remove the "
                              "key (and its placeholder)")
    return dict(value)


def place_named(turns: list[Turn], named: dict[str, Any]) -> list[Turn]:
    """Each ``<image_NN>`` in the text becomes that image; with none named anywhere, all of them
    (in key order) go at the start of the first user turn, as MiniCPM-V's fine-tuning code does."""
    used: set[str] = set()
    out: list[Turn] = []
    for i, (role, parts, extra) in enumerate(turns):
        new: list[tuple[str, Any]] = []
        for kind, value in parts:
            if kind != "text":
                new.append((kind, value))
                continue
            pieces = NAMED_RE.split(value)  # text, digits, text, digits, ..., text
            for k, piece in enumerate(pieces):
                if k % 2 == 0:
                    if piece:
                        new.append(("text", piece))
                    continue
                key = f"<image_{piece}>"
                if key not in named:
                    raise SampleError("placeholder_mismatch", f"turn {i} names the image {key!r}, which the "
                                      f"'image' dict does not have (keys: {sorted(named)[:8]}); add it or "
                                      "remove the placeholder")
                used.add(key)
                new.append(("image", named[key]))
        out.append((role, new, extra))
    if not used:
        order = sorted(named, key=lambda k: int(k[len("<image_"):-1]))  # keys matched NAMED_RE
        return place(out, [named[k] for k in order], IMAGE)
    unused = sorted(set(named) - used)
    if unused:
        raise SampleError("placeholder_mismatch", f"the 'image' dict has {unused[:8]} that no turn names; "
                          "put each key where its image belongs in the text, or name none of them to put all "
                          "the images first")
    return out


def split_prompt_placeholders(turns: list[Turn], kind: MediaKind) -> list[Turn]:
    """Each of ``kind``'s placeholders in a prompt (user or system turn) becomes a bare slot; in answers and
    tool results it is text (an HTML ``<video>`` tag in a coding answer)."""
    out: list[Turn] = []
    for role, parts, extra in turns:
        if role in ("user", "system"):
            new: list[tuple[str, Any]] = []
            for what, value in parts:
                if what != "text" or not kind.placeholder or kind.placeholder not in value:
                    new.append((what, value))
                    continue
                for k, piece in enumerate(value.split(kind.placeholder)):
                    new += [(kind.name, BARE)] if k else []
                    new += [("text", piece)] if piece else []
            parts = new
        out.append((role, parts, extra))
    return out


def media_list(row: Mapping[str, Any], kind: MediaKind) -> list:
    """The record's list of ``kind`` (the first of its fields that is set: ``images``, then ``image``)."""
    for key in kind.record_fields:
        value = row.get(key)
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            for k, v in enumerate(value):
                if v is None:
                    raise SampleError("malformed_record", f"{key}[{k}] is null; remove it from the list "
                                      f"(and its placeholder) or give the {kind.name}")
            return list(value)
        if isinstance(value, (str, bytes, bytearray, Mapping)):
            return [value]
        raise SampleError("malformed_record", f"field {key!r} is {type(value).__name__} {_short(value)}; "
                          f"give a path, a list of paths, or {kind.name} bytes")
    return []


def bare_slots(turns: list[Turn], kind: MediaKind) -> int:
    """How many slots of ``kind`` wait for the next entry of the record's list."""
    return sum(1 for _, parts, _ in turns for what, value in parts if what == kind.name and value is BARE)


def place(turns: list[Turn], pool: list, kind: MediaKind, *, as_image: bool = False) -> list[Turn]:
    """Fill the bare ``kind`` slots from ``pool`` in order; with no slot, put the pool at the start
    of the first user turn (before what is already there). ``as_image``: the slots are ``<image>``
    placeholders that stand for the kind's items (``kind.written_as_image``'s convention; named in the error)."""
    slots = bare_slots(turns, kind)
    if slots == 0 and pool:
        at = next((k for k, (role, _, _) in enumerate(turns) if role == "user"),
                  next((k for k, (role, _, _) in enumerate(turns) if role != "system"), 0))
        role, parts, extra = turns[at]
        turns = list(turns)
        turns[at] = (role, [(kind.name, ref) for ref in pool] + parts, extra)
        return turns
    if slots != len(pool):
        name = kind.name
        written = (f"{PLACEHOLDER!r} standing for a {name}: the record has {kind.plural} and no images, "
                   f"{kind.written_as_image}'s convention" if as_image
                   else f"{kind.placeholder!r} or bare {name} parts")
        raise SampleError("placeholder_mismatch", f"the record has {slots} {name} placeholder(s) ({written}) but "
                          f"{len(pool)} {name}(s); make the counts match, or remove every placeholder to put the "
                          f"{name}s before the first user turn")
    refs = iter(pool)
    return [(role, [(k, next(refs) if k == kind.name and value is BARE else value) for k, value in parts], extra)
            for role, parts, extra in turns]


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
