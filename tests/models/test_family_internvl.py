"""InternVL, exactly: images in LLaMA-Factory's ``mllm_demo.json`` layout and videos in its ``mllm_video_demo.json``
layout (and an image and a video in one sample), packed from a folder the real
``InternVLProcessor`` wrote with its own ``save_pretrained`` (its video settings in it), streamed and trained:
every sub-sample's tokens are the real processor's (its real ``InternVLVideoProcessor`` included), the model's
``pixel_values`` (image tiles and video frames in token order) are its pixels bit for bit, and the packed loss and
gradients equal the sub-samples run one by one through processor → model, in float64, under SDPA and eager.

Tiles of 16 px, 4 tokens each, 1 to 4 tiles an image (+ a thumbnail); 3 frames a video (the folder's
``num_frames``). The reference runs in the session's child process (``tests/support/video_reference.py``): its
video processor needs torchvision.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
import torch
from PIL import Image

import wdspack
from tests.support import vlm_harness as h
from tests.support.video_chats import ROWS, one_by_one, source_folder, typed
from tests.support.video_reference import processor_job, run_jobs, save_job
from wdspack.errors import ConfigError, SampleError
from wdspack.media.video.plan import VideoSettings, read_header
from wdspack.models import load_processor
from wdspack.models.families.internvl import INTERNVL, tile_kinds
from wdspack.ops.show import show_lines
from wdspack.packer.config import PackConfig
from wdspack.packer.job import pack_dataset
from wdspack.packer.samples import SampleConfig

av = pytest.importorskip("av")

SEQ_LEN = 128
FRAMES = 3
TILE = 16
#: the video processor's settings the folder is saved with (what a user sets in video_preprocessor_config.json)
VIDEO = {"do_sample_frames": True, "num_frames": FRAMES, "size": {"height": TILE, "width": TILE}}
#: LLaMA-Factory's mllm_demo.json layout: "<image>" in the turns' text, the files in "images"
IMAGE_ROWS = {
    "i-one": {"messages": [{"role": "user", "content": "<image>Who are they?"},
                           {"role": "assistant", "content": "Two players on a pitch."},
                           {"role": "user", "content": "What are they doing?"},
                           {"role": "assistant", "content": "Celebrating a goal."}],
              "images": ["images/wide.png"]},
    "i-two": {"messages": [{"role": "user", "content": "<image>What is this?"},
                           {"role": "assistant", "content": "A tall bar."},
                           {"role": "user", "content": "And this one?<image>"},
                           {"role": "assistant", "content": "A small square."}],
              "images": ["images/tall.png", "images/small.png"]},
}
SIZES = {"wide": (96, 40), "tall": (30, 90), "small": (12, 12)}  # (width, height): 2 + 1, 3 + 1 and 1 tile


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_processors, video_reference):
    """The folder the real processor saved (from the session's tiny processor), the processor loaded from it, the
    tiny model (float64), the packed dataset, the sources, and per sample the reference outputs."""
    from tiny_vlm import internvl

    root = tmp_path_factory.mktemp("internvl")
    src = source_folder(root)
    for name, size in SIZES.items():
        (src / "images" / f"{name}.png").write_bytes(h._png(size, seed=len(name)))
    rows = {**IMAGE_ROWS, **{sid: ROWS[sid] for sid in ("v-one", "v-odd", "v-mixed", "text")}}
    (src / "chats.jsonl").write_text("".join(json.dumps({"id": sid, **row}) + "\n" for sid, row in rows.items()))
    tiny = tiny_processors.get("internvl")
    calls = []
    for row in rows.values():
        videos = row.get("videos") or ([row["video"]] if "video" in row else [])
        calls.append({"text": tiny.apply_chat_template(typed(row), tokenize=False), "videos": [src / v for v in videos],
                      "images": [src / i for i in row["images"]] if "images" in row else None})
    folder = root / "saved"
    _, refs = run_jobs([save_job(tiny_processors.folder(tiny), "InternVLProcessor", VIDEO, folder),
                          processor_job(folder, "InternVLProcessor", VIDEO, calls)])
    processor = load_processor(str(folder))
    dataset = root / "packed"
    summary = pack_dataset([str(src / "chats.jsonl")], str(dataset), sample_config=SampleConfig(processor=str(folder)),
                           config=PackConfig(seq_len=SEQ_LEN, max_images=3, on_error="raise"), progress=False)
    assert summary.samples_packed == len(rows), summary.lines()
    return processor, internvl.model(processor).double(), dataset, src, dict(zip(rows, refs))


def test_tokens_and_pixels_are_the_processors(built):
    processor, model, dataset, _, refs = built
    subs = h.dataset_sub_samples(dataset)
    for sid, ref in refs.items():
        assert subs[sid][0].tolist() == ref["input_ids"][0].tolist(), f"{sid}: tokens differ from the processor's"
    text = processor.tokenizer.decode(subs["v-one"][0])
    assert all(f"Frame{k}: <img>" in text for k in range(1, FRAMES + 1)) and "Frame4" not in text
    assert subs["i-two"][3] == [16, 4]  # 3 tiles + thumbnail, then one tile (no thumbnail), 4 tokens each
    packs = h.pack_sample_ids(dataset)
    assert len(packs) >= 2 and any("v-mixed" in p or ({"i-one", "v-one"} <= set(p)) for p in packs)
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    want = torch.cat([torch.from_numpy(refs[sid]["pixel_values"]) for ids in packs for sid in ids
                      if "pixel_values" in refs[sid]])
    assert kwargs["pixel_values"].shape == want.shape and torch.equal(kwargs["pixel_values"], want)
    assert set(kwargs) == {"input_ids", "position_ids", "pixel_values", "labels", "use_cache"}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_loss_and_gradients_equal_one_by_one(built, attn):
    """Images alone, videos alone and both in one sub-sample, in packs with padding."""
    processor, model, dataset, _, refs = built
    model.set_attn_implementation(attn)
    try:
        want = one_by_one(model, dataset, refs)
        batches = h.loader_batches(dataset, processor)
        assert any(int(n) < SEQ_LEN for b in batches for n in b["num_tokens"]), "a pack has padding"
        got = h.packed(model, batches)
    finally:
        model.set_attn_implementation("sdpa")
    h.assert_same(model, got, want)


def test_tiles_out_of_order_are_not_exact(built):
    """The check above can fail: the batch's image tiles and video frames concatenated kind by kind (not in the
    order their tokens come) give another loss."""
    processor, model, dataset, _, _ = built
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    by_kind = torch.cat([batch["pixel_values"][batch["patch_mask"]],
                         batch["pixel_values_videos"][batch["video_patch_mask"]]])
    assert by_kind.shape == kwargs["pixel_values"].shape and not torch.equal(by_kind, kwargs["pixel_values"])
    with torch.no_grad():
        exact = model(**kwargs).loss
        assert not torch.allclose(model(**dict(kwargs, pixel_values=by_kind)).loss, exact, rtol=1e-6)


# (height, width): square, wide, tall, tiny, large, extreme ratios, ties between grids
SHAPES = [(16, 16), (40, 40), (30, 90), (90, 30), (56, 96), (100, 44), (7, 5), (300, 200), (20, 200), (200, 21),
          (48, 33), (33, 48), (64, 17), (32, 64), (24, 96)]


@pytest.mark.parametrize("max_patches,min_patches", [(4, 1), (12, 1), (6, 2), (1, 1)])
def test_tiles_from_sizes_are_the_processors(tiny_processors, max_patches, min_patches):
    """From header sizes alone, every size and aspect ratio, with the image processor's max and min tiles (its
    saved settings), gives the processor's own count (the processor turns tiling on whatever the file says)."""
    processor = copy.copy(tiny_processors.get("internvl"))
    processor.image_processor = copy.deepcopy(processor.image_processor)
    processor.image_processor.max_patches, processor.image_processor.min_patches = max_patches, min_patches
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (hh, ww, 3), dtype=np.uint8)) for hh, ww in SHAPES]
    got = INTERNVL.image.replacements(processor, SHAPES)
    ids = processor(text=["x".join(processor.image_token for _ in SHAPES)], images=images)["input_ids"][0]
    assert processor.tokenizer.encode("x".join(got), add_special_tokens=False) == list(ids)
    tiles = [t.count(processor.image_token) // 4 for t in got]
    assert len(set(tiles)) >= (4 if max_patches > 4 else 2 if max_patches > 1 else 1), tiles


def test_video_settings_from_the_folder_and_the_flags(built):
    """The folder's 3 frames a video; ``--video-fps`` / ``--video-num-frames`` / ``--video-max-frames`` over them;
    ``--video-max-pixels`` refused (frames are tiles); a video shorter than its sampling dropped."""
    processor, _, _, src, _ = built
    side = INTERNVL.video
    assert side is not None
    from wdspack.media.settings import read_settings

    base = side.sampling(processor, read_settings(built[2].parent / "saved", "video_processor").values)
    assert (base.do_sample_frames, base.num_frames, base.fps, base.height) == (True, FRAMES, None, TILE)
    clip = read_header((src / "clips" / "a.mp4").read_bytes())  # 12 frames at 10 fps
    assert side.plan(clip, base).indices == (2, 6, 10)  # arange(N / n / 2, N, N / n)
    assert side.plan(clip, VideoSettings(fps=5.0).apply(base)).indices == (1, 3, 5, 7, 9, 11)
    assert side.plan(clip, VideoSettings(fps=5.0, max_frames=4).apply(base)).tokens == 4 * 4
    assert side.plan(clip, VideoSettings(num_frames=2).apply(base)).indices == (3, 9)
    assert len(side.plan(clip, dataclasses.replace(base, do_sample_frames=False)).indices) == 12
    with pytest.raises(ConfigError, match="--video-max-pixels"):
        side.plan(clip, VideoSettings(max_pixels=4096).apply(base))
    with pytest.raises(SampleError) as e:
        side.plan(clip, VideoSettings(num_frames=13).apply(base))
    assert e.value.reason == "video_too_short"
    with pytest.raises(ConfigError, match="16x16"):
        side.sampling(processor, {"size": {"height": 32, "width": 32}})


def test_show_lays_images_and_frames_out(built):
    """``wdspack show`` names each run of ``<IMG_CONTEXT>``: an image's tiles, or a video's frame (one token for
    both kinds)."""
    _, _, dataset, _, _ = built
    lines = list(show_lines(str(dataset), packs=len(h.pack_sample_ids(dataset))))
    mixed = lines[lines.index(next(line for line in lines if "v-mixed" in line)) + 1]
    assert "<image×20></img>" in mixed and mixed.count("<video×4>") == FRAMES and "<image×4>" not in mixed
    assert "1 image, 1 video" in next(line for line in lines if "v-mixed" in line)
    two = lines[lines.index(next(line for line in lines if "i-two" in line)) + 1]
    assert "<image×16>" in two and "<image×4>" in two and "video" not in two


def test_runs_that_fit_no_item_are_refused(built):
    processor, _, _, _, _ = built
    ctx, start = int(processor.image_token_id), int(processor.start_image_token_id)
    ids = torch.tensor([5, start, ctx, ctx, ctx, 6])
    with pytest.raises(ConfigError, match="neither the next image"):
        tile_kinds(ids, [6], [1], [], context_id=ctx, start_id=start, per_tile=4, frame_text=lambda ids, k: True)
    assert tile_kinds(ids, [6], [], [1], context_id=ctx, start_id=start, per_tile=3,
                      frame_text=lambda ids, k: True).tolist() == [0, 0, 2, 2, 2, 0]


def test_inspect_counts_what_the_packs_hold(built, capsys):
    """``wdspack inspect --deep``: per pack its samples, tokens (the processor's, tiles and thumbnails included),
    images, videos, the folder's frames a video and a frame's ``<IMG_CONTEXT>`` tokens."""
    processor, _, dataset, _, refs = built
    rows = {**IMAGE_ROWS, **ROWS}
    packs = [{"tokens": sum(refs[s]["input_ids"].shape[1] for s in ids), "samples": len(ids),
              "images": sum(len(rows[s].get("images", ())) for s in ids),
              "videos": sum(len(rows[s].get("videos", ())) for s in ids),
              "frames": FRAMES * sum(len(rows[s].get("videos", ())) for s in ids),
              "video_tokens": FRAMES * int(processor.image_seq_length) * sum(len(rows[s].get("videos", ()))
                                                                            for s in ids)}
             for ids in h.pack_sample_ids(dataset)]
    assert len({p["images"] for p in packs}) > 1 and all(p["videos"] for p in packs), packs
    h.check_inspect(dataset, packs, capsys)
