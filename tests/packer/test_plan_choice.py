"""Scale by default (#38 item 11): a pack job plans in groups by itself when it is large (more records
than ``WDSPACK_PLAN_GROUPS_ABOVE``, 10 M unless set), says so in its summary, and ``--plan-groups``
forces either way. Small jobs keep the global plan (the golden shard tests hold their bytes)."""

from __future__ import annotations

import re

import pytest

from tests.support.demo import ROOT, demo_sources, generate_demo
from wdspack.cli import main
from wdspack.format.manifest import read_manifest
from wdspack.packer.config import PackConfig
from wdspack.packer.job import _choose_plan
from wdspack.packer.partitioned import PLAN_GROUPS_ABOVE, choose_plan_groups
from wdspack.packer.sources import list_partitions

TEMPLATE = str(ROOT / "examples" / "chat_templates" / "pixtral.jinja")


@pytest.fixture(scope="module")
def small_demo(tmp_path_factory):
    return generate_demo(tmp_path_factory.mktemp("demo"), records=20, seed=5)


def _argv(data, tekken_dir, out, *extra: str) -> list[str]:
    return ["pack", *demo_sources(data), "--output", str(out), "--tokenizer", str(tekken_dir),
            "--chat-template", TEMPLATE, "--image-token", "[IMG]", "--tokens-per-image", "16", "--seq-len", "2048",
            "--max-images", "8", "--max-drop-fraction", "1", "--quiet", *extra]


def test_a_job_over_the_threshold_plans_in_groups_and_says_so(small_demo, tekken_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WDSPACK_PLAN_GROUPS_ABOVE", "30")  # 40 records: a "large" job
    assert main(_argv(small_demo, tekken_dir, tmp_path / "grouped")) == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if line.startswith("plan ")]
    assert len(said) == 1 and re.fullmatch(r"plan +in groups of 200 partitions: the job has up to 2,000 records, "
                                           r"over 30 \(WDSPACK_PLAN_GROUPS_ABOVE\); --plan-groups off forces one "
                                           r"global plan", said[0]), out
    assert all(re.fullmatch(r"train-000000-\d{4}\.tar", s.name) for s in read_manifest(tmp_path / "grouped").shards)
    # --plan-groups off forces the global plan, and says nothing
    assert main(_argv(small_demo, tekken_dir, tmp_path / "global", "--plan-groups", "off")) == 0
    assert "plan " not in capsys.readouterr().out
    assert [s.name for s in read_manifest(tmp_path / "global").shards] == ["train-000000.tar"]


def test_small_jobs_keep_the_global_plan(small_demo):
    parts = list_partitions(demo_sources(small_demo))
    config = PackConfig(seq_len=2048)
    assert _choose_plan(parts, config) == (config, "")  # plan_group_partitions stays None: the global plan
    forced = PackConfig(seq_len=2048, plan_group_partitions=3)
    assert _choose_plan(parts, forced) == (forced, "")
    assert choose_plan_groups(PLAN_GROUPS_ABOVE, records_per_partition=1000, above=PLAN_GROUPS_ABOVE) is None
    assert choose_plan_groups(PLAN_GROUPS_ABOVE + 1, records_per_partition=1000, above=PLAN_GROUPS_ABOVE) == 200


def test_a_bad_threshold_is_a_usage_error(small_demo, tekken_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WDSPACK_PLAN_GROUPS_ABOVE", "lots")
    assert main(_argv(small_demo, tekken_dir, tmp_path / "ds")) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "WDSPACK_PLAN_GROUPS_ABOVE='lots'" in err and "whole number" in err
    assert not (tmp_path / "ds").exists()
