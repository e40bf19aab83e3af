"""Record layouts of other projects (#19): each one's normalisation, and each drop reason it can give.

Layouts: LLaMA-Factory v1 (``value`` / ``image_url`` / ``tool_call`` parts), TRL conversational
prompt-completion with ``images``, ms-swift ``query``/``response``/``history`` and ``conversation``,
MiniCPM-V's ``image`` dict with ``<image_00>`` placeholders; media wdspack does not pack yet
(``unsupported_media``: grounding objects; videos and audio are read: ``test_video_records.py``); the
newline after ``<image>``; image names in drop details; symlinked and absolute image paths.
End-to-end packs of the same layouts are in ``tests/packer/sources/test_published_layouts.py``.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from wdspack.errors import DROP_REASONS, Dropped, SampleError
from wdspack.packer.samples import SampleBuilder, SampleConfig, get_builder
from wdspack.packer.sources import Record, iter_records, list_partitions


def _image(color: str = "red", fmt: str = "PNG", size: tuple[int, int] = (6, 4)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, fmt)
    return buf.getvalue()


RED, BLUE, GREEN = _image("red"), _image("blue", "JPEG"), _image("green", size=(3, 9))
IMG = {"type": "image"}


def _text(s: str) -> dict:
    return {"type": "text", "text": s}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "imgs").mkdir()
    for name, data in (("red.png", RED), ("blue.jpg", BLUE), ("green.png", GREEN)):
        (tmp_path / "imgs" / name).write_bytes(data)
    return tmp_path


def _read_all(paths, **kw) -> list[Record | Dropped]:
    return [r for p in list_partitions([str(s) for s in paths], **kw) for r in iter_records(p)]


def _one(root: Path, record: dict, **kw) -> Record | Dropped:
    path = root / "one.jsonl"
    path.write_text(json.dumps(record) + "\n")
    (item,) = _read_all([path], **kw)
    return item


def _drop(root: Path, record: dict, reason: str, *words: str) -> Dropped:
    d = _one(root, record)
    assert isinstance(d, Dropped), d
    assert d.reason == reason and reason in DROP_REASONS, d
    for w in words:
        assert w in d.detail, (w, d.detail)
    return d


def _roles(rec: Record) -> list[str]:
    return [m["role"] for m in rec.messages]


# ---------------------------------------------------------------------------------------------
# LLaMA-Factory v1: content parts with `value` (src/llamafactory/v1/utils/types.py: Content{type, value},
# types text | reasoning | tool_call | image_url | video_url | audio_url; Message{role, content, loss_weight})


def test_llamafactory_v1_parts(root):
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    tools = json.dumps([{"name": "get_weather", "description": "Weather of a city",
                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}])
    rec = _one(root, {"messages": [
        {"role": "system", "content": [{"type": "text", "value": "Be brief."}], "loss_weight": 0.0},
        {"role": "user", "content": [{"type": "image_url", "value": "imgs/red.png"},
                                     {"type": "text", "value": "Weather where this was taken?"}], "loss_weight": 0.0},
        {"role": "assistant", "content": [{"type": "tool_call", "value": json.dumps(call)}], "loss_weight": 1.0},
        {"role": "tool", "content": [{"type": "text", "value": "18 C"}], "loss_weight": 0.0},
        {"role": "assistant", "content": [{"type": "text", "value": "18 C in Paris."}], "loss_weight": 1.0}],
        "tools": tools})
    assert _roles(rec) == ["system", "user", "assistant", "tool", "assistant"]
    assert rec.messages[1]["content"] == [IMG, _text("Weather where this was taken?")]
    assert rec.images == (RED,) and rec.image_names == ("imgs/red.png",)
    (got,) = rec.messages[2]["tool_calls"]
    assert got["function"] == call and rec.messages[2]["content"] == [_text("")]
    assert rec.messages[3]["tool_call_id"] == got["id"] and rec.messages[3]["name"] == "get_weather"
    assert rec.messages[3]["content"] == [_text("18 C")]
    assert rec.tools[0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize("part, role, reason, words", [
    ({"type": "video_url", "value": "a.mp4"}, "user", "missing_video", ("video 'a.mp4' does not exist",)),
    ({"type": "audio_url", "value": "a.wav"}, "user", "missing_audio", ("'a.wav' does not exist",)),
    ({"type": "reasoning", "value": "Hmm."}, "assistant", "malformed_record", ("'reasoning'",)),
    ({"type": "tool_call", "value": "{not json"}, "assistant", "malformed_record", ("tool_call part's value",)),
    ({"type": "tool_call", "value": json.dumps({"name": "f", "arguments": {}})}, "user", "malformed_record",
     ("user turn with a tool_call part",)),
    ({"type": "text", "value": 3}, "user", "malformed_record", ("'value'",)),
])
def test_llamafactory_v1_bad_parts(root, part, role, reason, words):
    turns = [{"role": "user", "content": [{"type": "text", "value": "Q"}]},
             {"role": "assistant", "content": [{"type": "text", "value": "A"}]}]
    turns[0 if role == "user" else 1]["content"].append(part)
    _drop(root, {"messages": turns}, reason, *words)


# ---------------------------------------------------------------------------------------------
# TRL prompt-completion, conversational, with images (huggingface/trl docs/source/dataset_formats.md:
# "Prompt-completion" and "Vision datasets": content a list of {"type": "image"} / {"type": "text"} parts)


def test_trl_prompt_completion_with_images(root):
    rec = _one(root, {"prompt": [{"role": "system", "content": "Answer in one word."},
                                 {"role": "user", "content": [IMG, _text("What colour is the sky here?")]}],
                      "completion": [{"role": "assistant", "content": [_text("Red.")]}],
                      "images": ["imgs/red.png"]})
    assert _roles(rec) == ["system", "user", "assistant"]
    assert rec.messages[1]["content"] == [IMG, _text("What colour is the sky here?")]
    assert rec.messages[2]["content"] == [_text("Red.")] and rec.images == (RED,)


@pytest.mark.parametrize("row, words", [
    ({"prompt": "The sky is", "completion": " blue."}, ("field 'prompt' is a string", "conversational")),
    ({"prompt": [{"role": "user", "content": "Q"}], "completion": " blue."}, ("field 'completion' is a string",)),
    ({"prompt": [{"role": "user", "content": "Q"}]}, ("'prompt' but no 'completion'",)),
    ({"prompt": [{"role": "user", "content": "Q"}], "completion": {"role": "assistant", "content": "A"}},
     ("field 'completion' is dict",)),
    ({"prompt": [{"role": "user", "content": "Q"}], "completion": ["A"]}, ("completion[0] is str",)),
])
def test_trl_bad_rows(root, row, words):
    _drop(root, row, "malformed_record", *words)


def test_a_string_prompt_without_completion_is_not_taken_for_trl(root):
    # a prompt/response row (or the Qwen2-VL fine-tuning repo's DPO rows) names every layout wdspack reads
    _drop(root, {"prompt": "q", "response": "a"}, "malformed_record", "none of 'conversations'",
          "'prompt' + 'completion'")


# ---------------------------------------------------------------------------------------------
# ms-swift (docs/source_en/Customization/Custom-dataset.md): query-response and ShareGPT `conversation`


def test_ms_swift_query_response_history(root):
    rec = _one(root, {"system": "You are a calculator.", "query": "<image>What about adding 1?",
                      "response": "It equals 3", "history": [["What is 1 + 1?", "It equals 2"]],
                      "images": ["imgs/blue.jpg"]})
    assert _roles(rec) == ["system", "user", "assistant", "user", "assistant"]
    assert rec.messages[1]["content"] == [_text("What is 1 + 1?")]
    assert rec.messages[3]["content"] == [IMG, _text("What about adding 1?")]
    assert rec.messages[4]["content"] == [_text("It equals 3")] and rec.images == (BLUE,)


@pytest.mark.parametrize("row, words", [
    ({"query": "q"}, ("'query' but no 'response'",)),
    ({"query": ["q"], "response": "r"}, ("field 'query' is list", "query-response")),
    ({"query": "q", "response": "r", "history": [["only one"]]}, ("history[0]",)),
    ({"query": "q", "response": "r", "history": "q1 r1"}, ("field 'history' is str",)),
])
def test_ms_swift_query_bad_rows(root, row, words):
    _drop(root, row, "malformed_record", *words)


def test_ms_swift_conversation(root):
    rec = _one(root, {"system": "Be brief.", "conversation": [{"human": "<image>\nWhat is it?", "assistant": "A dot."},
                                                              {"human": "Colour?", "assistant": "Green."}],
                      "images": ["imgs/green.png"]})
    assert _roles(rec) == ["system", "user", "assistant", "user", "assistant"]
    assert rec.messages[1]["content"] == [IMG, _text("\nWhat is it?")] and rec.images == (GREEN,)
    assert rec.messages[4]["content"] == [_text("Green.")]
    _drop(root, {"conversation": [{"human": "q", "gpt": "a"}]}, "malformed_record", "conversation[0]",
          "'human': str, 'assistant': str")


# ---------------------------------------------------------------------------------------------
# MiniCPM-V (OpenBMB/MiniCPM-V finetune/readme.md): "image": {"<image_00>": path, ...}, <image_NN> in the text


def test_minicpm_v_image_dict_places_each_image_where_named(root):
    rec = _one(root, {"id": "0", "image": {"<image_00>": "imgs/red.png", "<image_01>": "imgs/blue.jpg"},
                      "conversations": [{"role": "user", "content": "Compare <image_01> with\n<image_00>\n"},
                                        {"role": "assistant", "content": "Blue, then red."}]})
    assert rec.messages[0]["content"] == [_text("Compare "), IMG, _text(" with\n"), IMG, _text("\n")]
    assert rec.images == (BLUE, RED)  # text order, not key order
    assert rec.image_names == ("imgs/blue.jpg", "imgs/red.png")


def test_minicpm_v_images_named_nowhere_go_first_in_key_order(root):
    rec = _one(root, {"image": {"<image_10>": "imgs/green.png", "<image_02>": "imgs/red.png"},
                      "conversations": [{"role": "user", "content": "Describe both."},
                                        {"role": "assistant", "content": "A dot and a square."}]})
    assert rec.messages[0]["content"] == [IMG, IMG, _text("Describe both.")]
    assert rec.images == (RED, GREEN)  # <image_02> before <image_10>


@pytest.mark.parametrize("images, text, reason, words", [
    ({"<image_00>": "imgs/red.png"}, "See <image_01>.", "placeholder_mismatch", ("'<image_01>'",)),
    ({"<image_00>": "imgs/red.png", "<image_01>": "imgs/blue.jpg"}, "See <image_00>.", "placeholder_mismatch",
     ("['<image_01>']", "no turn names")),
    ({"<image_00>": None}, "See <image_00>.", "malformed_record", ("image['<image_00>'] is null",)),
    ({"<image_00>": "imgs/nope.png"}, "See <image_00>.", "missing_image", ("imgs/nope.png",)),
])
def test_minicpm_v_bad_rows(root, images, text, reason, words):
    _drop(root, {"image": images, "conversations": [{"role": "user", "content": text},
                                                    {"role": "assistant", "content": "A"}]}, reason, *words)


def test_an_image_struct_is_not_taken_for_a_minicpm_dict(root):
    rec = _one(root, {"image": {"bytes": None, "path": "imgs/red.png"},
                      "conversations": [{"from": "human", "value": "<image>Q"}, {"from": "gpt", "value": "A"}]})
    assert rec.images == (RED,)


# ---------------------------------------------------------------------------------------------
# Grounding objects: dropped as unsupported_media, never packed as text (videos and audio are read:
# tests/packer/sources/test_video_records.py)


_CHAT = [{"from": "human", "value": "What happens?"}, {"from": "gpt", "value": "A man walks."}]


@pytest.mark.parametrize("field, value, what", [
    ("objects", {"ref": ["a dog"], "bbox": [[1, 2, 3, 4]]}, "grounding objects are not supported yet"),
    ("objects", {"ref": [], "bbox": [[615, 226]]}, "grounding objects"),
])
def test_media_fields_are_dropped_with_their_own_reason(root, field, value, what):
    _drop(root, {"id": "v", field: value, "conversations": _CHAT}, "unsupported_media", f"field {field!r}", what)


@pytest.mark.parametrize("value", [None, [], "", {"ref": [], "bbox": []}, [None]])
def test_empty_media_fields_are_not_media(root, value):
    rec = _one(root, {"objects": value, "conversations": _CHAT})
    assert isinstance(rec, Record), rec
    if value in (None, []):  # an empty video or audio list is no video or audio (as for images)
        rec = _one(root, {"videos": value, "video": value, "audios": value, "audio": value, "conversations": _CHAT})
        assert isinstance(rec, Record) and rec.videos == () and rec.media["audio"] == (), rec


@pytest.mark.parametrize("text, reason, words", [
    ("<video>\nWhat happens?", "placeholder_mismatch", ("1 video placeholder(s)", "but 0 video(s)")),
    ("Listen: <audio>", "placeholder_mismatch", ("1 audio placeholder(s)", "but 0 audio(s)")),
])
def test_media_placeholders_without_a_field_are_dropped(root, text, reason, words):
    _drop(root, {"conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "x"}]}, reason, *words)
    _drop(root, {"messages": [{"role": "system", "content": text}, {"role": "user", "content": "q"},
                              {"role": "assistant", "content": "x"}]}, reason, *words)


def test_an_answer_that_mentions_a_video_tag_is_text(root):
    rec = _one(root, {"messages": [{"role": "user", "content": "How do I embed a clip in HTML?"},
                                   {"role": "assistant", "content": "Use the <video> element."}]})
    assert rec.messages[1]["content"] == [_text("Use the <video> element.")]


def test_media_columns_are_read_from_parquet(root):
    table = pa.table({"id": ["img", "vid"], "images": [[{"bytes": RED, "path": "r.png"}], []],
                      "videos": [[], ["clip.mp4"]],
                      "messages": [[{"role": "user", "content": "<image>Q"}, {"role": "assistant", "content": "A"}],
                                   [{"role": "user", "content": "<video>Q"}, {"role": "assistant", "content": "A"}]]})
    pq.write_table(table, root / "mixed.parquet")
    (root / "clip.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 not decoded here")
    img, vid = _read_all([root / "mixed.parquet"])
    assert isinstance(img, Record) and img.images == (RED,) and img.image_names == ("r.png",) and img.videos == ()
    assert isinstance(vid, Record) and vid.videos == ((root / "clip.mp4").read_bytes(),) and vid.images == ()
    assert vid.messages[0]["content"] == [{"type": "video"}, _text("Q")] and vid.video_names == ("clip.mp4",)


def test_trl_prompt_completion_from_parquet(root):
    prompt = [[{"role": "user", "content": [{"type": "image", "text": None}, {"type": "text", "text": "Q"}]}]]
    table = pa.table({"prompt": prompt, "completion": [[{"role": "assistant", "content": [
        {"type": "text", "text": "A"}]}]], "images": [[{"bytes": BLUE, "path": None}]]})
    pq.write_table(table, root / "trl.parquet")
    (rec,) = _read_all([root / "trl.parquet"])
    assert isinstance(rec, Record), rec
    assert _roles(rec) == ["user", "assistant"] and rec.images == (BLUE,)
    assert rec.messages[0]["content"] == [IMG, _text("Q")]


# ---------------------------------------------------------------------------------------------
# The newline after <image> (LLaVA and InternVL train on "<image>\n")

STRING_TEMPLATE = ("{% for m in messages %}{% if m.role == 'user' %}USER: {{ m.content }} {% else %}ASSISTANT: "
                   "{{ m.content }}</s>{% endif %}{% endfor %}")  # LLaVA-1.5's vicuna layout; content a string


def _llava_record(root: Path) -> Record:
    rec = _one(root, {"id": "r", "image": "imgs/red.png",
                      "conversations": [{"from": "human", "value": "<image>\nWhat is it?"},
                                        {"from": "gpt", "value": "A dot."}]})
    assert rec.messages[0]["content"] == [IMG, _text("\nWhat is it?")]  # the source's text, newline kept
    return rec


@pytest.mark.slow  # builds its own tokenizer (tekken: ~5 s each)
def test_string_templates_keep_the_newline_after_the_image(root, tekken_dir):
    builder = SampleBuilder(SampleConfig(tokenizer=str(tekken_dir), chat_template=STRING_TEMPLATE,
                                         tokens_per_image=2, image_token="[IMG]"))
    assert not builder.typed_images
    sample = builder.build(_llava_record(root))
    text = builder.tokenizer.decode(sample.input_ids.tolist())
    assert "USER: [IMG][IMG]\nWhat is it? ASSISTANT: A dot.</s>" in text


def test_typed_templates_place_the_image_and_get_no_second_newline(root, sample_config):
    # Pixtral's template renders typed image parts itself: the newline after <image> is left to it
    builder = get_builder(sample_config)
    assert builder.typed_images
    rec = _llava_record(root)
    assert builder._message(rec.messages[0])["content"] == [IMG, _text("What is it?")]
    two = _one(root, {"image": ["imgs/red.png", "imgs/blue.jpg"], "conversations": [
        {"from": "human", "value": "<image>\n<image>\nSame?"}, {"from": "gpt", "value": "No."}]})
    assert builder._message(two.messages[0])["content"] == [IMG, IMG, _text("Same?")]
    text = builder.tokenizer.decode(builder.build(rec).input_ids.tolist())
    assert "[IMG]What is it?" in text and "[IMG]\n" not in text


# ---------------------------------------------------------------------------------------------
# Drop details name the image


def test_unreadable_and_oversized_images_are_named(root, sample_config, tmp_path):
    (root / "imgs" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    rec = _one(root, {"id": "b", "image": "imgs/broken.png", "conversations": _CHAT})
    assert rec.image_names == ("imgs/broken.png",)
    with pytest.raises(SampleError) as e:
        get_builder(sample_config).build(rec)
    assert e.value.reason == "unreadable_image" and "image 0 ('imgs/broken.png') cannot be decoded" in e.value.detail
    small = SampleConfig(tokenizer=sample_config.tokenizer, chat_template=sample_config.chat_template,
                         tokens_per_image=16, image_token="[IMG]", max_image_pixels=10)
    big = _one(root, {"id": "g", "image": "imgs/green.png", "conversations": _CHAT})
    with pytest.raises(SampleError) as e:
        SampleBuilder(small).build(big)
    assert e.value.reason == "image_too_large" and "image 0 ('imgs/green.png') is 3x9" in e.value.detail


# ---------------------------------------------------------------------------------------------
# Symlinked images (#19 item 4): containment is judged on the path as written


def test_hub_cache_snapshot_links_into_blobs(tmp_path):
    """The Hugging Face hub cache: ``snapshots/REV/...`` files are relative links to ``../../blobs/HASH``."""
    repo = tmp_path / "datasets--org--name"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "0123abcd"
    (snap / "images").mkdir(parents=True)
    rows = []
    for k, data in enumerate((RED, BLUE)):
        (repo / "blobs" / f"hash{k}").write_bytes(data)
        os.symlink(f"../../../blobs/hash{k}", snap / "images" / f"{k}.png")
        rows.append({"id": f"r{k}", "image": f"images/{k}.png", "conversations": _CHAT})
    (repo / "blobs" / "data").write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.symlink("../../blobs/data", snap / "data.jsonl")
    recs = _read_all([snap / "data.jsonl"])
    assert [r.images for r in recs] == [(RED,), (BLUE,)]
    recs = _read_all([snap], image_root=str(snap))  # the snapshot folder, given as the root
    assert [r.images for r in recs] == [(RED,), (BLUE,)]
    (snap / "escape.jsonl").write_text(json.dumps({"image": "../../blobs/hash0", "conversations": _CHAT}) + "\n")
    (d,) = _read_all([snap / "escape.jsonl"])
    assert d.reason == "image_path_escape"  # `..` out of the root as written is still refused
