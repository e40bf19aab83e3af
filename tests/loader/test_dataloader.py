"""The loader on local folders: shapes, coverage, shuffling, splits, damage, checks, resume."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import tarfile
from collections import Counter
from itertools import chain
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.synthetic import TOKENIZER, pack_numbers, write_dataset
from wdspack import loader as loader_mod
from wdspack.errors import ConfigError, FormatError, ManifestError
from wdspack.format.manifest import MANIFEST_NAME, read_manifest
from wdspack.loader import PackedDataset, make_loader, plan_epoch, shuffle_order
from wdspack.media.image.pixels import make_image_transform

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def even(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("even")
    write_dataset(root, shards=4, packs_per_shard=6, seed=1)
    return root


@pytest.fixture(scope="module")
def uneven(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("uneven")
    write_dataset(root, shards=5, packs_per_shard=[9, 3, 7, 2, 5], seed=2)
    return root


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def _examples(ds) -> list[int]:
    return [pack_numbers(ex["input_ids"])[0] for ex in ds]


def _batches(loader, limit: int | None = None) -> list[list[int]]:
    out = []
    for batch in loader:
        out.append(pack_numbers(batch["input_ids"]))
        if limit is not None and len(out) == limit:
            break
    return out


def _members(path: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(path) as tar:
        return [(m, tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers()]


def _rewrite(path: Path, members, fmt=tarfile.USTAR_FORMAT) -> None:
    with tarfile.open(path, "w", format=fmt) as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)


# -- shapes, coverage, order -----------------------------------------------------------------------


def test_batches_have_constant_shapes_and_dtypes(even):
    loader = make_loader(even, batch_size=3, num_workers=2, seed=0)
    assert len(loader) == 8
    signatures = {tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(b.items()) if isinstance(v, torch.Tensor))
                  for b in loader}
    assert len(signatures) == 1, signatures
    shapes = dict((k, s) for k, s, _ in next(iter(signatures)))
    assert shapes["input_ids"] == (3, 64) and shapes["labels"] == (3, 64)
    assert dict((k, d) for k, _, d in next(iter(signatures)))["input_ids"] == torch.int64
    assert not any(k.startswith("__wdspack") for k, _, _ in next(iter(signatures)))


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_pack_exactly_once_per_epoch(even, shuffle):
    ds = PackedDataset(even, shuffle=shuffle, shuffle_buffer=5, seed=4)
    first = _examples(ds)
    assert sorted(first) == list(range(24))
    if not shuffle:
        assert first == list(range(24))
    else:
        assert first != list(range(24))
    assert ds.stats["corrupt_packs"] == ds.stats["truncated_shards"] == 0


def test_same_seed_same_order_other_seed_other_order(even):
    a = _examples(PackedDataset(even, seed=7, shuffle_buffer=8))
    b = _examples(PackedDataset(even, seed=7, shuffle_buffer=8))
    c = _examples(PackedDataset(even, seed=8, shuffle_buffer=8))
    assert a == b and a != c and sorted(c) == sorted(a)


def test_set_epoch_changes_the_order_and_is_reproducible(even):
    ds = PackedDataset(even, seed=3, shuffle_buffer=8)
    e0 = _examples(ds)
    ds.set_epoch(1)
    e1 = _examples(ds)
    ds.set_epoch(0)
    assert sorted(e1) == sorted(e0) and e1 != e0 and _examples(ds) == e0


def test_loader_moves_to_the_next_epoch_after_a_full_pass(even):
    loader = make_loader(even, batch_size=4, num_workers=0, seed=3)
    e0, e1 = _batches(loader), _batches(loader)
    assert loader.epoch == 2
    assert sorted(chain(*e0)) == sorted(chain(*e1)) == list(range(24)) and e0 != e1


@pytest.mark.parametrize("world,workers", [(1, 2), (2, 1), (2, 2), (3, 2)])
def test_rank_worker_splits_are_disjoint_and_complete(even, world, workers):
    per_rank = [list(chain(*_batches(make_loader(even, batch_size=2, num_workers=workers, rank=r, world_size=world,
                                                 remainder="wrap", seed=5, shuffle_buffer=4))))
                for r in range(world)]
    seen = Counter(n for got in per_rank for n in got)
    slots = world * max(workers, 1)
    expected_per_rank = max(workers, 1) * -(-24 // (slots * 2)) * 2
    assert all(len(got) == expected_per_rank for got in per_rank)
    assert set(seen) == set(range(24))
    if 24 % (slots * 2) == 0:
        assert max(seen.values()) == 1  # nothing wrapped: disjoint


@pytest.mark.parametrize("remainder", ["drop", "wrap"])
def test_uneven_shards_give_every_rank_the_same_number_of_batches(uneven, remainder):
    world, batch = 3, 2
    loaders = [make_loader(uneven, batch_size=batch, num_workers=2, rank=r, world_size=world, remainder=remainder,
                           seed=9, shuffle_buffer=3) for r in range(world)]
    got = [_batches(loader) for loader in loaders]
    steps = {len(g) for g in got}
    assert len(steps) == 1 and steps == {len(loaders[0])}
    assert all(len(b) == batch for g in got for b in g)
    seen = Counter(n for g in got for b in g for n in b)
    if remainder == "drop":
        assert max(seen.values()) == 1 and len(seen) == world * 2 * (26 // (world * 2) // batch * batch)
    else:
        assert set(seen) == set(range(26)) and sum(seen.values()) >= 26


def test_plan_epoch_literal_split():
    # the shards back to back, cut where a slot's share ends: one split shard, in two pieces
    plan = plan_epoch([9, 3, 7, 2, 5], slots=2, epoch=0, seed=0, shuffle=False, remainder="drop")
    assert plan.per_slot == 13
    assert [[(r.shard, r.start, r.stop) for r in s] for s in plan.slots] == [
        [(0, 0, 9), (1, 0, 3), (2, 0, 1)], [(2, 1, 7), (3, 0, 2), (4, 0, 5)]]


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 40), min_size=1, max_size=12), slots=st.integers(1, 8),
       batch=st.integers(1, 4), epoch=st.integers(0, 3), remainder=st.sampled_from(["drop", "wrap"]),
       shuffle=st.booleans())
def test_plan_epoch_properties(counts, slots, batch, epoch, remainder, shuffle):
    total = sum(counts)
    try:
        plan = plan_epoch(counts, slots=slots, epoch=epoch, seed=1, shuffle=shuffle, remainder=remainder,
                          batch_size=batch)
    except ConfigError:
        assert total // slots // batch == 0 or total < slots
        return
    assert plan.per_slot % batch == 0 and plan.per_slot > 0
    covered = Counter()
    for s in range(slots):
        for r in plan.slots[s]:
            assert 0 <= r.start < r.stop <= counts[r.shard]
            covered.update((r.shard, i) for i in range(r.start, r.stop))
    assert max(covered.values(), default=1) == 1  # no pack in two slots
    if remainder == "drop":
        assert all(plan.assigned(s) == plan.per_slot for s in range(slots))
    else:
        assert len(covered) == total and all(0 < plan.assigned(s) <= plan.per_slot for s in range(slots))
    # whole shards are not split needlessly: at most slots - 1 shards are read by more than one slot
    owners = {}
    for s in range(slots):
        for r in plan.slots[s]:
            owners.setdefault(r.shard, set()).add(s)
    assert sum(len(o) - 1 for o in owners.values()) <= slots - 1
    # and a shard is split only at slot boundaries: no more pieces than the shares it spans
    share = plan.per_slot if remainder == "drop" else total // slots  # the smallest slot's share
    for shard, o in owners.items():
        assert len(o) <= 2 + (counts[shard] - 1) // share


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 300), size=st.integers(1, 40), seed=st.integers(0, 10))
def test_shuffle_order_is_a_bounded_buffer(n, size, seed):
    order = shuffle_order(n, buffer_size=size, rng=np.random.default_rng(seed))
    assert sorted(order.tolist()) == list(range(n))
    assert all(order[k] <= k + size - 1 for k in range(n))


# -- damaged shards --------------------------------------------------------------------------------


def test_corrupt_pack_is_skipped_counted_and_logged(even, tmp_path, caplog):
    root = _copy(even, tmp_path / "ds")
    shard = root / "train-000001.tar"
    members = _members(shard)
    members[2] = (members[2][0], b"not msgpack at all")
    _rewrite(shard, members)
    lost = 6 + 2
    with caplog.at_level(logging.WARNING, logger="wdspack.loader"):
        ds = PackedDataset(root, shuffle=False, remainder="drop")
        got = _examples(ds)
    assert len(got) == 24  # the slot makes up for the skipped pack (a second lap) so counts stay equal
    assert set(got) == set(range(24)) - {lost}
    assert ds.stats["corrupt_packs"] == 1
    assert any("train-000001.tar pack 2" in r.getMessage() for r in caplog.records)
    with pytest.raises(FormatError, match=r"train-000001\.tar pack 2"):
        _examples(PackedDataset(root, shuffle=False, on_corrupt="raise"))


def test_truncated_shard_is_skipped_counted_and_raised_on_request(even, tmp_path, caplog):
    root = _copy(even, tmp_path / "ds")
    shard = root / "train-000002.tar"
    with tarfile.open(shard) as tar:
        offsets = [m.offset_data + m.size for m in tar.getmembers()]
    cut = offsets[3] + 100  # inside the fifth pack's header/data
    shard.write_bytes(shard.read_bytes()[:cut])
    with caplog.at_level(logging.WARNING, logger="wdspack.loader"):
        ds = PackedDataset(root, seed=2, shuffle_buffer=4)
        got = _examples(ds)
    lost = {12 + 4, 12 + 5}
    assert len(got) == 24 and set(got) == set(range(24)) - lost
    assert ds.stats["truncated_shards"] == 1
    assert any("truncated" in r.getMessage() and "train-000002.tar" in r.getMessage() for r in caplog.records)
    with pytest.raises(FormatError, match=r"train-000002\.tar"):
        _examples(PackedDataset(root, on_corrupt="raise"))


def test_non_pack_members_are_ignored_and_counted(even, tmp_path):
    root = _copy(even, tmp_path / "ds")
    shard = root / "train-000000.tar"
    members = _members(shard)
    extra_file = tarfile.TarInfo("000000000000.json")
    long_name = tarfile.TarInfo("notes/" + "x" * 150 + ".txt")  # needs a pax header
    folder = tarfile.TarInfo("subdir")
    folder.type = tarfile.DIRTYPE
    link = tarfile.TarInfo("fake.mp")
    link.type, link.linkname = tarfile.SYMTYPE, "000000000000.mp"
    # (the reader stops right after a range's last pack, so nothing goes after the last one)
    members = [(extra_file, b'{"a": 1}'), members[0], (folder, b""), (long_name, b"hello"), *members[1:-1],
               (link, b""), members[-1]]
    _rewrite(shard, members, fmt=tarfile.PAX_FORMAT)
    ds = PackedDataset(root, shuffle=False)
    assert _examples(ds) == list(range(24))
    assert ds.stats["ignored_members"] == 4


def test_unknown_pack_format_is_refused_naming_both_versions(even, tmp_path):
    root = _copy(even, tmp_path / "ds")
    shard = root / "train-000000.tar"
    members = _members(shard)
    record = msgpack.unpackb(members[1][1], raw=False)
    record["format"] = "wdspack/2"
    members[1] = (members[1][0], msgpack.packb(record, use_bin_type=True))
    _rewrite(shard, members)
    with pytest.raises(FormatError, match=r"'wdspack/2'.*'wdspack/1'"):
        _examples(PackedDataset(root, shuffle=False, on_corrupt="skip"))


def test_unknown_manifest_format_is_refused_naming_both_versions(even, tmp_path):
    root = _copy(even, tmp_path / "ds")
    m = json.loads((root / MANIFEST_NAME).read_text())
    m["format"] = "wdspack/9"
    (root / MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(ManifestError, match=r"'wdspack/9'.*'wdspack/1'"):
        PackedDataset(root)


# -- checks against the manifest -------------------------------------------------------------------


def test_expect_tokenizer(even):
    PackedDataset(even, expect_tokenizer=dict(TOKENIZER))
    PackedDataset(even, expect_tokenizer="synthetic/tok")
    other = {**TOKENIZER, "chat_template_sha256": "0" * 64}
    with pytest.raises(ConfigError) as e:
        PackedDataset(even, expect_tokenizer=other)
    assert TOKENIZER["chat_template_sha256"] in str(e.value) and "0" * 64 in str(e.value)
    with pytest.raises(ConfigError, match=r"'synthetic/tok'.*'org/other-tok'"):
        PackedDataset(even, expect_tokenizer="org/other-tok")


def test_budgets_must_match_the_manifest(even):
    assert PackedDataset(even, seq_len=64, max_images=2).seq_len == 64
    with pytest.raises(ConfigError, match=r"seq_len=128.*64"):
        PackedDataset(even, seq_len=128)
    assert PackedDataset(even, max_images=5).max_images == 5  # more slots than the packs need: they stay empty
    with pytest.raises(ConfigError, match=r"max_images=1 .*holds 2 images"):
        PackedDataset(even, max_images=1)


def test_bad_options_are_refused(even):
    with pytest.raises(ConfigError, match="remainder"):
        PackedDataset(even, remainder="pad")
    with pytest.raises(ConfigError, match="on_corrupt"):
        PackedDataset(even, on_corrupt="ignore")
    with pytest.raises(ConfigError, match="rank 2"):
        PackedDataset(even, rank=2, world_size=2)
    with pytest.raises(ConfigError, match="too few"):
        make_loader(even, batch_size=8, num_workers=0, world_size=4, rank=0)
    with pytest.raises(ManifestError, match="does not exist"):
        PackedDataset(even / "nope")


# -- other ways to name the shards -----------------------------------------------------------------


def test_shard_lists_globs_and_brace_patterns_use_the_manifest(even):
    names = [str(even / f"train-{i:06d}.tar") for i in range(4)]
    for source in (names, str(even / "train-*.tar"), str(even / "train-{000000..000003}.tar"),
                   str(even / MANIFEST_NAME)):
        ds = PackedDataset(source, shuffle=False)
        assert ds.manifest is not None and ds.num_packs == 24
        assert _examples(ds) == list(range(24))
    ds = PackedDataset(names[1:3], shuffle=False)
    assert _examples(ds) == list(range(6, 18))


def test_shards_without_a_manifest_are_counted_from_tar_headers(even, tmp_path):
    root = _copy(even, tmp_path / "ds")
    (root / MANIFEST_NAME).unlink()
    with pytest.raises(ConfigError, match="seq_len, max_images, pad_token_id"):
        PackedDataset(str(root / "train-*.tar"))
    ds = PackedDataset(str(root / "train-*.tar"), seq_len=64, max_images=2, pad_token_id=0, shuffle=False)
    assert ds.num_packs == 24 and _examples(ds) == list(range(24))
    with pytest.raises(ConfigError, match="expect_tokenizer needs a manifest"):
        PackedDataset(str(root / "train-*.tar"), seq_len=64, max_images=2, pad_token_id=0, expect_tokenizer="x")


# -- checkpoints -----------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_restore_continues_exactly_mid_shard_and_mid_buffer(uneven, workers):
    kw = dict(batch_size=3, num_workers=workers, seed=11, shuffle_buffer=6, remainder="wrap")
    reference = make_loader(uneven, **kw)
    steps = len(reference)
    full = _batches(reference) + _batches(reference)  # two epochs
    assert len(full) == 2 * steps
    for k in (1, 2, steps - 1, steps, steps + 3):
        first = make_loader(uneven, **kw)
        head = _batches(first, limit=k) if k <= steps else _batches(first) + _batches(first, limit=k - steps)
        state = json.loads(json.dumps(first.state_dict()))  # survives JSON
        if 0 < k % steps:
            assert any(0 < w[1] for w in state["workers"])  # saved mid-lap: the buffer was holding packs
        second = make_loader(uneven, **kw)
        second.load_state_dict(state)
        rest = _batches(second)
        if k < steps:
            rest += _batches(second)
        assert head + rest == full, k


def test_break_and_iterate_again_continues_the_stream(even):
    loader = make_loader(even, batch_size=2, num_workers=2, seed=1, shuffle_buffer=4)
    full = _batches(make_loader(even, batch_size=2, num_workers=2, seed=1, shuffle_buffer=4))
    assert _batches(loader, limit=5) + _batches(loader) == full


def test_restore_in_a_fresh_process(uneven, tmp_path):
    kw = dict(batch_size=2, num_workers=2, seed=5, shuffle_buffer=5)
    loader = make_loader(uneven, **kw)
    full = _batches(loader)
    first = make_loader(uneven, **kw)
    head = _batches(first, limit=4)
    (tmp_path / "state.json").write_text(json.dumps(first.state_dict()))
    script = (
        "import json, sys\n"
        "from tests.support.synthetic import pack_numbers\n"
        "from wdspack.loader import make_loader\n"
        f"loader = make_loader({str(uneven)!r}, **{kw!r})\n"
        f"loader.load_state_dict(json.loads(open({str(tmp_path / 'state.json')!r}).read()))\n"
        "print(json.dumps([pack_numbers(b['input_ids']) for b in loader]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert head + json.loads(out.stdout.strip().splitlines()[-1]) == full


def test_restore_refuses_another_setup(even):
    first = make_loader(even, batch_size=2, num_workers=2, seed=1)
    _batches(first, limit=3)
    state = first.state_dict()
    with pytest.raises(ConfigError, match=r"batch_size: saved 2, now 4"):
        make_loader(even, batch_size=4, num_workers=2, seed=1).load_state_dict(state)
    older = {**state, "config": {k: v for k, v in state["config"].items() if k != "plan"}}  # before plan 2
    with pytest.raises(ConfigError, match=r"plan 1, this one 2.*loader.set_epoch\(1\)"):
        make_loader(even, batch_size=2, num_workers=2, seed=1).load_state_dict(older)
    fewer = make_loader(even, batch_size=2, num_workers=1, seed=1)  # another layout resumes elastically
    fewer.load_state_dict(state)
    assert len(fewer) == len(first) - 3  # the rest of the epoch: 3 batches were read
    with pytest.raises(ConfigError, match=r"seed: saved 1, now 2"):
        make_loader(even, batch_size=2, num_workers=2, seed=2).load_state_dict(state)
    # the location may change: the same shards through a brace pattern resume fine
    moved = make_loader(str(even / "train-{000000..000003}.tar"), batch_size=2, num_workers=2, seed=1)
    moved.load_state_dict(state)


# -- images: decoded in the dataset, normalised straight into the batch ------------------------------


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> Path:
    """48 packs of 0-3 tiny PNG/JPEG images each (M = 3)."""
    root = tmp_path_factory.mktemp("pictures")
    write_dataset(root, shards=4, packs_per_shard=12, max_images=3, seed=5)
    return root


S = 128  # B·M·3·S·S·4 bytes > 1 MiB: pixel_values travels as shared memory, not by value


def _expected_pixels(root: Path) -> dict[int, torch.Tensor]:
    """Pack number → its ``[M, 3, S, S]`` slots, from the dataset alone (no loader, no worker)."""
    ds = PackedDataset(root, shuffle=False, image_transform=make_image_transform(size=S))
    return {pack_numbers(ex["input_ids"])[0]: ex["pixel_values"] for ex in ds}


def _inode(t: torch.Tensor) -> tuple[str, int]:
    """Which memory a batch's pixels are in: a shared-memory segment's inode, or, for a view of a recycled
    buffer the main process keeps mapped (not shared memory of its own), the mapped address."""
    if not t.is_shared():
        return "mapped", t.untyped_storage().data_ptr()
    fd, _ = t.untyped_storage()._share_fd_cpu_()
    return "segment", os.fstat(fd).st_ino


@pytest.mark.parametrize("workers, reuse, options", [
    (0, True, {}), (1, True, {}), (2, True, {}), (1, False, {}), (1, True, {"persistent_workers": False}),
    (1, True, {"multiprocessing_context": "spawn"})])
def test_worker_image_batches_are_exact_and_zero_in_empty_slots(pictures, workers, reuse, options):
    """Every batch equals the transform's own output, slot for slot, and empty slots are zero, also in
    recycled worker buffers (a slot holding an image in one batch and none in a later one)."""
    expected = _expected_pixels(pictures)
    loader = make_loader(pictures, batch_size=2, num_workers=workers, seed=3, reuse_buffers=reuse, pin_memory=False,
                         image_transform=make_image_transform(size=S), **options)
    seen, inodes = [], []
    for _ in range(2):  # two epochs
        for batch in loader:
            numbers = pack_numbers(batch["input_ids"])
            seen += numbers
            pv, mask = batch["pixel_values"], batch["image_mask"]
            assert pv.shape == (2 * 3, 3, S, S) and pv.dtype == torch.float32
            assert torch.equal(pv, torch.cat([expected[n] for n in numbers]))
            assert not pv[~mask].any() and mask.sum() == sum(int(expected[n].flatten(1).any(1).sum()) for n in numbers)
            if workers:
                inodes.append(_inode(pv))
    assert sorted(seen) == sorted(list(range(48)) * 2)
    if workers and reuse:  # recycled: a handful of buffers per worker (and epoch, without persistent workers)
        assert len(set(inodes)) <= 2 * workers * (2 + 3) < len(inodes)
    elif workers:
        assert len(set(inodes)) == len(inodes)


def test_a_batch_kept_by_the_caller_is_never_written_over(pictures):
    loader = make_loader(pictures, batch_size=2, num_workers=1, seed=4, pin_memory=False, prefetch_factor=1,
                         image_transform=make_image_transform(size=S))
    it = iter(loader)
    kept = next(it)
    views = {"whole": kept["pixel_values"], "slot": kept["pixel_values"][1:2]}
    copies = {k: v.clone() for k, v in views.items()}
    del kept
    rest = [b["pixel_values"][0, 0, 0, 0].item() for b in it]  # 23 more batches through a pool of 4
    assert len(rest) == 23
    for k, view in views.items():
        assert torch.equal(view, copies[k]), k


def test_pixel_buffers_reuse_only_what_the_main_process_released():
    from wdspack.loader.batch.buffers import PixelBuffers, _release

    pool = PixelBuffers(workers=2, size=2)
    shape = (4, 3, 2, 2)
    a, dirty, lease = pool.take(shape, worker=1, packs=2)
    assert dirty == [0, 0] and not a.any() and a.is_shared()
    a[0] = 1.0
    pool.ship(lease, [1, 0])
    b, _, lease_b = pool.take(shape, worker=1, packs=2)  # a is still out: another buffer
    assert b.data_ptr() != a.data_ptr()
    pool.ship(lease_b, [0, 0])
    c, _, lease_c = pool.take(shape, worker=1, packs=2)  # both out and the pool is full: a new, unkept one
    assert lease_c is None and c.data_ptr() not in (a.data_ptr(), b.data_ptr())
    _release(pool.released, 1, lease.index, lease.number + 1)  # a stale or foreign number: no reuse
    _release(pool.released, 0, lease.index, lease.number)  # another worker's row: no reuse
    assert pool.take(shape, worker=1, packs=2)[2] is None
    _release(pool.released, 1, lease.index, lease.number)
    again, dirty, lease_again = pool.take(shape, worker=1, packs=2)
    assert again.data_ptr() == a.data_ptr() and dirty == [1, 0] and lease_again.number > lease.number
    assert pool.take(shape, worker=1, packs=2)[2] is None, "leased again: not handed out twice"


def test_a_shipment_unpickles_as_the_batch_and_releases_on_the_last_view():
    """What crosses the worker → main boundary: small tensors by value, big ones as shared memory,
    and the pixel buffer's release only once no view of it is left in the receiving process."""
    import gc
    import pickle
    from multiprocessing.reduction import ForkingPickler

    from wdspack.loader.batch.buffers import PixelBuffers, Shipment

    pool = PixelBuffers(workers=1, size=1)
    pixels, _, lease = pool.take((64, 3, 32, 32), worker=0, packs=4)  # 768 KiB: by value
    big, _, big_lease = PixelBuffers(workers=1, size=1).take((4, 3, 256, 256), worker=0, packs=2)
    pool.ship(lease, [0, 0, 0, 0])
    batch = {"input_ids": torch.arange(6).view(2, 3), "mask": torch.ones(2, 2, dtype=torch.bfloat16), "max_seqlen": 3,
             "pixel_values": pixels}
    got = pickle.loads(ForkingPickler.dumps(Shipment(batch, lease)))
    assert list(got) == list(batch) and got["max_seqlen"] == 3
    assert torch.equal(got["input_ids"], batch["input_ids"]) and not got["input_ids"].is_shared()
    assert got["mask"].dtype == torch.bfloat16 and torch.equal(got["pixel_values"], pixels)
    view = got["pixel_values"][3:5]
    del got
    gc.collect()
    assert int(pool.released[0, 0]) == 0, "a view is still alive"
    del view
    gc.collect()
    assert int(pool.released[0, 0]) == lease.number
    shipped = pickle.loads(ForkingPickler.dumps(Shipment({"pixel_values": big}, big_lease)))
    assert shipped["pixel_values"].is_shared() and torch.equal(shipped["pixel_values"], big)


def test_a_corrupt_image_drops_its_sample_and_names_it(pictures, tmp_path, caplog):
    from wdspack.format.pack import Pack, decode_pack, encode_pack

    root = _copy(pictures, tmp_path / "ds")
    shard = root / "train-000001.tar"
    members = _members(shard)
    k, pack = next((k, p) for k, (m, data) in enumerate(members)
                   if m.name.endswith(".mp") and (p := decode_pack(data, seq_len=64, max_images=3)).num_images)
    bad = Pack(pack.input_ids, pack.loss_mask, pack.seq_lens, pack.sample_ids, (b"not an image",) + pack.images[1:],
               pack.image_sample, pack.image_tokens)
    members[k] = (members[k][0], encode_pack(bad, token_dtype="<u2"))
    _rewrite(shard, members)
    owner = pack.sample_ids[pack.image_sample[0]]
    transform = make_image_transform(size=16)
    with caplog.at_level(logging.WARNING, logger="wdspack.loader"):
        loader = make_loader(root, batch_size=2, num_workers=0, shuffle=False, image_transform=transform)
        seen = [n for batch in loader for n in pack_numbers(batch["input_ids"])]
    # its sample dropped, the pack served with the others (issue #47): every pack once, none twice
    assert len(set(seen)) == len(seen) == 48 and set(range(48)) - {12 + k} <= set(seen)
    assert loader.stats["dropped_samples"] == 1 and loader.stats["corrupt_packs"] == 0
    assert any(f"sample {owner!r}: image 0: cannot read the image header" in r.getMessage() for r in caplog.records)
    with pytest.raises(FormatError, match=f"sample {owner!r}: image 0"):
        list(make_loader(root, batch_size=2, num_workers=1, shuffle=False, on_corrupt="raise",
                         image_transform=transform))


def test_public_names():
    assert {"PackedDataset", "make_loader", "PackedLoader"} <= set(loader_mod.__all__)
    for name in loader_mod.__all__:
        assert getattr(loader_mod, name) is not None
    assert read_manifest  # the manifest module is what the loader reads


def test_mistakes_in_the_source_and_keywords_name_the_fix(tmp_path, even):
    """A data file before packing, two datasets without weights, a misspelled keyword (issue #38, item 6)."""
    (tmp_path / "llava.jsonl").write_text('{"id": 1}\n')
    (tmp_path / "llava.json").write_text('[{"id": 1}]')
    with pytest.raises(ConfigError, match=r"llava\.jsonl is a data file, not a packed dataset: pack it first"):
        make_loader(str(tmp_path / "llava.jsonl"), batch_size=2)
    with pytest.raises(ConfigError, match=r"llava\.json is not a packed dataset .*reads as a data file: pack it first"):
        make_loader(str(tmp_path / "llava.json"), batch_size=2)
    with pytest.raises(ConfigError, match=r"a list of 2 datasets, not of shards.*\(path, weight\) pairs.*, 1\)\]"):
        make_loader([str(even), str(tmp_path)], batch_size=2)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'batchsize': did you mean batch_size=\?"):
        make_loader(str(even), batchsize=2)
    with pytest.raises(TypeError, match=r"'procesor': did you mean processor=\?"):
        make_loader(str(even), batch_size=2, procesor="qwen/")


# -- the processor a dataset was packed with (issue #38, item 6) -------------------------------------

@pytest.fixture(scope="module")
def qwen_packed(tmp_path_factory):
    """Chats packed with the real Qwen2.5-VL processor class (``examples/tiny_vlm``), as
    tests/models/test_processor_mode.py builds it."""
    from tests.support import vlm_harness as h
    from tiny_vlm import qwen2_5_vl

    folder = tmp_path_factory.mktemp("qwen-packed")
    processor = qwen2_5_vl.processor(folder / "tok")
    return processor, folder, h.pack_chats(folder, processor, seq_len=96)


def _other_processors(processor, folder):
    """Processors of the same family that the dataset was *not* packed with, by what differs."""
    import copy

    from transformers import Qwen2VLImageProcessor

    from tiny_vlm import qwen2_5_vl
    from wdspack.models import assemble_processor

    def with_images(**kwargs):
        options = {"min_pixels": 4 * 28 * 28, "max_pixels": 64 * 28 * 28, **kwargs}  # qwen2_5_vl.processor's
        return assemble_processor("Qwen2_5_VLProcessor", image_processor=Qwen2VLImageProcessor(**options),
                                  tokenizer=processor.tokenizer, chat_template=processor.chat_template)

    video = copy.copy(processor)  # its image token another special token of the same tokenizer
    video.image_token = "<|video_pad|>"
    video.image_token_id = processor.tokenizer.convert_tokens_to_ids(video.image_token)
    return {
        "min pixels": (with_images(min_pixels=16 * 28 * 28), "another patch size, merge size or min/max pixels"),
        "patch size": (with_images(patch_size=16), "another patch size"),
        "merge size": (with_images(merge_size=1), "merge size"),
        "image token": (video, "image_token: packed '<|image_pad|>', given '<|video_pad|>'"),
        "family": (qwen2_5_vl.processor(folder / "tok", cls="Qwen2VLProcessor"), "packed with a qwen2_5_vl processor"),
    }


@pytest.mark.slow  # Qwen2.5-VL's processor
def test_a_processor_unlike_the_packing_one_is_refused_when_the_loader_is_built(qwen_packed):
    """Another image processor setting, other token ids or another family: one line from make_loader,
    naming both processors and the fix, before any worker starts; the packing processor still loads."""
    processor, folder, dataset = qwen_packed
    packed_name = str(folder / "processor")
    for what, (other, says) in _other_processors(processor, folder).items():
        with pytest.raises(ConfigError) as e:
            make_loader(str(dataset), batch_size=1, num_workers=1, processor=other)
        text = str(e.value)
        assert says in text and "\n" not in text, (what, text)
        assert repr(packed_name) in text and type(other).__name__ in text, (what, text)
    batch = next(iter(make_loader(str(dataset), batch_size=1, num_workers=0, processor=processor)))
    assert batch["image_grid_thw"].shape[0] == 4 and batch["input_ids"].shape == (1, 96)


@pytest.mark.slow  # Qwen2.5-VL's processor
def test_a_processor_packed_dataset_with_the_built_in_transform_is_refused(qwen_packed, even):
    """The reverse: pixels resized to a square for a dataset whose image tokens a processor laid out."""
    _, folder, dataset = qwen_packed
    with pytest.raises(ConfigError) as e:
        make_loader(str(dataset), batch_size=1, num_workers=1, image_transform=make_image_transform(size=28))
    assert f"processor={str(folder / 'processor')!r} instead of image_transform=" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"tokenizer 'synthetic/tok' .*image_token: packed '<image>', given '<\|ima"):
        make_loader(str(even), batch_size=1, num_workers=1, processor=qwen_packed[0])
