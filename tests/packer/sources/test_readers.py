"""Sources: every format, partitioning that never changes ids, and every drop reason."""

from __future__ import annotations

import base64
import io
import itertools
import json
import os
import pickle
import types
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import wdspack.packer.sources as sources
from wdspack.errors import DROP_REASONS, ConfigError, Dropped, SourceError
from wdspack.packer.sources import Partition, Record, iter_records, list_partitions
from wdspack.packer.sources.scan import array_separators, jsonl_boundaries, split_array_chunk


def _image(fmt: str = "PNG", color: str = "red", size: tuple[int, int] = (6, 4)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, fmt)
    return buf.getvalue()


PNG, JPEG, PNG2 = _image("PNG", "red"), _image("JPEG", "blue"), _image("PNG", "green", (3, 9))


def _text(s: str) -> dict:
    return {"type": "text", "text": s}


IMG = {"type": "image"}


def _chat(question: str = "What is it?", answer: str = "A thing.") -> list[dict]:
    return [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]


def _read_all(srcs, **kw) -> list[Record | Dropped]:
    return [r for p in list_partitions([str(s) for s in srcs], **kw) for r in iter_records(p)]


def _one(tmp_path: Path, record: dict, **kw) -> Record | Dropped:
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(record) + "\n")
    (item,) = _read_all([path], **kw)
    return item


def _summary(items) -> list[tuple]:
    """What must not change with partitioning: ids, kinds, messages, images, drop reasons."""
    return [(r.sample_id, r.reason) if isinstance(r, Dropped) else (r.sample_id, r.messages, r.images)
            for r in items]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(PNG)
    (tmp_path / "imgs" / "b.jpg").write_bytes(JPEG)
    (tmp_path / "imgs" / "c.png").write_bytes(PNG2)
    return tmp_path


# ---------------------------------------------------------------------------------------------
# LLaVA / ShareGPT


def test_llava_json_array_with_placeholder(root):
    recs = [{"id": "q-1", "image": "imgs/a.png", "conversations": _chat("<image>\nWhat is it?")},
            {"id": 7, "conversations": _chat("Hi")}]
    (root / "llava.json").write_text(json.dumps(recs, indent=2))
    a, b = _read_all([root / "llava.json"])
    # the newline after <image> is the source's text (LLaVA trains on "<image>\n"); kept in the record
    assert a == Record("q-1", ({"role": "user", "content": [IMG, _text("\nWhat is it?")]},
                               {"role": "assistant", "content": [_text("A thing.")]}), (PNG,))
    assert b.sample_id == "7" and b.images == ()  # int id stringified; text-only is first-class
    assert b.messages[0] == {"role": "user", "content": [_text("Hi")]}


def test_llava_multi_image_order_and_text_kept_as_is(root):
    conv = [{"from": "human", "value": "First <image> then\n<image>\nand  <image>"},
            {"from": "gpt", "value": "  three  \n"}]
    rec = _one(root, {"image": ["imgs/b.jpg", "imgs/a.png", "imgs/c.png"], "conversations": conv})
    assert rec.messages[0]["content"] == [_text("First "), IMG, _text(" then\n"), IMG, _text("\nand  "), IMG]
    assert rec.messages[1]["content"] == [_text("  three  \n")]
    assert rec.images == (JPEG, PNG, PNG2)


def test_llava_images_without_placeholder_go_to_first_user_turn(root):
    conv = [{"from": "system", "value": "Be brief."}, *_chat("Describe."), *_chat("More?", "No.")]
    rec = _one(root, {"image": ["imgs/a.png", "imgs/b.jpg"], "conversations": conv})
    assert [m["role"] for m in rec.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert rec.messages[0]["content"] == [_text("Be brief.")]
    assert rec.messages[1]["content"] == [IMG, IMG, _text("Describe.")]
    assert rec.images == (PNG, JPEG)


@pytest.mark.parametrize("user, assistant", [("human", "gpt"), ("user", "assistant"), ("Human", "bot"),
                                             ("USER", "chatgpt"), ("human", "model")])
def test_role_aliases(root, user, assistant):
    conv = [{"from": "system", "value": "s"}, {"from": user, "value": "q"},
            {"from": assistant, "value": "a"}, {"from": assistant, "value": "a2"}]  # same role twice is fine
    rec = _one(root, {"conversations": conv})
    assert [m["role"] for m in rec.messages] == ["system", "user", "assistant", "assistant"]


def test_unknown_role_names_role_and_accepted_ones(root):
    conv = [{"from": "human", "value": "q"}, {"from": "narrator", "value": "x"}, {"from": "gpt", "value": "a"}]
    d = _one(root, {"conversations": conv})
    assert isinstance(d, Dropped) and d.reason == "unknown_role" and d.sample_id == "one.jsonl:0"
    assert "'narrator'" in d.detail and "system, user, assistant" in d.detail and "gpt" in d.detail


@pytest.mark.parametrize("question, images", [
    ("<image>\n<image>\nQ", ["imgs/a.png"]),              # more placeholders than images
    ("<image>\nQ", ["imgs/a.png", "imgs/b.jpg"]),         # fewer
    ("<image>\nQ", []),                                   # placeholder, no image
])
def test_placeholder_mismatch(root, question, images):
    d = _one(root, {"image": images, "conversations": _chat(question)})
    assert isinstance(d, Dropped) and d.reason == "placeholder_mismatch"
    assert f"but {len(images)} image" in d.detail


@pytest.mark.parametrize("record, reason", [
    ({"conversations": []}, "empty_conversation"),
    ({"conversations": _chat(" ", "")}, "empty_conversation"),
    ({"messages": []}, "empty_conversation"),
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "human", "value": "q2"}]},
     "no_assistant_turn"),
    ({"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"}]},
     "no_assistant_turn"),
    ({"conversations": "human: hi"}, "malformed_record"),
    ({"conversations": [{"from": "human", "value": 3}, {"from": "gpt", "value": "a"}]}, "malformed_record"),
    ({"conversations": [{"value": "q"}, {"from": "gpt", "value": "a"}]}, "malformed_record"),
    ({"conversations": [["human", "q"]]}, "malformed_record"),
    ({"image": 5, "conversations": _chat()}, "malformed_record"),
    ({"image": ["imgs/a.png", None], "conversations": _chat("<image><image>")}, "malformed_record"),
    ({"prompt": "q", "answer": "a"}, "malformed_record"),
    ({"id": 1.5, "conversations": _chat()}, "malformed_record"),
    ({"id": ["x"], "conversations": _chat()}, "malformed_record"),
    ({"id": True, "conversations": _chat()}, "malformed_record"),
])
def test_bad_records_are_dropped_with_their_reason(root, record, reason):
    d = _one(root, record)
    assert isinstance(d, Dropped), d
    assert d.reason == reason and d.reason in DROP_REASONS and d.detail
    assert d.sample_id == "one.jsonl:0"  # a bad or missing id falls back to the position


def test_missing_image(root):
    d = _one(root, {"id": "m", "image": "imgs/nope.png", "conversations": _chat("<image>\nQ")})
    assert (d.sample_id, d.reason) == ("m", "missing_image") and "imgs/nope.png" in d.detail
    d = _one(root, {"image": "imgs", "conversations": _chat()})  # a folder is not an image file
    assert d.reason == "missing_image"


def test_image_path_escape(root, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.png").write_bytes(PNG)
    (root / "imgs" / "link.png").symlink_to(outside / "secret.png")
    (root / "imgs" / "dirlink").symlink_to(outside)
    # an explicit root: the path as written must stay inside it (`..` out, absolute paths elsewhere)
    for path in ["../outside.png", "sub/../../x.png", str(outside / "secret.png"), "dirlink/../../x.png"]:
        d = _one(root, {"image": path, "conversations": _chat()}, image_root=str(root / "imgs"))
        assert isinstance(d, Dropped) and d.reason == "image_path_escape", path
        assert str(root / "imgs") in d.detail
    # inside the root, an absolute path and a path through `..` that comes back are fine
    ok = _one(root, {"image": [str(root / "imgs" / "a.png"), "sub/../b.jpg"],
                     "conversations": _chat("<image><image>")}, image_root=str(root / "imgs"))
    assert ok.images == (PNG, JPEG)
    # symlinks are followed, not judged: where a link inside the root points is not an escape (#19)
    ok = _one(root, {"image": ["link.png", "dirlink/secret.png"], "conversations": _chat("<image><image>")},
              image_root=str(root / "imgs"))
    assert ok.images == (PNG, PNG)


def test_absolute_image_paths_need_no_root_unless_one_is_given(root, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "x.jpg").write_bytes(JPEG)
    (root / "data").mkdir()
    path = root / "data" / "abs.jsonl"
    path.write_text(json.dumps({"image": str(elsewhere / "x.jpg"), "conversations": _chat()}) + "\n"
                    + json.dumps({"image": "../imgs/a.png", "conversations": _chat()}) + "\n")
    rec, rel = _read_all([path])  # no --image-root: an absolute path means what it says
    assert rec.images == (JPEG,) and rec.image_names == (str(elsewhere / "x.jpg"),)
    assert rel.reason == "image_path_escape" and "data" in rel.detail  # relative paths stay in the file's folder
    d, _ = _read_all([path], image_root=str(root / "imgs"))  # an explicit root confines them too
    assert d.reason == "image_path_escape" and "--image-root" in d.detail


def test_image_root_defaults_to_the_files_folder_and_can_be_given(root):
    (root / "data").mkdir()
    (root / "data" / "x.jsonl").write_text(json.dumps({"image": "a.png", "conversations": _chat()}) + "\n")
    (d,) = _read_all([root / "data" / "x.jsonl"])
    assert d.reason == "missing_image"  # looked in data/
    (rec,) = _read_all([root / "data" / "x.jsonl"], image_root=str(root / "imgs"))
    assert rec.images == (PNG,)
    with pytest.raises(SourceError, match="image root"):
        list_partitions([str(root / "data")], image_root=str(root / "nope"))


# ---------------------------------------------------------------------------------------------
# OpenAI / Hugging Face messages


def test_messages_string_content_with_placeholders(root):
    rec = _one(root, {"messages": [{"role": "system", "content": "sys"},
                                   {"role": "user", "content": "<image>\nCompare with <image>"},
                                   {"role": "assistant", "content": "Same."}],
                      "images": ["imgs/a.png", "imgs/b.jpg"]})
    assert rec.messages[1]["content"] == [IMG, _text("\nCompare with "), IMG]
    assert rec.images == (PNG, JPEG)


def test_messages_typed_parts(root):
    data_url = "data:image/png;base64," + base64.b64encode(PNG2).decode()
    rec = _one(root, {"messages": [
        {"role": "user", "content": [IMG, _text("and"), {"type": "image", "image": "imgs/c.png"},
                                     {"type": "image_url", "image_url": {"url": data_url}}, IMG]},
        {"role": "assistant", "content": [_text("ok")]}], "images": ["imgs/b.jpg", "imgs/a.png"]})
    assert rec.messages[0]["content"] == [IMG, _text("and"), IMG, IMG, IMG]
    assert rec.images == (JPEG, PNG2, PNG2, PNG)  # bare parts take the list in order; inline ones their own
    null_struct = {"type": "image", "image": {"bytes": None, "path": None}}  # as Arrow gives a bare part
    rec = _one(root, {"messages": [{"role": "user", "content": [null_struct, _text("Q")]},
                                   {"role": "assistant", "content": "A"}], "images": ["imgs/c.png"]})
    assert rec.images == (PNG2,)


def test_messages_typed_parts_without_image_parts_get_images_first(root):
    rec = _one(root, {"messages": [{"role": "user", "content": [_text("Q")]},
                                   {"role": "assistant", "content": [_text("A")]}], "images": ["imgs/a.png"]})
    assert rec.messages[0]["content"] == [IMG, _text("Q")]


@pytest.mark.parametrize("record, reason", [
    ({"messages": [{"role": "user", "content": [IMG, IMG]}, {"role": "assistant", "content": "a"}],
      "images": ["imgs/a.png"]}, "placeholder_mismatch"),
    ({"messages": [{"role": "narrator", "content": "x"}, {"role": "assistant", "content": "a"}]}, "unknown_role"),
    ({"messages": [{"role": "user", "content": [{"type": "audio"}]}, {"role": "assistant", "content": "a"}]},
     "placeholder_mismatch"),  # a bare audio part takes the record's next audio: it has none
    ({"messages": [{"role": "user", "content": [{"type": "chart"}]}, {"role": "assistant", "content": "a"}]},
     "malformed_record"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}, {"role": "assistant", "content": "a"}]},
     "malformed_record"),
    ({"messages": [{"role": "user", "content": None}, {"role": "assistant", "content": "a"}]},
     "malformed_record"),
    ({"messages": [{"role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
                   {"role": "assistant", "content": "a"}]}, "missing_image"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "image": "../../etc/passwd"}]},
                   {"role": "assistant", "content": "a"}]}, "image_path_escape"),
])
def test_messages_bad_records(root, record, reason):
    d = _one(root, record)
    assert isinstance(d, Dropped) and d.reason == reason, d


# ---------------------------------------------------------------------------------------------
# JSONL robustness


def test_malformed_lines_in_the_middle_lose_nothing_around_them(root):
    good = json.dumps({"conversations": _chat()}).encode()
    lines = [good, b"{not json", good, b'{"conversations": "\xff\xfe broken utf-8"}', b"[1, 2]", b"", b"  ",
             good, json.dumps({"id": "last", "conversations": _chat()}).encode()]
    (root / "mixed.jsonl").write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(lines))  # BOM, CRLF, no final newline
    items = _read_all([root / "mixed.jsonl"], records_per_partition=2)
    assert [(r.sample_id, getattr(r, "reason", "ok")) for r in items] == [
        ("mixed.jsonl:0", "ok"), ("mixed.jsonl:1", "malformed_record"), ("mixed.jsonl:2", "ok"),
        ("mixed.jsonl:3", "malformed_record"), ("mixed.jsonl:4", "malformed_record"),
        ("mixed.jsonl:5", "ok"), ("last", "ok")]
    assert "UTF-8" in items[3].detail and "JSON" in items[1].detail


def test_json_file_holding_json_lines_is_read_as_lines(root):
    lines = [json.dumps({"conversations": _chat(str(i))}) for i in range(3)]
    (root / "lines.json").write_text("\n".join(lines))
    assert [r.sample_id for r in _read_all([root / "lines.json"])] == [f"lines.json:{i}" for i in range(3)]


def test_json_array_with_a_bad_element_keeps_the_others(root):
    (root / "arr.json").write_text('[{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", '
                                   '"value": "a"}]}, {"conversations": [tru]}, 3, \n{"conversations": []}]')
    items = _read_all([root / "arr.json"])
    assert [getattr(r, "reason", "ok") for r in items] == ["ok", "malformed_record", "malformed_record",
                                                           "empty_conversation"]


@pytest.mark.parametrize("content, match", [
    ("{\n  \"conversations\": []\n}", "does not start with"),
    ("[{\"a\": 1}, {\"b\": [}", "do not balance"),
    ("[{\"a\": \"open string}]", "not closed"),
    ("[1, 2] [3]", "more than one"),
])
def test_json_that_is_not_an_array_is_a_source_error(root, content, match):
    (root / "bad.json").write_text(content)
    with pytest.raises(SourceError, match=match) as e:
        list_partitions([str(root / "bad.json")])
    assert "bad.json" in str(e.value)


# ---------------------------------------------------------------------------------------------
# Parquet and save_to_disk


def _rows_messages(n: int) -> list[dict]:
    return [{"id": None if i % 3 else f"p{i}",
             "messages": [{"role": "user",
                           "content": [{"type": "image", "text": None}, {"type": "text", "text": f"q{i}"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": f"a{i}"}]}]}
            for i in range(n)]


@pytest.mark.parametrize("layout", ["struct", "raw", "single"])
def test_parquet_messages_with_image_bytes(root, layout):
    rows = _rows_messages(7)
    images = [PNG if i % 2 else JPEG for i in range(7)]
    if layout == "struct":
        col = {"images": [[{"bytes": b, "path": f"{i}.png"}] for i, b in enumerate(images)]}
    elif layout == "raw":
        col = {"images": [[b] for b in images]}
    else:
        col = {"image": [{"bytes": b, "path": None} for b in images]}
    table = pa.Table.from_pylist([{**r, **{k: v[i] for k, v in col.items()}} for i, r in enumerate(rows)])
    pq.write_table(table, root / "vlm.parquet", row_group_size=2)
    parts = list_partitions([str(root / "vlm.parquet")], records_per_partition=3)
    assert [(p.kind, p.start, p.stop, p.first_row) for p in parts] == [
        ("parquet", 0, 2, 0), ("parquet", 2, 4, 4)]  # row groups of 2 merged up to >= 3 rows
    items = [r for p in parts for r in iter_records(p)]
    assert [r.sample_id for r in items] == ["p0", "vlm.parquet:1", "vlm.parquet:2", "p3", "vlm.parquet:4",
                                            "vlm.parquet:5", "p6"]
    assert [r.images for r in items] == [(b,) for b in images]
    assert items[4].messages == ({"role": "user", "content": [IMG, _text("q4")]},
                                 {"role": "assistant", "content": [_text("a4")]})
    assert _summary(items) == _summary(_read_all([root / "vlm.parquet"], records_per_partition=1))


def test_parquet_llava_conversations_with_image_struct(root):
    table = pa.table({"id": ["x", "y"], "image": [{"bytes": PNG, "path": "a.png"}, None],
                      "conversations": [_chat("<image>\nQ"), _chat("text only")]})
    pq.write_table(table, root / "ov.parquet")
    x, y = _read_all([root / "ov.parquet"])
    assert x.images == (PNG,) and x.messages[0]["content"] == [IMG, _text("\nQ")]
    assert y.images == () and y.sample_id == "y"


def test_parquet_image_path_only_is_read_from_the_image_root(root):
    table = pa.table({"images": [[{"bytes": None, "path": "imgs/b.jpg"}],
                                 [{"bytes": None, "path": "../x.png"}]],
                      "texts": [[{"user": "q", "assistant": "a"}]] * 2})
    pq.write_table(table, root / "paths.parquet")
    ok, bad = _read_all([root / "paths.parquet"])
    assert ok.images == (JPEG,) and bad.reason == "image_path_escape"


def test_parquet_without_a_conversation_column_is_a_source_error(root):
    pq.write_table(pa.table({"question": ["q"], "answer": ["a"]}), root / "qa.parquet")
    with pytest.raises(SourceError, match="messages"):
        list_partitions([str(root / "qa.parquet")])


@pytest.fixture(scope="module")
def datasets_lib():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    return datasets


def test_save_to_disk_texts_the_cauldron_style(root, datasets_lib):
    ds = datasets_lib
    features = ds.Features({
        "images": ds.List(ds.Image()),
        "texts": ds.List({k: ds.Value("string") for k in ("user", "assistant", "source")}),
    })
    n = 9
    data = {"images": [[{"bytes": PNG, "path": None}, {"bytes": JPEG, "path": None}] if i % 3 == 0 else
                       [{"bytes": PNG2, "path": None}] if i % 3 == 1 else [] for i in range(n)],
            "texts": [[{"user": f"q{i}", "assistant": f"a{i}", "source": "s"},
                       {"user": "more?", "assistant": "no", "source": "s"}] for i in range(n)]}
    ds.Dataset.from_dict(data, features=features).save_to_disk(str(root / "cauldron"), num_shards=2,
                                                                 max_shard_size=None)
    items = _read_all([root / "cauldron"], records_per_partition=2)
    assert len(items) == n and all(isinstance(r, Record) for r in items)
    assert items[0].sample_id == "cauldron/data-00000-of-00002.arrow:0"
    assert items[-1].sample_id.startswith("cauldron/data-00001-of-00002.arrow:")
    assert items[0].images == (PNG, JPEG) and items[1].images == (PNG2,) and items[2].images == ()
    assert items[0].messages == (
        {"role": "user", "content": [IMG, IMG, _text("q0")]}, {"role": "assistant", "content": [_text("a0")]},
        {"role": "user", "content": [_text("more?")]}, {"role": "assistant", "content": [_text("no")]})
    assert _summary(items) == _summary(_read_all([root / "cauldron"], records_per_partition=1000))


def test_save_to_disk_messages_many_batches(root, datasets_lib):
    rows = _rows_messages(25)
    data = {"id": [r["id"] for r in rows], "messages": [r["messages"] for r in rows],
            "images": [[PNG if i % 2 else JPEG] for i in range(25)]}
    dataset = datasets_lib.Dataset.from_dict(data)
    dataset.save_to_disk(str(root / "msgs"))
    # datasets writes batches of its own size; write small batches too, as a big dataset would have
    arrow = next((root / "msgs").glob("data-*.arrow"))
    table = pa.ipc.open_stream(arrow.read_bytes()).read_all()
    with pa.OSFile(str(arrow), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=4):
            writer.write_batch(batch)
    for per in (1, 5, 8, 1000):
        parts = list_partitions([str(root / "msgs")], records_per_partition=per)
        assert all(p.kind == "arrow" for p in parts)
        items = [r for p in parts for r in iter_records(p)]
        assert [r.sample_id for r in items] == [f"p{i}" if i % 3 == 0 else f"msgs/{arrow.name}:{i}"
                                                for i in range(25)]
        assert [r.images for r in items] == [(PNG if i % 2 else JPEG,) for i in range(25)]


def test_save_to_disk_dataset_dict_folder(root, datasets_lib):
    split = {"conversations": [_chat("q"), _chat("r")]}
    datasets_lib.DatasetDict({"train": datasets_lib.Dataset.from_dict(split),
                              "test": datasets_lib.Dataset.from_dict(split)}).save_to_disk(str(root / "dd"))
    ids = [r.sample_id for r in _read_all([root / "dd"])]  # dataset_dict.json is metadata, not records
    assert ids == [f"{s}/data-00000-of-00001.arrow:{i}" for s in ("test", "train") for i in (0, 1)]
    ids = [r.sample_id for r in _read_all([root / "dd" / "train"])]
    assert ids == ["train/data-00000-of-00001.arrow:0", "train/data-00000-of-00001.arrow:1"]


def test_arrow_file_format_named_directly(root):
    table = pa.table({"texts": [[{"user": f"q{i}", "assistant": "a"}] for i in range(5)],
                      "images": [[PNG]] * 5})
    with pa.OSFile(str(root / "t.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=2):
            writer.write_batch(batch)
    items = _read_all([root / "t.arrow"], records_per_partition=2)
    assert [r.sample_id for r in items] == [f"t.arrow:{i}" for i in range(5)]
    assert items[3].messages[0]["content"] == [IMG, _text("q3")] and items[3].images == (PNG,)


# ---------------------------------------------------------------------------------------------
# Folders, globs, errors on whole sources


def test_folders_and_globs(root):
    (root / "a").mkdir()
    (root / "a" / "deep").mkdir()
    (root / ".hidden").mkdir()
    for name in ["a/one.jsonl", "a/deep/two.json", ".hidden/x.jsonl", "a/.skip.jsonl"]:
        (root / name).write_text(json.dumps([{"conversations": _chat()}]) if name.endswith(".json")
                                 else json.dumps({"conversations": _chat()}) + "\n")
    (root / "a" / "notes.txt").write_text("not a source")
    pq.write_table(pa.table({"texts": [[{"user": "q", "assistant": "a"}]]}), root / "a/deep/t.parquet")
    ids = [r.sample_id for r in _read_all([root / "a"])]
    assert ids == ["deep/t.parquet:0", "deep/two.json:0", "one.jsonl:0"]  # sorted, relative to the folder
    ids = [r.sample_id for r in _read_all([str(root / "a" / "**" / "*.json*")])]
    assert ids == ["deep/two.json:0", "one.jsonl:0"]  # relative to the glob's fixed part
    # a file reached twice is read once; sources keep their order
    ids = [r.sample_id for r in _read_all([root / "a" / "one.jsonl", root / "a"])]
    assert ids == ["one.jsonl:0", "deep/t.parquet:0", "deep/two.json:0"]


@pytest.mark.parametrize("make, match", [
    (lambda r: str(r / "missing.jsonl"), "does not exist"),
    (lambda r: str(r / "*.nothing"), "matches nothing"),
    (lambda r: (r / "x.csv").write_text("a,b") and str(r / "x.csv"), "unknown format"),
    (lambda r: (r / "empty").mkdir() or str(r / "empty"), "no source files"),
    (lambda r: "hf://datasets/org/repo/data.parquet", "URL"),
    (lambda r: (r / "x.arrow").write_bytes(b"not arrow") and str(r / "x.arrow"), "Arrow"),
])
def test_unreadable_sources_are_source_errors(root, make, match):
    with pytest.raises(SourceError, match=match) as e:
        list_partitions([make(root)])
    assert str(root) in str(e.value) or "hf://" in str(e.value)  # the message names the source


def test_records_per_partition_must_be_positive(root):
    with pytest.raises(ConfigError, match="records_per_partition"):
        list_partitions([str(root)], records_per_partition=0)


def test_partition_is_picklable_and_public_api_is_complete(root):
    (root / "x.jsonl").write_text(json.dumps({"conversations": _chat()}) + "\n")
    (p,) = list_partitions([str(root / "x.jsonl")])
    assert pickle.loads(pickle.dumps(p)) == p
    assert [r.sample_id for r in iter_records(pickle.loads(pickle.dumps(p)))] == ["x.jsonl:0"]
    public = {n for n, v in vars(sources).items()
              if not n.startswith("_") and not isinstance(v, types.ModuleType) and n != "annotations"}
    assert public == set(sources.__all__)


# ---------------------------------------------------------------------------------------------
# Partitioning properties

_tricky = st.lists(st.sampled_from(list('ab ,[]{}"\\\n\t/é中😀<>') + ["<image>", "<image>\n"]),
                  max_size=8).map("".join)
_record = st.one_of(
    st.builds(lambda q, a, i: {"conversations": _chat(q, a), **({"id": i} if i else {})},
              _tricky, _tricky, st.one_of(st.none(), st.integers(0, 10**6).map(str))),
    st.builds(lambda q: {"messages": [{"role": "user", "content": q}, {"role": "gpt", "content": "x"}]},
              _tricky),
    st.just("BAD"), st.just("BLANK"))


@given(records=st.lists(_record, max_size=30), per=st.integers(1, 12), indent=st.sampled_from([None, 0, 2]),
       newline=st.sampled_from(["\n", "\r\n"]))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_partitioning_never_changes_records_or_ids(tmp_path, records, per, indent, newline):
    lines = [" " * (k * 7 % 40) if r == "BLANK" else '{"broken": ' if r == "BAD"
             else json.dumps(r, ensure_ascii=False) for k, r in enumerate(records)]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_bytes(newline.join(lines).encode())
    whole = _read_all([jsonl], records_per_partition=10**6)
    assert len(whole) == sum(r != "BLANK" for r in records)  # every non-blank line: a Record or a Dropped
    assert [r.sample_id for r in whole if isinstance(r, Dropped) and r.reason == "malformed_record"] == [
        f"p.jsonl:{k}" for k, r in enumerate(r for r in records if r != "BLANK") if r == "BAD"]
    parts = list_partitions([str(jsonl)], records_per_partition=per)
    assert [p.first_row for p in parts] == list(range(0, len(whole), per))
    assert all(a.stop == b.start for a, b in itertools.pairwise(parts))  # byte ranges tile the file
    assert _summary(r for p in parts for r in iter_records(p)) == _summary(whole)

    array = [r for r in records if r not in ("BAD", "BLANK")]
    js = tmp_path / "p.json"
    js.write_text(json.dumps(array, indent=indent, ensure_ascii=False), encoding="utf-8")
    parts = list_partitions([str(js)], records_per_partition=per)
    items = [r for p in parts for r in iter_records(p)]
    assert len(items) == len(array) and [p.first_row for p in parts] == list(range(0, len(array), per))
    assert [r.sample_id for r in items] == [str(r.get("id") or f"p.json:{k}") for k, r in enumerate(array)]
    assert _summary(items) == _summary(_read_all([js], records_per_partition=10**6))


_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(alphabet='ab,[]{}"\\ é', max_size=6)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='k,]"\\', max_size=3), inner,
                                                                max_size=3),
    max_leaves=8)


@given(values=st.lists(_json_values, max_size=8), block=st.integers(1, 9), indent=st.sampled_from([None, 1]))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_array_scanner_finds_every_element_at_any_block_size(tmp_path, values, block, indent):
    path = tmp_path / "v.json"
    text = json.dumps(values, indent=indent, ensure_ascii=False)
    path.write_text(text, encoding="utf-8")
    layout = array_separators(str(path), block_bytes=block)
    assert not isinstance(layout, str), layout
    data = path.read_bytes()
    seps = layout.separators.tolist()
    elements = [data[a + 1:b] for a, b in itertools.pairwise(seps)][:layout.count]
    assert [json.loads(e) for e in elements] == values
    if values:
        assert [json.loads(e) for e in split_array_chunk(data[seps[0] + 1:seps[-1]])] == values


@given(lines=st.lists(st.sampled_from(["", " ", "\r", "{}", '{"a": "x"}', "[1]", "  {}  ", "\t", " " * 40,
                                      "\t" * 20 + "{}", "\ufeff{}", "\ufeff"]), max_size=25),
       block=st.integers(1, 9), every=st.integers(1, 5), final_newline=st.booleans())
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_jsonl_scanner_matches_a_line_by_line_count(tmp_path, lines, block, every, final_newline):
    path = tmp_path / "l.jsonl"
    path.write_bytes(("\n".join(lines) + ("\n" if final_newline and lines else "")).encode())
    expected, pos, row = [], 0, 0
    for k, line in enumerate(lines):
        content = line[1:] if k == 0 and line.startswith("\ufeff") else line  # a BOM only at the start
        if content.strip(" \t\r\n"):
            if row % every == 0:
                expected.append((pos, row))
            row += 1
        pos += len(line.encode()) + 1
    assert jsonl_boundaries(str(path), every=every, block_bytes=block) == expected


def test_empty_files_have_no_partitions(root):
    (root / "e.jsonl").write_bytes(b"")
    (root / "e.json").write_text("[ ]")
    assert list_partitions([str(root / "e.jsonl"), str(root / "e.json")]) == []
    assert Partition("/x", "jsonl", 0, 0, 0, "/") == Partition("/x", "jsonl", 0, 0, 0, "/", "")
