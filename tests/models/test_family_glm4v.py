"""GLM-4.1V, GLM-4.5V and GLM-4.6V, exactly: the real processor classes (their real video processors in the reference
child) and model classes (tiny, random), on LLaMA-Factory's ``mllm_demo.json`` and ``mllm_video_demo.json`` layouts.

One dataset per processor class holds image chats, video chats and a text chat, packed so that one pack holds an
image chat and a video chat: its tokens and pixels are the processor's, its ``position_ids`` rows each sub-sample's
own ``get_rope_index``, and its loss and gradients equal the chats run one by one through processor → model.
GLM-4.5V (a mixture-of-experts text model behind GLM-4.1V's processor) runs on GLM-4.1V's dataset.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

import wdspack
from tests.support import vlm_harness as h
from tests.support.video_chats import one_by_one, source_folder, typed
from tests.support.video_reference import processor_job, run_jobs
from tiny_vlm import glm4v
from wdspack.errors import ConfigError
from wdspack.media.video.plan import VideoHeader, VideoSettings
from wdspack.models import save_processor
from wdspack.models.families.glm4v import GlmVideoSampling, plan_glm4v, plan_glm46v
from wdspack.packer.config import PackConfig
from wdspack.packer.job import pack_dataset
from wdspack.packer.samples import SampleConfig

pytest.importorskip("av")

SEQ_LEN = 112
#: the model class -> (its processor class, the user's video settings, the video processor's beyond VIDEO)
CLASSES = {"Glm4vForConditionalGeneration": ("Glm4vProcessor", VideoSettings(fps=4.0), {"fps": 4.0}),
           "Glm46VForConditionalGeneration": ("Glm46VProcessor", None, {})}
#: GLM-4.5V: GLM-4.1V's processor, dataset and references in front of another model
MOE, GLM41 = glm4v.MOE, "Glm4vForConditionalGeneration"
MODELS = [*CLASSES, MOE]
#: the video processor as transformers builds it from the tiny image processor's settings (the folder has no video
#: processor's): its pixel bounds, mean and std
VIDEO = {"do_sample_frames": True, "size": {"shortest_edge": 4 * 28 * 28, "longest_edge": 2 * 64 * 28 * 28},
         "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
#: id -> record, in LLaMA-Factory's mllm_demo.json (images) and mllm_video_demo.json (videos) layouts
ROWS = {
    "i-one": {"messages": [{"role": "user", "content": "<image>Who are they?"},
                           {"role": "assistant", "content": "Two players after a match."},
                           {"role": "user", "content": "What are they doing?"},
                           {"role": "assistant", "content": "Celebrating."}], "images": ["images/p.png"]},
    "i-two": {"messages": [{"role": "user", "content": "Compare <image> and <image>."},
                           {"role": "assistant", "content": "The first is wider."}],
              "images": ["images/w.png", "images/t.png"]},
    "v-one": {"messages": [{"role": "user", "content": "<video>Why is this video funny?"},
                           {"role": "assistant", "content": "The bar grows for no reason."}],
              "videos": ["clips/a.mp4"]},
    "v-short": {"messages": [{"role": "user", "content": "<video>Describe it."},
                             {"role": "assistant", "content": "A short clip."}], "videos": ["clips/b.mp4"]},
    "v-webm": {"messages": [{"role": "user", "content": "What moves in <video>?"},
                            {"role": "assistant", "content": "Colours."}], "videos": ["clips/c.webm"]},
    "text": {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]},
}


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_processors, video_reference):
    """Per model class: the session's processor, the tiny model (float64), the packed rows and the real processor's
    outputs per row (its real video processor, images by Pillow as here, in the session's reference child); GLM-4.5V's
    all but the model GLM-4.1V's."""
    root = tmp_path_factory.mktemp("glm4v")
    src = source_folder(root)
    (src / "images" / "w.png").write_bytes(h._png((90, 40), seed=5))
    (src / "images" / "t.png").write_bytes(h._png((40, 84), seed=6))
    (src / "chats.jsonl").write_text("".join(json.dumps({"id": sid, **row}) + "\n" for sid, row in ROWS.items()))
    out, jobs = {}, []
    for cls, (name, video, call) in CLASSES.items():
        processor = tiny_processors.get("glm4v", cls=name)
        folder = save_processor(processor, root / name / "processor")
        dataset = root / name / "packed"
        summary = pack_dataset([str(src / "chats.jsonl")], str(dataset),
                               sample_config=SampleConfig(processor=str(folder), video=video),
                               config=PackConfig(seq_len=SEQ_LEN, max_images=3, on_error="raise"), progress=False)
        assert summary.samples_packed == len(ROWS), summary.lines()
        model = glm4v.model(processor).double()
        assert type(model).__name__ == cls
        calls = [{"text": processor.apply_chat_template(typed(row), tokenize=False),
                  "videos": [src / v for v in row.get("videos", ())],
                  "images": [src / i for i in row["images"]] if "images" in row else None}
                 for row in ROWS.values()]
        jobs.append(processor_job(folder, name, {**VIDEO, **call}, calls))
        out[cls] = (processor, model, dataset)
    references = run_jobs(jobs)
    models = {cls: (*out[cls], dict(zip(ROWS, refs))) for cls, refs in zip(CLASSES, references)}
    processor, _, dataset, refs = models[GLM41]
    moe = glm4v.model(processor, cls=MOE).double()
    moe.set_experts_implementation("eager")  # grouped_mm, the default, has no float64 kernel; the loop, per expert
    assert type(moe).__name__ == MOE
    return {**models, MOE: (processor, moe, dataset, refs)}


@pytest.fixture(scope="module", params=list(CLASSES))
def glm(request, built):
    """Per processor class."""
    return built[request.param]


@pytest.fixture(scope="module", params=MODELS)
def glm_model(request, built):
    """Per model class (GLM-4.5V's processor and dataset GLM-4.1V's)."""
    return built[request.param]


def _sub_samples(dataset):
    """Per pack, its sub-samples' ids."""
    return h.pack_sample_ids(dataset)


def test_tokens_and_pixels_are_the_processors(glm):
    processor, _, dataset, refs = glm
    subs = h.dataset_sub_samples(dataset)
    for sid, ref in refs.items():
        assert subs[sid][0].tolist() == ref["input_ids"][0].tolist(), f"{sid}: tokens differ from the processor's"
    packs = _sub_samples(dataset)
    assert any({sid[0] for sid in p} >= {"i", "v"} for p in packs), f"a pack holds images and a video: {packs}"
    (batch,) = h.loader_batches(dataset, processor)
    order = [sid for ids in packs for sid in ids]
    for key, rows, grid, mask in (("pixel_values", "patch_mask", "image_grid_thw", "image_mask"),
                                  ("pixel_values_videos", "video_patch_mask", "video_grid_thw", "video_mask")):
        want = [refs[sid][key] for sid in order if key in refs[sid]]
        assert torch.equal(batch[key][batch[rows]], torch.from_numpy(np.concatenate(want))), key
        assert batch[grid][batch[mask]].tolist() == np.concatenate([refs[s][grid] for s in order
                                                                    if grid in refs[s]]).tolist()


def test_the_batchs_positions_and_token_types_are_the_models(glm_model):
    """Rows 1-3 of every sub-sample are the model's own ``get_rope_index`` of it alone (a video's frames split by
    their times), row 0 restarts; ``mm_token_type_ids`` are the processor's (2 inside a video)."""
    processor, model, dataset, refs = glm_model
    (batch,) = h.loader_batches(dataset, processor)
    videos = 0
    for b, ids in enumerate(_sub_samples(dataset)):
        start = 0
        for sid in ids:
            ref = {k: torch.from_numpy(v) for k, v in refs[sid].items()}
            n = ref["input_ids"].shape[1]
            rope, _ = model.model.get_rope_index(ref["input_ids"], ref["mm_token_type_ids"],
                                                 ref.get("image_grid_thw"), ref.get("video_grid_thw"))
            assert torch.equal(batch["position_ids"][1:, b, start:start + n], rope[:, 0]), sid
            assert torch.equal(batch["position_ids"][0, b, start:start + n], torch.arange(n)), sid
            assert torch.equal(batch["mm_token_type_ids"][b, start:start + n], ref["mm_token_type_ids"][0]), sid
            videos += int((ref["mm_token_type_ids"] == 2).any())
            start += n
    assert videos == 3


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_loss_and_gradients_equal_one_by_one(glm_model, attn):
    """Images, videos, and a pack with both (whose frames go to the model as images, in token order). The tower
    casts its position table to float32 for ``grid_sample``, whose backward sums every patch's part in one float32
    buffer: that gradient is the packed and one-by-one sums rounded apart (~1e-10 absolute, measured); GLM-4.5V's
    router casts the hidden states and its weight to float32, whose gradient is a float32 sum over the tokens too
    (3e-11 absolute apart on a scale of 4e-4, measured); eager's float32 softmax rounds apart as for the audio
    families (``EAGER_GRADIENTS``)."""
    processor, model, dataset, refs = glm_model
    model.set_attn_implementation(attn)
    try:
        want = one_by_one(model, dataset, refs)
        batches = h.loader_batches(dataset, processor)
        assert any(int(n) < SEQ_LEN for b in batches for n in b["num_tokens"])
        looser = h.EAGER_GRADIENTS if attn == "eager" else [("visual.embeddings.position_embedding", 1e-4, 1e-9),
                                                            ("mlp.gate.weight", 1e-4, 1e-9)]
        h.assert_same(model, h.packed(model, batches), want, looser=looser)
    finally:
        model.set_attn_implementation("sdpa")


def test_each_token_goes_to_the_same_experts_packed(built):
    """GLM-4.5V routes each token by its own hidden state (top 2 of 4 experts by a sigmoid score, no capacity, no
    token dropped): packed, every real token of a sub-sample goes to the experts it goes to alone, and the tiny
    model's tokens spread over the experts (the check can fail)."""
    processor, model, dataset, refs = built[MOE]
    gate = model.model.language_model.layers[1].mlp.gate
    seen: list[torch.Tensor] = []
    hook = gate.register_forward_hook(lambda module, args, out: seen.append(out[2].sort(dim=-1).values))
    try:
        with torch.no_grad():
            (batch,) = h.loader_batches(dataset, processor)
            model(**wdspack.model_inputs(batch, model))
            packed = seen.pop().view(*batch["input_ids"].shape, -1)
            for b, ids in enumerate(_sub_samples(dataset)):
                start = 0
                for sid in ids:
                    model(**{k: torch.from_numpy(v) for k, v in refs[sid].items()}, use_cache=False)
                    alone = seen.pop()
                    assert torch.equal(packed[b, start:start + len(alone)], alone), sid
                    start += len(alone)
    finally:
        hook.remove()
    assert len(torch.unique(packed.flatten(0, 1), dim=0)) >= 3, "the tokens go to different experts"


def test_varlen_attention_covers_text_and_tower(built):
    """``use_varlen_attention`` on padding-free batches: the text model and the vision tower (on ``cu_seqlens``, one
    call per image or frame) run the kernel, and loss and gradients equal the one-by-one SDPA path."""
    import copy

    from wdspack.models.varlen import reference_varlen_attn

    processor, model, dataset, refs = built["Glm4vForConditionalGeneration"]
    model = copy.deepcopy(model)
    want = one_by_one(model, dataset, refs)
    calls = {"vision": 0, "text": 0}

    def kernel(*args, **kwargs):
        calls["vision" if kwargs["window_size"] == (-1, -1) else "text"] += 1
        return reference_varlen_attn(*args, **kwargs)

    kernel.__name__ = "counting_reference"
    wdspack.use_varlen_attention(model, kernel=kernel)
    batches = h.loader_batches(dataset, processor, padding_free=True)
    h.assert_same(model, h.packed(model, batches), want, looser=("visual.embeddings.position_embedding", 1e-4, 1e-9))
    assert calls["vision"] > 0 and calls["text"] > 0, calls


def test_two_d_positions_are_not_exact(glm_model):
    """The checks above can fail: the text row alone as positions gives another loss."""
    processor, model, dataset, _ = glm_model
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    with torch.no_grad():
        exact = model(**kwargs).loss
        kwargs["position_ids"] = kwargs["position_ids"][0]
        flat = model(**kwargs).loss
    assert not torch.allclose(flat, exact, rtol=1e-6)


def test_show_lays_a_pack_out(built, capsys):
    from wdspack.cli import main

    _, _, dataset, _ = built["Glm46VForConditionalGeneration"]
    assert main(["show", str(dataset), "--packs", "9", "--color", "never"]) == 0
    shown = capsys.readouterr().out
    # the frames fill <|image|> tokens; show marks them by the item they belong to: the video's
    assert "<|begin_of_video|><|begin_of_image|><video×" in shown
    assert "<|end_of_image|>0.0 seconds<|begin_of_image|>" in shown
    assert "[[Celebrating.]]" in shown and "What moves in" in shown


def test_settings_without_a_counterpart_are_refused():
    """The user's settings that the classes have no counterpart for stop the job with the fix, never a plan that
    is not the processor's."""
    header = VideoHeader(frames=30, fps=10.0, width=64, height=48)
    with pytest.raises(ConfigError, match=re.escape("--video-fps 2: GLM-4.6V")):
        plan_glm46v(header, VideoSettings(fps=2.0).apply(GlmVideoSampling(fps=None)))
    with pytest.raises(ConfigError, match=re.escape("--video-max-frames 8: GLM-4.1V's video processor has no such")):
        plan_glm4v(header, VideoSettings(max_frames=8).apply(GlmVideoSampling()))
    with pytest.raises(ConfigError, match="do_sample_frames"):
        plan_glm4v(header, GlmVideoSampling.from_config({"do_sample_frames": False}, GlmVideoSampling()))
    # a long video: GLM-4.1V spreads max_duration · fps frames over it; GLM-4.6V walks at 0.5 temporal patches a second
    long = VideoHeader(frames=400 * 30, fps=30.0, width=64, height=48)
    assert len(plan_glm4v(long).indices) == 600 and plan_glm4v(long).indices[-1] == 400 * 30 - 1
    assert len(plan_glm46v(long).indices) == 400


def test_inspect_counts_what_the_packs_hold(glm, capsys):
    """``wdspack inspect --deep``: per pack its samples, tokens, images, videos, the frames the video processor
    samples (two a temporal patch) and the video's ``<|image|>`` tokens, the processor's own counts."""
    processor, _, dataset, refs = glm
    temporal = int(processor.image_processor.temporal_patch_size)
    packs = [{"tokens": sum(refs[s]["input_ids"].shape[1] for s in ids), "samples": len(ids),
              "images": sum(len(ROWS[s].get("images", ())) for s in ids),
              "videos": sum(len(ROWS[s].get("videos", ())) for s in ids),
              "frames": sum(int(refs[s]["video_grid_thw"][:, 0].sum()) * temporal for s in ids
                            if "video_grid_thw" in refs[s]),
              "video_tokens": sum(int((refs[s]["mm_token_type_ids"] == 2).sum()) for s in ids)}
             for ids in _sub_samples(dataset)]
    assert all(p["images"] and p["videos"] for p in packs), packs  # every kind in every pack: the spread tells
    h.check_inspect(dataset, packs, capsys)
