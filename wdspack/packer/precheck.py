"""What a tokenizer or processor folder tells from its files, read before anything loads.

    --tokenizer / --processor  ──► its folder (a local one, or the cached snapshot of a name)
        │ tokenizer_config.json, tokenizer.json / tekken.json / vocab.json, chat_template.*
        ├─► chat records, no --chat-template, and no template in the folder? ──► one line
        └─► fixed image tokens: the image token not in the vocabulary?       ──► one line
    where the files do not tell (no folder, a format not read here), the load decides as before

A mistake answered in about a second instead of after the 10–20 s a tokenizer or processor takes
to load; the builder (:mod:`.samples`) still checks the same things on what it loaded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .loading import NO_IMAGE_TOKEN, not_one_token

__all__ = ["model_folder", "precheck"]

_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "tekken.json")


def precheck(config: Any, first_is_chat: Callable[[], bool]) -> None:
    """Refuse, from the files alone, a job whose tokenizer or processor cannot do what it is asked.

    Args:
        config: the job's :class:`~wdspack.packer.samples.SampleConfig`.
        first_is_chat: whether the data's first record is a chat (read only when the folder has no
            chat template: captions and documents need none).
    """
    spec = config.processor if config.processor is not None else config.tokenizer
    if not isinstance(spec, (str, os.PathLike)):
        return  # an object: it is already loaded
    folder = model_folder(os.fspath(spec))
    if folder is None or not any((folder / f).is_file() for f in _TOKENIZER_FILES):
        return
    flag = "--processor" if config.processor is not None else "--tokenizer"
    if config.chat_template is None and not _has_template(folder) and first_is_chat():
        raise ConfigError(f"{flag} {os.fspath(spec)!r} has no chat template (none in {folder}), which chat records "
                          "need; pass --chat-template FILE")
    if config.processor is None and config.tokens_per_image is not None:
        _check_image_token(folder, config.image_token, os.fspath(spec))


def model_folder(name: str) -> Path | None:
    """The folder ``name`` loads from: itself, or the snapshot of a cached Hub name (None: unknown)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    import huggingface_hub.constants as hf

    repo = Path(hf.HF_HUB_CACHE) / f"models--{name.replace('/', '--')}"
    ref = repo / "refs" / "main"
    if ref.is_file():
        snapshot = repo / "snapshots" / ref.read_text().strip()
        return snapshot if snapshot.is_dir() else None
    return None


def _has_template(folder: Path) -> bool:
    if any((folder / f).is_file() for f in _TEMPLATE_FILES) or (folder / "additional_chat_templates").is_dir():
        return True
    return any(_json(folder / f).get("chat_template") for f in ("tokenizer_config.json", "processor_config.json"))


def _check_image_token(folder: Path, given: str | None, name: str) -> None:
    vocab = _vocabulary(folder)
    if vocab is None:
        return
    config = _json(folder / "tokenizer_config.json")
    if given is not None:
        if given not in vocab:
            raise not_one_token(given, name)
        return
    from ..models import IMAGE_TOKEN_GUESSES

    extra = config.get("extra_special_tokens")
    declared = [config.get("image_token"), extra.get("image_token") if isinstance(extra, dict) else None]
    if any(isinstance(t, str) for t in declared) or any(g in vocab for g in IMAGE_TOKEN_GUESSES):
        return
    raise ConfigError(NO_IMAGE_TOKEN)


def _vocabulary(folder: Path) -> set[str] | None:
    """Every token string the folder's files name (None when no vocabulary file is read here)."""
    tokens: set[str] = set()
    known = False
    fast = _json(folder / "tokenizer.json")
    if fast:
        known = True
        vocab = (fast.get("model") or {}).get("vocab")
        if isinstance(vocab, dict):
            tokens.update(vocab)
        elif isinstance(vocab, list):  # Unigram: [piece, score] pairs
            tokens.update(str(v[0]) for v in vocab if v)
        tokens.update(t.get("content", "") for t in fast.get("added_tokens") or ())
    tekken = _json(folder / "tekken.json")
    if tekken.get("special_tokens"):  # v7+; earlier files leave the special tokens' names to the code
        known = True
        for entry in [*tekken["special_tokens"], *(tekken.get("vocab") or ())]:
            if isinstance(entry, dict) and entry.get("token_str"):
                tokens.add(entry["token_str"])
    slow = _json(folder / "vocab.json")
    if slow:
        known = True
        tokens.update(slow)
    tokens.update(_json(folder / "added_tokens.json"))
    decoder = _json(folder / "tokenizer_config.json").get("added_tokens_decoder") or {}
    tokens.update(t.get("content", "") for t in decoder.values() if isinstance(t, dict))
    return tokens if known else None


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
