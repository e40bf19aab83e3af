"""tools/bench_train.py ``--family``: its table names the test harness's families with their options, and it
refuses what a family's tiny model cannot take in one line, before any work (the runs themselves are
``docs/benchmarks/training.md``'s: a minute or two each)."""

from __future__ import annotations

import importlib

import pytest

from tests.support import vlm_harness


def test_families_are_the_harness_families_with_their_options():
    tool = importlib.import_module("tools.bench_train")
    assert {"qwen2_5_vl", "internvl", "glm4v", "minicpmv4_6"} <= set(tool.FAMILIES)
    for name, spec in tool.FAMILIES.items():
        assert spec == vlm_harness.ALL_FAMILIES[name][:3], f"{name}: not the harness's module and options"


def test_family_refuses_sizes_and_unknown_names(capsys):
    tool = importlib.import_module("tools.bench_train")
    with pytest.raises(SystemExit, match=r"^--hidden and --layers: --family internvl's tiny model has its example's"):
        tool.main(["--quick", "--family", "internvl", "--hidden", "64", "--layers", "2"])
    with pytest.raises(SystemExit, match=r"^--layers: --family glm4v's"):
        tool.main(["--family", "glm4v", "--layers", "2"])
    with pytest.raises(SystemExit, match=r"^--long-video plans with Qwen2.5-VL's video settings, not --family minicpm"):
        tool.main(["--long-video", "--family", "minicpmv4_6"])
    with pytest.raises(SystemExit) as exit_:
        tool.main(["--family", "gemma9"])
    assert exit_.value.code == 2
    assert "'gemma9': give one of qwen2_5_vl, internvl, glm4v, minicpmv4_6" in capsys.readouterr().err
