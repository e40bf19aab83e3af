"""What is trained, as text (``wdspack show``): packed samples decoded with the dataset's tokenizer.

Each pack gets a header, each sample in it a header; the tokens of a sample are decoded in runs, a
run of trained tokens (``loss_mask`` 1: the labels) marked, a run of image placeholders collapsed::

    == pack 0  (train-000000.tar, 3 samples, 1890 of 2048 tokens, 2 images)
    -- sample 1/3  llava.jsonl:17  (412 tokens, 96 trained, 1 image)
    <s>[INST]<image×64>What is in the picture?[/INST][[A red square.</s>]]

Marks: colour on a terminal, ``[[…]]`` elsewhere (``color="never"``), or any pair given.
"""

from __future__ import annotations

import itertools
import os
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from functools import cache, lru_cache
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..format.dataset import open_dataset
from ..format.manifest import Manifest
from ..format.pack import Pack, decode_pack
from ..media import KINDS, MediaKind

__all__ = ["COLOR", "PLAIN", "load_tokenizer", "render_tokens", "show_lines"]

#: the plain marks around trained text (no colour)
PLAIN = ("[[", "]]")
#: ANSI bold green around trained text, on a terminal
COLOR = ("\x1b[1;32m", "\x1b[0m")


def render_tokens(tokenizer: Any, input_ids: Any, loss_mask: Any, *,
                  token_ids: Mapping[str, int | None] | None = None,
                  media_tokens: Mapping[str, Sequence[int]] | None = None, marks: tuple[str, str] = PLAIN,
                  **by_kind: Any) -> str:
    """One sample's tokens as text: trained runs between ``marks``, each medium's placeholders as
    ``<{kind}×N>`` (an image's as ``<image×N>``, a video's as ``<video×N>``).

    ``token_ids``: each kind's placeholder token id (``{"image": 10}``). ``media_tokens``: per kind, the
    placeholder count of each of the sample's items, in order (the pack has them), so that adjacent items read
    as one marker each; without them a run is one marker. A kind's also read by their first names,
    ``{kind}_token_id=`` and ``{kind}_tokens=`` (``image_token_id=10``).

    Example:
        >>> render_tokens(tok, [1, 10, 10, 5, 6], [0, 0, 0, 0, 1], token_ids={"image": 10})  # doctest: +SKIP
        '<s><image×2>Hi[[!]]'
    """
    token_ids, media_tokens = dict(token_ids or {}), dict(media_tokens or {})
    for key, value in by_kind.items():  # the first spellings: image_token_id=, image_tokens=, video_...
        name = key.removesuffix("_token_id").removesuffix("_tokens")
        if name not in {kind.name for kind in KINDS} or key not in (f"{name}_token_id", f"{name}_tokens"):
            raise TypeError(f"render_tokens() got an unexpected keyword argument {key!r}")
        (token_ids if key.endswith("_token_id") else media_tokens)[name] = value
    ids = np.asarray(input_ids).tolist()
    mask = np.asarray(loss_mask).astype(bool).tolist()
    named: dict[int, list[str]] = {}
    for name, token_id in (token_ids or {}).items():
        if token_id is not None:
            named.setdefault(token_id, []).append(name)
    counts = {name: [int(n) for n in (media_tokens or {}).get(name, ())] for names in named.values() for name in names}
    labels = [named[t][0] if t in named else "" for t in ids]
    for token_id, names in named.items():  # one id for two kinds (InternVL's image tiles and video frames)
        if len(names) > 1:
            _label_shared(labels, ids, token_id, {name: list(counts[name]) for name in names})
    out: list[str] = []
    for (trained, media), run in itertools.groupby(zip(ids, mask, labels), key=lambda x: (x[1], x[2])):
        tokens = [t for t, _, _ in run]
        text = _markers(len(tokens), counts[media], media) if media else tokenizer.decode(tokens)
        out.append(f"{marks[0]}{text}{marks[1]}" if trained else text)
    return "".join(out)


def _label_shared(labels: list[str], ids: list[int], token_id: int, items: dict[str, list[int]]) -> None:
    """The kind of each run of ``token_id``, where several kinds fill it: the runs split into consecutive groups,
    each group one item (its tokens its count), the kinds' items in their order; the first such split in the kinds'
    order (none: every run keeps the first kind's label)."""
    runs: list[tuple[int, int]] = []  # (start, length)
    for k, t in enumerate(ids):
        if t == token_id:
            if runs and runs[-1][0] + runs[-1][1] == k:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((k, 1))
    names = list(items)

    @cache
    def split(r: int, taken: tuple[int, ...]) -> tuple[str, ...] | None:
        if r == len(runs):
            return () if all(t == len(items[n]) for t, n in zip(taken, names)) else None
        for j, name in enumerate(names):
            if taken[j] == len(items[name]):
                continue
            want, end, got = items[name][taken[j]], r, 0
            while end < len(runs) and got < want:
                got, end = got + runs[end][1], end + 1
            rest = split(end, taken[:j] + (taken[j] + 1,) + taken[j + 1:]) if got == want else None
            if rest is not None:
                return (name,) * (end - r) + rest
        return None

    found = split(0, (0,) * len(names))
    for (start, length), name in zip(runs, found or ()):
        labels[start:start + length] = [name] * length


def _markers(n: int, counts: list[int], what: str = "image") -> str:
    """``n`` placeholder tokens as one ``<{what}×k>`` per item (``<image×k>``), taking the items' counts from
    ``counts``; a run that is part of an item (its tokens split by other tokens: MiniCPM-V's slices, Qwen3-VL's
    timestamps) is shown as it is and taken off the item's count, so the next item's run reads as its own."""
    parts = []
    while counts and 0 < counts[0] <= n:
        k = counts.pop(0)
        parts.append(f"<{what}×{k}>")
        n -= k
    if n and counts and counts[0] > n:
        counts[0] -= n
    return "".join(parts) + (f"<{what}×{n}>" if n or not parts else "")


def _token_id(manifest: Manifest, kind: MediaKind) -> int | None:
    """The placeholder token id of ``kind`` as the manifest records it: the tokenizer's ``{name}_token_id``
    (images), else the image policy's part for the kind (``image_policy["video"]["token_id"]``)."""
    key = f"{kind.name}_token_id"
    if key in manifest.tokenizer:
        return manifest.tokenizer[key]
    return (manifest.image_policy.get(kind.name) or {}).get("token_id")


def load_tokenizer(manifest: Manifest, tokenizer: str | os.PathLike[str] | None = None) -> Any:
    """The tokenizer to decode with: ``tokenizer`` if given, else the one the manifest names, offline.

    Raises:
        ConfigError: it does not load, or its vocabulary is not the dataset's (one line, with the fix).
    """
    recorded = manifest.tokenizer.get("name")
    name = os.fspath(tokenizer) if tokenizer is not None else recorded
    try:
        tok = _load(name)
    except Exception as e:  # transformers raises OSError/ValueError/...: one line, with the fix
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        if tokenizer is not None:
            raise ConfigError(f"cannot load --tokenizer {name!r} ({reason}); give the folder of the tokenizer "
                              "the dataset was packed with") from None
        raise ConfigError(f"cannot load the tokenizer the manifest names, {name!r}, offline ({reason}); pass "
                          "--tokenizer PATH, a local folder of the same tokenizer") from None
    vocab = manifest.tokenizer.get("vocab_size")
    if vocab is not None and len(tok) != vocab:
        raise ConfigError(f"tokenizer {name!r} has {len(tok)} tokens, the dataset was packed with {vocab} "
                          f"({recorded!r}); pass --tokenizer PATH with that one")
    return tok


@lru_cache(maxsize=2)
def _load(name: str | None) -> Any:
    """A tokenizer by folder or cached Hub name, once per process."""
    from transformers import AutoTokenizer

    if not name:
        raise ValueError("the manifest names no tokenizer")
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1  # a Hub id is ORG/NAME or NAME
    if looks_local and not os.path.isdir(os.path.expanduser(name)):
        raise FileNotFoundError("no such folder")
    return AutoTokenizer.from_pretrained(os.path.expanduser(name))


def _iter_packs(manifest: Manifest, root: str, start: int) -> Iterator[tuple[int, str, Pack]]:
    """``(pack number, shard name, pack)`` from pack ``start`` on; shards before it are not opened."""
    import fsspec

    first = 0
    for shard in manifest.shards:
        if first + shard.packs <= start:
            first += shard.packs
            continue
        with fsspec.open(f"{root}/{shard.name}", "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
            k = first
            for member in tar:
                if not (member.isfile() and member.name.endswith(".mp")):
                    continue
                if k >= start:
                    data = tar.extractfile(member)
                    assert data is not None  # a regular file
                    yield k, shard.name, decode_pack(data.read())
                k += 1
        first += shard.packs


def _elide(text: str, max_chars: int, marks: tuple[str, str] = ("", "")) -> str:
    """``text`` with its middle elided; a trained run cut by the elision is closed before it and
    reopened after it, so each visible piece reads as marked."""
    if not max_chars or len(text) <= max_chars:
        return text
    half = max_chars // 2
    head, tail = text[:half], text[len(text) - half:]
    start, end = marks
    if start and end:
        if head.rfind(start) > head.rfind(end):  # the head ends inside a trained run
            head += end
        if tail.find(end) != -1 and (tail.find(start) == -1 or tail.find(end) < tail.find(start)):
            tail = start + tail  # the tail begins inside one
    return f"{head} … ({len(text) - 2 * half} characters) … {tail}"


def show_lines(source: str, *, packs: int = 1, pack: int = 0, tokenizer: str | os.PathLike[str] | None = None,
               marks: tuple[str, str] = PLAIN, max_chars: int = 0, samples: int = 0) -> Iterator[str]:
    """Lines of text for ``packs`` packs from pack number ``pack`` on (manifest order) of ``source``.

    Args:
        source: a dataset folder, ``https://`` or ``hf://`` URL (as ``inspect`` takes).
        tokenizer: decode with this tokenizer instead of the one the manifest names.
        marks: the text before and after each trained run (:data:`PLAIN`, or colour codes).
        max_chars: show at most this many characters of a sample, the middle elided (0: all).
        samples: show at most this many samples of a pack (0: all).

    Example:
        >>> print("\\n".join(show_lines("packed/", packs=1)))  # doctest: +SKIP
    """
    for flag, value, least in (("--packs", packs, 1), ("--pack", pack, 0), ("--max-chars", max_chars, 0),
                               ("--samples", samples, 0)):
        if value < least:
            raise ConfigError(f"{flag} {value}: must be >= {least}")
    manifest, root = open_dataset(source)
    total = sum(s.packs for s in manifest.shards)
    if pack >= total:
        raise ConfigError(f"--pack {pack}: {source} has {total} packs (0 to {total - 1})")
    tok = load_tokenizer(manifest, tokenizer)
    token_ids = {kind.name: _token_id(manifest, kind) for kind in KINDS}
    for k, shard, p in itertools.islice(_iter_packs(manifest, root, pack), packs):
        held = ", ".join(f"{p.count(kind.name)} {kind.plural}" for kind in KINDS
                         if kind.always_stored or p.count(kind.name))
        yield (f"== pack {k}  ({shard}, {p.num_samples} samples, {p.num_tokens} of {manifest.seq_len} tokens, "
               f"{held})")
        bounds = [0, *itertools.accumulate(p.seq_lens)]
        for j, sid in enumerate(p.sample_ids):
            if samples and j == samples:
                yield f"-- ({p.num_samples - samples} more samples; --samples 0 shows them all)"
                break
            span = slice(bounds[j], bounds[j + 1])
            ids, mask = p.input_ids[span], p.loss_mask[span]
            owned = {name: [int(n) for n, owner in zip(items.tokens, items.sample) if owner == j]
                     for name, items in p.media.items()}
            held = ", ".join(f"{len(owned[kind.name])} {kind.name if len(owned[kind.name]) == 1 else kind.plural}"
                             for kind in KINDS if kind.always_stored or owned[kind.name])
            yield (f"-- sample {j + 1}/{p.num_samples}  {sid}  ({bounds[j + 1] - bounds[j]} tokens, "
                   f"{int(np.asarray(mask).sum())} trained, {held})")
            text = render_tokens(tok, ids, mask, token_ids=token_ids, media_tokens=owned, marks=marks)
            shown = _elide(text, max_chars, marks)
            yield shown + (COLOR[1] if shown != text and marks == COLOR else "")  # no colour left open
