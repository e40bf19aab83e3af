"""``tools/bench_mixture_loader.py --quick``: the mixture and one dataset of the same packs are both read
whole by every rank, with equal batches per rank, and the mixture's requests stay within the issue's
bound (Σ over sources of shards + 3, plus one per split piece: at most one more per shard here)."""

from __future__ import annotations

import json

from tools import bench_mixture_loader


def test_quick_run_reads_both_whole_with_bounded_requests(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench_mixture_loader.main(["--quick", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert "mixture / one dataset" in capsys.readouterr().out
    packs = doc["packs"]
    assert packs["one"] == packs["a"] + packs["b"]
    for r in doc["results"]:
        mix, one = r["readers"]["mixture"], r["readers"]["one dataset"]
        assert len(set(mix["batches_per_rank"])) == 1 and len(set(one["batches_per_rank"])) == 1
        assert one["packs"] <= packs["one"] and one["packs"] > packs["one"] - r["ranks"] * doc["batch_size"]
        assert mix["packs"] > 0 and r["mixture_over_one"] > 0
        shards = 2 * doc["shards_per_source"]
        assert all(g <= r["bound_per_rank_mixture"] + shards for g in mix["tar_gets_per_rank"])
