"""Packs planned for context parallelism (``--cp N``): each sub-sample counted at its length padded to a multiple of
``2·N`` within ``seq_len``, the padding in the manifest and in ``inspect``, resharded to another degree, and loaded
as segments that ``cp_layout`` splits with no padding of its own. Without ``--cp`` the bytes are as before."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from tests.support.demo import demo_sources
from wdspack.cli import main
from wdspack.errors import ConfigError
from wdspack.format.dataset import iter_dataset_packs, open_dataset
from wdspack.format.manifest import Manifest
from wdspack.loader import PackedDataset
from wdspack.loader.batch.collate import IGNORE_INDEX, collate_packs
from wdspack.ops.inspect import dataset_stats, format_stats
from wdspack.packer.config import PackConfig, RunOptions
from wdspack.packer.job import pack_dataset
from wdspack.packer.reshard import reshard_dataset
from wdspack.train.cp import cp_layout

#: Short packs, so the padding binds: the demo's samples are a few hundred tokens.
SEQ_LEN = 1024
CONFIG = PackConfig(seq_len=SEQ_LEN, max_images=6, records_per_partition=40, run=RunOptions(max_drop_fraction=1.0))


def _packs(root):
    manifest, where = open_dataset(str(root))
    return manifest, [pack for _, pack in iter_dataset_packs(manifest, where)]


def _padded(lens, cp):
    step = 2 * cp
    return [-(-n // step) * step for n in lens]


@pytest.fixture(scope="module")
def planned(tmp_path_factory, demo_data, sample_config):
    """The demo packed at ``seq_len`` 1024 for ``cp = 2``, and the same job without ``--cp``."""
    root = tmp_path_factory.mktemp("cp-plan")
    pack_dataset(demo_sources(demo_data), root / "cp2", sample_config=sample_config, config=replace(CONFIG, cp=2))
    pack_dataset(demo_sources(demo_data), root / "plain", sample_config=sample_config, config=CONFIG)
    return root


def test_each_sample_is_planned_padded_to_2cp_within_seq_len(planned):
    manifest, packs = _packs(planned / "cp2")
    assert manifest.cp == 2
    padding = 0
    for pack in packs:
        padded = _padded(pack.seq_lens, 2)
        assert sum(padded) <= SEQ_LEN, pack.sample_ids  # the budget counts the padding
        padding += sum(padded) - pack.num_tokens
    assert padding > 0 and manifest.totals["cp_padding"] == padding
    # the plain plan fills packs past what the padded lengths allow: the padding had to be counted
    _, plain = _packs(planned / "plain")
    assert max(sum(_padded(p.seq_lens, 2)) for p in plain) > SEQ_LEN
    # the same samples in both (nothing dropped for the padding on this data)
    assert sorted(i for p in packs for i in p.sample_ids) == sorted(i for p in plain for i in p.sample_ids)


def test_inspect_shows_the_padding(planned):
    stats = dataset_stats(str(planned / "cp2"), deep=True)
    assert stats["cp"] == 2 and stats["cp_padding"] == json.loads((planned / "cp2" / "manifest.json").read_text()
                                                                  )["totals"]["cp_padding"]
    per_pack = stats["per_pack"]["cp_padding"]
    assert 0 < per_pack["max"] <= 3 * stats["per_pack"]["samples"]["max"]  # < 2·cp per sub-sample
    text = "\n".join(format_stats(stats))
    assert f"planned for 2 CP ranks: each sub-sample padded to a multiple of 4 when it loads, {stats['cp_padding']} " \
           "padding tokens" in text
    assert "cp_padding/pack" in text
    assert "cp" not in dataset_stats(str(planned / "plain"))  # not planned for CP: no line, no key


def test_reshard_to_another_cp_and_back_to_none(planned, tmp_path):
    reshard_dataset(str(planned / "cp2"), tmp_path / "cp4", config=replace(CONFIG, cp=4))
    manifest, packs = _packs(tmp_path / "cp4")
    assert manifest.cp == 4
    assert all(sum(_padded(p.seq_lens, 4)) <= SEQ_LEN for p in packs)
    assert manifest.totals["cp_padding"] == sum(sum(_padded(p.seq_lens, 4)) - p.num_tokens for p in packs)
    assert main(["reshard", str(tmp_path / "cp4"), str(tmp_path / "none"), "--seq-len", str(SEQ_LEN), "-q"]) == 0
    written = json.loads((tmp_path / "none" / "manifest.json").read_text())
    assert "cp" not in written and "cp_padding" not in written["totals"]


def test_without_cp_the_bytes_are_as_before(planned):
    """No ``cp`` key in the manifest nor in the job's fingerprint; a manifest read back writes the same bytes."""
    text = (planned / "plain" / "manifest.json").read_text()
    assert '"cp"' not in text and "cp_padding" not in text
    assert Manifest.from_json(text).to_json() == text
    assert "cp" not in CONFIG.output_fields() and replace(CONFIG, cp=2).output_fields()["cp"] == 2
    cp_text = (planned / "cp2" / "manifest.json").read_text()
    assert Manifest.from_json(cp_text).to_json() == cp_text


@pytest.mark.parametrize("padding_free", [False, True])
def test_the_loader_hands_out_segments_cp_layout_splits_without_padding(planned, padding_free):
    ds = PackedDataset(str(planned / "cp2"), shuffle=False, text_only=True)
    assert ds.cp == 2
    raw = PackedDataset(str(planned / "cp2"), shuffle=False, text_only=True)
    raw.cp = None  # the same packs as stored: what a loader without the manifest's cp would give
    examples = list(ds)
    batch = collate_packs(examples[:4], padding_free=padding_free)
    plain = collate_packs(list(raw)[:4], padding_free=padding_free)
    cu = batch["cu_seqlens"]
    assert all(int(n) % 4 == 0 for n in cu.diff())
    for rank in range(2):
        assert cp_layout(cu, cp=2, rank=rank, cu_seqlens=True).padding == 0
    assert cp_layout(plain["cu_seqlens"], cp=2, rank=0, cu_seqlens=True).padding > 0  # the load-time cost, else
    # the padding carries no target and moves none: the same targets, in order, and the same counts
    assert batch["labels"][batch["labels"] != IGNORE_INDEX].tolist() == \
        plain["labels"][plain["labels"] != IGNORE_INDEX].tolist()
    assert batch["num_targets"].tolist() == plain["num_targets"].tolist()
    assert batch["segment_targets"][batch["segment_targets"] > 0].tolist() == \
        plain["segment_targets"][plain["segment_targets"] > 0].tolist()


def test_bad_cp_is_refused_naming_the_fix(demo_data, tekken_dir, capsys):
    with pytest.raises(ConfigError, match=r"--seq-len 1002 is not a multiple of 2·cp = 8 \(--cp 4\).*1000 or 1008"):
        PackConfig(seq_len=1002, cp=4)
    with pytest.raises(ConfigError, match="--cp 0"):
        PackConfig(seq_len=1024, cp=0)
    assert main(["reshard", "nowhere", "out", "--seq-len", "1002", "--cp", "4", "-q"]) == 2
    assert "not a multiple of 2·cp = 8" in capsys.readouterr().err


def test_a_sample_too_long_once_padded_is_dropped_saying_so():
    from wdspack.packer.selection import too_long

    d = too_long("a", 1021, replace(CONFIG, cp=4))
    assert d.reason == "too_long" and d.detail.startswith("1021 tokens (padded to 1024 for --cp 4)")
    assert too_long("a", 1025, CONFIG).detail == "1025 tokens > seq_len 1024; raise --seq-len to keep it"
    assert np.array_equal(replace(CONFIG, cp=2).planned_tokens(np.array([1, 4, 5])), [4, 4, 8])


def test_planned_in_groups_counts_the_padding_too(demo_data, sample_config, tmp_path):
    pack_dataset(demo_sources(demo_data), tmp_path / "ds", sample_config=sample_config,
                 config=replace(CONFIG, cp=2, plan_group_partitions=2))
    manifest, packs = _packs(tmp_path / "ds")
    assert manifest.cp == 2 and all(sum(_padded(p.seq_lens, 2)) <= SEQ_LEN for p in packs)
    assert manifest.totals["cp_padding"] == sum(sum(_padded(p.seq_lens, 2)) - p.num_tokens for p in packs) > 0
