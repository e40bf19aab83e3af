"""Videos read from every source layout (#40, sources): each layout's videos in ``Record.videos``
with a ``{"type": "video"}`` part where each goes; images and videos mixed, each with its own list;
LLaVA-Video's ``<image>`` standing for its video; Parquet ``videos`` columns; WebDataset shards with
video members; and each bad video's own drop reason (missing, out of the root, empty, too large).

The sources never decode a video: two real clips made once with PyAV stand for what people have,
and the bytes read must be exactly the file's.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from tests.support.pretrain import write_tar
from wdspack.errors import DROP_REASONS, Dropped, SampleError
from wdspack.media.video import source as videos
from wdspack.packer.sources import Record, TextRecord, iter_records, list_partitions
from wdspack.packer.sources.documents import IMAGE, VIDEO

av = pytest.importorskip("av")

IMG, VID = {"type": "image"}, {"type": "video"}


def _text(s: str) -> dict:
    return {"type": "text", "text": s}


def _clip(codec: str, fmt: str, frames: int, width: int, height: int) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as out:
        stream = out.add_stream(codec, rate=Fraction(10))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for k in range(frames):
            pixels = np.full((height, width, 3), (k * 11) % 256, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


@pytest.fixture(scope="module")
def clips() -> tuple[bytes, bytes]:
    """An MP4 (h264) and a WebM (VP9) clip, a dozen frames each."""
    return _clip("h264", "mp4", 12, 48, 32), _clip("libvpx-vp9", "webm", 10, 32, 32)


def _png(color: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (6, 4), color).save(buf, "PNG")
    return buf.getvalue()


RED = _png("red")


@pytest.fixture
def root(tmp_path: Path, clips) -> Path:
    """``tmp_path`` holding ``clips/a.mp4``, ``clips/b.webm`` and ``imgs/red.png``."""
    (tmp_path / "clips").mkdir()
    (tmp_path / "imgs").mkdir()
    (tmp_path / "clips" / "a.mp4").write_bytes(clips[0])
    (tmp_path / "clips" / "b.webm").write_bytes(clips[1])
    (tmp_path / "imgs" / "red.png").write_bytes(RED)
    return tmp_path


def _read_all(paths, **kw) -> list[Record | TextRecord | Dropped]:
    return [r for p in list_partitions([str(s) for s in paths], **kw) for r in iter_records(p)]


def _one(root: Path, record: dict, **kw) -> Record | Dropped:
    path = root / "one.jsonl"
    path.write_text(json.dumps(record) + "\n")
    (item,) = _read_all([path], **kw)
    return item


def _drop(root: Path, record: dict, reason: str, *words: str, **kw) -> Dropped:
    d = _one(root, record, **kw)
    assert isinstance(d, Dropped), d
    assert d.reason == reason and reason in DROP_REASONS, d
    for w in words:
        assert w in d.detail, (w, d.detail)
    return d


def _chat(question: str, answer: str = "A man walks.") -> list[dict]:
    return [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]


# ---- the layouts ---------------------------------------------------------------------------------


def test_llamafactory_mllm_video_demo(root, clips):
    # LLaMA-Factory data/mllm_video_demo.json (ms-swift's `messages` + `videos` read the same)
    rec = _one(root, {"messages": [{"content": "<video>Why is this video funny?", "role": "user"},
                                   {"content": "Because a baby is wearing glasses.", "role": "assistant"}],
                      "videos": ["clips/a.mp4"]})
    assert rec.messages[0]["content"] == [VID, _text("Why is this video funny?")]
    assert rec.messages[1]["content"] == [_text("Because a baby is wearing glasses.")]
    assert rec.videos == (clips[0],) and rec.video_names == ("clips/a.mp4",) and rec.images == ()


def test_ms_swift_images_and_videos_each_take_their_own_list(root, clips):
    # ms-swift's Custom-dataset.md: "<image>What is in the image, <video>What is in the video?", absolute paths
    rec = _one(root, {"messages": [
        {"role": "user", "content": "<image>What is in the image, <video>What is in the video? <video>And here?"},
        {"role": "assistant", "content": "An elephant, and a puppy running on the grass."}],
        "images": [str(root / "imgs" / "red.png")], "videos": [str(root / "clips" / "b.webm"),
                                                               str(root / "clips" / "a.mp4")]})
    assert rec.messages[0]["content"] == [IMG, _text("What is in the image, "), VID, _text("What is in the video? "),
                                          VID, _text("And here?")]
    assert rec.images == (RED,) and rec.videos == (clips[1], clips[0])
    assert rec.video_names == (str(root / "clips" / "b.webm"), str(root / "clips" / "a.mp4"))


def test_qwen2_vl_finetune_and_internvl_video_string(root, clips):
    # 2U1/Qwen2-VL-Finetune and InternVL: `video` a path string, "<video>\n" in the first human turn
    rec = _one(root, {"id": "sample1", "video": "clips/a.mp4",
                      "conversations": _chat("<video>\nWhat is going on in this video?")})
    assert rec.sample_id == "sample1" and rec.videos == (clips[0],)
    assert rec.messages[0] == {"role": "user", "content": [VID, _text("\nWhat is going on in this video?")]}


def test_llava_video_writes_image_for_its_video(root, clips):
    # LLaVA-Video-178K: `video` + `conversations`, "<image>\n" standing for the video
    rec = _one(root, {"id": "v_1", "video": "clips/b.webm", "data_source": "academic",
                      "conversations": _chat("<image>\nWhat does the man do?", "He walks.")})
    assert rec.messages[0]["content"] == [VID, _text("\nWhat does the man do?")]
    assert rec.videos == (clips[1],) and rec.images == ()
    _drop(root, {"video": "clips/b.webm", "conversations": _chat("<image>\n<image>\nBoth?")}, "placeholder_mismatch",
          "2 video placeholder(s)", "LLaVA-Video", "but 1 video(s)")
    # with images too, <image> is an image's place and the video goes first
    rec = _one(root, {"video": "clips/a.mp4", "image": "imgs/red.png", "conversations": _chat("<image>\nCompare.")})
    assert rec.messages[0]["content"] == [VID, IMG, _text("\nCompare.")]
    assert rec.images == (RED,) and rec.videos == (clips[0],)


def test_without_placeholders_videos_go_first_in_the_first_user_turn_before_images(root, clips):
    rec = _one(root, {"system": "Be brief.", "messages": [{"role": "user", "content": "Describe them."},
                                                          {"role": "assistant", "content": "A red frame."}],
                      "images": ["imgs/red.png"], "videos": ["clips/a.mp4", "clips/b.webm"]})
    assert [m["role"] for m in rec.messages] == ["system", "user", "assistant"]
    assert rec.messages[1]["content"] == [VID, VID, IMG, _text("Describe them.")]
    assert rec.videos == clips and rec.images == (RED,)


def test_typed_video_parts(root, clips):
    data_url = "data:video/mp4;base64," + base64.b64encode(clips[0]).decode()
    rec = _one(root, {"messages": [
        {"role": "user", "content": [
            {"type": "video", "video": "clips/b.webm"}, VID, {"type": "text", "text": "then"},
            {"type": "video_url", "video_url": {"url": "file://" + str(root / "clips" / "a.mp4")}},
            {"type": "input_video", "input_video": data_url}, {"type": "video_url", "value": "clips/a.mp4"},
            IMG, VID]},
        {"role": "assistant", "content": [_text("Six clips and a picture.")]}],
        "videos": ["clips/a.mp4", {"path": "clips/b.webm"}], "images": ["imgs/red.png"]})
    assert rec.messages[0]["content"] == [VID, VID, _text("then"), VID, VID, VID, IMG, VID]
    # parts with their own video take nothing from the list; bare ones take it in order
    assert rec.videos == (clips[1], clips[0], clips[0], clips[0], clips[0], clips[1])
    assert rec.video_names == ("clips/b.webm", "clips/a.mp4", "file://" + str(root / "clips" / "a.mp4"),
                               "a data: URL", "clips/a.mp4", "clips/b.webm")
    assert rec.images == (RED,)


def test_a_video_tag_in_an_answer_is_text(root, clips):
    rec = _one(root, {"messages": [{"role": "user", "content": "<video>How do I embed this clip?"},
                                   {"role": "assistant", "content": "Use the <video> element."}],
                      "videos": ["clips/a.mp4"]})
    assert rec.messages[0]["content"] == [VID, _text("How do I embed this clip?")]
    assert rec.messages[1]["content"] == [_text("Use the <video> element.")] and rec.videos == (clips[0],)


def test_parquet_video_columns(root, clips):
    # datasets' Video feature stores {bytes, path} structs, as its Image feature does; typed parts are structs
    prompt = [{"type": "video", "text": None}, {"type": "text", "text": "What happens?"}]
    table = pa.table({
        "id": ["inline", "by-path", "escape"],
        "videos": [[{"bytes": clips[0], "path": "a.mp4"}], [{"bytes": None, "path": "clips/b.webm"}],
                   [{"bytes": None, "path": "../b.webm"}]],
        "messages": [[{"role": "user", "content": prompt}, {"role": "assistant", "content": [_text("It moves.")]}]] * 3,
    })
    pq.write_table(table, root / "videos.parquet")
    inline, by_path, escape = _read_all([root / "videos.parquet"])
    assert inline.videos == (clips[0],) and inline.video_names == ("a.mp4",)
    assert inline.messages[0]["content"] == [VID, _text("What happens?")]
    assert by_path.videos == (clips[1],)
    assert isinstance(escape, Dropped) and escape.reason == "video_path_escape" and "'../b.webm'" in escape.detail


# ---- bad videos ----------------------------------------------------------------------------------


def test_placeholder_mismatch_names_both_counts(root):
    _drop(root, {"videos": ["clips/a.mp4"], "conversations": _chat("<video><video>Two?")}, "placeholder_mismatch",
          "2 video placeholder(s)", "but 1 video(s)")
    _drop(root, {"videos": ["clips/a.mp4", "clips/b.webm"], "conversations": _chat("<video>One?")},
          "placeholder_mismatch", "1 video placeholder(s)", "but 2 video(s)")


def test_missing_and_escaping_videos(root, tmp_path_factory):
    d = _drop(root, {"video": "clips/nope.mp4", "conversations": _chat("<video>Q")}, "missing_video",
              "video 'clips/nope.mp4' does not exist")
    assert str(root / "clips" / "nope.mp4") in d.detail
    _drop(root, {"videos": ["../a.mp4"], "conversations": _chat("<video>Q")}, "video_path_escape",
          "video path '../a.mp4'", "outside the image root")
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "c.mp4"
    elsewhere.write_bytes(b"\x00\x00\x00\x18ftypmp42")
    _drop(root, {"videos": [str(elsewhere)], "conversations": _chat("<video>Q")}, "video_path_escape",
          str(elsewhere), image_root=str(root))  # an absolute path outside a root that was given
    _drop(root, {"videos": ["https://example.com/a.mp4"], "conversations": _chat("<video>Q")}, "missing_video",
          "remote URL")
    _drop(root, {"video": "clips", "conversations": _chat("<video>Q")}, "missing_video", "is a folder")


def test_a_url_root_serves_videos_by_the_same_rules(clips, monkeypatch):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    fs.pipe("/wdspack-video-test/clips/a.mp4", clips[0])
    try:
        root = "memory://wdspack-video-test"
        assert videos.load_video("clips/a.mp4", root) == clips[0]
        for ref, reason in (("clips/b.mp4", "missing_video"), ("../a.mp4", "video_path_escape")):
            with pytest.raises(SampleError) as e:
                videos.load_video(ref, root)
            assert e.value.reason == reason and repr(ref) in e.value.detail
        monkeypatch.setattr(videos, "MAX_VIDEO_BYTES", 100)
        with pytest.raises(SampleError) as e:
            videos.load_video("clips/a.mp4", root)  # the size asked of the store, the file not fetched
        assert e.value.reason == "unreadable_video" and f"{len(clips[0]):,} bytes" in e.value.detail
    finally:
        fs.rm("/wdspack-video-test", recursive=True)


def test_empty_videos_are_unreadable(root):
    (root / "clips" / "empty.mp4").write_bytes(b"")
    _drop(root, {"video": "clips/empty.mp4", "conversations": _chat("<video>Q")}, "unreadable_video",
          "video 'clips/empty.mp4' is empty (0 bytes)")
    pq.write_table(pa.table({"videos": [[{"bytes": b"", "path": "e.mp4"}]],
                             "conversations": [_chat("<video>Q")]}), root / "empty.parquet")
    (d,) = _read_all([root / "empty.parquet"])
    assert d.reason == "unreadable_video" and "'e.mp4' is empty" in d.detail


def test_videos_over_the_size_limit_are_unreadable_and_not_read(root, clips, monkeypatch):
    size = len(clips[0])
    monkeypatch.setattr(videos, "MAX_VIDEO_BYTES", size - 1)
    for ref in ("clips/a.mp4", "data:video/mp4;base64," + base64.b64encode(clips[0]).decode()):
        _drop(root, {"videos": [ref], "conversations": _chat("<video>Q")}, "unreadable_video",
              f"{size:,} bytes", f"over the {size - 1:,}-byte limit")
    monkeypatch.undo()
    assert videos.MAX_VIDEO_BYTES == 2 << 30
    with open(root / "clips" / "huge.mp4", "wb") as f:  # sparse: over the default limit, no disk used
        f.truncate(videos.MAX_VIDEO_BYTES + 1)
    start = time.perf_counter()
    _drop(root, {"video": "clips/huge.mp4", "conversations": _chat("<video>Q")}, "unreadable_video",
          "'clips/huge.mp4' is 2,147,483,649 bytes")
    assert time.perf_counter() - start < 1.0  # 2 GiB were never read


@pytest.mark.parametrize("record, words", [
    ({"messages": [{"role": "user", "content": [{"type": "video", "video": ["f0.jpg", "f1.jpg"]}]},
                   {"role": "assistant", "content": "A"}]}, ("list of 2 frames",)),  # qwen-vl-utils' frame list
    ({"videos": [None], "conversations": _chat("<video>Q")}, ("videos[0] is null",)),
    ({"video": 7, "conversations": _chat("<video>Q")}, ("field 'video' is int",)),
    ({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"},
                   {"role": "tool", "content": [{"type": "video", "video": "clips/a.mp4"}]}]},
     ("tool result with an image or a video",)),
])
def test_malformed_video_references(root, record, words):
    _drop(root, record, "malformed_record", *words)


@pytest.mark.parametrize("record, reason, words", [
    ({"audios": ["a.mp3"], "videos": ["clips/a.mp4"], "conversations": _chat("<video><audio>Q")}, "missing_audio",
     ("audio 'a.mp3' does not exist",)),
    ({"audios": ["../a.mp3"], "conversations": _chat("<audio>Q")}, "audio_path_escape", ("'../a.mp3'",)),
    ({"conversations": _chat("<audio>What is that sound?")}, "placeholder_mismatch", ("1 audio placeholder(s)",)),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "..."}}]},
                   {"role": "assistant", "content": "Glass."}]}, "malformed_record", ("not valid base64",)),
])
def test_audio_references_that_cannot_be_read(root, record, reason, words):
    _drop(root, record, reason, *words)


def test_a_video_and_its_sound_track_are_read_as_a_video_and_an_audio(root, clips):
    """LLaMA-Factory's ``<video><audio>``: the same file under ``videos`` and ``audios``, read as bytes once each."""
    rec = _one(root, {"videos": ["clips/a.mp4"], "audios": ["clips/a.mp4"], "conversations": _chat("<video><audio>Q")})
    assert isinstance(rec, Record), rec
    assert rec.videos == (clips[0],) and rec.media["audio"] == (clips[0],)
    assert [p["type"] for p in rec.messages[0]["content"]] == ["video", "audio", "text"]


# ---- WebDataset shards ---------------------------------------------------------------------------


def test_webdataset_video_caption_samples(tmp_path, clips, monkeypatch):
    shard = write_tar(tmp_path / "v-000000.tar", [
        ("a.mp4", clips[0]), ("a.txt", b"A grey fade."),
        ("b.jpg", RED), ("b.webm", clips[1]), ("b.json", json.dumps({"caption": "Both."}).encode()),
        ("c.mp4", clips[0]), ("c.mkv", clips[1]), ("c.txt", b"Two videos."),
        ("d.mov", b""), ("d.txt", b"Empty."),
        ("e.avi", clips[0] + b"\0"), ("e.txt", b"Too large."),
        ("f.txt", b"Nothing to see."),
    ])
    monkeypatch.setattr(videos, "MAX_VIDEO_BYTES", max(map(len, clips)))  # e.avi is a byte over
    got = {r.sample_id.rpartition(":")[2]: r for r in _read_all([shard])}
    a, b = got["a"], got["b"]
    assert isinstance(a, TextRecord) and a.kind == "caption" and a.segments == (VIDEO, "A grey fade.")
    assert a.videos == (clips[0],) and a.images == ()
    assert b.segments == (VIDEO, IMAGE, "Both.") and b.videos == (clips[1],) and b.images == (RED,)
    reasons = {k: (r.reason, r.detail) for k, r in got.items() if isinstance(r, Dropped)}
    assert reasons["c"][0] == "malformed_record" and "2 video members (['mp4', 'mkv'])" in reasons["c"][1]
    assert reasons["d"] == ("unreadable_video", "video member d.mov is empty (0 bytes); re-encode it or drop the "
                                                "sample")
    assert reasons["e"][0] == "unreadable_video" and f"{len(clips[0]) + 1:,} bytes, over the" in reasons["e"][1]
    assert reasons["f"][0] == "missing_image" and "no image, video or audio member" in reasons["f"][1]
    again = pickle.loads(pickle.dumps(a))  # records cross process boundaries: VIDEO stays itself
    assert again == a and again.segments[0] is VIDEO and repr(VIDEO) == "VIDEO"
