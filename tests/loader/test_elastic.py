"""Elastic resume: a checkpoint of W ranks × K workers continues on W' ranks × K' workers.

The rest of the saved epoch, every pack the old layout had not read yet, is split over the new
layout: nothing read twice, nothing lost (with ``remainder="drop"`` fewer than slots × batch of
the rest are left out, as at any epoch's end; with ``"wrap"`` none), every new rank the same
number of batches, and the next epochs exactly those of the new layout. Checkpoints are taken in
the middle of shards and of shuffle buffers; the saved ranks are real DataLoader worker processes.
"""

from __future__ import annotations

import json

import pytest

from tests.support.synthetic import pack_numbers, write_dataset
from wdspack.errors import ConfigError
from wdspack.loader import make_loader

COUNTS = [23, 17, 30, 11, 25]  # 106 packs, uneven shards
OPTIONS = dict(batch_size=2, seed=4, shuffle_buffer=5)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    folder = tmp_path_factory.mktemp("elastic-ds")
    write_dataset(folder, shards=len(COUNTS), packs_per_shard=COUNTS, seed=2)
    return folder


def _loader(root, rank, world, workers, **kw):
    return make_loader(root, rank=rank, world_size=world, num_workers=workers, **{**OPTIONS, **kw})


def _take(loader, n=None) -> list[int]:
    out = []
    for k, batch in enumerate(loader, 1):
        out.extend(pack_numbers(row)[0] for row in batch["input_ids"])
        if n is not None and k == n:
            break
    return out


def _epoch_set(root, world, workers, **kw) -> set[int]:
    return {p for r in range(world) for p in _take(_loader(root, r, world, workers, **kw))}


@pytest.mark.parametrize("remainder", ["drop", "wrap"])
@pytest.mark.parametrize("old,new,steps", [((2, 2), (3, 2), 7), ((3, 2), (2, 1), 5), ((2, 2), (2, 1), 9)])
def test_the_rest_of_the_epoch_is_read_once_on_the_new_layout(root, remainder, old, new, steps):
    (w0, k0), (w1, k1) = old, new
    kw = {"remainder": remainder}
    planned = _epoch_set(root, w0, k0, **kw)  # what the old layout reads in epoch 0
    read, states = [], []
    for r in range(w0):
        loader = _loader(root, r, w0, k0, **kw)
        read += _take(loader, steps)
        states.append(json.loads(json.dumps(loader.state_dict())))
    assert len(read) == len(set(read)) == w0 * steps * 2

    rest, lengths, follow = [], set(), []
    for r in range(w1):
        loader = _loader(root, r, w1, k1, **kw)
        loader.load_state_dict(states)
        n = len(loader)
        lengths.add(n)
        got = _take(loader)
        assert len(got) == n * 2 and loader.epoch == 1
        rest += got
        follow.append(_take(loader, 4))
    assert len(lengths) == 1, "every new rank gets the same number of batches"
    assert not set(rest) & set(read), "nothing the old layout read is read again"
    repeated = len(rest) - len(set(rest))  # "wrap" tops the slots up from their own packs, as in any epoch
    assert repeated == 0 if remainder == "drop" else repeated < w1 * max(1, k1) * 2
    left_out = planned - set(read) - set(rest)
    if remainder == "wrap":
        assert set(read) | set(rest) == set(range(sum(COUNTS))) and not left_out
    else:
        assert set(rest) <= planned - set(read) and len(left_out) < w1 * max(1, k1) * 2
    fresh = []
    for r in range(w1):
        loader = _loader(root, r, w1, k1, **kw)
        loader.set_epoch(1)
        fresh.append(_take(loader, 4))
    assert follow == fresh, "the next epoch is the new layout's own"

    if remainder == "drop":  # one rank's state alone gives the same rest when nothing was skipped
        alone = _loader(root, 0, w1, k1, **kw)
        alone.load_state_dict(states[-1])
        again = _loader(root, 0, w1, k1, **kw)
        again.load_state_dict(states)
        assert _take(alone) == _take(again)


def test_a_checkpoint_inside_the_elastic_rest_resumes_exactly_and_elastically_again(root):
    states = []
    for r in range(2):
        loader = _loader(root, r, 2, 2)
        _take(loader, 6)
        states.append(loader.state_dict())
    whole = _loader(root, 1, 3, 1)
    whole.load_state_dict(states)
    full = _take(whole) + _take(whole, 3)

    part = _loader(root, 1, 3, 1)
    part.load_state_dict(states)
    head = _take(part, 4)
    mid = json.loads(json.dumps(part.state_dict()))
    assert mid["elastic"]["basis"]["world_size"] == 2
    same = _loader(root, 1, 3, 1)
    same.load_state_dict(mid)
    assert head + _take(same) + _take(same, 3) == full

    # and from inside that rest to yet another layout: 3 ranks → 1, still nothing twice
    mids, seen = [], []
    for r in range(3):
        loader = _loader(root, r, 3, 1)
        loader.load_state_dict(states)
        seen += _take(loader, 2)
        mids.append(loader.state_dict())
    one = _loader(root, 0, 1, 0)
    one.load_state_dict(mids)
    last = _take(one)
    before = []
    for r in range(2):
        before += _take(_loader(root, r, 2, 2), 6)
    parts = before + seen + last
    assert len(parts) == len(set(parts)), "nothing read twice across three layouts"
    assert len(_epoch_set(root, 2, 2) - set(parts)) < 2, "at most one batch's worth left out (drop)"


def test_refusals(root):
    a = _loader(root, 0, 2, 1)
    _take(a, 2)
    b = _loader(root, 1, 2, 1)
    _take(b, 3)
    with pytest.raises(ConfigError, match="disagree on the epoch, batches"):
        _loader(root, 0, 3, 1).load_state_dict([a.state_dict(), b.state_dict()])
    with pytest.raises(ConfigError, match="seed: saved 4, now 5"):
        _loader(root, 0, 3, 1, seed=5).load_state_dict(a.state_dict())
    c = _loader(root, 0, 2, 1)
    _take(c, 2)
    with pytest.raises(ConfigError, match=r"ranks \[0\] of a 2-rank run"):
        _loader(root, 0, 3, 1).load_state_dict([a.state_dict(), c.state_dict()])
