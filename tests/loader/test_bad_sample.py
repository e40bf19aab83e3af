"""One bad sample never costs its neighbours (issue #47, item 2, at load time).

A sub-sample whose image or video does not decode when the loader reads its pack is dropped from
that pack: the other sub-samples train with exactly the rows a pack packed without it gives (the
reference here is the packer's own assembly of the good sub-samples, or a pack job run without the
bad record), the drop is counted per source and reason and warned in one line, and no pack is
served twice in an epoch for it. A pack whose bytes are damaged is still skipped as corrupt.

The synthetic packs are written with the codec; the processor cases (a tiny Qwen2.5-VL, clips made
with PyAV, a clip cut after packing through the pack codec) are marked ``slow``.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import re
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

import wdspack
from tests.support.bad_input import png
from tests.support.synthetic import IMAGE_TOKEN_ID, TOKENIZER, TOKENS_PER_IMAGE, tiny_image
from wdspack import cli
from wdspack.format.manifest import MANIFEST_NAME, Manifest, read_manifest, write_json_atomic
from wdspack.format.pack import Pack, decode_pack, drop_sample, encode_pack, validate_pack
from wdspack.format.pack_index import COLUMNS, INDEX_NAME, encode_index, index_entry, pack_row
from wdspack.format.tar import ShardWriter, shard_name
from wdspack.loader.batch.collate import IGNORE_INDEX
from wdspack.media.image.pixels import make_image_transform
from wdspack.media.video.record import VideoPlanRecord
from wdspack.packer.spool import assemble_pack

SEQ_LEN, MAX_IMAGES = 64, 3
NOT_AN_IMAGE = b"not an image"


def _sub(sid: str, head: int, *, images: int = 0, bad: bool = False, text: int = 8) -> list:
    """One spooled sub-sample ``[id, ids, mask, images, image_tokens]`` (what the pack job assembles):
    ``head``, its image tokens, then ``text`` tokens whose second half is trained."""
    rng = np.random.default_rng(head)
    ids = np.concatenate([[head], np.full(images * TOKENS_PER_IMAGE, IMAGE_TOKEN_ID), rng.integers(10, 900, text)])
    mask = np.zeros(len(ids), np.uint8)
    mask[-(text // 2):] = 1
    pictures = [NOT_AN_IMAGE if bad and k == 0 else tiny_image(rng) for k in range(images)]
    return [sid, ids.astype("<u4").tobytes(), mask.tobytes(), pictures, [TOKENS_PER_IMAGE] * images]


A, B_BAD, C = _sub("a", 101, images=1), _sub("b-bad", 202, images=2, bad=True), _sub("c", 303, images=0)
D, E, F = _sub("d", 404, images=1), _sub("e", 505, images=1, text=12), _sub("f", 606)
#: the damaged dataset's packs, by their sub-samples; the reference packs the same without ``b-bad``
DAMAGED = [[A, B_BAD, C], [D], [E, F]]
REFERENCE = [[A, C], [D], [E, F]]


def _write(root: Path, packs: list[Pack]) -> Path:
    """One shard of ``packs``, its pack index and its manifest (a dataset as the pack job leaves it)."""
    root.mkdir(parents=True)
    with ShardWriter(root / shard_name("train", 0)) as writer:
        rows = []
        for p, pack in enumerate(packs):
            writer.add(f"{p:012d}", encode_pack(pack, token_dtype="<u2"), samples=pack.num_samples,
                       tokens=pack.num_tokens, images=pack.num_images)
            rows.append(pack_row(writer.offsets[-1], pack))
        info = writer.close()
    index = encode_index(np.asarray(rows, np.int64).reshape(-1, len(COLUMNS)))
    (root / INDEX_NAME).write_bytes(index)
    samples = sum(p.num_samples for p in packs)
    manifest = Manifest(
        seq_len=SEQ_LEN, max_images=MAX_IMAGES, algorithm="synthetic", seed=0, tokenizer=dict(TOKENIZER),
        image_policy={"kind": "fixed", "tokens_per_image": TOKENS_PER_IMAGE}, shards=(info,), split="train",
        sources=("synthetic",), pack_index=index_entry(index),
        totals={"samples_read": samples, "samples_packed": samples, "samples_dropped": 0, "dropped_by_reason": {},
                "packs": len(packs), "tokens": info.tokens, "images": info.images, "fill_ratio": 0.5,
                "max_samples_per_pack": 4})  # one max_segments for a dataset and its reference
    write_json_atomic(root / MANIFEST_NAME, manifest.to_json())
    return root


def _dataset(root: Path, subs: list[list[list]]) -> Path:
    return _write(root, [assemble_pack(s) for s in subs])


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> Path:
    return _dataset(tmp_path_factory.mktemp("bad-sample") / "damaged", DAMAGED)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    return _dataset(tmp_path_factory.mktemp("bad-sample") / "reference", REFERENCE)


def _loader(root, **kw):
    kw = {"batch_size": 1, "num_workers": 0, "shuffle": False, "image_transform": make_image_transform(size=16)} | kw
    return wdspack.make_loader(str(root), **kw)


def _served(batches) -> list[tuple[int, ...]]:
    """Each served pack as the heads of its sub-samples (first token of each segment of ``seq_idx``)."""
    out = []
    for batch in batches:
        for b in range(batch["input_ids"].shape[0]):
            ids, seq = batch["input_ids"][b], batch["seq_idx"][b]
            n = int(batch["num_tokens"][b])
            starts = [0] * bool(n) + [i for i in range(1, n) if seq[i] != seq[i - 1]]
            out.append(tuple(int(ids[i]) for i in starts))
    return out


def _same(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for key in want:
        g, w = got[key], want[key]
        assert (torch.equal(g, w) if isinstance(w, torch.Tensor) else g == w), key


def _with_video(sub: list, clip: bytes, frames: int) -> list:
    """``sub`` owning one video too (the spooled video fields: bytes, tokens, plans)."""
    plan = VideoPlanRecord(tuple(range(frames)), (28, 28), (frames, 2, 2), 0.5)
    return [*sub, [clip], [frames], [plan.to_msgpack()]]


def test_drop_sample_is_the_pack_packed_without_it():
    """Every field, videos too, equals the packer's assembly of the other sub-samples."""
    subs = [_with_video(A, b"clip-a", 2), B_BAD, _with_video(C, b"clip-c", 4), _sub("g", 707, images=1)]
    whole = assemble_pack(subs)
    for i in range(len(subs)):
        got, want = drop_sample(whole, i), assemble_pack(subs[:i] + subs[i + 1:])
        validate_pack(got)
        for field in dataclasses.fields(Pack):
            a, b = getattr(got, field.name), getattr(want, field.name)
            assert (np.array_equal(a, b) if isinstance(b, np.ndarray) else a == b), (i, field.name)
    assert drop_sample(whole, 0).video_sample == (1,) and drop_sample(whole, 2).videos == (b"clip-a",)
    empty = drop_sample(assemble_pack([B_BAD]), 0)
    validate_pack(empty)
    assert empty.num_samples == empty.num_tokens == empty.num_images == 0
    with pytest.raises(IndexError, match=r"sub-sample 4 is not in the pack's 0\.\.3"):
        drop_sample(whole, 4)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_bad_image_drops_its_sample_and_the_pack_trains_the_others(damaged, reference, workers, caplog):
    with caplog.at_level(logging.WARNING, logger="wdspack"):
        loader = _loader(damaged, num_workers=workers)
        got = list(loader)
    want = list(_loader(reference))
    assert len(got) == len(want) == 3, "every pack served once: the epoch needs no other"
    for g, w in zip(got, want):
        _same(g, w)  # labels, positions, cu_seqlens, targets and pixels as if packed without it
    assert _served(got) == [(101, 303), (404,), (505, 606)]
    assert loader.stats["dropped_samples"] == 1 and loader.stats["corrupt_packs"] == 0, loader.stats
    assert loader.stats["dropped_samples/damaged/unreadable_image"] == 1, loader.stats
    if workers == 0:  # a worker's log records stay in its process
        said = [r.getMessage() for r in caplog.records if "dropped from its pack" in r.getMessage()]
        assert len(said) == 1 and "\n" not in said[0], said
        assert said[0].startswith(f"{damaged / 'train-000000.tar'} pack 0: sample 'b-bad': image 1: "), said
        assert "(unreadable_image)" in said[0], said


def test_on_corrupt_raise_stops_at_the_bad_sample(damaged):
    with pytest.raises(wdspack.FormatError, match=r"train-000000\.tar pack 0: ImageDecodeError: sample 'b-bad': "
                                                  r"image 1: cannot read the image header"):
        list(_loader(damaged, on_corrupt="raise"))


def test_the_only_pack_trains_its_three_good_chats(tmp_path):
    """Before: the dataset's one pack skipped, the slot found nothing readable and stopped ("damaged")."""
    root = _dataset(tmp_path / "one", [[A, B_BAD, C, F]])
    loader = _loader(root)
    (batch,) = list(loader)
    (want,) = list(_loader(_dataset(tmp_path / "ref", [[A, C, F]])))
    _same(batch, want)
    assert int(batch["num_samples"][0]) == 3 and int(batch["num_targets"][0]) > 0
    assert loader.stats["dropped_samples"] == 1 and loader.stats["corrupt_packs"] == 0


def test_a_pack_whose_every_sample_fails_is_served_as_padding(tmp_path):
    bad2 = _sub("b2-bad", 808, images=1, bad=True)
    root = _dataset(tmp_path / "ds", [[B_BAD, bad2], [D]])
    loader = _loader(root, batch_size=2)
    (batch,) = list(loader)
    assert _served([batch]) == [(), (404,)], "both packs served, the first as padding, once"
    assert batch["num_samples"].tolist()[0] == 0 and batch["num_tokens"].tolist()[0] == 0
    assert bool((batch["labels"][0] == IGNORE_INDEX).all()) and batch["num_targets"].tolist()[0] == 0
    assert not bool(batch["image_mask"][:MAX_IMAGES].any()) and bool(batch["image_mask"][MAX_IMAGES])
    assert batch["cu_seqlens"].tolist()[:3] == [0, SEQ_LEN, SEQ_LEN + int(batch["num_tokens"][1])]
    assert loader.stats["dropped_samples"] == 2 and loader.stats["corrupt_packs"] == 0
    (alone,) = list(_loader(_dataset(tmp_path / "alone", [[B_BAD]])))
    assert int(alone["num_samples"][0]) == 0, "the only pack, all bad: padding, not 'the dataset is damaged'"
    logits = torch.randn(1, SEQ_LEN, 1000, requires_grad=True)  # a step of padding alone trains nothing, finitely
    n, samples = wdspack.num_items_in_batch([alone]), wdspack.num_samples_in_batch([alone])
    loss = wdspack.token_losses(logits, alone["labels"]).sum() / n + wdspack.sample_mean_loss(logits, alone, samples)
    loss.backward()
    assert float(loss.detach()) == 0.0 and bool((logits.grad == 0).all())


def test_damaged_pack_bytes_are_still_a_corrupt_pack(tmp_path):
    root = _dataset(tmp_path / "ds", [[A], [D], [E, F]])
    shard = root / "train-000000.tar"
    data = bytearray(shard.read_bytes())
    at = data.find(assemble_pack([D]).input_ids.astype("<u2").tobytes())
    data[at - 40:at + 8] = b"\xc1" * 48  # inside the msgpack map: not msgpack any more
    shard.write_bytes(bytes(data))
    loader = _loader(root)
    served = _served(loader)
    assert loader.stats["corrupt_packs"] >= 1 and loader.stats["dropped_samples"] == 0, loader.stats
    assert len(served) == 3 and (404,) not in served, "skipped, and the slot reads on for its count"


def test_resume_counts_the_pack_once(damaged):
    whole = _loader(damaged, num_workers=1, seed=3, shuffle=True, shuffle_buffer=3)
    full = _served(whole)
    first = _loader(damaged, num_workers=1, seed=3, shuffle=True, shuffle_buffer=3)
    it = iter(first)
    head = [next(it) for _ in range(2)]
    state = first.state_dict()
    del it
    resumed = _loader(damaged, num_workers=1, seed=3, shuffle=True, shuffle_buffer=3)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert _served(head) + _served(rest) == full and sorted(full) == [(101, 303), (404,), (505, 606)]
    assert whole.stats["dropped_samples"] == resumed.stats["dropped_samples"] == 1, (state, resumed.stats)


def test_a_mixture_counts_the_drop_under_its_source(damaged, reference):
    mix = [(str(reference), 0.5, "clean"), (str(damaged), 0.5, "hurt")]
    loader = wdspack.make_loader(mix, batch_size=1, num_workers=0, image_transform=make_image_transform(size=16))
    batches = list(loader)
    hurt = [s for b, s in zip(batches, _served(batches)) if int(b["source_idx"][0]) == 1]
    assert (101, 202, 303) not in hurt and all(202 not in s for s in hurt)
    assert loader.stats["dropped_samples"] == loader.stats.get("dropped_samples/hurt/unreadable_image", 0) \
        == sum(s == (101, 303) for s in hurt) >= 1, loader.stats
    assert not any(k.startswith("dropped_samples/clean/") for k in loader.stats)


# -- a model processor: videos and images through the Qwen2.5-VL family ------------------------------------------

QWEN_SEQ_LEN = 512  # every chat in one pack


def _faststart_clip(path: Path, *, frames: int = 24, seed: int = 0) -> bytes:
    """An h264 MP4 with its header (moov) before the frames, so a cut tail leaves the header whole."""
    import av

    with av.open(str(path), "w", options={"movflags": "faststart"}) as out:
        stream = out.add_stream("h264", rate=12)
        stream.width, stream.height, stream.pix_fmt = 48, 32, "yuv420p"
        rng = np.random.default_rng(seed)
        for _ in range(frames):
            pixels = rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path.read_bytes()


def _cut(mp4: bytes) -> bytes:
    """The clip with the second half of its frame data gone (what an interrupted copy leaves)."""
    mdat = mp4.find(b"mdat")
    assert 0 < mp4.find(b"moov") < mdat, "faststart: the header first"
    return mp4[: mdat + (len(mp4) - mdat) // 2]


#: the records (one pack holds them all); ``v-cut``'s clip and ``i-bad``'s image are damaged after packing
CHATS = {
    "v-a": {"messages": [{"role": "user", "content": "<video>What happens?"},
                         {"role": "assistant", "content": "Colours change."}], "videos": ["clips/a.mp4"]},
    "v-cut": {"messages": [{"role": "user", "content": "<video>Describe it."},
                           {"role": "assistant", "content": "A short clip."}], "videos": ["clips/b.mp4"]},
    "i-a": {"messages": [{"role": "user", "content": "<image>What is it?"},
                         {"role": "assistant", "content": "Noise."}], "images": ["images/p.png"]},
    "i-bad": {"messages": [{"role": "user", "content": "<image>And this?"},
                           {"role": "assistant", "content": "More noise."}], "images": ["images/q.png"]},
    "text": {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]},
}
BAD = ("v-cut", "i-bad")


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """The tiny Qwen2.5-VL processor (real classes) and the folder it is saved in."""
    from tiny_vlm import qwen2_5_vl
    from wdspack.models import save_processor

    root = tmp_path_factory.mktemp("qwen")
    processor = qwen2_5_vl.processor(root / "tok")
    return processor, save_processor(processor, root / "processor")


def _pack_chats(qwen, root: Path, ids) -> Path:
    """``wdspack pack`` on the chats ``ids`` (their clips and images under ``root``) with the Qwen processor."""
    src = root / "src"
    if not src.exists():
        (src / "clips").mkdir(parents=True)
        (src / "images").mkdir()
        _faststart_clip(src / "clips" / "a.mp4", seed=1)
        _faststart_clip(src / "clips" / "b.mp4", seed=2)
        (src / "images" / "p.png").write_bytes(png(seed=1))
        (src / "images" / "q.png").write_bytes(png(seed=2))
    name = "-".join(ids)
    (src / f"{name}.jsonl").write_text("".join(json.dumps({"id": i, **CHATS[i]}) + "\n" for i in ids))
    out = root / name
    code = cli.main(["pack", str(src / f"{name}.jsonl"), "--output", str(out), "--processor", str(qwen[1]),
                     "--image-root", str(src), "--video-fps", "4", "--video-max-frames", "8",
                     "--video-max-pixels", str(28 * 28 * 4), "--seq-len", str(QWEN_SEQ_LEN)])
    assert code == 0
    return out


def _rewrite_pack(out: Path, change) -> None:
    """Replace the dataset's one pack with ``change(pack)``, written through the pack codec."""
    (shard,) = out.glob("*.tar")
    with tarfile.open(shard) as tar:
        (info,) = tar.getmembers()
        pack = decode_pack(tar.extractfile(info).read())
    data = encode_pack(change(pack), token_dtype=read_manifest(out).tokenizer["token_dtype"])
    info.size = len(data)
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(data))


def _damage(pack: Pack) -> Pack:
    """``v-cut``'s clip cut and ``i-bad``'s image garbled: what a clip whose header lies, or bytes damaged after
    packing, look like to the loader."""
    cut, bad = pack.sample_ids.index("v-cut"), pack.sample_ids.index("i-bad")
    videos = tuple(_cut(v) if o == cut else v for v, o in zip(pack.videos, pack.video_sample))
    images = tuple(b"\x89PNG but not" if o == bad else b for b, o in zip(pack.images, pack.image_sample))
    return dataclasses.replace(pack, videos=videos, images=images)


@pytest.fixture(scope="module")
def qwen_packs(qwen, tmp_path_factory) -> tuple[Path, Path]:
    """(the pack of every chat, with the clip cut and the image garbled after packing; the pack job's pack of the
    chats without those two)."""
    pytest.importorskip("av")
    root = tmp_path_factory.mktemp("qwen-packs")
    damaged = _pack_chats(qwen, root, list(CHATS))
    _rewrite_pack(damaged, _damage)
    reference = _pack_chats(qwen, root, [i for i in CHATS if i not in BAD])
    _same_budgets(reference, damaged)
    return damaged, reference


def _same_budgets(reference: Path, like: Path) -> None:
    """Give ``reference``'s manifest the budgets of ``like``'s (image slots, pixel rows, segments), so their
    batches have the same shapes: what one dataset holding both packs would give each."""
    have, want = (json.loads((p / MANIFEST_NAME).read_text()) for p in (reference, like))
    have["max_images"] = want["max_images"]
    for key in ("max_images_per_pack", "max_image_tokens_per_pack", "max_video_tokens_per_pack",
                "max_samples_per_pack"):
        have["totals"][key] = want["totals"][key]
    write_json_atomic(reference / MANIFEST_NAME, json.dumps(have))


@pytest.mark.slow
def test_a_cut_clip_and_a_bad_image_drop_their_samples_and_the_pack_trains_the_rest(qwen, qwen_packs, caplog):
    """The dataset's only pack holds three good chats beside a cut clip and a bad image: the three train,
    with the rows (mRoPE positions, cu_seqlens, labels, pixels) the pack job gives them packed alone."""
    damaged, reference = qwen_packs
    with caplog.at_level(logging.WARNING, logger="wdspack"):
        loader = wdspack.make_loader(str(damaged), batch_size=1, num_workers=0, shuffle=False, processor=qwen[0])
        (batch,) = list(loader)
    (want,) = list(wdspack.make_loader(str(reference), batch_size=1, num_workers=0, shuffle=False,
                                       processor=qwen[0]))
    assert batch["position_ids"].shape[0] == 4 and bool(batch["video_mask"].any()) and bool(batch["image_mask"].any())
    _same(batch, want)
    assert int(batch["num_samples"][0]) == 3
    stats = loader.stats
    assert stats["dropped_samples"] == 2 and stats["corrupt_packs"] == 0, stats
    assert stats[f"dropped_samples/{damaged.name}/unreadable_video"] == 1, stats
    assert stats[f"dropped_samples/{damaged.name}/unreadable_image"] == 1, stats
    said = [r.getMessage() for r in caplog.records if "dropped from its pack" in r.getMessage()]
    assert len(said) == 2 and not any("\n" in m for m in said), said
    assert any(re.search(r"sample 'v-cut': video \d: frame \d+ asked for, but the video has \d+ frames", m)
               and "(unreadable_video)" in m for m in said), said
    assert any(re.search(r"sample 'i-bad': image \d: cannot read the image header", m) and "(unreadable_image)" in m
               for m in said), said
    assert all(m.startswith(f"{damaged / 'train-000000.tar'} pack 0: ") for m in said), said


@pytest.mark.slow
def test_a_cut_clip_under_on_corrupt_raise_stops(qwen, qwen_packs):
    damaged, _ = qwen_packs
    loader = wdspack.make_loader(str(damaged), batch_size=1, num_workers=0, shuffle=False, processor=qwen[0],
                                 on_corrupt="raise")
    with pytest.raises(wdspack.FormatError, match=r"pack 0: \w+DecodeError: sample '(v-cut|i-bad)': "):
        list(loader)


@pytest.mark.slow
def test_a_pack_of_only_bad_chats_is_served_as_padding_through_the_processor(qwen, qwen_packs, tmp_path):
    def bad_only(pack: Pack) -> Pack:  # the input: the pack of the two bad chats alone
        for sid in [s for s in pack.sample_ids if s not in BAD]:
            pack = drop_sample(pack, pack.sample_ids.index(sid))
        return pack

    root = shutil.copytree(qwen_packs[0], tmp_path / "bad-only")
    _rewrite_pack(root, bad_only)
    loader = wdspack.make_loader(str(root), batch_size=1, num_workers=0, shuffle=False, processor=qwen[0])
    (batch,) = list(loader)
    assert batch["num_samples"].tolist() == [0] and batch["num_targets"].tolist() == [0]
    assert not bool(batch["image_mask"].any()) and not bool(batch["video_mask"].any())
    assert bool((batch["labels"] == IGNORE_INDEX).all()) and batch["cu_seqlens"].tolist()[:2] == [0, QWEN_SEQ_LEN]
    assert loader.stats["dropped_samples"] == 2 and loader.stats["corrupt_packs"] == 0
