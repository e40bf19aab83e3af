"""Tool calling, normalized to what chat templates take.

Calls become ``{"type": "function", "id": ..., "function": {"name", "arguments": dict}}`` (a JSON
string of arguments is parsed; a call without an id gets a deterministic 9-character one, since
Mistral's templates require it), each tool turn is linked to the call it answers (``tool_call_id``,
``name``), and each tool definition is wrapped as ``{"type": "function", "function": {...}}``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ...errors import SampleError

__all__ = ["json_value", "link_tool_calls", "tool_calls", "tools_of"]

#: A turn while a record is parsed: (role, [("text", str) | ("image", ref)], extra message keys)
Turn = tuple[str, list, dict]


def json_value(value: Any, where: str) -> Any:
    """A JSON string parsed; lists and objects (Parquet/Arrow columns) as they are.

    Raises:
        SampleError: ``malformed_record`` for a string that is not JSON (``where`` names it).

    Example:
        >>> json_value('{"city": "Paris"}', "the arguments"), json_value({"city": "Paris"}, "the arguments")
        ({'city': 'Paris'}, {'city': 'Paris'})
    """
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as e:
        raise SampleError("malformed_record", f"{where} is not valid JSON ({e}): {_short(value)}; "
                          "write it as JSON") from None


def tool_calls(value: Any, i: int) -> list[dict]:
    """Tool calls as templates take them: ``{"type": "function", "function": {"name", "arguments": dict}}``.

    Args:
        value: one call or a list of them, OpenAI's (``{"function": {...}}``) or a bare
            ``{"name", "arguments"}`` (ShareGPT's ``function_call``), arguments a dict or JSON.
        i: the turn's index, for error messages.

    Example:
        >>> tool_calls({"name": "get_weather", "arguments": '{"city": "Paris"}'}, 1)
        [{'type': 'function', 'function': {'name': 'get_weather', 'arguments': {'city': 'Paris'}}}]
    """
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
        args = {} if args is None or args == "" else json_value(args, f"turn {i}, the arguments of call {name!r}")
        if not isinstance(args, Mapping):
            raise SampleError("malformed_record", f"turn {i}, the arguments of call {name!r} are "
                              f"{_short(args)}; they must be a JSON object")
        entry = {"type": "function", "function": {"name": name, "arguments": dict(args)}}
        if isinstance(call.get("id"), str) and call["id"]:
            entry["id"] = call["id"]
        out.append(entry)
    return out


def link_tool_calls(turns: list[Turn], sample_id: str) -> list[Turn]:
    """Give every call an id and every tool turn the id (and name) of the call it answers: the
    ``j``-th tool turn after an assistant's calls answers its ``j``-th call.

    Example:
        >>> call = {"type": "function", "function": {"name": "f", "arguments": {}}}
        >>> link_tool_calls([("assistant", [], {"tool_calls": [call]}), ("tool", [], {})], "s")[1][2]
        {'tool_call_id': 'fb2d8077a', 'name': 'f'}
    """
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


def tools_of(row: Mapping[str, Any]) -> tuple[dict, ...]:
    """The record's ``tools`` (a list of function definitions, or a JSON string of one), wrapped.

    Example:
        >>> tools_of({"tools": '[{"name": "f", "parameters": {}}]'})
        ({'type': 'function', 'function': {'name': 'f', 'parameters': {}}},)
    """
    value = row.get("tools")
    if value is None or (isinstance(value, str) and not value.strip()):
        return ()
    value = json_value(value, "field 'tools'")
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


def _first(d: Mapping[str, Any], *keys: str) -> Any:
    return next((d[k] for k in keys if d.get(k) is not None), None)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
