"""Normalize one raw record (a dict from JSON, JSONL, Parquet or Arrow) into a :class:`Record`.

Four record layouts are understood, whatever file they come from:

=================  ===========================================================================
``conversations``  LLaVA / ShareGPT: ``[{"from": "human", "value": "<image>\\nWhat is it?"}, ...]``
                   with ``image`` (a path or a list of paths); tool calling as LLaMA-Factory and
                   Glaive write it: ``function_call`` turns (a JSON object ``{"name", "arguments"}``
                   or a list of them) and ``observation`` turns (the tool's result), ``tools`` a
                   JSON string or a list of function definitions
``messages``       OpenAI / Hugging Face: ``[{"role": "user", "content": ...}]``, content a string
                   with ``<image>`` placeholders or typed parts, with an ``images`` list; assistant
                   turns may carry ``tool_calls``, ``tool`` turns carry results, ``tools`` on the record
``texts``          the_cauldron / FineVision: ``[{"user": ..., "assistant": ...}, ...]`` with an
                   ``images`` list; the images go at the start of the first user turn
``instruction``    Alpaca: ``instruction``, ``input`` (optional), ``output``, ``history`` (optional
                   ``[[instruction, response], ...]`` before it, LLaMA-Factory's convention) and an
                   ``images`` list; the user turn is ``instruction + "\\n" + input``
=================  ===========================================================================

A ``system`` string on the record (LLaMA-Factory's ShareGPT and Alpaca) becomes the first turn.
Every layout becomes the Hugging Face typed chat format, roles ``system | user | assistant | tool``::

    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}
    {"role": "assistant", "content": [], "tool_calls": [{"type": "function", "id": "3f2a9c01b",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    {"role": "tool", "content": [{"type": "text", "text": "18 C"}], "tool_call_id": "3f2a9c01b",
        "name": "get_weather"}

Tool calls are normalized to what chat templates expect: ``arguments`` a dict (a JSON string is
parsed), each call with an ``id`` (a deterministic 9-character hex id where the data has none:
Mistral's templates require one), each tool turn linked to the call it answers (``tool_call_id``,
``name``), each tool definition wrapped as ``{"type": "function", "function": {...}}``.

Images: each ``<image>`` placeholder (with the newline right after it) and each bare
``{"type": "image"}`` part takes the next entry of the record's image list; their counts must
match. With images but no placeholder at all, the images go at the start of the first user
turn (the LLaVA convention). A part may also carry its own image (``{"type": "image",
"image": "a.png"}``, ``image_url`` parts); such parts take nothing from the list.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SampleError
from .images import load_image

__all__ = ["COLUMNS", "ROLE_ALIASES", "Record", "TEXT_COLUMNS", "build_record", "sample_id_of"]

#: The fields a record may hold a conversation in (one of them is required).
TEXT_COLUMNS = ("messages", "conversations", "texts", "instruction")
#: Every field that is read; other fields (and Parquet/Arrow columns) are ignored.
COLUMNS = ("id", *TEXT_COLUMNS, "input", "output", "history", "system", "tools", "images", "image")

#: Accepted spellings of each role (compared case-insensitively).
ROLE_ALIASES: dict[str, str] = {
    "system": "system",
    "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant", "bot": "assistant", "chatgpt": "assistant",
    "model": "assistant", "ai": "assistant",
    "function_call": "assistant",  # ShareGPT: the value is the call(s), as JSON
    "tool": "tool", "observation": "tool", "function": "tool", "ipython": "tool",
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
    #: function definitions the conversation may call (``{"type": "function", "function": {...}}``)
    tools: tuple[dict, ...] = ()


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
        >>> build_record({"instruction": "Add", "input": "2 + 3", "output": "5"},
        ...              sample_id="alpaca.json:0", image_root="/data").messages[0]["content"]
        [{'type': 'text', 'text': 'Add\\n2 + 3'}]
    """
    try:
        if not isinstance(row, Mapping):
            raise SampleError("malformed_record", f"the record is a {type(row).__name__}, not an object; "
                              "each record must be a JSON object (dict)")
        turns = _with_system(row, _raw_turns(row))
        pool = _image_list(row)
        _check_turns(turns, pool)
        turns = _link_tool_calls(_place_images(turns, pool), sample_id)
        return _finish(turns, sample_id, image_root, _tools(row))
    except SampleError as e:
        raise SampleError(e.reason, e.detail, sample_id=sample_id) from None


# A turn while it is parsed: (role, [("text", str) | ("image", ref or _BARE)], extra message keys)
Turn = tuple[str, list, dict]


def _raw_turns(row: Mapping[str, Any]) -> list[Turn]:
    for key in TEXT_COLUMNS[:2]:
        if row.get(key) is not None:
            turns = _list_field(row, key)
            for i, t in enumerate(turns):
                if not isinstance(t, Mapping):
                    raise SampleError("malformed_record", f"{key}[{i}] is {type(t).__name__} {_short(t)}; "
                                      "each turn must be an object with a role and a content")
            return [_turn(t, i) for i, t in enumerate(turns)]
    if row.get("texts") is not None:
        return _texts_turns(_list_field(row, "texts"))
    if row.get("instruction") is not None:
        return _alpaca_turns(row)
    raise SampleError("malformed_record", f"the record has none of 'conversations', 'messages', 'texts', "
                      f"'instruction' (keys: {sorted(map(str, row))[:8]}); use one of these layouts")


def _turn(t: Mapping[str, Any], i: int) -> Turn:
    raw_role, content = _first(t, "role", "from"), _first(t, "content", "value")
    role = _role(raw_role, i)
    if raw_role.strip().lower() == "function_call":
        return "assistant", [], {"tool_calls": _calls(_json_value(content, f"turn {i} (function_call)"), i)}
    if role == "tool":
        extra = {k: str(t[k]) for k in ("tool_call_id", "name") if t.get(k) is not None}
        return "tool", [("text", _tool_text(content, i))], extra
    calls = t.get("tool_calls") if role == "assistant" else None
    if role == "assistant" and calls is None and t.get("function_call") is not None:
        calls = [t["function_call"]]  # OpenAI's older single-call field
    if calls is None:
        return role, _parts(content, i), {}
    return role, ([] if content is None else _parts(content, i)), {"tool_calls": _calls(calls, i)}


def _texts_turns(texts: list) -> list[Turn]:
    turns: list[Turn] = []
    for i, t in enumerate(texts):
        if not isinstance(t, Mapping) or not isinstance(t.get("user"), str) \
                or not isinstance(t.get("assistant"), str):
            raise SampleError("malformed_record", f"texts[{i}] is {_short(t)}; each entry must be "
                              "{'user': str, 'assistant': str}")
        turns += [("user", _split_placeholders(t["user"]), {}),
                  ("assistant", _split_placeholders(t["assistant"]), {})]
    return turns


def _alpaca_turns(row: Mapping[str, Any]) -> list[Turn]:
    """``history`` pairs, then ``instruction`` (+ ``"\\n" + input``) and ``output``."""
    fields = {}
    for key in ("instruction", "input", "output"):
        value = row.get(key)
        if value is not None and not isinstance(value, str):
            raise SampleError("malformed_record", f"field {key!r} is {type(value).__name__} {_short(value)}; "
                              "an Alpaca record's instruction, input and output are strings")
        fields[key] = value
    if fields["output"] is None:
        raise SampleError("malformed_record", f"the record has 'instruction' but no 'output' (keys: "
                          f"{sorted(map(str, row))[:8]}); an Alpaca record needs instruction, input (optional) "
                          "and output")
    history = row.get("history") or []
    if not isinstance(history, (list, tuple)):
        raise SampleError("malformed_record", f"field 'history' is {type(history).__name__} {_short(history)}; "
                          "it must be a list of [instruction, response] pairs")
    turns: list[Turn] = []
    for k, pair in enumerate(history):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise SampleError("malformed_record", f"history[{k}] is {_short(pair)}; each entry must be a pair "
                              "[instruction, response] of strings")
        turns += [("user", _split_placeholders(pair[0]), {}), ("assistant", _split_placeholders(pair[1]), {})]
    query = "\n".join(x for x in (fields["instruction"], fields["input"]) if x)
    return turns + [("user", _split_placeholders(query), {}),
                    ("assistant", _split_placeholders(fields["output"]), {})]


def _with_system(row: Mapping[str, Any], turns: list[Turn]) -> list[Turn]:
    system = row.get("system")
    if system is None or system == "":
        return turns
    if not isinstance(system, str):
        raise SampleError("malformed_record", f"field 'system' is {type(system).__name__} {_short(system)}; "
                          "it must be a string (the system prompt)")
    if turns and turns[0][0] == "system":
        raise SampleError("malformed_record", "the record has both a 'system' field and a system turn; keep one")
    return [("system", [("text", system)], {}), *turns]


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
        aliases = ", ".join(k for k in ROLE_ALIASES if k not in ("system", "user", "assistant", "tool"))
        raise SampleError("unknown_role", f"turn {i} has role {raw!r}; accepted roles are system, user, "
                          f"assistant, tool (aliases: {aliases}); rename the role or remove the turn")
    return role


# ---- tool calls -----------------------------------------------------------------------------


def _json_value(value: Any, where: str) -> Any:
    """A JSON string parsed; lists and objects (Parquet/Arrow columns) as they are."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as e:
        raise SampleError("malformed_record", f"{where} is not valid JSON ({e}): {_short(value)}; "
                          "write it as JSON") from None


def _calls(value: Any, i: int) -> list[dict]:
    """Tool calls as templates take them: ``{"type": "function", "function": {"name", "arguments": dict}}``."""
    calls = [value] if isinstance(value, Mapping) else value
    if not isinstance(calls, (list, tuple)) or not calls:
        raise SampleError("malformed_record", f"turn {i} has tool calls {_short(value)}; give a call "
                          "{'name': ..., 'arguments': {...}} or a non-empty list of them")
    out = []
    for k, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, Mapping) else None
        fn = fn if isinstance(fn, Mapping) else call
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(name, str) or not name:
            raise SampleError("malformed_record", f"turn {i}, tool call {k} is {_short(call)}; each call needs a "
                              "'name' string (OpenAI: {'function': {'name', 'arguments'}})")
        args = _first(fn, "arguments", "parameters")
        args = {} if args is None or args == "" else _json_value(args, f"turn {i}, the arguments of call {name!r}")
        if not isinstance(args, Mapping):
            raise SampleError("malformed_record", f"turn {i}, the arguments of call {name!r} are "
                              f"{_short(args)}; they must be a JSON object")
        entry = {"type": "function", "function": {"name": name, "arguments": dict(args)}}
        if isinstance(call.get("id"), str) and call["id"]:
            entry["id"] = call["id"]
        out.append(entry)
    return out


def _tool_text(content: Any, i: int) -> str:
    """A tool result as text (results are text; a JSON object is written back as JSON)."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = [p for part in content for p in _typed_part(part, i)]
        if any(kind != "text" for kind, _ in parts):
            raise SampleError("malformed_record", f"turn {i} is a tool result with an image; tool results must "
                              "be text")
        return "".join(text for _, text in parts)
    if isinstance(content, Mapping):
        return json.dumps(content, ensure_ascii=False)
    raise SampleError("malformed_record", f"turn {i} is a tool result with content {_short(content)}; give "
                      "the result as a string")


def _link_tool_calls(turns: list[Turn], sample_id: str) -> list[Turn]:
    """Give every call an id and every tool turn the id (and name) of the call it answers: the
    ``j``-th tool turn after an assistant's calls answers its ``j``-th call."""
    out: list[Turn] = []
    pending: list[dict] = []
    k = j = 0
    for role, parts, extra in turns:
        if extra.get("tool_calls"):
            pending = []
            for call in extra["tool_calls"]:
                pending.append(call if "id" in call else {**call, "id": _call_id(sample_id, k)})
                k += 1
            extra, j = {**extra, "tool_calls": pending}, 0
        elif role == "tool" and pending:
            call = pending[min(j, len(pending) - 1)]
            extra, j = {"tool_call_id": call["id"], "name": call["function"]["name"], **extra}, j + 1
        out.append((role, parts, extra))
    return out


def _call_id(sample_id: str, k: int) -> str:
    """Deterministic, 9 alphanumeric characters (Mistral's templates refuse any other length)."""
    return hashlib.sha256(f"{sample_id}\0{k}".encode()).hexdigest()[:9]


def _tools(row: Mapping[str, Any]) -> tuple[dict, ...]:
    value = row.get("tools")
    if value is None or (isinstance(value, str) and not value.strip()):
        return ()
    value = _json_value(value, "field 'tools'")
    items = [value] if isinstance(value, Mapping) else value
    if not isinstance(items, (list, tuple)):
        raise SampleError("malformed_record", f"field 'tools' is {_short(value)}; give a list of function "
                          "definitions {'name', 'description', 'parameters'} (or a JSON string of one)")
    out = []
    for k, tool in enumerate(items):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            out.append({"type": tool.get("type") or "function", "function": dict(fn)})
        elif isinstance(tool, Mapping) and isinstance(tool.get("name"), str):
            out.append({"type": "function", "function": dict(tool)})
        else:
            raise SampleError("malformed_record", f"tools[{k}] is {_short(tool)}; each tool must be a function "
                              "definition with a 'name' ({'name', 'description', 'parameters'})")
    return tuple(out)


# ---- content and images ---------------------------------------------------------------------


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


def _check_turns(turns: list[Turn], pool: list) -> None:
    if not turns:
        raise SampleError("empty_conversation", "the conversation has no turns; remove the record")
    blank = all(kind == "text" and not value.strip() for _, parts, _ in turns for kind, value in parts)
    if blank and not pool and not any(extra.get("tool_calls") for _, _, extra in turns):
        raise SampleError("empty_conversation", f"all {len(turns)} turns are empty (no text, no image)")
    if not any(role == "assistant" for role, _, _ in turns):
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


def _place_images(turns: list[Turn], pool: list) -> list[Turn]:
    slots = sum(1 for _, parts, _ in turns for kind, value in parts if kind == "image" and value is _BARE)
    if slots == 0 and pool:
        at = next((k for k, (role, _, _) in enumerate(turns) if role == "user"),
                  next((k for k, (role, _, _) in enumerate(turns) if role != "system"), 0))
        role, parts, extra = turns[at]
        turns = list(turns)
        turns[at] = (role, [("image", ref) for ref in pool] + parts, extra)
        return turns
    if slots != len(pool):
        raise SampleError("placeholder_mismatch", f"the record has {slots} image placeholder(s) "
                          f"({PLACEHOLDER!r} or bare image parts) but {len(pool)} image(s); make the counts "
                          "match, or remove every placeholder to put the images before the first user turn")
    refs = iter(pool)
    return [(role, [(kind, next(refs) if value is _BARE else value) for kind, value in parts], extra)
            for role, parts, extra in turns]


def _finish(turns: list[Turn], sample_id: str, image_root: str, tools: tuple[dict, ...]) -> Record:
    messages: list[dict] = []
    images: list[bytes] = []
    for role, parts, extra in turns:
        content: list[dict] = []
        for kind, value in parts:
            if kind == "image":
                images.append(load_image(value, image_root))
                content.append({"type": "image"})
            else:
                content.append({"type": "text", "text": value})
        messages.append({"role": role, "content": content or [{"type": "text", "text": ""}], **extra})
    return Record(sample_id=sample_id, messages=tuple(messages), images=tuple(images), tools=tools)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
