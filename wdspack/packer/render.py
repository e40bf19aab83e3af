"""The assistant spans of a conversation from one rendering (and a check), not one per turn.

:meth:`~wdspack.packer.samples.SampleBuilder._render` defines assistant turn ``i`` as what rendering
``messages[:i+1]`` adds to rendering ``messages[:i]`` with a generation prompt: two renderings per
turn, about 5 per sample, each as long as the conversation so far. Most templates lay every
assistant turn out the same way: a fixed ``head`` between the generation prompt's end and the turn's
words (usually nothing) and a fixed ``tail`` after them (``</s>``, ``<|im_end|>\\n``). For those the
spans follow from one rendering in which each assistant turn's words are wrapped in two markers::

    marked  <s>[INST]Hi[/INST]\\ue001Hello\\ue002</s>[INST]More[/INST]\\ue001Sure\\ue002</s>
    text    <s>[INST]Hi[/INST]Hello</s>[INST]More[/INST]Sure</s>       (markers removed)
    spans   [(18, 27), (44, 52)]     (words - len(head) .. words + len(tail))

The layout is learned once per builder (:func:`learn_layout`) from probe conversations rendered both
ways; where the probes disagree with it (a template that is not prefix-stable, e.g. Mistral's with
a system prompt, or lays turns out differently) there is no layout and every record takes the prefix
renderings. Per record the one-render path is taken only when the marked rendering, markers
removed, is the plain rendering character for character (a template that strips or inspects the
words fails this) and the head and tail are where the layout puts them; otherwise, and for tool
calling, the prefix renderings decide, as before.

The plain rendering is needed only for that comparison. :meth:`OneRender.once` skips it where the
template provably left the words alone: they go in as :class:`Words`, which note any use besides
being printed or added to, and the marked rendering, markers removed, is then the text (the first
records of each builder are still rendered both ways).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..media import KINDS

__all__ = ["CLOSE", "OPEN", "Layout", "OneRender", "Words", "learn_layout", "mark_assistant", "spans_from_marked",
           "typed_content"]

#: Wrap an assistant turn's words (private-use characters: in no real text).
OPEN, CLOSE = "\ue001", "\ue002"
_PRIVATE = ("\ue000", OPEN, CLOSE)
#: The content part types that stand for a media item (the kinds' names).
_KIND_NAMES = tuple(kind.name for kind in KINDS)

#: ``(head, tail)``: the text between a generation prompt's end and an assistant turn's words, and
#: after the words to the turn's end, the same for every turn.
Layout = tuple[str, str]

Apply = Callable[..., str]

log = logging.getLogger(__name__)

#: What a template may do with an assistant turn's words and still render them unchanged between
#: the markers: print them (``str``), add to them (the result is watched too), copy or pickle them.
_UNSEEN = {"__str__", "__add__", "__radd__", "__new__", "__init__", "__getattribute__", "__setattr__",
           "__delattr__", "__class__", "__init_subclass__", "__subclasshook__", "__dir__", "__sizeof__", "__repr__",
           "__reduce__", "__reduce_ex__", "__getnewargs__", "__getstate__", "__doc__"}


class Words(str):
    """An assistant turn's marked words that note (into ``seen``) whatever a template does with them
    besides printing them or adding to them: compare, test, measure, slice, strip, split, search
    them. A template that does any of it may render other words differently with the markers in,
    so that record takes the plain rendering as well. (Joined by ``~`` or a filter that takes
    ``str()`` first, the result is a plain string: the first records of each builder are rendered
    both ways to catch a template that looks at that, :class:`OneRender`.)

    Example:
        >>> seen = []
        >>> w = Words("Hi", seen)
        >>> str(w) is w, type(w + "</s>").__name__, seen
        (True, 'Words', [])
        >>> w.strip(), "H" in w, seen
        ('Hi', True, ['strip', 'contains'])
    """

    seen: list[str]

    def __new__(cls, text: str, seen: list[str]) -> Words:
        self = super().__new__(cls, text)
        self.seen = seen
        return self

    def __str__(self) -> str:
        return self  # printed, or passed on by soft_str(): still watched

    def __add__(self, other: str) -> Words:
        return Words(str.__add__(str.__str__(self), other), self.seen)

    def __radd__(self, other: str) -> Words:
        return Words(str.__add__(other, str.__str__(self)), self.seen)

    def __html__(self) -> str:  # Markup(), |safe, |e: a plain copy from here on
        self.seen.append("__html__")
        return str.__str__(self)


def _noting(name: str) -> Callable[..., Any]:
    method = getattr(str, name)

    def call(self: Words, *args: Any, **kwargs: Any) -> Any:
        self.seen.append(name.strip("_"))
        return method(str.__str__(self), *args, **kwargs)
    call.__name__ = name
    return call


for _name in dir(str):
    if _name not in _UNSEEN and callable(getattr(str, _name)) and _name not in Words.__dict__:
        setattr(Words, _name, _noting(_name))


def mark_assistant(messages: list[dict], watch: list[str] | None = None) -> list[dict] | None:
    """The messages with each assistant turn's words wrapped in :data:`OPEN` / :data:`CLOSE`; None
    where a turn cannot be wrapped (tool calls, an image at either end, the markers in the text).
    With ``watch``, the wrapped words are :class:`Words` noting into it what the template does with them.

    Example:
        >>> mark_assistant([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}])[1]
        {'role': 'assistant', 'content': '\\ue001Yo\\ue002'}
    """
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            if any(c in content for c in _PRIVATE):
                return None
        elif isinstance(content, list) and any(any(c in p.get("text", "") for c in _PRIVATE) for p in content):
            return None
        if m["role"] != "assistant":
            out.append(m)
            continue
        if m.get("tool_calls") or m.get("function_call"):
            return None
        wrap = str if watch is None else lambda text: Words(text, watch)
        if isinstance(content, str):
            out.append({**m, "content": wrap(OPEN + content + CLOSE)})
        elif isinstance(content, list) and content and all(p.get("type") == "text" for p in (content[0], content[-1])):
            parts = [dict(p) for p in content]
            parts[0]["text"] = OPEN + parts[0].get("text", "")
            parts[-1]["text"] = parts[-1].get("text", "") + CLOSE
            for p in (parts[0], parts[-1]):
                p["text"] = wrap(p["text"])
            out.append({**m, "content": parts})
        else:
            return None
    return out


def _words(marked: str) -> tuple[str, list[tuple[int, int]]] | None:
    """The text without markers and where each marked pair of words sits in it (None if unpaired)."""
    pieces, words, at, pos, start = [], [], 0, 0, -1
    while True:
        k = min((i for i in (marked.find(OPEN, at), marked.find(CLOSE, at)) if i >= 0), default=-1)
        if k < 0:
            break
        pieces.append(marked[at:k])
        pos += k - at
        if (marked[k] == OPEN) != (start < 0):
            return None  # two opens or a close first: the template moved words around
        if marked[k] == OPEN:
            start = pos
        else:
            words.append((start, pos))
            start = -1
        at = k + 1
    if start >= 0:
        return None
    pieces.append(marked[at:])
    return "".join(pieces), words


def spans_from_marked(text: str, marked: str, layout: Layout, turns: int,
                      found: tuple[str, list[tuple[int, int]]] | None = None) -> list[tuple[int, int]] | None:
    """The assistant spans in ``text`` from its marked rendering, or None where the one-render path
    cannot vouch for them (the prefix renderings then decide).

    Example:
        >>> spans_from_marked("[/INST]Yo</s>", "[/INST]\\ue001Yo\\ue002</s>", ("", "</s>"), 1)
        [(7, 13)]
    """
    found = found or _words(marked)
    if found is None or found[0] != text or len(found[1]) != turns:
        return None
    head, tail = layout
    spans, last = [], 0
    for start, end in found[1]:
        if not (text.startswith(head, start - len(head)) and start - len(head) >= last
                and text.startswith(tail, end)):
            return None
        spans.append((start - len(head), end + len(tail)))
        last = end + len(tail)
    return spans


class OneRender:
    """A record's text and assistant spans from its marked rendering alone (:meth:`once`), or its
    spans from a marked rendering beside the plain one (:meth:`spans`); None where the one-render
    path cannot vouch for them (the prefix renderings decide).

    :meth:`once` renders through ``compiled`` (the compiled template, no generation prompt; None
    where it is not to be used) with the words as :class:`Words`: a record whose words the template
    looks at (strips, compares, tests) takes the plain rendering too. The first :data:`CHECKS`
    records of each builder are rendered both ways; where they differ, every record is.

    Example:
        >>> one = OneRender(builder._apply, builder._message, builder._renderer.marked)  # doctest: +SKIP
        >>> one.once([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}])  # doctest: +SKIP
        ('<s>[INST]Hi[/INST]Yo</s>', [(18, 24)])
    """

    #: Records per builder rendered both ways before :meth:`once` is trusted alone.
    CHECKS = 32

    def __init__(self, apply: Apply, message: Callable[[dict], dict],
                 compiled: Callable[[list[dict], list[dict]], str | None]) -> None:
        self.apply, self.message, self.compiled = apply, message, compiled
        self._layouts: dict[bool, Layout | None] | None = None
        self._checks: int | None = self.CHECKS

    def layout(self, messages: list[dict]) -> Layout | None:
        if messages[0]["role"] == "assistant" or any(m["role"] == "tool" for m in messages):
            return None
        if self._layouts is None:  # learned once per builder, on the first chat
            self._layouts = learn_layout(self.apply, self.message)
        return self._layouts[any(m["role"] == "system" for m in messages)]

    def spans(self, messages: list[dict], text: str) -> list[tuple[int, int]] | None:
        layout = self.layout(messages)
        marked = mark_assistant(messages) if layout is not None else None
        if layout is None or marked is None:
            return None
        try:
            other = self.apply(marked, generation_prompt=False)
        except Exception:  # a template that refuses the marked words: the prefix renderings decide
            return None
        return spans_from_marked(text, other, layout, sum(m["role"] == "assistant" for m in messages))

    def once(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]] | None:
        layout = self.layout(messages) if self._checks is not None else None
        seen: list[str] = []
        marked = mark_assistant(messages, seen) if layout is not None else None
        if layout is None or marked is None:
            return None
        try:
            other = self.compiled(marked, messages)
        except Exception:  # the plain rendering raises its own error
            return None
        found = _words(other) if other is not None and not seen else None
        if found is None or other is None:
            return None
        text = found[0]
        spans = spans_from_marked(text, other, layout, sum(m["role"] == "assistant" for m in messages), found)
        if spans is not None and self._checks:
            self._checks -= 1
            try:
                same = self.apply(messages, generation_prompt=False) == text
            except Exception:
                return None
            if not same:
                log.warning("the chat template renders differently with each assistant turn's words marked, though "
                            "it does not look at them; every record is rendered twice")
                self._checks = None
                return None
        return (text, spans) if spans is not None else None


def _probes(message: Callable[[dict], dict]) -> dict[bool, list[list[dict]]]:
    """Probe conversations, without and with a system prompt (an image in the first user turn)."""
    def turn(role: str, text: str, image: bool = False) -> dict:
        words = [{"type": "text", "text": "\n" + text if image else text}]
        return message({"role": role, "content": [{"type": "image"}, *words] if image else words})

    chat = [turn("user", "What is it?", image=True), turn("assistant", "A cat."),
            turn("user", "And the colour?"), turn("assistant", "Grey, with white paws."),
            turn("user", "Thanks"), turn("assistant", "You are welcome")]
    system = turn("system", "You are a helpful assistant.")
    return {False: [chat[:2], chat], True: [[system, *chat[:2]], [system, *chat]]}


def learn_layout(apply: Apply, message: Callable[[dict], dict]) -> dict[bool, Layout | None]:
    """Per "has a system prompt": the :data:`Layout` every probe's assistant turns share where the
    template is prefix-stable on them, else None (no one-render path).

    ``apply(messages, generation_prompt=...)`` renders; ``message`` turns a record's message into
    the template's form.

    Example:
        >>> learn_layout(builder._apply, builder._message)  # doctest: +SKIP
        {False: ('', '</s>'), True: ('', '</s>')}
    """
    out: dict[bool, Layout | None] = {}
    for key, convs in _probes(message).items():
        layouts: set[Layout] = set()
        try:
            for messages in convs:
                layouts |= _probe_layouts(apply, messages)
        except Exception:  # a template that refuses a probe: the prefix renderings, as before
            layouts = set()
        out[key] = layouts.pop() if len(layouts) == 1 else None
    return out


def _probe_layouts(apply: Apply, messages: list[dict]) -> set[Any]:
    """Each assistant turn's (head, tail), from the prefix renderings; a sentinel where they fail."""
    text = apply(messages, generation_prompt=False)
    marked = mark_assistant(messages)
    found = _words(apply(marked, generation_prompt=False)) if marked is not None else None
    if found is None or found[0] != text:
        return {None, "unmarkable"}
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    out: set[Any] = set()
    for i, (start, end) in zip(turns, found[1]):
        after = apply(messages[: i + 1], generation_prompt=False)
        before = apply(messages[:i], generation_prompt=True)
        if not (text.startswith(after) and after.startswith(before) and len(before) <= start and end <= len(after)):
            return {None, "not prefix-stable"}
        out.add((text[len(before):start], text[end:len(after)]))
    return out


def typed_content(parts: list[dict]) -> list[dict]:
    """Typed parts for a template that renders images itself (many print their own newline after
    one): the newline the source wrote right after an image (``<image>\\n``) is left to it, not doubled.

    Example:
        >>> typed_content([{"type": "image"}, {"type": "text", "text": "\\nWhat is it?"}])
        [{'type': 'image'}, {'type': 'text', 'text': 'What is it?'}]
    """
    out: list[dict] = []
    for p in parts:
        p = dict(p)
        if out and out[-1].get("type") in _KIND_NAMES and p.get("type") == "text" \
                and p.get("text", "").startswith("\n"):
            p["text"] = p["text"][1:]
            if not p["text"]:
                continue
        out.append(p)
    return out
