"""The files people have, packed end to end (#19): pack, verify, load, decode what is trained.

Each test writes a small generated file in another project's *published* layout (the project and
file it follows are named above each fixture; the records' shapes are theirs, the contents ours),
packs it with the Pixtral tokenizer and template in fixed mode (16 tokens per image), and checks
through :func:`tests.published.round_trip` that every assistant answer is trained, that no prompt
word is, that each sample kept its images, and that what this job cannot pack (audio without an audio family,
grounding objects) is dropped and counted as ``unsupported_media``, never packed as text. Video rows are read
as videos: the clips they name are not written here, so they drop as ``missing_video``, naming the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.published import RoundTrip, image_bytes, round_trip, write_image

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # the loader warns: no image_transform= here


def _dump(path: Path, rows: list[dict], *, jsonl: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if jsonl:
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    else:
        path.write_text(json.dumps(rows, indent=2, ensure_ascii=False), encoding="utf-8")
    return path


def _check(rt: RoundTrip, sid: str, *, trained: list[str], untrained: list[str], images: int) -> None:
    """The sample's answers are trained, its prompts are not, and it carries its images."""
    assert sid in rt.trained, (sid, sorted(rt.trained))
    for words in trained:
        assert words in rt.trained[sid], (sid, words, rt.trained[sid])
        assert words in rt.text[sid]
    for words in untrained:
        assert words in rt.text[sid], (sid, words, rt.text[sid])
        assert words not in rt.trained[sid], (sid, words, rt.trained[sid])
    assert rt.images[sid] == images, (sid, rt.images[sid])
    assert "<image>" not in rt.text[sid] and "<video>" not in rt.text[sid]


def _dropped(out: Path) -> dict[str, tuple[str, str]]:
    rows = [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines() if line.strip()]
    return {r["id"]: (r["reason"], r["detail"]) for r in rows}


# ---------------------------------------------------------------------------------------------
# LLaMA-Factory: data/mllm_demo.json (ShareGPT-style `messages` with <image> + `images`),
# data/mllm_video_demo.json (`videos`, <video>) and data/mllm_audio_demo.json (`audios`, <audio>)


def test_llamafactory_mllm_demo_with_its_video_and_audio_demos(tmp_path, sample_config):
    data = tmp_path / "data"
    for k in (1, 2, 3):
        write_image(data / "mllm_demo_data" / f"{k}.jpg", "JPEG", ("red", "green", "blue")[k - 1])
    mllm = _dump(data / "mllm_demo.json", [
        {"messages": [{"content": "<image>Who are they?", "role": "user"},
                      {"content": "They're two footballers celebrating.", "role": "assistant"},
                      {"content": "What are they doing?", "role": "user"},
                      {"content": "They are hugging on the pitch.", "role": "assistant"}],
         "images": ["mllm_demo_data/1.jpg"]},
        {"messages": [{"content": "<image>Who is he?", "role": "user"},
                      {"content": "A goalkeeper in a green shirt.", "role": "assistant"}],
         "images": ["mllm_demo_data/2.jpg"]},
        {"messages": [{"content": "<image><image>Which picture is bluer?", "role": "user"},
                      {"content": "The second one is bluer.", "role": "assistant"}],
         "images": ["mllm_demo_data/1.jpg", "mllm_demo_data/3.jpg"]},
    ])
    video = _dump(data / "mllm_video_demo.json", [
        {"messages": [{"content": "<video>Why is this video funny?", "role": "user"},
                      {"content": "Because a baby is wearing glasses.", "role": "assistant"}],
         "videos": ["mllm_demo_data/1.mp4"]},
        {"messages": [{"content": "<video>What is she doing?", "role": "user"},
                      {"content": "She is cooking.", "role": "assistant"}],
         "videos": ["mllm_demo_data/2.avi"]},
    ])
    import wave

    with wave.open(str(data / "mllm_demo_data" / "1.wav"), "wb") as w:  # a real sound (LLaMA-Factory ships 1.mp3)
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
        w.writeframes(b"\0\0" * 1600)
    audio = _dump(data / "mllm_audio_demo.json", [
        {"messages": [{"content": "<audio>What's that sound?", "role": "user"},
                      {"content": "Glass shattering.", "role": "assistant"}],
         "audios": ["mllm_demo_data/1.wav"]},
    ])
    out = tmp_path / "out"
    rt = round_trip([str(mllm), str(video), str(audio)], out, sample_config, max_images=4,
                    max_drop_fraction=1.0)
    assert rt.summary.samples_read == 6 and rt.summary.samples_packed == 3
    assert rt.summary.dropped_by_reason == {"missing_video": 2, "unsupported_media": 1}
    assert rt.manifest.totals["dropped_by_reason"] == {"missing_video": 2, "unsupported_media": 1}
    _check(rt, "mllm_demo.json:0", trained=["two footballers celebrating", "hugging on the pitch"],
           untrained=["Who are they?", "What are they doing?"], images=1)
    _check(rt, "mllm_demo.json:1", trained=["goalkeeper in a green shirt"], untrained=["Who is he?"], images=1)
    _check(rt, "mllm_demo.json:2", trained=["second one is bluer"], untrained=["Which picture"], images=2)
    drops = _dropped(out)
    assert set(drops) == {"mllm_video_demo.json:0", "mllm_video_demo.json:1", "mllm_audio_demo.json:0"}
    assert drops["mllm_video_demo.json:0"][0] == "missing_video" and "'mllm_demo_data/1.mp4' does not exist" in \
        drops["mllm_video_demo.json:0"][1]
    assert drops["mllm_video_demo.json:1"][0] == "missing_video" and "mllm_demo_data/2.avi" in \
        drops["mllm_video_demo.json:1"][1]
    # read, and dropped only because this job packs with a tokenizer: audio needs an audio family's processor
    assert drops["mllm_audio_demo.json:0"][0] == "unsupported_media"
    assert "audio needs --processor" in drops["mllm_audio_demo.json:0"][1]
    assert not any("baby" in t or "cooking" in t for t in rt.text.values())


# ---------------------------------------------------------------------------------------------
# LLaMA-Factory v1 (src/llamafactory/v1/utils/types.py): messages whose content is a list of
# {"type": "text" | "image_url" | "video_url" | ..., "value": str}, with a loss_weight per message


def test_llamafactory_v1_layout(tmp_path, sample_config):
    data = tmp_path / "v1"
    write_image(data / "images" / "cat.png", color="orange")
    write_image(data / "images" / "dog.png", color="brown")
    path = _dump(data / "v1_demo.jsonl", [
        {"messages": [
            {"role": "system", "content": [{"type": "text", "value": "You describe pets."}], "loss_weight": 0.0},
            {"role": "user", "content": [{"type": "image_url", "value": "images/cat.png"},
                                         {"type": "text", "value": "Which animal is this?"}], "loss_weight": 0.0},
            {"role": "assistant", "content": [{"type": "text", "value": "An orange tabby cat."}], "loss_weight": 1.0}]},
        {"messages": [
            {"role": "user", "content": [{"type": "text", "value": "Compare"},
                                         {"type": "image_url", "value": "images/cat.png"},
                                         {"type": "image_url", "value": "images/dog.png"}], "loss_weight": 0.0},
            {"role": "assistant", "content": [{"type": "text", "value": "The cat is smaller than the dog."}],
             "loss_weight": 1.0}]},
        {"messages": [
            {"role": "user", "content": [{"type": "video_url", "value": "clips/1.mp4"},
                                         {"type": "text", "value": "What happens?"}], "loss_weight": 0.0},
            {"role": "assistant", "content": [{"type": "text", "value": "The dog jumps."}], "loss_weight": 1.0}]},
    ], jsonl=True)
    out = tmp_path / "out"
    rt = round_trip([str(path)], out, sample_config, max_images=4, max_drop_fraction=0.5)
    _check(rt, "v1_demo.jsonl:0", trained=["orange tabby cat"], untrained=["You describe pets.",
                                                                         "Which animal is this?"], images=1)
    _check(rt, "v1_demo.jsonl:1", trained=["smaller than the dog"], untrained=["Compare"], images=2)
    assert rt.summary.dropped_by_reason == {"missing_video": 1}
    assert "video 'clips/1.mp4' does not exist" in _dropped(out)["v1_demo.jsonl:2"][1]


# ---------------------------------------------------------------------------------------------
# LLaVA-1.5: llava_v1_5_mix665k.json (a JSON array; `image` relative to --image-folder, a dataset
# prefix per source: coco/train2017, gqa/images, ocr_vqa/images, ...; text-only ShareGPT rows without
# `image`; "<image>\n" at the start of the first human turn)


def test_llava_v1_5_mix665k(tmp_path, sample_config):
    folder = tmp_path / "playground" / "data"
    write_image(folder / "coco" / "train2017" / "000000033471.jpg", "JPEG", "white")
    write_image(folder / "gqa" / "images" / "2354786.jpg", "JPEG", "gray")
    mix = _dump(tmp_path / "llava_v1_5_mix665k.json", [
        {"id": "000000033471", "image": "coco/train2017/000000033471.jpg", "conversations": [
            {"from": "human", "value": "<image>\nWhat are the colors of the bus in the image?"},
            {"from": "gpt", "value": "The bus in the image is white and red."},
            {"from": "human", "value": "What feature can be seen on the back of the bus?"},
            {"from": "gpt", "value": "The back of the bus features an advertisement."}]},
        {"id": "2354786", "image": "gqa/images/2354786.jpg", "conversations": [
            {"from": "human", "value": "<image>\nIs the sky dark?\nAnswer the question using a single word or phrase."},
            {"from": "gpt", "value": "Yes"}]},
        {"id": "i6IyJda_0", "model": "", "conversations": [
            {"from": "human", "value": "How to tell if a customer segment is well segmented?"},
            {"from": "gpt", "value": "Check that each segment is homogeneous and distinct."}]},
    ])
    rt = round_trip([str(mix)], tmp_path / "out", sample_config, image_root=str(folder), max_images=2)
    assert rt.summary.samples_packed == 3
    _check(rt, "000000033471", trained=["white and red", "features an advertisement"],
           untrained=["colors of the bus", "back of the bus?"], images=1)
    _check(rt, "2354786", trained=["Yes"], untrained=["Is the sky dark?"], images=1)
    _check(rt, "i6IyJda_0", trained=["homogeneous and distinct"], untrained=["well segmented"], images=0)


# ---------------------------------------------------------------------------------------------
# Qwen2-VL fine-tuning repo (2U1/Qwen2-VL-Finetune README "Dataset Preparation"): the LLaVA
# specification with --image_folder; multi-image rows list `image` with one "<image>\n" each; video
# rows carry `video` and "<video>\n"


def test_qwen2_vl_finetune_repo_layout_with_a_video_row(tmp_path, sample_config):
    images = tmp_path / "image_folder"
    write_image(images / "000000033471.jpg", "JPEG", "red")
    write_image(images / "000000033472.jpg", "JPEG", "blue")
    data = _dump(tmp_path / "train.json", [
        {"id": "000000033471", "image": "000000033471.jpg", "conversations": [
            {"from": "human", "value": "<image>\nWhat are the colors of the bus in the image?"},
            {"from": "gpt", "value": "The bus in the image is white and red."}]},
        {"id": "multi-1", "image": ["000000033471.jpg", "000000033472.jpg"], "conversations": [
            {"from": "human", "value": "<image>\n<image>\nIs the perspective of the camera different?"},
            {"from": "gpt", "value": "Yes, the perspective of the camera is different."}]},
        {"id": "sample1", "video": "sample1.mp4", "conversations": [
            {"from": "human", "value": "<video>\nWhat is going on in this video?"},
            {"from": "gpt", "value": "A man is walking down the road."}]},
    ])
    out = tmp_path / "out"
    rt = round_trip([str(data)], out, sample_config, image_root=str(images), max_images=4, max_drop_fraction=0.5)
    _check(rt, "000000033471", trained=["white and red"], untrained=["colors of the bus"], images=1)
    _check(rt, "multi-1", trained=["perspective of the camera is different"], untrained=["Is the perspective"],
           images=2)
    assert rt.summary.dropped_by_reason == {"missing_video": 1}
    reason, detail = _dropped(out)["sample1"]
    assert reason == "missing_video" and "video 'sample1.mp4' does not exist" in detail
    assert not any("walking down the road" in t for t in rt.text.values())


# ---------------------------------------------------------------------------------------------
# MiniCPM-V (OpenBMB/MiniCPM-V finetune/readme.md): `conversations` of {role, content}; `image` a path
# with "<image>\n", or a dict {"<image_00>": path, ...} with <image_00> where each image goes


def test_minicpm_v_single_and_multi_image(tmp_path, sample_config):
    data = tmp_path / "minicpm"
    for k, color in enumerate(("black", "white", "yellow")):
        write_image(data / "path" / "to" / f"image_{k}.jpg", "JPEG", color)
    path = _dump(data / "vl_finetune_data.json", [
        {"id": "0", "image": "path/to/image_0.jpg", "conversations": [
            {"role": "user", "content": "<image>\nHow many desserts are on the white plate?"},
            {"role": "assistant", "content": "There are three desserts on the white plate."},
            {"role": "user", "content": "What type of desserts are they?"},
            {"role": "assistant", "content": "They are cakes with bananas and pecans on top."}]},
        {"id": "1", "image": {"<image_00>": "path/to/image_0.jpg", "<image_01>": "path/to/image_1.jpg",
                              "<image_02>": "path/to/image_2.jpg"}, "conversations": [
            {"role": "user", "content": "How to create such text-only videos?\n<image_00>\n<image_01>\n<image_02>\n"},
            {"role": "assistant", "content": "Open the editor and add a text layer to each clip."}]},
    ])
    rt = round_trip([str(path)], tmp_path / "out", sample_config, max_images=4)
    _check(rt, "0", trained=["three desserts on the white plate", "bananas and pecans"],
           untrained=["How many desserts", "What type of desserts"], images=1)
    _check(rt, "1", trained=["add a text layer to each clip"], untrained=["text-only videos"], images=3)
    assert "<image_0" not in rt.text["1"]


# ---------------------------------------------------------------------------------------------
# ms-swift (docs/source_en/Customization/Custom-dataset.md): the standard `messages` + `images`
# (absolute paths, as its docs advise), `objects` grounding rows, `videos` rows, query-response
# with history, and the ShareGPT `conversation` form


def test_ms_swift_layouts(tmp_path, sample_config):
    store = tmp_path / "xxx"  # the images live elsewhere: absolute paths, no --image-root
    x_jpg, x_png = write_image(store / "x.jpg", "JPEG", "purple"), write_image(store / "x.png", color="pink")
    swift = tmp_path / "swift"
    messages = _dump(swift / "messages.jsonl", [
        {"messages": [{"role": "user", "content": "Where is the capital of Zhejiang?"},
                      {"role": "assistant", "content": "The capital of Zhejiang is Hangzhou."}]},
        {"messages": [{"role": "user", "content": "<image><image>What is the difference between the two images?"},
                      {"role": "assistant", "content": "The first one is a kitten, and the second one is a puppy."}],
         "images": [str(x_jpg), str(x_png)]},
        {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                      {"role": "user", "content": "<image>Find the <ref-object> in the image"},
                      {"role": "assistant", "content": "<bbox><bbox>"}],
         "images": [str(x_jpg)], "objects": {"ref": ["sheep"], "bbox": [[90.9, 160.8, 135, 212.8],
                                                                        [360.9, 480.8, 495, 532.8]]}},
        {"messages": [{"role": "user", "content": "<image>What is in the image, <video>What is in the video?"},
                      {"role": "assistant", "content": "An elephant, and a puppy running on the grass."}],
         "images": [str(x_jpg)], "videos": ["/xxx/x.mp4"]},
    ], jsonl=True)
    query = _dump(swift / "query.jsonl", [
        {"system": "You are a calculator.", "query": "What about adding 1?", "response": "It equals three.",
         "history": [["What is 1 + 1?", "It equals two."]]},
        {"query": "<image>Describe the picture.", "response": "A purple square.", "images": [str(x_jpg)]},
    ], jsonl=True)
    conversation = _dump(swift / "conversation.jsonl", [
        {"system": "Be terse.", "conversation": [{"human": "Name a colour.", "assistant": "Teal."},
                                                 {"human": "Another one?", "assistant": "Ochre."}]},
    ], jsonl=True)
    out = tmp_path / "out"
    rt = round_trip([str(messages), str(query), str(conversation)], out, sample_config, max_images=4,
                    max_drop_fraction=0.5)
    assert rt.summary.samples_read == 7
    assert rt.summary.dropped_by_reason == {"unsupported_media": 1, "missing_video": 1}
    _check(rt, "messages.jsonl:0", trained=["capital of Zhejiang is Hangzhou"], untrained=["Where is"], images=0)
    _check(rt, "messages.jsonl:1", trained=["kitten", "puppy"], untrained=["the difference"], images=2)
    _check(rt, "query.jsonl:0", trained=["It equals two.", "It equals three."],
           untrained=["You are a calculator.", "What is 1 + 1?", "What about adding 1?"], images=0)
    _check(rt, "query.jsonl:1", trained=["A purple square."], untrained=["Describe the picture."], images=1)
    _check(rt, "conversation.jsonl:0", trained=["Teal.", "Ochre."], untrained=["Be terse.", "Name a colour."],
           images=0)
    drops = _dropped(out)
    assert "field 'objects'" in drops["messages.jsonl:2"][1] and "grounding" in drops["messages.jsonl:2"][1]
    assert drops["messages.jsonl:3"][0] == "missing_video" and "video '/xxx/x.mp4' does not exist" in \
        drops["messages.jsonl:3"][1]
    assert not any("<bbox>" in t or "<ref-object>" in t for t in rt.text.values())


# ---------------------------------------------------------------------------------------------
# TRL (huggingface/trl docs/source/dataset_formats.md): conversational prompt-completion, and the
# vision form: an `images` column (datasets' Image feature: {bytes, path}) and typed content parts


def test_trl_prompt_completion_with_images(tmp_path, sample_config):
    def part(kind: str, text: str | None = None) -> dict:
        return {"type": kind, "text": text}

    table = pa.table({
        "prompt": [
            [{"role": "user", "content": [part("image"), part("text", "What colour is the sky in the image?")]}],
            [{"role": "system", "content": [part("text", "Answer briefly.")]},
             {"role": "user", "content": [part("text", "Compare"), part("image"), part("image")]}],
            [{"role": "user", "content": [part("text", "Name a prime number.")]}]],
        "completion": [
            [{"role": "assistant", "content": [part("text", "It is blue.")]}],
            [{"role": "assistant", "content": [part("text", "The left one is darker.")]}],
            [{"role": "assistant", "content": [part("text", "Seven.")]}]],
        "images": [[{"bytes": image_bytes("PNG", "blue"), "path": None}],
                   [{"bytes": image_bytes("JPEG", "black"), "path": "l.jpg"},
                    {"bytes": image_bytes("JPEG", "white"), "path": "r.jpg"}],
                   []],
    })
    path = tmp_path / "trl" / "train-00000-of-00001.parquet"
    path.parent.mkdir()
    pq.write_table(table, path)
    rt = round_trip([str(path)], tmp_path / "out", sample_config, max_images=4)
    name = path.name
    _check(rt, f"{name}:0", trained=["It is blue."], untrained=["What colour is the sky"], images=1)
    _check(rt, f"{name}:1", trained=["The left one is darker."], untrained=["Answer briefly.", "Compare"], images=2)
    _check(rt, f"{name}:2", trained=["Seven."], untrained=["Name a prime number."], images=0)


# ---------------------------------------------------------------------------------------------
# Symlinks: a Hugging Face hub-cache snapshot (huggingface_hub's cache layout: every file under
# snapshots/REV/ is a relative link into ../../blobs/HASH) and a farm of links into other folders


def test_hub_cache_snapshot_packs_all_30(tmp_path, sample_config):
    repo = tmp_path / "hub" / "datasets--someone--pets"
    blobs, snap = repo / "blobs", repo / "snapshots" / "3f1c0ffee"
    (snap / "data").mkdir(parents=True)
    (snap / "images").mkdir()
    blobs.mkdir()
    rows = []
    for k in range(30):
        (blobs / f"img{k:02d}").write_bytes(image_bytes("PNG", ("red", "green", "blue")[k % 3], (8 + k, 8)))
        os.symlink(f"../../../blobs/img{k:02d}", snap / "images" / f"{k:02d}.png")
        rows.append({"id": f"pet-{k}", "image": f"images/{k:02d}.png",
                     "conversations": [{"from": "human", "value": f"<image>\nWhat is pet {k}?"},
                                       {"from": "gpt", "value": f"Pet number {k} is a cat."}]})
    (blobs / "train").write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.symlink("../../../blobs/train", snap / "data" / "train.jsonl")
    # the case: every image was an image_path_escape (its link target is outside the snapshot)
    rt = round_trip([str(snap / "data" / "train.jsonl")], tmp_path / "out", sample_config, max_images=2,
                    image_root=str(snap), max_drop_fraction=1.0)
    assert rt.summary.samples_packed == 30 and rt.summary.dropped_by_reason == {}, rt.summary.dropped_by_reason
    for k in (0, 17, 29):
        _check(rt, f"pet-{k}", trained=[f"Pet number {k} is a cat."], untrained=[f"What is pet {k}?"], images=1)


def test_hub_cache_snapshot_with_the_default_root(tmp_path, sample_config):
    repo = tmp_path / "hub" / "datasets--someone--pets"
    blobs, snap = repo / "blobs", repo / "snapshots" / "3f1c0ffee"
    (snap / "images").mkdir(parents=True)
    blobs.mkdir()
    (blobs / "aa11").write_bytes(image_bytes("PNG", "red"))
    os.symlink("../../../blobs/aa11", snap / "images" / "0.png")
    (blobs / "bb22").write_text(json.dumps([{"id": "p0", "image": "images/0.png", "conversations": [
        {"from": "human", "value": "<image>\nWhat colour?"}, {"from": "gpt", "value": "Bright red."}]}]))
    os.symlink("../../blobs/bb22", snap / "data.json")
    rt = round_trip([str(snap / "data.json")], tmp_path / "out", sample_config, max_images=2)
    _check(rt, "p0", trained=["Bright red."], untrained=["What colour?"], images=1)


def test_symlink_farm(tmp_path, sample_config):
    store = tmp_path / "store"  # where the bytes really are
    farm = tmp_path / "farm"  # a folder of links, e.g. assembled from several datasets
    (farm / "images").mkdir(parents=True)
    for k in range(4):
        write_image(store / f"shard{k % 2}" / f"{k}.png", color=("red", "green", "blue", "black")[k])
        os.symlink(store / f"shard{k % 2}" / f"{k}.png", farm / "images" / f"{k}.png")
    os.symlink(store / "shard0", farm / "more")  # a linked folder
    data = _dump(store / "meta" / "chat.json", [
        {"id": f"f{k}", "image": f"images/{k}.png" if k < 4 else "more/0.png", "conversations": [
            {"from": "human", "value": f"<image>\nDescribe picture {k}."},
            {"from": "gpt", "value": f"Picture {k} is one flat colour."}]} for k in range(5)])
    os.symlink(data, farm / "chat.json")
    rt = round_trip([str(farm / "chat.json")], tmp_path / "out", sample_config, image_root=str(farm), max_images=2)
    assert rt.summary.samples_packed == 5
    for k in range(5):
        _check(rt, f"f{k}", trained=[f"Picture {k} is one flat colour."], untrained=[f"Describe picture {k}."],
               images=1)
