"""Byte-level BPE, token for token what ``tokenizers`` gives, at a fraction of its cost.

Most current tokenizers (Mistral's tekken, Llama 3, Qwen2, GPT-2's family) have one shape in
``tokenizers``: added tokens (``[INST]``, ``<|im_end|>``) are cut out of the text first; a regular
expression splits each remaining segment into pieces; each piece's UTF-8 bytes become byte-level
characters and are merged by BPE on their own. ``Tokenizer.encode`` spends most of its time around
that work (alignments kept per byte, Oniguruma, a Python object per token): on a pack job's chat
records, ids and offsets included, it costs about 3 times what :class:`ByteLevelBPE` does (0.47
against 0.16 ms per record in ``tools/bench_pack_speed.py``'s records).

:class:`ByteLevelBPE` does the same steps with the tokenizer's own parts: the same pattern (through
:mod:`regex`), the tokenizer's own BPE model (``model.tokenize``) once per distinct piece, remembered.
What it cannot vouch for it hands to ``Tokenizer.encode``, segment by segment (segments between
added tokens are encoded independently by ``tokenizers`` too, so the result is the same):

* **Unicode.** Two regex engines agree on ASCII; elsewhere their Unicode tables may differ (a letter
  in one, not in the other). A segment with characters from a 128-code-point block not yet checked
  has that block checked first: every code point of it, in 20 contexts (next to letters, digits,
  spaces, newlines, punctuation, itself), split both ways (the pieces, their byte-level characters
  and offsets must be equal; the BPE that follows is the tokenizer's own). Where the block differs,
  each code point is checked alone and those that differ are the backend's. ASCII is checked when
  the encoder is built.
* **Normalisation.** No normaliser, or NFC on a segment already in NFC (the backend's for others).
* **Shape.** Anything else in the tokenizer (a normaliser that is not NFC, several splits, offsets
  trimmed, dropout, flags on added tokens) gives no :class:`ByteLevelBPE` at all
  (:meth:`ByteLevelBPE.from_backend` returns None).

:class:`~wdspack.packer.fastpath.TextEncoder` also compares its first texts with the public call.
``tests/packer/test_bpe.py`` holds it equal to ``Tokenizer.encode`` on every code point, on text from
many scripts and on the bundled tokenizers.
"""

from __future__ import annotations

import json
import logging
import re
import unicodedata
from itertools import accumulate, chain
from operator import itemgetter
from typing import Any

import numpy as np
import regex

__all__ = ["ByteLevelBPE"]

log = logging.getLogger(__name__)

#: The split ``ByteLevel(use_regex=True)`` does itself (GPT-2's).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

#: Where a code point is checked (``{c}``): beside letters, digits, spaces, newlines, punctuation, itself.
CONTEXTS = ("{c}", "a{c}", "{c}a", "A{c}b", "ab{c}", "{c}AB", "1{c}", "{c}2", " {c}", "{c} ", "  {c}x",
            "{c}  y", "{c}{c}", "{c}{c}{c}a", "\n{c}", "{c}\n", "!{c}", "{c}?", "'{c}'s", "x {c}\n\n")
BLOCK = 128
_CACHE_LIMIT = 1 << 16  # distinct pieces remembered per process (about 30 MiB at most, measured)
_IDS, _REL, _COUNT = itemgetter(0), itemgetter(1), itemgetter(2)


def _trie(tokens: list[str]) -> str:
    """A pattern matching the longest of ``tokens`` (sorted, none empty) that starts at a position:
    their trie, each node's continuations tried before it ends (what leftmost-longest finds).

    Example:
        >>> print(_trie(["[IMG]", "[IMG_END]", "[INST]"]))
        \\[I(?:MG(?:\\]|_END\\])|NST\\])
    """
    branches = []
    for first in sorted({t[0] for t in tokens}):
        rest = [t[1:] for t in tokens if t[0] == first]
        longer = [r for r in rest if r]
        inner = _trie(longer) if longer else ""
        if inner and "" in rest:
            inner = f"(?:{inner})?"
        branches.append(re.escape(first) + inner)
    return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"


def _byte_table() -> dict[int, str]:
    """``str.translate`` table: a byte (as a Latin-1 character) to its byte-level character (GPT-2's map)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTES = _byte_table()


_CLASS_ESCAPES = "pPsSdDwWhHvV"
_PLAIN_ESCAPES = "rntfaeAbBZ0123456789"


def _ascii_class(fragment: str) -> str:
    """``fragment`` (a class: ``[...]``, ``\\p{L}``, ``\\s``) as the ASCII characters it matches, listed."""
    matches = regex.compile(fragment).fullmatch
    runs = _runs([c for c in range(128) if matches(chr(c))])
    listed = "".join(f"\\x{a:02x}" + (f"-\\x{b:02x}" if b > a else "") for a, b in runs)
    return f"[{listed}]" if listed else r"[^\x00-\x7f]"


def ascii_pattern(pattern: str) -> str | None:
    """``pattern`` for ASCII text only, in :mod:`re` (about twice as fast as :mod:`regex` with Unicode
    classes): every class replaced by the ASCII characters :mod:`regex` says it matches. None where
    the pattern uses what this does not know.

    Example:
        >>> print(ascii_pattern(r" ?\\p{N}+|[^\\s\\p{L}]"))
         ?[\\x30-\\x39]+|[\\x00-\\x08\\x0e-\\x1f\\x21-\\x40\\x5b-\\x60\\x7b-\\x7f]
    """
    out, i, n = [], 0, len(pattern)
    try:
        while i < n:
            c = pattern[i]
            if c == "[":  # a class, to its closing bracket (one right after [ or [^ is a member)
                j = i + 1 + (pattern[i + 1] == "^")
                j += pattern[j] == "]"
                while pattern[j] != "]":
                    j += 2 if pattern[j] == "\\" else 1
                out.append(_ascii_class(pattern[i:j + 1]))
                i = j + 1
            elif c == "\\":
                e = pattern[i + 1]
                if e in "pP" and pattern[i + 2] == "{":
                    j = pattern.index("}", i) + 1
                    out.append(_ascii_class(pattern[i:j]))
                    i = j
                elif e in _CLASS_ESCAPES:
                    out.append(_ascii_class(pattern[i:i + 2 + (e in "pP")]))
                    i += 2 + (e in "pP")
                elif e.isalnum() and e not in _PLAIN_ESCAPES and e not in "xu":
                    return None  # \\X, \\R, \\G, \\N{...}: what re does not have or means otherwise
                else:
                    out.append(pattern[i:i + 2])
                    i += 2
            else:
                out.append(c)
                i += 1
        text = "".join(out)
        re.compile(text)
    except (IndexError, ValueError, re.error, regex.error):
        return None
    return text


def _state(component: Any) -> Any:
    return None if component is None else json.loads(component.__getstate__())


def _pattern(pre: Any) -> str | None:
    """The split pattern of a byte-level pre-tokenizer this module can follow, else None."""
    if not isinstance(pre, dict):
        return None
    if pre.get("type") == "ByteLevel":
        return GPT2_PATTERN if pre.get("use_regex") and not pre.get("add_prefix_space") else None
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return None
    split, level = steps
    if (split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert")
            or "Regex" not in split.get("pattern", {})):
        return None
    if level.get("type") != "ByteLevel" or level.get("add_prefix_space") or level.get("use_regex"):
        return None
    return str(split["pattern"]["Regex"])


def _offsets_untouched(post: Any) -> bool:
    """Whether the post-processor leaves the offsets of ``add_special_tokens=False`` as they are."""
    if post is None:
        return True
    kind = post.get("type")
    if kind == "Sequence":
        return all(_offsets_untouched(p) for p in post.get("processors", []))
    if kind == "ByteLevel":
        return not post.get("trim_offsets")
    return kind == "TemplateProcessing"


def _spans(segment: str, split: Any) -> list[tuple[int, int]]:
    """Where ``split`` cuts ``segment`` into pieces: its matches and the gaps between them (``Isolated``)."""
    out, at = [], 0
    for m in split.finditer(segment):
        if m.start() > at:
            out.append((at, m.start()))
        if m.end() > m.start():
            out.append(m.span())
        at = m.end()
    if at < len(segment):
        out.append((at, len(segment)))
    return out


class ByteLevelBPE:
    """``Tokenizer.encode(text, add_special_tokens=False)``'s ids and character offsets (see the module).

    Example:
        >>> fast = ByteLevelBPE.from_backend(tokenizer._tokenizer)  # doctest: +SKIP
        >>> ids, offsets = fast("[INST]Hello world[/INST]")  # doctest: +SKIP
        >>> offsets.tolist()  # doctest: +SKIP
        [[0, 6], [6, 11], [11, 17], [17, 24]]
    """

    def __init__(self, backend: Any, pattern: str, nfc: bool, added: dict[str, tuple[int, bool]]) -> None:
        self.backend, self.nfc = backend, nfc
        self._split = regex.compile(pattern)
        ascii_only = ascii_pattern(pattern)
        self._ascii = re.compile(ascii_only) if ascii_only is not None else self._split
        self._model = backend.model
        # added tokens as ``tokenizers`` cuts them: those matched in the raw text first, then the normalised
        self._added = [{t: i for t, (i, norm) in added.items() if norm is n} for n in (False, True)]
        self._find = [re.compile(_trie(sorted(a))) if a else None for a in self._added]
        self._pieces: dict[str, tuple[tuple[int, ...], tuple[int, ...], int]] = {}
        self._checked: set[int] = set()  # blocks of code points checked
        self._refused: set[int] = set()  # code points in them that are the backend's
        self._unknown = regex.compile(r"[^\x00-\x7f]")
        self._theirs: Any = None

    @classmethod
    def from_backend(cls, backend: Any) -> ByteLevelBPE | None:
        """The fast encoder for a ``tokenizers.Tokenizer``, or None where its shape is not this module's
        or ASCII does not encode the same both ways."""
        try:
            model = backend.model
            if type(model).__name__ != "BPE" or model.dropout or model.byte_fallback \
                    or model.continuing_subword_prefix or model.end_of_word_suffix:
                return None
            normalizer = _state(backend.normalizer)
            if normalizer is not None and normalizer.get("type") != "NFC":
                return None
            pattern = _pattern(_state(backend.pre_tokenizer))
            if pattern is None or not _offsets_untouched(_state(backend.post_processor)) \
                    or backend.encode_special_tokens or backend.truncation or backend.padding:
                return None
            added: dict[str, tuple[int, bool]] = {}
            for i, tok in backend.get_added_tokens_decoder().items():
                if tok.single_word or tok.lstrip or tok.rstrip or not tok.content:
                    return None
                added[tok.content] = (int(i), bool(tok.normalized))
            fast = cls(backend, pattern, normalizer is not None, added)
        except Exception as e:  # another tokenizers version's objects: the backend, as before
            log.debug("no fast byte-level BPE: %s", e)
            return None
        if fast._ascii is not fast._split:  # the ASCII pattern must split as the whole one does
            rng = np.random.default_rng(0)
            probe = "|".join(ctx.format(c=chr(c)) for c in range(128) for ctx in CONTEXTS)
            probe += "".join(map(chr, rng.choice([9, 10, 13, 32, 32, 32, *range(33, 127)], 20000)))
            if fast._ascii.findall(probe) != fast._split.findall(probe):
                fast._ascii = fast._split
        return fast if fast._check_block(0) else None

    # ---- encoding ---------------------------------------------------------------------------

    def __call__(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        ids: list[int] = []
        rel: list[int] = []  # each token's (start, end), relative to its piece's start
        starts: list[int] = []
        counts: list[int] = []
        for a, b, token in self._cut(text, 0, len(text), 0):
            if token >= 0:
                _token(token, a, b, ids, rel, starts, counts)
            elif self._ours(text[a:b]):
                self._normalised(text, a, b, ids, rel, starts, counts)
            else:
                self._theirs_segment(text[a:b], a, ids, rel, starts, counts)
        offsets = np.asarray(rel, np.int64).reshape(-1, 2)
        offsets += np.repeat(np.asarray(starts, np.int64), counts)[:, None]
        return np.asarray(ids, np.int64), offsets

    def _cut(self, text: str, a: int, b: int, which: int) -> list[tuple[int, int, int]]:
        """``text[a:b]`` as added tokens of kind ``which`` (``(start, end, id)``) and the segments
        between them (id -1), leftmost-longest as ``tokenizers`` matches them."""
        find = self._find[which]
        if find is None:
            return [(a, b, -1)] if b > a else []
        tokens = self._added[which]
        out, at = [], a
        for m in find.finditer(text, a, b):
            p, q = m.span()
            if p > at:
                out.append((at, p, -1))
            out.append((p, q, tokens[m.group()]))
            at = q
        if b > at:
            out.append((at, b, -1))
        return out

    def _normalised(self, text: str, a: int, b: int, ids: list[int], rel: list[int], starts: list[int],
                    counts: list[int]) -> None:
        """A segment the raw cut left: the normalised added tokens cut out, the rest split and merged."""
        for p, q, token in self._cut(text, a, b, 1):
            if token >= 0:
                _token(token, p, q, ids, rel, starts, counts)
                continue
            segment = text[p:q]
            split = self._ascii if segment.isascii() else self._split
            pieces = split.findall(segment)
            lengths = list(map(len, pieces))
            if sum(lengths) != len(segment):  # the pattern leaves gaps: each gap is a piece too
                pieces = [segment[a:b] for a, b in _spans(segment, split)]
                lengths = list(map(len, pieces))
            starts.extend(accumulate(lengths[:-1], initial=p))
            merged: list[Any] = list(map(self._pieces.get, pieces))
            if None in merged:
                merged = [m if m is not None else self._merge(x) for x, m in zip(pieces, merged)]
            ids.extend(chain.from_iterable(map(_IDS, merged)))
            rel.extend(chain.from_iterable(map(_REL, merged)))
            counts.extend(map(_COUNT, merged))

    def _merge(self, piece: str) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """A piece's ids and offsets (characters, from the piece's start) by the tokenizer's own BPE."""
        raw = piece.encode("utf-8")
        tokens = self._model.tokenize(raw.decode("latin-1").translate(_BYTES))
        ends = list(accumulate(len(t.value) for t in tokens))  # in the piece's bytes: one character each
        if piece.isascii():
            rel = tuple(x for a, b in zip([0, *ends], ends) for x in (a, b))
        else:  # bytes to characters: a token holding part of a character spans all of it
            char = [i for i, ch in enumerate(piece) for _ in range(len(ch.encode("utf-8")))]
            rel = tuple(x for a, b in zip([0, *ends], ends) for x in (char[a], char[b - 1] + 1))
        merged = (tuple(t.id for t in tokens), rel, len(tokens))
        if len(self._pieces) >= _CACHE_LIMIT:
            self._pieces.clear()
        self._pieces[piece] = merged
        return merged

    def _theirs_segment(self, segment: str, at: int, ids: list[int], rel: list[int], starts: list[int],
                        counts: list[int]) -> None:
        enc = self.backend.encode(segment, add_special_tokens=False)
        ids += enc.ids
        for s, e in enc.offsets:
            rel += (s, e)
        starts.append(at)
        counts.append(len(enc.ids))

    # ---- what is vouched for ----------------------------------------------------------------

    def _ours(self, segment: str) -> bool:
        """Whether this module encodes ``segment`` (a segment between raw-cut added tokens)."""
        if segment.isascii():
            return True
        if self._unknown.search(segment):
            for block in sorted({ord(c) // BLOCK for c in self._unknown.findall(segment)}):
                self._check_block(block)
            self._recompile()
        if self._theirs is not None and self._theirs.search(segment):
            return False
        return not self.nfc or unicodedata.is_normalized("NFC", segment)

    def _check_block(self, block: int) -> bool:
        """Split every code point of ``block`` in :data:`CONTEXTS` both ways (pieces, their byte-level
        characters and offsets; for NFC, that text in NFC stays as it is). Where the block as a whole
        splits differently, each code point on its own: those that differ are the backend's."""
        lo, hi = block * BLOCK, block * BLOCK + BLOCK
        self._checked.add(block)
        if 0xD800 <= lo < 0xE000:  # lone surrogates: the backend raises its own error on them
            self._refused.update(range(lo, hi))
            return False
        if self._alike(range(lo, hi)):
            return True
        refused = [c for c in range(lo, hi) if not self._alike([c])]
        self._refused.update(refused)
        log.debug("%d code points in %#x-%#x are tokenized by the backend (its Unicode tables differ from "
                  "the regex module's)", len(refused), lo, hi - 1)
        return not refused

    def _alike(self, points: Any) -> bool:
        probe = "|".join(ctx.format(c=chr(c)) for c in points for ctx in CONTEXTS)
        try:
            return all(self._splits_alike(probe[p:q]) for a, b, t in self._cut(probe, 0, len(probe), 0) if t < 0
                       for p, q, u in self._cut(probe, a, b, 1) if u < 0)
        except Exception as e:  # a code point one side refuses: the backend's
            log.debug("code points %#x-%#x: %s", points[0], points[-1], e)
            return False

    def _splits_alike(self, segment: str) -> bool:
        if self.nfc:
            if not unicodedata.is_normalized("NFC", segment):
                return True  # never split here: the backend's
            if self.backend.normalizer.normalize_str(segment) != segment:
                return False
        split = self._ascii if segment.isascii() else self._split
        ours = [(segment[a:b].encode("utf-8").decode("latin-1").translate(_BYTES), (a, b))
                for a, b in _spans(segment, split)]
        return ours == self.backend.pre_tokenizer.pre_tokenize_str(segment)

    def _recompile(self) -> None:
        blocks = _runs(sorted(self._checked))
        self._unknown = regex.compile("[^" + "".join(f"\\U{a * BLOCK:08x}-\\U{b * BLOCK + BLOCK - 1:08x}"
                                                     for a, b in blocks) + "]")
        points = "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in _runs(sorted(self._refused)))
        self._theirs = regex.compile(f"[{points}]") if points else None


def _token(token: int, a: int, b: int, ids: list[int], rel: list[int], starts: list[int], counts: list[int]) -> None:
    """An added token at ``text[a:b]``: one id, one piece."""
    ids.append(token)
    rel += (0, b - a)
    starts.append(a)
    counts.append(1)


def _runs(values: list[int]) -> list[tuple[int, int]]:
    """Sorted integers as runs ``(first, last)`` of consecutive ones."""
    runs: list[list[int]] = []
    for v in values:
        if runs and runs[-1][1] == v - 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return [(a, b) for a, b in runs]
