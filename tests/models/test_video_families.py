"""Video, exactly: Qwen2-VL, Qwen2.5-VL and Qwen3-VL chats with videos (and with images and videos in one
sample), packed from LLaMA-Factory's ``mllm_video_demo.json`` layout and LLaVA-Video's, streamed, and
trained: every sub-sample's tokens are the real processor's (with its real video processor), the
loader's ``pixel_values_videos`` are its pixels bit for bit, and the packed loss and gradients equal
the sub-samples run one by one through processor → model, in float64.

The reference is transformers' own processor with its video processor, which needs torchvision: it runs
in one child process (``tests/support/video_reference.py``) for the three families together.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

import wdspack
from tests.support import vlm_harness as h
from tests.support.video_chats import ROWS, one_by_one, source_folder, typed
from tests.support.video_reference import processor_job, run_jobs
from wdspack.media.video.plan import VideoSettings
from wdspack.models import save_processor
from wdspack.packer.config import PackConfig
from wdspack.packer.job import pack_dataset
from wdspack.packer.samples import SampleConfig

av = pytest.importorskip("av")

SEQ_LEN = 112
FPS = 4.0
#: family -> (tiny_vlm module, processor class, model class, frame pixels (min = max: one size per clip))
FAMILIES = {
    "qwen2_5_vl": ("qwen2_5_vl", "Qwen2_5_VLProcessor", "Qwen2_5_VLForConditionalGeneration", 28 * 28 * 4),
    "qwen2_vl": ("qwen2_5_vl", "Qwen2VLProcessor", "Qwen2VLForConditionalGeneration", 28 * 28 * 4),
    "qwen3_vl": ("qwen3_vl", "Qwen3VLProcessor", "Qwen3VLForConditionalGeneration", 32 * 32 * 16),
}
@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_processors, video_reference):
    """Per family: processor (the session's), tiny model (float64), packed dataset, and per sample the reference
    outputs (from the session's reference child)."""
    import importlib

    root = tmp_path_factory.mktemp("video")
    src = source_folder(root)
    (src / "chats.jsonl").write_text("".join(json.dumps({"id": sid, **row}) + "\n" for sid, row in ROWS.items()))
    out, jobs = {}, []
    for name, (module, cls, model_cls, pixels) in FAMILIES.items():
        tiny = importlib.import_module(f"tiny_vlm.{module}")
        kwargs = {"cls": cls} if module == "qwen2_5_vl" else {}
        processor = tiny_processors.get(module, **kwargs)
        folder = save_processor(processor, root / name / "processor")
        dataset = root / name / "packed"
        summary = pack_dataset([str(src / "chats.jsonl")], str(dataset),
                               sample_config=SampleConfig(processor=str(folder),
                                                          video=VideoSettings(fps=FPS, max_pixels=pixels)),
                               config=PackConfig(seq_len=SEQ_LEN, max_images=3, on_error="raise"), progress=False)
        assert summary.samples_packed == len(ROWS), summary.lines()
        model = tiny.model(processor, **({"cls": model_cls} if module == "qwen2_5_vl" else {})).double()
        model.config.save_pretrained(folder)  # a checkpoint's folder holds the model's config.json too
        calls = []
        for row in ROWS.values():
            text = processor.apply_chat_template(typed(row), tokenize=False)
            videos = row.get("videos") or ([row["video"]] if "video" in row else [])
            calls.append({"text": text, "videos": [src / v for v in videos],
                          "images": [src / i for i in row["images"]] if "images" in row else None})
        # the folder has no video settings: transformers builds the video processor from its image processor's
        # (min pixels included), and --video-max-pixels lowers the bound to the max where it is above
        least = min(pixels, int(processor.image_processor.size["shortest_edge"]))
        settings = {"do_sample_frames": True, "fps": FPS, "size": {"shortest_edge": least, "longest_edge": pixels}}
        jobs.append(processor_job(folder, cls, settings, calls))
        out[name] = (processor, model, dataset)
    references = run_jobs(jobs)
    return {name: (*out[name], dict(zip(ROWS, refs))) for name, refs in zip(FAMILIES, references)}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, built):
    return built[request.param]


def test_tokens_and_pixels_are_the_processors(family):
    processor, model, dataset, refs = family
    subs = h.dataset_sub_samples(dataset)
    for sid, ref in refs.items():
        assert subs[sid][0].tolist() == ref["input_ids"][0].tolist(), f"{sid}: tokens differ from the processor's"
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    order = [sid for ids in h.pack_sample_ids(dataset) for sid in ids]
    want = [torch.from_numpy(refs[sid]["pixel_values_videos"]) for sid in order if "pixel_values_videos" in refs[sid]]
    assert torch.equal(kwargs["pixel_values_videos"], torch.cat(want))
    grids = [refs[sid]["video_grid_thw"] for sid in order if "video_grid_thw" in refs[sid]]
    assert kwargs["video_grid_thw"].tolist() == np.concatenate(grids).tolist()
    assert sum(len(g) for g in grids) == 4 and torch.equal(kwargs["pixel_values"], torch.from_numpy(
        refs["v-mixed"]["pixel_values"]))


def test_the_batchs_positions_are_the_models(family, caplog):
    """The raw batch's ``position_ids`` (a loop that feeds the batch to the model itself) are the model's own
    ``get_rope_index`` of each sub-sample alone, the videos' time axis included: Qwen2.5-VL's
    ``tokens_per_second`` is read from the model's ``config.json`` in the processor's folder (the tiny model's
    is transformers' class default, 4: not the published checkpoints' 2, which the loader falls back to)."""
    _, model, dataset, refs = family
    folder = dataset.parent / "processor"
    if model.config.model_type == "qwen2_5_vl":
        assert model.config.vision_config.tokens_per_second == 4
    with caplog.at_level("WARNING"):
        (batch,) = h.loader_batches(dataset, str(folder))
    assert "tokens_per_second" not in caplog.text
    B = batch["input_ids"].shape[0]
    videos = 0
    for b, ids in enumerate(h.pack_sample_ids(dataset)):
        start = 0
        for sid in ids:
            ref = {k: torch.from_numpy(v) for k, v in refs[sid].items()}
            n = ref["input_ids"].shape[1]
            extra = {"second_per_grid_ts": ref["second_per_grid_ts"]} \
                if model.config.model_type == "qwen2_5_vl" and "second_per_grid_ts" in ref else {}
            rope, _ = model.model.get_rope_index(ref["input_ids"], ref["mm_token_type_ids"],
                                                 ref.get("image_grid_thw"), ref.get("video_grid_thw"), **extra)
            assert torch.equal(batch["position_ids"][1:, b, start:start + n], rope[:, 0]), sid
            assert torch.equal(batch["position_ids"][0, b, start:start + n], torch.arange(n)), sid
            videos += "video_grid_thw" in ref
            start += n
    assert B and videos == 4
    # model_inputs hands the model the same positions (nothing left to move)
    assert torch.equal(wdspack.model_inputs(batch, model)["position_ids"], batch["position_ids"])


def test_packed_loss_and_gradients_equal_one_by_one(family):
    processor, model, dataset, refs = family
    want = one_by_one(model, dataset, refs)
    batches = h.loader_batches(dataset, processor)
    assert len(h.pack_sample_ids(dataset)) >= 2 and any(int(n) < SEQ_LEN for b in batches for n in b["num_tokens"])
    h.assert_same(model, h.packed(model, batches), want)


def test_varlen_attention_covers_the_video_tower(built):
    """``use_varlen_attention`` on padding-free batches: the vision tower runs the kernel on the videos'
    frames too, and loss and gradients still equal the one-by-one SDPA path."""
    from wdspack.models.varlen import reference_varlen_attn

    processor, model, dataset, refs = built["qwen2_5_vl"]
    model = copy.deepcopy(model)
    want = one_by_one(model, dataset, refs)
    calls = {"vision": 0}

    def kernel(*args, **kwargs):
        calls["vision"] += kwargs["window_size"] == (-1, -1)
        return reference_varlen_attn(*args, **kwargs)

    kernel.__name__ = "counting_reference"
    wdspack.use_varlen_attention(model, kernel=kernel)
    batches = h.loader_batches(dataset, processor, padding_free=True)
    assert any(bool(b["video_mask"].any()) for b in batches)
    h.assert_same(model, h.packed(model, batches), want)
    assert calls["vision"] > 0


def test_uint8_video_pixels_normalise_to_the_same_rows(built):
    """``pixel_dtype="uint8"``: the videos' rows travel as bytes and ``normalize_pixels`` gives the float32
    rows bit for bit (the video processors' own fused normalisation, on the CPU here)."""
    processor, _, dataset, _ = built["qwen3_vl"]
    packs = sum(s.packs for s in wdspack.read_manifest(dataset / "manifest.json").shards)
    floats = h.loader_batches(dataset, processor)[0]
    loader = wdspack.make_loader(str(dataset), batch_size=packs, num_workers=0, shuffle=False, processor=processor,
                                 pixel_dtype="uint8")
    (raw,) = list(loader)
    assert raw["pixel_values_videos"].dtype == torch.uint8
    done = wdspack.normalize_pixels(raw, loader)
    assert torch.equal(done["pixel_values_videos"], floats["pixel_values_videos"])
    # images keep their own path (the Pillow image processor's order of operations: equal to float rounding)
    torch.testing.assert_close(done["pixel_values"], floats["pixel_values"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("pixel_dtype", ["float32", "uint8"])
def test_workers_write_video_rows_into_recycled_buffers(built, pixel_dtype, monkeypatch):
    """With a worker, ``pixel_values_videos`` is written (and, float32, normalised) straight into the worker's
    recycled shared-memory buffers for that key: over three epochs the batches are the in-process ones and
    come in the few buffers (``prefetch_factor + 3`` a key at most) passed to this process once each."""
    from multiprocessing import resource_sharer

    from wdspack.loader.batch import buffers

    monkeypatch.setattr(buffers, "_BY_VALUE_BYTES", 64 << 10)  # the tiny pixels through shared memory (forked worker)
    passed, detach = [], resource_sharer.DupFd.detach  # what receiving a descriptor calls, in this process

    def counted(self):
        passed.append(1)
        return detach(self)

    monkeypatch.setattr(resource_sharer.DupFd, "detach", counted)
    processor, _, dataset, _ = built["qwen2_5_vl"]
    options = {"batch_size": 1, "shuffle": False, "processor": processor, "pixel_dtype": pixel_dtype}
    want = list(wdspack.make_loader(str(dataset), num_workers=0, **options))
    loader = wdspack.make_loader(str(dataset), num_workers=1, prefetch_factor=1, **options)
    batches = 0
    for _ in range(5):
        for got, ref in zip(loader, want, strict=True):
            assert got["pixel_values_videos"].dtype == getattr(torch, pixel_dtype)
            assert got["pixel_values_videos"].nbytes > buffers._BY_VALUE_BYTES
            for key in ("pixel_values_videos", "video_patch_mask", "video_grid_thw", "pixel_values", "input_ids"):
                assert torch.equal(got[key], ref[key]), key
            batches += 1
    assert 0 < len(passed) <= 2 * (1 + 3) < batches, (len(passed), batches)  # images' and videos' buffers


def test_webdataset_video_captions_pack_and_stream(built, tmp_path):
    """WebDataset caption shards with video members (a video and its caption; a video, an image and a caption)
    pack with the processor, each video planned from its header as a chat's is, and stream: the packs' video
    tokens are their plans' and the clip's rows are the ones the chats' dataset streams for it."""
    from tests.support.pretrain import write_tar
    from wdspack.packer.text import PretrainConfig

    processor, _, chats, _ = built["qwen2_5_vl"]
    src = chats.parents[1] / "src"
    shard = write_tar(tmp_path / "cap-000000.tar", [
        ("a.mp4", (src / "clips" / "a.mp4").read_bytes()), ("a.txt", b"A block crosses a grey field."),
        ("b.png", (src / "images" / "p.png").read_bytes()), ("b.webm", (src / "clips" / "c.webm").read_bytes()),
        ("b.txt", b"A frame and a clip."),
    ])
    out = tmp_path / "packed"
    folder = chats.parent / "processor"
    summary = pack_dataset([str(shard)], str(out), progress=False,
                           sample_config=SampleConfig(processor=str(folder), pretrain=PretrainConfig(
                               eos_token="<|endoftext|>"), video=VideoSettings(fps=FPS, max_pixels=28 * 28 * 4)),
                           config=PackConfig(seq_len=SEQ_LEN, max_images=3, on_error="raise"))
    assert summary.samples_packed == 2 and wdspack.read_manifest(out / "manifest.json").totals["videos"] == 2
    (batch,) = h.loader_batches(out, processor)
    assert int(batch["video_mask"].sum()) == 2 and int(batch["image_mask"].sum()) == 1
    video_pad = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    grids = batch["video_grid_thw"][batch["video_mask"]]
    assert int((batch["input_ids"] == video_pad).sum()) == int(grids.prod(-1).sum()) // 4
    (theirs,) = h.loader_batches(chats, processor)  # clips a and c, checked against the real processor there
    known, blocks = _video_blocks(theirs), _video_blocks(batch)
    assert len(blocks) == 2
    for grid, rows in blocks:
        assert any(g == grid and torch.equal(r, rows) for g, r in known), grid


def _video_blocks(batch) -> list[tuple[tuple[int, ...], torch.Tensor]]:
    """Each video's grid and ``pixel_values_videos`` rows, pack by pack (``[B, L]`` rows)."""
    B = batch["input_ids"].shape[0]
    R, M = batch["pixel_values_videos"].shape[0] // B, batch["video_mask"].shape[0] // B
    out = []
    for b in range(B):
        at = b * R
        for k in range(b * M, (b + 1) * M):
            if batch["video_mask"][k]:
                grid = tuple(batch["video_grid_thw"][k].tolist())
                n = int(np.prod(grid))
                out.append((grid, batch["pixel_values_videos"][at: at + n]))
                at += n
    return out


def test_the_folders_video_settings_are_read_without_torchvision(built, tmp_path):
    """A processor folder with a ``video_preprocessor_config.json`` (its video processor needs torchvision,
    which this environment lacks): wdspack loads the rest and plans videos by that file's settings, and the
    user's ``--video-*`` settings go over them."""
    import shutil

    from wdspack.packer.samples import SampleBuilder

    processor = built["qwen2_5_vl"][0]
    folder = shutil.copytree(save_processor(processor, tmp_path / "saved"), tmp_path / "with-video")
    (folder / "video_preprocessor_config.json").write_text(json.dumps({
        "video_processor_type": "Qwen2VLVideoProcessor", "do_sample_frames": True, "fps": 1.0, "min_frames": 2,
        "max_frames": 16, "size": {"shortest_edge": 3136, "longest_edge": 6272}, "patch_size": 14,
        "temporal_patch_size": 2, "merge_size": 2}))
    with pytest.raises(ImportError):  # the class itself cannot be built here
        from transformers import Qwen2VLVideoProcessor

        Qwen2VLVideoProcessor()
    s = SampleBuilder(SampleConfig(processor=str(folder))).video_sampling
    assert (s.do_sample_frames, s.fps, s.min_frames, s.max_frames, s.min_pixels, s.max_pixels) == \
        (True, 1.0, 2, 16, 3136, 6272)
    over = SampleBuilder(SampleConfig(processor=str(folder), video=VideoSettings(fps=3.0, max_frames=8))).video_sampling
    assert (over.fps, over.max_frames, over.min_pixels, over.max_pixels) == (3.0, 8, 3136, 6272)


def test_a_resharded_copy_and_a_mixture_carry_the_videos(built, tmp_path):
    """``wdspack reshard`` keeps each video's bytes and plan (no source read again); a mixture of the dataset
    and its reshard streams both sources' videos in batches of one shape."""
    from wdspack.cli import main

    processor, model, dataset, _ = built["qwen2_5_vl"]
    copy_ = tmp_path / "resharded"
    assert main(["reshard", str(dataset), str(copy_), "--seq-len", str(SEQ_LEN), "--shard-packs", "1", "--quiet"]) == 0
    assert main(["verify", str(copy_)]) == 0
    assert main(["verify", str(dataset), "--source", str(dataset.parents[1] / "src" / "chats.jsonl")]) == 0
    assert h.dataset_sub_samples(copy_).keys() == h.dataset_sub_samples(dataset).keys()
    totals = wdspack.read_manifest(copy_ / "manifest.json").totals
    assert totals["videos"] == 4 and totals["max_video_tokens_per_pack"] > 0
    loader = wdspack.make_loader([(str(dataset), 1.0), (str(copy_), 1.0)], batch_size=1, num_workers=0, seed=0,
                                 processor=processor)
    shapes, seen = set(), {0: 0, 1: 0}
    for batch in loader:
        shapes.add(tuple((k, tuple(v.shape)) for k, v in sorted(batch.items()) if isinstance(v, torch.Tensor)))
        seen[int(batch["source_idx"][0])] += int(batch["video_mask"].sum())
        kwargs = wdspack.model_inputs(batch, model)
        assert ("pixel_values_videos" in kwargs) == bool(batch["video_mask"].any())
    assert len(shapes) == 1 and seen[0] > 0 and seen[1] > 0
