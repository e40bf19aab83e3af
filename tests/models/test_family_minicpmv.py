"""MiniCPM-V 4.6, exactly: the real ``MiniCPMV4_6Processor`` (with its real video processor, in the video reference's
child) and ``MiniCPMV4_6ForConditionalGeneration`` (tiny).

Images become an overview and a grid of slices (``<image>…</image><slice>…</slice>`` rows); a video's sampled
frames (one a second) each become the same. The batch carries each pack's NaViT patches as rows with each slice's
``target_sizes`` (``_videos`` for the frames). One dataset holds every kind: two videos in a sample (``<image_id>``
0 and 1), an image and a video in one (each numbered among its own kind), two images, text. The text model
(Qwen3.5) has a linear-attention layer, which runs per sub-sample.
"""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
import torch
from PIL import Image

import wdspack
from tests.support import vlm_harness as h
from tests.support.video_chats import clip, one_by_one, source_folder, typed
from tests.support.video_reference import processor_job, run_jobs, video_processor_job
from wdspack.errors import ConfigError
from wdspack.media.video.header import read_header
from wdspack.media.video.plan import VideoSettings
from wdspack.models.families.minicpmv import MINICPMV4_6, MiniCPMVideoSampling, image_layout, plan_minicpmv
from wdspack.packer.config import PackConfig
from wdspack.packer.job import pack_dataset
from wdspack.packer.samples import SampleConfig

av = pytest.importorskip("av")

SEQ_LEN = 160
#: id -> record (LLaMA-Factory's layout): every media kind, the <image_id> numbering of each, in two packs
ROWS = {
    "v-two": {"messages": [{"role": "user", "content": "<video>and<video>: which moves more?"},
                           {"role": "assistant", "content": "The first one."}],
              "videos": ["clips/a.mp4", "clips/b.mp4"]},
    "v-mixed": {"messages": [{"role": "user", "content": "Compare <image> with <video> please."},
                             {"role": "assistant", "content": "The picture is still; the clip moves."}],
                "images": ["images/p.png"], "videos": ["clips/c.webm"]},
    "two-images": {"messages": [{"role": "user", "content": "<image> or <image>?"},
                                {"role": "assistant", "content": "The wide one."}],
                   "images": ["images/wide.png", "images/thin.png"]},
    "text": {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]},
}
#: the clips the plans are checked on besides the chats' (a.mp4 10 fps, b.mp4 29.97 fps, c.webm without a count)
LONG = "clips/long.mp4"
#: (height, width): within one slice, just over it, wide, tall, extreme ratios, past max_slice_nums.
SIZES = [(1, 1), (20, 30), (56, 56), (57, 56), (56, 96), (100, 44), (70, 36), (13, 200), (200, 13), (3, 500),
         (300, 400), (1000, 999)]

#: Qwen3.5's Gated DeltaNet casts its inputs to float32 (transformers' torch path), so the float64 rounding that
#: differs between a pack and a sub-sample alone (SDPA over a longer row) can flip a float32 rounding there: the
#: gradients agree to float32 rounding on small entries (measured 5e-11 absolute, 1.3e-5 relative); the loss to 1e-9.
GRADIENTS = h.EAGER_GRADIENTS
TOLERANCE = {"sdpa": dict(rtol=1e-9, atol=1e-11), "eager": dict(rtol=1e-6, atol=1e-8)}


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_processors, video_reference):
    """The session's processor and its folder, the tiny model (float64), the packed dataset, per sample the real
    processor's outputs and per clip the real video processor's (default settings, and ``max_num_frames`` 1)."""
    root = tmp_path_factory.mktemp("minicpmv")
    src = source_folder(root)
    clip(src / LONG, codec="h264", rate=Fraction(5), frames=16, width=30, height=90)
    (src / "images" / "wide.png").write_bytes(h._png((96, 56), seed=5))
    (src / "images" / "thin.png").write_bytes(h._png((200, 13), seed=6))  # a 4-token overview, no slices
    (src / "chats.jsonl").write_text("".join(json.dumps({"id": sid, **row}) + "\n" for sid, row in ROWS.items()))
    processor = tiny_processors.family("minicpmv4_6")
    folder = tiny_processors.folder(processor)
    dataset = root / "packed"
    summary = pack_dataset([str(src / "chats.jsonl")], str(dataset), sample_config=SampleConfig(processor=str(folder)),
                           config=PackConfig(seq_len=SEQ_LEN, max_images=3, on_error="raise"), progress=False)
    assert summary.samples_packed == len(ROWS), summary.lines()
    calls = [{"text": processor.apply_chat_template(typed(row), tokenize=False),
              "videos": [src / v for v in row.get("videos", [])],
              "images": [src / i for i in row["images"]] if "images" in row else None} for row in ROWS.values()]
    settings = {k: v for k, v in processor.video_processor.to_dict().items()
                if k in ("max_num_frames", "scale_resolution", "max_slice_nums", "patch_size", "image_mean",
                         "image_std")}
    clips = [src / c for c in ("clips/a.mp4", "clips/b.mp4", "clips/c.webm", LONG)]
    refs, per_clip, long = run_jobs([processor_job(folder, "MiniCPMV4_6Processor", settings, calls),
                                     video_processor_job("minicpmv4_6", clips, settings),
                                     video_processor_job("minicpmv4_6", clips, {**settings, "max_num_frames": 2})])
    model = h.family_model("minicpmv4_6", processor).double()
    return processor, model, dataset, dict(zip(ROWS, refs)), {"default": (clips, per_clip), "two": (clips, long)}


def test_family_is_found_from_processor_and_model(built):
    processor, model = built[:2]
    assert wdspack.models.family_for(processor) is MINICPMV4_6 and wdspack.models.family_for(model) is MINICPMV4_6


def test_tokens_pixels_and_sizes_are_the_processors(built):
    """Every sub-sample's ids are the real processor's (videos numbered among the sample's videos, images among
    its images); the loader's pixels and target sizes, images' and videos', are its own bit for bit."""
    processor, model, dataset, refs, _ = built
    subs = h.dataset_sub_samples(dataset)
    for sid, ref in refs.items():
        assert subs[sid][0].tolist() == ref["input_ids"][0].tolist(), f"{sid}: tokens differ from the processor's"
    assert processor.tokenizer.decode(subs["v-two"][0]).count("<image_id>1</image_id>") == 1
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    order = [sid for ids in h.pack_sample_ids(dataset) for sid in ids]
    for key, sizes in (("pixel_values", "target_sizes"), ("pixel_values_videos", "target_sizes_videos")):
        have = [sid for sid in order if key in refs[sid]]
        assert len(have) == 2, key
        want = torch.cat([torch.from_numpy(refs[sid][key]) for sid in have], dim=-1)
        assert torch.equal(kwargs[key], want), key
        assert kwargs[sizes].tolist() == np.concatenate([refs[sid][sizes] for sid in have]).tolist(), sizes
    assert not batch["pixel_values_videos"][~batch["video_patch_mask"]].any()


@pytest.mark.parametrize("which", ["default", "two"])
def test_video_plans_are_the_processors(built, which):
    """From the header alone: the frames the video processor samples (one a second; a clip longer than
    ``max_num_frames`` seconds thinned from every 0.1 s) and every frame's slices and tokens."""
    processor = built[0]
    clips, outs = built[4][which]
    base = MiniCPMVideoSampling.from_config(processor.video_processor.to_dict())
    s = base if which == "default" else VideoSettings(max_frames=2).apply(base)
    plans = [plan_minicpmv(read_header(path.read_bytes()), s) for path in clips]
    for path, plan, out in zip(clips, plans, outs):
        assert list(plan.indices) == out["frames_indices"].tolist(), path.name
        assert [list(t) for t in plan.frame_sizes] * len(plan.indices) == out["target_sizes_videos"].tolist()
        assert plan.tokens == int(out["target_sizes_videos"].prod(-1).sum()) // 16, path.name
    assert any(len(p.indices) > 1 for p in plans) and any(len(p.frame_sizes) > 1 for p in plans)
    if which == "two":  # 3.2 s over max_num_frames 2: every 0.1 s, thinned
        assert plans[-1].indices == (0, 15)


def test_video_settings_from_the_folder_and_the_flags(built):
    """``max_num_frames`` comes from the folder and ``--video-max-frames`` goes over it; the rate and the frame
    size are the processor's own rule: ``--video-fps`` (but 1), ``--video-max-pixels`` and ``stack_frames`` over 1
    are refused with the fix."""
    processor, _, dataset = built[:3]
    spec = json.loads((dataset / "manifest.json").read_text())["image_policy"]["video"]
    assert spec["max_frames"] == processor.video_processor.max_num_frames == 8
    header = read_header((dataset.parent / "src" / "clips" / "a.mp4").read_bytes())
    base = MiniCPMVideoSampling.from_config(processor.video_processor.to_dict())
    assert len(plan_minicpmv(header, VideoSettings(max_frames=1).apply(base)).indices) == 1
    for user in (VideoSettings(fps=2.0), VideoSettings(max_pixels=10_000), VideoSettings(num_frames=2)):
        with pytest.raises(ConfigError, match="--video-max-frames bounds the frames"):
            plan_minicpmv(header, user.apply(base))
    with pytest.raises(ConfigError, match="set stack_frames to 1"):
        MiniCPMVideoSampling.from_config({"stack_frames": 2})


def test_replacements_from_sizes_are_the_processors(built):
    """For every size, the text from the header alone is the processor's own from the pixels (its slice grid,
    overview and slices), and so are the slices' target sizes."""
    processor = built[0]
    tok, token = processor.tokenizer, processor.image_token
    for height, width in SIZES:
        image = Image.new("RGB", (width, height), (120, 30, 200))
        want = processor(text=[f"a{token}b{token}"], images=[image, image], return_tensors="pt")
        texts = MINICPMV4_6.image.replacements(processor, [(height, width), (height, width)])
        got = tok(f"a{texts[0]}b{texts[1]}", add_special_tokens=False)["input_ids"]
        assert got == want["input_ids"][0].tolist(), (height, width)
        _, sizes = image_layout(processor.image_processor, height, width)
        assert sizes * 2 == want["target_sizes"].tolist(), (height, width)
    one = "<image>" + "<|image_pad|>" + "</image>"
    (text,) = MINICPMV4_6.image.replacements(processor, [(56, 96)])  # the layout drawn in the docstring
    assert text == f"<image_id>0</image_id>{one}" + "<slice><|image_pad|></slice>" * 2
    assert MINICPMV4_6.image.replacements(processor, [(40, 40)]) == [f"<image_id>0</image_id>{one}"]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_loss_and_gradients_equal_one_by_one(built, attn):
    """Images, videos and text in two packs (one with padding) give the loss and gradients of each sample alone
    through the real processor and model."""
    _, model, dataset, refs, _ = built
    model.set_attn_implementation(attn)
    try:
        want = one_by_one(model, dataset, refs)
        batches = h.loader_batches(dataset, built[0])
        got = h.packed(model, batches)
    finally:
        model.set_attn_implementation("sdpa")
    packs = h.pack_sample_ids(dataset)
    assert len(packs) >= 2 and any(len(p) > 1 for p in packs)
    assert any(int(n) < SEQ_LEN for b in batches for n in b["num_tokens"])
    h.assert_same(model, got, want, **TOLERANCE[attn], looser=GRADIENTS)


def test_varlen_attention_loss_and_gradients_equal_one_by_one(built):
    """``wdspack.use_varlen_attention`` (the CPU reference kernel, per-segment SDPA) on the padding-free batches:
    the full-attention layers take the segments through the kernel, the linear-attention ones run per segment, and
    the images and videos give each sample's loss and gradients alone."""
    import copy

    from wdspack.models.varlen import reference_varlen_attn

    processor, model, dataset, refs, _ = built
    model = copy.deepcopy(model)
    want = one_by_one(model, dataset, refs)
    wdspack.use_varlen_attention(model, kernel=reference_varlen_attn)
    assert model.config.get_text_config()._attn_implementation.startswith("wdspack_varlen")
    batches = h.loader_batches(dataset, processor, padding_free=True)
    assert all(b["input_ids"].shape[0] == 1 for b in batches), "one row a batch: no padding between the packs"
    h.assert_same(model, h.packed(model, batches), want, **TOLERANCE["sdpa"], looser=GRADIENTS)


def test_linear_attention_across_sub_samples_is_not_exact(built):
    """The check above can fail: without the segments the linear-attention state runs on across sub-samples
    (the random model's near-uniform logits move the mean loss by little, so its logits are compared)."""
    processor, model, dataset = built[:3]
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    with torch.no_grad():
        exact = model(**kwargs).logits
        state = model(**{k: v for k, v in kwargs.items() if k != "wdspack_cu_seqlens"}).logits
    assert float((state - exact).abs().max()) > 1e-3


def test_show_lays_a_pack_out(built, capsys):
    """``wdspack show``: a marker per run of an item's tokens (its overview and each slice), each item's count
    taken run by run: the thin image after the sliced one reads as its own 4 tokens, not as the rest of the other."""
    from wdspack.cli import main

    dataset = built[2]
    assert main(["show", str(dataset), "--packs", "3", "--color", "never"]) == 0
    text = capsys.readouterr().out
    sliced = "<image><image×1></image><slice><image×1></slice><slice><image×1></slice>"
    assert f"<image_id>0</image_id>{sliced} or <image_id>1</image_id><image><image×4></image>?" in text, text


def test_inspect_counts_what_the_packs_hold(built, capsys):
    """``wdspack inspect --deep``: per pack its samples, tokens (overviews and slices included), images, videos,
    the frames the real video processor samples from each clip and a video's ``<|video_pad|>`` tokens."""
    processor, _, dataset, refs, clips = built
    paths, per_clip = clips["default"]
    frames = {str(path.relative_to(path.parents[1])): len(out["frames_indices"]) for path, out in zip(paths, per_clip)}
    pad = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    packs = [{"tokens": sum(refs[s]["input_ids"].shape[1] for s in ids), "samples": len(ids),
              "images": sum(len(ROWS[s].get("images", ())) for s in ids),
              "videos": sum(len(ROWS[s].get("videos", ())) for s in ids),
              "frames": sum(frames[v] for s in ids for v in ROWS[s].get("videos", ())),
              "video_tokens": sum(int((refs[s]["input_ids"] == pad).sum()) for s in ids)}
             for ids in h.pack_sample_ids(dataset)]
    assert len({p["frames"] for p in packs}) == 3, packs  # no video, one frame, three: the spread tells
    h.check_inspect(dataset, packs, capsys)
