"""Real processors and tiny random-init models of each VLM family, built offline.

Nothing here downloads: a real production tokenizer (the Pixtral ``tekken.json`` that
``mistral_common`` ships) is extended with the family's special tokens, the family's real
processor and image-processor classes are built from code (small image sizes, so a CPU test runs in
seconds), and the family's real ``*ForConditionalGeneration`` class is built from a tiny config with
random weights. The chat templates follow the families' published templates.

    from tiny_vlm import build
    processor, model = build("qwen2_5_vl", "/tmp/tok")    # (sys.path holds examples/)

Each family is one module here with ``processor(tokenizer_dir)`` and ``model(processor, seed=0)``.
"""

from __future__ import annotations

import importlib
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["build", "tekken_dir", "tokenizer"]


def tekken_dir(folder: str | Path) -> Path:
    """A tokenizer folder holding mistral_common's Pixtral ``tekken.json`` (made once)."""
    import mistral_common

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "tekken.json").is_file():
        shutil.copyfile(Path(mistral_common.__file__).parent / "data" / "tekken_240911.json", folder / "tekken.json")
    return folder


@lru_cache(maxsize=1)
def _base_tokenizer() -> Any:
    """The tekken tokenizer, loaded once per process (a 131k vocabulary: seconds); every folder that
    :func:`tekken_dir` fills holds the same file, so each family's tokenizer is a copy of this one."""
    import tempfile

    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as folder:
        return AutoTokenizer.from_pretrained(str(tekken_dir(folder)))


def tokenizer(folder: str | Path, special: list[str], **named: str) -> Any:
    """The real tekken tokenizer plus the family's special tokens (``named``: e.g. ``image_token="<image>"``
    registers the attribute the processor reads); a copy of the one made once per process for these tokens."""
    import copy

    tekken_dir(folder)  # the folder a family's tokenizer names, as the caller expects it
    return copy.deepcopy(_extended_tokenizer(tuple(special), tuple(sorted(named.items()))))


@lru_cache(maxsize=8)
def _extended_tokenizer(special: tuple[str, ...], named: tuple[tuple[str, str], ...]) -> Any:
    import copy

    tok = copy.deepcopy(_base_tokenizer())
    vocab = tok.get_vocab()  # a dict of 131k entries, built anew on every call
    extra = [t for t in special if t not in vocab]
    tok.add_special_tokens({"additional_special_tokens": extra}, replace_extra_special_tokens=False)
    for key, value in named:
        setattr(tok, key, value)
    return tok


def build(family: str, tokenizer_folder: str | Path, *, seed: int = 0, **options: Any) -> tuple[Any, Any]:
    """``(processor, model)`` of ``family``: the real classes, tiny sizes, float32 random weights."""
    module = importlib.import_module(f".{family}", __name__)
    processor = module.processor(tokenizer_folder, **options)
    return processor, module.model(processor, seed=seed)
