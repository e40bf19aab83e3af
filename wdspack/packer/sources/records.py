"""Normalize one raw record (a dict from JSON, JSONL, Parquet or Arrow) into a :class:`Record`.

These record layouts are understood, whatever file they come from:

=================  ===========================================================================
``conversations``  LLaVA / ShareGPT: ``[{"from": "human", "value": "<image>\\nWhat is it?"}, ...]``
                   with ``image`` (a path or a list of paths); tool calling as LLaMA-Factory and
                   Glaive write it: ``function_call`` turns (a JSON object ``{"name", "arguments"}``
                   or a list of them) and ``observation`` turns (the tool's result), ``tools`` a
                   JSON string or a list of function definitions. MiniCPM-V's ``image`` dict
                   ``{"<image_00>": "a.jpg", "<image_01>": "b.jpg"}`` places each image where the
                   text names it (``<image_00>``); named nowhere, they all go first
``messages``       OpenAI / Hugging Face: ``[{"role": "user", "content": ...}]``, content a string
                   with ``<image>`` placeholders or typed parts, with an ``images`` list; assistant
                   turns may carry ``tool_calls``, ``tool`` turns carry results, ``tools`` on the
                   record. LLaMA-Factory's v1 parts are read too: ``{"type": "text", "value": ...}``,
                   ``{"type": "image_url", "value": "a.jpg"}``, ``{"type": "tool_call", "value":
                   "{JSON call}"}`` (``loss_weight`` is not read: assistant turns are the targets)
``prompt``         TRL prompt-completion, conversational: ``prompt`` and ``completion`` lists of
                   messages (as ``messages``), with an ``images`` list
``conversation``   ms-swift ShareGPT: ``[{"human": ..., "assistant": ...}, ...]``
``texts``          the_cauldron / FineVision: ``[{"user": ..., "assistant": ...}, ...]`` with an
                   ``images`` list; the images go at the start of the first user turn
``query``          ms-swift query-response: ``query``, ``response``, ``history`` (optional
                   ``[[query, response], ...]`` before it)
``instruction``    Alpaca: ``instruction``, ``input`` (optional), ``output``, ``history`` (optional
                   ``[[instruction, response], ...]`` before it, LLaMA-Factory's convention) and an
                   ``images`` list; the user turn is ``instruction + "\\n" + input``
=================  ===========================================================================

Grounding objects are not supported yet: a record with a non-empty ``objects`` field is dropped as
``unsupported_media`` (:mod:`.media`).

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

Images: each ``<image>`` placeholder and each bare ``{"type": "image"}`` part takes the next
entry of the record's image list; their counts must match. The text around a placeholder is kept
as written: ``<image>\\nWhat is it?`` keeps its newline (LLaVA and InternVL train on
``<image>\\n``; templates that render typed image parts place the image themselves, and the
sample builder leaves the newline right after it to them). With images but no placeholder at
all, the images go at the start of the first user turn (the LLaVA convention). A part may also
carry its own image (``{"type": "image", "image": "a.png"}``, ``image_url`` parts); such parts
take nothing from the list.

Videos: the same rules with their own list, ``videos`` or ``video`` (LLaMA-Factory, ms-swift,
InternVL, the Qwen2-VL fine-tuning repos, LLaVA-Video): each ``<video>`` placeholder in a prompt
(a user or system turn; in an answer ``<video>`` is HTML and stays text) and each bare
``{"type": "video"}`` part takes the next video; ``video``, ``video_url`` and ``input_video``
parts may carry their own. With no video placeholder the videos go at the start of the first
user turn, before any images put there. LLaVA-Video writes ``<image>`` for its video: in a record
with videos, no images and no video placeholder, each ``<image>`` is the next video's place.
Video files are read as bytes, never decoded here (:mod:`wdspack.media.video.source`).

Audio: the same rules again, with ``audios`` or ``audio`` (LLaMA-Factory's ``mllm_audio_demo.json``,
ms-swift), ``<audio>`` placeholders and ``audio``, ``audio_url`` and ``input_audio`` parts; LLaMA-Factory's
``<video><audio>`` (a video and its own sound track) lists the video under ``videos`` and the same file under
``audios``: read here as a video part then an audio part; whether that audio is the video's sound, interleaved
with it, is decided with the family at pack time (:mod:`wdspack.media.audio.link`). Audio files are read as
bytes, never decoded here (:mod:`wdspack.media.audio.source`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import SampleError
from ...media import IMAGE, KINDS, MediaKind, by_name
from .media import MEDIA_FIELDS, MEDIA_PART_TYPES, check_media_fields, media_part_error
from .placement import (
    BARE,
    PLACEHOLDER,
    bare_slots,
    media_list,
    named_images,
    place,
    place_named,
    split_prompt_placeholders,
)
from .toolcalls import Turn, json_value, link_tool_calls, tool_calls, tools_of

__all__ = ["COLUMNS", "MEDIA_FIELDS", "ROLE_ALIASES", "Record", "TEXT_COLUMNS", "build_record", "sample_id_of"]

#: The fields a record may hold a conversation in (one of them is required), in the order they are tried.
TEXT_COLUMNS = ("messages", "conversations", "conversation", "texts", "prompt", "query", "instruction")
#: Every field that is read; other fields (and Parquet/Arrow columns) are ignored.
COLUMNS = ("id", *TEXT_COLUMNS, "completion", "response", "input", "output", "history", "system", "tools",
           *(key for kind in KINDS for key in kind.record_fields), *MEDIA_FIELDS)

#: Accepted spellings of each role (compared case-insensitively).
ROLE_ALIASES: dict[str, str] = {
    "system": "system",
    "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant", "bot": "assistant", "chatgpt": "assistant",
    "model": "assistant", "ai": "assistant",
    "function_call": "assistant",  # ShareGPT: the value is the call(s), as JSON
    "tool": "tool", "observation": "tool", "function": "tool", "ipython": "tool",
}
_PLACEHOLDER_RE = re.compile(re.escape(PLACEHOLDER))  # the newline after it stays in the text
_TEXT_PART_TYPES = ("text", "input_text")
_CALL_PART_TYPES = ("tool_call", "tool_calls")  # LLaMA-Factory v1: {"type": "tool_call", "value": "{JSON}"}


#: A kind's fields of a record by their v1 spelling: ``images`` is ``media["image"]``, ``image_names``
#: is ``media_names["image"]`` (and so for every kind).
_FIELD_OF = {key: (kind.name, part) for kind in KINDS
             for key, part in ((kind.plural, "media"), (f"{kind.name}_names", "media_names"))}
#: v1's positional order after ``messages`` (frozen: a later kind's fields are keywords only).
_V1_POSITIONS = ("images", "tools", "image_names", "videos", "video_names")


@dataclass(frozen=True, slots=True, init=False)
class Record:
    """One conversation read from a source, before tokenization, with its ``media`` by kind (every kind of
    :data:`~wdspack.media.KINDS`, empty where it has none).

    ``media["image"][k]`` belongs to the ``k``-th ``{"type": "image"}`` part, counting through the messages
    in order, and so for every kind. A kind's fields also read, and construct, by their v1 spelling:
    ``r.images``, ``r.video_names``, ``Record(sid, messages, images=(png,))`` (``images`` also by position).

    Example:
        >>> r = Record("chat.jsonl:0", ({"role": "user", "content": [{"type": "text", "text": "Hi"}]},), ())
        >>> r.messages[0]["content"][0]["text"], r.images, r.media["video"]
        ('Hi', (), ())
    """

    sample_id: str
    messages: tuple[dict, ...]
    #: each kind's items, as stored (a video file's bytes undecoded), in the order of their parts
    media: Mapping[str, tuple[bytes, ...]]
    #: function definitions the conversation may call (``{"type": "function", "function": {...}}``)
    tools: tuple[dict, ...] = ()
    #: each item's path as the record names it (``""`` for inline bytes), by kind, for drop details only
    media_names: Mapping[str, tuple[str, ...]] = field(default_factory=dict, compare=False)

    def __init__(self, sample_id: str, messages: tuple[dict, ...], *by_position: Any,
                 media: Mapping[str, tuple[bytes, ...]] | None = None,
                 media_names: Mapping[str, tuple[str, ...]] | None = None, **by_key: Any) -> None:
        by_key = by_name("Record", _V1_POSITIONS, by_position, by_key, fixed=2)
        tools = by_key.pop("tools", ())
        unknown = sorted(set(by_key) - set(_FIELD_OF))
        if unknown:
            raise TypeError(f"Record() got unexpected keyword arguments {unknown}; a kind's fields are "
                            f"{sorted(_FIELD_OF)}")
        parts: dict[str, dict[str, Any]] = {"media": dict(media or {}), "media_names": dict(media_names or {})}
        for key, value in by_key.items():
            name, part = _FIELD_OF[key]
            parts[part][name] = value
        for name, value in (("sample_id", sample_id), ("messages", messages), ("tools", tools),
                            *((part, {kind.name: tuple(have.get(kind.name, ())) for kind in KINDS})
                              for part, have in parts.items())):
            object.__setattr__(self, name, value)

    def __getattr__(self, key: str) -> Any:  # a kind's field by its v1 spelling (record.images)
        if key in _FIELD_OF:
            name, part = _FIELD_OF[key]
            return getattr(self, part)[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {key!r}")


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


def build_record(row: Any, *, sample_id: str, image_root: str, absolute_images: bool = False) -> Record:
    """Normalize one raw record and read its media (each kind's items).

    Args:
        row: the record as parsed (a dict).
        sample_id: its stable id.
        image_root: the resolved folder image (and video) paths are relative to.
        absolute_images: read absolute image and video paths where they point (no image root was given).

    Raises:
        SampleError: with one of ``malformed_record``, ``unknown_role``, ``empty_conversation``,
            ``no_assistant_turn``, ``placeholder_mismatch``, ``missing_image``,
            ``image_path_escape``, ``missing_video``, ``video_path_escape``, ``unreadable_video``,
            ``unsupported_media``.

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
        check_media_fields(row)
        turns = _with_system(row, _raw_turns(row))
        for kind in KINDS:
            if kind is not IMAGE:  # <image> was split where the turns were read, in any turn; the others' in prompts
                turns = split_prompt_placeholders(turns, kind)
        named = named_images(row)  # MiniCPM-V's image dict: the named images are placed, the list is empty
        if named is not None:
            turns = place_named(turns, named)
        pools = {kind.name: [] if kind is IMAGE and named is not None else media_list(row, kind) for kind in KINDS}
        # a kind some records write as <image> where they hold no images (LLaVA-Video's videos)
        as_image = next((kind for kind in KINDS if kind.written_as_image and pools[kind.name] and named is None
                         and not pools[IMAGE.name] and not bare_slots(turns, kind)), None)
        if as_image is not None:
            turns = [(role, [(as_image.name, v) if k == IMAGE.name and v is BARE else (k, v) for k, v in parts],
                      extra) for role, parts, extra in turns]
        _check_turns(turns, any(pools.values()))
        for kind in KINDS:  # each kind prepends the items it puts first: the later kinds come before
            turns = place(turns, pools[kind.name], kind, as_image=kind is as_image)
        turns = link_tool_calls(turns, sample_id)
        return _finish(turns, sample_id, image_root, tools_of(row), absolute_images)
    except SampleError as e:
        raise SampleError(e.reason, e.detail, sample_id=sample_id) from None


def _raw_turns(row: Mapping[str, Any]) -> list[Turn]:
    for key in TEXT_COLUMNS[:2]:
        if row.get(key) is not None:
            return _message_turns(_list_field(row, key), key)
    if row.get("conversation") is not None:  # ms-swift's ShareGPT
        return _pair_entries(_list_field(row, "conversation"), "conversation", ("human", "user"))
    if row.get("texts") is not None:
        return _pair_entries(_list_field(row, "texts"), "texts", ("user",))
    # TRL prompt-completion; a string prompt alone (a preference or prompt/response row) is no such row
    if isinstance(row.get("prompt"), (list, tuple)) or row.get("completion") is not None:
        return _prompt_completion_turns(row)
    if row.get("query") is not None:
        return _query_turns(row)
    if row.get("instruction") is not None:
        return _alpaca_turns(row)
    raise SampleError("malformed_record", f"the record has none of 'conversations', 'messages', 'conversation', "
                      f"'texts', 'prompt' + 'completion', 'query', 'instruction' (keys: {sorted(map(str, row))[:8]}); "
                      "use one of these layouts (the Sources table, docs/guides/pack.md#sources)")


def _message_turns(items: list, key: str, start: int = 0) -> list[Turn]:
    """Turns of a list of ``{role, content}`` (or ``{from, value}``) messages; ``start`` numbers them."""
    for i, t in enumerate(items):
        if not isinstance(t, Mapping):
            raise SampleError("malformed_record", f"{key}[{i}] is {type(t).__name__} {_short(t)}; "
                              "each turn must be an object with a role and a content")
    return [_turn(t, start + i) for i, t in enumerate(items)]


def _turn(t: Mapping[str, Any], i: int) -> Turn:
    raw_role, content = _first(t, "role", "from"), _first(t, "content", "value")
    role = _role(raw_role, i)
    if raw_role.strip().lower() == "function_call":
        return "assistant", [], {"tool_calls": tool_calls(json_value(content, f"turn {i} (function_call)"), i)}
    content, part_calls = _call_parts(content, role, i)
    if role == "tool":
        extra = {k: str(t[k]) for k in ("tool_call_id", "name") if t.get(k) is not None}
        return "tool", [("text", _tool_text(content, i))], extra
    calls = t.get("tool_calls") if role == "assistant" else None
    if role == "assistant" and calls is None and t.get("function_call") is not None:
        calls = [t["function_call"]]  # OpenAI's older single-call field
    if part_calls:
        calls = [*([calls] if isinstance(calls, Mapping) else calls or []), *part_calls]
    if calls is None:
        return role, _parts(content, i), {}
    return role, ([] if content is None else _parts(content, i)), {"tool_calls": tool_calls(calls, i)}


def _call_parts(content: Any, role: str, i: int) -> tuple[Any, list]:
    """LLaMA-Factory v1 writes an assistant's tool calls as content parts ``{"type": "tool_call",
    "value": "{\\"name\\": ..., \\"arguments\\": ...}"}``: the content without them, and the calls."""
    if not isinstance(content, (list, tuple)):
        return content, []
    calls = [p for p in content if isinstance(p, Mapping) and p.get("type") in _CALL_PART_TYPES]
    if not calls:
        return content, []
    if role != "assistant":
        raise SampleError("malformed_record", f"turn {i} is a {role} turn with a tool_call part; only assistant "
                          "turns call tools")
    parsed = []
    for part in calls:
        value = json_value(_first(part, "value", "tool_call", "text"), f"turn {i}, a tool_call part's value")
        parsed += list(value) if isinstance(value, (list, tuple)) else [value]
    return [p for p in content if not (isinstance(p, Mapping) and p.get("type") in _CALL_PART_TYPES)], parsed


def _pair_entries(entries: list, key: str, user_keys: tuple[str, ...]) -> list[Turn]:
    """``[{user: ..., assistant: ...}, ...]``: the_cauldron's ``texts`` and ms-swift's ``conversation``
    (``human``) entries, each one exchange."""
    turns: list[Turn] = []
    for i, t in enumerate(entries):
        query = next((t[k] for k in user_keys if isinstance(t.get(k), str)), None) \
            if isinstance(t, Mapping) else None
        if query is None or not isinstance(t.get("assistant"), str):
            raise SampleError("malformed_record", f"{key}[{i}] is {_short(t)}; each entry must be "
                              f"{{{user_keys[0]!r}: str, 'assistant': str}}")
        turns += [("user", _split_placeholders(query), {}),
                  ("assistant", _split_placeholders(t["assistant"]), {})]
    return turns


def _prompt_completion_turns(row: Mapping[str, Any]) -> list[Turn]:
    """TRL's conversational prompt-completion: the ``prompt`` messages, then the ``completion`` ones."""
    for key in ("prompt", "completion"):
        value = row.get(key)
        if isinstance(value, str):
            raise SampleError("malformed_record", f"field {key!r} is a string ({_short(value)}): TRL's standard "
                              "prompt-completion (or a preference row), not a conversation; give 'prompt' and "
                              "'completion' as lists of {'role', 'content'} messages (TRL's conversational form)")
    if row.get("completion") is None:
        raise SampleError("malformed_record", f"the record has 'prompt' but no 'completion' (keys: "
                          f"{sorted(map(str, row))[:8]}): a prompt-only or preference row has no answer to train "
                          "on; give the answer as 'completion': [{'role': 'assistant', 'content': ...}]")
    prompt = _message_turns(_list_field(row, "prompt"), "prompt")
    return prompt + _message_turns(_list_field(row, "completion"), "completion", start=len(prompt))


def _query_turns(row: Mapping[str, Any]) -> list[Turn]:
    """ms-swift's query-response: ``history`` pairs, then ``query`` and ``response``."""
    query, response = _str_field(row, "query", "query-response"), _str_field(row, "response", "query-response")
    assert query is not None  # the caller picked this layout for its 'query'
    if response is None:
        raise SampleError("malformed_record", f"the record has 'query' but no 'response' (keys: "
                          f"{sorted(map(str, row))[:8]}); a query-response record needs query and response")
    return _history_turns(row) + [("user", _split_placeholders(query), {}),
                                  ("assistant", _split_placeholders(response), {})]


def _str_field(row: Mapping[str, Any], key: str, layout: str) -> str | None:
    value = row.get(key)
    if value is not None and not isinstance(value, str):
        raise SampleError("malformed_record", f"field {key!r} is {type(value).__name__} {_short(value)}; "
                          f"in a {layout} record it must be a string")
    return value


def _alpaca_turns(row: Mapping[str, Any]) -> list[Turn]:
    """``history`` pairs, then ``instruction`` (+ ``"\\n" + input``) and ``output``."""
    fields = {key: _str_field(row, key, "Alpaca") for key in ("instruction", "input", "output")}
    if fields["output"] is None:
        raise SampleError("malformed_record", f"the record has 'instruction' but no 'output' (keys: "
                          f"{sorted(map(str, row))[:8]}); an Alpaca record needs instruction, input (optional) "
                          "and output")
    query = "\n".join(x for x in (fields["instruction"], fields["input"]) if x)
    return _history_turns(row) + [("user", _split_placeholders(query), {}),
                                  ("assistant", _split_placeholders(fields["output"]), {})]


def _history_turns(row: Mapping[str, Any]) -> list[Turn]:
    """``history``: ``[[query, response], ...]`` before the record's own exchange (Alpaca, ms-swift)."""
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
    return turns


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


# ---- tool results ---------------------------------------------------------------------------


def _tool_text(content: Any, i: int) -> str:
    """A tool result as text (results are text; a JSON object is written back as JSON)."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = [p for part in content for p in _typed_part(part, i)]
        if any(kind != "text" for kind, _ in parts):
            raise SampleError("malformed_record", f"turn {i} is a tool result with an image or a video; tool "
                              "results must be text")
        return "".join(text for _, text in parts)
    if isinstance(content, Mapping):
        return json.dumps(content, ensure_ascii=False)
    raise SampleError("malformed_record", f"turn {i} is a tool result with content {_short(content)}; give "
                      "the result as a string")


# ---- content and media ----------------------------------------------------------------------


def _parts(content: Any, i: int) -> list[tuple[str, Any]]:
    """A turn's content as ``("text", str)`` items and, for each media item, ``(kind name, ref or BARE)``."""
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
            out.append((IMAGE.name, BARE))
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
    elif kind is None:  # an untyped part holding a kind's own key (``image``, ``image_url``) is that kind's
        kind = next((k.name for k in KINDS if _first(part, k.name, f"{k.name}_url") is not None), None)
    if kind in _TEXT_PART_TYPES:
        text = part.get("text") if part.get("text") is not None else part.get("value")  # LLaMA-Factory v1: value
        if not isinstance(text, str):
            raise SampleError("malformed_record", f"turn {i} has a text part without a 'text' (or 'value') "
                              f"string: {_short(part)}")
        return [("text", text)] if text else []
    of = next((k for k in KINDS if kind in k.part_types), None)
    if of is not None:
        ref = _first(part, *of.ref_keys)
        if isinstance(ref, Mapping) and all(v is None for v in ref.values()):
            ref = None  # an Arrow struct column with every field null: no inline item, a bare part
        return [(of.name, BARE if ref is None else ref)]
    if kind in MEDIA_PART_TYPES:
        raise media_part_error(kind, i)
    accepted = (*_TEXT_PART_TYPES, *(t for k in KINDS for t in k.part_types))
    raise SampleError("malformed_record", f"turn {i} has a content part of type {kind!r}; accepted types "
                      f"are {', '.join(accepted)} (and tool_call in assistant turns)")


def _check_turns(turns: list[Turn], listed: bool) -> None:
    """``listed``: the record lists media (an item is something to train on, though no turn places it)."""
    if not turns:
        raise SampleError("empty_conversation", "the conversation has no turns; remove the record")
    blank = all(kind == "text" and not value.strip() for _, parts, _ in turns for kind, value in parts)
    if blank and not listed and not any(extra.get("tool_calls") for _, _, extra in turns):
        raise SampleError("empty_conversation", f"all {len(turns)} turns are empty (no text, no image)")
    if not any(role == "assistant" for role, _, _ in turns):
        raise SampleError("no_assistant_turn", f"none of the {len(turns)} turns is an assistant turn, so "
                          "there is nothing to train on; add the answer or remove the record")


def _finish(turns: list[Turn], sample_id: str, image_root: str, tools: tuple[dict, ...],
            absolute_images: bool) -> Record:
    messages: list[dict] = []
    kinds: dict[str, MediaKind] = {kind.name: kind for kind in KINDS}
    media: dict[str, list[bytes]] = {name: [] for name in kinds}
    names: dict[str, list[str]] = {name: [] for name in kinds}
    for role, parts, extra in turns:
        content: list[dict] = []
        for what, value in parts:
            kind = kinds.get(what)
            if kind is None:
                content.append({"type": "text", "text": value})
                continue
            media[what].append(kind.load(value, image_root, absolute_ok=absolute_images))
            names[what].append(kind.describe(value))
            content.append({"type": what})
        messages.append({"role": role, "content": content or [{"type": "text", "text": ""}], **extra})
    return Record(sample_id, tuple(messages), tools=tools, media={k: tuple(v) for k, v in media.items()},
                  media_names={k: tuple(v) for k, v in names.items()})


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
