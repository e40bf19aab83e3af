"""Several datasets in one job (issue #19, item 5): each source with its own image root, the meta
files other projects publish to list their datasets, and ids namespaced where sources share them.

Every fixture is small, generated here, in the published layout of a project:

- InternVL: a meta JSON as in OpenGVLab/InternVL ``internvl_chat/shell/data/*.json`` (``root``,
  ``annotation``, ``data_augment``, ``repeat_time``, ``length``), JSONL annotations whose ids count
  from 0 in every file (``{"id", "image", "width", "height", "conversations"}``);
- LLaMA-Factory: ``data/dataset_info.json`` as in hiyouga/LLaMA-Factory ``data/`` (``mllm_demo``'s
  ShareGPT with role/content tags and ``images`` relative to the data folder, the Alpaca default,
  hub entries beside them), and a custom entry renaming columns and tags as data/README.md shows;
- LLaVA-NeXT: a data YAML as in LLaVA-VL/LLaVA-NeXT ``scripts/train/*.yaml`` (``datasets:`` of
  ``json_path`` + ``sampling_strategy``), LLaVA records whose COCO ids repeat across files;
- the_cauldron as huggingface/nanoVLM loads it (``load_dataset("HuggingFaceM4/the_cauldron", subset)``
  per subset): one folder per subset holding ``train-00000-of-00001.parquet`` (the same file name in
  every subset), rows of ``images`` (``{"bytes", "path"}``) and ``texts`` (``{"user", "assistant",
  "source"}``); and the same subsets written by ``datasets``' ``save_to_disk``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.demo import read_files
from tests.support.published import image_bytes, round_trip, write_image
from tests.support.resume import pack_interrupted_then_resumed
from wdspack import cli
from wdspack.errors import ConfigError, SampleError, SourceError, TooManyDropsError
from wdspack.format.dataset import iter_dataset_packs, open_dataset
from wdspack.ops.verify import verify_dataset
from wdspack.packer.config import PackConfig, RunOptions
from wdspack.packer.job import pack_dataset
from wdspack.packer.sources import Source, iter_records, list_partitions
from wdspack.packer.sources.meta import RowMap, collision_key, expand_sources, parse_source

MAX_IMAGES = 4


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _json(path: Path, doc) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2))
    return path


def _images_of(out: Path) -> dict[str, tuple[bytes, ...]]:
    """Per packed sample id, the image bytes its pack holds for it."""
    found = {}
    for _, pack in iter_dataset_packs(*open_dataset(str(out))):
        for k, sid in enumerate(pack.sample_ids):
            found[sid] = tuple(b for b, owner in zip(pack.images, pack.image_sample) if owner == k)
    return found


# ---- InternVL meta file -------------------------------------------------------------------------


def _internvl(base: Path, n: int = 3) -> Path:
    """``shell/data/meta.json`` over two image datasets (ids 0..n-1 in each, the same image file
    names under two roots, drawn in different colours) and a pure-text one with ids of its own."""
    colours = {"docvqa": "red", "chartqa": "blue"}
    for name, colour in colours.items():
        for k in range(n):
            write_image(base / "playground" / "data" / name / "images" / f"{k}.png", color=colour)
        _jsonl(base / "playground" / "opensource" / f"{name}_train.jsonl", [
            {"id": k, "image": f"images/{k}.png", "width": 32, "height": 24,
             "conversations": [{"from": "human", "value": f"<image>\nWhat does {name} chart {k} show?"},
                               {"from": "gpt", "value": f"answer {name} {k}"}]} for k in range(n)])
    _jsonl(base / "playground" / "opensource" / "sharegpt_text.jsonl", [
        {"id": f"text-{k}", "conversations": [{"from": "human", "value": f"Tell me fact {k}."},
                                              {"from": "gpt", "value": f"fact number {k}"}]} for k in range(n)])
    entry = lambda root, ann: {"root": root, "annotation": ann, "data_augment": False,  # noqa: E731
                               "repeat_time": 1, "length": n}
    return _json(base / "shell" / "data" / "meta.json", {
        "docvqa_train_3": entry("playground/data/docvqa/", "playground/opensource/docvqa_train.jsonl"),
        "chartqa_train_3": entry("playground/data/chartqa/", "playground/opensource/chartqa_train.jsonl"),
        "sharegpt_text": entry("", "playground/opensource/sharegpt_text.jsonl"),
    })


def test_internvl_meta_each_dataset_its_own_root_and_ids_namespaced_where_they_collide(
        tmp_path, sample_config, monkeypatch):
    monkeypatch.chdir(tmp_path)  # InternVL's paths are relative to the folder training runs in
    meta = _internvl(tmp_path)
    rt = round_trip([str(meta)], tmp_path / "out", sample_config, max_images=MAX_IMAGES)
    expected = {f"{ds}/{k}" for ds in ("docvqa_train_3", "chartqa_train_3") for k in range(3)}
    expected |= {f"text-{k}" for k in range(3)}  # unique in the job: left as they are
    assert set(rt.trained) == expected and rt.summary.samples_dropped == 0
    for ds, name in (("docvqa_train_3", "docvqa"), ("chartqa_train_3", "chartqa")):
        for k in range(3):
            assert rt.trained[f"{ds}/{k}"].strip().startswith(f"answer {name} {k}")
            assert "What does" not in rt.trained[f"{ds}/{k}"] and f"What does {name} chart {k}" in rt.text[f"{ds}/{k}"]
    assert rt.trained["text-1"].strip().startswith("fact number 1")
    images = _images_of(tmp_path / "out")
    red, blue = image_bytes(color="red"), image_bytes(color="blue")
    assert all(images[f"docvqa_train_3/{k}"] == (red,) for k in range(3))  # each from its own root
    assert all(images[f"chartqa_train_3/{k}"] == (blue,) for k in range(3))


def test_internvl_meta_paths_beside_the_meta_file_and_selection(tmp_path, sample_config):
    root = tmp_path / "ds"
    write_image(root / "imgs" / "a.png")
    _jsonl(root / "a.jsonl", [{"id": 0, "image": "a.png", "conversations": [
        {"from": "human", "value": "<image>\nq"}, {"from": "gpt", "value": "a"}]}])
    _jsonl(root / "b.jsonl", [{"id": 0, "conversations": [{"from": "human", "value": "q"},
                                                          {"from": "gpt", "value": "b"}]}])
    meta = _json(root / "meta.json", {"a": {"root": "imgs", "annotation": "a.jsonl", "repeat_time": 1},
                                      "b": {"root": "", "annotation": "b.jsonl", "repeat_time": 1}})
    parts = list_partitions([f"{meta}#b"])
    assert [(p.source, Path(p.path).name) for p in parts] == [("b", "b.jsonl")]
    parts = list_partitions([str(meta)])
    assert [p.image_root for p in parts] == [str((root / "imgs").resolve()), str(root.resolve())]
    with pytest.raises(ConfigError, match="lists no dataset named 'c'; it lists a, b"):
        list_partitions([f"{meta}#c"])


@pytest.mark.parametrize("entry, words", [
    ({"root": "", "annotation": "a.jsonl", "repeat_time": 2, "length": 1},
     "repeat_time 2; wdspack packs every record once .* weight it when training instead"),
    ({"root": "", "annotation": "a.jsonl", "repeat_time": 0.5},
     "repeat_time 0.5; .* write the part to use to its own file"),
    ({"root": "", "annotation": "missing.jsonl", "repeat_time": 1},
     "annotation 'missing.jsonl' does not exist: looked in .* and .*; fix the path in"),
    ({"root": ""}, "dataset 'x' has no 'annotation' path"),
])
def test_internvl_meta_what_wdspack_does_not_do_is_refused_with_the_fix(tmp_path, entry, words):
    _jsonl(tmp_path / "a.jsonl", [{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}])
    meta = _json(tmp_path / "meta.json", {"x": entry})
    with pytest.raises(SourceError, match=words):
        list_partitions([str(meta)])


# ---- LLaMA-Factory dataset_info.json ---------------------------------------------------------


def _llamafactory(data: Path) -> Path:
    write_image(data / "mllm_demo_data" / "1.png", color="green")
    write_image(data / "mllm_demo_data" / "2.png", color="yellow")
    _json(data / "mllm_demo.json", [
        {"messages": [{"role": "user", "content": "<image>Who are they?"},
                      {"role": "assistant", "content": "They are two players."}], "images": ["mllm_demo_data/1.png"]},
        {"messages": [{"role": "user", "content": "<image>What is it?"},
                      {"role": "assistant", "content": "It is a yellow square."}], "images": ["mllm_demo_data/2.png"]},
    ])
    _json(data / "alpaca_en_demo.json", [
        {"instruction": "Name a colour.", "input": "", "output": "Blue is a colour."},
        {"instruction": "Add the numbers.", "input": "2 + 3", "output": "The sum is 5."},
    ])
    _json(data / "identity.json", [{"instruction": "hi", "input": "", "output": "Hello! I am {{name}}."}])
    _jsonl(data / "custom_chat.jsonl", [  # data/README.md: columns and tags renamed
        {"dialog": [{"speaker": "client", "words": "<image>Describe it."},
                    {"speaker": "agent", "words": "A green picture."}], "pictures": ["mllm_demo_data/1.png"]},
    ])
    return _json(data / "dataset_info.json", {
        "identity": {"file_name": "identity.json"},
        "alpaca_en_demo": {"file_name": "alpaca_en_demo.json"},
        "mllm_demo": {"file_name": "mllm_demo.json", "formatting": "sharegpt",
                      "columns": {"messages": "messages", "images": "images"},
                      "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                               "assistant_tag": "assistant"}},
        "custom_chat": {"file_name": "custom_chat.jsonl", "formatting": "sharegpt",
                        "columns": {"messages": "dialog", "images": "pictures"},
                        "tags": {"role_tag": "speaker", "content_tag": "words", "user_tag": "client",
                                 "assistant_tag": "agent"}},
        "alpaca_en": {"hf_hub_url": "llamafactory/alpaca_en", "ms_hub_url": "llamafactory/alpaca_en"},
        "dpo_en_demo": {"file_name": "dpo_en_demo.json", "ranking": True, "formatting": "sharegpt",
                        "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"}},
    })


def test_llamafactory_dataset_info_sharegpt_with_images_and_alpaca(tmp_path, sample_config):
    info = _llamafactory(tmp_path / "data")
    source = f"{info}#mllm_demo,alpaca_en_demo,custom_chat"
    rt = round_trip([source], tmp_path / "out", sample_config, max_images=MAX_IMAGES)
    # file names differ, so the '{file}:{row}' ids collide nowhere: none is namespaced
    assert set(rt.trained) == {"mllm_demo.json:0", "mllm_demo.json:1", "alpaca_en_demo.json:0",
                               "alpaca_en_demo.json:1", "custom_chat.jsonl:0"}
    assert rt.trained["mllm_demo.json:0"].strip().startswith("They are two players.")
    assert rt.trained["alpaca_en_demo.json:1"].strip().startswith("The sum is 5.")
    assert "2 + 3" in rt.text["alpaca_en_demo.json:1"] and "2 + 3" not in rt.trained["alpaca_en_demo.json:1"]
    assert rt.trained["custom_chat.jsonl:0"].strip().startswith("A green picture.")
    assert "Describe it." in rt.text["custom_chat.jsonl:0"]
    images = _images_of(tmp_path / "out")  # relative to the data folder, LLaMA-Factory's media_dir
    assert images["mllm_demo.json:1"] == (image_bytes(color="yellow"),)
    assert images["custom_chat.jsonl:0"] == (image_bytes(color="green"),)


def test_llamafactory_entries_wdspack_cannot_read_are_named(tmp_path):
    info = _llamafactory(tmp_path / "data")
    with pytest.raises(SourceError, match=r"dataset 'alpaca_en' is read from hf_hub_url"):
        list_partitions([str(info)])  # the published file lists hub datasets: pick the local ones
    (tmp_path / "data" / "identity.json").unlink()
    with pytest.raises(SourceError, match=r"dataset 'identity': file_name 'identity.json' does not exist in"):
        list_partitions([f"{info}#identity"])
    with pytest.raises(SourceError, match="'alpaca_en' is read from hf_hub_url 'llamafactory/alpaca_en'.*"
                                          r"#NAME,NAME"):
        list_partitions([f"{info}#alpaca_en"])
    with pytest.raises(SourceError, match="'dpo_en_demo' has 'ranking': true"):
        list_partitions([f"{info}#dpo_en_demo"])
    doc = json.loads(info.read_text())
    doc["kto"] = {"file_name": "mllm_demo.json", "formatting": "sharegpt",
                  "columns": {"messages": "messages", "kto_tag": "label"}}
    doc["odd"] = {"file_name": "mllm_demo.json", "formatting": "sharegpt", "columns": {"prompt": "q"}}
    doc["subset"] = {"file_name": "mllm_demo.json", "num_samples": 10}
    info.write_text(json.dumps(doc))
    with pytest.raises(SourceError, match="column 'kto_tag' \\(KTO data\\)"):
        list_partitions([f"{info}#kto"])
    with pytest.raises(SourceError, match="column 'prompt', which the sharegpt format does not use"):
        list_partitions([f"{info}#odd"])
    with pytest.raises(SourceError, match=r"num_samples 10; .*write the subset to its own file"):
        list_partitions([f"{info}#subset"])


def test_llamafactory_row_maps():
    """Entries in the layouts wdspack reads need no renames; the others are renamed row by row."""
    from wdspack.packer.sources.meta import _lf_row_map

    assert _lf_row_map({"file_name": "a.json"}, "x") is None  # Alpaca defaults
    assert _lf_row_map({"file_name": "a.json", "formatting": "sharegpt",
                        "columns": {"messages": "conversations", "tools": "tools"}}, "x") is None
    pretrain = _lf_row_map({"file_name": "c4_demo.jsonl", "columns": {"prompt": "content"}}, "x")
    assert pretrain.apply({"content": "A document.", "other": 1}) == {"text": "A document."}
    orca = _lf_row_map({"file_name": "o.json", "columns": {"prompt": "question", "response": "response",
                                                           "system": "system_prompt"}}, "x")
    assert orca.apply({"id": 7, "question": "Q?", "response": "R.", "system_prompt": "S", "input": "ignored"}) \
        == {"id": 7, "instruction": "Q?", "output": "R.", "system": "S"}
    chat = _lf_row_map({"file_name": "l.json", "formatting": "sharegpt", "columns": {"messages": "conversation"},
                        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                                 "assistant_tag": "assistant"}}, "x")
    assert chat.apply({"conversation": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}) \
        == {"conversations": [{"from": "user", "value": "Hi"}, {"from": "assistant", "value": "Yo"}]}
    assert RowMap(columns=(("a", "b"),)).apply(["not", "a", "dict"]) == ["not", "a", "dict"]


def test_llamafactory_renames_need_a_json_file(tmp_path):
    data = tmp_path / "data"
    pq.write_table(pa.table({"dialog": [[{"speaker": "client", "words": "q"}]]}), data.mkdir() or data / "c.parquet")
    info = _json(data / "dataset_info.json", {"c": {"file_name": "c.parquet", "formatting": "sharegpt",
                                                    "columns": {"messages": "dialog"},
                                                    "tags": {"role_tag": "speaker", "content_tag": "words"}}})
    with pytest.raises(SourceError, match=r"dataset 'c' renames columns .* is parquet; rename the columns"):
        list_partitions([str(info)])


# ---- LLaVA-NeXT data YAML ---------------------------------------------------------------------


def _llava(path: Path, name: str, ids: list[str]) -> Path:
    rows = [{"id": i, "image": f"coco/train2017/{i}.jpg", "conversations": [
        {"from": "human", "value": f"<image>\n{name} question about {i}?"},
        {"from": "gpt", "value": f"{name} answer {i}"}]} for i in ids]
    if path.suffix == ".jsonl":
        return _jsonl(path, rows)
    return _json(path, rows)


def test_llava_next_yaml_with_an_image_folder(tmp_path, sample_config):
    ids = ["000000033471", "000000052846"]
    images = tmp_path / "images"
    for i in ids:
        write_image(images / "coco" / "train2017" / f"{i}.jpg", fmt="JPEG")
    _llava(tmp_path / "json" / "llava_v1_5_mix_sub.json", "mix", ids)
    _llava(tmp_path / "json" / "sharegpt4v_coco.jsonl", "sharegpt4v", [*ids, "000000000009"])
    write_image(images / "coco" / "train2017" / "000000000009.jpg", fmt="JPEG")
    yaml_path = tmp_path / "scripts" / "train" / "single_image.yaml"
    yaml_path.parent.mkdir(parents=True)
    yaml_path.write_text("datasets:\n"
                         f"  - json_path: {tmp_path}/json/llava_v1_5_mix_sub.json\n"
                         "    sampling_strategy: \"all\"\n"
                         f"  - json_path: {tmp_path}/json/sharegpt4v_coco.jsonl # the COCO ids again\n"
                         "    sampling_strategy: all\n")
    rt = round_trip([f"{yaml_path}::{images}"], tmp_path / "out", sample_config, max_images=MAX_IMAGES)
    assert set(rt.trained) == {*(f"llava_v1_5_mix_sub/{i}" for i in ids), *(f"sharegpt4v_coco/{i}" for i in ids),
                               "000000000009"}
    assert rt.trained["sharegpt4v_coco/000000052846"].strip().startswith("sharegpt4v answer 000000052846")
    assert rt.trained["llava_v1_5_mix_sub/000000052846"].strip().startswith("mix answer 000000052846")


def test_llava_next_sampling_other_than_all_is_refused_with_the_fix(tmp_path):
    _llava(tmp_path / "a.json", "a", ["1"])
    yaml_path = tmp_path / "mix.yaml"
    yaml_path.write_text(f"datasets:\n  - json_path: {tmp_path}/a.json\n    sampling_strategy: \"first:10%\"\n")
    with pytest.raises(SourceError, match=r"sampling_strategy 'first:10%'; .*write the part to use to its own "
                                          r'file and name that one, or use "all"'):
        list_partitions([str(yaml_path)])
    yaml_path.write_text("datasets: a.json\n")
    with pytest.raises(SourceError, match="is not a LLaVA-NeXT data YAML: expected 'datasets:'"):
        list_partitions([str(yaml_path)])


# ---- the_cauldron as nanoVLM reads it ---------------------------------------------------------


def _cauldron_rows(subset: str, colour: str, n: int = 2) -> dict[str, list]:
    return {"images": [[{"bytes": image_bytes(color=colour), "path": None}] for _ in range(n)],
            "texts": [[{"user": f"{subset} question {k}?", "assistant": f"{subset} answer {k}",
                        "source": subset}] for k in range(n)]}


def test_the_cauldron_parquet_subsets_share_file_names_and_are_namespaced(tmp_path, sample_config):
    base = tmp_path / "the_cauldron"
    for subset, colour in (("ai2d", "red"), ("chartqa", "blue")):
        (base / subset).mkdir(parents=True)
        pq.write_table(pa.table(_cauldron_rows(subset, colour)), base / subset / "train-00000-of-00001.parquet")
    subsets = [str(base / "ai2d"), str(base / "chartqa")]  # what nanoVLM's train_dataset_name lists
    rt = round_trip(subsets, tmp_path / "out", sample_config, max_images=MAX_IMAGES)
    expected = {f"{s}/train-00000-of-00001.parquet:{k}" for s in ("ai2d", "chartqa") for k in range(2)}
    assert set(rt.trained) == expected and rt.summary.samples_dropped == 0
    assert rt.trained["chartqa/train-00000-of-00001.parquet:1"].strip().startswith("chartqa answer 1")
    images = _images_of(tmp_path / "out")
    assert images["ai2d/train-00000-of-00001.parquet:0"] == (image_bytes(color="red"),)
    # the whole folder as one source: its files are named from it, so nothing collides
    whole = round_trip([str(base)], tmp_path / "whole", sample_config, max_images=MAX_IMAGES)
    assert set(whole.trained) == expected


def test_the_cauldron_save_to_disk_subsets(tmp_path, sample_config):
    import datasets

    features = datasets.Features({
        "images": datasets.Sequence(datasets.Image()),
        "texts": [{"user": datasets.Value("string"), "assistant": datasets.Value("string"),
                   "source": datasets.Value("string")}]})
    base = tmp_path / "the_cauldron"
    for subset, colour in (("ai2d", "red"), ("chartqa", "blue")):
        datasets.Dataset.from_dict(_cauldron_rows(subset, colour), features=features).save_to_disk(base / subset)
    rt = round_trip([str(base / "ai2d"), str(base / "chartqa")], tmp_path / "out", sample_config,
                    max_images=MAX_IMAGES)
    # save_to_disk folders name their files from the parent (ai2d/data-...arrow): no collision, no prefix
    assert set(rt.trained) == {f"{s}/data-00000-of-00001.arrow:{k}" for s in ("ai2d", "chartqa") for k in range(2)}
    assert rt.trained["ai2d/data-00000-of-00001.arrow:1"].strip().startswith("ai2d answer 1")
    assert _images_of(tmp_path / "out")["chartqa/data-00000-of-00001.arrow:0"] == (image_bytes(color="blue"),)


# ---- SOURCE::ROOT on the command line ----------------------------------------------------------


def _two_roots(base: Path) -> list[str]:
    """Two LLaVA files, the same image names under two roots, ids from 0 in each."""
    for name, colour in (("a", "red"), ("b", "blue")):
        for k in range(3):
            write_image(base / "imgs" / name / f"{k}.png", color=colour)
        _jsonl(base / f"{name}.jsonl", [{"id": k, "image": f"{k}.png", "conversations": [
            {"from": "human", "value": f"<image>\nColour of {name}{k}?"},
            {"from": "gpt", "value": f"{name} is {colour}"}]}
            for k in range(3)])
    return [f"{base / 'a.jsonl'}::{base / 'imgs' / 'a'}", f"{base / 'b.jsonl'}::{base / 'imgs' / 'b'}"]


def _cli_pack(sources: list[str], out: Path, tekken_dir: Path, *extra: str) -> int:
    template = Path(__file__).resolve().parents[3] / "examples" / "chat_templates" / "pixtral.jinja"
    return cli.main(["pack", *sources, "--output", str(out), "--tokenizer", str(tekken_dir), "--chat-template",
                     str(template), "--image-token", "[IMG]", "--tokens-per-image", "16", "--seq-len", "1024",
                     "--max-images", str(MAX_IMAGES), "--quiet", *extra])


def test_cli_source_with_its_own_image_root(tmp_path, tekken_dir, capsys):
    sources = _two_roots(tmp_path / "data")
    assert _cli_pack(sources, tmp_path / "out", tekken_dir) == 0
    assert cli.main(["verify", str(tmp_path / "out"), "--source", *sources]) == 0
    images = _images_of(tmp_path / "out")
    assert set(images) == {f"{s}/{k}" for s in "ab" for k in range(3)}
    assert images["a/2"] == (image_bytes(color="red"),) and images["b/2"] == (image_bytes(color="blue"),)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["sources"] == sources
    capsys.readouterr()
    # verify with one of the two sources: the other's samples are packed but not in the sources given
    assert cli.main(["verify", str(tmp_path / "out"), "--source", sources[0]]) == 1
    assert "packed samples are not in the sources" in capsys.readouterr().out
    missing = f"{tmp_path / 'data' / 'a.jsonl'}::{tmp_path / 'nowhere'}"
    assert _cli_pack([missing], tmp_path / "bad", tekken_dir) == 1
    err = capsys.readouterr().err
    assert "image root" in err and "nowhere" in err and "SOURCE::ROOT" in err and "is not a folder" in err
    assert _cli_pack([f"{tmp_path / 'data' / 'a.jsonl'}::x::y"], tmp_path / "bad2", tekken_dir) == 2
    assert "PATH::IMAGE_ROOT (one '::'" in capsys.readouterr().err


def test_source_records_and_plain_strings_are_the_same_job(tmp_path, sample_config):
    sources = _two_roots(tmp_path / "data")
    config = PackConfig(seq_len=1024, max_images=MAX_IMAGES)
    pack_dataset(sources, tmp_path / "strings", sample_config=sample_config, config=config)
    records = [Source(s.split("::")[0], image_root=s.split("::")[1]) for s in sources]
    pack_dataset(records, tmp_path / "records", sample_config=sample_config, config=config)
    assert read_files(tmp_path / "strings") == read_files(tmp_path / "records")
    named = [Source(records[0].path, image_root=records[0].image_root, name="first"), records[1]]
    pack_dataset(named, tmp_path / "named", sample_config=sample_config, config=config)
    assert set(_images_of(tmp_path / "named")) == {f"{s}/{k}" for s in ("first", "b") for k in range(3)}
    assert verify_dataset(str(tmp_path / "named"), sources=named) == []


# ---- determinism, resume, duplicates ----------------------------------------------------------


@pytest.mark.slow
def test_several_sources_are_deterministic_and_resume_identically(tmp_path, sample_config, monkeypatch):
    monkeypatch.chdir(tmp_path)
    meta = _internvl(tmp_path, n=6)
    sources = [str(meta), *_two_roots(tmp_path / "more")]
    config = lambda **kw: PackConfig(seq_len=1024, max_images=MAX_IMAGES, records_per_partition=2, **kw)  # noqa: E731
    pack_dataset(sources, tmp_path / "a", sample_config=sample_config, config=config())
    pack_dataset(sources, tmp_path / "b", sample_config=sample_config, config=config(run=RunOptions(workers=2)))
    assert read_files(tmp_path / "a") == read_files(tmp_path / "b")
    assert verify_dataset(str(tmp_path / "a"), sources=sources) == []
    pack_interrupted_then_resumed(monkeypatch, sources, tmp_path / "resumed", interrupt_at=5,
                                  sample_config=sample_config, config=config())
    assert read_files(tmp_path / "a") == read_files(tmp_path / "resumed")


def _chats(path: Path, ids: list) -> Path:
    return _jsonl(path, [{"id": i, "conversations": [{"from": "human", "value": f"q {i}"},
                                                      {"from": "gpt", "value": f"a {i}"}]} for i in ids])


def test_a_duplicate_in_one_source_is_dropped_and_the_fix_is_the_ids(tmp_path, sample_config):
    a = _chats(tmp_path / "a.jsonl", [0, 1, 2, 2, 3, 3, 4, 4])  # three ids used twice in a
    b = _chats(tmp_path / "b.jsonl", [0, 1, 2])  # the same ids as a: no duplicates, a collision
    with pytest.raises(TooManyDropsError) as e:
        pack_dataset([str(a), str(b)], tmp_path / "out", sample_config=sample_config,
                     config=PackConfig(seq_len=1024))
    msg = str(e.value)
    assert "duplicate_id" in msg and "'a/2': id 'a/2' is used by more than one record of source 'a'" in msg
    assert "fix the ids, not the tolerance" in msg and "'{source}/{id}'" in msg
    assert "--resume --max-drop-fraction" not in msg and "accept these drops" not in msg
    dropped = [json.loads(line) for line in (tmp_path / "out" / "dropped.jsonl").read_text().splitlines()]
    assert sorted(d["id"] for d in dropped) == ["3", "4", "a/2"]  # 3 and 4 are in a only: no prefix
    with pytest.raises(SampleError) as e:
        pack_dataset([str(a), str(b)], tmp_path / "strict", sample_config=sample_config,
                     config=PackConfig(seq_len=1024, on_error="raise"))
    assert e.value.reason == "duplicate_id" and "--on-error skip" not in str(e.value)


def test_ids_are_namespaced_only_where_they_collide(tmp_path, sample_config):
    a = _chats(tmp_path / "x" / "train.jsonl", ["shared", "only-a", 7])
    b = _chats(tmp_path / "y" / "train.jsonl", ["shared", "only-b", "7"])  # 7 and "7" are one id
    rt = round_trip([str(a), str(b)], tmp_path / "out", sample_config)
    assert set(rt.trained) == {"x/train/shared", "y/train/shared", "only-a", "only-b", "x/train/7", "y/train/7"}
    assert rt.trained["y/train/shared"].strip().startswith("a shared")


def test_a_split_document_follows_its_collision(tmp_path, sample_config):
    """Pieces ``{id}#{k}`` of a long document collide as their document does."""
    from wdspack.ops.verify import _expected_ids

    assert collision_key("doc#3") == "doc" and collision_key("doc#x") == "doc#x" and collision_key("#1") == "#1"
    seen = _expected_ids([("a", "doc"), ("b", "doc"), ("a", "solo"), ("b", "x#1")])
    assert seen == {"a/doc": 1, "b/doc": 1, "solo": 1, "x#1": 1}


# ---- parsing -----------------------------------------------------------------------------------


def test_parse_source():
    assert parse_source("a.jsonl") == Source("a.jsonl")
    assert parse_source("s3://b/a.jsonl::s3://b/imgs") == Source("s3://b/a.jsonl", image_root="s3://b/imgs")
    assert parse_source("info.json#x,y::imgs") == Source("info.json", image_root="imgs", datasets=("x", "y"))
    assert str(Source("info.json", image_root="imgs", datasets=("x", "y"))) == "info.json#x,y::imgs"
    for bad in ("a.jsonl::", "::imgs", "a::b::c"):
        with pytest.raises(ConfigError, match="PATH::IMAGE_ROOT"):
            parse_source(bad)
    with pytest.raises(ConfigError, match="name the datasets after '#'"):
        parse_source("info.json#a,,b")


def test_names_of_plain_sources(tmp_path):
    for d in ("cauldron/ai2d", "cauldron/chartqa", "x", "y"):
        (tmp_path / d).mkdir(parents=True)
    subsets = [str(tmp_path / "cauldron" / "ai2d"), str(tmp_path / "cauldron" / "chartqa")]
    names = [s.name for s in expand_sources(subsets)]
    assert names == ["ai2d", "chartqa"]
    names = [s.name for s in expand_sources([str(tmp_path / "x" / "t.jsonl"), str(tmp_path / "y" / "t.jsonl"),
                                             str(tmp_path / "x" / "t.jsonl")])]
    assert names == ["x/t", "y/t", "x/t~2"]
    with pytest.raises(ConfigError, match=r"selects datasets of a meta file .* remove the '#\.\.\.'"):
        expand_sources([f"{tmp_path / 'x' / 't.jsonl'}#a"])


def test_a_json_array_or_jsonl_is_data_not_a_meta_file(tmp_path):
    one = _jsonl(tmp_path / "one.json", [{"conversations": [{"from": "human", "value": "q"},
                                                            {"from": "gpt", "value": "a"}]}])
    parts = list_partitions([str(one)])
    assert [r.sample_id for p in parts for r in iter_records(p)] == ["one.json:0"]
