"""Elastic resume of a mixture under another number of ranks (issue #21, item 4; DESIGN.md section 8):
the states of all the saved ranks say which packs of each source's unfinished passes were consumed;
the new ranks read the rest of those passes, split over them, then the following passes as usual.
Over the resumed run nothing within a pass is read twice or skipped, every new rank makes as many
batches, and the stream is deterministic. Ranks are simulated in-process, as in
tests/loader/mixture/test_continuation.py."""

from __future__ import annotations

import json

import pytest

from tests.support.mixture import M1, check_passes, mixture_loader, read_batches, with_passes
from tests.support.synthetic import write_mixture_sources
from wdspack.errors import ConfigError


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    return write_mixture_sources(tmp_path_factory.mktemp("elastic"))


def _saved(roots, *, world, workers, epochs, stop, weights=M1):
    """Every rank of a ``world``-rank run after ``epochs`` whole epochs and ``stop`` batches: its packs as
    (source, pass, row) and its state."""
    packs, states = [], []
    for rank in range(world):
        loader = mixture_loader(roots, weights, workers=workers, rank=rank, world=world)
        got = [b for _ in range(epochs) for b in read_batches(loader)] + (read_batches(loader, stop) if stop else [])
        packs += with_passes(loader, got)
        states.append(json.loads(json.dumps(loader.state_dict())))
    return packs, states


def _resumed(roots, states, *, world, workers, epochs=1, weights=M1):
    """Every rank of the new layout, resumed from ``states``: the rest of the epoch's batches per rank and
    the packs of that rest and ``epochs`` more epochs, as (source, pass, row), and the raw batches."""
    lengths, packs, raw = [], [], []
    for rank in range(world):
        loader = mixture_loader(roots, weights, workers=workers, rank=rank, world=world)
        loader.load_state_dict(states)
        rest = read_batches(loader)
        lengths.append(len(rest))
        later = [b for _ in range(epochs) for b in read_batches(loader)]
        packs += with_passes(loader, rest + later)
        raw.append(rest + later)
    return lengths, packs, raw


@pytest.mark.parametrize(("world", "workers", "new_world", "new_workers", "epochs", "stop"),
                         [(2, 2, 3, 1, 0, 3), (4, 0, 2, 0, 1, 1), (2, 0, 3, 2, 1, 2), (3, 1, 2, 2, 0, 0)])
def test_a_mixture_resumes_on_another_number_of_ranks(roots, world, workers, new_world, new_workers, epochs, stop):
    before, states = _saved(roots, world=world, workers=workers, epochs=epochs, stop=stop)
    length = len(mixture_loader(roots, M1, workers=workers, rank=0, world=world))
    lengths, after, raw = _resumed(roots, states, world=new_world, workers=new_workers, epochs=2)
    assert len(set(lengths)) == 1  # every new rank as many batches
    if stop:  # the saved ranks' batches left, shared out, rounded up
        assert lengths[0] == -(-world * (length - stop) // new_world)
    else:  # at an epoch's start: the new layout's own epoch
        assert lengths[0] == len(mixture_loader(roots, M1, workers=new_workers, rank=0, world=new_world))
    check_passes(before + after)  # nothing within a pass twice; every pass but a source's last two whole
    seen: dict[tuple[str, int], set[int]] = {}
    for s, p, r in before + after:
        seen.setdefault((s, p), set()).add(r)
    for (s, p) in {(s, p) for s, p, _ in before}:  # the passes the saved ranks had begun end whole
        if any(q > p + 1 for t, q in seen if t == s):
            assert len(seen[s, p]) == {"a": 18, "b": 13, "c": 12}[s], (s, p)
    # deterministic: resumed again from the same states, the same batches
    assert _resumed(roots, states, world=new_world, workers=new_workers)[2] == [r[:len(x)] for r, x in zip(
        raw, _resumed(roots, states, world=new_world, workers=new_workers)[2])]


def test_one_state_alone_is_enough_when_the_others_follow_from_it(roots):
    _, states = _saved(roots, world=2, workers=2, epochs=1, stop=3)
    every = _resumed(roots, states, world=3, workers=1)[2]
    one = _resumed(roots, states[1], world=3, workers=1)[2]
    assert one == every


def test_a_resumed_elastic_rest_resumes_exactly_and_again_elastically(roots):
    _, states = _saved(roots, world=2, workers=2, epochs=0, stop=3)
    whole = [mixture_loader(roots, M1, workers=1, rank=r, world=3) for r in range(3)]
    for loader in whole:
        loader.load_state_dict(states)
    full = [read_batches(loader) + read_batches(loader) for loader in whole]
    # on the same layout: exact
    part = mixture_loader(roots, M1, workers=1, rank=1, world=3)
    part.load_state_dict(states)
    head = read_batches(part, 2)
    again = mixture_loader(roots, M1, workers=1, rank=1, world=3)
    again.load_state_dict(json.loads(json.dumps(part.state_dict())))
    assert head + read_batches(again) + read_batches(again) == full[1]
    # elastic again, inside the rest: every pass still read once
    before, mids = [], []
    for r in range(3):
        loader = mixture_loader(roots, M1, workers=1, rank=r, world=3)
        loader.load_state_dict(states)
        before += with_passes(loader, read_batches(loader, 2))
        mids.append(json.loads(json.dumps(loader.state_dict())))
    first, _ = _saved(roots, world=2, workers=2, epochs=0, stop=3)
    lengths, after, _ = _resumed(roots, mids, world=2, workers=0, epochs=2)
    assert len(set(lengths)) == 1
    check_passes(first + before + after)


def test_a_state_with_a_continuation_alone_is_refused_for_other_ranks(roots):
    first = mixture_loader(roots, M1, workers=2, rank=0, world=2)
    read_batches(first, 3)
    continued = mixture_loader(roots, M1, workers=1, rank=0, world=2)  # another number of workers: a continuation
    continued.load_state_dict(json.loads(json.dumps(first.state_dict())))
    read_batches(continued, 1)
    state = json.loads(json.dumps(continued.state_dict()))
    with pytest.raises(ConfigError, match=r"needs the states of all 2"):
        mixture_loader(roots, M1, workers=1, rank=0, world=3).load_state_dict(state)
    with pytest.raises(ConfigError, match=r"another mixture.*two checkpoints"):
        mixture_loader(roots, {"a": 0.2, "b": 0.8}, workers=1, rank=0, world=3).load_state_dict(state)
