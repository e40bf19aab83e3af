"""Balanced steps (``balance="cost"``) and the pack index they read.

The plan is pure: every pack read at most once (each once with ``remainder="wrap"``), in runs of
packs (one ranged request each), no slot holding more than its window, the same on every call;
on the LLaVA-like mix of issue #11 the slowest rank of a step costs at most 5 % over the mean,
where the shuffle buffer's order costs 25 % or more; ``heaviest_first`` puts the costliest step first. The
loader then yields exactly that plan, on every rank the same number of batches, resumes exactly,
and over HTTP reads each run with one request starting at the pack's own offset.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.httpserver import serve
from tests.support.synthetic import pack_numbers, write_dataset
from wdspack import Balance, CostModel, verify_dataset
from wdspack.cli import main
from wdspack.errors import ConfigError, ManifestError
from wdspack.format.manifest import MANIFEST_NAME
from wdspack.format.pack_index import COLUMNS, INDEX_NAME
from wdspack.loader import make_loader
from wdspack.loader.balance import RUNS, TARGET_WAITING, choose_run, plan_epoch_balanced, step_costs, waiting
from wdspack.loader.plan import plan_epoch

COUNTS = [40, 33, 47, 40, 18, 62]  # uneven shards, 240 packs


def _costs(seed: int, counts=COUNTS) -> list[np.ndarray]:
    """LLaVA-like pack costs: tokens near the budget, Σ length² long-tailed, 0-16 images."""
    rng = np.random.default_rng(seed)
    out = []
    for n in counts:
        images = np.where(rng.random(n) < 0.2, 0, rng.integers(1, 17, n))
        attention = rng.lognormal(np.log(2e6), 1.0, n)
        out.append(CostModel().costs(np.column_stack([np.zeros(n), rng.integers(3800, 4097, n), attention,
                                                      np.ones(n), images, 64 * images, np.zeros(n)])))
    return out


def _steps(plan, costs, *, ranks, workers, batch_size, seed=0) -> np.ndarray:
    """``[steps, ranks]``: the cost each rank runs at each step (worker ``t % workers`` serves step ``t``)."""
    return step_costs(plan, costs, ranks=ranks, workers=workers, batch_size=batch_size, seed=seed,
                      shuffle_buffer=64)


def _waiting(steps: np.ndarray) -> float:
    return float(steps.max(1).sum() / steps.mean(1).sum())


# -- the plan ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("remainder", ["drop", "wrap"])
@pytest.mark.parametrize("ranks,workers,batch_size", [(2, 1, 1), (3, 2, 2), (4, 2, 3), (7, 1, 4)])
def test_every_pack_read_at_most_once_in_runs_within_the_window(remainder, ranks, workers, batch_size):
    costs = _costs(1)
    kw = dict(ranks=ranks, workers=workers, epoch=3, seed=5, shuffle=True, remainder=remainder,
              batch_size=batch_size, window=24, run=8)
    plan = plan_epoch_balanced(COUNTS, costs, **kw)
    base = plan_epoch(COUNTS, slots=ranks * workers, epoch=3, seed=5, shuffle=True, remainder=remainder,
                      batch_size=batch_size)
    assert plan.per_slot == base.per_slot  # len(loader) does not change with balance
    seen = [(g.shard, i) for ranges in plan.slots for g in ranges for i in range(g.start, g.stop)]
    assert len(seen) == len(set(seen))
    if remainder == "wrap":
        assert len(seen) == sum(COUNTS)
    else:
        assert all(plan.assigned(s) == plan.per_slot for s in range(ranks * workers))
    for s, order in enumerate(plan.orders):
        assert sorted(order.tolist()) == list(range(plan.assigned(s)))
        waiting = np.maximum.accumulate(order) + 1 - np.arange(1, len(order) + 1)  # read, not yet emitted
        assert waiting.max() <= 24
    packs_per_range = len(seen) / sum(len(r) for r in plan.slots)
    assert packs_per_range >= 4, "a request reads a run of packs, not one pack"
    again = plan_epoch_balanced(COUNTS, costs, **kw)
    assert again.slots == plan.slots and all(np.array_equal(a, b) for a, b in zip(plan.orders, again.orders))
    other = plan_epoch_balanced(COUNTS, costs, **{**kw, "epoch": 4})
    assert other.slots != plan.slots


def _llava_like_costs() -> list[np.ndarray]:
    """The issue's workload, exactly as ``tools/bench_balance.py`` builds it (200k LLaVA-like samples,
    bfd at 4096 tokens and 16 images, the pipeline's shuffled pack order, shards of 1,000 packs)."""
    from tools.bench_balance import workload

    return [CostModel().costs(rows) for rows in workload(200_000, 1000)]


@pytest.mark.parametrize("ranks", [8, 64])
def test_slowest_rank_within_five_percent_of_the_mean(ranks):
    costs = _llava_like_costs()
    counts = [len(c) for c in costs]
    for batch_size in (1, 4):
        kw = dict(ranks=ranks, workers=2, batch_size=batch_size)
        base = plan_epoch(counts, slots=ranks * 2, epoch=0, seed=0, shuffle=True, remainder="drop",
                          batch_size=batch_size)
        bal = plan_epoch_balanced(counts, costs, epoch=0, seed=0, shuffle=True, remainder="drop", **kw)
        before, after = _waiting(_steps(base, costs, **kw)), _waiting(_steps(bal, costs, **kw))
        assert before > 1.25 and after <= 1.05, (ranks, batch_size, before, after)


@pytest.mark.parametrize("workers,batch_size", [(1, 1), (2, 1), (2, 3)])
def test_heaviest_first_makes_the_first_step_the_costliest(workers, batch_size):
    costs = _costs(3)
    ranks = 4
    plan = plan_epoch_balanced(COUNTS, costs, ranks=ranks, workers=workers, epoch=0, seed=2, shuffle=True,
                               remainder="drop", batch_size=batch_size, window=20, run=5, heaviest_first=True)
    steps = _steps(plan, costs, ranks=ranks, workers=workers, batch_size=batch_size, seed=2)
    assert steps[0].max() == steps.max(), "the first step holds the costliest batch of the epoch"
    assert steps[0].max() >= steps.max(1)[1:].max()
    if batch_size == 1:
        top = np.sort(np.concatenate(costs))[::-1][:ranks]
        assert sorted(steps[0].tolist(), reverse=True) == top.tolist()


def test_cost_model_weights():
    rows = np.array([[0, 4000, 4000 ** 2, 1, 0, 0, 3999], [0, 4096, 64 ** 2 * 64, 64, 16, 1024, 4000]])
    assert CostModel().costs(rows).tolist() == [4000 + 3906, 4096 + 64 + 16 * 1024]
    assert CostModel(tokens=0, attention=0, images=0, image_tokens=1).costs(rows).tolist() == [0, 1024]
    with pytest.raises(ConfigError, match="every weight at 0"):
        CostModel(tokens=0, attention=0, images=0)
    with pytest.raises(ConfigError, match="must be a finite weight"):
        CostModel(images=-1)
    with pytest.raises(ConfigError, match=r"\['vision'\] are unknown"):
        CostModel.coerce({"vision": 2.0})


# -- the loader -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    folder = tmp_path_factory.mktemp("balance-ds")
    write_dataset(folder, shards=6, packs_per_shard=COUNTS, seq_len=64, max_images=4, seed=4, pack_index=True)
    return folder


COST = {"tokens": 1.0, "attention": 1 / 64, "images": 32.0}
BALANCED = dict(balance=Balance(window=12, run=4, heaviest_first=True, cost_model=COST), seed=9)


def _pack_costs(root) -> np.ndarray:
    index = np.load(root / INDEX_NAME)
    return CostModel(**COST).costs(index)


def _stream(loader, n=None) -> list[list[int]]:
    out = []
    for batch in loader:
        out.append([pack_numbers(row)[0] for row in batch["input_ids"]])
        if n is not None and len(out) == n:
            break
    return out


def test_pack_index_is_written_and_verified(root, tmp_path):
    assert verify_dataset(str(root)) == ["dropped.jsonl: missing"]  # synthetic: no dropped list; index checked
    manifest = json.loads((root / MANIFEST_NAME).read_text())
    assert manifest["pack_index"]["columns"] == list(COLUMNS)
    index = np.load(root / INDEX_NAME, allow_pickle=False)
    assert index.shape == (sum(COUNTS), len(COLUMNS)) and (index[:, COLUMNS.index("tokens")] > 0).all()

    wrong = tmp_path / "wrong"
    wrong.mkdir()
    for p in root.iterdir():
        (wrong / p.name).write_bytes(p.read_bytes())
    index[5, COLUMNS.index("images")] += 1  # a consistent file (digest updated) that lies about one pack
    from wdspack.format.pack_index import encode_index, index_entry

    data = encode_index(index)
    (wrong / INDEX_NAME).write_bytes(data)
    manifest["pack_index"] = index_entry(data)
    (wrong / MANIFEST_NAME).write_text(json.dumps(manifest))
    problems = verify_dataset(str(wrong))
    assert any("1 rows disagree with their packs, e.g. row 5 (images)" in p for p in problems), problems

    (wrong / INDEX_NAME).write_bytes(data[:-8])
    assert any("does not match the sha256" in p for p in verify_dataset(str(wrong)))
    with pytest.raises(ManifestError, match="does not match the sha256"):
        make_loader(wrong, batch_size=1, num_workers=0, balance="cost")


def test_every_rank_gets_its_balanced_share_and_the_same_count(root):
    costs = _pack_costs(root)
    ranks, workers, b = 3, 2, 2
    streams = [_stream(make_loader(root, batch_size=b, num_workers=workers, rank=r, world_size=ranks, **BALANCED))
               for r in range(ranks)]
    lengths = {len(s) for s in streams}
    assert len(lengths) == 1 and lengths.pop() == len(make_loader(root, batch_size=b, num_workers=workers, rank=0,
                                                                  world_size=ranks, **BALANCED))
    packs = [p for s in streams for batch in s for p in batch]
    assert len(packs) == len(set(packs))
    steps = np.array([[costs[batch].sum() for batch in step] for step in zip(*streams)])
    per_shard = np.split(costs, np.cumsum(COUNTS)[:-1])
    plan = plan_epoch_balanced(COUNTS, per_shard, ranks=ranks, workers=workers, epoch=0, seed=9, shuffle=True,
                               remainder="drop", batch_size=b, window=12, run=4, heaviest_first=True)
    assert np.array_equal(steps, _steps(plan, per_shard, ranks=ranks, workers=workers, batch_size=b, seed=9))
    unbalanced = [_stream(make_loader(root, batch_size=b, num_workers=workers, rank=r, world_size=ranks, seed=9,
                                      shuffle_buffer=12)) for r in range(ranks)]
    before = np.array([[costs[batch].sum() for batch in step] for step in zip(*unbalanced)])
    assert _waiting(steps) < _waiting(before)
    assert steps[0].max() == steps.max()  # heaviest first


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_is_exact_and_the_stream_deterministic(root, workers):
    def loader():
        return make_loader(root, batch_size=2, num_workers=workers, rank=1, world_size=2, **BALANCED)

    whole = loader()
    full = _stream(whole) + _stream(whole, 5)  # into the second epoch
    assert full[:len(full) - 5] == _stream(loader())
    first = loader()
    head = _stream(first, 7)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + _stream(resumed) + _stream(resumed, 5) == full

    plain = make_loader(root, batch_size=2, num_workers=workers, rank=1, world_size=2, seed=9)
    with pytest.raises(ConfigError, match="balance"):
        plain.load_state_dict(state)


def test_over_http_each_run_is_one_request_from_its_own_offset(root):
    index = np.load(root / INDEX_NAME)
    starts = np.cumsum([0] + COUNTS)
    with serve(root) as server:
        loader = make_loader(server.url, batch_size=2, num_workers=2, rank=0, world_size=2, **BALANCED)
        got = _stream(loader)
        plan = loader.dataset._plan(2, 0)
        ranges = [g for s in (0, 1) for g in plan.slots[s]]
        assert len(server.requests("/" + INDEX_NAME)) == 1 and len(server.requests("/" + MANIFEST_NAME)) == 1
        assert loader.stats["requests"] == len(ranges) and loader.stats["retries"] == 0
        for shard in range(len(COUNTS)):
            name = f"/train-{shard:06d}.tar"
            want = sorted(int(index[starts[shard] + g.start, 0]) for g in ranges if g.shard == shard)
            assert sorted(r.range_start or 0 for r in server.requests(name)) == want, name
    local = _stream(make_loader(root, batch_size=2, num_workers=2, rank=0, world_size=2, **BALANCED))
    assert got == local


def test_clear_errors_and_wdspack_index_for_older_datasets(root, tmp_path, capsys):
    plain = tmp_path / "plain"
    write_dataset(plain, shards=6, packs_per_shard=COUNTS, seq_len=64, max_images=4, seed=4)  # as `root`, no index
    with pytest.raises(ConfigError, match=r"no pack index.*wdspack index DATASET_FOLDER"):
        make_loader(plain, batch_size=1, num_workers=0, balance="cost")
    assert main(["index", str(plain)]) == 0 and "pack_index.npy" in capsys.readouterr().out
    assert (plain / INDEX_NAME).read_bytes() == (root / INDEX_NAME).read_bytes()
    assert json.loads((plain / MANIFEST_NAME).read_text())["pack_index"] == \
        json.loads((root / MANIFEST_NAME).read_text())["pack_index"]
    assert _stream(make_loader(plain, batch_size=2, num_workers=0, **BALANCED)) == \
        _stream(make_loader(root, batch_size=2, num_workers=0, **BALANCED))
    with pytest.raises(ConfigError, match="balance='speed' is not one of"):
        make_loader(root, batch_size=1, num_workers=0, balance="speed")
    with pytest.raises(ConfigError, match=r"balance window \(2 packs\) must be >= batch_size \(4\)"):
        make_loader(root, batch_size=4, num_workers=0, balance={"window": 2})
    unknown = r"keys \['runs'\] are unknown; use \['cost_model', 'heaviest_first', 'window', 'run'\]"
    with pytest.raises(ConfigError, match=unknown):
        make_loader(root, batch_size=1, num_workers=0, balance={"runs": 2})
    with pytest.raises(ConfigError, match="run=0 must be >= 1"):
        Balance(run=0)
    with pytest.raises(ConfigError, match="cost weights"):
        Balance(cost_model={"speed": 1.0})
    # the simple form and the record are one thing, and a loader's state says which it was built with
    simple, record = (make_loader(root, batch_size=2, num_workers=0, balance=b) for b in ("cost", Balance()))
    assert simple.dataset.balance == record.dataset.balance == Balance(run=None, window=None)
    assert simple.state_dict()["config"]["balance"] == record.state_dict()["config"]["balance"]


def test_the_run_length_is_chosen_from_the_storage_and_the_data(root):
    """Local files: every pack its own run (requests are free, the dealing evens out best). Over a
    network: the longest run that keeps the slowest rank within 5 % of the mean, never longer."""
    index = np.load(root / INDEX_NAME)
    costs = [CostModel().costs(index[a:b]) for a, b in zip(np.cumsum([0, *COUNTS[:-1]]), np.cumsum(COUNTS))]
    kw = dict(ranks=4, workers=2, batch_size=2, seed=3, shuffle=True, remainder="drop", window=16,
              heaviest_first=False)
    assert choose_run(COUNTS, costs, remote=False, **kw) == 1
    chosen = choose_run(COUNTS, costs, remote=True, **kw)
    assert chosen in RUNS

    def waits(run):
        plan = plan_epoch_balanced(COUNTS, costs, run=run, epoch=0, **kw)
        return waiting(step_costs(plan, costs, ranks=4, workers=2, batch_size=2, seed=3))

    assert chosen == RUNS[-1] or waits(chosen) <= TARGET_WAITING
    longer = [r for r in RUNS if r > chosen]
    assert all(waits(r) > TARGET_WAITING for r in longer)  # the longest that meets the target
    loader = make_loader(root, batch_size=2, num_workers=0, rank=0, world_size=4, balance="cost")
    assert loader.state_dict()["config"]["balance"]["run"] == 1  # a local folder


def test_a_state_saved_with_a_run_length_resumes_with_it(root):
    """A balance that chooses its own run adopts the one a state was saved with (states saved before the
    choice existed held 32), so the resumed stream is the saved one's."""
    saved_with = make_loader(root, batch_size=2, num_workers=0, balance={"run": 4}, seed=2)
    it = iter(saved_with)
    [next(it) for _ in range(3)]
    state = saved_with.state_dict()
    rest = _stream(saved_with)
    chooser = make_loader(root, batch_size=2, num_workers=0, balance="cost", seed=2)
    chooser.load_state_dict(state)
    assert chooser.state_dict()["config"]["balance"]["run"] == 4
    assert _stream(chooser) == rest
    fixed = make_loader(root, batch_size=2, num_workers=0, balance={"run": 8}, seed=2)
    with pytest.raises(ConfigError, match="cannot resume"):
        fixed.load_state_dict(state)  # a run the user fixed is not overridden


def test_inspect_tells_the_waiting_with_and_without_balance(root, tmp_path, capsys):
    assert main(["inspect", str(root), "--ranks", "4", "--json"]) == 0
    b = json.loads(capsys.readouterr().out)["balance"]
    assert b["ranks"] == 4 and 1.0 <= b["balanced"] < b["shuffle_buffer"]
    assert main(["inspect", str(root), "--ranks", "4"]) == 0
    assert f"the slowest rank costs {b['shuffle_buffer']:.3f}× the mean; with balance='cost' {b['balanced']:.3f}×" \
        in capsys.readouterr().out
    plain = tmp_path / "plain"
    write_dataset(plain, shards=2, packs_per_shard=6, seed=1)
    assert main(["inspect", str(plain), "--ranks", "4"]) == 0
    assert "no pack index; add one with `wdspack index DATASET`" in capsys.readouterr().out
