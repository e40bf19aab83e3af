"""Video, exactly: LLaVA-OneVision chats with videos (and an image and a video in one sample), packed from
LLaMA-Factory's and LLaVA-Video's layouts, streamed and trained: every sub-sample's tokens are the real
``LlavaOnevisionProcessor``'s (with its real ``LlavaOnevisionVideoProcessor``), the loader's
``pixel_values_videos`` are its pixels bit for bit, and the packed loss and gradients equal the
sub-samples run one by one through processor → model, in float64.

Tiles of 24 px with 8 px patches: 3 × 3 features per frame, pooled to 2 × 2 (the ``ceil`` of the
model's ``apply_pooling``), so a video of ``n`` frames takes ``4n + 1`` ``<video>`` tokens. The
reference runs in one child process (``tests/support/video_reference.py``): it needs torchvision.
"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
import torch

import wdspack
from tests.support import vlm_harness as h
from tests.support.video_chats import ROWS, clip, one_by_one, source_folder, typed
from tests.support.video_reference import processor_job, run_jobs
from wdspack.errors import ConfigError, SampleError
from wdspack.loader.batch.model import ModelBatcher
from wdspack.media.video.plan import VideoSettings, read_header
from wdspack.media.video.prepare import plan_record
from wdspack.models import save_processor
from wdspack.models.families.llava import LLAVA_ONEVISION
from wdspack.packer.config import PackConfig
from wdspack.packer.job import pack_dataset
from wdspack.packer.samples import SampleConfig

av = pytest.importorskip("av")

SEQ_LEN = 112
FRAMES = 4
TILE = 24
#: two videos in one sample: the model's one [videos, frames, 3, S, S] tensor holds both
TWO = {"v-two": {"messages": [{"role": "user", "content": "<video><video>Which one is longer?"},
                              {"role": "assistant", "content": "The first."}],
                 "videos": ["clips/a.mp4", "clips/b.mp4"]}}


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_processors, video_reference):
    """Processor (the session's), tiny model (float64), packed dataset, the clips' folder, and per sample the
    reference outputs (from the session's reference child)."""
    from tiny_vlm import llava

    root = tmp_path_factory.mktemp("video-onevision")
    processor = tiny_processors.get("llava", kind="llava_onevision", tile=TILE)
    src = source_folder(root)
    clip(src / "clips" / "short.mp4", codec="h264", rate=Fraction(10), frames=3, width=32, height=32)
    rows = {**ROWS, **TWO}
    (src / "chats.jsonl").write_text("".join(json.dumps({"id": sid, **row}) + "\n" for sid, row in rows.items()))
    folder = save_processor(processor, root / "processor")
    dataset = root / "packed"
    summary = pack_dataset([str(src / "chats.jsonl")], str(dataset),
                           sample_config=SampleConfig(processor=str(folder), video=VideoSettings(num_frames=FRAMES)),
                           config=PackConfig(seq_len=SEQ_LEN, max_images=3, on_error="raise"), progress=False)
    assert summary.samples_packed == len(rows), summary.lines()
    calls = []
    for row in rows.values():
        videos = row.get("videos") or ([row["video"]] if "video" in row else [])
        calls.append({"text": processor.apply_chat_template(typed(row), tokenize=False),
                      "videos": [src / v for v in videos],
                      "images": [src / i for i in row["images"]] if "images" in row else None})
    settings = {"do_sample_frames": True, "num_frames": FRAMES, "size": {"height": TILE, "width": TILE}}
    (refs,) = run_jobs([processor_job(folder, "LlavaOnevisionProcessor", settings, calls)])
    model = llava.model(processor).double()
    return processor, model, dataset, src, dict(zip(rows, refs))


def test_tokens_and_pixels_are_the_processors(built):
    processor, model, dataset, _, refs = built
    subs = h.dataset_sub_samples(dataset)
    video_id = processor.video_token_id
    for sid, ref in refs.items():
        assert subs[sid][0].tolist() == ref["input_ids"][0].tolist(), f"{sid}: tokens differ from the processor's"
    assert int((subs["v-two"][0] == video_id).sum()) == 2 * (FRAMES * 4 + 1)  # n · pooled² + 1 per video
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    order = [sid for ids in h.pack_sample_ids(dataset) for sid in ids]
    want = torch.cat([torch.from_numpy(refs[sid]["pixel_values_videos"]).reshape(-1, FRAMES, 3, TILE, TILE)
                      for sid in order if "pixel_values_videos" in refs[sid]])
    assert want.shape[0] == 6 and torch.equal(kwargs["pixel_values_videos"], want)
    image = torch.from_numpy(refs["v-mixed"]["pixel_values"])  # its tiles, then the slot's zero padding
    assert torch.equal(kwargs["pixel_values"][:, : image.shape[1]], image)
    assert not kwargs["pixel_values"][:, image.shape[1]:].any()
    assert kwargs["image_sizes"].tolist() == refs["v-mixed"]["image_sizes"].tolist()


def test_packed_loss_and_gradients_equal_one_by_one(built):
    processor, model, dataset, _, refs = built
    want = one_by_one(model, dataset, refs)
    batches = h.loader_batches(dataset, processor)
    assert len(h.pack_sample_ids(dataset)) >= 2 and any(int(n) < SEQ_LEN for b in batches for n in b["num_tokens"])
    h.assert_same(model, h.packed(model, batches), want)


def test_short_videos_are_dropped_and_fps_refused(built):
    processor, _, _, src, _ = built
    side = LLAVA_ONEVISION.video
    assert side is not None
    base = side.sampling(processor, None)
    short = read_header((src / "clips" / "short.mp4").read_bytes())
    with pytest.raises(SampleError) as e:  # the processor raises for num_frames > total_num_frames too
        side.plan(short, VideoSettings(num_frames=FRAMES).apply(base))
    assert e.value.reason == "video_too_short" and "3 frames < the 4 frames" in str(e.value)
    for settings in (VideoSettings(fps=2.0), VideoSettings(), VideoSettings(num_frames=2, max_pixels=4096)):
        with pytest.raises(ConfigError, match="--video-num-frames") as refused:
            side.plan(short, settings.apply(base))
        assert "\n" not in str(refused.value)
    assert side.plan(short, VideoSettings(num_frames=3).apply(base)).indices == (0, 1, 2)


def test_a_pack_without_videos_pads_to_the_same_shapes(built):
    """A pack with no video (after one with two) still fills its frame rows and slots: the batch's keys have
    static shapes, and ``model_inputs`` takes only the real frames, as ``[videos, frames, 3, S, S]``."""
    processor, _, _, src, _ = built
    batcher = ModelBatcher(processor, seq_len=SEQ_LEN, max_images=3, max_video_tokens=2 * (FRAMES * 4 + 1))
    side = LLAVA_ONEVISION.video
    assert side is not None
    plan = plan_record(side.plan(read_header((src / "clips" / "a.mp4").read_bytes()),
                                 VideoSettings(num_frames=FRAMES).apply(side.sampling(processor, None))))
    data = (src / "clips" / "a.mp4").read_bytes()
    two = side.pad(side.pixels(processor, [data, data], [plan, plan]), processor, batcher.budgets, [17, 17])
    none = side.pad(side.pixels(processor, [], []), processor, batcher.budgets, [])
    batch, _ = batcher.collate({}, [(two, {}), (none, {})])
    assert batch["pixel_values_videos"].shape == (2 * 2 * FRAMES, 3, TILE, TILE)
    assert batch["video_frame_mask"].tolist() == [True] * 2 * FRAMES + [False] * 2 * FRAMES
    assert batch["video_mask"].tolist() == [True, True, False, False, False, False]
    assert batch["video_frames"].tolist() == [FRAMES, FRAMES, 0, 0, 0, 0]
    assert not batch["pixel_values_videos"][2 * FRAMES:].any()
    videos = LLAVA_ONEVISION.model_kwargs({**batch, "input_ids": None, "position_ids": None,
                                           "image_mask": torch.zeros(6, dtype=torch.bool)}, None)
    assert videos["pixel_values_videos"].shape == (2, FRAMES, 3, TILE, TILE)
    assert torch.equal(videos["pixel_values_videos"][0], videos["pixel_values_videos"][1])


def test_a_video_only_dataset_has_no_image_slots(built):
    """A dataset of videos alone (its manifest: no image, so no image tokens a pack) pads no ``pixel_values``
    slots of zeros beside its frames; a dataset with images keeps its ``max_images`` slots."""
    processor, _, _, _, _ = built
    for image_tokens, slots in ((0, 0), (40, 3)):
        batcher = ModelBatcher(processor, seq_len=SEQ_LEN, max_images=3, max_image_tokens=image_tokens,
                               max_video_tokens=2 * (FRAMES * 4 + 1))
        pixels = LLAVA_ONEVISION.image.pad({}, processor, batcher.budgets, ())
        batch, _ = batcher.collate({}, [(pixels, {})])
        assert batch["pixel_values"].shape[0] == slots, image_tokens
