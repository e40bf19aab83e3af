"""Pre-training samples: image captions and interleaved documents, tokenized without a chat.

A :class:`~wdspack.packer.sources.documents.TextRecord` is not a conversation: there is no chat
template and no assistant turn. Its segments are tokenized one by one (``add_special_tokens=False``)
and laid end to end, each image as the span the model sees (the same image-token policy as
chats: a fixed count, a processor's count, or a ``--processor`` family's layout)::

    caption, no template ("{image}{caption}"), 2 tokens per image for the drawing:
    tokens     <s> [IMG] [IMG]  A  cat  on  a  mat  </s>
    loss_mask   0    0     0    1   1    1  1   1    1      the caption and end-of-text only

    caption, --caption-template "{image}Caption: {caption}":
    tokens     <s> [IMG] [IMG] Caption :  A  cat  </s>
    loss_mask   0    0     0      0    0  1   1    1

    document ("A cat.", IMAGE, "It sleeps."):
    tokens     <s>  A  cat  .  [IMG] [IMG]  It  sleeps  .  </s>
    loss_mask   0   1   1   1    0     0    1     1     1   1     every text token

``<s>`` is the tokenizer's ``bos_token`` (none when it has none) and ``</s>`` its ``eos_token``;
:class:`PretrainConfig` may name others. Image tokens are never targets.

**Long documents.** A document longer than ``seq_len`` (or with more than ``max_images``
images) is dropped as ``too_long`` / ``too_many_images`` with its reason, as any sample is,
unless splitting is asked for (``PretrainConfig(split_long_documents=True)``, ``wdspack pack
--split-long-documents``; ``pack_dataset`` calls :func:`build_samples` per record). It is then
cut into pieces ``{id}#0``, ``{id}#1``, ... that each fit both budgets, at the best text
boundary in the second half of each piece's room, in this order: before or after an image, a paragraph break (blank
line), a line break, a sentence end, a space. Tokens are never re-tokenized at a cut, nothing is
lost, every piece starts with ``<s>`` and only the last ends with ``</s>``. A document with no
boundary within ``seq_len`` tokens (or an image larger than ``seq_len``) is dropped whole as
``too_long``. ``wdspack verify --source`` counts a document as present when its pieces
``#0 … #n-1`` are each packed or dropped exactly once.

Drop reasons these records can get (besides the image ones every sample can get):
``malformed_record`` (a document's lists disagree, a shard member is corrupt or has no caption),
``missing_image`` (a shard sample with no image), ``empty_conversation`` (an empty caption, a
document without text), ``too_long``, ``too_many_images``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Protocol
from weakref import WeakKeyDictionary

import numpy as np

from ..errors import ConfigError, SampleError
from ..media import KINDS, Media, MediaKind
from .sources.documents import SEGMENT_OF, Segment, TextRecord, is_media
from .tokenized import Sample

__all__ = ["DEFAULT_CAPTION_TEMPLATE", "PretrainConfig", "TextBuilder", "build_samples", "build_text_sample"]

DEFAULT_CAPTION_TEMPLATE = "{image}{caption}"
_IMAGE_FIELD, _CAPTION_FIELD = "{image}", "{caption}"
_NO_CUT = 9  # cut level of a place inside a word: never cut there
_SENTENCE_END = ".!?"
_CLOSERS = "\"')]»”’"


@dataclass(frozen=True, slots=True)
class PretrainConfig:
    """How captions and documents are laid out (part of :class:`~wdspack.packer.samples.SampleConfig`).

    Attributes:
        caption_template: the text around a caption, with ``{image}`` and ``{caption}`` each once
            (other braces are literal); None for ``"{image}{caption}"``: the image tokens, then
            the caption. Only the caption (and end-of-text) is a target.
        bos_token: the token each sample starts with; None: the tokenizer's ``bos_token``, if any.
        eos_token: the end-of-text token; None: the tokenizer's ``eos_token`` (required then).
        split_long_documents: cut documents over the budgets into pieces (see the module).

    Example:
        >>> PretrainConfig(caption_template="{image}A photo of {caption}").caption_template
        '{image}A photo of {caption}'
    """

    caption_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    split_long_documents: bool = False

    def __post_init__(self) -> None:
        t = self.caption_template
        if t is not None and (t.count(_IMAGE_FIELD) != 1 or t.count(_CAPTION_FIELD) != 1):
            raise ConfigError(f"--caption-template {t!r} must hold {_IMAGE_FIELD} and {_CAPTION_FIELD} once each, "
                              f"e.g. '{{image}}A photo of {{caption}}'")


@dataclass(frozen=True, slots=True)
class _Part:
    """A run of tokens: text (a target or not, with its text and offsets for cutting) or one media item."""

    ids: np.ndarray
    target: bool
    text: str = ""
    offsets: np.ndarray | None = None
    #: a media item's kind (``"image"``), bytes, feature tokens and stored plan (None: the kind has none)
    kind: str = ""
    data: bytes | None = None
    tokens: int = 0
    plan: Any = None


class TextBuilder(Protocol):
    """What laying out a caption or a document asks of the sample builder
    (:class:`~wdspack.packer.samples.SampleBuilder`, which calls this module for such records)."""

    config: Any  # its SampleConfig: ``.pretrain`` is the PretrainConfig (None: the defaults)
    tokenizer: Any
    family: Any  # the processor's model family (wdspack.models), or None for a fixed image-token policy
    processor: Any
    image_token_id: int | None

    @property
    def name(self) -> str: ...

    def build(self, record: Any) -> Sample: ...

    def fixed_tokens(self, width: int, height: int, sid: str) -> int | tuple[int, int]: ...

    def _encode(self, text: str) -> tuple[np.ndarray, np.ndarray]: ...  # ids and offsets, no special tokens


def build_text_sample(builder: TextBuilder, record: TextRecord) -> Sample:
    """Tokenize a caption or a whole document as one sample (what ``SampleBuilder.build`` does for them).

    Raises:
        SampleError: a drop reason (an unreadable image, nothing to train on).
        ConfigError: splitting was asked for (only :func:`build_samples` returns pieces), or
            the tokenizer has no end-of-text token.

    Example:
        >>> b = get_builder(SampleConfig("./tok", image_token="[IMG]",
        ...                              pretrain=PretrainConfig(eos_token="</s>")))  # doctest: +SKIP
        >>> build_text_sample(b, TextRecord("s:0", "caption", (IMAGE, "A cat"), (png,))).loss_mask  # doctest: +SKIP
        array([0, 0, ..., 1, 1, 1], dtype=uint8)
    """
    config = _config(builder)
    if record.kind == "document" and config.split_long_documents:
        raise ConfigError("split_long_documents: a document may become several samples, which only "
                          "wdspack.packer.text.build_samples returns (as pack_dataset's measure step calls it)")
    bos, eos = _special_ids(builder, config)
    return _assemble(record.sample_id, bos, _parts(builder, record, config, offsets=False), eos)


def build_samples(builder: TextBuilder, record: Any, *, seq_len: int, max_images: int | None) -> list[Sample]:
    """The samples of any record: one for a chat, a caption or a document that fits; for a longer
    document under ``split_long_documents``, its pieces ``{id}#0 …`` (see the module).

    Raises:
        SampleError: a drop reason for the whole record (``too_long``: no text boundary fits).

    Example:
        >>> [s.sample_id for s in build_samples(b, long_doc, seq_len=4096, max_images=16)]  # doctest: +SKIP
        ['web.jsonl:7#0', 'web.jsonl:7#1']
    """
    if not isinstance(record, TextRecord):
        return [builder.build(record)]
    config = _config(builder)
    if record.kind != "document" or not config.split_long_documents:
        return [builder.build(record)]
    bos, eos = _special_ids(builder, config)
    parts = _parts(builder, record, config, offsets=True)
    tokens = len(bos) + sum(p.ids.size for p in parts) + 1
    media = sum(p.data is not None for p in parts)  # what max_images bounds: every kind's items
    if tokens <= seq_len and (max_images is None or media <= max_images):
        return [_assemble(record.sample_id, bos, parts, eos)]
    pieces = _split(parts, budget=seq_len - len(bos) - 1, max_images=max_images, sid=record.sample_id)
    return [_assemble(f"{record.sample_id}#{k}", bos, piece, eos if k == len(pieces) - 1 else None)
            for k, piece in enumerate(pieces)]


# ---- parts -----------------------------------------------------------------------------------


def _config(builder: TextBuilder) -> PretrainConfig:
    return builder.config.pretrain or PretrainConfig()


#: Per builder, per (bos, eos) option: the ids (looked up once, not per sample).
_SPECIAL_IDS: WeakKeyDictionary[Any, dict[tuple[str | None, str | None], tuple[list[int], int]]] = WeakKeyDictionary()


def _special_ids(builder: TextBuilder, config: PretrainConfig) -> tuple[list[int], int]:
    per = _SPECIAL_IDS.setdefault(builder, {})
    key = (config.bos_token, config.eos_token)
    if key not in per:
        per[key] = _look_up_special_ids(builder, config)
    bos, eos = per[key]
    return list(bos), eos


def _look_up_special_ids(builder: TextBuilder, config: PretrainConfig) -> tuple[list[int], int]:
    tok = builder.tokenizer
    bos_token = config.bos_token or tok.bos_token
    eos_token = config.eos_token or tok.eos_token
    if not eos_token:
        raise ConfigError(f"tokenizer {builder.name!r} has no eos_token, which ends every caption and document; "
                          "name the end-of-text token with --eos-token (e.g. '</s>')")
    return ([_token_id(builder, bos_token, "--bos-token")] if bos_token else [],
            _token_id(builder, eos_token, "--eos-token"))


def _token_id(builder: TextBuilder, token: str, option: str) -> int:
    tok = builder.tokenizer
    i = tok.convert_tokens_to_ids([token])[0]
    if i is None or (i == tok.unk_token_id and token != tok.unk_token):
        raise ConfigError(f"{option} {token!r} is not a single token in the vocabulary of {builder.name!r}; "
                          "give one of its special tokens")
    return int(i)


def _parts(builder: TextBuilder, record: TextRecord, config: PretrainConfig, *, offsets: bool) -> list[_Part]:
    """The record's text, image and video runs in order, each text tokenized on its own."""
    sid = record.sample_id
    for kind in KINDS:  # every kind's count first, then each kind's items checked
        count, have = record.segments.count(SEGMENT_OF[kind.name]), len(record.media.get(kind.name, ()))
        if count != have:
            raise SampleError("placeholder_mismatch", f"{count} {kind.name} segments for {have} {kind.plural}", sid)
    items = {}  # per kind present, each item's (bytes, token ids, feature tokens, stored plan)
    for kind in KINDS:
        data = tuple(record.media.get(kind.name, ()))
        if data or kind.always_stored:  # the images always: their checks (and a fixed count per image)
            items[SEGMENT_OF[kind.name]] = (kind.name, _media_spans(builder, kind, data, sid))
    layout = _layout(record, config)  # (text, a kind's segment; target)
    texts = [t for t, _ in layout if isinstance(t, str)]
    encoded = [builder._encode(t) for t in texts]  # each text alone: wdspack.packer.fastpath.TextEncoder
    parts, t, taken = [], 0, dict.fromkeys(items, 0)
    for text, target in layout:
        if text in items:
            name, spans = items[text]
            item, ids, n, plan = spans[taken[text]]
            parts.append(_Part(ids, False, kind=name, data=item, tokens=n, plan=plan))
            taken[text] += 1
            continue
        assert isinstance(text, str)
        ids, where = encoded[t][0], (encoded[t][1] if offsets else None)
        if ids.size:
            parts.append(_Part(ids, target, text=text, offsets=where))
        t += 1
    if not any(p.target for p in parts):
        raise SampleError("empty_conversation", f"the {record.kind} has no text tokens to train on", sid)
    return parts


def _media_spans(builder: Any, kind: MediaKind, data: tuple[bytes, ...],
                 sid: str) -> list[tuple[bytes, np.ndarray, int, Any]]:
    """Each item's bytes (as checked), token ids (the processor's replacement text, or the fixed count of image
    tokens without a family), feature tokens and stored plan: the kind's room prepares them as for a chat."""
    assert kind.prepare is not None
    side = kind.prepare()  # a kind that needs a family's side says so (unsupported_media)
    checked, probes = side.probe(builder, data, sid)
    if builder.family is None:  # a tokenizer and a fixed count per image (the only kind without a family)
        return [(b, np.full(int(c), builder.image_token_id, np.int64), int(c), None) for b, c in zip(checked, probes)]
    if not checked:
        return []
    prepared = side.part(builder, sid, checked, probes)
    out = []
    for k, rep in enumerate(prepared.texts()):
        ids = np.asarray(builder.tokenizer(rep, add_special_tokens=False)["input_ids"], np.int64)
        out.append((checked[k], ids, int((ids == prepared.token_id).sum()),
                    prepared.plans[k] if prepared.plans else None))
    return out


def _layout(record: TextRecord, config: PretrainConfig) -> list[tuple[Segment, bool]]:
    if record.kind == "document":
        return [(s, isinstance(s, str)) for s in record.segments if is_media(s) or s]
    caption = next(s for s in record.segments if isinstance(s, str))
    media = [s for s in record.segments if is_media(s)]  # a caption's media, in the order its record gives
    out: list[tuple[Segment, bool]] = []
    template = config.caption_template or DEFAULT_CAPTION_TEMPLATE
    for piece in _split_fields(template):
        if piece == _IMAGE_FIELD:
            out += [(m, False) for m in media]
        elif piece == _CAPTION_FIELD:
            out.append((caption, True))
        elif piece:
            out.append((piece, False))
    return out


def _split_fields(template: str) -> list[str]:
    out, rest = [], template
    while rest:
        at = [(rest.find(f), f) for f in (_IMAGE_FIELD, _CAPTION_FIELD) if f in rest]
        if not at:
            out.append(rest)
            break
        i, f = min(at)
        out += [rest[:i], f]
        rest = rest[i + len(f):]
    return out


def _assemble(sid: str, bos: list[int], parts: Sequence[_Part], eos: int | None) -> Sample:
    tail = [eos] if eos is not None else []
    ids = np.concatenate([np.asarray(bos, np.int64), *(p.ids for p in parts), np.asarray(tail, np.int64)])
    mask = np.concatenate([np.zeros(len(bos), np.uint8), *(np.full(p.ids.size, p.target, np.uint8) for p in parts),
                           np.ones(len(tail), np.uint8)])
    media = {kind.name: Media(tuple(p.data for p in parts if p.kind == kind.name and p.data is not None), (),
                              tuple(p.tokens for p in parts if p.kind == kind.name),
                              tuple(p.plan for p in parts if p.kind == kind.name and p.plan is not None))
             for kind in KINDS}
    return Sample(sid, ids.astype(np.uint32), mask, media=media)


# ---- splitting -------------------------------------------------------------------------------


def _split(parts: list[_Part], *, budget: int, max_images: int | None, sid: str) -> list[list[_Part]]:
    """Cut the parts into pieces of at most ``budget`` tokens and ``max_images`` images.

    Atoms are text tokens (cost 1) and whole images (cost: their span); ``level[j]`` says how good
    a cut before atom ``j`` is (0 best, :data:`_NO_CUT` never).
    """
    cost, img, level, where = [], [], [], []  # where: (part index, token index) of each atom
    for pi, p in enumerate(parts):
        if p.data is not None:  # a media item: one atom
            cost.append(p.ids.size)
            img.append(1)
            level.append(0)
            where.append((pi, 0))
            continue
        assert p.offsets is not None  # parts made for splitting carry their offsets
        lv = _text_levels(p.text, p.offsets)
        lv[0] = 0  # a part boundary: text meets an image or another text run
        cost += [1] * p.ids.size
        img += [0] * p.ids.size
        level += lv.tolist()
        where += [(pi, t) for t in range(p.ids.size)]
    cum_cost = np.concatenate(([0], np.cumsum(cost)))
    cum_img = np.concatenate(([0], np.cumsum(img)))
    level_arr = np.asarray(level + [0])  # the end is always a cut
    n, cap = len(cost), max_images if max_images is not None else len(cost) + 1
    cuts, start = [0], 0
    while start < n:
        fit = min(int(np.searchsorted(cum_cost, cum_cost[start] + budget, "right")),
                  int(np.searchsorted(cum_img, cum_img[start] + cap, "right"))) - 1
        if fit >= n:
            break
        if fit <= start:
            what = f"an image of {cost[start]} tokens" if img[start] else "a token"
            raise SampleError("too_long", f"{what} at atom {start} does not fit a piece of {budget} tokens "
                              "(seq_len less <s> and </s>); raise --seq-len to keep the document", sid)
        end = _best_cut(level_arr, start, fit)
        if end is None:
            raise SampleError("too_long", f"the document has no text boundary (image, line break, sentence end "
                              f"or space) within {budget} tokens after token {int(cum_cost[start])}; raise --seq-len "
                              "to keep it", sid)
        cuts.append(end)
        start = end
    cuts.append(n)
    return [_slice(parts, where, a, b) for a, b in pairwise(cuts)]


def _best_cut(level: np.ndarray, start: int, fit: int) -> int | None:
    """The cut in ``(start, fit]``: the best level in the window's second half, else any cut, latest first."""
    window = level[start + 1:fit + 1]
    half = (fit - start) // 2
    for lv in range(_NO_CUT):
        hits = np.flatnonzero(window[half:] == lv)
        if hits.size:
            return start + 1 + half + int(hits[-1])
    hits = np.flatnonzero(window < _NO_CUT)
    return start + 1 + int(hits[-1]) if hits.size else None


def _text_levels(text: str, offsets: np.ndarray) -> np.ndarray:
    """Cut level before each token of a text: 1 paragraph, 2 line, 3 sentence, 4 word, else never."""
    out = np.full(len(offsets), _NO_CUT, np.int64)
    for t in range(1, len(offsets)):
        s, e = int(offsets[t, 0]), int(offsets[t, 1])
        piece = text[s:e]
        lead = len(piece) - len(piece.lstrip())
        if lead == len(piece) or not (lead or (s > 0 and text[s - 1].isspace())):
            continue  # whitespace only, or inside a word
        q = s + lead
        r = q
        while r > 0 and text[r - 1].isspace():
            r -= 1
        run = text[r:q]
        before = text[:r].rstrip(_CLOSERS)[-1:]
        out[t] = 1 if run.count("\n") >= 2 else 2 if "\n" in run else 3 if before and before in _SENTENCE_END else 4
    return out


def _slice(parts: list[_Part], where: list[tuple[int, int]], a: int, b: int) -> list[_Part]:
    """Atoms ``[a, b)`` as parts (a text part cut at its token index)."""
    out: list[_Part] = []
    last = where[b - 1]
    for pi in range(where[a][0], last[0] + 1):
        p = parts[pi]
        if p.data is not None:
            out.append(p)
            continue
        lo = where[a][1] if pi == where[a][0] else 0
        hi = last[1] + 1 if pi == last[0] else p.ids.size
        out.append(_Part(p.ids[lo:hi], p.target))
    return out
