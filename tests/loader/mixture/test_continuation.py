"""Mixture continuations (issue #21, item 5; DESIGN.md section 8): a loader state saved under one mixture
continues under another (new weights, a source added, a source removed, matched by name), each kept
source's pass going on where it stopped: nothing within a pass read twice or skipped, the epoch's
length kept on every rank, and a state saved inside a continuation resumes exactly.

Three small synthetic datasets (tests/support/synthetic.py): every pack's first token is 1000 + its row in
its dataset, so a batch tells which pack of which source each row is; the pass of each pack comes
from the schedule the loader follows (checked against the batches)."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from tests.support.mixture import COUNTS, M1, OPTIONS, check_passes, mixture_loader, read_batches, with_passes
from tests.support.synthetic import write_dataset, write_mixture_sources
from wdspack.errors import ConfigError
from wdspack.format.pack_index import COLUMNS, INDEX_NAME
from wdspack.loader import Mixture, MixtureSource, make_loader


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    return write_mixture_sources(tmp_path_factory.mktemp("continuations"), COUNTS)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("change", ["weights", "added", "removed"])
def test_a_new_mixture_continues_every_pass_where_it_stopped(roots, workers, change):
    before = {"weights": M1, "added": {"a": 0.6, "b": 0.4}, "removed": M1}[change]
    after = {"weights": {"a": 0.2, "b": 0.3, "c": 0.5}, "added": M1, "removed": {"a": 0.5, "c": 0.5}}[change]
    world, stop = 2, 5
    packs = []
    for rank in range(world):
        first = mixture_loader(roots, before, workers=workers, rank=rank, world=world)
        length = len(first)
        head = read_batches(first) + read_batches(first, stop)  # into the second epoch
        head_packs = with_passes(first, head)
        state = json.loads(json.dumps(first.state_dict()))
        second = mixture_loader(roots, after, workers=workers, rank=rank, world=world)
        second.load_state_dict(state)
        assert second.epoch == 1 and len(second) == length  # the epoch keeps its length on every rank
        rest = read_batches(second)
        assert [t for _, t, _ in rest] == list(range(stop, length))
        later = read_batches(second)  # the next epoch: the new mixture's own length
        assert len(later) == len(second) == len(mixture_loader(roots, after, workers=workers, rank=rank, world=world))
        tail = with_passes(second, rest + later)
        if change == "removed":
            assert all(s != "b" for s, _, _ in tail)
        if change == "added":
            assert any(s == "c" for s, _, _ in tail)
        packs += head_packs + tail
    check_passes(packs)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_saved_inside_a_continuation_resumes_exactly(roots, workers):
    first = mixture_loader(roots, M1, workers=workers)
    read_batches(first, 3)
    state = json.loads(json.dumps(first.state_dict()))
    after = {"a": 0.2, "c": 0.8}

    def continued():
        loader = mixture_loader(roots, after, workers=workers)
        loader.load_state_dict(state)
        return loader

    whole = continued()
    full = read_batches(whole) + read_batches(whole)
    part = continued()
    head = read_batches(part, 2)
    mid = json.loads(json.dumps(part.state_dict()))
    assert mid["mixture"]["stage"]["names"] == ["a", "c"]  # the key states keep it under
    resumed = mixture_loader(roots, after, workers=workers)
    resumed.load_state_dict(mid)
    assert head + read_batches(resumed) + read_batches(resumed) == full
    # and a state saved in the epoch after the continuation resumes from its anchor, exactly
    later = continued()
    got = read_batches(later) + read_batches(later, 3)
    anchored = mixture_loader(roots, after, workers=workers)
    anchored.load_state_dict(json.loads(json.dumps(later.state_dict())))
    assert got + read_batches(anchored) == full


def test_same_mixture_resume_keeps_its_stream(roots):
    whole = mixture_loader(roots, M1, workers=2)
    full = read_batches(whole) + read_batches(whole) + read_batches(whole)
    first = mixture_loader(roots, M1, workers=2)
    head = read_batches(first) + read_batches(first) + read_batches(first, 3)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["mixture"]["start"] is not None and state["mixture"]["stage"] is None
    resumed = mixture_loader(roots, M1, workers=2)
    resumed.load_state_dict(state)
    assert resumed.dataset.mixture.continuation().epoch == 2  # an anchor: the workers do not replan epochs 0 and 1
    assert head + read_batches(resumed) == full


@pytest.mark.parametrize(("world", "was", "now", "stop"), [(1, 2, 3, 5), (2, 1, 2, 3), (1, 3, 0, 4)])
def test_another_number_of_workers_continues_every_pass(roots, world, was, now, stop):
    """Elastic in workers (ranks kept): each rank's cursors resume under the new workers; the rank's
    batches left in the epoch are dealt over them; every rank the same number of batches."""
    after = {"a": 0.4, "b": 0.4, "c": 0.2}  # with new weights too, for the 2-rank case
    packs, left = [], set()
    for rank in range(world):
        first = mixture_loader(roots, M1, workers=was, rank=rank, world=world)
        length = len(first)
        head = read_batches(first) + read_batches(first, stop)
        head_packs = with_passes(first, head)
        state = json.loads(json.dumps(first.state_dict()))
        second = mixture_loader(roots, after if world == 2 else M1, workers=now, rank=rank, world=world)
        second.load_state_dict(state)
        rest = read_batches(second)
        assert len(rest) == length - stop
        left.add(len(rest))
        later = read_batches(second)
        assert len(later) == len(second) == len(mixture_loader(roots, M1, workers=now, rank=rank, world=world))
        packs += head_packs + with_passes(second, rest + later)
    assert len(left) == 1
    check_passes(packs)


def _scheduled(roots, every=5):
    return Mixture((MixtureSource(str(roots / "a"), 1), MixtureSource(str(roots / "b"), 1)),
                   schedule=((0, {"a": 0.8, "b": 0.2}), (30, {"a": 0.2, "b": 0.8})), every=every)


@pytest.mark.parametrize("workers", [0, 2])
def test_weights_following_a_schedule(roots, workers):
    """Piecewise-linear weights over steps, in segments of ``every`` steps each planned with the weights
    at its middle step from where the one before ended: each segment's token share is within a pack
    of them, passes still read once, and a resume mid-schedule is exact."""
    mix = _scheduled(roots)
    tokens = {n: np.load(roots / n / INDEX_NAME)[:, COLUMNS.index("tokens")] for n in ("a", "b")}
    loader = make_loader(mix, num_workers=workers, **OPTIONS)
    per_epoch = len(loader)
    got = read_batches(loader) + read_batches(loader)
    most = max(int(t.max()) for t in tokens.values())
    segments: dict[tuple[int, int], list[tuple[str, int]]] = defaultdict(list)
    for e, t, rows in got:  # segments restart at every epoch's start
        segments[e, t // 5] += rows
    shares = []
    for (e, k), rows in sorted(segments.items()):
        t0, t1 = 5 * k, min(5 * k + 5, per_epoch)
        units = {n: sum(int(tokens[n][r]) for s, r in rows if s == n) for n in ("a", "b")}
        total = units["a"] + units["b"]
        want = mix.shares_at(e * per_epoch + (t0 + t1) / 2)[0]  # the weights at the segment's middle step
        assert abs(units["a"] / total - want) <= 1.5 * most / total, (e, k, units, want)
        shares.append(units["a"] / total)
    assert shares[0] > 0.6 and shares[-1] < 0.4  # the schedule moves the mix from a to b
    check_passes(with_passes(make_loader(mix, num_workers=workers, **OPTIONS), got[:per_epoch]), ("a", "b"))

    first = make_loader(mix, num_workers=workers, **OPTIONS)
    head = read_batches(first, 7)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["config"]["mixture"]["schedule"][1] == [30, [0.2, 0.8]]
    resumed = make_loader(mix, num_workers=workers, **OPTIONS)
    resumed.load_state_dict(state)
    assert head + read_batches(resumed) + read_batches(resumed) == got


def test_a_schedule_from_a_file(roots, tmp_path):
    path = tmp_path / "mix.yaml"
    path.write_text(f"sources:\n  - {{path: {roots / 'a'}, weight: 1}}\n  - {{path: {roots / 'b'}, weight: 1}}\n"
                    "every: 5\nschedule:\n  - {step: 0, weights: {a: 0.8, b: 0.2}}\n"
                    "  - {step: 30, weights: {a: 0.2, b: 0.8}}\n")
    assert Mixture.of(str(path)) == _scheduled(roots)
    with pytest.raises(ConfigError, match="give every source"):
        Mixture((MixtureSource("a/", 1), MixtureSource("b/", 1)), schedule=((0, {"a": 1}),))


def test_the_refusals_that_remain_say_what_to_do(roots, tmp_path):
    first = mixture_loader(roots, M1, workers=0)
    read_batches(first, 3)
    state = json.loads(json.dumps(first.state_dict()))
    other_ranks = mixture_loader(roots, M1, workers=0, rank=0, world=2)
    other_ranks.load_state_dict(state)  # one rank of one: exactly recoverable (tests/loader/mixture/test_elastic.py)
    assert other_ranks.dataset.mixture.continuation().rest["old_ranks"] == 1
    continued = mixture_loader(roots, {"a": 1, "c": 1}, workers=0)
    continued.load_state_dict(state)
    with pytest.raises(ConfigError, match=r"a resume began inside it.*set_epoch\(1\)"):
        continued.set_epoch(0)
    old = {k: v for k, v in state.items() if k != "mixture"}  # a state saved before continuations
    with pytest.raises(ConfigError, match=r"no per-source cursors.*set_epoch"):
        mixture_loader(roots, {"a": 1, "b": 1}, workers=0).load_state_dict(old)
    # a kept name over other data: its cursor would mean other packs
    write_dataset(tmp_path / "b", shards=1, packs_per_shard=6, seq_len=64, max_images=0, seed=5, pack_index=True)
    changed = make_loader([(str(roots / "a"), 1), (str(tmp_path / "b"), 1)], num_workers=0, **OPTIONS)
    with pytest.raises(ConfigError, match=r"mixture source 'b' had 13 packs .*another name"):
        changed.load_state_dict(state)
