"""Assistant spans under real chat templates that are not prefix-stable, assistant-first chats,
and templates that end a turn in no special token (issue #19, items 3, 6 and 11).

The records follow LLaMA-Factory's ``data/glaive_toolcall_en_demo.json``: ShareGPT
``conversations`` with ``human`` / ``function_call`` / ``observation`` / ``gpt`` turns and
``tools`` as a JSON string, several user turns per record. Mistral-Nemo's published template
puts ``[AVAILABLE_TOOLS]`` and the system prompt inside the *last* user turn, so rendering the
first turns is not a prefix of rendering them all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.published import round_trip
from tests.support.templates import MISTRAL_NEMO_TEMPLATE, QWEN25_TEMPLATE, TIME_TOOL, WEATHER_TOOL
from wdspack.errors import SampleError
from wdspack.packer.samples import SampleBuilder, SampleConfig, get_builder
from wdspack.packer.sources import Record

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def nemo_config(nemo_dir) -> SampleConfig:
    """Mistral-Nemo-Instruct-2407: its tokenizer (``nemo_dir``) and template."""
    return SampleConfig(tokenizer=str(nemo_dir), chat_template=MISTRAL_NEMO_TEMPLATE, tokens_per_image=4,
                        image_token="[IMG]")


def _glaive_row(k: int, *, system: bool) -> dict:
    """Two user turns, a tool call and its result, two answers (glaive_toolcall_en_demo.json's shape)."""
    row = {"conversations": [
        {"from": "human", "value": f"What is the weather in City{k}?"},
        {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": f"City{k}"}})},
        {"from": "observation", "value": json.dumps({"temperature": 10 + k, "unit": "celsius"})},
        {"from": "gpt", "value": f"It is {10 + k} degrees in City{k}."},
        {"from": "human", "value": f"Thanks! And tomorrow in City{k}?"},
        {"from": "gpt", "value": f"I can only tell the weather now, not tomorrow's ({k})."}],
        "tools": json.dumps([WEATHER_TOOL, TIME_TOOL])}
    if system:
        row["system"] = f"You are a weather bot number {k}."
    return row


def test_mistral_nemo_multi_turn_tool_chats_pack_and_train_exactly_the_assistant(tmp_path, nemo_config):
    rows = [_glaive_row(k, system=k % 2 == 0) for k in range(12)]
    (tmp_path / "glaive_toolcall_en_demo.json").write_text(json.dumps(rows), encoding="utf-8")
    rt = round_trip([str(tmp_path / "glaive_toolcall_en_demo.json")], tmp_path / "out", nemo_config, seq_len=1024)
    assert rt.summary.samples_packed == 12 and rt.summary.samples_dropped == 0
    for k in range(12):
        sid = f"glaive_toolcall_en_demo.json:{k}"
        trained, text = rt.trained[sid], rt.text[sid]
        assert trained.startswith(f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {{"city": "City{k}"}}')
        assert trained.count("</s>") == 3, trained  # the call and both answers end their turns
        assert f"It is {10 + k} degrees in City{k}.</s>" in trained
        assert f"I can only tell the weather now, not tomorrow's ({k}).</s>" in trained
        for prompt in (f"What is the weather in City{k}?", f"Thanks! And tomorrow in City{k}?", "celsius",
                       "[AVAILABLE_TOOLS]", "Get the current weather", "weather bot number"):
            assert prompt not in trained
        # the tools sit in the last user turn, after the first answer (the published template writes the
        # system prompt only into a conversation that ends on a user turn, so none of these has it)
        assert text.index("[AVAILABLE_TOOLS]") > text.index(f"It is {10 + k} degrees")


def test_prefix_stable_templates_keep_their_spans(tmp_path, qwen_config_module):
    """The same records under Qwen2.5's (prefix-stable) template: spans where the prefixes end."""
    builder = get_builder(qwen_config_module)
    rec = Record("r", tuple(builder_messages(_glaive_row(3, system=True))), (), tools=(
        {"type": "function", "function": WEATHER_TOOL}, {"type": "function", "function": TIME_TOOL}))
    sample = builder.build(rec)
    trained = builder.tokenizer.decode(sample.input_ids[sample.loss_mask.astype(bool)].tolist())
    assert trained.count("<|im_end|>") == 3 and "weather bot number" not in trained
    assert trained.startswith('<tool_call>\n{"name": "get_weather"')


def builder_messages(row: dict) -> list[dict]:
    from wdspack.packer.sources import build_record

    return list(build_record(row, sample_id="x", image_root=".").messages)


@pytest.fixture(scope="module")
def qwen_config_module(tekken_dir) -> SampleConfig:
    return SampleConfig(tokenizer=str(tekken_dir), chat_template=QWEN25_TEMPLATE, tokens_per_image=4,
                        image_token="[IMG]")


def _chat(*turns: tuple[str, str]) -> tuple[dict, ...]:
    return tuple({"role": role, "content": [{"type": "text", "text": text}]} for role, text in turns)


def test_a_template_that_rewrites_its_opening_is_found_by_the_turns_text(tekken):
    """A running count in front of the conversation: no prefix is a prefix of the whole, yet each turn's
    own text is found in it."""
    counting = "{{ messages | length }} turns:{% for m in messages %}[INST]{{ m.content }}\n{% endfor %}"
    b = SampleBuilder(SampleConfig(tekken, chat_template=counting, tokens_per_image=16, image_token="[IMG]"))
    sample = b.build(Record("u", _chat(("user", "a"), ("assistant", "bee"), ("user", "c"), ("assistant", "dee")), ()))
    assert b.tokenizer.decode(sample.input_ids[sample.loss_mask.astype(bool)].tolist()) == "bee\ndee\n"


def test_a_template_that_rewrites_earlier_assistant_turns_drops_naming_the_turn(tekken):
    """Qwen3-style: a turn's reasoning is kept only while it is the last one."""
    rewriting = ("{% for m in messages %}<{{ m.role }}>\n{% if m.role == 'assistant' and not loop.last %}"
                 "{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}{% endif %}\n</{{ m.role }}>\n"
                 "{% endfor %}{% if add_generation_prompt %}<assistant>\n{% endif %}")
    b = SampleBuilder(SampleConfig(tekken, chat_template=rewriting, tokens_per_image=16, image_token="[IMG]"))
    fine = b.build(Record("ok", _chat(("user", "a"), ("assistant", "bee"), ("user", "c"), ("assistant", "dee")), ()))
    trained = b.tokenizer.decode(fine.input_ids[fine.loss_mask.astype(bool)].tolist())
    assert "bee" in trained and "dee" in trained and "a" not in trained.replace("</assistant>", "")
    with pytest.raises(SampleError) as e:
        b.build(Record("t", _chat(("user", "a"), ("assistant", "x</think>b"), ("user", "c"), ("assistant", "d")), ()))
    assert e.value.reason == "unmaskable_turn" and e.value.sample_id == "t"
    assert "assistant turn 1 cannot be located" in str(e.value) and "--chat-template" in str(e.value)


@pytest.mark.parametrize("template", ["qwen2_5_vl", "qwen2_5_instruct"])
def test_assistant_first_trains_no_template_boilerplate(tekken, template):
    """ms-swift's pre-training rows (one assistant turn): the template's opening (its default system
    prompt, the assistant header) is not trained, under Qwen2.5-VL's template and Qwen2.5-Instruct's."""
    from tiny_vlm.qwen2_5_vl import TEMPLATE

    b = SampleBuilder(SampleConfig(tekken, tokens_per_image=4, image_token="[IMG]",
                                   chat_template=TEMPLATE if template == "qwen2_5_vl" else QWEN25_TEMPLATE))
    sample = b.build(Record("a", _chat(("assistant", "A red square on a white page.")), ()))
    trained = b.tokenizer.decode(sample.input_ids[sample.loss_mask.astype(bool)].tolist())
    assert trained == "A red square on a white page.<|im_end|>\n"
    whole = b.tokenizer.decode(sample.input_ids.tolist())
    assert whole.startswith("<|im_start|>system\nYou are ") and "<|im_start|>assistant\n" in whole


def test_a_template_without_an_end_of_turn_token_is_warned_about(nemo_config):
    from tiny_vlm.llava import LLAVA_TEMPLATE

    llava = SampleBuilder(SampleConfig(nemo_config.tokenizer, chat_template=LLAVA_TEMPLATE, tokens_per_image=4,
                                       image_token="[IMG]"))
    (warning,) = llava.template_warnings()
    assert "ends an assistant turn in no special token" in warning and "--chat-template" in warning
    assert "'</s>'" in warning  # the tokenizer's end-of-sequence token, named as the fix
    assert get_builder(nemo_config).template_warnings() == []  # turns end in </s>


def test_a_turn_ending_in_its_special_token_and_a_newline_is_not_warned_about(tmp_path):
    """Qwen's turns end ``<|im_end|>\n``: the newline after the end-of-turn token is no reason to warn."""
    from tiny_vlm import qwen2_5_vl
    from wdspack.models import save_processor

    folder = save_processor(qwen2_5_vl.processor(tmp_path / "tok"), tmp_path / "processor")
    qwen = SampleBuilder(SampleConfig(processor=str(folder)))
    text, spans = qwen._render([qwen._message({"role": "user", "content": [{"type": "text", "text": "Hi"}]}),
                                qwen._message({"role": "assistant", "content": [{"type": "text", "text": "Yo"}]})], "p")
    assert text[spans[0][0]:spans[0][1]] == "Yo<|im_end|>\n"
    assert qwen.template_warnings() == []


def test_the_pack_job_logs_the_template_warning_once(tmp_path, nemo_config, caplog):

    from tiny_vlm.llava import LLAVA_TEMPLATE
    from wdspack.packer.config import PackConfig
    from wdspack.packer.job import pack_dataset

    rows = [{"messages": [{"role": "user", "content": f"Hi {k}"}, {"role": "assistant", "content": f"Yo {k}"}]}
            for k in range(3)]
    (tmp_path / "chats.json").write_text(json.dumps(rows), encoding="utf-8")
    config = SampleConfig(nemo_config.tokenizer, chat_template=LLAVA_TEMPLATE, tokens_per_image=4, image_token="[IMG]")
    with caplog.at_level("WARNING", logger="wdspack"):
        pack_dataset([str(tmp_path / "chats.json")], tmp_path / "out", sample_config=config,
                     config=PackConfig(seq_len=256))
    assert [r.getMessage() for r in caplog.records].count(get_builder(config).template_warnings()[0]) == 1
