"""``wdspack inspect`` of a dataset planned for context parallelism: the fill of real tokens and the ``2·cp``
padding's share told apart (each of ``packs · seq_len``), and the fill the packs load at, the two added."""

from __future__ import annotations

import pytest

from tests.support.synthetic import plan_for_cp, write_dataset
from wdspack.ops.inspect import dataset_stats, format_stats


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cp-inspect")
    write_dataset(folder, shards=2, packs_per_shard=4, seed=5)
    packs, padded = plan_for_cp(folder, cp=2)
    return folder, packs, padded


def test_the_fill_says_real_tokens_and_cp_padding_apart(planned):
    folder, packs, padded = planned
    stats = dataset_stats(str(folder), deep=True)
    budget = len(packs) * 64
    real, loaded = sum(p.num_tokens for p in packs), sum(q.num_tokens for q in padded)
    assert stats["tokens"] == real and stats["cp_padding"] == loaded - real > 0
    f = stats["cp_fill"]
    assert f["real"] == pytest.approx(stats["fill_ratio"]) == pytest.approx(real / budget, abs=1e-6)
    assert f["cp_padding"] == pytest.approx((loaded - real) / budget, abs=1e-6)
    assert f["loaded"] == pytest.approx(loaded / budget, abs=1e-6) and f["loaded"] > f["real"]
    per_pack = [q.num_tokens - p.num_tokens for p, q in zip(packs, padded)]
    assert stats["per_pack"]["cp_padding"]["max"] == max(per_pack) and stats["_arrays"]["cp_padding"] == per_pack
    lines = format_stats(stats)
    tokens = next(line for line in lines if line.startswith("tokens"))
    assert (f"fill {f['real']:.2%} real + {f['cp_padding']:.2%} CP padding = {f['loaded']:.2%} loaded"
            in tokens), tokens
    cp = next(line for line in lines if line.startswith("cp "))
    assert f"{loaded - real} padding tokens in all ({f['cp_padding']:.2%} of the packs' seq_len budget" in cp, cp
    padding = next(line for line in lines if line.startswith("padding"))
    assert (f"packed {1 - f['real']:.1%} of tokens: {f['cp_padding']:.1%} the 2·cp padding, "
            f"{1 - f['loaded']:.1%} the packs' tails;" in padding), padding


def test_a_dataset_not_planned_for_cp_reads_as_before(tmp_path):
    write_dataset(tmp_path, shards=1, packs_per_shard=2, seed=5)
    stats = dataset_stats(str(tmp_path))
    assert "cp" not in stats and "cp_fill" not in stats
    tokens = next(line for line in format_stats(stats) if line.startswith("tokens"))
    assert tokens.endswith(f"fill {stats['fill_ratio']:.2%}"), tokens
