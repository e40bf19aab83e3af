"""`wdspack inspect MIXTURE.yaml` (issue #21, item 3): each source's epoch and the achieved mix.

Two small real packed datasets (tests/support/synthetic.py, with their pack index) make the mixture; the
numbers are checked against the pack index read directly with numpy, :func:`mixture_epoch` and the
schedule planned for the whole epoch by :func:`plan_slot` (the first steps are its prefix).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.support.synthetic import pack_numbers, write_dataset
from wdspack.cli import main
from wdspack.errors import ConfigError
from wdspack.format.manifest import read_manifest
from wdspack.format.pack_index import COLUMNS, INDEX_NAME
from wdspack.loader import PackedDataset, make_loader
from wdspack.loader.mixture.merge import plan_slot
from wdspack.loader.mixture.spec import Mixture, MixtureSource, mixture_epoch
from wdspack.loader.mixture.streams import source_layout
from wdspack.ops.inspect import dataset_stats, format_stats, is_mixture
from wdspack.ops.mixture import mixture_stats


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two packed datasets of the same seq_len and tokenizer: ``long`` (4 shards) and ``caps`` (3, uneven)."""
    root = tmp_path_factory.mktemp("mixture")
    write_dataset(root / "long", shards=4, packs_per_shard=30, seq_len=64, max_images=2, seed=1, pack_index=True)
    write_dataset(root / "caps", shards=3, packs_per_shard=[10, 12, 8], seq_len=64, max_images=2, seed=2,
                  pack_index=True)
    (root / "mix.yaml").write_text("sources:\n"
                                   "  - {path: long, weight: 0.7}\n"
                                   "  - {path: caps, weight: 0.3, name: captions}\n"
                                   "unit: targets\n")
    return root


def _index(folder) -> np.ndarray:
    return np.load(folder / INDEX_NAME, allow_pickle=False)


def _col(index: np.ndarray, name: str) -> np.ndarray:
    return index[:, COLUMNS.index(name)]


def test_epoch_numbers_follow_the_pack_index(sources):
    stats = mixture_stats(str(sources / "mix.yaml"), steps=20, ranks=2, batch_size=2)
    idx = [_index(sources / "long"), _index(sources / "caps")]
    m = Mixture.of(str(sources / "mix.yaml"))
    epoch = mixture_epoch(m, [int(_col(x, "targets").sum()) for x in idx], [len(x) for x in idx])
    assert stats["unit"] == "targets" and stats["seq_len"] == 64
    assert [s["name"] for s in stats["sources"]] == ["long", "captions"]
    assert stats["epoch"]["units"] == pytest.approx(epoch.total)
    assert stats["epoch"]["packs"] == pytest.approx(epoch.epoch_packs)
    assert stats["epoch"]["packs_per_slot"] == epoch.per_slot(2, 2)
    assert stats["epoch"]["steps"] == epoch.per_slot(2, 2) // 2
    for s, x, passes, units in zip(stats["sources"], idx, epoch.passes, epoch.source_units):
        assert s["passes"] == pytest.approx(passes)
        assert s["per_pass"] == {"packs": len(x), **{k: int(_col(x, k).sum())
                                                     for k in ("tokens", "targets", "images", "samples")}}
        assert s["expected"]["units"] == pytest.approx(units)
        assert s["expected"]["targets"] == pytest.approx(units)  # the unit is targets
        for key in ("tokens", "images", "samples"):
            assert s["expected"][key] == pytest.approx(passes * _col(x, key).sum())
        assert s["expected"]["packs"] == pytest.approx(passes * len(x))
    # the small source is upsampled, the big one read in part, as the weights in targets ask
    assert stats["sources"][0]["passes"] < 1 < stats["sources"][1]["passes"]
    token_shares = [s["expected"]["token_share"] for s in stats["sources"]]
    assert sum(token_shares) == pytest.approx(1.0)
    json.dumps({k: v for k, v in stats.items() if not k.startswith("_")})  # --json prints it


@pytest.mark.parametrize(("ranks", "workers", "batch_size"), [(2, 1, 2), (2, 2, 1), (3, 1, 1)])
def test_achieved_mix_is_the_schedules_first_steps(sources, ranks, workers, batch_size):
    """Rebuild the first steps from each slot's whole-epoch plan (planned as the loader plans it: the
    layout's workers and batch size): worker ``t % workers`` of every rank serves step ``t``; the shares
    are each source's units over all of them."""
    steps = 12
    stats = mixture_stats(str(sources / "mix.yaml"), steps=steps, ranks=ranks, workers=workers,
                          batch_size=batch_size, seed=3)
    idx = [_index(sources / "long"), _index(sources / "caps")]
    counts = [[s.packs for s in read_manifest(sources / name / "manifest.json").shards] for name in ("long", "caps")]
    layouts = [source_layout(n, c, _col(x, "targets")) for n, c, x in zip(("long", "captions"), counts, idx)]
    slots = ranks * workers
    per_slot = stats["epoch"]["packs_per_slot"]
    plans = [plan_slot(layouts, (0.7, 0.3), slot=s, slots=slots, per_slot=per_slot, seed=3, shuffle_buffer=128,
                       workers=workers, batch_size=batch_size)
             for s in range(slots)]  # the loader's default buffer of 256, shared by the two sources
    units = np.zeros((steps, 2), np.int64)
    tokens = np.zeros((steps, 2), np.int64)
    for t in range(steps):
        k = t // workers
        for r in range(ranks):
            p = plans[r * workers + t % workers]
            for pos in range(k * batch_size, (k + 1) * batch_size):
                i, row = int(p.source[pos]), int(p.row[pos])
                units[t, i] += _col(idx[i], "targets")[row]
                tokens[t, i] += _col(idx[i], "tokens")[row]
    assert stats["_steps"]["units"] == units.tolist()
    assert stats["_steps"]["tokens"] == tokens.tolist()
    a = stats["achieved"]
    assert a["steps"] == steps and a["packs"] == steps * ranks * batch_size
    assert a["shares"] == pytest.approx((units.sum(0) / units.sum()).tolist())
    assert a["token_shares"] == pytest.approx((tokens.sum(0) / tokens.sum()).tolist())
    assert a["max_error_points"] == pytest.approx(100 * np.abs(units.sum(0) / units.sum() - (0.7, 0.3)).max())


@pytest.mark.parametrize("workers", [1, 2])
def test_the_loader_reads_what_inspect_shows(sources, workers):
    """Each rank's loader over the mixture yields, batch after batch, the packs the first steps name:
    the source (``source_idx``) and the pack (its first token, 1000 + its row; tests/support/synthetic.py). With
    two DataLoader workers a rank's batches come from its workers in turn, as inspect lays them out."""
    ranks, batch_size, steps = 2, 2, 9
    stats = mixture_stats(str(sources / "mix.yaml"), steps=steps, ranks=ranks, workers=workers,
                          batch_size=batch_size, seed=5, shuffle_buffer=16)
    source, row = np.array(stats["_steps"]["source"]), np.array(stats["_steps"]["row"])
    for r in range(ranks):
        if workers == 1:  # the dataset alone, in this process
            ds = PackedDataset(str(sources / "mix.yaml"), rank=r, world_size=ranks, batch_size=batch_size, seed=5,
                               shuffle_buffer=16, text_only=True)
            got = [(int(ex["source_idx"]), pack_numbers(ex["input_ids"])[0])
                   for _, ex in zip(range(steps * batch_size), ds)]
        else:
            loader = make_loader(str(sources / "mix.yaml"), num_workers=workers, rank=r, world_size=ranks,
                                 batch_size=batch_size, seed=5, shuffle_buffer=16, text_only=True)
            got = [pair for _, batch in zip(range(steps), loader)
                   for pair in zip(batch["source_idx"].tolist(), pack_numbers(batch["input_ids"]))]
        cols = slice(r * batch_size, (r + 1) * batch_size)
        assert got == list(zip(source[:, cols].ravel().tolist(), row[:, cols].ravel().tolist())), r


def test_steps_are_capped_at_the_epoch_and_text_lines(sources):
    stats = mixture_stats(str(sources / "mix.yaml"), steps=10_000, ranks=2, batch_size=2)
    assert stats["achieved"]["steps"] == stats["epoch"]["steps"] < 10_000
    lines = "\n".join(format_stats(stats))
    assert "2 sources weighed in targets" in lines
    assert "captions" in lines and "long" in lines
    assert f"first {stats['epoch']['steps']} steps" in lines
    with pytest.raises(ConfigError, match="ranks=0"):
        mixture_stats(str(sources / "mix.yaml"), ranks=0)


def test_cli_prints_text_json_and_writes_the_plot(sources, tmp_path, capsys):
    png = tmp_path / "mix.png"
    assert main(["inspect", str(sources / "mix.yaml"), "--ranks", "2", "--batch-size", "2", "--steps", "15",
                 "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "achieved over the first 15 steps (60 packs, seed 0)" in out
    assert "2 ranks × 1 worker × 2 packs" in out
    assert f"plot      {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert main(["inspect", str(sources / "mix.yaml"), "--json", "--steps", "5", "--seed", "1"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["achieved"]["steps"] == 5 and shown["achieved"]["ranks"] == 1 and shown["achieved"]["seed"] == 1
    assert "_steps" not in shown
    assert shown == {k: v for k, v in mixture_stats(str(sources / "mix.yaml"), steps=5, seed=1).items()
                     if not k.startswith("_")}


def test_dataset_stats_takes_a_mixture_and_one_dataset_alike(sources):
    assert is_mixture(str(sources / "mix.yaml"))
    assert is_mixture([(str(sources / "long"), 1), (str(sources / "caps"), 1)])
    assert not is_mixture(str(sources / "long")) and not is_mixture(str(sources / "long" / "manifest.json"))
    mixed = dataset_stats(str(sources / "mix.yaml"), ranks=2)
    assert mixed["achieved"]["ranks"] == 2 and mixed["achieved"]["batch_size"] == 1
    one = dataset_stats(str(sources / "long"))
    assert one["packs"] == 120 and "mixture" not in one
    python = mixture_stats(Mixture((MixtureSource(str(sources / "long"), 1), MixtureSource(str(sources / "caps"), 1)),
                                   unit="packs"), steps=4)
    assert python["mixture"] == "2 sources" and python["unit"] == "packs"
    assert python["achieved"]["shares"] == [0.5, 0.5]  # packs: one of each every two steps


def test_source_without_pack_index_is_refused_naming_wdspack_index(sources, tmp_path, capsys):
    plain = tmp_path / "plain"
    write_dataset(plain, shards=2, packs_per_shard=5, seq_len=64, max_images=2, seed=9)  # no pack index
    mix = tmp_path / "mix.json"
    mix.write_text(json.dumps({"sources": [{"path": str(sources / "long"), "weight": 1},
                                           {"path": str(plain), "weight": 1}]}))
    with pytest.raises(ConfigError, match=r"'plain' .*no pack index.*`wdspack index "):
        mixture_stats(str(mix))
    assert main(["inspect", str(mix)]) == 2
    assert "wdspack index" in capsys.readouterr().err


def test_incompatible_sources_are_refused_first(sources, tmp_path):
    other = tmp_path / "wide"
    write_dataset(other, shards=1, packs_per_shard=4, seq_len=128, max_images=2, seed=5)  # no index either
    with pytest.raises(ConfigError, match=r"'wide' has seq_len 128 but 'long' has 64.*wdspack reshard"):
        mixture_stats([(str(sources / "long"), 1), (str(other), 1)])
    shutil.rmtree(other)
