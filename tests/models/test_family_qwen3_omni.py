"""Qwen3-Omni's thinker, exactly: chats with audio, with two audios of different lengths and an image, with images
alone and text, in LLaMA-Factory's layout, packed with the real ``Qwen3OmniMoeProcessor`` and streamed: every
sub-sample's tokens are the processor's (a chat's audios counted as its one call pads them, to the longest), the
loader's audio features and pixels are its own, the batch's positions are the thinker's ``get_rope_index`` per
sub-sample, and the packed loss and gradients equal the sub-samples run one by one through processor → thinker, in
float64.

The reference feeds the processor the waveform the loader decodes (``probe_audio`` then ``decode_audio`` at 16 kHz).
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from PIL import Image

import wdspack
from tests.support import vlm_harness as h
from wdspack.media.audio.decode import decode_audio
from wdspack.media.audio.header import probe_audio
from wdspack.packer.config import PackConfig
from wdspack.packer.job import pack_dataset
from wdspack.packer.samples import SampleConfig

av = pytest.importorskip("av")

SEQ_LEN = 200

#: id -> the record, as LLaMA-Factory writes it (``mllm_audio_demo.json``), with images beside the audio
ROWS = {
    "a-one": {"messages": [{"role": "user", "content": "<audio>What is this sound?"},
                           {"role": "assistant", "content": "A steady tone."}],
              "audios": ["clips/a.wav"]},
    "a-image": {"messages": [{"role": "user", "content": "<image>Does <audio> match the picture?"},
                             {"role": "assistant", "content": "No, the picture is silent."}],
                "audios": ["clips/b.flac"], "images": ["images/p.png"]},
    # a.wav again, beside a longer clip: padded to it, its 16,001 samples keep ceil(n/160) = 101 frames (14 tokens)
    "a-two": {"messages": [{"role": "user", "content": "Compare <audio> and <audio> please."},
                           {"role": "assistant", "content": "The second is longer."},
                           {"role": "user", "content": "And this <image>?"},
                           {"role": "assistant", "content": "A picture."}],
              "audios": ["clips/a.wav", "clips/d.wav"], "images": ["images/q.png"]},
    "a-mp3": {"messages": [{"role": "user", "content": "<audio>Again?"}, {"role": "assistant", "content": "Yes."}],
              "audios": ["clips/c.mp3"]},
    "i-only": {"messages": [{"role": "user", "content": "<image>What is it?"},
                            {"role": "assistant", "content": "Colours."}],
               "images": ["images/q.png"]},
    "text": {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]},
}


def _typed(row: dict, *, linked: bool = False) -> list[dict]:
    """The record's turns as typed parts, as the reference renders them with the chat template; ``linked``: the
    audio part right after a video left out (its sound has no placeholder of its own: ``load_audio_from_video``
    lays it inside the video's)."""
    out = []
    for turn in row["messages"]:
        text = turn["content"]
        for tag in ("audio", "image", "video"):
            text = text.replace(f"<{tag}>", f"\0{tag}\0")
        parts = [{"type": p} if p in ("audio", "image", "video") else {"type": "text", "text": p}
                 for p in text.split("\0") if p]
        if linked:
            parts = [p for k, p in enumerate(parts)
                     if not (p["type"] == "audio" and k and parts[k - 1]["type"] == "video")]
        out.append({"role": turn["role"], "content": parts})
    return out


def _source(root):
    from tests.support.audio_clips import encode, tone

    src = root / "src"
    (src / "clips").mkdir(parents=True)
    (src / "images").mkdir()
    (src / "clips" / "a.wav").write_bytes(encode(tone(16_001, 16_000), 16_000, fmt="wav", codec="pcm_s16le"))
    (src / "clips" / "b.flac").write_bytes(encode(tone(50_001, 44_100, 2), 44_100, fmt="flac", codec="flac"))
    (src / "clips" / "c.mp3").write_bytes(encode(tone(22_050, 22_050), 22_050, fmt="mp3", codec="libmp3lame"))
    # 32,014 samples at 16 kHz: not a multiple of 160
    (src / "clips" / "d.wav").write_bytes(encode(tone(16_007, 8_000), 8_000, fmt="wav", codec="pcm_s16le"))
    (src / "images" / "p.png").write_bytes(h._png((60, 44), seed=3))
    (src / "images" / "q.png").write_bytes(h._png((40, 70), seed=4))
    return src


def _waveform(data: bytes) -> np.ndarray:
    probe = probe_audio(data, sample_id="ref")
    return decode_audio(data, rate=16_000, frames=probe.frames, sample_id="ref")


def _write_chats(src, rows) -> None:
    (src / "chats.jsonl").write_text("".join(json.dumps({"id": sid, **row}) + "\n" for sid, row in rows.items()))


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_processors):
    """The real processor, the tiny thinker (float64), the packed dataset and, per sample, the processor's outputs
    on the loader's waveforms and images (one call per chat)."""
    from tiny_vlm import qwen3_omni

    root = tmp_path_factory.mktemp("omni3")
    src = _source(root)
    _write_chats(src, ROWS)
    processor = tiny_processors.get("qwen3_omni")
    dataset = root / "packed"
    summary = pack_dataset([str(src / "chats.jsonl")], str(dataset), sample_config=SampleConfig(processor=processor),
                           config=PackConfig(seq_len=SEQ_LEN, max_images=3, on_error="raise"), progress=False)
    assert summary.samples_packed == len(ROWS), summary.lines()
    model = qwen3_omni.model(processor).double()
    model.set_experts_implementation("eager")  # the default grouped_mm kernel has no float64 on CPU
    refs = {}
    for sid, row in ROWS.items():
        text = processor.apply_chat_template(_typed(row), tokenize=False)
        audio = [_waveform((src / a).read_bytes()) for a in row.get("audios", [])] or None
        images = [Image.open(src / i).convert("RGB") for i in row.get("images", [])] or None
        refs[sid] = dict(processor(text=[text], audio=audio, images=images, return_tensors="pt"))
    return processor, model, dataset, refs


def test_tokens_are_the_processors(built):
    processor, _, dataset, refs = built
    subs = h.dataset_sub_samples(dataset)
    assert sorted(subs) == sorted(ROWS)
    audio_id = processor.audio_token_id
    for sid, ref in refs.items():
        assert subs[sid][0].tolist() == ref["input_ids"][0].tolist(), f"{sid}: tokens differ from the processor's"
    # the same 16,001-sample clip: 100 frames (13 tokens) alone, 101 (14) padded beside a 32,014-sample one
    assert refs["a-one"]["feature_attention_mask"].sum(-1).tolist() == [100]
    assert refs["a-two"]["feature_attention_mask"].sum(-1).tolist() == [101, 200]
    assert int((refs["a-one"]["input_ids"] == audio_id).sum()) == 13
    assert int((refs["a-two"]["input_ids"] == audio_id).sum()) == 14 + 26


def test_features_and_pixels_are_the_processors(built):
    processor, model, dataset, refs = built
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    order = [sid for ids in h.pack_sample_ids(dataset) for sid in ids]
    masks = [refs[s]["feature_attention_mask"] for s in order if "feature_attention_mask" in refs[s]]
    feats = [refs[s]["input_features"] for s in order if "input_features" in refs[s]]
    frames = max(int(m.sum(-1).max()) for m in masks)
    pad = [(0, frames - m.shape[1]) for m in masks]
    want_mask = torch.cat([torch.nn.functional.pad(m, p) for m, p in zip(masks, pad)]).to(torch.int64)
    want = torch.cat([torch.nn.functional.pad(f, p) for f, p in zip(feats, pad)]) * want_mask[:, None, :]
    assert torch.equal(kwargs["feature_attention_mask"], want_mask)
    assert torch.equal(kwargs["input_features"], want.to(kwargs["input_features"].dtype))
    pixels = [refs[s]["pixel_values"] for s in order if "pixel_values" in refs[s]]
    assert torch.equal(kwargs["pixel_values"], torch.cat(pixels).to(kwargs["pixel_values"].dtype))
    grids = [refs[s]["image_grid_thw"] for s in order if "image_grid_thw" in refs[s]]
    assert kwargs["image_grid_thw"].tolist() == torch.cat(grids).tolist()
    B = batch["input_ids"].shape[0]
    assert batch["audio_mask"].shape == (B * 3,) and batch["input_features"].shape[1] == 128


def _check_positions(model, dataset, refs, batch, *, linked=()) -> None:
    """Rows 1-3 of every sub-sample are the thinker's own ``get_rope_index`` of that sub-sample alone (``linked``:
    with ``use_audio_in_video``); row 0 restarts at 0."""
    B, L = batch["input_ids"].shape
    assert batch["position_ids"].shape == (4, B, L)
    for b, ids in enumerate(h.pack_sample_ids(dataset)):
        start = 0
        for sid in ids:
            ref = refs[sid]
            n = ref["input_ids"].shape[1]
            lengths = ref["feature_attention_mask"].sum(-1) if "feature_attention_mask" in ref else None
            rope, _ = model.model.get_rope_index(ref["input_ids"], ref.get("image_grid_thw"), ref.get("video_grid_thw"),
                                                 ref["attention_mask"], sid in linked, lengths,
                                                 ref.get("video_second_per_grid"))
            assert torch.equal(batch["position_ids"][1:, b, start:start + n], rope[:, 0]), sid
            assert torch.equal(batch["position_ids"][0, b, start:start + n], torch.arange(n).float()), sid
            start += n


def test_the_batchs_positions_are_the_thinkers(built):
    processor, model, dataset, refs = built
    (batch,) = h.loader_batches(dataset, processor)
    _check_positions(model, dataset, refs, batch)


def _one_by_one(model, dataset, refs, *, linked=()):
    subs = h.dataset_sub_samples(dataset)
    model.zero_grad()
    total, count = torch.zeros((), dtype=torch.float64), 0
    for sid, ref in refs.items():
        inputs = dict(ref)  # with its attention mask: the thinker computes its 3-D positions only then
        if sid in linked:
            inputs["use_audio_in_video"] = True
        for key in ("input_features", "pixel_values", "pixel_values_videos"):
            if key in inputs:
                inputs[key] = inputs[key].double()
        ids, mask = subs[sid][:2]
        labels = torch.where(torch.from_numpy(mask.astype(bool)), torch.from_numpy(ids), -100)[None]
        labels[0, 0] = -100
        loss = h._token_losses(model(**inputs, use_cache=False).logits, labels)
        loss.backward()
        total, count = total + loss.detach(), count + int((labels[:, 1:] != -100).sum())
    return total, count, h._gradients(model)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_loss_and_gradients_equal_one_by_one(built, attn):
    processor, model, dataset, refs = built
    model = copy.deepcopy(model)
    model.set_attn_implementation(attn)
    want = _one_by_one(model, dataset, refs)
    batches = h.loader_batches(dataset, processor)
    assert len(h.pack_sample_ids(dataset)) >= 2 and any(int(n) < SEQ_LEN for b in batches for n in b["num_tokens"])
    h.assert_same(model, h.packed(model, batches), want, looser=h.EAGER_GRADIENTS if attn == "eager" else None)



# ---- videos: the reference is the real processor with its video processor, in the torchvision child -------------

FPS = 4.0
FRAME_PIXELS = 32 * 32 * 4
VIDEO_SEQ_LEN = 320
#: a video alone; a video, an image and an audio in one chat; a video with its own sound and another audio (one pack
#: holds all three)
VIDEO_ROWS = {
    "v-only": {"messages": [{"role": "user", "content": "<video>What moves?"},
                            {"role": "assistant", "content": "A bar."}],
               "videos": ["clips/w.webm"]},
    "v-all": {"messages": [{"role": "user", "content": "<video>Listen to <audio>: does it fit <image>?"},
                           {"role": "assistant", "content": "It fits the moving bar."}],
              "videos": ["clips/v.mp4"], "audios": ["clips/a.wav"], "images": ["images/p.png"]},
    # LLaMA-Factory's <video><audio> naming the video's own file twice: its sound, merged with its frames by time;
    # a.wav beside it padded to the 3 s track (101 frames, 14 tokens), as the processor's one audio call pads it
    "v-sound": {"messages": [{"role": "user", "content": "<video><audio>What is heard? And in <audio>?"},
                             {"role": "assistant", "content": "A tone over a fading grey, then a higher one."}],
                "videos": ["clips/s.mp4"], "audios": ["clips/s.mp4", "clips/a.wav"]},
}
#: the chats whose video comes with its own sound (the reference's ``load_audio_from_video``)
LINKED = {"v-sound"}


@pytest.fixture(scope="module")
def video_built(tmp_path_factory, tiny_processors, video_reference):
    """A folder the real ``Qwen3OmniMoeProcessor`` with its ``Qwen2VLVideoProcessor`` (``tiny_vlm.qwen3_omni.VIDEO``)
    wrote with its own ``save_pretrained``; the dataset packed from it with ``--video-fps`` and
    ``--video-max-pixels``; per chat the processor's outputs with the same settings passed to its call (the
    references, in the session's child), and the processor's own of ``v-only`` with the fps alone."""
    from fractions import Fraction

    from tests.support.audio_clips import encode_video, tone
    from tests.support.video_chats import clip
    from tests.support.video_reference import processor_job, run_jobs, save_job
    from tiny_vlm import qwen3_omni
    from wdspack.media.video.plan import VideoSettings
    from wdspack.models import load_processor, save_processor

    root = tmp_path_factory.mktemp("omni3-video")
    src = _source(root)
    clip(src / "clips" / "v.mp4", codec="h264", rate=Fraction(10), frames=12, width=66, height=50)
    clip(src / "clips" / "w.webm", codec="libvpx-vp9", rate=Fraction(24), frames=8, width=64, height=36)
    # 3 s at 10 fps with its AAC sound (39 tokens); 8 frames sampled, 0.5 s a temporal patch by the processor's rule
    (src / "clips" / "s.mp4").write_bytes(encode_video(seconds=3, audio=tone(48_000 * 3, 48_000)))
    _write_chats(src, VIDEO_ROWS)
    tiny = tiny_processors.get("qwen3_omni")
    source = save_processor(tiny, root / "source")
    folder = root / "processor"
    size = {"shortest_edge": FRAME_PIXELS, "longest_edge": FRAME_PIXELS}  # --video-max-pixels, as the call takes it
    calls = []
    for sid, row in VIDEO_ROWS.items():
        waves = []
        for k, a in enumerate(row.get("audios", [])):
            waves.append(root / f"{sid}-{k}.npy")
            np.save(waves[-1], _waveform((src / a).read_bytes()))
        kwargs: dict = {"videos_kwargs": {"fps": FPS, "size": size}}
        if sid in LINKED:  # the video's sound given decoded, as the loader decodes it
            kwargs.update(load_audio_from_video=True, audio_from_video_indices=[0, None])
        calls.append({"text": tiny.apply_chat_template(_typed(row, linked=sid in LINKED), tokenize=False),
                      "videos": [src / v for v in row.get("videos", [])],
                      "images": [src / i for i in row["images"]] if "images" in row else None,
                      "audio": waves or None, "kwargs": kwargs})
    calls.append({**calls[0], "kwargs": {"videos_kwargs": {"fps": FPS}}})
    refs = run_jobs([save_job(source, "Qwen3OmniMoeProcessor", qwen3_omni.VIDEO, folder, features=qwen3_omni.FEATURES),
                     processor_job(folder, "Qwen3OmniMoeProcessor", qwen3_omni.VIDEO, calls,
                                   features=qwen3_omni.FEATURES)])[1]
    refs = [{k: torch.from_numpy(v) for k, v in ref.items()} for ref in refs]
    dataset = root / "packed"
    summary = pack_dataset([str(src / "chats.jsonl")], str(dataset),
                           sample_config=SampleConfig(processor=str(folder),
                                                      video=VideoSettings(fps=FPS, max_pixels=FRAME_PIXELS)),
                           config=PackConfig(seq_len=VIDEO_SEQ_LEN, max_images=8, on_error="raise"), progress=False)
    assert summary.samples_packed == len(VIDEO_ROWS), summary.lines()
    processor = load_processor(str(folder))
    model = qwen3_omni.model(processor).double()
    model.set_experts_implementation("eager")
    return processor, model, dataset, dict(zip(VIDEO_ROWS, refs)), (src, folder, refs[-1])


def test_video_tokens_pixels_and_positions_are_the_processors(video_built):
    processor, model, dataset, refs, _ = video_built
    subs = h.dataset_sub_samples(dataset)
    for sid, ref in refs.items():
        assert subs[sid][0].tolist() == ref["input_ids"][0].tolist(), f"{sid}: tokens differ from the processor's"
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    order = [sid for ids in h.pack_sample_ids(dataset) for sid in ids]
    for key in ("pixel_values_videos", "video_grid_thw", "video_second_per_grid", "pixel_values"):
        want = torch.cat([refs[s][key] for s in order if key in refs[s]])
        assert torch.equal(kwargs[key], want.to(kwargs[key].dtype)), key
    # 6 frames (the folder's min_frames over 4 fps) of 64 × 64, and 6 of 64 × 96 (upscaled to the min pixels)
    assert refs["v-all"]["video_grid_thw"].tolist() == [[3, 4, 4]] and refs["v-only"]["video_grid_thw"].tolist() == [
        [3, 4, 6]]
    assert refs["v-all"]["video_second_per_grid"].tolist() == [2 / FPS]
    _check_positions(model, dataset, refs, batch, linked=LINKED)


def test_video_planned_under_the_processors_own_pixel_bounds(video_built):
    """Without ``--video-max-pixels``, a video is planned as the processor's call resizes it: under its class's
    128·32² to 768·32² pixels, not the video processor's saved ``size``."""
    from wdspack.media.settings import read_settings
    from wdspack.media.video.header import read_header
    from wdspack.media.video.plan import VideoSettings
    from wdspack.models.families.qwen3_omni import QWEN3_OMNI_VIDEO as side

    processor, _, _, _, (src, folder, plain) = video_built
    settings = VideoSettings(fps=FPS).apply(side.sampling(processor, read_settings(folder, "video_processor").values))
    plan = side.plan(read_header((src / "clips" / "w.webm").read_bytes(), sample_id="w"), settings)
    assert (settings.min_pixels, settings.max_pixels, settings.min_frames) == (128 * 32 * 32, 768 * 32 * 32, 6)
    assert [list(plan.grid)] == plain["video_grid_thw"].tolist() == [[3, 18, 32]]
    assert int((plain["input_ids"] == processor.video_token_id).sum()) == plan.tokens


def test_a_processor_without_its_video_processor_plans_with_its_image_processors_patches(tiny_processors):
    """In memory without torchvision (no video processor), the video settings are the image processor's, as
    transformers builds a video processor from them: 16-pixel patches, every frame, the processor's pixel bounds."""
    from wdspack.models.families.qwen3_omni import QWEN3_OMNI_VIDEO as side

    s = side.sampling(tiny_processors.get("qwen3_omni"), None)
    assert (s.patch_size, s.do_sample_frames, s.fps, s.min_pixels, s.max_pixels) == (16, False, None, 128 * 32 * 32,
                                                                                     768 * 32 * 32)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_video_packed_loss_and_gradients_equal_one_by_one(video_built, attn):
    processor, model, dataset, refs, _ = video_built
    model = copy.deepcopy(model)
    model.set_attn_implementation(attn)
    want = _one_by_one(model, dataset, refs, linked=LINKED)
    batches = h.loader_batches(dataset, processor)
    assert len(batches) == 1 and [set(ids) for ids in h.pack_sample_ids(dataset)] == [set(VIDEO_ROWS)]
    h.assert_same(model, h.packed(model, batches), want, looser=h.EAGER_GRADIENTS if attn == "eager" else None)


def test_a_videos_own_sound_merges_with_it_by_time(video_built):
    """``<video><audio>`` naming one file: between ``<|vision_start|><|audio_start|>`` and
    ``<|audio_end|><|vision_end|>`` each temporal patch's tokens at ``13·k·s`` (s = 0.5 s: 0, 6.5, 13, 19.5), the
    audio tokens ``j`` before it where ``j`` < that time (as the processor writes it, checked token for token above);
    the track is counted with the chat's other audio (a.wav padded to it: 101 frames)."""
    import itertools

    processor, _, _, refs, _ = video_built
    ref = refs["v-sound"]
    ids = ref["input_ids"][0].tolist()
    tok = processor.tokenizer
    start, end = (tok.convert_tokens_to_ids(t) for t in ("<|audio_start|>", "<|audio_end|>"))
    first = ids.index(start)
    assert ids[first - 1] == tok.convert_tokens_to_ids("<|vision_start|>")
    assert ids[ids.index(end, first) + 1] == tok.convert_tokens_to_ids("<|vision_end|>")
    runs = [(t, len(list(g))) for t, g in itertools.groupby(ids[first + 1:ids.index(end, first)])]
    t, h_, w_ = ref["video_grid_thw"][0].tolist()
    per_patch, v, a = h_ * w_ // 4, processor.video_token_id, processor.audio_token_id
    assert ref["video_second_per_grid"].tolist() == [0.5] and t == 4
    assert runs == [(v, per_patch), (a, 7), (v, per_patch), (a, 6), (v, per_patch), (a, 7), (v, per_patch),
                    (a, 39 - 20)], runs
    assert ref["feature_attention_mask"].sum(-1).tolist() == [300, 101]
