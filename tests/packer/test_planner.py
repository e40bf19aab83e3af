"""Planner invariants for every algorithm, property-based, plus literal cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wdspack import ALGORITHMS, lower_bound, plan_packs
from wdspack.errors import ConfigError


def _check(packs, tok, img, seq_len, max_images):
    """Every fitting index exactly once, oversize ones nowhere, no pack over a budget."""
    flat = [i for p in packs for i in p]
    assert len(flat) == len(set(flat)), "an index appears twice"
    fits = {i for i in range(len(tok)) if tok[i] <= seq_len and (max_images is None or img[i] <= max_images)}
    assert set(flat) == fits
    for p in packs:
        assert p, "empty pack"
        assert sum(tok[i] for i in p) <= seq_len
        if max_images is not None:
            assert sum(img[i] for i in p) <= max_images


items = st.lists(st.tuples(st.integers(1, 300), st.integers(0, 5)), min_size=0, max_size=120)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@given(items=items, seq_len=st.integers(1, 256), max_images=st.one_of(st.none(), st.integers(0, 6)),
       seed=st.integers(0, 3))
@settings(max_examples=60, deadline=None)
def test_invariants(algorithm, items, seq_len, max_images, seed):
    tok = [t for t, _ in items]
    img = [m for _, m in items]
    packs = plan_packs(tok, img, seq_len=seq_len, max_images=max_images, algorithm=algorithm, seed=seed)
    _check(packs, tok, img, seq_len, max_images)
    again = plan_packs(tok, img, seq_len=seq_len, max_images=max_images, algorithm=algorithm, seed=seed)
    assert packs == again, "same inputs and seed must give the same plan"


def _realistic(n, seed=0):
    """Long-tailed instruction-data lengths: most short, a lognormal tail, a few long."""
    rng = np.random.default_rng(seed)
    text = np.clip(rng.lognormal(np.log(300), 1.0, n), 8, 4096).astype(np.int64)
    img = (rng.random(n) < 0.7).astype(np.int64)
    return text + 64 * img, img


@pytest.mark.parametrize("algorithm", ["ffd", "bfd"])
def test_decreasing_algorithms_near_lower_bound(algorithm):
    tok, img = _realistic(20_000)
    packs = plan_packs(tok, img, seq_len=4096, max_images=16, algorithm=algorithm)
    _check(packs, tok, img, 4096, 16)
    lb = lower_bound(tok, img, seq_len=4096, max_images=16)
    assert len(packs) <= 1.01 * lb, (len(packs), lb)


def _image_bound(n, seed=0):
    """75 % short single-image samples beside 25 % longer text-only ones (seq_len 2048, 8 images)."""
    rng = np.random.default_rng(seed)
    is_img = rng.random(n) < 0.75
    tok = np.where(is_img, 64 + rng.integers(20, 200, n), rng.integers(300, 2000, n))
    return tok, is_img.astype(np.int64)


def test_bfd_plans_in_two_dimensions():
    tok, img = _image_bound(30_000)
    token_lb = -(-int(tok.sum()) // 2048)
    assert -(-int(img.sum()) // 8) <= 0.6 * token_lb  # the case the promise is about
    bfd = plan_packs(tok, img, seq_len=2048, max_images=8, algorithm="bfd")
    _check(bfd, tok, img, 2048, 8)
    ffd = plan_packs(tok, img, seq_len=2048, max_images=8, algorithm="ffd")
    _check(ffd, tok, img, 2048, 8)
    from wdspack.packer.planner import _best_fit, _decreasing

    valid = np.arange(tok.size)
    token_sorted = int(_best_fit(_decreasing(valid, tok), tok, img, 2048, 8)[1].max()) + 1
    assert token_sorted > 1.05 * token_lb  # token order alone strands the image samples
    assert len(bfd) <= 1.015 * token_lb, (len(bfd), token_lb)
    assert len(ffd) <= 1.015 * token_lb, (len(ffd), token_lb)


@given(items=items, seed=st.integers(0, 5))
@settings(max_examples=60, deadline=None)
def test_bfd_never_worse_than_token_sorted_bfd(items, seed):
    from wdspack.packer.planner import _best_fit, _decreasing

    tok = np.array([t for t, _ in items] or [1], dtype=np.int64)
    img = np.array([m for _, m in items] or [0], dtype=np.int64)
    valid = np.flatnonzero((tok <= 200) & (img <= 4))
    packs = plan_packs(tok, img, seq_len=200, max_images=4, algorithm="bfd", seed=seed)
    if valid.size:
        token_sorted = int(_best_fit(_decreasing(valid, tok), tok, img, 200, 4)[1].max()) + 1
        assert len(packs) <= token_sorted


def test_balanced_spreads_load_evenly():
    tok, img = _realistic(5_000, seed=1)
    packs = plan_packs(tok, img, seq_len=4096, max_images=16, algorithm="balanced")
    _check(packs, tok, img, 4096, 16)
    loads = np.array([tok[p].sum() for p in packs])
    bfd_loads = np.array([tok[p].sum() for p in plan_packs(tok, img, seq_len=4096, max_images=16)])
    assert loads.std() < bfd_loads.std()
    assert len(packs) <= 1.03 * lower_bound(tok, img, seq_len=4096, max_images=16)


def test_literal_plans():
    assert plan_packs([5, 3, 4, 2, 6], seq_len=10) == [[4, 2], [0, 1, 3]]
    assert plan_packs([5, 3, 4, 2, 6], seq_len=10, algorithm="greedy") == [[0, 1], [2, 3], [4]]
    assert plan_packs([5, 3, 4, 2, 6], seq_len=10, algorithm="ffd") == [[4, 2], [0, 1, 3]]
    # The image budget splits samples that would fit on tokens alone.
    assert plan_packs([1, 1, 1], [1, 1, 1], seq_len=10, max_images=2, algorithm="greedy") == [[0, 1], [2]]
    # Oversize samples are left out (the caller records them as dropped).
    assert plan_packs([11, 4, 3], [0, 3, 0], seq_len=10, max_images=2) == [[2]]
    assert plan_packs([], seq_len=10) == []


def test_shuffle_depends_on_seed():
    tok = list(range(1, 200))
    a = plan_packs(tok, seq_len=400, algorithm="shuffle", seed=0)
    b = plan_packs(tok, seq_len=400, algorithm="shuffle", seed=1)
    assert a != b


@pytest.mark.parametrize("kwargs, match", [
    (dict(seq_len=0), "seq_len must be a positive integer"),
    (dict(seq_len=10, algorithm="knapsack"), "unknown packing algorithm 'knapsack'"),
    (dict(seq_len=10, max_images=-1), "max_images"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        plan_packs([1, 2], **kwargs)


def test_bad_counts():
    with pytest.raises(ConfigError, match="token counts must be positive"):
        plan_packs([3, 0], seq_len=10)
    with pytest.raises(ConfigError, match="2 image counts for 3 token counts"):
        plan_packs([1, 2, 3], [0, 1], seq_len=10, max_images=2)
