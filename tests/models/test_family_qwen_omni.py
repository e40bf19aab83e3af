"""Qwen2.5-Omni's thinker, exactly: chats with audio, with audio and images, with images alone and text, in
LLaMA-Factory's layout (``audios``, ``images``, ``<audio>``/``<image>`` in the text), packed with the real
``Qwen2_5OmniProcessor`` and streamed: every sub-sample's tokens are the processor's, the loader's audio features
and pixels are its own, the batch's positions are the thinker's ``get_rope_index`` per sub-sample, and the packed
loss and gradients equal the sub-samples run one by one through processor → thinker, in float64.

The reference feeds the processor the waveform the loader decodes (``decode_audio`` at 16 kHz to the probed
sample count, as ``load_audio`` pads or trims a resampled file).
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
from wdspack.packer.config import PackConfig, RunOptions
from wdspack.packer.job import pack_dataset
from wdspack.packer.samples import SampleConfig

av = pytest.importorskip("av")

SEQ_LEN = 200
CHUNK_SECONDS = 4  # the feature extractor's window (the published 300 s: 30,000 frames an audio, slow on CPU)

#: id -> the record, as LLaMA-Factory writes it (``mllm_audio_demo.json``), with images beside the audio
ROWS = {
    "a-one": {"messages": [{"role": "user", "content": "<audio>What is this sound?"},
                           {"role": "assistant", "content": "A steady tone."}],
              "audios": ["clips/a.wav"]},
    "a-image": {"messages": [{"role": "user", "content": "<image>Does <audio> match the picture?"},
                             {"role": "assistant", "content": "No, the picture is silent."}],
                "audios": ["clips/b.flac"], "images": ["images/p.png"]},
    "a-two": {"messages": [{"role": "user", "content": "Compare <audio> and <audio> please."},
                           {"role": "assistant", "content": "The second is longer."},
                           {"role": "user", "content": "And this <image>?"},
                           {"role": "assistant", "content": "A picture."}],
              "audios": ["clips/c.mp3", "clips/d.wav"], "images": ["images/q.png"]},
    "i-only": {"messages": [{"role": "user", "content": "<image>What is it?"},
                            {"role": "assistant", "content": "Colours."}],
               "images": ["images/q.png"]},
    "text": {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]},
}


def _typed(row: dict) -> list[dict]:
    """The record's turns as typed parts, as the reference renders them with the chat template."""
    out = []
    for turn in row["messages"]:
        parts = []
        for piece in turn["content"].replace("<audio>", "\0audio\0").replace("<image>", "\0image\0").split("\0"):
            if piece in ("audio", "image"):
                parts.append({"type": piece})
            elif piece:
                parts.append({"type": "text", "text": piece})
        out.append({"role": turn["role"], "content": parts})
    return out


def _source(root):
    from tests.support.audio_clips import encode, tone

    src = root / "src"
    (src / "clips").mkdir(parents=True)
    (src / "images").mkdir()
    (src / "clips" / "a.wav").write_bytes(encode(tone(16_001, 16_000), 16_000, fmt="wav", codec="pcm_s16le"))
    (src / "clips" / "b.flac").write_bytes(encode(tone(30_001, 44_100, 2), 44_100, fmt="flac", codec="flac"))
    (src / "clips" / "c.mp3").write_bytes(encode(tone(22_050, 22_050), 22_050, fmt="mp3", codec="libmp3lame"))
    # past the window: the processor cuts it at CHUNK_SECONDS
    (src / "clips" / "d.wav").write_bytes(encode(tone(8_000 * 9 + 7, 8_000), 8_000, fmt="wav", codec="pcm_s16le"))
    (src / "images" / "p.png").write_bytes(h._png((60, 44), seed=3))
    (src / "images" / "q.png").write_bytes(h._png((40, 70), seed=4))
    return src


def _waveform(data: bytes) -> np.ndarray:
    probe = probe_audio(data, sample_id="ref")
    return decode_audio(data, rate=16_000, frames=probe.frames, sample_id="ref")


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_processors):
    """The real processor, the tiny thinker (float64), the packed dataset and, per sample, the processor's outputs
    on the loader's waveforms and images."""
    from tiny_vlm import qwen2_5_omni

    root = tmp_path_factory.mktemp("omni")
    src = _source(root)
    (src / "chats.jsonl").write_text("".join(json.dumps({"id": sid, **row}) + "\n" for sid, row in ROWS.items()))
    processor = tiny_processors.get("qwen2_5_omni", chunk_length=CHUNK_SECONDS)
    dataset = root / "packed"
    summary = pack_dataset([str(src / "chats.jsonl")], str(dataset), sample_config=SampleConfig(processor=processor),
                           config=PackConfig(seq_len=SEQ_LEN, max_images=3, on_error="raise"), progress=False)
    assert summary.samples_packed == len(ROWS), summary.lines()
    model = qwen2_5_omni.model(processor).double()
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
        ids = subs[sid][0]
        assert ids.tolist() == ref["input_ids"][0].tolist(), f"{sid}: tokens differ from the processor's"
        assert int((ids == audio_id).sum()) == sum(
            ((int(n) - 1) // 2 + 1 - 2) // 2 + 1 for n in ref.get("feature_attention_mask", torch.zeros(0, 1)).sum(-1))
    # the clip past the window is cut there: CHUNK_SECONDS × 25 tokens
    assert int((refs["a-two"]["input_ids"] == audio_id).sum()) == 25 + CHUNK_SECONDS * 25


def test_features_and_pixels_are_the_processors(built):
    processor, model, dataset, refs = built
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    order = [sid for ids in h.pack_sample_ids(dataset) for sid in ids]
    masks = [refs[s]["feature_attention_mask"] for s in order if "feature_attention_mask" in refs[s]]
    feats = [refs[s]["input_features"] for s in order if "input_features" in refs[s]]
    frames = max(int(m.sum(-1).max()) for m in masks)
    want_mask = torch.cat([m[:, :frames] for m in masks]).to(torch.int64)
    want = torch.cat([f[:, :, :frames] for f in feats]) * want_mask[:, None, :]
    assert torch.equal(kwargs["feature_attention_mask"], want_mask)
    assert torch.equal(kwargs["input_features"], want.to(kwargs["input_features"].dtype))
    pixels = [refs[s]["pixel_values"] for s in order if "pixel_values" in refs[s]]
    assert torch.equal(kwargs["pixel_values"], torch.cat(pixels).to(kwargs["pixel_values"].dtype))
    grids = [refs[s]["image_grid_thw"] for s in order if "image_grid_thw" in refs[s]]
    assert kwargs["image_grid_thw"].tolist() == torch.cat(grids).tolist()
    B = batch["input_ids"].shape[0]
    assert batch["audio_mask"].shape == (B * 3,) and batch["input_features"].shape[1] == 128


def test_the_batchs_positions_are_the_thinkers(built):
    """Rows 1-3 of every sub-sample are the thinker's own ``get_rope_index`` of that sub-sample alone (with its
    audio's feature lengths); row 0 restarts at 0."""
    _, model, dataset, refs = built
    (batch,) = h.loader_batches(dataset, built[0])
    B, L = batch["input_ids"].shape
    assert batch["position_ids"].shape == (4, B, L)
    for b, ids in enumerate(h.pack_sample_ids(dataset)):
        start = 0
        for sid in ids:
            ref = refs[sid]
            n = ref["input_ids"].shape[1]
            lengths = ref["feature_attention_mask"].sum(-1) if "feature_attention_mask" in ref else None
            rope, _ = model.model.get_rope_index(ref["input_ids"], ref.get("image_grid_thw"), None,
                                                 ref["attention_mask"], False, lengths, None)
            assert torch.equal(batch["position_ids"][1:, b, start:start + n], rope[:, 0]), sid
            assert torch.equal(batch["position_ids"][0, b, start:start + n], torch.arange(n)), sid
            start += n


def _one_by_one(model, dataset, refs, *, linked=()):
    subs = h.dataset_sub_samples(dataset)
    model.zero_grad()
    total, count = torch.zeros((), dtype=torch.float64), 0
    for sid, ref in refs.items():
        inputs = dict(ref)  # with its attention mask: the thinker computes its 3-D positions only then
        if sid in linked:
            inputs["use_audio_in_video"] = True
        if "input_features" in inputs:
            inputs["input_features"] = inputs["input_features"].double()
        for key in ("pixel_values", "pixel_values_videos"):
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
FRAME_PIXELS = 28 * 28 * 4
VIDEO_ROWS = {
    "v-audio": {"messages": [{"role": "user", "content": "<video>Listen to <audio>: does it fit?"},
                             {"role": "assistant", "content": "It fits the moving bar."}],
                "videos": ["clips/v.mp4"], "audios": ["clips/a.wav"]},
    "v-only": {"messages": [{"role": "user", "content": "<video>What moves?"},
                            {"role": "assistant", "content": "A bar."}],
               "videos": ["clips/w.webm"]},
    "a-image": ROWS["a-image"],
    "text": ROWS["text"],
    # LLaMA-Factory's <video><audio> naming the video's own file twice: its sound, interleaved with its frames
    "v-sound": {"messages": [{"role": "user", "content": "<video><audio>What is heard?"},
                             {"role": "assistant", "content": "A tone over a fading grey."}],
                "videos": ["clips/s.mp4"], "audios": ["clips/s.mp4"]},
}
#: the chats whose video comes with its own sound (the reference's ``load_audio_from_video``)
LINKED = {"v-sound"}
#: the processor's setting (LLaMA-Factory's ``use_audio_in_video``): each video's next <audio> is its sound, here
#: a separate file (LLaMA-Factory's demo lists ``4.mp4`` and ``4.mp3``); a video without one, or a chat mixing
#: a linked video with a plain one, is dropped
SETTING_ROWS = {
    "set-sound": {"messages": [{"role": "user", "content": "Watch <video> and hear <audio>. What is it?"},
                               {"role": "assistant", "content": "A tone."}],
                  "videos": ["clips/s.mp4"], "audios": ["clips/a.wav"]},
    "set-no-audio": {"messages": [{"role": "user", "content": "<video>What moves? <audio>"},
                                  {"role": "user", "content": "<video>And here?"},
                                  {"role": "assistant", "content": "A bar."}],
                     "videos": ["clips/s.mp4", "clips/w.webm"], "audios": ["clips/a.wav"]},
}


def _typed_video(row: dict, *, linked: bool = False) -> list[dict]:
    """The record's typed turns; ``linked``: each video's next audio part left out (its sound has no placeholder
    in the processor's text: ``load_audio_from_video`` lays it inside the video's)."""
    out = []
    for turn in row["messages"]:
        parts = []
        text = turn["content"]
        for tag in ("audio", "image", "video"):
            text = text.replace(f"<{tag}>", f"\0{tag}\0")
        for piece in text.split("\0"):
            if piece in ("audio", "image", "video"):
                parts.append({"type": piece})
            elif piece:
                parts.append({"type": "text", "text": piece})
        if linked:
            parts = [p for k, p in enumerate(parts)
                     if not (p["type"] == "audio" and any(q["type"] == "video" for q in parts[:k]))]
        out.append({"role": turn["role"], "content": parts})
    return out


@pytest.fixture(scope="module")
def video_built(tmp_path_factory, tiny_processors, video_reference):
    from fractions import Fraction

    from tests.support.audio_clips import encode_video, tone
    from tests.support.video_chats import clip
    from tests.support.video_reference import processor_job, run_jobs
    from tiny_vlm import qwen2_5_omni
    from wdspack.media.video.plan import VideoSettings
    from wdspack.models import save_processor

    root = tmp_path_factory.mktemp("omni-video")
    src = _source(root)
    clip(src / "clips" / "v.mp4", codec="h264", rate=Fraction(10), frames=12, width=66, height=50)
    clip(src / "clips" / "w.webm", codec="libvpx-vp9", rate=Fraction(24), frames=8, width=64, height=36)
    # 3 s at 10 fps with its AAC sound: two 2-second chunks of frames and of audio tokens
    (src / "clips" / "s.mp4").write_bytes(encode_video(seconds=3, audio=tone(48_000 * 3, 48_000)))
    (src / "chats.jsonl").write_text("".join(json.dumps({"id": s, **r}) + "\n" for s, r in VIDEO_ROWS.items()))
    (src / "setting.jsonl").write_text("".join(json.dumps({"id": s, **r}) + "\n" for s, r in SETTING_ROWS.items()))
    processor = tiny_processors.get("qwen2_5_omni", chunk_length=CHUNK_SECONDS)
    folder = save_processor(processor, root / "processor")
    dataset = root / "packed"
    summary = pack_dataset([str(src / "chats.jsonl")], str(dataset),
                           sample_config=SampleConfig(processor=processor,
                                                      video=VideoSettings(fps=FPS, max_pixels=FRAME_PIXELS)),
                           config=PackConfig(seq_len=SEQ_LEN, max_images=3, on_error="raise"), progress=False)
    assert summary.samples_packed == len(VIDEO_ROWS), summary.lines()
    setting = copy.copy(processor)
    setting.use_audio_in_video = True  # as LLaMA-Factory sets it on the processor
    setting_summary = pack_dataset([str(src / "setting.jsonl")], str(root / "setting"),
                                   sample_config=SampleConfig(processor=setting,
                                                              video=VideoSettings(fps=FPS, max_pixels=FRAME_PIXELS)),
                                   config=PackConfig(seq_len=SEQ_LEN, max_images=3, on_error="skip",
                                                     run=RunOptions(max_drop_fraction=1)),
                                   progress=False)
    least = min(FRAME_PIXELS, int(processor.image_processor.size["shortest_edge"]))
    size = {"shortest_edge": least, "longest_edge": FRAME_PIXELS}
    # passed to the processor's call: its class's own video defaults (128·28² to 768·28² pixels) go over the
    # video processor's settings otherwise
    settings = {"do_sample_frames": True, "fps": FPS, "size": size}
    calls = []
    rows = {**VIDEO_ROWS, "set-sound": SETTING_ROWS["set-sound"]}
    for sid, row in rows.items():
        waves = []
        for k, a in enumerate(row.get("audios", [])):
            path = root / f"{sid}-{k}.npy"
            np.save(path, _waveform((src / a).read_bytes()))
            waves.append(path)
        kwargs: dict = {"videos_kwargs": {"fps": FPS, "size": size}}
        if sid in LINKED or sid in SETTING_ROWS:  # the video's sound given decoded, as the loader decodes it
            kwargs.update(load_audio_from_video=True, audio_from_video_indices=[0])
        typed = _typed_video(row, linked="load_audio_from_video" in kwargs)
        calls.append({"text": processor.apply_chat_template(typed, tokenize=False),
                      "videos": [src / v for v in row.get("videos", [])],
                      "images": [src / i for i in row["images"]] if "images" in row else None,
                      "audio": waves or None, "kwargs": kwargs})
    # no video settings in the call: the processor class's own sizes (128·28² to 768·28²) over its video processor's
    calls.append({"text": processor.apply_chat_template(_typed_video(VIDEO_ROWS["v-only"]), tokenize=False),
                  "videos": [src / "clips" / "w.webm"], "images": None, "audio": None, "kwargs": {}})
    features = {"feature_size": 128, "chunk_length": CHUNK_SECONDS, "return_attention_mask": True}
    (refs,) = run_jobs([processor_job(folder, "Qwen2_5OmniProcessor", settings, calls, features=features)])
    model = qwen2_5_omni.model(processor).double()
    refs = [{k: torch.from_numpy(v) for k, v in ref.items()} for ref in refs]
    extra = {"setting": (root / "setting", setting_summary, refs[len(VIDEO_ROWS)]), "defaults": (settings, refs[-1]),
             "src": src}
    return processor, model, dataset, dict(zip(VIDEO_ROWS, refs)), extra


def test_video_tokens_pixels_and_positions_are_the_processors(video_built):
    processor, model, dataset, refs, _ = video_built
    subs = h.dataset_sub_samples(dataset)
    for sid, ref in refs.items():
        assert subs[sid][0].tolist() == ref["input_ids"][0].tolist(), f"{sid}: tokens differ from the processor's"
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    order = [sid for ids in h.pack_sample_ids(dataset) for sid in ids]
    want = [refs[s]["pixel_values_videos"] for s in order if "pixel_values_videos" in refs[s]]
    assert torch.equal(kwargs["pixel_values_videos"], torch.cat(want))
    assert kwargs["video_second_per_grid"].tolist() == [
        float(x) for s in order if "video_second_per_grid" in refs[s] for x in refs[s]["video_second_per_grid"]]
    for b, ids in enumerate(h.pack_sample_ids(dataset)):
        start = 0
        for sid in ids:
            ref = refs[sid]
            n = ref["input_ids"].shape[1]
            lengths = ref["feature_attention_mask"].sum(-1) if "feature_attention_mask" in ref else None
            rope, _ = model.model.get_rope_index(ref["input_ids"], ref.get("image_grid_thw"), ref.get("video_grid_thw"),
                                                 ref["attention_mask"], sid in LINKED, lengths,
                                                 ref.get("video_second_per_grid"))
            assert torch.equal(batch["position_ids"][1:, b, start:start + n], rope[:, 0]), sid
            start += n


def test_video_packed_loss_and_gradients_equal_one_by_one(video_built):
    processor, model, dataset, refs, _ = video_built
    model = copy.deepcopy(model)
    want = _one_by_one(model, dataset, refs, linked=LINKED)
    h.assert_same(model, h.packed(model, h.loader_batches(dataset, processor)), want)


def test_a_videos_own_sound_interleaves_with_it(video_built):
    """``<video><audio>`` naming one file: the audio's tokens lie inside the video's, chunk by chunk of 2 s, as the
    processor's ``load_audio_from_video`` lays them (checked token for token above); its plan names its video, and
    the other chats' shards hold no such key."""
    processor, _, dataset, refs, _ = video_built
    ids = refs["v-sound"]["input_ids"][0].tolist()
    tok = processor.tokenizer
    v, a = processor.video_token_id, processor.audio_token_id
    start = ids.index(tok.convert_tokens_to_ids("<|audio_bos|>"))
    assert ids[start - 1] == tok.convert_tokens_to_ids("<|vision_bos|>")
    region = ids[start + 1:ids.index(tok.convert_tokens_to_ids("<|audio_eos|>"))]
    runs = [(t, len(list(g))) for t, g in __import__("itertools").groupby(region)]
    assert [t for t, _ in runs] == [v, a, v, a] and runs[1][1] == 50, runs  # 2 s of audio: 50 tokens
    plans = {sid: p for sid, p in _audio_plans(dataset).items()}
    assert plans["v-sound"] == [0] and plans["v-audio"] == [None] and plans["a-image"] == [None]


def _audio_plans(dataset) -> dict[str, list]:
    """Each sub-sample's audio plans' ``video`` (None where the stored plan has no such key)."""
    import tarfile

    import msgpack

    out: dict[str, list] = {}
    for shard in sorted(dataset.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                pack = msgpack.unpackb(tar.extractfile(member).read())
                for sid in pack["sample_ids"]:
                    out.setdefault(sid, [])
                for owner, plan in zip(pack.get("audio_sample", []), pack.get("audio_plans", [])):
                    out[pack["sample_ids"][owner]].append(plan.get("video"))
    return out


def test_the_processors_setting_links_each_videos_next_audio(video_built):
    """With the processor's ``use_audio_in_video`` (LLaMA-Factory's setting), a separate sound file after the video
    is its sound: the processor's tokens; a chat where a video has none, or mixes, is dropped naming it."""
    _, _, _, _, extra = video_built
    folder, summary, ref = extra["setting"]
    subs = h.dataset_sub_samples(folder)
    assert subs["set-sound"][0].tolist() == ref["input_ids"][0].tolist()
    assert _audio_plans(folder)["set-sound"] == [0]
    assert summary.samples_packed == 1 and set(summary.dropped_by_reason) == {"placeholder_mismatch"}, summary.lines()


def test_the_plan_takes_the_processor_classs_video_sizes(video_built):
    """No ``--video-*`` settings: ``Qwen2_5OmniProcessor.videos_kwargs``' sizes win over the video processor's saved
    ones, as the processor's call merges them (the reference called with no video settings)."""
    from wdspack.media.video.header import read_header
    from wdspack.models.families.qwen_omni import QWEN2_5_OMNI

    processor, _, _, _, extra = video_built
    settings, ref = extra["defaults"]
    side = QWEN2_5_OMNI.video
    plan = side.plan(read_header((extra["src"] / "clips" / "w.webm").read_bytes(), sample_id="w"),
                     side.sampling(processor, settings))
    assert settings["size"]["longest_edge"] < plan.height * plan.width  # the saved size would have given fewer
    assert list(plan.grid) == ref["video_grid_thw"][0].tolist()
    assert plan.tokens == int((ref["input_ids"] == processor.video_token_id).sum())


def test_a_chat_mixing_a_video_with_its_sound_and_one_without_is_dropped(video_built):
    """The thinker lays one chat's videos out all with their sound or all without: such a chat is dropped naming
    why; a different file after ``<video>`` stays an audio of its own without the processor's setting."""
    from wdspack.errors import SampleError
    from wdspack.media.video.plan import VideoSettings
    from wdspack.packer.samples import SampleBuilder
    from wdspack.packer.sources.records import build_record

    processor, _, _, _, extra = video_built
    builder = SampleBuilder(SampleConfig(processor=processor, video=VideoSettings(fps=FPS, max_pixels=FRAME_PIXELS)))
    row = {"messages": [{"role": "user", "content": "<video><audio>Then <video>?"},
                        {"role": "assistant", "content": "Two clips."}],
           "videos": ["clips/s.mp4", "clips/w.webm"], "audios": ["clips/s.mp4"]}
    with pytest.raises(SampleError, match="1 of the chat's 2 videos come with their own sound") as e:
        builder.build(build_record(row, sample_id="mixed", image_root=str(extra["src"])))
    assert e.value.reason == "unsupported_media"
    row = {**row, "videos": ["clips/s.mp4"], "audios": ["clips/a.wav"],
           "messages": [{"role": "user", "content": "<video><audio>?"}, {"role": "assistant", "content": "A tone."}]}
    sample = builder.build(build_record(row, sample_id="apart", image_root=str(extra["src"])))
    assert sample.media["audio"].plans[0].video is None and int((sample.input_ids == processor.audio_token_id).sum())
