"""The fast byte-level BPE (wdspack.packer.bpe) gives ``Tokenizer.encode``'s ids and offsets, token for token.

Over the real tekken tokenizer (every block of the Basic Multilingual Plane, emoji, text in many
scripts), the tiny families' tokenizer (tekken plus their special tokens) and two built here in the
shapes of GPT-2 (``ByteLevel(use_regex=True)``) and Qwen2 (NFC, a split pattern, added tokens cut
before and after normalising); what it cannot follow it leaves to the backend.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import pytest
import regex
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers.trainers import BpeTrainer

from wdspack.packer.bpe import BLOCK, GPT2_PATTERN, ByteLevelBPE, ascii_pattern
from wdspack.packer.fastpath import TextEncoder

ROOT = Path(__file__).resolve().parents[2]
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
WORDS = ("Hello world — “quoted” ’tis naïve café Ünïcödé 日本語のテキスト 中文字符 한국어 Ελληνικά русский язык עברית "
         "العربية हिन्दी ไทย 🙂 👍🏽 👨‍👩‍👧 e\u0301 a\u0308\u0323 \u00a0 \u2028 \u200b ﬁ Å Å ½ ² ₿ € 12345 3.14 don't "
         "I'M <b>bold</b> def f():\n\treturn 1 {\"k\": [1, 2]} C:\\path\\to \x00 \x1c \x7f").split(" ")
SEPARATORS = ("", " ", "  ", "\n", "\n\n", "\t", " \n ", "\r\n")


def _texts(specials: list[str], n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 40)):
            r = rng.random()
            word = rng.choice(specials) if r < 0.1 and specials else (
                chr(rng.randint(0x20, 0x2FFF)) if r < 0.2 else rng.choice(WORDS))
            parts.append(word + rng.choice(SEPARATORS))
        out.append("".join(parts))
    return out


def _same(fast: ByteLevelBPE, backend: Tokenizer, text: str) -> bool:
    ids, offsets = fast(text)
    want = backend.encode(text, add_special_tokens=False)
    return ids.tolist() == want.ids and offsets.tolist() == [list(o) for o in want.offsets]


def _corpus() -> list[str]:
    return _texts([], 300, seed=1) + ["the quick brown fox jumps over the lazy dog " * 20]


def _gpt2() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_corpus(), BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                  show_progress=False))
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def _qwen2() -> Tokenizer:
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_corpus(), BpeTrainer(vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                  show_progress=False))
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>", "<|image_pad|>"])
    tok.add_tokens([AddedToken("Ünï", normalized=True), AddedToken("quick brown", normalized=False)])
    return tok


@pytest.fixture(scope="module")
def backends(tekken, tmp_path_factory) -> dict[str, Tokenizer]:
    from tiny_vlm import qwen2_5_vl

    family = qwen2_5_vl.processor(tmp_path_factory.mktemp("qwen-tok")).tokenizer
    return {"tekken": tekken._tokenizer, "tekken+qwen2.5-vl tokens": family._tokenizer, "gpt2-shaped": _gpt2(),
            "qwen2-shaped": _qwen2()}


@pytest.mark.parametrize("name", ["tekken", "tekken+qwen2.5-vl tokens", "gpt2-shaped", "qwen2-shaped"])
def test_equal_to_the_backend_on_text_in_many_scripts(backends, name):
    backend = backends[name]
    fast = ByteLevelBPE.from_backend(backend)
    assert fast is not None, f"{name}: the fast path is off, the test would compare nothing"
    specials = [t.content for t in backend.get_added_tokens_decoder().values()][:40]
    texts = _texts(specials, 400)
    assert [t for t in texts if not _same(fast, backend, t)] == []
    assert len(fast._checked) > 20  # blocks beyond ASCII were checked and encoded here, not left to the backend
    assert len(fast._refused) < 0.02 * BLOCK * len(fast._checked)


def test_equal_to_the_backend_on_every_code_point_of_the_bmp_and_emoji(backends):
    """Each block: its code points in random runs among ASCII words, spaces, digits and punctuation."""
    backend = backends["tekken"]
    fast = ByteLevelBPE.from_backend(backend)
    rng = random.Random(2)
    blocks = [*range(0x10000 // BLOCK), *range(0x1F300 // BLOCK, 0x1FB00 // BLOCK)]
    wrong = []
    for block in blocks:
        points = [c for c in range(block * BLOCK, block * BLOCK + BLOCK) if not 0xD800 <= c < 0xE000]
        if not points:
            continue
        rng.shuffle(points)
        parts = ["".join(map(chr, points[i:i + rng.randint(1, 4)])) + rng.choice([" ", "a", "1", "!", "\n", "", "ab "])
                 for i in range(0, len(points), 3)]
        text = "".join(parts)
        if not _same(fast, backend, text):
            wrong.append(hex(block * BLOCK))
    assert wrong == []
    ours = sum(1 for b in blocks for c in range(b * BLOCK, b * BLOCK + BLOCK)
               if b in fast._checked and c not in fast._refused)
    assert ours > 0.9 * len(blocks) * BLOCK  # the engines agree on almost all of it: the fast path was taken


def test_a_code_point_the_engines_disagree_on_goes_to_the_backend(backends, monkeypatch):
    backend = backends["tekken"]
    fast = ByteLevelBPE.from_backend(backend)
    alike = fast._alike
    monkeypatch.setattr(fast, "_alike", lambda points: "é" not in map(chr, points) and alike(points))
    calls = []
    theirs = fast._theirs_segment
    monkeypatch.setattr(fast, "_theirs_segment", lambda segment, *a: (calls.append(segment), theirs(segment, *a)))
    text = "[INST]Un café, s'il vous plaît[/INST]Voilà: café crème</s>"
    assert _same(fast, backend, text)
    assert ord("é") in fast._refused and ord("à") not in fast._refused
    assert calls == ["Un café, s'il vous plaît", "Voilà: café crème"]  # the segments with é; none without
    assert _same(fast, backend, "[INST]Voilà[/INST]") and len(calls) == 2


def test_shapes_it_does_not_follow_get_no_fast_path():
    metaspace = Tokenizer(models.BPE())
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace()
    metaspace.train_from_iterator(_corpus(), BpeTrainer(vocab_size=300, show_progress=False))
    trimmed = _gpt2()
    trimmed.post_processor = processors.ByteLevel(trim_offsets=True)
    stripped = _gpt2()
    stripped.add_tokens([AddedToken("<mask>", lstrip=True)])
    lowercase = _qwen2()
    lowercase.normalizer = normalizers.Lowercase()
    for tok in (metaspace, trimmed, stripped, lowercase):
        assert ByteLevelBPE.from_backend(tok) is None
    assert ByteLevelBPE.from_backend(_gpt2()) is not None


@pytest.mark.parametrize("pattern", [GPT2_PATTERN, QWEN2_PATTERN, "tekken"])
def test_the_ascii_pattern_splits_as_the_unicode_one(tekken, pattern):
    if pattern == "tekken":
        import json

        pattern = json.loads(tekken._tokenizer.pre_tokenizer.__getstate__())["pretokenizers"][0]["pattern"]["Regex"]
    fast, whole = ascii_pattern(pattern), regex.compile(pattern)
    assert fast is not None
    rng = np.random.default_rng(3)
    text = "".join(map(chr, rng.integers(0, 128, 50_000)))
    text += "".join(map(chr, rng.choice([9, 10, 13, 32, 32, 39, 65, 97, 108, 115, 49], 50_000)))
    import re

    assert re.compile(fast).findall(text) == whole.findall(text)
    assert ascii_pattern(r"\X+|a") is None  # a class re does not have: no ASCII pattern


def test_text_encoder_takes_it_and_checks_its_first_texts(tekken, caplog):
    enc = TextEncoder(tekken)
    assert enc._fast is not None
    text = "[INST]What is in the picture?[/INST]A grey cat.</s>"
    ids, offsets = enc(text)
    ref = tekken(text, add_special_tokens=False, return_offsets_mapping=True)
    assert ids.tolist() == ref["input_ids"] and offsets.tolist() == [list(o) for o in ref["offset_mapping"]]

    wrong = TextEncoder(tekken)
    real = wrong._fast
    wrong._fast = lambda t: (real(t)[0] + 1, real(t)[1])  # a fast path gone wrong
    with caplog.at_level(logging.WARNING, logger="wdspack.packer.fastpath"):
        ids, _ = wrong(text)
    assert ids.tolist() == ref["input_ids"] and wrong._fast is None
    assert "encodes differently from the tokenizer" in caplog.text


def test_text_encoder_with_special_tokens_added(tekken, monkeypatch):
    """Where the post-processor adds tokens (a BOS), ``add_special_tokens=True`` takes the public call;
    where it adds none (tekken's), the fast path, with the same result."""
    from transformers import PreTrainedTokenizerFast

    text = "<|im_start|>Hello wörld<|im_end|>"
    backend = _qwen2()
    backend.post_processor = processors.TemplateProcessing(single="<|im_start|> $A", special_tokens=[
        ("<|im_start|>", backend.token_to_id("<|im_start|>"))])
    bos = PreTrainedTokenizerFast(tokenizer_object=backend)
    for tok, adds in ((bos, True), (tekken, False)):
        enc = TextEncoder(tok)
        assert enc._fast is not None and enc._adds is adds
        calls: list[str] = []
        monkeypatch.setattr(enc, "_fast", lambda t, real=enc._fast, seen=calls: (seen.append(t), real(t))[1])
        enc._checks = 0
        ids, offsets = enc(text, add_special_tokens=True)
        ref = tok(text, add_special_tokens=True, return_offsets_mapping=True)
        assert ids.tolist() == ref["input_ids"] and offsets.tolist() == [list(o) for o in ref["offset_mapping"]]
        assert calls == ([] if adds else [text])
    with_bos, without = TextEncoder(bos)(text, add_special_tokens=True)[0], TextEncoder(bos)(text)[0]
    assert with_bos.tolist() == [backend.token_to_id("<|im_start|>"), *without.tolist()]  # the BOS, then the text
