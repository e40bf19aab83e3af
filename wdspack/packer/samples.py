"""Samples: tokenize a record once with the model's chat template, mask, expand image tokens.

A sample after building (Pixtral-style template, 2 tokens per image for the drawing)::

    tokens     <s> [INST] [IMG] [IMG] What is it? [/INST] A cat . </s>
    loss_mask   0     0     0     0    0   0   0     0     1   1  1   1
                                                          └ assistant content + end of turn

The mask is found by rendering the conversation's prefixes with the chat template: the text
between ``messages[:i]`` with a generation prompt and ``messages[:i+1]`` is assistant turn i.
The full text is tokenized once with character offsets and every token inside such a span is a
target. In a prefix-stable template (rendering the first turns is a prefix of rendering all of
them) the turn sits where the prefix ends; in one that is not (Mistral's move the tools and the
system prompt into the last user turn) the turn's text is found in the full rendering, after the
previous turn. A turn found in neither way drops its record (``unmaskable_turn``).
Each image part becomes the image token once in the text; after tokenizing, each occurrence is
expanded to the image's token count (fixed, or from the model's image processor and the image's
header size).

With a model's processor (``SampleConfig(processor=...)``, ``wdspack pack --processor``) the
processor supplies the tokenizer, the chat template and the image layout: each placeholder the
template renders is replaced, in the text, by what the processor would put there for an image of
that size (its model family says how, from the header alone; :mod:`wdspack.models`), and the
expanded text is tokenized as the processor tokenizes it. The ids are then token for token those
of ``processor.apply_chat_template(..., tokenize=True)`` with the images::

    rendered   <|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>...
    expanded   <|im_start|>user\n<|vision_start|><|image_pad|> × 6 <|vision_end|>Hi<|im_end|>...
    image_tokens [6]    (the feature tokens of each image: what its vision features fill)
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple, Protocol, cast

import numpy as np

from ..errors import ConfigError, SampleError
from ..format.pack import token_dtype_for
from ..media import IMAGE, KINDS
from ..media.audio.link import link_parts, sound_links, without_linked
from ..media.image.check import error_text as _error_text
from ..media.video.plan import VideoSettings
from .expand import build_expanded
from .fastpath import ChatRenderer, TextEncoder, span_mask
from .loading import (
    check_template_syntax,
    default_image_token,
    images_need_tokens_per_image,
    load_count_processor,
    load_tokenizer,
    not_one_token,
    processor_tokens,
)
from .render import OneRender
from .render import typed_content as _typed_content
from .sources.documents import TextRecord
from .text import PretrainConfig, build_text_sample
from .tokenized import Sample

__all__ = ["ProcessorLike", "Sample", "SampleBuilder", "SampleConfig", "get_builder"]


class RecordLike(Protocol):
    sample_id: str
    messages: tuple[dict, ...]
    images: tuple[bytes, ...]


class ProcessorLike(Protocol):
    """A model's processor object (``transformers.ProcessorMixin``): what wdspack reads of it."""

    tokenizer: Any
    image_processor: Any


@dataclass(frozen=True, slots=True)
class SampleConfig:
    """How samples are built; picklable, shipped to worker processes. It checks itself when built,
    so a library caller gets the errors ``wdspack pack`` gives (naming both the flag and the field).

    Attributes:
        tokenizer: a tokenizer folder or cached model name, or the tokenizer object (fixed image tokens);
            or give ``processor``.
        chat_template: the template's text; default the tokenizer's (or the processor's).
        tokens_per_image: the tokens one image takes (an int >= 0, or digits), or
            ``"processor:NAME_OR_PATH"`` for a dynamic-resolution image processor's count, or an
            image processor object; required with ``tokenizer``, refused with ``processor``.
        image_token: the image token; default the tokenizer's (refused with ``processor``).
        max_image_side, max_image_pixels: images above these are dropped (``image_too_large``).
        processor: the model's processor (a folder, a cached model name or the object): its
            tokenizer, chat template and image layout, token for token.
        pretrain: how captions and documents are laid out (:class:`~wdspack.packer.text.PretrainConfig`).
        video: the video sampling over the processor's own (:class:`~wdspack.media.video.plan.VideoSettings`:
            fps, max frames, max pixels); videos need a ``processor`` whose family has a video path.

    Example:
        >>> SampleConfig("./pixtral", tokens_per_image="64", image_token="[IMG]").tokens_per_image
        64
    """

    tokenizer: str | os.PathLike[str] | Any | None = None
    chat_template: str | None = None
    tokens_per_image: int | str | Any | None = None
    image_token: str | None = None
    max_image_side: int | None = None
    max_image_pixels: int = 64_000_000
    processor: str | os.PathLike[str] | ProcessorLike | None = None
    pretrain: PretrainConfig | None = None
    video: VideoSettings | None = None

    def __post_init__(self) -> None:
        if self.processor is not None and (self.tokenizer or self.tokens_per_image is not None or self.image_token):
            raise ConfigError("--processor supplies the tokenizer, the image token and the tokens per image; drop "
                              "--tokenizer, --tokens-per-image and --image-token (in Python: processor= without "
                              "tokenizer=, tokens_per_image=, image_token=)")
        if self.processor is None and not self.tokenizer:
            raise ConfigError("give --tokenizer (tokenizer=: fixed image tokens) or --processor (processor=: the "
                              "model's own layout)")
        object.__setattr__(self, "tokens_per_image", _tokens_per_image(self.tokens_per_image, self.processor))
        if self.max_image_side is not None and self.max_image_side < 1:
            raise ConfigError(f"--max-image-side must be >= 1 pixel, got {self.max_image_side}")
        if self.max_image_pixels < 1:
            raise ConfigError(f"max_image_pixels must be >= 1, got {self.max_image_pixels}")
        if self.pretrain is not None and not isinstance(self.pretrain, PretrainConfig):
            raise ConfigError(f"pretrain={self.pretrain!r}: pass a wdspack.packer.text.PretrainConfig")
        if self.chat_template is not None:
            check_template_syntax(self.chat_template, "chat_template")
        if self.video is not None and not isinstance(self.video, VideoSettings):
            raise ConfigError(f"video={self.video!r}: pass a wdspack.media.video.plan.VideoSettings")


def _tokens_per_image(value: Any, processor: Any) -> Any:
    """``tokens_per_image`` checked: digits become an int. None without a processor is text-only data:
    the first record with an image stops the job with the fix (:func:`~.loading.images_need_tokens_per_image`)."""
    if value is None:
        return None
    if isinstance(value, str) and re.fullmatch(r"\d+", value):
        return int(value)
    if isinstance(value, bool) or (isinstance(value, str) and not value.startswith("processor:")):
        raise ConfigError(f"--tokens-per-image {value!r}: give a number (e.g. 64) or processor:NAME_OR_PATH")
    if isinstance(value, int) and value < 0:
        raise ConfigError(f"--tokens-per-image must be >= 0, got {value}")
    return value


class _Chat(NamedTuple):
    """A chat record rendered, before tokenizing (:meth:`SampleBuilder.build_chats`)."""

    sid: str
    #: each kind's items (the images always; another kind where the chat has some), checked or planned from
    #: their headers: the bytes, and per item what it expands from (a token count, a size, a plan)
    media: dict[str, tuple[tuple[bytes, ...], tuple[Any, ...]]]
    text: str
    spans: list[tuple[int, int]]
    #: ``(video, audio)``: each audio that is a video's own sound (:mod:`wdspack.media.audio.link`)
    links: tuple[tuple[int, int], ...] = ()


@lru_cache(maxsize=4)
def get_builder(config: SampleConfig) -> SampleBuilder:
    """The builder for ``config``, built once per process (workers call this per task)."""
    return SampleBuilder(config)


class SampleBuilder:
    """Turns records into samples with one tokenizer, chat template and image-token policy."""

    def __init__(self, config: SampleConfig) -> None:
        self.config = config
        self.family = None
        if config.processor is not None:
            from ..models import family_for, load_processor

            self.processor = load_processor(config.processor)
            self.family = family_for(self.processor)
            feature: str | None
            self.tokenizer = self.processor.tokenizer
            template = config.chat_template or self.processor.chat_template or self.tokenizer.chat_template
            side = self.family.image  # None: a family without images (audio alone)
            self.image_token: str | None = side.placeholder(self.processor) if side is not None else None
            feature = side.feature_token(self.processor) if side is not None else None
        else:
            self.tokenizer = load_tokenizer(config.tokenizer)
            template = config.chat_template or getattr(self.tokenizer, "chat_template", None)
            self.processor = load_count_processor(config.tokens_per_image)
            feature = config.image_token or default_image_token(self.tokenizer, self.processor,
                                                                 required=config.tokens_per_image is not None)
            self.image_token = feature  # None: text-only (no --tokens-per-image) and no image token declared
        if not template and config.pretrain is None:  # pre-training records need none (checked per chat)
            raise ConfigError(f"{self.name!r} has no chat template; pass --chat-template FILE")
        self.template = template or ""
        self._renderer, self._encoder = ChatRenderer(self.tokenizer, self.template), TextEncoder(self.tokenizer)
        self.feature_token, self.image_token_id = feature, self._token_id(feature)
        self._setup_kinds()
        self._one = OneRender(self._apply, self._message, self._renderer.marked)
        rendered = {kind.name: self._template_renders_typed(kind.name, self.holders.get(kind.name) or None)
                    for kind in KINDS}
        #: whether messages go to the template as typed parts: it renders a bare part of the first kind the
        #: family (or the tokenizer's image token) takes, images where it takes them
        self.typed_parts = rendered[next((k.name for k in KINDS if self.holders.get(k.name)), IMAGE.name)]
        #: per kind, whether the template renders a bare ``{"type": kind}`` part as its placeholder (only where
        #: messages go as typed parts: records are written one way or the other)
        self.typed: dict[str, bool] = {name: self.typed_parts and found for name, found in rendered.items()}
        self.tool_support = self._template_renders_tools()

    def _setup_kinds(self) -> None:
        """Each kind's pack-time side set up (its room's ``prepare.setup``: the processor's settings for the kind,
        read where transformers reads them, and the user's over them); ``settings_used`` is what the manifest
        records of them and where they were read."""
        self.settings_used: dict[str, dict[str, Any]] = {}
        #: each kind's placeholder, as a chat's parts are written in the text (a kind's setup adds its own)
        self.holders: dict[str, str] = {"image": self.image_token or ""}
        #: per kind, its pack-time side (``wdspack.media.<kind>.prepare``)
        self._prepare = {kind.name: kind.prepare() for kind in KINDS if kind.prepare is not None}
        for side in self._prepare.values():
            side.setup(self)

    def families_taking(self, kind: str) -> tuple[str, ...]:
        """The families with a side for the media kind ``kind`` (for the message when this one has none)."""
        from ..models import known_families

        return tuple(f.name for f in known_families() if kind in f.sides)

    def _token_id(self, feature: str | None) -> int | None:
        """The image token's id; refused unless it is one token of the vocabulary."""
        if feature is None:
            return None
        ids = self.tokenizer.convert_tokens_to_ids([feature])
        unk = getattr(self.tokenizer, "unk_token_id", None)
        if not ids or ids[0] is None or (unk is not None and ids[0] == unk and feature != self.tokenizer.unk_token):
            raise not_one_token(feature, self.name)
        return int(ids[0])

    @property
    def name(self) -> str:
        """The tokenizer (or processor) as the manifest names it."""
        spec = self.config.processor if self.config.processor is not None else self.config.tokenizer
        return str(spec) if isinstance(spec, (str, os.PathLike)) else type(spec).__name__

    # ---- public ----------------------------------------------------------------------------

    def build(self, record: RecordLike | TextRecord) -> Sample:
        """Tokenize one record. Raises :class:`SampleError` with a drop reason for a bad record."""
        # ---- pre-training records (captions, documents) are not chats: wdspack.packer.text builds them
        if hasattr(record, "segments"):  # a TextRecord, or any record shaped like one
            return build_text_sample(self, cast("TextRecord", record))
        # ---- end of the pre-training hook
        return self._finish_chat(self._render_chat(record))

    def build_chats(self, records: Sequence[RecordLike]) -> list[Sample | SampleError | ConfigError]:
        """:meth:`build` of each chat record, in stages over the batch: every record's images checked
        and template rendered, then every text tokenized, then every sample finished. The same samples
        and errors as one by one (an error stands in its record's place), for less CPU: each stage's
        code and tables (Jinja, the tokenizer's vocabulary, libjpeg) stay in the CPU's caches."""
        staged: list[_Chat | SampleError | ConfigError] = []
        for record in records:
            try:
                staged.append(self._render_chat(record))
            except (SampleError, ConfigError) as e:
                staged.append(e)
        encoded = [self._encode(c.text) if isinstance(c, _Chat) and self.family is None else None for c in staged]
        out: list[Sample | SampleError | ConfigError] = []
        for chat, enc in zip(staged, encoded):
            try:
                out.append(chat if not isinstance(chat, _Chat) else self._finish_chat(chat, enc))
            except (SampleError, ConfigError) as e:
                out.append(e)
        return out

    def _render_chat(self, record: RecordLike) -> _Chat:
        """A chat record's checked images and rendered text with its assistant spans."""
        if not self.template:
            raise ConfigError(f"{self.name!r} has no chat template, which chat records need; pass --chat-template FILE")
        sid = record.sample_id
        media = {}
        for kind in KINDS:  # the images always: a stray image placeholder is a mismatch even without images
            items = tuple(getattr(record, kind.plural, ()))
            if items or kind.always_stored:
                names = tuple(getattr(record, f"{kind.name}_names", ()))
                media[kind.name] = self._prepare[kind.name].probe(self, items, sid, names)
        links = sound_links(self, record)
        messages = [self._message(m) for m in without_linked(record.messages, links)]
        if not messages:
            raise SampleError("empty_conversation", "the conversation has no turns", sid)
        if not any(m["role"] == "assistant" for m in messages):
            raise SampleError("no_assistant_turn", "the conversation has no assistant turn to train on", sid)
        tools = [dict(t) for t in getattr(record, "tools", ())] or None
        self._check_tool_support(messages, tools, sid)
        text, spans = self._render(messages, sid, tools=tools)
        return _Chat(sid, media, text, spans, links)

    def _finish_chat(self, chat: _Chat, encoded: tuple[np.ndarray, np.ndarray] | None = None) -> Sample:
        if self.family is not None:
            parts = link_parts(self, [self._prepare[name].part(self, chat.sid, data, probes)
                                      for name, (data, probes) in chat.media.items()], chat.links)
            return build_expanded(self, chat.sid, chat.text, chat.spans, parts)
        ids, offsets = encoded if encoded is not None else self._encode(chat.text)
        if ids.size == 0:
            raise SampleError("empty_conversation", "nothing left after templating", chat.sid)
        images, counts = chat.media["image"]  # without a family, images are the only kind (videos need one)
        return self._expand(chat.sid, ids, span_mask(offsets, chat.spans), list(images), list(counts))

    def _encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and character offsets of ``text``, no special tokens added."""
        return self._encoder(text)

    def describe(self) -> dict[str, Any]:
        """Tokenizer and image-token policy as the manifest records them (deterministic)."""
        vocab = len(self.tokenizer)
        pad = self.pad_token_id
        policy: dict[str, Any]
        if self.family is not None:
            policy = {"kind": "processor", "name": self.name, "family": self.family.name,
                      "processor_class": type(self.processor).__name__}
            for name, side in self._prepare.items():  # each kind's settings and where they were read
                if (used := side.policy(self)) is not None:
                    policy[name] = used
        elif isinstance(self.config.tokens_per_image, int):
            policy = {"kind": "fixed", "tokens_per_image": self.config.tokens_per_image}
        elif self.config.tokens_per_image is None:  # text only: a record with an image stopped the job
            policy = {"kind": "none"}
        else:
            policy = {"kind": "processor", "name": str(self.config.tokens_per_image).split(":", 1)[-1]}
        return {
            "tokenizer": {
                "name": self.name, "vocab_size": vocab, "pad_token_id": pad,
                "image_token": self.feature_token, "image_token_id": self.image_token_id,
                "chat_template_sha256": hashlib.sha256(self.template.encode()).hexdigest(),
                "token_dtype": token_dtype_for(vocab),
            },
            "image_policy": policy,
        }

    @property
    def pad_token_id(self) -> int:
        """The tokenizer's pad token, else a ``<pad>`` token in the vocabulary, else EOS, else 0."""
        tok = self.tokenizer
        if tok.pad_token_id is not None:
            return int(tok.pad_token_id)
        pad = tok.convert_tokens_to_ids(["<pad>"])[0]
        if pad is not None and pad != tok.unk_token_id:
            return int(pad)
        return int(tok.eos_token_id) if tok.eos_token_id is not None else 0

    # ---- rendering -------------------------------------------------------------------------

    def _message(self, m: dict) -> dict:
        """A record's message as the template takes it; tool calls and tool-result links kept,
        a tool result always a string (templates print it as it is)."""
        parts = m["content"]
        extra = {k: v for k, v in m.items() if k not in ("role", "content")}
        if isinstance(parts, str):
            parts = [{"type": "text", "text": parts}]
        if self.typed_parts and m["role"] != "tool":
            return {"role": m["role"], "content": _typed_content(parts), **extra}
        # String form: the text keeps what the source wrote around each image (LLaVA's "<image>\n").
        holders = self.holders
        text = "".join(holders[p["type"]] if p.get("type") in holders else p.get("text", "") for p in parts)
        return {"role": m["role"], "content": text, **extra}

    def _apply(self, messages: list[dict], *, generation_prompt: bool, tools: list[dict] | None = None) -> str:
        return self._renderer(messages, generation_prompt=generation_prompt, tools=tools)

    def _render(self, messages: list[dict], sid: str, *, tools: list[dict] | None = None,
                one_render: bool = True) -> tuple[str, list[tuple[int, int]]]:
        """The full text and the character spans of the assistant turns (tool calls included: they
        are what the model says; tool results are not).

        Assistant turn ``i`` is what rendering ``messages[:i+1]`` adds to rendering ``messages[:i]``
        with a generation prompt, where both are prefixes of the full text (a first turn starts where
        its words do: the template's opening, a system prompt and the assistant header, is no target).
        Where they are not (Mistral's templates write the tools and the system prompt into whichever
        user turn is last), the turn's own text is cut from the end of
        ``messages[:i+1]``'s rendering (where it departs from the same turns with the turn's words
        replaced by a marker) and found in the full text after the previous turn. A turn found in
        neither way (a template that rewrites earlier turns) drops its record, naming the turn.
        """
        if one_render and not tools and (once := self._one.once(messages)) is not None:
            return once  # the text and spans from the marked rendering alone (wdspack.packer.render)
        try:
            text = self._apply(messages, generation_prompt=False, tools=tools)
        except Exception as e:  # jinja raises on templates that reject a conversation shape
            raise SampleError("malformed_record", f"the chat template rejected the conversation: {e}", sid) from None
        found = self._one.spans(messages, text) if one_render and not tools else None
        if found is not None:  # the same spans from one more rendering, not two per turn (wdspack.packer.render)
            return text, found
        spans: list[tuple[int, int]] = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            after = self._apply(messages[: i + 1], generation_prompt=False, tools=tools)
            if i:
                before = self._apply(messages[:i], generation_prompt=True, tools=tools)
            else:  # the template's opening (system prompt, assistant header) is no target
                first = self._turn_text([], after, tools=tools)
                before = after[:len(after) - len(first)] if first else ""
            if text.startswith(after) and after.startswith(before):
                spans.append((len(before), len(after)))
                continue
            turn = self._turn_text(messages[:i], after, tools=tools)
            at = text.find(turn, spans[-1][1] if spans else 0) if turn else -1
            if at < 0:
                raise SampleError("unmaskable_turn", f"assistant turn {i} cannot be located: the chat template "
                                  "renders it differently inside the whole conversation than at its end (e.g. it "
                                  "rewrites earlier turns); pass a template that does not (--chat-template)", sid)
            spans.append((at, at + len(turn)))
        return text, spans

    def _turn_text(self, earlier: list[dict], after: str, *, tools: list[dict] | None) -> str:
        """The text of the last turn of ``after`` (the rendering of ``earlier`` + an assistant turn):
        from where it departs from ``earlier`` + a turn whose words are a marker ("" if it cannot tell)."""
        marked = [*earlier, self._message({"role": "assistant", "content": [{"type": "text", "text": _MARK}]})]
        try:
            other = self._apply(marked, generation_prompt=False, tools=tools)
        except Exception:  # a template that refuses the marked turn: nothing to compare with
            return ""
        at = len(os.path.commonprefix([after, other]))  # noqa: RUF071  (two texts, not paths: the character prefix is meant)
        return after[at:] if other.startswith(_MARK, at) else ""

    def template_warnings(self) -> list[str]:
        """What is wrong with the chat template for training, though it renders: today, an assistant
        turn that ends in no special token (llava-1.5-hf's ``ASSISTANT: text ``), so the model would
        never learn to stop. The pack job logs these once, in the driver."""
        if not self.template:
            return []
        probe = [self._message({"role": "user", "content": [{"type": "text", "text": "Hi"}]}),
                 self._message({"role": "assistant", "content": [{"type": "text", "text": "Hello"}]})]
        try:
            text, spans = self._render(probe, "template probe")
        except (SampleError, ConfigError):
            return []  # a template that cannot render a plain chat fails on the records themselves
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        # the turn's last token that is not only whitespace (Qwen's turns end "<|im_end|>\n")
        last = [i for i, (a, b) in enumerate(enc["offset_mapping"])
                if b > a and a >= spans[0][0] and b <= spans[0][1] and text[a:b].strip()]
        special = set(self.tokenizer.all_special_ids) | {
            i for i, t in self.tokenizer.added_tokens_decoder.items() if getattr(t, "special", False)}
        if last and enc["input_ids"][last[-1]] in special:
            return []
        end = repr(text[spans[0][1] - 12:spans[0][1]])
        eos = f" (e.g. {self.tokenizer.eos_token!r})" if self.tokenizer.eos_token else ""
        return [f"the chat template of {self.name!r} ends an assistant turn in no special token (a turn ends "
                f"...{end}), so the model never learns to stop; pass --chat-template with one that ends each "
                f"assistant turn in the end-of-turn token{eos}"]

    def _template_renders_tools(self) -> dict[str, Any]:
        """Which parts of tool calling the template renders: ``tools`` (the definitions), ``tool_calls``
        (assistant calls), ``tool_results`` (tool turns); ``error`` when it raises on them."""
        tool = {"type": "function", "function": {"name": "wdspack_probe", "description": "wdspack_probe_describes",
                                                 "parameters": {"type": "object", "properties": {}}}}
        call = {"type": "function", "id": "wdsprobe1",
                "function": {"name": "wdspack_probe", "arguments": {"q": "wdspack_probe_argument"}}}
        probe = [self._message(m) for m in (
            {"role": "user", "content": [{"type": "text", "text": "x"}]},
            {"role": "assistant", "content": [{"type": "text", "text": ""}], "tool_calls": [call]},
            {"role": "tool", "content": [{"type": "text", "text": "wdspack_probe_result"}],
             "tool_call_id": "wdsprobe1", "name": "wdspack_probe"},
            {"role": "assistant", "content": [{"type": "text", "text": "y"}]})]
        try:
            text = self._apply(probe, generation_prompt=False, tools=[tool])
        except Exception as e:  # a template that refuses tool roles or keys raises
            return {"tools": False, "tool_calls": False, "tool_results": False, "error": _error_text(e)}
        return {"tools": "wdspack_probe_describes" in text, "tool_calls": "wdspack_probe_argument" in text,
                "tool_results": "wdspack_probe_result" in text, "error": None}

    def _check_tool_support(self, messages: list[dict], tools: list[dict] | None, sid: str) -> None:
        """A record with tool calling needs a template that renders it. Not a per-sample drop: the
        template, not the record, is at fault, and every such record would go the same way."""
        used = {"tools": bool(tools), "tool_calls": any(m.get("tool_calls") for m in messages),
                "tool_results": any(m["role"] == "tool" for m in messages)}
        missing = [k for k, v in used.items() if v and not self.tool_support[k]]
        if not missing:
            return
        names = {"tools": "tool definitions ('tools')", "tool_calls": "assistant tool calls ('tool_calls')",
                 "tool_results": "tool results ('tool' turns)"}
        how = (f"raises on them ({self.tool_support['error']})" if self.tool_support["error"]
               else "leaves them out of the text")
        raise ConfigError(f"sample {sid!r} has {', '.join(names[k] for k in missing)}, but the chat template of "
                          f"{self.name!r} {how}; pass --chat-template FILE with one that renders tools, "
                          "tool_calls and tool turns (the model's own, e.g. Qwen2.5's or Mistral's), or leave the "
                          "tool-calling records out")

    @property
    def typed_images(self) -> bool:
        """Whether the template renders ``{"type": "image"}`` parts (``typed["image"]``)."""
        return self.typed[IMAGE.name]

    def _template_renders_typed(self, kind: str, token: str | None) -> bool:
        """Whether the template renders a bare ``{"type": kind}`` part as ``token``."""
        probe = [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": "x"}]},
                 {"role": "assistant", "content": [{"type": "text", "text": "y"}]}]
        if token is None:
            return False
        try:
            return token in self._apply(probe, generation_prompt=False)
        except Exception:
            return False

    # ---- a tokenizer's fixed count per image (no family) -----------------------------------

    def fixed_tokens(self, width: int, height: int, sid: str) -> int | tuple[int, int]:
        """An image's tokens of ``width`` x ``height`` where no family lays it out: the fixed count (a tokenizer's
        ``tokens_per_image``, or the count processor's); with a family, ``(height, width)`` for it to expand
        (the image kind's ``probe`` asks this)."""
        if self.family is not None:
            return (height, width)
        if self.processor is None:
            if self.config.tokens_per_image is None:
                raise images_need_tokens_per_image(sid)
            return int(self.config.tokens_per_image)
        return processor_tokens(self.processor, height, width)

    def _expand(self, sid: str, ids: np.ndarray, mask: np.ndarray, images: list[bytes],
                counts: list[int]) -> Sample:
        where = np.flatnonzero(ids == self.image_token_id)
        if where.size != len(images):
            raise SampleError("placeholder_mismatch", f"{where.size} image tokens {self.image_token!r} in the "
                              f"rendered text for {len(images)} images", sid)
        if where.size:
            reps = np.ones(ids.size, np.int64)
            reps[where] = counts
            ids, mask = np.repeat(ids, reps), np.repeat(mask, reps)
            mask[ids == self.image_token_id] = 0
        if not mask.any():
            raise SampleError("no_assistant_turn", "no token is a training target after templating", sid)
        return Sample(sid, ids.astype(np.uint32), mask, tuple(images), tuple(int(c) for c in counts))



#: Stands for an assistant turn's words when locating the turn (a private-use character: in no real text).
_MARK = "\ue000"
