"""A mixture holds what one dataset holds (issue #21, item 4): damaged packs and shards inside a source,
request economy and retries over HTTP, processor-mode batches, the same number of batches on every
rank; and the webdataset stages refuse a mixture, naming make_loader (item 1).

Two small synthetic datasets (tests/support/synthetic.py): every pack's first token is 1000 + its row in its
dataset, so a batch tells which pack of which source each row is. Damage is done in place, byte for
byte (a pack's bytes overwritten, a shard cut short), so each source's pack index still gives the
packs' byte offsets for the ranged reads.
"""

from __future__ import annotations

import json
import logging
import shutil
import tarfile
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.support.httpserver import cut, serve, status
from tests.support.synthetic import pack_numbers, write_dataset
from wdspack.errors import ConfigError, FormatError, WdspackError
from wdspack.loader import Mixture, make_loader

ROOT = Path(__file__).resolve().parents[3]
COUNTS = {"a": [5, 7, 6], "b": [9, 4]}
B = 2
OPTIONS = dict(batch_size=B, shuffle_buffer=4, seed=3, text_only=True)
BAD = (1, 3)  # (source, row): pack 3 of b's shard 0, the pack the `damaged` fixture overwrites
FAST = {"retries": 5, "backoff": 0.01}


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("mix")
    for k, (name, counts) in enumerate(COUNTS.items()):
        write_dataset(base / name, shards=len(counts), packs_per_shard=counts, seq_len=64,
                      max_images=2 if name == "a" else 0, seed=10 + k, pack_index=True)
    return base


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _member(shard: Path, k: int) -> tarfile.TarInfo:
    with tarfile.open(shard) as tar:
        return tar.getmembers()[k]


@pytest.fixture(scope="module")
def damaged(roots, tmp_path_factory) -> Path:
    """``b`` with pack 3 of shard 0 overwritten by bytes that are not msgpack (0xc1 is never used),
    the same length, so every offset of the pack index still holds."""
    b = _copy(roots / "b", tmp_path_factory.mktemp("damaged") / "b")
    shard = b / "train-000000.tar"
    member = _member(shard, BAD[1])
    data = bytearray(shard.read_bytes())
    data[member.offset_data:member.offset_data + member.size] = b"\xc1" * member.size
    shard.write_bytes(bytes(data))
    return b


def _mix(roots: Path, b: Path | None = None, weights=(0.5, 0.5)) -> list:
    return [(str(roots / "a"), weights[0], "a"), (str(b or roots / "b"), weights[1], "b")]


def _batches(loader, n: int | None = None) -> list[list[tuple[int, int]]]:
    """Each batch as its rows' (source, pack row); at most ``n`` batches."""
    out = []
    for batch in loader:
        out.append(list(zip(batch["source_idx"].tolist(), pack_numbers(batch["input_ids"]))))
        if n is not None and len(out) == n:
            break
    return out


def _take(loader, n: int) -> list[list[tuple[int, int]]]:
    """The next ``n`` batches, across epochs (an epoch consumed to its end starts the next)."""
    out: list[list[tuple[int, int]]] = []
    empty = 0
    while len(out) < n:
        got = _batches(loader, n - len(out))
        empty = 0 if got else empty + 1
        assert empty < 2, "the loader yields nothing"
        out += got
    return out


# -- a damaged source -----------------------------------------------------------------------------


def test_a_corrupt_pack_is_skipped_counted_and_the_slot_makes_it_up(roots, damaged, caplog):
    """One slot: each epoch is the clean stream without the corrupt pack, followed by as many packs as
    were skipped (the slot's schedule made longer), so every epoch still has len(loader) batches."""
    clean = make_loader(_mix(roots), num_workers=0, **OPTIONS)
    with caplog.at_level(logging.WARNING, logger="wdspack.loader"):
        hurt = make_loader(_mix(roots, damaged), num_workers=0, **OPTIONS)
        skipped = 0
        for _ in range(3):
            want = [row for batch in _batches(clean) for row in batch]
            got = [row for batch in _batches(hurt) for row in batch]
            kept = [row for row in want if row != BAD]
            skipped += len(want) - len(kept)
            assert len(got) == len(want) == len(hurt) * B
            assert BAD not in got and got[:len(kept)] == kept
    assert skipped >= 2  # b makes more than one pass an epoch: the pack was due more than once
    warned = [r.getMessage() for r in caplog.records if "skipped (corrupt_packs" in r.getMessage()]
    assert hurt.stats["corrupt_packs"] == len(warned) >= skipped
    assert all("mixture source 'b'" in w and "train-000000.tar pack 3" in w for w in warned)
    assert clean.stats["corrupt_packs"] == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_a_restored_state_recomputes_the_stream_around_a_corrupt_pack(roots, damaged, workers):
    def loader():
        return make_loader(_mix(roots, damaged), num_workers=workers, **OPTIONS)

    whole = loader()
    n = len(whole)
    full = _take(whole, 2 * n + 3)
    where = next(k for k, batch in enumerate(_take(make_loader(_mix(roots), num_workers=workers, **OPTIONS), 2 * n))
                 if BAD in batch)  # the batch the corrupt pack would have been in
    cuts = range(1, 2 * n + 1) if workers == 0 else sorted({1, where, where + 1, n, n + 1, 2 * n - 1})
    for k in cuts:
        first = loader()
        head = _take(first, k)
        state = json.loads(json.dumps(first.state_dict()))
        resumed = loader()
        resumed.load_state_dict(state)
        assert head + _take(resumed, len(full) - k) == full, k
    assert whole.stats["corrupt_packs"] >= 2


def test_on_corrupt_raise_names_the_source_and_the_shard(roots, damaged):
    for workers in (0, 1):
        with pytest.raises(FormatError, match=r"mixture source 'b': .*train-000000\.tar pack 3: "):
            for _ in range(2):
                _batches(make_loader(_mix(roots, damaged), num_workers=workers, on_corrupt="raise", **OPTIONS))


def test_a_truncated_shard_is_counted_and_every_epoch_stays_full(roots, tmp_path):
    b = _copy(roots / "b", tmp_path / "b")
    shard = b / "train-000001.tar"
    shard.write_bytes(shard.read_bytes()[:_member(shard, 2).offset_data + 10])  # inside pack 2 of 4
    lost = {(1, 9 + 2), (1, 9 + 3)}
    loader = make_loader(_mix(roots, b), num_workers=0, **OPTIONS)
    for _ in range(3):
        got = _batches(loader)
        assert len(got) == len(loader) and not lost & {row for batch in got for row in batch}
    assert loader.stats["truncated_shards"] >= 2 and loader.stats["corrupt_packs"] == 0
    with pytest.raises(WdspackError, match=r"train-000001\.tar: truncated"):
        for _ in range(2):
            _batches(make_loader(_mix(roots, b), num_workers=0, on_corrupt="raise", **OPTIONS))


# -- every rank gets the same number of batches ---------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("hurt", [False, True], ids=["clean", "corrupt-pack"])
def test_every_rank_gets_the_same_number_of_batches(roots, damaged, workers, hurt):
    """Three ranks, passes that are fractions (one source capped by max_passes), batches that do not
    divide the packs; with a corrupt pack, the ranks that meet it still yield as many batches."""
    mixture = Mixture.of({"unit": "tokens", "sources": [
        {"path": str(roots / "a"), "weight": 0.7, "name": "a", "max_passes": 0.8},
        {"path": str(damaged if hurt else roots / "b"), "weight": 0.3, "name": "b"}]})
    ranks, epochs = 3, 2
    lens, counts, seen, skipped = [], [], set(), 0
    for rank in range(ranks):
        loader = make_loader(mixture, num_workers=workers, rank=rank, world_size=ranks, **{**OPTIONS, "batch_size": 3})
        passes = loader.dataset.mixture.epoch.passes
        lens.append(len(loader))
        per_epoch = []
        for _ in range(epochs):
            got = _batches(loader)
            per_epoch.append(len(got))
            seen.update(row for batch in got for row in batch)
        counts.append(per_epoch)
        skipped += loader.stats["corrupt_packs"]
    assert all(p % 1 for p in passes) and passes[0] == pytest.approx(0.8)
    assert len(set(lens)) == 1 and lens[0] > 0
    assert counts == [[lens[0]] * epochs] * ranks
    assert (skipped > 0) == hurt and (BAD in seen) != hurt  # the pack is due in these epochs; damaged, it is skipped


# -- over HTTP --------------------------------------------------------------------------------------


def _whole(shard_counts, read) -> bool:
    return read.start == 0 and read.stop == shard_counts[read.shard]


def _reads(loader, *, rank: int, workers: int, epoch: int) -> list:
    """The ranged reads the schedules of this rank's slots name for ``epoch`` (DESIGN.md section 8)."""
    ds = loader.dataset
    slots = ds.world_size * max(workers, 1)
    per_slot = ds.mixture.per_slot(slots, B)
    out = []
    for w in range(max(workers, 1)):
        plan = ds.mixture.schedule(slot=rank * max(workers, 1) + w, slots=slots, workers=max(workers, 1), epoch=epoch,
                                   positions=per_slot, batch_size=B, seed=ds.seed, shuffle=ds.shuffle,
                                   shuffle_buffer=ds.shuffle_buffer)
        out += plan.reads
    return out


@pytest.mark.parametrize("ranks, workers", [(1, 0), (2, 0), (1, 2), (2, 2)])
def test_request_economy_over_http(roots, ranks, workers):
    """Per rank and epoch: the requests the loader counts are the shard GETs the server saw, no more
    than its schedule's ranged reads, and within Σ_sources (shards + 3) plus one per piece of a split
    shard; the manifest and the pack index are read once per rank; the stream is the local one."""
    epochs = 3
    shards = {name: len(counts) for name, counts in COUNTS.items()}
    with serve(roots) as server:
        for rank in range(ranks):
            kw = dict(num_workers=workers, rank=rank, world_size=ranks, read=FAST, **OPTIONS)
            local = make_loader(_mix(roots), **kw)
            remote = make_loader([(server.url + "a/", 0.5, "a"), (server.url + "b/", 0.5, "b")], **kw)
            counts = remote.dataset.mixture.layouts
            for epoch in range(epochs):
                logged, counted = len(server.log), remote.stats["requests"]
                assert _batches(remote) == _batches(local)
                gets = [r for r in server.log[logged:] if r.path.endswith(".tar")]
                requests = remote.stats["requests"] - counted
                reads = _reads(remote, rank=rank, workers=workers, epoch=epoch)
                split = sum(not _whole(counts[r.source].counts, r) for r in reads)
                bound = sum(n + 3 for n in shards.values()) + split
                assert requests == len(gets) <= len(reads), (rank, epoch)
                assert requests <= bound, (rank, epoch, requests, bound)
                assert all(r.status in (200, 206) for r in gets)
                print(f"ranks {ranks} workers {workers} rank {rank} epoch {epoch}: {requests} requests, "
                      f"{split} split pieces, bound {bound}")
            assert remote.stats["retries"] == 0
        paths = Counter(r.path for r in server.log if not r.path.endswith(".tar"))
        assert paths == {f"/{n}/{f}": ranks for n in COUNTS for f in ("manifest.json", "pack_index.npy")}


def test_faults_over_http_are_retried_counted_and_the_stream_is_the_local_one(roots):
    kw = dict(num_workers=0, read=FAST, **OPTIONS)
    with serve(roots) as server:
        sources = [(server.url + "a/", 0.5, "a"), (server.url + "b/", 0.5, "b")]
        clean = make_loader(sources, **kw)
        want = _take(clean, 2 * len(clean))
        assert want == _take(make_loader(_mix(roots), **kw), 2 * len(clean))
        server.clear()
        server.script("/a/train-000001.tar", cut(100), cut(100, reset=True))  # a cut, then a reset connection
        server.script("/b/train-000000.tar", status(503, retry_after="0"), cut(100))
        hurt = make_loader(sources, **kw)
        assert _take(hurt, 2 * len(hurt)) == want
        gets = [r for r in server.log if r.path.endswith(".tar")]
        failed = [r for r in gets if r.status not in (200, 206) or r.sent == 100]
    assert len(failed) == 4 and hurt.stats["retries"] == 4 and len(gets) == clean.stats["requests"] + 4
    # stats["requests"] counts the answered GETs (storage/http.py): the three cut ones, not the 503
    answered = [r for r in gets if r.status in (200, 206)]
    assert hurt.stats["requests"] == len(answered) == clean.stats["requests"] + 3
    resumed = {(r.path, r.range_start) for r in gets}
    for r in failed:  # a cut body is asked for again from the byte it stopped at
        if r.sent == 100:
            assert (r.path, (r.range_start or 0) + 100) in resumed


# -- processor-mode batches ---------------------------------------------------------------------------


@pytest.mark.slow  # Qwen2.5-VL's processor and model
def test_processor_mode_batches_from_two_processor_packed_sources(tmp_path):
    """Two Qwen2.5-VL datasets, the second with fewer image slots and fewer image tokens: the mixture's
    batches have the larger static shapes, and each row equals that source's own loader's row (pixel
    rows past the source's own padded to zero); the model reads both the same way."""
    import wdspack
    from tests.support import vlm_harness as h
    from tiny_vlm import qwen2_5_vl

    processor = qwen2_5_vl.processor(tmp_path / "tok")
    a = h.pack_chats(tmp_path / "a", processor, seq_len=96)
    b = h.pack_chats(tmp_path / "b", processor, seq_len=96, max_images=2, chats=h.CHATS[1:2] + h.CHATS[3:])
    mix = [(str(a), 1, "a"), (str(b), 1, "b")]
    loader = wdspack.make_loader(mix, batch_size=1, num_workers=0, processor=processor, seed=3)
    assert loader.source_names == ("a", "b") and loader.dataset.max_images == 4
    own = {}
    for i, src in enumerate((a, b)):
        for batch in wdspack.make_loader(str(src), batch_size=1, num_workers=0, processor=processor, shuffle=False,
                                         max_images=4):
            own[i, batch["input_ids"].numpy().tobytes()] = batch
    batches = list(loader)
    assert len(batches) == len(loader) and {int(x["source_idx"]) for x in batches} == {0, 1}
    padded = 0
    for batch in batches:
        mine = own[int(batch["source_idx"]), batch["input_ids"].numpy().tobytes()]
        assert list(batch) == list(mine)
        for key, value in batch.items():
            if key == "source_idx":
                continue
            theirs = mine[key]
            if not isinstance(value, torch.Tensor):
                assert value == theirs, key
                continue
            if key in ("pixel_values", "patch_mask") and value.shape != theirs.shape:  # b's fewer image tokens
                n = theirs.shape[0]
                assert value.shape[1:] == theirs.shape[1:] and not value[n:].any(), key
                value, padded = value[:n], padded + 1
            assert value.dtype == theirs.dtype and torch.equal(value, theirs), key
    assert padded  # b's rows were laid out in a's larger pixel tensors

    in_workers = list(wdspack.make_loader(mix, batch_size=1, num_workers=1, processor=processor, seed=3))
    assert len(in_workers) == len(batches)
    for x, y in zip(batches, in_workers):
        assert list(x) == list(y)
        assert all(torch.equal(x[k], y[k]) if isinstance(x[k], torch.Tensor) else x[k] == y[k] for k in x)
    model = qwen2_5_vl.model(processor, seed=0)
    with torch.no_grad():
        for batch in batches:
            if int(batch["source_idx"]) == 1 and batch["image_mask"].any():
                mine = own[1, batch["input_ids"].numpy().tobytes()]
                got = model(**wdspack.model_inputs(batch, model)).loss
                assert torch.isfinite(got) and torch.equal(got, model(**wdspack.model_inputs(mine, model)).loss)
                break
        else:
            raise AssertionError("no batch of b with an image")


# -- the webdataset stages -------------------------------------------------------------------------


def test_the_webdataset_stages_refuse_a_mixture_naming_make_loader(roots, tmp_path):
    from wdspack.loader.wds import read_dataset

    spec = tmp_path / "mix.yaml"
    spec.write_text(f"sources:\n  - {{path: {roots / 'a'}, weight: 1}}\n  - {{path: {roots / 'b'}, weight: 1}}\n")
    for value in (str(spec), spec, _mix(roots), Mixture.of(_mix(roots))):
        with pytest.raises(ConfigError, match=r"is a mixture: .*wdspack\.make_loader\(mixture, \.\.\.\)"):
            read_dataset(value)
    assert read_dataset(roots / "a").packs == tuple(COUNTS["a"])  # one source still reads as before
