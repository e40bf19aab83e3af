"""tools/bench_pack_speed.py runs, and the one-render spans are the prefix renderings' spans.

Real parts: the Pixtral and Mistral-Nemo tekken tokenizers, the published Qwen2.5 and Mistral-Nemo
templates and the Pixtral one. Speed is measured by the tool, not asserted here.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.templates import MISTRAL_NEMO_TEMPLATE, QWEN25_TEMPLATE
from wdspack.packer.render import mark_assistant, spans_from_marked
from wdspack.packer.samples import SampleConfig, get_builder

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    return importlib.import_module("tools.bench_pack_speed")


def _conversations(tmp_path: Path, n: int) -> list[list[dict]]:
    """The benchmark's LLaVA records as typed turns, plus system prompts and words with edge spaces."""
    out = []
    for k, line in enumerate(_tool().make_llava(tmp_path / "llava", n).read_text().splitlines()):
        turns = []
        for t in json.loads(line)["conversations"]:
            value = t["value"]
            parts = ([{"type": "image"}, {"type": "text", "text": value[len("<image>"):]}]
                     if value.startswith("<image>") else [{"type": "text", "text": value}])
            turns.append({"role": "user" if t["from"] == "human" else "assistant", "content": parts})
        if k % 3 == 1:
            turns.insert(0, {"role": "system", "content": [{"type": "text", "text": "Answer briefly."}]})
        if k % 5 == 2:  # words a template may strip: the one-render check must notice
            turns[-1]["content"][0]["text"] = "  " + turns[-1]["content"][0]["text"] + "\n"
        out.append(turns)
    return out


@pytest.mark.parametrize("name", ["pixtral", "qwen2.5", "mistral-nemo"])
def test_one_render_spans_are_the_prefix_spans(name, tmp_path, tekken, nemo_dir, pixtral_template):
    template = {"pixtral": pixtral_template, "qwen2.5": QWEN25_TEMPLATE, "mistral-nemo": MISTRAL_NEMO_TEMPLATE}[name]
    builder = get_builder(SampleConfig(str(nemo_dir) if name == "mistral-nemo" else tekken,
                                       chat_template=template, tokens_per_image=4, image_token="[IMG]"))
    fast = once = 0
    for k, raw in enumerate(_conversations(tmp_path, 60)):
        messages = [builder._message(m) for m in raw]
        one = builder._render(messages, f"s{k}")
        assert one == builder._render(messages, f"s{k}", one_render=False), (name, k)
        fast += builder._one.spans(messages, one[0]) is not None
        once += builder._one.once(messages) is not None
    if name != "mistral-nemo":  # prefix-stable: nearly every record takes one rendering
        assert fast >= 48, (name, fast, builder._one._layouts)
    else:  # its system prompt moves into the last user turn: those records take the prefix renderings
        assert builder._one._layouts[True] is None
    # the marked rendering alone serves every record the one-render path serves: these three templates
    # only print the assistant's words (measured: 60, 60 and 40 of 60)
    assert once == fast, (name, once, fast)
    assert builder._one._checks is not None  # the records rendered both ways agreed


def test_a_template_that_looks_at_the_words_renders_them_twice(tekken):
    """Words strip(), compared, tested for a prefix or measured: that record takes the plain rendering
    too; and a template that changes them out of sight (``~`` then a filter) is caught by the first checks."""
    looks = {
        "strip": "{{ m.content | trim }}",
        "compare": "{% if m.content == 'x' %}X{% endif %}{{ m.content }}",
        "truth": "{% if m.content %}{{ m.content }}{% endif %}",
        "search": "{% if '<think>' in m.content %}T{% endif %}{{ m.content }}",
        "split": "{{ m.content.split('</think>')[-1] }}",
        "length": "{{ m.content }}{{ m.content | length }}",
    }
    head = "{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]{% else %}"
    tail = "</s>{% endif %}{% endfor %}"
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "  Hello there  "}]
    for name, words in looks.items():
        builder = get_builder(SampleConfig(tekken, chat_template=head + words + tail, tokens_per_image=4,
                                           image_token="[IMG]"))
        builder._render(chat, "warm-up")  # the renderer checks itself on its first rendering
        assert builder._one.once(chat) is None, name
        assert builder._render(chat, "s") == builder._render(chat, "s", one_render=False), name
    printed = get_builder(SampleConfig(tekken, chat_template=head + "{{ m.content }}" + tail,
                                       tokens_per_image=4, image_token="[IMG]"))
    printed._render(chat, "warm-up")
    assert printed._one.once(chat) == printed._render(chat, "s", one_render=False)
    hidden = get_builder(SampleConfig(tekken, chat_template=head + "{{ ('' ~ m.content) | trim }}" + tail,
                                      tokens_per_image=4, image_token="[IMG]"))
    hidden._render(chat, "warm-up")
    assert hidden._one.once(chat) is None and hidden._one._checks is None  # caught on a first record: off
    assert hidden._render(chat, "s") == hidden._render(chat, "s", one_render=False)


def test_one_render_refuses_what_it_cannot_vouch_for():
    layout = ("", "</s>")
    assert spans_from_marked("[/INST]Yo</s>", "[/INST]\ue001Yo\ue002</s>", layout, 1) == [(7, 13)]
    # the template stripped the words: the text without markers is not the plain rendering
    assert spans_from_marked("[/INST]Yo</s>", "[/INST]\ue001 Yo\ue002</s>", layout, 1) is None
    # the tail is not where the layout puts it; a turn missing; markers out of order
    assert spans_from_marked("[/INST]Yo<eos>", "[/INST]\ue001Yo\ue002<eos>", layout, 1) is None
    assert spans_from_marked("[/INST]Yo</s>", "[/INST]\ue001Yo\ue002</s>", layout, 2) is None
    assert spans_from_marked("[/INST]Yo</s>", "[/INST]\ue002Yo\ue001</s>", layout, 1) is None
    # tool calls and the markers' own characters in a record: no one-render path
    assert mark_assistant([{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}]) is None
    assert mark_assistant([{"role": "user", "content": "a \ue001 b"}]) is None


@pytest.mark.slow  # loads the Pixtral tokenizer and packs twice (~30 s)
def test_bench_quick_reports_sane_ratios(tmp_path):
    out = tmp_path / "bench.json"
    # its own process, as the bench runs: in the suite's process, what earlier tests left (warm caches,
    # threads) can favour one stage; one CI run gave measure 1.83x the floor there (0.8-0.93 alone)
    run = subprocess.run([sys.executable, "-m", "tools.bench_pack_speed", "--quick", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(out.read_text())
    for name in ("chat", "processor", "captions"):
        row = result[name]
        assert row["records"] == 120
        assert row["floor_sps"] > 0 and row["measure_sps"] > 0 and row["pack_sps"] > 0
        # the pack job does the floor's work and more, so it is not much faster than the floor. The median of
        # the rounds' own ratios holds that within 1.5; the best rounds of 120 records (CPU times of 0.1-0.5 s)
        # are each one sample of a host that drifts by tens of percent, so only a gross error fails them
        assert 0 < row["pack_vs_floor_median"] < 1.5 and 0 < row["measure_vs_floor_median"] < 1.5, row
        assert 0 < row["pack_vs_floor"] < 2.5 and 0 < row["measure_vs_floor"] < 2.5, row
    assert 1 <= result["chat"]["rounds_mean"] <= 5
