"""The pack job's shortcuts around transformers render and tokenize exactly what the public calls do.

``ChatRenderer`` calls the compiled chat template directly and ``TextEncoder`` the ``tokenizers``
backend (wdspack.packer.fastpath): over every chat template the project ships (the examples' and the
tiny model families') and conversations of every shape the builder renders, the text is the one
``apply_chat_template(..., tokenize=False)`` gives, character for character, and the ids and
offsets the ones ``tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)`` gives.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from wdspack.packer.fastpath import ChatRenderer, TextEncoder, span_mask

ROOT = Path(__file__).resolve().parents[2]


def _templates() -> dict[str, str]:
    from tests.support.templates import MISTRAL_NEMO_TEMPLATE, QWEN25_TEMPLATE
    from tiny_vlm import gemma3, llava, qwen2_5_vl, qwen3_vl, smolvlm

    folder = ROOT / "examples" / "chat_templates"
    out = {p.stem: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.jinja"))}
    out.update({"qwen2.5": QWEN25_TEMPLATE, "mistral_nemo_tools": MISTRAL_NEMO_TEMPLATE,
                "llava": llava.LLAVA_TEMPLATE, "onevision": llava.ONEVISION_TEMPLATE, "qwen2_5_vl": qwen2_5_vl.TEMPLATE,
                "qwen3_vl": qwen3_vl.TEMPLATE, "gemma3": gemma3.TEMPLATE, "smolvlm": smolvlm.SMOLVLM_TEMPLATE})
    return out


TEMPLATES = _templates()


def _conversations(typed: bool) -> list[list[dict]]:
    def msg(role: str, text: str, image: bool = False) -> dict:
        if typed:
            return {"role": role, "content": ([{"type": "image"}] if image else []) + [{"type": "text", "text": text}]}
        return {"role": role, "content": ("[IMG]\n" if image else "") + text}

    chat = [msg("user", "What is in the picture?", image=True), msg("assistant", "A grey cat on a mat."),
            msg("user", "  And its colour?  "), msg("assistant", "Grey,\nwith white paws. "),
            msg("user", "Thanks [/INST] <|im_end|>"), msg("assistant", "")]
    system = msg("system", "You are a careful assistant.")
    return [chat[:2], chat[:4], chat, [system, *chat[:2]], [system, *chat], [chat[0]]]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("typed", [False, True])
def test_renderer_matches_apply_chat_template(tekken, name, typed):
    render = ChatRenderer(tekken, TEMPLATES[name])
    assert render._compiled is not None, "the compiled-template shortcut is off: the test would compare nothing"
    compared = 0
    for messages in _conversations(typed):
        for generation_prompt in (False, True):
            try:
                want = tekken.apply_chat_template(messages, chat_template=TEMPLATES[name], tokenize=False,
                                                  add_generation_prompt=generation_prompt)
            except Exception as e:  # a template that refuses a shape refuses it through the shortcut too
                with pytest.raises(type(e)):
                    render(messages, generation_prompt=generation_prompt)
                continue
            assert render(messages, generation_prompt=generation_prompt) == want
            compared += 1
    assert render._compiled is not None  # its self-check on first use agreed
    # every template renders some shapes (Mistral's refuse a system turn, an empty answer); these three take
    # string content only (the builder hands them strings), and the shortcut raised where they do
    assert compared >= 2 or (typed and name in {"mistral_nemo", "mistral_nemo_tools", "qwen2.5"})


def test_renderer_leaves_other_messages_to_transformers(tekken):
    """Tools, tool calls and reasoning fields take the public call (it rewrites them first)."""
    from tests.support.templates import QWEN25_TEMPLATE, WEATHER_TOOL

    render = ChatRenderer(tekken, QWEN25_TEMPLATE)
    render._checked = True  # its first-use check would compare with the replaced public call
    calls = []
    render.public = lambda messages, **kw: calls.append(kw) or "public"  # type: ignore[method-assign]
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    assert render([{"role": "user", "content": "Hi"}], generation_prompt=True, tools=[WEATHER_TOOL]) == "public"
    assert render([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "", "tool_calls": [call]}],
                  generation_prompt=False) == "public"
    assert render([{"role": "assistant", "content": "x", "reasoning_content": "y"}],
                  generation_prompt=False) == "public"
    assert len(calls) == 3
    assert render([{"role": "user", "content": "Hi"}], generation_prompt=True) != "public"


def test_renderer_turns_itself_off_when_it_disagrees(tekken):
    """A shortcut that renders differently (here: special tokens it was handed wrong) is dropped on first use."""
    template = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"
    render = ChatRenderer(tekken, template)
    render._variables = {**render._variables, "bos_token": "<wrong>"}
    messages = [{"role": "user", "content": "Hi"}]
    want = tekken.apply_chat_template(messages, chat_template=template, tokenize=False)
    assert render(messages, generation_prompt=False) == want
    assert render._compiled is None


@pytest.mark.parametrize("which", ["tekken", "nemo"])
def test_encoder_matches_the_tokenizer(tekken, nemo_dir, which):
    tok = tekken if which == "tekken" else AutoTokenizer.from_pretrained(str(nemo_dir))
    encode = TextEncoder(tok)
    assert encode._backend is not None
    render = ChatRenderer(tok, TEMPLATES["pixtral"])
    texts = [render(m, generation_prompt=False) for m in _conversations(False)]
    texts += ["", " ", "héllo wörld — ünïcode 🐈 cats", "[IMG][IMG] two images", "a\n\n\tb  c"]
    for text in texts:
        ids, offsets = encode(text)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        assert ids.tolist() == enc["input_ids"]
        assert offsets.reshape(-1, 2).tolist() == [list(p) for p in enc["offset_mapping"]]
        assert ids.dtype == offsets.dtype == np.int64 and offsets.shape == (ids.size, 2)
    assert encode._backend is not None


def test_encoder_uses_the_public_call_where_the_tokenizer_truncates(tekken):
    tok = copy.deepcopy(tekken)  # its backend is changed below
    tok._tokenizer.enable_truncation(max_length=3)
    try:
        assert TextEncoder(tok)._backend is None
    finally:
        tok._tokenizer.no_truncation()


def test_span_mask_is_the_per_span_rule():
    """The vectorised mask equals the per-span comparison it replaced, on random tokens and spans."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        cuts = np.sort(rng.choice(np.arange(1, 200), size=int(rng.integers(1, 60)), replace=False))
        starts = np.concatenate([[0], cuts])
        ends = np.concatenate([cuts, [200]])
        ends = np.where(rng.random(ends.size) < 0.1, starts, ends)  # some empty tokens
        offsets = np.stack([starts, ends], 1)
        edges = np.sort(rng.choice(np.arange(0, 201), size=2 * int(rng.integers(0, 5)), replace=False))
        spans = [(int(a), int(b)) for a, b in edges.reshape(-1, 2)]
        want = np.zeros(len(offsets), np.uint8)
        for a, b in spans:
            want[(offsets[:, 0] >= a) & (offsets[:, 1] <= b) & (offsets[:, 1] > offsets[:, 0])] = 1
        assert np.array_equal(span_mask(offsets, spans), want)


def test_build_chats_is_build_one_by_one(demo_data, sample_config):
    """The staged batch (the pack job's measure stage) gives each record's sample or drop exactly as
    ``build`` does, in its place, good records mixed with every kind of bad one."""
    from dataclasses import replace

    from wdspack.errors import SampleError
    from wdspack.packer.samples import get_builder
    from wdspack.packer.sources import list_partitions
    from wdspack.packer.sources.readers import iter_records

    parts = list_partitions([str(demo_data / "llava.jsonl"), str(demo_data / "messages.jsonl")],
                            records_per_partition=10**9)
    records = [r for p in parts for r in iter_records(p) if not isinstance(r, Exception) and hasattr(r, "images")]
    with_image = next(r for r in records if r.images)
    user_only = tuple(m for m in with_image.messages if m["role"] != "assistant")
    bad = [replace(with_image, sample_id="corrupt", images=(with_image.images[0][:200],)),
           replace(with_image, sample_id="extra-image", images=with_image.images * 2),
           replace(with_image, sample_id="no-answer", messages=user_only),
           replace(with_image, sample_id="empty", messages=())]
    batch = records[:40] + bad + records[40:80]
    builder = get_builder(sample_config)

    def one(record):
        try:
            return builder.build(record)
        except SampleError as e:
            return e

    def same(a, b) -> bool:
        if isinstance(a, SampleError) or isinstance(b, SampleError):
            return type(a) is type(b) and (a.reason, str(a)) == (b.reason, str(b))
        return (a.sample_id == b.sample_id and np.array_equal(a.input_ids, b.input_ids)
                and np.array_equal(a.loss_mask, b.loss_mask) and a.images == b.images
                and a.image_tokens == b.image_tokens)

    staged, alone = builder.build_chats(batch), [one(r) for r in batch]
    assert len(staged) == len(batch)
    assert all(same(a, b) for a, b in zip(staged, alone))
    reasons = [e.reason for e in staged if isinstance(e, SampleError)]
    assert {"unreadable_image", "placeholder_mismatch", "no_assistant_turn", "empty_conversation"} <= set(reasons)
    assert sum(not isinstance(s, SampleError) for s in staged) >= 70
