"""Normalize one raw record (a dict from JSON, JSONL, Parquet or Arrow) into a :class:`Record`.

Three record layouts are understood, whatever file they come from:

=================  ===========================================================================
``conversations``  LLaVA / ShareGPT: ``[{"from": "human", "value": "<image>\\nWhat is it?"}, ...]``
                   with ``image`` (a path or a list of paths)
``messages``       OpenAI / Hugging Face: ``[{"role": "user", "content": ...}]``, content a string
                   with ``<image>`` placeholders or typed parts, with an ``images`` list
``texts``          the_cauldron / FineVision: ``[{"user": ..., "assistant": ...}, ...]`` with an
                   ``images`` list; the images go at the start of the first user turn
=================  ===========================================================================

Every layout becomes the Hugging Face typed chat format, roles ``system | user | assistant``::

    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}

Images: each ``<image>`` placeholder (with the newline right after it) and each bare
``{"type": "image"}`` part takes the next entry of the record's image list; their counts must
match. With images but no placeholder at all, the images go at the start of the first user
turn (the LLaVA convention). A part may also carry its own image (``{"type": "image",
"image": "a.png"}``, ``image_url`` parts); such parts take nothing from the list.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SampleError
from .images import load_image

__all__ = ["COLUMNS", "ROLE_ALIASES", "Record", "TEXT_COLUMNS", "build_record", "sample_id_of"]

#: The fields a record may hold a conversation in (one of them is required).
TEXT_COLUMNS = ("messages", "conversations", "texts")
#: Every field that is read; other fields (and Parquet/Arrow columns) are ignored.
COLUMNS = ("id", *TEXT_COLUMNS, "images", "image")

#: Accepted spellings of each role (compared case-insensitively).
ROLE_ALIASES: dict[str, str] = {
    "system": "system",
    "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant", "bot": "assistant", "chatgpt": "assistant",
    "model": "assistant", "ai": "assistant",
}
PLACEHOLDER = "<image>"
_PLACEHOLDER_RE = re.compile(re.escape(PLACEHOLDER) + "\n?")
_IMAGE_PART_TYPES = ("image", "image_url", "input_image")
_TEXT_PART_TYPES = ("text", "input_text")
_BARE = object()  # an image slot that takes the next entry of the record's image list


@dataclass(frozen=True, slots=True)
class Record:
    """One conversation read from a source, before tokenization.

    ``images[k]`` belongs to the ``k``-th ``{"type": "image"}`` part, counting through the
    messages in order.

    Example:
        >>> r = Record("chat.jsonl:0", ({"role": "user", "content": [{"type": "text", "text": "Hi"}]},), ())
        >>> r.messages[0]["content"][0]["text"], r.images
        ('Hi', ())
    """

    sample_id: str
    messages: tuple[dict, ...]
    images: tuple[bytes, ...]


def sample_id_of(row: Mapping[str, Any], fallback: str) -> str:
    """The record's own ``id`` (stringified), or ``fallback`` when it has none.

    Raises:
        SampleError: ``malformed_record`` (with ``sample_id=fallback``) for an id that is not a
            non-empty string or an integer.

    Example:
        >>> sample_id_of({"id": 17}, "data.jsonl:3"), sample_id_of({}, "data.jsonl:3")
        ('17', 'data.jsonl:3')
    """
    value = row.get("id")
    if value is None:
        return fallback
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and value:
        return value
    raise SampleError("malformed_record", f"field 'id' is {type(value).__name__} {value!r}; give each "
                      "record a non-empty string or integer id, or leave 'id' out", sample_id=fallback)


def build_record(row: Any, *, sample_id: str, image_root: str) -> Record:
    """Normalize one raw record and read its images.

    Args:
        row: the record as parsed (a dict).
        sample_id: its stable id.
        image_root: the resolved folder image paths are relative to.

    Raises:
        SampleError: with one of ``malformed_record``, ``unknown_role``, ``empty_conversation``,
            ``no_assistant_turn``, ``placeholder_mismatch``, ``missing_image``,
            ``image_path_escape``.

    Example:
        >>> r = build_record({"conversations": [{"from": "human", "value": "Hi"},
        ...                                     {"from": "gpt", "value": "Hello"}]},
        ...                  sample_id="chat.json:0", image_root="/data")
        >>> r.messages[1]
        {'role': 'assistant', 'content': [{'type': 'text', 'text': 'Hello'}]}
    """
    try:
        if not isinstance(row, Mapping):
            raise SampleError("malformed_record", f"the record is a {type(row).__name__}, not an object; "
                              "each record must be a JSON object (dict)")
        turns = [(_role(role, i), _parts(content, i)) for i, (role, content) in enumerate(_raw_turns(row))]
        pool = _image_list(row)
        _check_turns(turns, pool)
        turns = _place_images(turns, pool)
        return _finish(turns, sample_id, image_root)
    except SampleError as e:
        raise SampleError(e.reason, e.detail, sample_id=sample_id) from None


def _raw_turns(row: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    for key in TEXT_COLUMNS[:2]:
        if row.get(key) is not None:
            turns = _list_field(row, key)
            for i, t in enumerate(turns):
                if not isinstance(t, Mapping):
                    raise SampleError("malformed_record", f"{key}[{i}] is {type(t).__name__} {_short(t)}; "
                                      "each turn must be an object with a role and a content")
            return [(_first(t, "role", "from"), _first(t, "content", "value")) for t in turns]
    if row.get("texts") is not None:
        return _texts_turns(_list_field(row, "texts"))
    raise SampleError("malformed_record", f"the record has none of 'conversations', 'messages', 'texts' "
                      f"(keys: {sorted(map(str, row))[:8]}); use one of these layouts")


def _texts_turns(texts: list) -> list[tuple[Any, Any]]:
    turns: list[tuple[Any, Any]] = []
    for i, t in enumerate(texts):
        if not isinstance(t, Mapping) or not isinstance(t.get("user"), str) \
                or not isinstance(t.get("assistant"), str):
            raise SampleError("malformed_record", f"texts[{i}] is {_short(t)}; each entry must be "
                              "{'user': str, 'assistant': str}")
        turns += [("user", t["user"]), ("assistant", t["assistant"])]
    return turns


def _list_field(row: Mapping[str, Any], key: str) -> list:
    value = row[key]
    if not isinstance(value, (list, tuple)):
        raise SampleError("malformed_record", f"field {key!r} is {type(value).__name__} {_short(value)}; "
                          "it must be a list of turns")
    return list(value)


def _first(turn: Mapping[str, Any], *keys: str) -> Any:
    return next((turn[k] for k in keys if turn.get(k) is not None), None)


def _role(raw: Any, i: int) -> str:
    if not isinstance(raw, str):
        raise SampleError("malformed_record", f"turn {i} has role {_short(raw)}; every turn needs a "
                          "'role' (or 'from') string")
    role = ROLE_ALIASES.get(raw.strip().lower())
    if role is None:
        aliases = ", ".join(k for k in ROLE_ALIASES if k not in ("system", "user", "assistant"))
        raise SampleError("unknown_role", f"turn {i} has role {raw!r}; accepted roles are system, user, "
                          f"assistant (aliases: {aliases}); rename the role or remove the turn")
    return role


def _parts(content: Any, i: int) -> list[tuple[str, Any]]:
    """A turn's content as ``("text", str)`` and ``("image", ref or _BARE)`` items."""
    if isinstance(content, str):
        return _split_placeholders(content)
    if isinstance(content, (list, tuple)):
        return [p for part in content for p in _typed_part(part, i)]
    raise SampleError("malformed_record", f"turn {i} has content {type(content).__name__} {_short(content)}; "
                      "content must be a string or a list of typed parts")


def _split_placeholders(text: str) -> list[tuple[str, Any]]:
    pieces = _PLACEHOLDER_RE.split(text)
    out: list[tuple[str, Any]] = []
    for k, piece in enumerate(pieces):
        if k:
            out.append(("image", _BARE))
        if piece:
            out.append(("text", piece))
    return out


def _typed_part(part: Any, i: int) -> list[tuple[str, Any]]:
    if isinstance(part, str):
        return [("text", part)]
    if not isinstance(part, Mapping):
        raise SampleError("malformed_record", f"turn {i} has a content part {_short(part)}; parts must be "
                          "objects like {'type': 'text', 'text': ...} or {'type': 'image'}")
    kind = part.get("type")
    if kind is None and isinstance(part.get("text"), str):
        kind = "text"
    elif kind is None and _first(part, "image", "image_url") is not None:
        kind = "image"
    if kind in _TEXT_PART_TYPES:
        if not isinstance(part.get("text"), str):
            raise SampleError("malformed_record", f"turn {i} has a text part without a 'text' string: "
                              f"{_short(part)}")
        return [("text", part["text"])] if part["text"] else []
    if kind in _IMAGE_PART_TYPES:
        ref = _first(part, "image", "image_url", "path", "url")
        if isinstance(ref, Mapping) and all(v is None for v in ref.values()):
            ref = None  # an Arrow struct column with every field null: no inline image
        return [("image", _BARE if ref is None else ref)]
    raise SampleError("malformed_record", f"turn {i} has a content part of type {kind!r}; accepted types "
                      f"are {', '.join(_TEXT_PART_TYPES + _IMAGE_PART_TYPES)}")


def _check_turns(turns: list[tuple[str, list]], pool: list) -> None:
    if not turns:
        raise SampleError("empty_conversation", "the conversation has no turns; remove the record")
    blank = all(kind == "text" and not value.strip() for _, parts in turns for kind, value in parts)
    if blank and not pool:
        raise SampleError("empty_conversation", f"all {len(turns)} turns are empty (no text, no image)")
    if not any(role == "assistant" for role, _ in turns):
        raise SampleError("no_assistant_turn", f"none of the {len(turns)} turns is an assistant turn, so "
                          "there is nothing to train on; add the answer or remove the record")


def _image_list(row: Mapping[str, Any]) -> list:
    for key in ("images", "image"):
        value = row.get(key)
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            for k, v in enumerate(value):
                if v is None:
                    raise SampleError("malformed_record", f"{key}[{k}] is null; remove it from the list "
                                      "(and its placeholder) or give the image")
            return list(value)
        if isinstance(value, (str, bytes, bytearray, Mapping)):
            return [value]
        raise SampleError("malformed_record", f"field {key!r} is {type(value).__name__} {_short(value)}; "
                          "give a path, a list of paths, or image bytes")
    return []


def _place_images(turns: list[tuple[str, list]], pool: list) -> list[tuple[str, list]]:
    slots = sum(1 for _, parts in turns for kind, value in parts if kind == "image" and value is _BARE)
    if slots == 0 and pool:
        at = next((k for k, (role, _) in enumerate(turns) if role == "user"),
                  next((k for k, (role, _) in enumerate(turns) if role != "system"), 0))
        role, parts = turns[at]
        turns = list(turns)
        turns[at] = (role, [("image", ref) for ref in pool] + parts)
        return turns
    if slots != len(pool):
        raise SampleError("placeholder_mismatch", f"the record has {slots} image placeholder(s) "
                          f"({PLACEHOLDER!r} or bare image parts) but {len(pool)} image(s); make the counts "
                          "match, or remove every placeholder to put the images before the first user turn")
    refs = iter(pool)
    return [(role, [(kind, next(refs) if value is _BARE else value) for kind, value in parts])
            for role, parts in turns]


def _finish(turns: list[tuple[str, list]], sample_id: str, image_root: str) -> Record:
    messages: list[dict] = []
    images: list[bytes] = []
    for role, parts in turns:
        content: list[dict] = []
        for kind, value in parts:
            if kind == "image":
                images.append(load_image(value, image_root))
                content.append({"type": "image"})
            else:
                content.append({"type": "text", "text": value})
        messages.append({"role": role, "content": content or [{"type": "text", "text": ""}]})
    return Record(sample_id=sample_id, messages=tuple(messages), images=tuple(images))


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
