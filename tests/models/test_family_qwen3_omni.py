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


def _typed(row: dict) -> list[dict]:
    """The record's turns as typed parts, as the reference renders them with the chat template."""
    out = []
    for turn in row["messages"]:
        text = turn["content"]
        for tag in ("audio", "image", "video"):
            text = text.replace(f"<{tag}>", f"\0{tag}\0")
        parts = [{"type": p} if p in ("audio", "image", "video") else {"type": "text", "text": p}
                 for p in text.split("\0") if p]
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


def _check_positions(model, dataset, refs, batch) -> None:
    """Rows 1-3 of every sub-sample are the thinker's own ``get_rope_index`` of that sub-sample alone; row 0
    restarts at 0."""
    B, L = batch["input_ids"].shape
    assert batch["position_ids"].shape == (4, B, L)
    for b, ids in enumerate(h.pack_sample_ids(dataset)):
        start = 0
        for sid in ids:
            ref = refs[sid]
            n = ref["input_ids"].shape[1]
            lengths = ref["feature_attention_mask"].sum(-1) if "feature_attention_mask" in ref else None
            rope, _ = model.model.get_rope_index(ref["input_ids"], ref.get("image_grid_thw"), ref.get("video_grid_thw"),
                                                 ref["attention_mask"], False, lengths,
                                                 ref.get("video_second_per_grid"))
            assert torch.equal(batch["position_ids"][1:, b, start:start + n], rope[:, 0]), sid
            assert torch.equal(batch["position_ids"][0, b, start:start + n], torch.arange(n).float()), sid
            start += n


def test_the_batchs_positions_are_the_thinkers(built):
    processor, model, dataset, refs = built
    (batch,) = h.loader_batches(dataset, processor)
    _check_positions(model, dataset, refs, batch)


def _one_by_one(model, dataset, refs):
    subs = h.dataset_sub_samples(dataset)
    model.zero_grad()
    total, count = torch.zeros((), dtype=torch.float64), 0
    for sid, ref in refs.items():
        inputs = dict(ref)  # with its attention mask: the thinker computes its 3-D positions only then
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

