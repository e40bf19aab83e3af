"""Gemma 4, exactly: the real ``Gemma4Processor`` (saved with its own ``save_pretrained`` and packed from that folder)
and ``Gemma4ForConditionalGeneration`` (tiny, random), on images, audio and both in one chat; and on videos, alone
and beside an image and an audio in one chat, against the processor with its real ``Gemma4VideoProcessor`` (it needs
torchvision: built, saved and run in the video reference's child, ``tests/support/video_reference.py``).

The packs carry ``attention_mask`` = ``{"full_attention", "sliding_attention"}`` built by the family: Gemma 4's own
mask path reads packed sequences from the positions, and its sliding layers let each image's soft tokens see each
other (``use_bidirectional_attention="vision"``), which a causal block mask does not express.

Float64 caveats: the audio tower cannot run in float64 (its attention casts q/k/v to float32 and a float64
``per_dim_scale`` breaks the product), so it and its embedder stay float32 here, and its outputs change with the
frame count at float32 rounding (~1e-7); ``Gemma4RMSNorm`` and the vision pooler compute in float32 too. The mean
loss agrees at float64 tolerance (1e-9; measured ~2e-11), each gradient within a few millionths of its own largest
entry (:data:`GRAD_SHARE`: float32 rounding, amplified in the audio attention's tiny gradients).
"""

from __future__ import annotations

import io
import json
import re
from fractions import Fraction

import numpy as np
import pytest
import torch
from PIL import Image

import wdspack
from tests.support import audio_clips
from tests.support import vlm_harness as h
from tests.support.video_chats import clip
from wdspack.errors import ConfigError, SampleError
from wdspack.media.audio.decode import decode_audio
from wdspack.media.audio.header import probe_audio
from wdspack.media.video.plan import VideoHeader, VideoSettings
from wdspack.models.families.gemma4 import GEMMA4, Gemma4VideoSampling, packed_masks
from wdspack.models.family import Budgets

pytest.importorskip("av")

SEQ_LEN = 256
#: Of each gradient's largest entry (module docstring): float32 RMSNorm and vision pooler; the float32 audio tower,
#: whose attention gradients are small (~1e-6 of the others) and so carry more of the rounding (measured: at most
#: 5e-6 elsewhere, in the vision tower's query projection; 7e-6 in the audio tower).
GRAD_SHARE = {"": 1e-5, "model.audio_tower.": 3e-5}
#: The audio tower's share in the video chats' check: one short audio there, whose attention gradients are small
#: (~1e-8), carries more of the float32 rounding (measured: 5.8e-5 in its second layer's per_dim_scale, 5.5e-5 in
#: its k_proj; every text and vision parameter within 4e-7, the loss within 1e-9).
VIDEO_AUDIO_SHARE = 1e-4
#: Audio chats: (id, turns, image sizes (width, height), audios (format, codec, rate, samples)); "<audio>" in a user
#: text marks where an audio goes (after the images' "<image>", as in the harness's chats).
AUDIO_CHATS = (
    ("audio-only", (("user", "Listen: <audio> What is it?"), ("assistant", "A steady tone.")), (),
     (("wav", "pcm_s16le", 16_000, 20_000),)),
    ("image-and-audio", (("user", "<image>Look, then listen <audio>"), ("assistant", "A picture and a tone."),
                         ("user", "Which came first?"), ("assistant", "The picture.")), ((64, 48),),
     (("flac", "flac", 44_100, 30_000),)),
    ("two-audios", (("user", "Compare <audio> with <audio> please."), ("assistant", "The second is shorter.")), (),
     (("wav", "pcm_s16le", 22_050, 30_000), ("wav", "pcm_s16le", 16_000, 4_001))),
)
CHATS = h.CHATS + AUDIO_CHATS
#: Video chats: as the audio chats, with the clips of :data:`CLIPS` they hold ("<video>" marks where each goes).
VIDEO_CHATS = (
    ("video-only", (("user", "<video>What happens?"), ("assistant", "A white bar grows over noise.")), (), (),
     ("slow.mp4",)),
    ("video-image-audio", (("user", "<image>Look, <video> watch, then listen <audio>"),
                           ("assistant", "A picture, a clip and a tone.")), ((64, 48),),
     (("wav", "pcm_s16le", 16_000, 19_968),), ("wide.webm",)),
    h.CHATS[4],  # text alone
)
#: (The audio: 156 × 128 samples, whose 124 mel frames fill its slot of 4 · 31 frames exactly, so the float32 audio
#: tower sees the processor's input as it is; :data:`AUDIO_CHATS` cover padded slots.)
#: The clips (codec, frame rate, frames, width, height): 5 fps, so the second of 2 sampled frames is at 00:01; a WebM,
#: whose header has no frame count.
CLIPS = {"slow.mp4": ("h264", Fraction(5), 12, 40, 30), "wide.webm": ("libvpx-vp9", Fraction(24), 8, 64, 36)}
VIDEO_SEQ_LEN = 464  # one pack of all four (453 tokens), its padding after them


def _clips(chat) -> list[bytes]:
    specs = chat[3] if len(chat) > 3 else ()
    return [audio_clips.encode(audio_clips.tone(n, rate) * (1 + k), rate, fmt=fmt, codec=codec)
            for k, (fmt, codec, rate, n) in enumerate(specs)]


def _waves(chat) -> list[np.ndarray]:
    """Each clip as the loader decodes it: 16 kHz mono, the probed sample count."""
    out = []
    for data in _clips(chat):
        probe = probe_audio(data, sample_id=chat[0])
        out.append(decode_audio(data, rate=16_000, frames=probe.frames, source_rate=probe.rate, sample_id=chat[0]))
    return out


def _messages(chat, images=None, audio=None, videos=None) -> list[dict]:
    items = {"image": iter(images or []), "audio": iter(audio or []), "video": iter(videos or [])}
    out = []
    for role, text in chat[1]:
        parts: list[dict] = []
        for piece in re.split(r"(<image>|<audio>|<video>)", text):
            if piece in ("<image>", "<audio>", "<video>"):
                kind = piece[1:-1]
                parts.append({"type": kind, kind: next(items[kind])})
            elif piece:
                parts.append({"type": "text", "text": piece})
        out.append({"role": role, "content": parts})
    return out


def oracle(processor, chat) -> dict[str, torch.Tensor]:
    """The plain path: the processor's own ``apply_chat_template`` with the chat's PIL images and waveforms."""
    pil = [Image.open(io.BytesIO(b)) for b in h.chat_images(chat)]
    return dict(processor.apply_chat_template(_messages(chat, pil, _waves(chat)), tokenize=True, return_dict=True,
                                              return_tensors="pt"))


def _pack(folder, processor_dir) -> object:
    from wdspack.packer.config import PackConfig
    from wdspack.packer.job import pack_dataset
    from wdspack.packer.samples import SampleConfig

    src = folder / "src"
    (src / "media").mkdir(parents=True)
    lines = []
    for chat in CHATS:
        names = {"image": [], "audio": []}
        for kind, blobs, ext in (("image", h.chat_images(chat), "png"), ("audio", _clips(chat), None)):
            for k, data in enumerate(blobs):
                name = f"media/{chat[0]}-{k}.{ext or chat[3][k][0]}"
                (src / name).write_bytes(data)
                names[kind].append(name)
        lines.append(json.dumps({"id": chat[0], "messages": _messages(chat, names["image"], names["audio"])}))
    (src / "chats.jsonl").write_text("\n".join(lines) + "\n")
    out = folder / "packed"
    summary = pack_dataset([str(src / "chats.jsonl")], str(out),
                           sample_config=SampleConfig(processor=str(processor_dir)),
                           config=PackConfig(seq_len=SEQ_LEN, max_images=4, on_error="raise"), progress=False)
    assert summary.samples_packed == len(CHATS), summary.lines()
    return out


def save_pretrained(processor, folder) -> None:
    """The processor's own ``save_pretrained``, its absent video processor (it needs torchvision) skipped: transformers'
    5.x folder (one ``processor_config.json`` holding the image processor's and feature extractor's settings)."""
    from unittest import mock

    cls = type(processor)
    parts = [name for name in cls.get_attributes() if getattr(processor, name, None) is not None]
    with mock.patch.object(cls, "get_attributes", classmethod(lambda c: parts)):
        processor.save_pretrained(str(folder))


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """The real processor, the tiny model (float64; its audio tower float32) and the packed chats."""
    from tiny_vlm import gemma4

    folder = tmp_path_factory.mktemp("gemma4")
    processor = gemma4.processor(folder / "tok")
    saved = folder / "processor"
    save_pretrained(processor, saved)
    model = gemma4.model(processor).double()
    model.model.audio_tower.float()
    model.model.embed_audio.float()
    return processor, model, _pack(folder, saved)


def _reference(model, processor, dataset, *, backward: bool = True, refs=None):
    """Loss sum, target count and gradients of the chats one by one (processor → model); ``refs``: the processor's
    outputs per chat id (the video chats', from the reference child) instead of :data:`CHATS` through ``oracle``."""
    subs = h.dataset_sub_samples(dataset)
    model.zero_grad()
    total, count = torch.zeros((), dtype=torch.float64), 0
    alone = refs or {chat[0]: oracle(processor, chat) for chat in CHATS}
    for sid, outputs in alone.items():
        inputs = {k: torch.as_tensor(v) for k, v in outputs.items() if k != "attention_mask"}
        ids, mask = subs[sid][:2]
        labels = torch.where(torch.from_numpy(mask.astype(bool)), torch.from_numpy(ids), -100)[None]
        labels[0, 0] = -100
        with torch.set_grad_enabled(backward):
            logits = model(**inputs, use_cache=False).logits
        loss = h._token_losses(logits, labels)
        if backward:
            loss.backward()
        total, count = total + loss.detach(), count + int((labels[:, 1:] != -100).sum())
    return total, count, h._gradients(model) if backward else None


def test_tokens_are_the_processors(gemma):
    processor, _, dataset = gemma
    subs = h.dataset_sub_samples(dataset)
    assert sorted(subs) == sorted(c[0] for c in CHATS)
    bos = processor.tokenizer.bos_token_id
    for chat in CHATS:
        ids, mask, _, tokens = subs[chat[0]]
        want = oracle(processor, chat)["input_ids"][0]
        assert ids.tolist() == want.tolist(), f"{chat[0]}: tokens differ from the processor's"
        assert ids[0] == bos and int((ids == bos).sum()) == 1
        assert sum(tokens) == int((ids == processor.image_token_id).sum()) and len(tokens) == len(chat[2])
        trained = processor.tokenizer.decode(ids[mask.astype(bool)])
        for role, text in chat[1]:
            assert (text in trained) == (role == "assistant"), f"{chat[0]}: {role} turn {text!r} trained?"
    assert any(int((subs[c[0]][0] == processor.audio_token_id).sum()) for c in AUDIO_CHATS)


def test_pixels_features_and_token_types_are_the_processors(gemma):
    processor, model, dataset = gemma
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    chats = {c[0]: c for c in CHATS}
    packs = h.pack_sample_ids(dataset)
    alone = {sid: oracle(processor, chats[sid]) for sid in chats}
    order = [sid for ids in packs for sid in ids]
    for key in ("pixel_values", "image_position_ids"):
        want = torch.cat([alone[sid][key] for sid in order if key in alone[sid]])
        torch.testing.assert_close(kwargs[key], want, rtol=0, atol=0)
    got_f, got_m = kwargs["input_features"], kwargs["input_features_mask"]
    want_f = [f[m] for sid in order if "input_features" in alone[sid]
              for f, m in zip(alone[sid]["input_features"], alone[sid]["input_features_mask"])]
    assert len(want_f) == got_f.shape[0] == 4
    for f, m, w in zip(got_f, got_m, want_f):
        assert int(m.sum()) == w.shape[0] and not m[w.shape[0]:].any()
        torch.testing.assert_close(f[:w.shape[0]], w, rtol=0, atol=0)
    for b, ids in enumerate(packs):
        start = 0
        for sid in ids:
            types = alone[sid]["mm_token_type_ids"][0]
            assert torch.equal(batch["mm_token_type_ids"][b, start:start + len(types)], types), sid
            start += len(types)


def test_masks_are_the_models_per_sub_sample(gemma):
    """Each sub-sample's block of the packed masks is the mask the model builds for it alone; the rest is masked."""
    processor, model, dataset = gemma
    (batch,) = h.loader_batches(dataset, processor)
    assert_masks_are_the_models(model, batch)


def assert_masks_are_the_models(model, batch) -> None:
    """The packed masks of ``batch``, per sub-sample, are ``create_masks_for_vision_model``'s for it alone."""
    from transformers.models.gemma4.modeling_gemma4 import (
        create_masks_for_vision_model,
        get_block_sequence_ids_for_mask,
    )

    masks = wdspack.model_inputs(batch, model)["attention_mask"]
    text = model.config.get_text_config()
    assert text._attn_implementation == "sdpa" and masks["full_attention"].dtype == torch.bool
    for b in range(batch["input_ids"].shape[0]):
        for s in batch["seq_idx"][b].unique().tolist():
            where = torch.nonzero(batch["seq_idx"][b] == s)[:, 0]
            lo, hi = int(where[0]), int(where[-1]) + 1
            types = batch["mm_token_type_ids"][b, lo:hi][None]
            own = create_masks_for_vision_model(config=text, inputs_embeds=torch.zeros(1, hi - lo, 1),
                                                attention_mask=None, cache=None, position_ids=None,
                                                block_sequence_ids=get_block_sequence_ids_for_mask(types, "cpu"))
            for name, mask in masks.items():
                want = own[name][0, 0] if own[name] is not None else torch.ones(hi - lo, hi - lo).tril().bool()
                assert torch.equal(mask[b, 0, lo:hi, lo:hi], want), (b, s, name)  # None: plain causal (SDPA's own)
                assert not mask[b, 0, lo:hi, :lo].any() and not mask[b, 0, lo:hi, hi:].any(), (b, s, name)
    full, sliding = masks["full_attention"], masks["sliding_attention"]
    assert (full & ~sliding).any(), "the window is shorter than a sub-sample"
    assert not full.triu(1).any(), "full layers are causal"
    assert sliding.triu(1).any(), "on sliding layers soft tokens see their image's later ones"


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_loss_and_gradients_equal_one_by_one(gemma, attn):
    """Loss and gradients under SDPA; under eager (the same masks, additive) the loss, which any mask error moves."""
    processor, model, dataset = gemma
    packs = h.pack_sample_ids(dataset)
    assert len(packs) >= 2 and any(len(p) > 1 for p in packs)
    media = {c[0]: bool(c[2]) or len(c) > 3 for c in CHATS}
    assert any(media[sid] for p in packs for sid in p[1:]), "media sits in a pack's second or later sub-sample"
    model.set_attn_implementation({"text_config": attn, "vision_config": attn})  # the audio tower: eager only
    try:
        batches = h.loader_batches(dataset, processor)
        assert any(int(n) < SEQ_LEN for b in batches for n in b["num_tokens"]), "a pack has padding"
        want = _reference(model, processor, dataset, backward=attn == "sdpa")
        got = h.packed(model, batches, backward=attn == "sdpa")
    finally:
        model.set_attn_implementation({"text_config": "sdpa", "vision_config": "sdpa"})
    assert_same(model, got, want)


def assert_same(model, got, want, *, audio_share: float = GRAD_SHARE["model.audio_tower."]) -> None:
    """The mean loss at float64 tolerance; every gradient within :data:`GRAD_SHARE` of its largest entry (the audio
    tower's within ``audio_share``)."""
    (g_total, g_count, g_grads), (w_total, w_count, w_grads) = got, want
    assert g_count == w_count > 0
    torch.testing.assert_close(g_total / g_count, w_total / w_count, rtol=1e-9, atol=1e-11)
    if g_grads is None and w_grads is None:
        return
    seen = 0
    for (name, _), g, w in zip(model.named_parameters(), g_grads, w_grads):
        share = audio_share if name.startswith("model.audio_tower.") else GRAD_SHARE[""]
        scale = float((w / w_count).abs().max())
        err = float((g / g_count - w / w_count).abs().max())
        assert err <= share * scale, f"gradient of {name}: off by {err:.3g}, its largest entry {scale:.3g}"
        seen += int(scale > 0)
    assert seen > len(w_grads) // 2, "most parameters got a gradient"


def test_without_the_image_spans_it_is_not_exact(gemma):
    """The check above can fail: plain block-causal masks (no bidirectional image spans) give another loss."""
    processor, model, dataset = gemma
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    with torch.no_grad():
        exact = model(**kwargs).loss
        kwargs["attention_mask"] = packed_masks(torch.zeros_like(batch["mm_token_type_ids"]), batch["seq_idx"],
                                                sliding_window=int(model.config.get_text_config().sliding_window),
                                                implementation="sdpa")
        blind = model(**kwargs).loss
    assert not torch.allclose(blind, exact, rtol=1e-6)


def test_refusals_name_the_fix(gemma):
    processor, _, _ = gemma
    with pytest.raises(ConfigError, match="sdpa, eager"):
        packed_masks(torch.zeros(1, 4, dtype=torch.int64), torch.zeros(1, 4, dtype=torch.int32), sliding_window=2,
                     implementation="flash_attention_2")
    with pytest.raises(ConfigError, match="16000 Hz"):
        GEMMA4.audio.rule(processor, {"sampling_rate": 24_000})


# ---- video ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_video(tmp_path_factory, gemma, video_reference):
    """The video chats packed from the folder the real processor (with its video processor, :data:`tiny_vlm.gemma4`'s
    ``VIDEO`` settings) wrote with ``save_pretrained`` in the reference child, that folder loaded here (its video
    settings read from it), the module's model, and per chat the processor's own outputs."""
    from tests.support.video_reference import example_job, run_jobs
    from wdspack.models import load_processor
    from wdspack.packer.config import PackConfig
    from wdspack.packer.job import pack_dataset
    from wdspack.packer.samples import SampleConfig

    processor, model, _ = gemma
    root = tmp_path_factory.mktemp("gemma4-video")
    src = root / "src"
    (src / "media").mkdir(parents=True)
    for name, (codec, rate, frames, width, height) in CLIPS.items():
        clip(src / "media" / name, codec=codec, rate=rate, frames=frames, width=width, height=height)
    lines, calls = [], []
    for chat in VIDEO_CHATS:
        names = {"image": [], "audio": [], "video": [f"media/{c}" for c in (chat[4] if len(chat) > 4 else ())]}
        for k, data in enumerate(h.chat_images(chat)):
            names["image"].append(f"media/{chat[0]}-{k}.png")
            (src / names["image"][-1]).write_bytes(data)
        for k, (data, wave) in enumerate(zip(_clips(chat), _waves(chat))):
            names["audio"].append(f"media/{chat[0]}-{k}.{chat[3][k][0]}")
            (src / names["audio"][-1]).write_bytes(data)
            np.save(src / f"{names['audio'][-1]}.npy", wave)  # as the loader decodes it, for the reference
        messages = _messages(chat, names["image"], names["audio"], names["video"])
        lines.append(json.dumps({"id": chat[0], "messages": messages}))
        calls.append({"text": processor.apply_chat_template(messages, tokenize=False),
                      "videos": [src / v for v in names["video"]],
                      "images": [src / i for i in names["image"]] or None,
                      "audio": [src / f"{a}.npy" for a in names["audio"]] or None})
    (src / "chats.jsonl").write_text("\n".join(lines) + "\n")
    folder = root / "processor"
    (refs,) = run_jobs([example_job("gemma4", root / "tok", folder, calls)])
    dataset = root / "packed"
    summary = pack_dataset([str(src / "chats.jsonl")], str(dataset), sample_config=SampleConfig(processor=str(folder)),
                           config=PackConfig(seq_len=VIDEO_SEQ_LEN, max_images=4, on_error="raise"), progress=False)
    assert summary.samples_packed == len(VIDEO_CHATS), summary.lines()
    said = "\n".join(summary.lines())  # the folder's own video settings, as save_pretrained nested them
    assert "2 frames a video, each resized to at most 70 soft tokens" in said and "processor_config.json" in said, said
    return load_processor(folder), model, dataset, dict(zip((c[0] for c in VIDEO_CHATS), refs))


def test_video_tokens_pixels_and_masks_are_the_processors(gemma_video):
    """Tokens (each frame ``MM:SS <|image>`` + its soft tokens + ``<image|>``, from the folder's ``num_frames``),
    ``mm_token_type_ids``, ``pixel_values_videos`` and ``video_position_ids`` (bit for bit, frames padded as the
    video processor pads them), the image's pixels and the audio's features are the real processor's; the packed
    masks are the model's per sub-sample (each frame's soft tokens one bidirectional span)."""
    processor, model, dataset, refs = gemma_video
    subs = h.dataset_sub_samples(dataset)
    for sid, ref in refs.items():
        assert subs[sid][0].tolist() == ref["input_ids"][0].tolist(), f"{sid}: tokens differ from the processor's"
    text = processor.tokenizer.decode(subs["video-only"][0])
    assert "00:00 <|image>" in text and "00:01 <|image>" in text  # 2 frames of a 5 fps clip: frames 0 and 6
    (batch,) = h.loader_batches(dataset, processor)
    kwargs = wdspack.model_inputs(batch, model)
    order = [sid for ids in h.pack_sample_ids(dataset) for sid in ids]
    for key in ("pixel_values_videos", "video_position_ids", "num_frames_per_video", "pixel_values",
                "image_position_ids"):
        want = torch.cat([torch.from_numpy(refs[sid][key]) for sid in order if key in refs[sid]])
        assert torch.equal(kwargs[key], want), key
    assert kwargs["num_frames_per_video"].tolist() == [2, 2] and kwargs["pixel_values_videos"].shape[1] == 70 * 4
    audio = {k: torch.from_numpy(refs["video-image-audio"][k][0]) for k in ("input_features", "input_features_mask")}
    got_f = kwargs["input_features"][0][kwargs["input_features_mask"][0]]
    assert torch.equal(got_f, audio["input_features"][audio["input_features_mask"].bool()])
    for b, ids in enumerate(h.pack_sample_ids(dataset)):
        start = 0
        for sid in ids:
            types = torch.from_numpy(refs[sid]["mm_token_type_ids"][0])
            assert torch.equal(batch["mm_token_type_ids"][b, start:start + len(types)], types), sid
            start += len(types)
    assert int((batch["mm_token_type_ids"] == 2).sum()) == int(batch["video_patch_mask"].sum()) // 4
    assert_masks_are_the_models(model, batch)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_video_packed_loss_and_gradients_equal_one_by_one(gemma_video, attn):
    """Videos alone and beside an image and an audio: loss and gradients under SDPA, the loss under eager, as the
    module's other check (the video frames through the same float32 pooler as images, at the same tolerances)."""
    processor, model, dataset, refs = gemma_video
    packs = h.pack_sample_ids(dataset)
    assert any(sid.startswith("video") for p in packs for sid in p[1:]), "a video sits in a pack's later sub-sample"
    model.set_attn_implementation({"text_config": attn, "vision_config": attn})
    try:
        batches = h.loader_batches(dataset, processor)
        assert any(int(n) < VIDEO_SEQ_LEN for b in batches for n in b["num_tokens"]), "a pack has padding"
        want = _reference(model, processor, dataset, backward=attn == "sdpa", refs=refs)
        got = h.packed(model, batches, backward=attn == "sdpa")
    finally:
        model.set_attn_implementation({"text_config": "sdpa", "vision_config": "sdpa"})
    assert_same(model, got, want, audio_share=VIDEO_AUDIO_SHARE)


def test_video_plans_are_the_processors(gemma):
    """The plan from a header alone: transformers' own frame sampling (``num_frames``, ``fps``) and sizes, and the
    processor's own text with ``MM:SS`` past a minute; what the processor refuses is refused with the fix."""
    from transformers.models.gemma4.processing_gemma4 import get_aspect_ratio_preserving_size
    from transformers.video_utils import VideoMetadata, default_sample_indices_fn

    from tiny_vlm import gemma4

    processor = gemma[0]
    side = GEMMA4.video
    assert side is not None
    base = side.sampling(processor, gemma4.VIDEO)
    header = VideoHeader(frames=2400, fps=30000 / 1001, width=50, height=90)
    for settings, kwargs in ((VideoSettings(), {"num_frames": 2}), (VideoSettings(num_frames=5), {"num_frames": 5}),
                             (VideoSettings(fps=0.1), {"fps": 0.1})):
        plan = side.plan(header, settings.apply(base))
        meta = VideoMetadata(total_num_frames=header.frames, fps=header.fps, width=50, height=90)
        meta.frames_indices = default_sample_indices_fn(meta, **kwargs)
        assert plan.indices == tuple(meta.frames_indices.tolist())
        size = get_aspect_ratio_preserving_size(height=90, width=50, patch_size=4, max_patches=280,
                                                pooling_kernel_size=2)
        per_frame = size[0] * size[1] // 64
        assert (plan.height, plan.width) == size and plan.tokens == len(plan.indices) * per_frame
        want = processor.replace_video_token({"num_soft_tokens_per_video": [per_frame], "video_metadata": [meta]},
                                             video_idx=0)
        assert side.replacement(processor, plan) == want
    assert want.count("<|image>") == 8 and "01:10 <|image>" in want  # at 0.1 fps the last of 8: frame 2100, 70.07 s
    with pytest.raises(SampleError, match="3 frames < the 5 frames") as short:
        side.plan(VideoHeader(frames=3, fps=5.0, width=40, height=30), VideoSettings(num_frames=5).apply(base))
    assert short.value.reason == "video_too_short"
    for settings in (VideoSettings(max_frames=4), VideoSettings(max_pixels=4096)):
        with pytest.raises(ConfigError, match="leave --video-max"):
            side.plan(header, settings.apply(base))
    with pytest.raises(ConfigError, match=r"fps 2\.0 and num_frames 32"):
        side.plan(header, Gemma4VideoSampling(fps=2.0))
    assert side.sampling(processor, None) == Gemma4VideoSampling(patch_size=4, pooling_kernel_size=2)
    with pytest.raises(ConfigError, match="patch_size 16 differs from the image processor's 4"):
        side.sampling(processor, {**gemma4.VIDEO, "patch_size": 16})
    with pytest.raises(ConfigError, match="max_soft_tokens is 70; load with the processor"):  # packed with 140, say
        side.pad({"video_grid": torch.tensor([[2, 20, 20]]), "pixel_values_videos": ()}, processor,
                 Budgets(64, 2, max_video_tokens=400), [200])
    with pytest.raises(ConfigError, match="max_soft_tokens 100"):
        side.sampling(processor, {**gemma4.VIDEO, "max_soft_tokens": 100})
