"""Audio, exactly: Qwen2-Audio chats in LLaMA-Factory's ``mllm_audio_demo.json`` layout (and transformers' typed
parts), packed from the folder the real processor's own ``save_pretrained`` writes, streamed, and trained: every
sub-sample's tokens are the real processor's, the loader's ``input_features`` are its features bit for bit, and
the packed loss and gradients equal the sub-samples run one by one through processor → model, in float64, under
SDPA and eager.

The reference feeds the processor the waveform the loader decodes (``decode_audio`` of the whole file: the
processor cuts at its window itself); the clips are MP3, WAV, FLAC and Opus at 8 to 48 kHz, mono and stereo, one
past the window. The processor's window is 4 s here, not the published 30 s (its folder says so, and the plan
reads it there): the encoder and the packs are 7 times shorter, so the test costs seconds. The 30 s window's
token counts are checked against the real processors in ``tests/media/audio/test_tokens.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import wdspack
from tests.support import vlm_harness as h
from tests.support.audio_clips import av, encode, tone
from wdspack.media.audio.decode import decode_audio
from wdspack.media.audio.header import probe_audio
from wdspack.packer.config import PackConfig
from wdspack.packer.job import pack_dataset
from wdspack.packer.samples import SampleConfig

if av is None:
    pytest.skip("PyAV is not installed (pip install av)", allow_module_level=True)

SEQ_LEN = 160
WINDOW = 4  #: seconds: the feature extractor's chunk_length
#: name -> (samples, rate, channels, container, codec)
CLIPS = {
    "mllm_demo_data/1.mp3": (44_100, 44_100, 2, "mp3", "libmp3lame"),
    "mllm_demo_data/2.wav": (44_101, 22_050, 1, "wav", "pcm_s16le"),
    "mllm_demo_data/3.flac": (33_600, 48_000, 2, "flac", "flac"),
    "mllm_demo_data/4.ogg": (19_201, 16_000, 1, "ogg", "libopus"),
    "mllm_demo_data/long.wav": (8_000 * 5, 8_000, 1, "wav", "pcm_s16le"),
}
#: LLaMA-Factory's layout (``audios`` and ``<audio>``), transformers' typed parts, two audios in one turn, a chat
#: without audio; the long clip fills a pack of its own.
ROWS = {
    "a-glass": {"messages": [{"role": "user", "content": "<audio>What's that sound?"},
                             {"role": "assistant", "content": "It is the sound of glass shattering."}],
                "audios": ["mllm_demo_data/1.mp3"]},
    "a-two": {"messages": [{"role": "user", "content": "<audio><audio>Which one is lower?"},
                           {"role": "assistant", "content": "The second."},
                           {"role": "user", "content": "Sure?"}, {"role": "assistant", "content": "Yes."}],
              "audios": ["mllm_demo_data/2.wav", "mllm_demo_data/3.flac"]},
    "a-typed": {"messages": [{"role": "user", "content": [{"type": "audio", "audio": "mllm_demo_data/4.ogg"},
                                                          {"type": "text", "text": "Transcribe it."}]},
                             {"role": "assistant", "content": [{"type": "text", "text": "A hum."}]}]},
    "a-text": {"messages": [{"role": "user", "content": "Hello?"}, {"role": "assistant", "content": "Hi."}]},
    "a-long": {"messages": [{"role": "user", "content": "<audio>How long is it?"},
                            {"role": "assistant", "content": "Past the window."}],
               "audios": ["mllm_demo_data/long.wav"]},
}


def _typed(row: dict, src) -> tuple[list[dict], list[np.ndarray]]:
    """The row as transformers' messages, and the waveform the loader decodes for each of its audios in order."""
    pool = iter(row.get("audios", ()))
    messages, files = [], []
    for m in row["messages"]:
        content = m["content"]
        parts = []
        if isinstance(content, str):
            for k, piece in enumerate(content.split("<audio>")):
                if k:
                    parts.append({"type": "audio"})
                    files.append(next(pool))
                if piece:
                    parts.append({"type": "text", "text": piece})
        else:
            for p in content:
                if p["type"] == "audio":
                    files.append(p["audio"])
                    parts.append({"type": "audio"})
                else:
                    parts.append(p)
        messages.append({"role": m["role"], "content": parts})
    waves = []
    for name in files:
        data = (src / name).read_bytes()
        found = probe_audio(data, sample_id=name)
        waves.append(decode_audio(data, rate=16_000, frames=found.frames, source_rate=found.rate, sample_id=name))
    return messages, waves


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The real processor (saved by its own ``save_pretrained``), a tiny float64 model, the packed dataset and
    each sample's reference inputs."""
    from tiny_vlm import qwen2_audio

    root = tmp_path_factory.mktemp("audio")
    src = root / "src"
    (src / "mllm_demo_data").mkdir(parents=True)
    for name, (n, rate, channels, fmt, codec) in CLIPS.items():
        (src / name).write_bytes(encode(tone(n, rate, channels), rate, fmt=fmt, codec=codec))
    (src / "chats.jsonl").write_text("".join(json.dumps({"id": sid, **row}) + "\n" for sid, row in ROWS.items()))
    processor = qwen2_audio.processor(root / "tok", chunk_length=WINDOW)
    folder = root / "processor"
    processor.save_pretrained(folder)
    dataset = root / "packed"
    summary = pack_dataset([str(src / "chats.jsonl")], str(dataset), sample_config=SampleConfig(processor=str(folder)),
                           config=PackConfig(seq_len=SEQ_LEN, max_images=3, on_error="raise"), progress=False)
    assert summary.samples_packed == len(ROWS), summary.lines()
    refs = {}
    for sid, row in ROWS.items():
        messages, waves = _typed(row, src)
        text = processor.apply_chat_template(messages, tokenize=False)
        refs[sid] = dict(processor(text=[text], audio=waves or None, return_tensors="pt"))
    model = qwen2_audio.model(processor).double()
    return processor, model, dataset, refs, summary


def test_tokens_and_features_are_the_processors(built):
    processor, _, dataset, refs, summary = built
    subs = h.dataset_sub_samples(dataset)
    for sid, ref in refs.items():
        assert subs[sid][0].tolist() == ref["input_ids"][0].tolist(), f"{sid}: tokens differ from the processor's"
    assert int((refs["a-long"]["input_ids"] == processor.audio_token_id).sum()) == 100  # cut at 4 s, as it cuts
    (batch,) = h.loader_batches(dataset, processor)
    order = [sid for ids in h.pack_sample_ids(dataset) for sid in ids]
    want = torch.cat([refs[sid]["input_features"] for sid in order if "input_features" in refs[sid]])
    mask = torch.cat([refs[sid]["feature_attention_mask"] for sid in order if "input_features" in refs[sid]])
    assert torch.equal(batch["input_features"][batch["audio_mask"]], want)
    assert torch.equal(batch["feature_attention_mask"][batch["audio_mask"]], mask.to(torch.int64))
    assert int(batch["audio_mask"].sum()) == 5 and batch["input_features"].shape[1:] == (128, 100 * WINDOW)
    assert "audios   processor qwen2_audio (Qwen2AudioProcessor), 16000 Hz mono, cut at 4 s" in "\n".join(
        summary.lines())


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_loss_and_gradients_equal_one_by_one(built, attn):
    processor, model, dataset, refs, _ = built
    subs = h.dataset_sub_samples(dataset)
    model.set_attn_implementation(attn)
    try:
        model.zero_grad()
        total, count = torch.zeros((), dtype=torch.float64), 0
        for sid, ref in refs.items():
            ids, mask = subs[sid][:2]
            labels = torch.where(torch.from_numpy(mask.astype(bool)), torch.from_numpy(ids), -100)[None]
            labels[0, 0] = -100
            inputs = {k: v.double() if v.is_floating_point() else v for k, v in ref.items() if k != "attention_mask"}
            loss = h._token_losses(model(**inputs, use_cache=False).logits, labels)
            loss.backward()
            total, count = total + loss.detach(), count + int((labels[:, 1:] != -100).sum())
        want = (total, count, h._gradients(model))
        batches = h.loader_batches(dataset, processor)
        assert any(int(n) < SEQ_LEN for b in batches for n in b["num_tokens"]), "a pack has padding"
        h.assert_same(model, h.packed(model, batches), want, looser=h.EAGER_GRADIENTS if attn == "eager" else None)
    finally:
        model.set_attn_implementation("sdpa")


def test_the_static_slots_give_the_same_loss_as_the_real_ones(built):
    """Every ``max_images`` slot fed to the model (the static shape a compiled step takes), empty ones included:
    an empty slot attends to one frame (no row masked whole, no NaN), gives no token, and the loss and gradients
    are those of the real slots alone."""
    processor, model, dataset, _, _ = built
    batches = h.loader_batches(dataset, processor)
    assert any(not bool(b["audio_mask"].all()) for b in batches)
    real = h.packed(model, batches)
    model.zero_grad()
    total, count = torch.zeros((), dtype=torch.float64), 0
    for batch in batches:
        kwargs = wdspack.model_inputs(batch, model)
        kwargs["input_features"] = batch["input_features"].double()
        kwargs["feature_attention_mask"] = batch["feature_attention_mask"]
        loss = h._token_losses(model(**kwargs).logits, kwargs["labels"])
        loss.backward()
        total, count = total + loss.detach(), count + int((kwargs["labels"][:, 1:] != -100).sum())
    grads = h._gradients(model)
    assert all(torch.isfinite(g).all() for g in grads)
    h.assert_same(model, (total, count, grads), real)
