"""Loader checkpoints saved before #20's re-layout load after it (issue #20, item 6).

How the fixtures were made: ``tests/data/checkpoints/<case>.json`` were written by
``tools/make_checkpoint_fixture.py`` run with the code of 5796b65, the last commit before #20
moved the package (``wdspack/pipeline.py``, ``wdspack/loader/`` flat), from this checkout::

    git worktree add /tmp/oldtree 5796b65
    PYTHONPATH=/tmp/oldtree HF_HUB_OFFLINE=1 .venv/bin/python -m tools.make_checkpoint_fixture
    git worktree remove /tmp/oldtree

The old code generated the demo dataset (150 records, seed 11), packed it as ``demo_packed``
does here, and per case ran ``make_loader(...)`` (``saved_with``) for ``after`` batches, saved
``state_dict()`` and recorded a digest of every batch that followed: the rest of that epoch and
the first three of the next. Each file holds the loader arguments, the state exactly as the old
loader returned it (it is JSON: ints, strings, lists; no conversion, no pickle) and, per batch,
per key, the first 16 hex digits of a sha256 over the tensor's dtype, shape and bytes
(:func:`make_checkpoint_fixture.batch_digest`).

Here today's code packs the same dataset (the session's ``demo_packed``: the golden-shard and
determinism tests prove its bytes did not change, and the state's config carries a digest of the
shards, checked first), a fresh loader built with ``resumed_with`` loads the old state, and its
batches must have the recorded digests. Cases: one process; two workers; a two-worker state
resumed elastically in one process; ``balance="cost"``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.support.demo import DEMO_PACK
from wdspack import make_loader

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS = ROOT / "tests" / "data" / "checkpoints"
CASES = sorted(p.stem for p in CHECKPOINTS.glob("*.json"))


def _tool():
    return importlib.import_module("tools.make_checkpoint_fixture")


TOOL = _tool()


def _fixture(name: str) -> dict:
    return json.loads((CHECKPOINTS / f"{name}.json").read_text(encoding="utf-8"))


def test_the_fixtures_are_the_tools_cases():
    assert CASES == sorted(TOOL.CASES), "tests/data/checkpoints/ and the tool's CASES differ: re-make the fixture"


@pytest.mark.parametrize("name", CASES)
def test_an_old_loader_state_resumes_the_recorded_batches(name, demo_packed):
    fixture = _fixture(name)
    pack = {k: v for k, v in DEMO_PACK.items() if k != "run"}  # run: where tasks ran, not the bytes
    assert pack == fixture["demo_pack"], (f"support.demo.DEMO_PACK {pack} is not what {name}.json was packed with "
                                          f"({fixture['demo_pack']}): re-make it (see this module's docstring)")
    loader = make_loader(str(demo_packed[0]), **fixture["resumed_with"])
    saved_over = fixture["state"]["config"]["dataset"]
    assert loader.state_dict()["config"]["dataset"] == saved_over, (
        "the demo packed today has other shards than the one the old state was saved over: the packer's bytes changed")
    loader.load_state_dict(fixture["state"])
    got = TOOL.following_batches(loader)
    assert len(got) == len(fixture["following"])
    for i, (want, have) in enumerate(zip(fixture["following"], got)):
        differ = sorted(k for k in want if have.get(k) != want[k])
        assert not differ, f"{name}: batch {i} after the resume differs in {differ}"


def test_the_digests_tell_the_positions_apart(demo_packed):
    """Without the state, the stream starts elsewhere: the comparison above can fail."""
    fixture = _fixture("workers0")
    fresh = TOOL.following_batches(make_loader(str(demo_packed[0]), **fixture["resumed_with"]))
    assert fresh[0] != fixture["following"][0]
    # and from `after` on, the same stream (in the keys the old batches had: later ones, like
    # source_idx, are additions to the batch contract)
    tail = [{k: have.get(k) for k in want} for want, have in zip(fixture["following"], fresh[fixture["after"]:])]
    assert tail == fixture["following"] and len(fresh) - fixture["after"] == len(fixture["following"])
