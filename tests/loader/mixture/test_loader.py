"""The loader over a mixture (issue #21, DESIGN.md section 8): make_loader / PackedDataset read several
packed datasets as one stream in the schedule's order, every batch names its packs' sources, the
stream resumes exactly, and per-source losses come from the token losses.

Three small synthetic datasets (tests/support/synthetic.py): every pack's first token is 1000 + its row in
its dataset, so a batch tells which pack of which source each row is."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from tests.support.synthetic import MIXTURE_COUNTS, pack_numbers, write_dataset, write_mixture_sources
from wdspack.errors import ConfigError
from wdspack.format.pack_index import COLUMNS, INDEX_NAME
from wdspack.loader import Mixture, MixtureSource, PackedDataset, make_loader
from wdspack.train.loss import token_losses
from wdspack.train.mixture import per_source_losses

COUNTS = MIXTURE_COUNTS
WEIGHTS = {"a": 0.5, "b": 0.3, "c": 0.2}
OPTIONS = dict(batch_size=2, shuffle_buffer=9, seed=3, text_only=True)


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    return write_mixture_sources(tmp_path_factory.mktemp("mixture"), COUNTS)


def _mix(roots, weights=WEIGHTS):
    return [(str(roots / name), w) for name, w in weights.items()]


def _rows(loader, n=None) -> list[tuple[int, int]]:
    """(source, pack row) of every pack, in order; at most ``n`` batches."""
    out: list[tuple[int, int]] = []
    for k, batch in enumerate(loader):
        out += list(zip(batch["source_idx"].tolist(), pack_numbers(batch["input_ids"])))
        if n is not None and k + 1 == n:
            break
    return out


def _schedule(loader, *, slot=0, slots=1, workers=1, epoch=0):
    """Slot ``slot`` (``rank * workers + worker``) of ``slots`` (``ranks * workers``): its plan of ``epoch``."""
    ds = loader.dataset
    return ds.mixture.schedule(slot=slot, slots=slots, workers=workers, epoch=epoch,
                               positions=ds.mixture.per_slot(slots, 2), batch_size=2, seed=ds.seed, shuffle=True,
                               shuffle_buffer=ds.shuffle_buffer)


def _round_robin(plans, batch=2) -> list[tuple[int, int]]:
    """The rank's stream as a DataLoader yields it: worker 0's first batch, worker 1's, ..., then the next."""
    return [(int(p.source[i]), int(p.row[i])) for b in range(len(plans[0].source) // batch) for p in plans
            for i in range(b * batch, (b + 1) * batch)]


def _within_a_pack(got, units, what):
    """Each source's share of the tokens of ``got`` is within one pack's tokens of its weight (schedule.py)."""
    given = np.zeros(3)
    for s, r in got:
        given[s] += units["abc"[s]][r]
    share = given / given.sum()
    most = max(int(u.max()) for u in units.values())
    for i, w in enumerate(WEIGHTS.values()):
        assert abs(share[i] - w) <= most / given.sum(), (share, what)


def _units(roots) -> dict[str, np.ndarray]:
    return {name: np.load(roots / name / INDEX_NAME)[:, COLUMNS.index("tokens")] for name in COUNTS}


def test_the_stream_is_the_schedule_and_keeps_the_token_shares(roots):
    loader = make_loader(_mix(roots), num_workers=0, **OPTIONS)
    assert loader.source_names == ("a", "b", "c") and loader.dataset.max_images == 2
    units = _units(roots)
    for epoch in range(2):
        got = _rows(loader)
        plan = _schedule(loader, epoch=epoch)
        assert [s for s, _ in got] == plan.source.tolist()
        assert [r for _, r in got] == plan.row.tolist()  # each source's own packs, in the schedule's order
        assert len(got) == len(loader) * 2
        _within_a_pack(got, units, epoch)


@pytest.mark.parametrize("workers", [0, 2])
def test_every_pack_of_a_pass_is_read_once_over_the_slots(roots, workers):
    """Two ranks, three epochs: per source, each completed pass gives every pack exactly once over
    both ranks (and, with workers, over their workers), and an unfinished one none twice."""
    ranks, epochs, w = 2, 3, max(workers, 1)
    seen: dict[tuple[int, int], list[int]] = {}
    ends = []
    for rank in range(ranks):
        loader = make_loader(_mix(roots), num_workers=workers, rank=rank, world_size=ranks, **OPTIONS)
        for epoch in range(epochs):
            got = _rows(loader)
            plans = [_schedule(loader, slot=rank * w + v, slots=ranks * w, workers=w, epoch=epoch) for v in range(w)]
            assert got == _round_robin(plans)
            passes = [int(p.pass_no[i]) for b in range(len(plans[0].source) // 2) for p in plans
                      for i in (2 * b, 2 * b + 1)]
            for (s, r), p in zip(got, passes):
                seen.setdefault((s, p), []).append(r)
            assert len({p.end for p in plans}) == 1  # the cursors are the rank's
        ends.append(plans[0].end)
    def finished(cursor, p):  # every pack of pass p handed out, and no block of it held unfinished
        return cursor.pass_no > p and all(q != p for _, q, *_ in cursor.held)

    for (s, p), rows in seen.items():
        done = all(finished(end[s], p) for end in ends)
        total = sum(COUNTS["abc"[s]])
        if done:
            assert sorted(rows) == list(range(total)), (s, p)
        else:
            assert len(rows) == len(set(rows)) < total, (s, p)
    assert any(all(finished(end[s], 1) for end in ends) for s in range(3))  # some source made two whole passes


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")  # a 2-core machine
def test_same_seed_same_stream_and_workers_share_the_rank_merge(roots):
    """Same seed, same stream. With W DataLoader workers the rank's stream is the round robin of its
    workers' schedules (plan_slot with workers=W: one merge over the rank's batches in that order), no
    pack is read by two workers of the rank, and the rank's token shares stay within a pack of the
    weights, as with one worker."""
    first = _rows(make_loader(_mix(roots), num_workers=0, **OPTIONS))
    assert first == _rows(make_loader(_mix(roots), num_workers=0, **OPTIONS))
    assert first != _rows(make_loader(_mix(roots), num_workers=0, **{**OPTIONS, "seed": 4}))

    units = _units(roots)
    for workers in (2, 3):
        loader = make_loader(_mix(roots), num_workers=workers, **OPTIONS)
        for epoch in range(2):
            got = _rows(loader)
            plans = [_schedule(loader, slot=w, slots=workers, workers=workers, epoch=epoch) for w in range(workers)]
            assert got == _round_robin(plans) and len(got) == len(loader) * 2, (workers, epoch)
            assert {len(p.source) for p in plans} == {loader.dataset.packs_per_slot(workers)}
            read: dict[tuple[int, int, int, int], int] = {}  # (source, pass, shard, pack) -> the worker reading it
            for w, p in enumerate(plans):
                for r in p.reads:
                    for pack in range(r.start, r.stop):
                        assert read.setdefault((r.source, r.pass_no, r.shard, pack), w) == w, (workers, epoch, r)
            for w, p in enumerate(plans):  # each worker's packs lie in its own reads
                for s, q, shard, pack in zip(p.source.tolist(), p.pass_no.tolist(), p.shard.tolist(),
                                             p.pack.tolist()):
                    assert read[s, q, shard, pack] == w
            _within_a_pack(got, units, (workers, epoch))


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_is_exact(roots, workers):
    def loader():
        return make_loader(_mix(roots), num_workers=workers, **OPTIONS)

    whole = loader()
    full = _rows(whole) + _rows(whole, 5)  # into the second epoch
    first = loader()
    head = _rows(first, 7)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + _rows(resumed) + _rows(resumed, 5) == full

    # other weights: a new continuation (tests/loader/mixture/test_continuation.py), which keeps the epoch's length
    reweighted = make_loader(_mix(roots, {"a": 0.2, "b": 0.3, "c": 0.5}), num_workers=workers, **OPTIONS)
    reweighted.load_state_dict(state)
    assert len(_rows(reweighted)) == len(full) - 5 * 2 - len(head)  # the rest of epoch 0
    other = make_loader(_mix(roots), num_workers=workers, rank=1, world_size=2, **OPTIONS)
    other.load_state_dict(state)  # another number of ranks: tests/loader/mixture/test_elastic.py
    continued = json.loads(json.dumps(reweighted.state_dict()))  # another mixture and another number of ranks
    with pytest.raises(ConfigError, match="two checkpoints"):
        other.load_state_dict(continued)
    single = make_loader(roots / "a", num_workers=workers, **OPTIONS)
    with pytest.raises(ConfigError, match="mixture"):
        single.load_state_dict(state)


def test_a_yaml_file_with_relative_paths(roots, tmp_path):
    folder = tmp_path / "mixtures"
    folder.mkdir()
    rel = folder / "stage1.yaml"
    rel.write_text("unit: tokens\nsources:\n" + "".join(
        f"  - {{path: {os.path.relpath(roots / name, folder)}, weight: {w}}}\n" for name, w in WEIGHTS.items()))
    assert "../" in rel.read_text()
    from_file = make_loader(str(rel), num_workers=0, **OPTIONS)
    assert from_file.source_names == ("a", "b", "c")
    assert _rows(from_file) == _rows(make_loader(_mix(roots), num_workers=0, **OPTIONS))
    as_record = Mixture([MixtureSource(str(roots / n), w) for n, w in WEIGHTS.items()])
    ds = PackedDataset(as_record, **{**OPTIONS, "batch_size": 1})
    assert ds.source_names == ("a", "b", "c") and ds.packs_per_slot() == ds.mixture.per_slot(1, 1)


def test_incompatible_or_unindexed_sources_are_refused(roots, tmp_path):
    write_dataset(tmp_path / "short", shards=1, packs_per_shard=6, seq_len=32, max_images=0, seed=1,
                  pack_index=True)
    with pytest.raises(ConfigError, match=r"mixture source 'short' has seq_len 32 .*`wdspack reshard"):
        make_loader([(str(roots / "a"), 1), (str(tmp_path / "short"), 1)], num_workers=0, **OPTIONS)
    write_dataset(tmp_path / "old", shards=1, packs_per_shard=6, seq_len=64, max_images=0, seed=1)
    with pytest.raises(ConfigError, match=r"'old' .* no pack index .*`wdspack index"):
        make_loader([(str(roots / "a"), 1), (str(tmp_path / "old"), 1)], num_workers=0, **OPTIONS)
    # a mixture balances (tests/loader/mixture/test_balance.py), with a window of a batch at least
    with pytest.raises(ConfigError, match=r"balance window \(1 packs\) must be >= batch_size"):
        make_loader(_mix(roots), num_workers=0, balance={"window": 1}, **OPTIONS)


def test_single_dataset_batches_carry_source_zero(roots):
    loader = make_loader(roots / "b", num_workers=0, **OPTIONS)
    assert loader.source_names == ("b",)
    batches = list(loader)
    assert all(b["source_idx"].dtype == torch.int64 and b["source_idx"].tolist() == [0, 0] for b in batches)
    assert "mixture" not in loader.state_dict()["config"]  # a single dataset's checkpoint is unchanged


def test_per_source_losses_padded_and_padding_free(roots):
    names = ("a", "b", "c")
    padded = next(iter(make_loader(_mix(roots), num_workers=0, **{**OPTIONS, "batch_size": 4})))
    flat = next(iter(make_loader(_mix(roots), num_workers=0, padding_free=True, **{**OPTIONS, "batch_size": 4})))

    def fake_losses(batch):  # the loss of a target is the token it predicts
        after = batch["labels"][:, 1:]
        return torch.nn.functional.pad(torch.where(after >= 0, after.float(), torch.zeros(())), (0, 1))

    got = per_source_losses(fake_losses(padded), padded, names)
    want_sum, want_n = np.zeros(3), np.zeros(3, np.int64)
    for row, s in zip(padded["labels"], padded["source_idx"].tolist()):
        targets = row[row >= 0]
        want_sum[s] += float(targets.float().sum())
        want_n[s] += len(targets)
    assert [int(n) for _, n in got.values()] == want_n.tolist() and want_n.sum() == int(padded["num_targets"].sum())
    assert np.allclose([float(x) for x, _ in got.values()], want_sum)
    free = per_source_losses(fake_losses(flat), flat, names)
    assert {k: (float(x), int(n)) for k, (x, n) in free.items()} == {k: (float(x), int(n)) for k, (x, n) in got.items()}
    logits = torch.randn(*padded["labels"].shape, 1100, requires_grad=True)
    losses = token_losses(logits, padded["labels"])
    parts = per_source_losses(losses, padded, names)
    assert torch.allclose(sum(x for x, _ in parts.values()), losses.sum())
    sum(x for x, _ in parts.values()).backward()  # in the graph: a source's loss can be weighted
    assert logits.grad is not None
