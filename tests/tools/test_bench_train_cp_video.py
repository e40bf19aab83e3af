"""``bench_train --long-video``'s planning (no model): each CP degree's figures for a dataset padded at load time
and for it resharded with ``--cp N``, on a small synthetic dataset (the long-video mix itself is the bench's run;
its clips take tens of seconds to encode)."""

from __future__ import annotations

import importlib
import json

import pytest

from tests.support.synthetic import write_dataset


@pytest.fixture(scope="module")
def tool():
    return importlib.import_module("tools.bench_train")


def test_each_degree_planned_has_static_ranks_and_load_time_does_not(tool, tmp_path):
    manifest = write_dataset(tmp_path / "plain", shards=2, packs_per_shard=4, seq_len=64, seed=11)
    (tmp_path / "plain" / "dropped.jsonl").write_text("")  # as a pack job leaves it: reshard carries it over
    out = tool.cp_planning(tmp_path / "plain", tmp_path, cps=[2, 4], seq_len=64, max_images=2, batch_size=1)
    assert list(out) == ["2", "4"] and not (tmp_path / "cp2").exists()  # each planned copy removed after use
    for cp, r in out.items():
        lt, pl, cp = r["load_time"], r["planned"], int(cp)
        assert r["packs"] == 8 and lt["steps"] == 8 and lt["padding_tokens"] > 0
        assert lt["rank_tokens"]["max"] > 64 // cp and lt["steps_over_static"] > 0  # padded at load: past L / cp
        assert pl["padding_tokens"] == 0 and pl["steps_over_static"] == 0  # planned: every rank holds L / cp
        assert pl["rank_tokens"] == {"max": 64 // cp, "mean": 64 / cp} and pl["padding_in_plan"] > 0
        assert pl["samples_packed"] == manifest.totals["samples_packed"]  # a sample ≤ 64 padded to 2·cp still fits
        assert lt["rank_real_tokens"]["mean"] == 64 / cp  # the loader's B·L tokens, the 2·cp padding on top
        assert pl["rank_real_tokens"]["mean"] < 64 / cp  # the plan's padding sits inside L


def test_the_cp_option_takes_several_degrees_only_with_long_video(tool, capsys):
    assert tool.cp_list("2,4,8") == [2, 4, 8]
    with pytest.raises(SystemExit, match="one degree with the training modes"):
        tool.main(["--cp", "2,4"])
    with pytest.raises(SystemExit, match=r"--seq-len 100 is not a multiple of 2·cp = 16"):
        tool.main(["--long-video", "--cp", "8", "--seq-len", "100"])
    assert json.dumps(tool.LONG_VIDEO)  # the defaults the help prints
