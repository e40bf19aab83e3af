"""Every tool knows audio (issue #50, item 6): the demo's sound chats (LLaMA-Factory's ``mllm_audio_demo.json``
layout, WAV/FLAC/MP3 at 8 to 44.1 kHz) packed by the CLI with Qwen2-Audio's processor in two worker processes;
``inspect --deep`` counts each pack's audio and seconds, ``show`` collapses each audio's tokens,
``verify --source`` checks every stored audio against its plan and the source, and ``reshard`` re-plans the packs
with their audio, plans and bytes untouched.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.support.audio_clips import av
from wdspack.cli import main

if av is None:
    pytest.skip("PyAV is not installed (pip install av)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    from tiny_vlm import qwen2_audio

    spec = importlib.util.spec_from_file_location("make_demo_data", ROOT / "examples" / "make_demo_data.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    root = tmp_path_factory.mktemp("audio-tools")
    generator.generate_audio(root / "data", clips=6, seed=3)
    folder = root / "processor"
    qwen2_audio.processor(root / "tok", chunk_length=4).save_pretrained(folder)
    out = root / "packed"
    rc = main(["pack", str(root / "data" / "audios.jsonl"), "--output", str(out), "--processor", str(folder),
               "--seq-len", "200", "--max-images", "3", "--workers", "2", "-q"])
    assert rc == 0
    return root, folder, out


def test_inspect_counts_each_packs_audio_and_seconds(packed, capsys):
    _, _, out = packed
    assert main(["inspect", str(out), "--deep", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["audios"] == 6 and stats["max_audio_tokens_per_pack"] > 0
    per = stats["per_pack"]
    assert per["audios"]["max"] <= 3 and per["audio_tokens"]["max"] == stats["max_audio_tokens_per_pack"]
    assert 0 < per["audio_seconds"]["min"] <= per["audio_seconds"]["max"] <= 3 * 4.0  # at most 3 audios of 4 s
    assert main(["inspect", str(out), "--deep"]) == 0
    text = capsys.readouterr().out
    assert "audios 6 (at most" in text and "audio_seconds/pack" in text


def test_show_collapses_each_audios_tokens(packed, capsys):
    _, _, out = packed
    assert main(["show", str(out), "--samples", "2"]) == 0
    text = capsys.readouterr().out
    assert "Audio 1: <|audio_bos|><audio×" in text and "<|AUDIO|>" not in text


def test_verify_checks_each_audio_against_its_plan_and_the_source(packed, capsys):
    root, _, out = packed
    assert main(["verify", str(out), "--source", str(root / "data" / "audios.jsonl")]) == 0
    assert "checks out" in capsys.readouterr().out


def test_reshard_keeps_the_audio_its_plans_and_bytes(packed, tmp_path, capsys):
    from tests.support.vlm_harness import pack_sample_ids

    _, _, out = packed
    again = tmp_path / "re"
    assert main(["reshard", str(out), str(again), "--seq-len", "160", "--max-images", "2", "-q"]) == 0
    capsys.readouterr()
    assert len(pack_sample_ids(again)) > len(pack_sample_ids(out))
    assert main(["verify", str(again)]) == 0
    assert _audio_by_sample(again) == _audio_by_sample(out)


def _audio_by_sample(dataset: Path) -> dict:
    import tarfile

    from wdspack.format.pack import decode_pack

    found = {}
    for shard in sorted(dataset.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                pack = decode_pack(tar.extractfile(m).read())
                audio = pack.media["audio"]
                for k, owner in enumerate(audio.sample):
                    found.setdefault(pack.sample_ids[owner], []).append(
                        (audio.data[k], audio.tokens[k], audio.plans[k]))
    return found


def test_webdataset_members_and_parquet_columns_pack_their_audio(packed, tmp_path, capsys):
    """A WebDataset shard's ``.wav``/``.flac`` members (a caption each; an empty member is dropped unread) and a
    Parquet ``audios`` column of ``{bytes, path}`` structs pack as the JSON layouts do."""
    import io
    import tarfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    root, folder, _ = packed
    sounds = sorted((root / "data" / "audios").iterdir())
    wav = next(p for p in sounds if p.suffix == ".wav").read_bytes()
    flac = next(p for p in sounds if p.suffix == ".flac").read_bytes()
    shard = tmp_path / "sounds-000000.tar"
    with tarfile.open(shard, "w") as tar:
        for name, data in (("a.wav", wav), ("a.txt", b"A steady tone."), ("b.flac", flac), ("b.txt", b"A chirp."),
                           ("c.wav", b""), ("c.txt", b"Nothing.")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    table = pa.table({"messages": [[{"role": "user", "content": "<audio>What is it?"},
                                    {"role": "assistant", "content": "A tone."}]],
                      "audios": [[{"bytes": wav, "path": "a.wav"}]]})
    pq.write_table(table, tmp_path / "chats.parquet")
    out = tmp_path / "out"
    rc = main(["pack", str(shard), str(tmp_path / "chats.parquet"), "--output", str(out), "--processor", str(folder),
               "--eos-token", "<|endoftext|>", "--seq-len", "200", "--max-images", "3", "--max-drop-fraction", "1",
               "-q"])
    assert rc == 0
    dropped = [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]
    assert [(d["id"], d["reason"]) for d in dropped] == [("sounds-000000.tar:c", "unreadable_audio")]
    assert "c.wav is empty (0 bytes)" in dropped[0]["detail"]
    capsys.readouterr()
    assert main(["show", str(out), "--samples", "3"]) == 0
    text = capsys.readouterr().out
    assert "sounds-000000.tar:a" in text and "sounds-000000.tar:b" in text and "chats.parquet:0" in text
    assert text.count("<audio×") == 3


def test_a_mixture_streams_audio_from_each_source(packed, tmp_path, capsys):
    """Two audio datasets of the same budgets in one mixture (the second a reshard of the first): the loader's
    batches carry each source's audio features, as many audios as the packs it drew hold."""
    import torch

    import wdspack

    _, folder, out = packed
    other = tmp_path / "other"
    assert main(["reshard", str(out), str(other), "--seq-len", "200", "--max-images", "3", "--seed", "7", "-q"]) == 0
    capsys.readouterr()
    loader = wdspack.make_loader([(str(out), 1), (str(other), 1)], batch_size=1, num_workers=0, processor=str(folder),
                                 seed=0)
    seen, audios = set(), 0
    for batch in loader:
        seen.add(int(batch["source_idx"][0]))
        audios += int(batch["audio_mask"].sum())
        assert torch.isfinite(batch["input_features"]).all()
    assert seen == {0, 1} and audios > 0


def test_the_kind_neutral_spellings_pack_as_the_first_ones(packed, tmp_path, capsys):
    """``--media-root`` and ``--max-media`` (``pack_dataset(media_root=)``) are ``--image-root`` and
    ``--max-images`` by the names that say what they count: every kind's paths and items."""
    from wdspack.packer.config import PackConfig
    from wdspack.packer.job import pack_dataset
    from wdspack.packer.samples import SampleConfig

    root, folder, out = packed
    elsewhere = tmp_path / "lists"
    elsewhere.mkdir()
    (elsewhere / "audios.jsonl").write_bytes((root / "data" / "audios.jsonl").read_bytes())
    neutral = tmp_path / "neutral"
    rc = main(["pack", str(elsewhere / "audios.jsonl"), "--output", str(neutral), "--processor", str(folder),
               "--media-root", str(root / "data"), "--seq-len", "200", "--max-media", "3", "-q"])
    assert rc == 0
    capsys.readouterr()
    assert _audio_by_sample(neutral) == _audio_by_sample(out)
    summary = pack_dataset([str(elsewhere / "audios.jsonl")], str(tmp_path / "api"),
                           sample_config=SampleConfig(processor=str(folder)),
                           config=PackConfig(seq_len=200, max_images=3), media_root=str(root / "data"))
    assert summary.samples_packed == 6
