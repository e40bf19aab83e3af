"""Processor folders as transformers writes them (#47): a tiny real processor of every family with a video path,
its image and video processors set away from their class defaults, saved with its own ``save_pretrained``
(transformers 5: one ``processor_config.json``, each part's settings nested under its name) and as transformers 4
and Hub checkpoints lay it out (``preprocessor_config.json`` and ``video_preprocessor_config.json``; a Hub
checkpoint with the image processor's file alone, which transformers builds the video processor from). Packed
with ``wdspack pack --processor FOLDER`` (from the folder and from the Hugging Face cache), every sample's tokens
are those of ``AutoProcessor.from_pretrained(FOLDER)`` with its real video processor, run in one child process
with torchvision (``tests/support/video_reference.py``), which also writes the folders; the summary says which
settings were used and where they were read; settings that cannot be read stop the job in one line.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from fractions import Fraction
from pathlib import Path

import pytest

from tests.support import vlm_harness as h
from tests.support.video_chats import ROWS, clip, source_folder, typed
from tests.support.video_reference import LAYOUTS, folder_job, run_jobs, save_job
from wdspack.cli import main
from wdspack.errors import ConfigError
from wdspack.media.settings import read_settings
from wdspack.media.video.plan import QWEN3_VL_VIDEO, QwenVideoSampling
from wdspack.models import save_processor

av = pytest.importorskip("av")

#: family -> (tiny_vlm module, its processor()'s keywords, processor class, the video processor's settings (none of
#: them its class's default), the summary's words for them)
FAMILIES = {
    "qwen2_vl": ("qwen2_5_vl", {"cls": "Qwen2VLProcessor", "min_pixels": 6 * 28 * 28, "max_pixels": 48 * 28 * 28},
                 "Qwen2VLProcessor",
                 {"do_sample_frames": True, "fps": 3.0, "min_frames": 2, "max_frames": 8,
                  "size": {"shortest_edge": 4 * 28 * 28, "longest_edge": 32 * 28 * 28}},
                 "frames at 3 fps (2 to 8 a video), 3136 to 25088 pixels each"),
    "qwen2_5_vl": ("qwen2_5_vl", {"min_pixels": 8 * 28 * 28, "max_pixels": 64 * 28 * 28}, "Qwen2_5_VLProcessor",
                   {"do_sample_frames": True, "fps": 2.0, "min_frames": 4, "max_frames": 16,
                    "size": {"shortest_edge": 8 * 28 * 28, "longest_edge": 64 * 28 * 28}},
                   "frames at 2 fps (4 to 16 a video), 6272 to 50176 pixels each"),
    "qwen3_vl": ("qwen3_vl", {}, "Qwen3VLProcessor",
                 {"do_sample_frames": True, "fps": 3.0, "min_frames": 2, "max_frames": 12,
                  "size": {"shortest_edge": 8 * 32 * 32, "longest_edge": 128 * 32 * 32}},
                 "frames at 3 fps (2 to 12 a video), 8192 to 131072 pixels each"),
    "llava_onevision": ("llava", {"kind": "llava_onevision", "tile": 24}, "LlavaOnevisionProcessor",
                        {"do_sample_frames": True, "num_frames": 4, "size": {"height": 24, "width": 24}},
                        "4 frames a video, each resized to 24x24"),
}
#: where each layout keeps the video settings, as the summary names it
SOURCES = {"5.x": "processor_config.json", "4.x": "video_preprocessor_config.json",
           "hub": "preprocessor_config.json (the image processor's: no video settings, as transformers reads it)"}
#: a 6 s clip: more frames than any family's max_frames samples at its fps
LONG = {"v-long": {"messages": [{"role": "user", "content": "<video>How long is it?"},
                                {"role": "assistant", "content": "Six seconds."}],
                   "videos": ["clips/long.mp4"]}}
ROWS_HERE = {**ROWS, **LONG}


def _hub_folder(source: Path, folder: Path, *, min_pixels: int, max_pixels: int) -> Path:
    """Qwen/Qwen2.5-VL-7B-Instruct's layout: its tokenizer and template, a ``preprocessor_config.json`` with the
    pixel bounds at its top (no ``size``), no video settings and no ``processor_config.json``."""
    shutil.copytree(source, folder)
    (folder / "processor_config.json").unlink()
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "min_pixels": min_pixels, "max_pixels": max_pixels, "patch_size": 14, "temporal_patch_size": 2,
        "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2_5_VLProcessor"}, indent=2))
    return folder


def _pack(folder: Path | str, chats: Path, out: Path) -> tuple[int, str, str]:
    out_text, err_text = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out_text), contextlib.redirect_stderr(err_text):
        code = main(["pack", str(chats), "--output", str(out), "--processor", str(folder), "--seq-len", "1024",
                     "--max-images", "4", "--on-error", "raise", "--quiet"])
    return code, out_text.getvalue(), err_text.getvalue()


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_processors, video_reference):
    """Per (family, layout): the folder, its packed dataset, the summary printed, and per sample what
    ``AutoProcessor.from_pretrained(folder)`` made of it (and the video processor it loaded), in the session's
    reference child; the processors are the session's."""
    root = tmp_path_factory.mktemp("folders")
    src = source_folder(root)
    clip(src / "clips" / "long.mp4", codec="h264", rate=Fraction(10), frames=60, width=34, height=26)
    chats = src / "chats.jsonl"
    chats.write_text("".join(json.dumps({"id": sid, **row}) + "\n" for sid, row in ROWS_HERE.items()))
    folders, jobs, calls = {}, [], {}
    for name, (module, kwargs, cls, settings, _) in FAMILIES.items():
        processor = tiny_processors.get(module, **kwargs)
        source = save_processor(processor, root / name / "source")  # tokenizer, image processor, template
        calls[name] = []
        for row in ROWS_HERE.values():
            videos = row.get("videos") or ([row["video"]] if "video" in row else [])
            calls[name].append({"text": processor.apply_chat_template(typed(row), tokenize=False),
                                "videos": [src / v for v in videos],
                                "images": [src / i for i in row["images"]] if "images" in row else None})
        for layout in LAYOUTS:
            folders[name, layout] = root / name / layout
            jobs.append(save_job(source, cls, settings, folders[name, layout], layout=layout))
        if name == "qwen2_5_vl":
            folders[name, "hub"] = _hub_folder(source, root / name / "hub", min_pixels=kwargs["min_pixels"],
                                               max_pixels=kwargs["max_pixels"])
    keys = list(folders)
    jobs += [folder_job(folders[key], calls[key[0]]) for key in keys]
    refs = run_jobs(jobs)[-len(keys):]  # the save jobs first (one child): they return nothing
    out = {}
    for key, ref in zip(keys, refs):
        dataset = root / "packed" / "-".join(key)
        code, printed, err = _pack(folders[key], chats, dataset)
        assert code == 0, err
        out[key] = (folders[key], dataset, printed, dict(zip(ROWS_HERE, ref)))
    return out


@pytest.mark.parametrize("key", [(name, layout) for name in FAMILIES for layout in LAYOUTS]
                         + [("qwen2_5_vl", "hub")], ids="-".join)
def test_tokens_are_the_processors_loaded_from_the_folder(built, key):
    _, dataset, _, refs = built[key]
    subs = h.dataset_sub_samples(dataset)
    assert set(subs) == set(refs)
    for sid, ref in refs.items():
        assert subs[sid][0].tolist() == ref["input_ids"][0].tolist(), f"{key} {sid}: tokens differ"
    # the reference's video processor has the folder's settings (not its class's defaults)
    loaded = json.loads(str(refs["v-one"]["video_processor"]))
    name, layout = key
    want = FAMILIES[name][3] if layout != "hub" else {"do_sample_frames": False,
                                                       "size": {"shortest_edge": 6272, "longest_edge": 50176}}
    assert {k: loaded[k] for k in want} == want


@pytest.mark.parametrize("key", [(name, layout) for name in FAMILIES for layout in LAYOUTS]
                         + [("qwen2_5_vl", "hub")], ids="-".join)
def test_the_summary_says_which_settings_and_where(built, key):
    name, layout = key
    printed = built[key][2].splitlines()
    (videos,) = [line for line in printed if line.startswith("videos")]
    words = FAMILIES[name][4] if layout != "hub" else "every frame, 6272 to 50176 pixels each"
    assert videos == f"videos   {words}, tokens from each video's header; settings from {SOURCES[layout]}"
    (images,) = [line for line in printed if line.startswith("images")]
    image_file = "processor_config.json" if layout == "5.x" else "preprocessor_config.json"
    assert images.endswith(f" from {image_file}"), images
    manifest = json.loads((built[key][1] / "manifest.json").read_text())
    assert manifest["image_policy"]["video"]["settings_from"] == SOURCES[layout]
    assert manifest["image_policy"]["image"]["settings_from"] == image_file


def test_the_image_settings_are_the_folders_not_the_class_defaults(built):
    """Without torchvision the image side is built from AutoImageProcessor: it reads the nested settings."""
    for key, (size, words) in {("qwen2_5_vl", "5.x"): ((6272, 50176), "shortest_edge 6272, longest_edge 50176"),
                               ("qwen2_5_vl", "hub"): ((6272, 50176), "shortest_edge 6272, longest_edge 50176"),
                               ("qwen3_vl", "5.x"): ((4096, 65536), "shortest_edge 4096, longest_edge 65536")}.items():
        (images,) = [line for line in built[key][2].splitlines() if line.startswith("images")]
        assert f"settings (size {words}) from" in images
        manifest = json.loads((built[key][1] / "manifest.json").read_text())
        assert manifest["image_policy"]["image"]["size"] == {"shortest_edge": size[0], "longest_edge": size[1]}
    mixed = built["qwen2_5_vl", "5.x"][3]["v-mixed"]
    assert mixed["image_grid_thw"].tolist() == [[1, 6, 8]]  # 44 × 60 raised to at least 6272 pixels: 84 × 112


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_cached_model_name_reads_the_same_settings(built, tmp_path, monkeypatch, layout):
    """``--processor org/name`` in the Hugging Face cache: the same settings, the same shards as its folder."""
    import huggingface_hub.constants as hf

    folder, dataset, _, _ = built["qwen2_5_vl", layout]
    name = f"tiny-{layout[0]}"  # one name a layout: a process keeps the sample builder of a name it packed with
    snapshot = tmp_path / "hub" / f"models--org--{name}" / "snapshots" / "0123abc"
    shutil.copytree(folder, snapshot)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))  # transformers asks for it
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0123abc")
    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path / "hub"))
    cached = read_settings(f"org/{name}", "video_processor")
    assert cached.values == read_settings(folder, "video_processor").values and cached.source == SOURCES[layout]
    assert cached.path == str(snapshot / SOURCES[layout])
    code, printed, err = _pack(f"org/{name}", dataset.parent.parent / "src" / "chats.jsonl", tmp_path / "out")
    assert code == 0, err
    assert f"settings from {SOURCES[layout]}" in printed
    for shard in dataset.glob("*.tar"):
        assert (tmp_path / "out" / shard.name).read_bytes() == shard.read_bytes()


def test_settings_it_cannot_use_stop_the_job_in_one_line(built, tmp_path):
    """A setting of the wrong type in a transformers-5 folder: one line naming the file, before anything packs."""
    folder = shutil.copytree(built["qwen2_5_vl", "5.x"][0], tmp_path / "processor")
    config = json.loads((folder / "processor_config.json").read_text())
    config["video_processor"]["fps"] = "2"
    (folder / "processor_config.json").write_text(json.dumps(config))
    code, _, err = _pack(folder, built["qwen2_5_vl", "5.x"][1].parent.parent / "src" / "chats.jsonl",
                         tmp_path / "out")
    assert code == 2 and err.count("\n") == 1, err
    assert f"{folder / 'processor_config.json'}: the video processor's fps '2' is not a positive number" in err
    assert not (tmp_path / "out").exists()


def test_a_file_that_does_not_parse_is_one_line(built, tmp_path):
    folder = shutil.copytree(built["qwen2_5_vl", "4.x"][0], tmp_path / "processor")
    (folder / "video_preprocessor_config.json").write_text('{"fps": 2.0,')
    code, _, err = _pack(folder, built["qwen2_5_vl", "4.x"][1].parent.parent / "src" / "chats.jsonl",
                         tmp_path / "out")
    assert code == 2 and err.count("\n") == 1, err
    assert f"cannot read {folder / 'video_preprocessor_config.json'}" in err and "save_pretrained" in err
    assert not (tmp_path / "out").exists()


# ---- the reader and the Qwen spellings, without a child ------------------------------------------------------------


def test_transformers_order_nested_then_own_file_then_the_image_processors(tmp_path):
    nested = {"image_processor": {"size": {"shortest_edge": 1, "longest_edge": 2}},
              "video_processor": {"fps": 1.0}, "processor_class": "Qwen2_5_VLProcessor"}
    (tmp_path / "processor_config.json").write_text(json.dumps(nested))
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps({"fps": 2.0}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"fps": 3.0, "min_pixels": 5}))
    assert read_settings(tmp_path, "video_processor").values == {"fps": 1.0}
    assert read_settings(tmp_path, "image_processor").values == nested["image_processor"]
    (tmp_path / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2_5_VLProcessor"}))
    s = read_settings(tmp_path, "video_processor")
    assert (s.values, s.file, s.path) == ({"fps": 2.0}, "video_preprocessor_config.json",
                                          str(tmp_path / "video_preprocessor_config.json"))
    (tmp_path / "video_preprocessor_config.json").unlink()
    assert read_settings(tmp_path, "video_processor").source == SOURCES["hub"]
    assert read_settings(tmp_path, "image_processor").source == "preprocessor_config.json"
    (tmp_path / "preprocessor_config.json").unlink()
    assert read_settings(tmp_path, "video_processor").values is None
    assert read_settings(tmp_path, "video_processor").source == "the class's defaults"


def test_size_in_either_spelling_and_the_pixels_at_the_top():
    """``Qwen2VLVideoProcessor`` takes top-level ``min_pixels``/``max_pixels`` over ``size``; Qwen3-VL's ignores
    them (transformers 5.24)."""
    old = {"size": {"min_pixels": 6272, "max_pixels": 50176}}
    new = {"size": {"shortest_edge": 6272, "longest_edge": 50176}}
    for config in (old, new):
        s = QwenVideoSampling.from_config(config)
        assert (s.min_pixels, s.max_pixels) == (6272, 50176)
    s = QwenVideoSampling.from_config({**new, "min_pixels": 3136, "max_pixels": 40000})
    assert (s.min_pixels, s.max_pixels) == (3136, 40000)
    s = QwenVideoSampling.from_config({**new, "max_pixels": 40000}, base=QWEN3_VL_VIDEO, pixels_at_top=False)
    assert (s.min_pixels, s.max_pixels, s.patch_size, s.fps) == (6272, 50176, 16, 2.0)
    s = QwenVideoSampling.from_config({"min_pixels": 3136, "max_pixels": 12845056})  # Qwen2.5-VL's Hub checkpoint
    assert (s.min_pixels, s.max_pixels, s.do_sample_frames) == (3136, 12845056, False)
    with pytest.raises(ConfigError, match=r"size \{'max_pixels': 50176\} has no shortest_edge \(or min_pixels\)"):
        QwenVideoSampling.from_config({"size": {"max_pixels": 50176}})
    with pytest.raises(ConfigError, match=r"max_frames 16.5 is not a whole number"):
        QwenVideoSampling.from_config({"max_frames": 16.5})


@pytest.mark.parametrize("settings, says", [
    ({"video_processor": "fast"}, "'video_processor' is str 'fast', not the video processor's settings"),
    ([1, 2], "holds a JSON list, not an object of settings"),
])
def test_settings_of_the_wrong_shape_are_refused(tmp_path, settings, says):
    (tmp_path / "processor_config.json").write_text(json.dumps(settings))
    with pytest.raises(ConfigError, match=says) as e:
        read_settings(tmp_path, "video_processor")
    assert str(tmp_path / "processor_config.json") in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("config, says", [
    ({"do_sample_frames": "yes"}, "do_sample_frames 'yes' is not true or false"),
    ({"fps": 0}, "fps 0 is not a positive number"),
    ({"size": 50176}, "size 50176 is not a mapping"),
])
def test_qwen_settings_of_the_wrong_type_are_refused(config, says):
    with pytest.raises(ConfigError, match=says):
        QwenVideoSampling.from_config(config)


def test_the_summary_lines_of_older_datasets_and_of_the_users_settings():
    """A manifest from before the settings were recorded reads as it did; the user's settings are named by flag."""
    from wdspack.packer.config import PackSummary

    base = dict(output="out", samples_read=1, samples_packed=1, dropped_by_reason={}, packs=1, tokens=90, images=1,
                fill_ratio=0.9, shards=1, bytes=1000, seconds=1.0, media={"video": 1})
    video = {"do_sample_frames": True, "fps": 2.0, "min_frames": 4, "max_frames": 768, "max_pixels": 12544}
    old = PackSummary(**base, image_policy={"kind": "processor", "family": "qwen2_5_vl", "video": video}).lines()
    assert "videos   frames at 2 fps (4 to 768 a video), at most 12544 pixels each, tokens from each video's header" \
        in old
    new = {**video, "min_pixels": 3136, "settings_from": "processor_config.json",
           "overrides": {"fps": 2.0, "max_frames": 64, "max_pixels": 12544}}
    (line,) = [x for x in PackSummary(**base, image_policy={"kind": "processor", "video": new}).lines()
               if x.startswith("videos")]
    assert line.endswith("; settings from processor_config.json, --video-fps 2, --video-max-frames 64 and "
                         "--video-max-pixels 12544 over them")
    llava = {"do_sample_frames": True, "num_frames": 8, "height": 384, "width": 384, "max_pixels": None,
             "settings_from": "video_preprocessor_config.json"}
    assert "videos   8 frames a video, each resized to 384x384, tokens from each video's header; settings from " \
           "video_preprocessor_config.json" in PackSummary(**base, image_policy={"kind": "processor",
                                                                                  "video": llava}).lines()


@pytest.mark.parametrize("key", [(name, layout) for name in FAMILIES for layout in LAYOUTS]
                         + [("qwen2_5_vl", "hub")], ids="-".join)
def test_the_videos_stream_pixel_for_pixel_as_the_processor_makes_them(built, key):
    """Streamed with the same folder as the loader's processor, every video's rows are the ones
    ``AutoProcessor.from_pretrained(folder)`` makes of it, bit for bit, in pack order."""
    import numpy as np
    import torch

    folder, dataset, _, refs = built[key]
    (batch,) = h.loader_batches(dataset, str(folder))
    order = [sid for ids in h.pack_sample_ids(dataset) for sid in ids]
    want = [refs[sid]["pixel_values_videos"] for sid in order if "pixel_values_videos" in refs[sid]]
    real = batch["video_patch_mask"] if "video_patch_mask" in batch else batch["video_frame_mask"]
    got = batch["pixel_values_videos"][real]
    assert len(want) >= 4 and torch.equal(got, torch.from_numpy(np.concatenate([w.reshape(-1, *got.shape[1:])
                                                                                for w in want])))
