"""Render a chat template and tokenize text at the cost of the work itself, not of the wrappers.

A pack job renders every record's template twice (the text and the marked text,
:mod:`wdspack.packer.render`) and tokenizes it once with offsets. Through transformers' public
calls, half of that time is spent around the work: ``apply_chat_template`` copies and normalises
every message, looks the template up and re-reads the special tokens on each call, and
``tokenizer(text)`` validates its input and sets truncation and padding on the backend each time.

:class:`ChatRenderer` calls the compiled template (transformers' own compiler and sandbox, reached
through :mod:`wdspack.models.compat`) with exactly the variables ``apply_chat_template(...,
tokenize=False)`` gives it, for messages it would pass through unchanged: plain ``role`` and
``content`` (a string, or typed parts of strings), no tools. Anything else (tools, tool calls,
reasoning fields) goes through ``apply_chat_template`` as before. :class:`TextEncoder` calls the
``tokenizers`` backend directly where the tokenizer is transformers' plain fast tokenizer with no
truncation or padding set, through :class:`~wdspack.packer.bpe.ByteLevelBPE` where the backend is a
byte-level BPE (tekken, Llama 3, Qwen2: about 3 times faster again), else ``tokenizer(text, ...)``.

Both check themselves on their first uses against the public call (a template, special tokens or
tokenizer that disagrees turns the shortcut off for the builder), and ``tests/packer/test_fastpath.py``
holds them equal, character for character and token for token, over the bundled chat templates and
tokenizers. Measured in ``tools/bench_pack_speed.py``.
"""

from __future__ import annotations

import logging
from itertools import chain
from typing import Any

import numpy as np

from .bpe import ByteLevelBPE

__all__ = ["ChatRenderer", "TextEncoder", "span_mask"]

log = logging.getLogger(__name__)


def _plain(messages: list[dict]) -> bool:
    """Messages ``apply_chat_template`` passes to the template as they are (copies of the same values)."""
    for m in messages:
        if len(m) != 2 or type(m.get("role")) is not str:
            return False
        content = m.get("content")
        if type(content) is str:
            continue
        if type(content) is not list:
            return False
        for part in content:
            if type(part) is not dict or not all(type(k) is str and type(v) is str for k, v in part.items()):
                return False
    return True


class ChatRenderer:
    """``tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, ...)``,
    without its per-call overhead for plain messages (see the module).

    Example:
        >>> render = ChatRenderer(tokenizer, template)  # doctest: +SKIP
        >>> render([{"role": "user", "content": "Hi"}], generation_prompt=True)  # doctest: +SKIP
        '<s>[INST]Hi[/INST]'
    """

    def __init__(self, tokenizer: Any, template: str) -> None:
        self.tokenizer, self.template = tokenizer, template
        self._compiled: Any = None
        self._variables: dict[str, Any] = {}
        self._checked = False
        if not template:
            return
        try:
            from ..models.compat import IncompatibleTransformersError, private

            compile_template = private("transformers.utils.chat_template_utils", "_compile_jinja_template")
            self._compiled = compile_template(template)
            # what apply_chat_template adds to every rendering: the special tokens, as plain data
            self._variables = {k: (list(v) if isinstance(v, (list, tuple)) else str(v))
                               for k, v in tokenizer.special_tokens_map.items()}
        except IncompatibleTransformersError as e:
            log.warning("chat templates render through apply_chat_template (slower): %s", e)
        except Exception:  # a template that does not compile fails in apply_chat_template, with its message
            self._compiled = None

    def public(self, messages: list[dict], *, generation_prompt: bool, tools: list[dict] | None = None) -> str:
        """The rendering through transformers' public call."""
        out = self.tokenizer.apply_chat_template(messages, tools=tools, chat_template=self.template, tokenize=False,
                                                 add_generation_prompt=generation_prompt)
        return str(out)

    def __call__(self, messages: list[dict], *, generation_prompt: bool, tools: list[dict] | None = None) -> str:
        if self._compiled is None or tools or not _plain(messages):
            return self.public(messages, generation_prompt=generation_prompt, tools=tools)
        text = str(self._compiled.render(messages=messages, tools=None, documents=None,
                                         add_generation_prompt=generation_prompt, **self._variables))
        if not self._checked:  # once per builder: the shortcut must render what the public call renders
            self._checked = True
            if text != self.public(messages, generation_prompt=generation_prompt):
                log.warning("the compiled chat template renders differently from apply_chat_template here; "
                            "rendering through apply_chat_template")
                self._compiled = None
                return self.public(messages, generation_prompt=generation_prompt)
        return text


    def marked(self, messages: list[dict], plain: list[dict]) -> str | None:
        """The compiled template's rendering of ``messages`` (``plain`` with the assistant words
        marked: :class:`~wdspack.packer.render.Words`), no generation prompt; None where the shortcut
        is off, not yet checked, or would not take ``plain``."""
        if self._compiled is None or not self._checked or not _plain(plain):
            return None
        return str(self._compiled.render(messages=messages, tools=None, documents=None, add_generation_prompt=False,
                                         **self._variables))


class TextEncoder:
    """Token ids and character offsets of a text: what ``tokenizer(text, add_special_tokens=...,
    return_offsets_mapping=True)`` gives (see the module; the public call where the tokenizer's
    post-processor adds tokens and ``add_special_tokens`` is true).

    Example:
        >>> ids, offsets = TextEncoder(tokenizer)("Hello world")  # doctest: +SKIP
        >>> offsets.shape  # doctest: +SKIP
        (2, 2)
    """

    #: Texts compared with the public call before the shortcuts are trusted alone.
    CHECKS = 16

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._backend = self._direct_backend(tokenizer)
        self._fast = ByteLevelBPE.from_backend(self._backend) if self._backend is not None else None
        self._checks = self.CHECKS
        post = getattr(self._backend, "post_processor", None)  # what add_special_tokens=True adds, if anything
        self._adds = self._backend is None or (post is not None and post.num_special_tokens_to_add(False) > 0)

    @staticmethod
    def _direct_backend(tokenizer: Any) -> Any:
        """The ``tokenizers.Tokenizer`` to call directly, or None where the public call does more."""
        try:
            from transformers import PreTrainedTokenizerFast
        except ImportError:
            return None
        base = PreTrainedTokenizerFast
        kind = type(tokenizer)
        if not isinstance(tokenizer, base) or any(getattr(kind, name) is not getattr(base, name)
                                                  for name in ("__call__", "_encode_plus")):
            return None  # a subclass that changes encoding (a slow or a custom tokenizer)
        backend = getattr(tokenizer, "_tokenizer", None)
        if backend is None or backend.truncation is not None or backend.padding is not None:
            return None
        if bool(getattr(tokenizer, "split_special_tokens", False)) != bool(backend.encode_special_tokens):
            return None
        return backend

    def public(self, text: str, add_special_tokens: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Through transformers' public call."""
        enc = self.tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
        return (np.asarray(enc["input_ids"], np.int64),
                np.asarray(enc["offset_mapping"], np.int64).reshape(-1, 2))

    def __call__(self, text: str, add_special_tokens: bool = False) -> tuple[np.ndarray, np.ndarray]:
        if self._backend is None or (add_special_tokens and self._adds):
            return self.public(text, add_special_tokens)
        if self._fast is not None:
            ids, offsets = self._fast(text)
        else:
            enc = self._backend.encode(text, add_special_tokens=False)
            ids = np.asarray(enc.ids, np.int64)  # offsets: a list of pairs, flattened without a per-pair array
            offsets = np.fromiter(chain.from_iterable(enc.offsets), np.int64, count=2 * ids.size).reshape(-1, 2)
        if self._checks:  # the first texts of each builder, as ChatRenderer checks its first rendering
            self._checks -= 1
            ref = self.public(text, add_special_tokens)
            if not (np.array_equal(ids, ref[0]) and np.array_equal(offsets, ref[1])):
                log.warning("%s encodes differently from the tokenizer here; tokenizing through the tokenizer",
                            "the fast byte-level BPE" if self._fast is not None else "the tokenizer's backend")
                self._backend = self._fast = None
                return ref
        return ids, offsets


def span_mask(offsets: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """1 for each token (``offsets`` ``[N, 2]``, characters) wholly inside one of ``spans`` (sorted,
    disjoint ``(start, end)``) and not empty, else 0.

    Example:
        >>> span_mask(np.array([[0, 3], [3, 5], [5, 5], [5, 9]]), [(3, 6)]).tolist()
        [0, 1, 0, 0]
    """
    if not spans:
        return np.zeros(len(offsets), np.uint8)
    starts, ends = np.asarray(spans, np.int64).T
    k = np.searchsorted(starts, offsets[:, 0], side="right") - 1  # the one span a token can start in
    inside = (k >= 0) & (offsets[:, 1] <= ends[np.maximum(k, 0)]) & (offsets[:, 1] > offsets[:, 0])
    return inside.astype(np.uint8)
