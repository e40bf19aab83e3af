"""Alpaca and tool-calling sources, rendered through real chat templates with the real Pixtral and
Mistral-Nemo tokenizers; a job that packs nothing, or drops too much, fails after its report.

The templates (``tests/support/templates.py``) are the published ones of Qwen2.5-Instruct
(``tokenizer_config.json``) and of Mistral-Nemo-Instruct-2407, copied verbatim: both render ``tools``,
assistant ``tool_calls`` and ``tool`` turns, each in its own syntax.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image

from tests.support.demo import read_files
from tests.support.resume import pack_interrupted_then_resumed
from tests.support.templates import MISTRAL_NEMO_TEMPLATE, QWEN25_TEMPLATE, TIME_TOOL, WEATHER_TOOL
from wdspack.cli import main
from wdspack.errors import ConfigError, Dropped, TooManyDropsError
from wdspack.format.manifest import read_manifest
from wdspack.ops.verify import verify_dataset
from wdspack.packer.config import DEFAULT_MAX_DROP_FRACTION, PackConfig, RunOptions
from wdspack.packer.job import pack_dataset
from wdspack.packer.samples import SampleConfig, get_builder
from wdspack.packer.sources import Record, iter_records, list_partitions


def _png(color: str = "red") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 6), color).save(buf, "PNG")
    return buf.getvalue()


def _records(tmp_path: Path, rows: list, name: str = "data.jsonl") -> list[Record | Dropped]:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [r for p in list_partitions([str(path)]) for r in iter_records(p)]


def _one(tmp_path: Path, row: dict) -> Record | Dropped:
    (item,) = _records(tmp_path, [row])
    return item


def _texts(message: dict) -> str:
    return "".join(p.get("text", "") for p in message["content"])


def _sharegpt_tool_row(k: int = 0, *, parallel: bool = False) -> dict:
    """LLaMA-Factory / Glaive ``glaive_toolcall`` layout: ``function_call`` and ``observation`` turns."""
    if parallel:
        call = [{"name": "get_weather", "arguments": {"city": "Paris"}},
                {"name": "get_time", "arguments": {"city": "Paris"}}]
        result = json.dumps([{"temperature": 18}, {"time": "14:05"}])
        answer = "It is 18 degrees and 14:05 in Paris."
    else:
        call = {"name": "get_weather", "arguments": {"city": f"City{k}"}}
        result = json.dumps({"temperature": 10 + k % 20, "unit": "celsius"})
        answer = f"It is {10 + k % 20} degrees in City{k}."
    return {"conversations": [
        {"from": "human", "value": f"What is the weather in City{k}?"},
        {"from": "function_call", "value": json.dumps(call)},
        {"from": "observation", "value": result},
        {"from": "gpt", "value": answer}],
        "tools": json.dumps([WEATHER_TOOL, TIME_TOOL])}


# ---- Alpaca ---------------------------------------------------------------------------------


def test_alpaca_record_becomes_a_chat(tmp_path):
    rec = _one(tmp_path, {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"})
    assert [m["role"] for m in rec.messages] == ["user", "assistant"]
    assert _texts(rec.messages[0]) == "Translate to French.\nGood morning"
    assert _texts(rec.messages[1]) == "Bonjour"
    no_input = _one(tmp_path, {"instruction": "Name a prime.", "input": "", "output": "7"})
    assert _texts(no_input.messages[0]) == "Name a prime."


def test_alpaca_rows_with_a_rendered_text_column_stay_alpaca(tmp_path):
    # tatsu-lab/alpaca ships each row's prompt rendered in `text` too: still a chat, not a document
    rec = _one(tmp_path, {"instruction": "Add.", "input": "2 + 2", "output": "4",
                          "text": "Below is an instruction ... ### Response:\n4"})
    assert isinstance(rec, Record) and _texts(rec.messages[1]) == "4"


def test_alpaca_system_history_and_images(tmp_path):
    (tmp_path / "a.png").write_bytes(_png())
    rec = _one(tmp_path, {"system": "Be brief.", "history": [["Hi", "Hello!"], ["2+2?", "4"]],
                          "instruction": "<image>\nWhat colour?", "output": "Red.", "images": ["a.png"]})
    assert [m["role"] for m in rec.messages] == ["system", "user", "assistant", "user", "assistant", "user",
                                                  "assistant"]
    assert [_texts(m) for m in rec.messages] == ["Be brief.", "Hi", "Hello!", "2+2?", "4", "\nWhat colour?", "Red."]
    assert rec.messages[5]["content"][0] == {"type": "image"} and rec.images == (_png(),)


@pytest.mark.parametrize("row, words", [
    ({"instruction": "Say hi."}, "no 'output'"),
    ({"instruction": "Say hi.", "output": ["hi", "hello"]}, "field 'output' is list"),
    ({"instruction": "Q", "output": "A", "history": [["only one"]]}, "history[0]"),
    ({"instruction": "Q", "output": "A", "history": "Q1 A1"}, "field 'history' is str"),
    ({"instruction": "Q", "output": "A", "system": 3}, "field 'system' is int"),
    ({"system": "S", "conversations": [{"from": "system", "value": "S2"}, {"from": "human", "value": "q"},
                                       {"from": "gpt", "value": "a"}]}, "both a 'system' field"),
])
def test_alpaca_bad_records_are_dropped_with_the_field_named(tmp_path, row, words):
    d = _one(tmp_path, row)
    assert isinstance(d, Dropped) and d.reason == "malformed_record" and words in d.detail, d


def test_alpaca_parquet_columns_are_read(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"instruction": ["Add.", "Sub."], "input": ["2 3", ""], "output": ["5", "0"]}),
                   tmp_path / "alpaca.parquet")
    recs = [r for p in list_partitions([str(tmp_path / "alpaca.parquet")]) for r in iter_records(p)]
    assert [(_texts(r.messages[0]), _texts(r.messages[1])) for r in recs] == [("Add.\n2 3", "5"), ("Sub.", "0")]


# ---- tool calls: records --------------------------------------------------------------------


def test_sharegpt_function_call_and_observation_turns(tmp_path):
    rec = _one(tmp_path, _sharegpt_tool_row(3))
    _, call, result, _ = rec.messages
    assert [m["role"] for m in rec.messages] == ["user", "assistant", "tool", "assistant"]
    (tc,) = call["tool_calls"]
    assert tc["type"] == "function" and tc["function"] == {"name": "get_weather", "arguments": {"city": "City3"}}
    assert len(tc["id"]) == 9 and tc["id"].isalnum()
    assert result["tool_call_id"] == tc["id"] and result["name"] == "get_weather"
    assert json.loads(_texts(result)) == {"temperature": 13, "unit": "celsius"}
    assert [t["function"]["name"] for t in rec.tools] == ["get_weather", "get_time"]
    assert all(t["type"] == "function" for t in rec.tools)
    again = _one(tmp_path, _sharegpt_tool_row(3))
    assert again.messages == rec.messages  # ids are deterministic


def test_openai_tool_calls_messages(tmp_path):
    row = {"id": "oa-1", "tools": [{"type": "function", "function": WEATHER_TOOL}], "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_Xy12", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_Xy12", "content": "-3 C"},
        {"role": "assistant", "content": "It is -3 C in Oslo."}]}
    rec = _one(tmp_path, row)
    call = rec.messages[1]["tool_calls"][0]
    assert call == {"type": "function", "id": "call_Xy12",
                    "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    assert rec.messages[2]["tool_call_id"] == "call_Xy12" and _texts(rec.messages[2]) == "-3 C"
    assert rec.tools == ({"type": "function", "function": WEATHER_TOOL},)
    legacy = _one(tmp_path, {"messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": "{}"}},
        {"role": "function", "name": "get_weather", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."}]})
    assert legacy.messages[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {}}
    assert legacy.messages[2]["role"] == "tool" and legacy.messages[2]["name"] == "get_weather"


@pytest.mark.parametrize("turn, tools, words", [
    ({"from": "function_call", "value": "{not json"}, None, "is not valid JSON"),
    ({"from": "function_call", "value": json.dumps({"arguments": {}})}, None, "needs a 'name'"),
    ({"from": "function_call", "value": json.dumps({"name": "f", "arguments": "[1, 2]"})}, None, "JSON object"),
    ({"from": "gpt", "value": "ok"}, "[{\"description\": \"no name\"}]", "tools[0]"),
    ({"from": "gpt", "value": "ok"}, "{broken", "field 'tools' is not valid JSON"),
])
def test_bad_tool_calls_are_dropped_with_the_value_named(tmp_path, turn, tools, words):
    row = {"conversations": [{"from": "human", "value": "q"}, turn, {"from": "gpt", "value": "a"}]}
    if tools is not None:
        row["tools"] = tools
    d = _one(tmp_path, row)
    assert isinstance(d, Dropped) and d.reason == "malformed_record" and words in d.detail, d


# ---- tool calls: rendering and the loss mask --------------------------------------------------


@pytest.fixture(scope="module")
def qwen_config(tekken_dir):
    return SampleConfig(tokenizer=str(tekken_dir), chat_template=QWEN25_TEMPLATE, tokens_per_image=4,
                        image_token="[IMG]")


def _targets(builder, sample) -> str:
    """The trained text: the decoded tokens under the loss mask."""
    return builder.tokenizer.decode(sample.input_ids[sample.loss_mask.astype(bool)].tolist())


def _untrained(builder, sample) -> str:
    return builder.tokenizer.decode(sample.input_ids[~sample.loss_mask.astype(bool)].tolist())


def test_qwen_template_trains_tool_calls_not_tool_results(tmp_path, qwen_config):
    builder = get_builder(qwen_config)
    assert builder.tool_support == {"tools": True, "tool_calls": True, "tool_results": True, "error": None}
    rec = _one(tmp_path, _sharegpt_tool_row(0, parallel=True))
    sample = builder.build(rec)
    # token for token what the template gives for the same messages and tools
    messages = [builder._message(m) for m in rec.messages]
    text = builder.tokenizer.apply_chat_template(messages, tools=list(rec.tools), chat_template=QWEN25_TEMPLATE,
                                                 tokenize=False)
    assert sample.input_ids.tolist() == builder.tokenizer(text, add_special_tokens=False)["input_ids"]
    trained, untrained = _targets(builder, sample), _untrained(builder, sample)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in trained
    assert '{"name": "get_time", "arguments": {"city": "Paris"}}' in trained
    assert "It is 18 degrees and 14:05 in Paris." in trained
    assert "<tool_response>" in untrained and '"temperature": 18' in untrained and "temperature" not in trained
    assert '"name": "get_weather", "description": "Get the current weather in a city"' in untrained  # tools
    assert "What is the weather" in untrained


def test_mistral_nemo_template_with_its_own_tokenizer(tmp_path, nemo_dir):
    """Mistral's syntax: [AVAILABLE_TOOLS] … [TOOL_CALLS] … [TOOL_RESULTS], 9-character call ids."""
    builder = get_builder(SampleConfig(tokenizer=str(nemo_dir), chat_template=MISTRAL_NEMO_TEMPLATE,
                                       tokens_per_image=4, image_token="[IMG]"))
    assert builder.tool_support["tool_calls"] and builder.tool_support["tool_results"]
    rec = _one(tmp_path, _sharegpt_tool_row(5))
    sample = builder.build(rec)
    call_id = rec.messages[1]["tool_calls"][0]["id"]
    ids, mask = sample.input_ids.tolist(), sample.loss_mask
    tok = builder.tokenizer
    special = {name: tok.convert_tokens_to_ids(name) for name in
               ("[AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "</s>")}
    assert ids.count(special["[TOOL_CALLS]"]) == 1 and mask[ids.index(special["[TOOL_CALLS]"])] == 1
    assert mask[ids.index(special["[AVAILABLE_TOOLS]"])] == 0 and mask[ids.index(special["[TOOL_RESULTS]"])] == 0
    assert [mask[i] for i, t in enumerate(ids) if t == special["</s>"]] == [1, 1]  # both assistant turns end
    trained = _targets(builder, sample)
    assert f'"name": "get_weather", "arguments": {{"city": "City5"}}, "id": "{call_id}"' in trained
    assert "It is 15 degrees in City5." in trained and "celsius" not in trained


def test_template_without_tool_support_is_a_config_error(tmp_path, sample_config):
    """Pixtral's template leaves tool calls out of the text: a job-level error, not a drop."""
    builder = get_builder(sample_config)
    assert builder.tool_support == {"tools": False, "tool_calls": False, "tool_results": False, "error": None}
    rec = _one(tmp_path, _sharegpt_tool_row(1))
    with pytest.raises(ConfigError, match=r"leaves them out of the text; pass --chat-template FILE") as e:
        builder.build(rec)
    assert "assistant tool calls ('tool_calls')" in str(e.value) and "tool definitions" in str(e.value)
    plain = _one(tmp_path, {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]})
    assert builder.build(plain).loss_mask.any()  # chats without tools are unaffected


def test_template_that_raises_on_tools_is_a_config_error(tmp_path, tekken_dir):
    raising = ("{%- for m in messages %}{%- if m.role not in ['user', 'assistant', 'system'] %}"
               "{{ raise_exception('Only user and assistant roles are supported!') }}{%- endif %}"
               "[{{ m.role }}]{{ m.content }}{%- endfor %}")
    builder = get_builder(SampleConfig(tokenizer=str(tekken_dir), chat_template=raising, tokens_per_image=16,
                                       image_token="[IMG]"))
    assert builder.tool_support["error"] and "Only user and assistant roles" in builder.tool_support["error"]
    with pytest.raises(ConfigError, match=r"raises on them .*Only user and assistant roles"):
        builder.build(_one(tmp_path, _sharegpt_tool_row(2)))


# ---- the pack job ---------------------------------------------------------------------------


def _write_formats(folder: Path, *, n: int = 24) -> list[str]:
    """An Alpaca JSON array and a ShareGPT tool-calling JSONL file, as public data sets ship them."""
    folder.mkdir(parents=True, exist_ok=True)
    alpaca = [{"instruction": f"Give the word for number {k}.", "input": "" if k % 3 else f"in French, #{k}",
               "output": f"Word {k}."} for k in range(n)]
    alpaca[1]["history"] = [["Hello", "Hi, how can I help?"]]
    alpaca[2]["system"] = "You are a translator."
    (folder / "alpaca.json").write_text(json.dumps(alpaca, indent=1))
    tools = [_sharegpt_tool_row(k, parallel=k % 5 == 0) for k in range(n)]
    (folder / "tools.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tools))
    return [str(folder / "alpaca.json"), str(folder / "tools.jsonl")]


def _pack_config(**kw) -> PackConfig:
    return PackConfig(**{"seq_len": 1024, "max_images": 4, "shard_max_packs": 3, "records_per_partition": 7, **kw})


@pytest.mark.slow
def test_alpaca_and_tool_files_pack_verify_and_are_deterministic(tmp_path, qwen_config):
    srcs = _write_formats(tmp_path / "data")
    first = pack_dataset(srcs, tmp_path / "a", sample_config=qwen_config, config=_pack_config())
    assert first.samples_read == 48 and first.samples_packed == 48 and first.samples_dropped == 0
    assert verify_dataset(str(tmp_path / "a"), sources=srcs) == []
    pack_dataset(srcs, tmp_path / "b", sample_config=qwen_config, config=_pack_config(run=RunOptions(workers=2)))
    assert read_files(tmp_path / "a") == read_files(tmp_path / "b")


def test_resume_after_an_interrupted_measure_is_identical(tmp_path, qwen_config, monkeypatch):
    srcs = _write_formats(tmp_path / "data")
    pack_dataset(srcs, tmp_path / "clean", sample_config=qwen_config, config=_pack_config())
    pack_interrupted_then_resumed(monkeypatch, srcs, tmp_path / "resumed", interrupt_at=4,
                                  sample_config=qwen_config, config=_pack_config())
    assert read_files(tmp_path / "clean") == read_files(tmp_path / "resumed")


def test_tool_records_under_a_template_without_tools_fail_the_cli_with_the_fix(tmp_path, tekken_dir, capsys):
    srcs = _write_formats(tmp_path / "data", n=4)
    template = Path(__file__).resolve().parents[3] / "examples" / "chat_templates" / "pixtral.jinja"
    rc = main(["pack", srcs[1], "--output", str(tmp_path / "out"), "--tokenizer", str(tekken_dir),
               "--chat-template", str(template), "--image-token", "[IMG]", "--tokens-per-image", "16",
               "--seq-len", "1024", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "leaves them out of the text; pass --chat-template FILE" in err and "tools.jsonl:0" in err


# ---- failing loudly -------------------------------------------------------------------------


def test_default_tolerance_is_five_percent():
    assert DEFAULT_MAX_DROP_FRACTION == 0.05 and PackConfig(seq_len=8).run.max_drop_fraction == 0.05
    with pytest.raises(ConfigError, match=r"--max-drop-fraction must be in \[0, 1\].*got 5"):
        RunOptions(max_drop_fraction=5)


def test_a_job_that_packs_nothing_fails_with_reasons_and_examples(tmp_path, qwen_config):
    """The issue's case: a layout wdspack does not read. Every record dropped: no shard, an error."""
    path = tmp_path / "dolly.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{k}", "response": f"a{k}"}) + "\n" for k in range(30))
                    + '{"broken\n')
    out = tmp_path / "out"
    with pytest.raises(TooManyDropsError) as e:
        pack_dataset([str(path)], out, sample_config=qwen_config,
                     config=_pack_config(run=RunOptions(max_drop_fraction=1.0)))
    msg = str(e.value)
    assert msg.startswith("nothing was packed: all 31 samples read were dropped")
    assert "malformed_record" in msg and "'dolly.jsonl:0': the record has none of 'conversations'" in msg
    assert "keys: ['prompt', 'response']" in msg and "fix the inputs" in msg
    dropped = [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]
    assert len(dropped) == 31 and {d["reason"] for d in dropped} == {"malformed_record"}
    assert not (out / "manifest.json").exists() and not list(out.glob("*.tar"))


def test_over_the_tolerance_fails_after_the_report_then_resume_accepts(tmp_path, qwen_config):
    srcs = _write_formats(tmp_path / "data", n=20)
    bad = [{"instruction": "No answer here."}, {"conversations": [{"from": "narrator", "value": "x"},
                                                                  {"from": "gpt", "value": "y"}]},
           {"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": "{oops"},
                              {"from": "gpt", "value": "a"}]}]
    with open(srcs[1], "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in bad))
    out = tmp_path / "out"
    with pytest.raises(TooManyDropsError) as e:
        pack_dataset(srcs, out, sample_config=qwen_config, config=_pack_config())
    msg = str(e.value)  # 3 of 43 = 7.0 %
    assert msg.startswith("3 of 43 samples read (7.0%) were dropped, over the tolerance --max-drop-fraction 0.05")
    assert "malformed_record" in msg and "unknown_role" in msg and "'tools.jsonl:20'" in msg
    assert "--resume --max-drop-fraction 0.07" in msg
    assert len((out / "dropped.jsonl").read_text().splitlines()) == 3 and not (out / "manifest.json").exists()
    summary = pack_dataset(srcs, out, sample_config=qwen_config,
                           config=_pack_config(run=RunOptions(max_drop_fraction=0.07)), resume=True)
    assert summary.samples_packed == 40 and summary.samples_dropped == 3
    pack_dataset(srcs, tmp_path / "fresh", sample_config=qwen_config,
                         config=_pack_config(run=RunOptions(max_drop_fraction=1.0)))
    assert read_files(out) == read_files(tmp_path / "fresh")
    assert verify_dataset(str(out), sources=srcs) == []
    assert read_manifest(out).totals["dropped_by_reason"] == {"malformed_record": 2, "unknown_role": 1}


def test_cli_exit_status_for_drops(tmp_path, tekken_dir, capsys):
    (tmp_path / "qwen.jinja").write_text(QWEN25_TEMPLATE)
    srcs = _write_formats(tmp_path / "data", n=10)

    def run(bad: int, out: str, *extra: str) -> tuple[int, str, str]:
        good = [{"instruction": f"q{k}", "output": f"a{k}"} for k in range(10 - bad)]
        Path(srcs[0]).write_text(json.dumps(good + [{"instruction": "no output"}] * bad))
        rc = main(["pack", *srcs, "--output", str(tmp_path / out), "--tokenizer", str(tekken_dir),
                   "--chat-template", str(tmp_path / "qwen.jinja"), "--tokens-per-image", "16", "--seq-len",
                   "1024", "--quiet", *extra])
        captured = capsys.readouterr()
        return rc, captured.out, captured.err

    rc, out, err = run(2, "strict")  # 2 of 20 = 10 % > 5 %
    assert rc == 1 and out == "" and (tmp_path / "strict" / "dropped.jsonl").exists()
    assert "2 of 20 samples read (10.0%) were dropped, over the tolerance --max-drop-fraction 0.05" in err
    assert "e.g. 'alpaca.json:8': the record has 'instruction' but no 'output'" in err
    rc, out, err = run(2, "loose", "--max-drop-fraction", "1")
    assert rc == 0 and "dropped 2 (malformed_record 2)" in out
    rc, out, err = run(1, "at-the-limit")  # 1 of 20 = 5 %: within the default tolerance
    assert rc == 0 and "dropped 1 (malformed_record 1)" in out


def test_demo_template_is_the_published_one():
    """``make demo`` packs its tool-calling file with examples/chat_templates/mistral_nemo.jinja: this one."""
    path = Path(__file__).resolve().parents[3] / "examples" / "chat_templates" / "mistral_nemo.jinja"
    assert path.read_text(encoding="utf-8") == MISTRAL_NEMO_TEMPLATE
