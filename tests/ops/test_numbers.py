"""Numbers that say what they mean (issue #38 item 9): records vs pieces, which budget binds, each
mixture figure once, and a reshard's own drops apart from the ones it inherited.

Real datasets throughout: documents and the demo chats packed with the session's tekken tokenizer
(loaded once: ``SampleConfig(tekken, ...)``), and the CLI run on the result as a user runs it.
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from tests.support.demo import demo_sources
from tests.support.synthetic import write_dataset
from wdspack.cli import main
from wdspack.format.dataset import iter_dataset_packs, open_dataset
from wdspack.format.pack_index import COLUMNS, INDEX_NAME
from wdspack.ops.verify import verify_dataset
from wdspack.packer.config import PackConfig, RunOptions, budget_use
from wdspack.packer.job import pack_dataset
from wdspack.packer.samples import SampleConfig
from wdspack.packer.text import PretrainConfig


def _inspect(capsys, path) -> list[str]:
    capsys.readouterr()
    assert main(["inspect", str(path)]) == 0
    return capsys.readouterr().out.splitlines()


def _column(folder, name: str) -> np.ndarray:
    return np.load(folder / INDEX_NAME, allow_pickle=False)[:, COLUMNS.index(name)]


def test_documents_cut_into_pieces_count_records_and_samples(tekken, tmp_path, capsys):
    src = tmp_path / "web.jsonl"
    with open(src, "w") as f:
        for k in range(40):  # every fifth page is long: cut into pieces for seq_len 128
            text = (f"Short page {k}." if k % 5 else
                    "\n\n".join(f"Paragraph {p}. " + " ".join(f"w{p}x{w}." for w in range(30)) for p in range(4)))
            f.write(json.dumps({"id": f"page-{k}", "text": text}) + "\n")
    config = SampleConfig(tekken, pretrain=PretrainConfig(eos_token="</s>", split_long_documents=True))
    summary = pack_dataset([str(src)], tmp_path / "out", sample_config=config,
                           config=PackConfig(seq_len=128, run=RunOptions(max_drop_fraction=1)))
    totals = json.loads((tmp_path / "out" / "manifest.json").read_text())["totals"]
    pieces = totals["samples_read"]
    assert totals["records_read"] == 40 and pieces > 40
    assert totals["samples_packed"] + totals["samples_dropped"] == pieces  # the invariant readers check holds
    assert verify_dataset(str(tmp_path / "out")) == []
    first = summary.lines()[0]
    assert f"read 40 records = {pieces} samples (long documents cut into pieces)" in first, first
    assert f"packed {totals['samples_packed']}" in first
    lines = _inspect(capsys, tmp_path / "out")
    assert any(f"of 40 records = {pieces} samples" in line for line in lines), lines


def test_a_manifest_without_the_new_keys_still_reads(demo_packed, tmp_path, capsys):
    """A chat job writes no records_read (records = samples); an older manifest has neither new key."""
    folder, _ = demo_packed
    manifest = json.loads((folder / "manifest.json").read_text())
    assert "records_read" not in manifest["totals"] and manifest["totals"]["min_sample_tokens"] > 0
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    del manifest["totals"]["min_sample_tokens"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    lines = _inspect(capsys, old)
    samples = [line for line in lines if line.startswith("samples ")]
    assert samples[0].startswith(f"samples   {manifest['totals']['samples_packed']} packed of "
                                 f"{manifest['totals']['samples_read']} read;"), samples
    assert sum(line.startswith("budget") for line in lines) == 1


def test_image_budget_that_binds_is_named_with_its_fix(demo_data, tekken, pixtral_template, tmp_path, capsys):
    config = SampleConfig(tekken, chat_template=pixtral_template, tokens_per_image=16, image_token="[IMG]")
    out = tmp_path / "one-image"
    summary = pack_dataset(demo_sources(demo_data), out, sample_config=config,
                           config=PackConfig(seq_len=2048, max_images=1, run=RunOptions(max_drop_fraction=1)))
    images, tokens = _column(out, "images"), _column(out, "tokens")
    at_limit = (images == 1) & (2048 - tokens >= summary.budget.shortest)  # from the packs themselves
    share, free = at_limit.mean(), 1 - tokens.sum() / (2048 * tokens.size)
    assert share > 0.5 and summary.fill_ratio < 0.5
    expected = (f"packs hit --max-images 1 ({share:.0%} of packs) while {free:.0%} of tokens are free: "
                "raise --max-images or the fill stays low")
    assert f"budget   {expected}" in summary.lines()
    lines = _inspect(capsys, out)
    assert [line for line in lines if line.startswith("budget")] == [f"budget    {expected}"]


def test_token_budget_that_binds_is_named(demo_packed, capsys):
    folder, summary = demo_packed
    tokens = _column(folder, "tokens")
    shortest = min(n for _, pack in iter_dataset_packs(*open_dataset(str(folder))) for n in pack.seq_lens)
    full = (2048 - tokens < shortest).mean()
    assert full > 0.5
    line = (f"packs are full of tokens: {full:.0%} have no room for the shortest sample ({shortest} tokens) "
            "in seq_len 2048")
    assert summary.budget.line().startswith(line), summary.budget.line()
    budget = [x for x in _inspect(capsys, folder) if x.startswith("budget")]
    assert len(budget) == 1 and budget[0].startswith(f"budget    {line}") and "raise" not in budget[0]


def test_budget_use_literal_cases():
    # pack 0 full of tokens, pack 1 at the image limit with room, pack 2 open
    use = budget_use(np.array([95, 40, 50]), np.array([1, 4, 0]), seq_len=100, max_images=4, shortest=10)
    assert (use.token_full, use.image_full, use.open) == (1, 1, 1)
    assert budget_use(np.array([40]), np.array([4]), seq_len=100, max_images=None, shortest=10).open == 1
    assert "no budget binds" in budget_use(np.array([40, 50]), np.array([0, 0]), seq_len=100, max_images=4,
                                           shortest=10).line()


@pytest.mark.parametrize("unit", ["tokens", "packs", "targets"])
def test_mixture_epoch_prints_each_figure_once(tmp_path, capsys, unit):
    write_dataset(tmp_path / "a", shards=2, packs_per_shard=20, seq_len=64, max_images=2, seed=1, pack_index=True)
    write_dataset(tmp_path / "b", shards=1, packs_per_shard=15, seq_len=64, max_images=2, seed=2, pack_index=True)
    (tmp_path / "mix.yaml").write_text(f"sources:\n  - {{path: a, weight: 0.6}}\n  - {{path: b, weight: 0.4}}\n"
                                       f"unit: {unit}\n")
    assert main(["inspect", str(tmp_path / "mix.yaml")]) == 0
    epoch = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch"))
    head = epoch.split(";")[0]
    for word in ("tokens", "packs", unit):
        assert len(re.findall(rf"\b{word}\b", head)) == 1, epoch
    figures = re.findall(r"\d[\d,.]*[MG]?(?= \w)", head)
    assert len(figures) == len(set(figures)) == 3 - (unit in ("tokens", "packs")), epoch


def test_reshard_tells_its_own_drops_from_the_inherited(demo_packed, tmp_path, capsys):
    folder, source = demo_packed
    lengths = [n for _, pack in iter_dataset_packs(*open_dataset(str(folder))) for n in pack.seq_lens]
    too_long = sum(n > 700 for n in lengths)
    assert too_long > 0
    capsys.readouterr()
    assert main(["reshard", str(folder), str(tmp_path / "re"), "--seq-len", "700", "--max-drop-fraction", "1",
                 "--quiet"]) == 0
    out = capsys.readouterr().out.splitlines()
    inherited = ", ".join(f"{k} {v}" for k, v in sorted(source.dropped_by_reason.items()))
    expected = (f"dropped  {source.samples_dropped} carried from the original job ({inherited}); "
                f"{too_long} by this reshard (too_long {too_long})")
    assert expected in out, out
    assert out[0].startswith(f"samples  read {source.samples_read}  packed {len(lengths) - too_long}  "
                             f"dropped {source.samples_dropped + too_long} ")
