"""Mixtures (issue #21): the spec, compatibility, the mixture epoch and the per-slot schedule."""

from __future__ import annotations

import itertools
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from wdspack.errors import ConfigError
from wdspack.format.dataset import read_pack_index, resolve_source
from wdspack.format.manifest import read_manifest
from wdspack.loader.mixture.merge import merge_sources, plan_slot, slot_phase
from wdspack.loader.mixture.spec import (
    Mixture,
    MixtureSource,
    check_compatible,
    is_mixture_spec,
    mixture_epoch,
    unit_values,
)
from wdspack.loader.mixture.streams import SourceCursor, pass_share, share_order, slot_stream, source_layout
from wdspack.loader.plan import shuffle_order

SEQ = 4096


# ---------------------------------------------------------------------------------------------
# The spec


def test_python_forms_and_shares():
    m = Mixture.of([("data/llava/", 3), ("hf://datasets/org/captions@main", 1, "caps")])
    assert m.names == ("llava", "caps")
    assert m.shares == (0.75, 0.25)
    assert m.unit == "tokens"
    same = Mixture.of([MixtureSource("data/llava/", 3), {"path": "hf://datasets/org/captions@main", "weight": 1,
                                                         "name": "caps"}])
    assert same == m
    assert Mixture.of(m) is m
    assert Mixture.of(m, unit="supervised_tokens").unit == "targets"
    assert MixtureSource("s3://bucket/sets/ocr/manifest.json", 1).name == "ocr"
    assert MixtureSource("hf://datasets/org/llava@v2", 1).name == "llava"
    assert MixtureSource("data/packed/train-{000000..000009}.tar", 1).name == "packed"


def test_files_yaml_and_json_resolve_relative_paths(tmp_path):
    folder = tmp_path / "mixtures"
    folder.mkdir()
    (folder / "stage1.yaml").write_text(
        "sources:\n"
        "  - {path: ../packed/llava, weight: 0.7}\n"
        "  - {path: /abs/captions/, weight: 0.3, name: caps, max_passes: 2}\n"
        "  - {path: 'hf://datasets/org/ocr@main', weight: 0.1}\n"
        "unit: supervised_tokens\n")
    m = Mixture.load(folder / "stage1.yaml")
    assert m.paths == (str(tmp_path / "packed" / "llava"), "/abs/captions/", "hf://datasets/org/ocr@main")
    assert m.names == ("llava", "caps", "ocr")
    assert m.unit == "targets"
    assert m.sources[1].max_passes == 2
    (folder / "stage2.json").write_text(json.dumps({"sources": [{"path": "a", "weight": 1}, {"path": "b", "weight": 3}],
                                                    "unit": "packs"}))
    j = Mixture.of(str(folder / "stage2.json"))
    assert j.paths == (str(folder / "a"), str(folder / "b")) and j.shares == (0.25, 0.75) and j.unit == "packs"
    assert is_mixture_spec(folder / "stage1.yaml") and is_mixture_spec(str(folder / "stage2.json"))
    (folder / "manifest.json").write_text(json.dumps({"sources": []}))
    (folder / "other.json").write_text(json.dumps({"format": "x"}))
    assert not is_mixture_spec(str(folder / "manifest.json"))
    assert not is_mixture_spec(str(folder / "other.json"))
    assert not is_mixture_spec(str(tmp_path / "packed"))
    assert not is_mixture_spec(["a/train-000000.tar", "a/train-000001.tar"])
    assert is_mixture_spec({"sources": []}) and is_mixture_spec([("a", 1)]) and is_mixture_spec(m)
    with pytest.raises(ConfigError, match="not a mixture file"):
        Mixture.of(str(tmp_path / "packed"))


@pytest.mark.parametrize(("value", "match"), [
    ({"sources": [{"path": "a", "weight": 1}], "units": "tokens"}, r"unknown keys \['units'\].*\['sources', 'unit'\]"),
    ({"sources": [{"path": "a", "weight": 1, "wieght": 2}]}, r"unknown keys \['wieght'\].*'max_passes'"),
    ({"sources": [{"path": "a"}]}, "has no 'weight'"),
    ({"sources": "a"}, "give a list"),
    ({"sources": []}, "at least one source"),
    ({"sources": [{"path": "a", "weight": 1}], "unit": "bytes"}, "unit 'bytes' is not one of"),
    ([("a", 0)], "weight 0; give a finite number > 0"),
    ([("a", -1)], "weight -1"),
    ([("a", float("nan"))], "weight nan"),
    ([("a", float("inf"))], "weight inf"),
    ([("a", "0.5")], "weight '0.5'"),
    ([("a", True)], "weight True"),
    ([{"path": "a", "weight": 1, "max_passes": 0}], "max_passes 0"),
    ([("", 1)], "non-empty"),
    ([("x/llava", 1), ("y/llava/", 2)], "'x/llava' and 'y/llava/' are both named 'llava'; give one of them a name"),
    (42, "cannot read a mixture from int"),
])
def test_bad_specs_are_refused_naming_the_value(value, match):
    with pytest.raises(ConfigError, match=match):
        Mixture.of(value)


def test_bad_file_is_refused(tmp_path):
    (tmp_path / "m.yaml").write_text("sources: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        Mixture.load(tmp_path / "m.yaml")
    (tmp_path / "list.yaml").write_text("- {path: a, weight: 1}\n")
    with pytest.raises(ConfigError, match="holds a list"):
        Mixture.load(tmp_path / "list.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        Mixture.load(tmp_path / "missing.yaml")


# ---------------------------------------------------------------------------------------------
# Compatibility, on the real demo manifest


def _variant(demo_folder: Path, tmp_path: Path, name: str, edit) -> Path:
    out = tmp_path / name
    out.mkdir()
    d = json.loads((demo_folder / "manifest.json").read_text())
    edit(d)
    (out / "manifest.json").write_text(json.dumps(d))
    return out


def test_compatible_sources_pass_and_mismatches_are_refused(demo_packed, tmp_path, caplog):
    folder, _ = demo_packed
    ref = read_manifest(folder)
    assert ref.seq_len == 2048 and any(s.images for s in ref.shards)
    check_compatible(["a", "b"], [ref, read_manifest(folder)])

    def seq(d):
        d["seq_len"] = 4096

    def vocab(d):
        d["tokenizer"]["vocab_size"] += 1000

    def template(d):
        d["tokenizer"]["chat_template_sha256"] = "f" * 64

    def per_image(d):
        d["image_policy"] = {"kind": "fixed", "tokens_per_image": 64}

    def processor(d):
        d["image_policy"] = {"kind": "processor", "name": "Qwen/Qwen2-VL-2B-Instruct", "family": "qwen2_vl"}

    cases = [(seq, r"'b' has seq_len 4096 but 'a' has 2048.*wdspack reshard SOURCE OUTPUT --seq-len 2048"),
             (vocab, r"'b' has tokenizer vocab_size \d+ but 'a' has \d+.*re-pack 'b' with the tokenizer of 'a'"),
             (template, r"'b' has chat template sha256 'ffffffffffff'.*--chat-template"),
             (per_image, r"'b' has tokens per image 64 but 'a' has 16.*--tokens-per-image 16"),
             (processor, r"'b' has image policy 'processor' but 'a' has 'fixed'.*--tokens-per-image 16")]
    for k, (edit, match) in enumerate(cases):
        other = read_manifest(_variant(folder, tmp_path, f"v{k}", edit))
        with pytest.raises(ConfigError, match=match):
            check_compatible(["a", "b"], [ref, other])

    def text_only(d):  # no images: its image policy does not matter
        d["image_policy"] = {"kind": "fixed", "tokens_per_image": 64}
        d["totals"]["images"] = 0
        for s in d["shards"]:
            s["images"] = 0

    def renamed(d):  # the same tokenizer under another name (a local path), and another max_images
        d["tokenizer"]["name"] = "/models/pixtral"
        d["max_images"] = 12

    with caplog.at_level(logging.WARNING, logger="wdspack.loader"):
        check_compatible(["a", "t", "r"], [ref, read_manifest(_variant(folder, tmp_path, "text", text_only)),
                                           read_manifest(_variant(folder, tmp_path, "renamed", renamed))])
    assert "name their tokenizers differently" in caplog.text
    text = read_manifest(tmp_path / "text")
    with pytest.raises(ConfigError, match="'b' has tokens per image 64 but 'a' has 16"):  # images: against 'a'
        check_compatible(["t", "a", "b"], [text, ref, read_manifest(tmp_path / "v3")])

    def no_template(d):  # packed without a chat template (pre-training text): any template goes with it
        d["tokenizer"]["chat_template_sha256"] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

    check_compatible(["n", "a"], [read_manifest(_variant(folder, tmp_path, "none", no_template)), ref])
    with pytest.raises(ConfigError, match="'b' has chat template sha256 'ffffffffffff' but 'a' has"):
        check_compatible(["n", "a", "b"], [read_manifest(tmp_path / "none"), ref, read_manifest(tmp_path / "v2")])
    with pytest.raises(ConfigError, match=r"'s' has no manifest\.json"):
        check_compatible(["a", "s"], [ref, None])


def test_demo_dataset_plans_from_its_pack_index(demo_packed, tmp_path):
    """Two real sources (the demo and a copy): units from the pack index, every row a real pack."""
    folder, _ = demo_packed
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    mixture = Mixture.of([(str(folder), 1, "demo"), (str(copy), 3, "copy")], unit="targets")
    resolved = [resolve_source(p) for p in mixture.paths]
    check_compatible(mixture.names, [r.manifest for r in resolved])
    indexes = [np.concatenate(read_pack_index(r)) for r in resolved]
    units = [unit_values(ix, mixture.unit) for ix in indexes]
    epoch = mixture_epoch(mixture, [int(u.sum()) for u in units], [len(u) for u in units])
    assert epoch.passes[0] == pytest.approx(0.5) and epoch.passes[1] == pytest.approx(1.5)
    layouts = [source_layout(n, [s.packs for s in r.shards], u) for n, r, u in zip(mixture.names, resolved, units)]
    per_slot = epoch.per_slot(2, 2)
    plans = [plan_slot(layouts, mixture.shares, slot=s, slots=2, per_slot=per_slot, seed=5) for s in range(2)]
    for p in plans:
        assert len(p.source) == per_slot
        for i, ix in enumerate(indexes):
            mask = p.source == i
            assert np.array_equal(p.units[mask], ix[p.row[mask], 6])  # targets column
            starts = np.cumsum([0] + [s.packs for s in resolved[i].shards])
            assert np.array_equal(p.row[mask], starts[p.shard[mask]] + p.pack[mask])
    got = sum(float(p.units[p.source == 1].sum()) for p in plans) / sum(float(p.units.sum()) for p in plans)
    assert abs(got - 0.75) < 0.05  # a tiny epoch (a few dozen packs): the share holds to within a pack or two


# ---------------------------------------------------------------------------------------------
# The mixture epoch


def test_epoch_definition_passes_caps_and_upsampling():
    m = Mixture.of([("a", 1), ("b", 1)])
    e = mixture_epoch(m, units=[100, 300], packs=[10, 30])
    assert e.total == 400 and e.passes == (2.0, 2 / 3) and e.capped_by is None
    assert e.source_units == (200.0, 200.0) and e.source_packs == (20.0, 20.0) and e.epoch_packs == 40
    assert e.per_slot(4, 2) == 10 and e.per_slot(3, 1) == 13
    capped = mixture_epoch(Mixture.of([MixtureSource("a", 1, max_passes=1.5), MixtureSource("b", 1)]), [100, 300],
                           [10, 30])
    assert capped.total == 300 and capped.passes == (1.5, 0.5) and capped.capped_by == "a"
    loose = mixture_epoch(Mixture.of([MixtureSource("a", 1, max_passes=5), MixtureSource("b", 1)]), [100, 300],
                          [10, 30])
    assert loose.total == 400 and loose.capped_by is None
    with pytest.raises(ConfigError, match="too few for 64"):
        e.per_slot(64, 1)


def test_schedule_makes_the_epochs_passes():
    """A small source upsampled (2.5 passes), a capped one, a big one read in part: the slots together
    take what the epoch says, to within a pack per slot."""
    rng = np.random.default_rng(0)
    small = source_layout("small", [50] * 4, (rng.uniform(0.5, 1, 200) * SEQ).astype(np.int64))
    capped = source_layout("capped", [100] * 6, (rng.uniform(0.5, 1, 600) * SEQ).astype(np.int64))
    big = source_layout("big", [500] * 8, (rng.uniform(0.9, 1, 4000) * SEQ).astype(np.int64))
    m = Mixture.of([MixtureSource("small", 0.25), MixtureSource("capped", 0.3, max_passes=1),
                    MixtureSource("big", 0.45)])
    e = mixture_epoch(m, [int(x.units.sum()) for x in (small, capped, big)], [200, 600, 4000])
    assert e.capped_by == "capped" and e.passes[1] == pytest.approx(1.0)
    assert 2.4 < e.passes[0] < 2.6 and e.passes[2] < 0.5
    slots = 4
    plans = [plan_slot([small, capped, big], m.shares, slot=s, slots=slots, per_slot=e.per_slot(slots, 2), seed=1)
             for s in range(slots)]
    taken = sum(p.taken for p in plans)
    assert np.abs(taken - np.array(e.source_packs)).max() <= 2 * slots
    assert max(int(p.pass_no[p.source == 0].max()) for p in plans) == 2  # passes 0, 1 and half of 2
    assert max(int(p.pass_no[p.source == 1].max()) for p in plans) <= 1


def test_text_only_source_weighed_in_images_is_refused():
    m = Mixture.of([("photos", 1), ("books", 1)], unit="images")
    with pytest.raises(ConfigError, match=r"'books' holds no images but has weight 1.*unit: tokens"):
        mixture_epoch(m, units=[500, 0], packs=[100, 100])


def test_unit_values_follow_the_index_columns():
    rows = np.array([[0, 2000, 9, 3, 2, 64, 900], [512, 1000, 9, 1, 0, 0, 10]])
    assert unit_values(rows, "tokens").tolist() == [2000, 1000]
    assert unit_values(rows, "supervised_tokens").tolist() == [900, 10]
    assert unit_values(rows, "images").tolist() == [2, 0]
    assert unit_values(rows, "samples").tolist() == [3, 1]
    assert unit_values(rows, "packs").tolist() == [1, 1]


# ---------------------------------------------------------------------------------------------
# The schedule


def _layouts(seed: int, n: int = 16_000, shards: int = 20, kinds=("uniform", "full")):
    rng = np.random.default_rng(seed)
    out = []
    for k, kind in enumerate(kinds):
        if kind == "uniform":  # long answers and short captions: packs between half full and full
            units = rng.uniform(0.5, 1.0, n)
        elif kind == "full":
            units = rng.uniform(0.93, 0.97, n)
        else:
            units = rng.uniform(0.2, 1.0, n)
        counts = np.full(shards, n // shards)
        counts[: n % shards] += 1
        out.append(source_layout(f"s{k}", counts.tolist(), (units * SEQ).astype(np.int64)))
    return out


def _epoch(layouts, shares, *, slots, batch, seed=0, cursors=None, workers=1, **kw):
    """Every slot's plan of one epoch (``slots`` = ranks × workers; ``cursors`` per slot)."""
    m = Mixture.of([(f"s{k}", w) for k, w in enumerate(shares)])
    e = mixture_epoch(m, [int(x.units.sum()) for x in layouts], [x.packs for x in layouts])
    per_slot = e.per_slot(slots, batch)
    if workers > 1:
        kw = {"workers": workers, "batch_size": batch, **kw}
    return [plan_slot(layouts, m.shares, slot=s, slots=slots, per_slot=per_slot, seed=seed,
                      cursors=None if cursors is None else cursors[s], **kw) for s in range(slots)]


def _window_error(units: np.ndarray, source: np.ndarray, shares, min_steps: int = 100) -> float:
    """The largest |achieved - weight| share (points) over every window of >= ``min_steps`` steps (rows)."""
    per = np.stack([(units * (source == i)).sum(1) for i in range(len(shares))], 1).astype(np.float64)
    cs = np.vstack([np.zeros((1, len(shares))), np.cumsum(per, 0)])
    total = cs.sum(1)
    worst = 0.0
    for n in range(min_steps, len(per) + 1):
        got = (cs[n:] - cs[:-n]) / (total[n:] - total[:-n])[:, None]
        worst = max(worst, float(np.abs(got - shares).max()))
    return 100 * worst


def _steps(plans, batch, workers=1):
    """``[steps, ranks * batch]`` units and sources as the DataLoaders yield them: rank r's batch t is
    worker ``t % workers``'s batch ``t // workers`` (slot ``r * workers + t % workers``), and global
    step t is every rank's t-th batch."""
    per = len(plans[0].source) // batch  # batches per worker
    ranks = len(plans) // workers
    units = np.empty((per * workers, ranks * batch), np.int64)
    source = np.empty_like(units)
    for s, p in enumerate(plans):
        r, w = divmod(s, workers)
        units[w::workers, r * batch:(r + 1) * batch] = p.units.reshape(per, batch)
        source[w::workers, r * batch:(r + 1) * batch] = p.source.reshape(per, batch)
    return units, source


def _errors(units, source, shares, ranks, batch):
    w = np.asarray(shares, np.float64) / sum(shares)
    glob = _window_error(units, source, w)
    rank = max(_window_error(units[:, r * batch:(r + 1) * batch], source[:, r * batch:(r + 1) * batch], w)
               for r in range(ranks))
    tot = np.array([(units * (source == i)).sum() for i in range(len(w))], np.float64)
    return glob, rank, 100 * float(np.abs(tot / tot.sum() - w).max())


def _peer_draw(layouts, shares, steps, width, seed):
    """The peers' way: each pack's source drawn at random (seeded), weighted to meet the shares in expectation."""
    rng = np.random.default_rng(seed)
    w = np.asarray(shares, np.float64)
    p = w / np.array([x.mean_units for x in layouts])
    source = rng.choice(len(layouts), size=(steps, width), p=p / p.sum())
    units = np.zeros_like(source)
    for i, x in enumerate(layouts):
        units[source == i] = rng.choice(x.units, int((source == i).sum()))
    return units, source


@pytest.mark.parametrize(("kinds", "shares"), [
    (("uniform", "full"), (0.5, 0.5)),
    (("uniform", "full"), (0.2, 0.8)),
    (("uniform", "full", "wide"), (0.5, 0.3, 0.2)),
])
def test_achieved_share_over_every_window(kinds, shares, capsys):
    """Issue #21's target: every window of >= 100 global steps (8 ranks × 2 packs) within 0.5 points of
    the weight, 1 point per rank, 0.1 over the epoch; the peers' random draw is measured beside it."""
    ranks, batch = 8, 2
    layouts = _layouts(1, kinds=kinds)
    plans = _epoch(layouts, shares, slots=ranks, batch=batch)
    units, source = _steps(plans, batch)
    assert len(units) >= 1500
    glob, rank, epoch = _errors(units, source, shares, ranks, batch)
    peer = _errors(*_peer_draw(layouts, shares, len(units), ranks * batch, seed=0), shares, ranks, batch)
    with capsys.disabled():
        print(f"\n{kinds} {shares}: {len(units)} steps; max error (points) over windows >= 100 steps: "
              f"wdspack global {glob:.3f} per rank {rank:.3f} epoch {epoch:.4f}; "
              f"random draw global {peer[0]:.3f} per rank {peer[1]:.3f} epoch {peer[2]:.4f}")
    assert glob <= 0.5
    assert rank <= 1.0
    assert epoch <= 0.1


@pytest.mark.parametrize(("ranks", "workers"), [(8, 2), (4, 4)])
@pytest.mark.parametrize(("kinds", "shares"), [
    (("uniform", "full"), (0.5, 0.5)),
    (("uniform", "full"), (0.2, 0.8)),
    (("uniform", "full", "wide"), (0.5, 0.3, 0.2)),
])
def test_achieved_share_over_every_window_with_workers(kinds, shares, ranks, workers, capsys):
    """The same target with several DataLoader workers per rank, in the order the DataLoader yields
    their batches (round robin): the rank's merge spans its workers, so its error is one worker's.

    With 4 ranks a window of 100 steps holds 800 packs, half the 8-rank one's, and the three-source
    mix sits at the packs' granularity: one worker per rank gives 0.47-0.60 points globally there
    too (seeds 0-2). So for fewer than 8 ranks the global error is held to one worker's (+0.05)."""
    batch = 2
    layouts = _layouts(1, kinds=kinds)
    plans = _epoch(layouts, shares, slots=ranks * workers, batch=batch, workers=workers)
    for r in range(ranks):  # every worker of a rank plans the same rank: the same cursors
        assert len({plans[r * workers + w].end for w in range(workers)}) == 1
    units, source = _steps(plans, batch, workers)
    assert len(units) >= 1500
    glob, rank, epoch = _errors(units, source, shares, ranks, batch)
    line = (f"\n{kinds} {shares} {ranks} ranks × {workers} workers: {len(units)} steps; max error (points) over "
            f"windows >= 100 steps: global {glob:.3f} per rank {rank:.3f} epoch {epoch:.4f}")
    bound = 0.5
    if ranks < 8:
        one = _errors(*_steps(_epoch(layouts, shares, slots=ranks, batch=batch), batch), shares, ranks, batch)
        bound = max(bound, one[0] + 0.05)
        line += f"; one worker per rank: global {one[0]:.3f} per rank {one[1]:.3f}"
    with capsys.disabled():
        print(line)
    assert glob <= bound
    assert rank <= 1.0
    assert epoch <= 0.1


def test_equal_packs_are_dephased_between_slots():
    """Equal packs give every slot the same pattern; the slots' phases keep the global error small anyway."""
    layouts = [source_layout(f"s{k}", [4000] * 4, np.full(16_000, 4000)) for k in range(3)]
    plans = _epoch(layouts, (0.5, 0.3, 0.2), slots=8, batch=2)
    glob, rank, epoch = _errors(*_steps(plans, 2), (0.5, 0.3, 0.2), 8, 2)
    assert glob <= 0.25 and rank <= 1.0 and epoch <= 0.01


@pytest.mark.parametrize("workers", [1, 2])
def test_same_inputs_same_schedule_and_seed_matters(workers):
    layouts = _layouts(2, n=3000)
    a = _epoch(layouts, (0.5, 0.5), slots=4, batch=2, seed=7, workers=workers)
    b = _epoch(layouts, (0.5, 0.5), slots=4, batch=2, seed=7, workers=workers)
    c = _epoch(layouts, (0.5, 0.5), slots=4, batch=2, seed=8, workers=workers)
    for x, y in zip(a, b):
        for field in ("source", "pass_no", "shard", "pack", "row", "units"):
            assert np.array_equal(getattr(x, field), getattr(y, field))
        assert x.end == y.end and x.reads == y.reads
    assert not all(np.array_equal(x.row, z.row) for x, z in zip(a, c))


def test_every_pack_of_a_pass_once_and_passes_in_order():
    """Upsampled (a small source at 50 %): over epochs, every pass of every source is read exactly once
    across the slots, and on each slot a pass is finished before the next one starts."""
    small = source_layout("small", [7, 9, 5, 11], np.full(32, 3000))
    big = source_layout("big", [40] * 10, np.full(400, 3000))
    slots, batch = 3, 2
    cursors = None
    seen: dict[tuple[int, int], list[int]] = {}
    epochs = []
    for _ in range(3):
        plans = _epoch([small, big], (0.5, 0.5), slots=slots, batch=batch, seed=3, cursors=cursors, shuffle_buffer=8)
        epochs.append(plans)
        cursors = [p.end for p in plans]
        for p in plans:
            for i in range(2):
                passes = p.pass_no[p.source == i]
                assert (np.diff(passes) >= 0).all()
                for q in np.unique(passes):
                    seen.setdefault((i, int(q)), []).extend(p.row[(p.source == i) & (p.pass_no == q)].tolist())
    assert max(q for i, q in seen if i == 0) >= 5  # the small source made several passes
    complete = {q for i, q in seen if i == 0 and all(p.end[0].pass_no > q for p in epochs[-1])}
    assert len(complete) >= 4
    for q in complete:
        assert sorted(seen[(0, q)]) == list(range(32))
    for rows in seen.values():
        assert len(rows) == len(set(rows))  # within a pass nothing twice, finished or not


def _open_pass(cursor: SourceCursor) -> int:
    """The first pass a rank has not handed out whole (its frontier's, or a held block's)."""
    return min([cursor.pass_no] + [h[1] for h in cursor.held])


def test_every_pack_of_a_pass_once_as_workers_and_weights_change():
    """Epochs with 2, 2, 4, 1, 3 and 2 workers per rank and new weights at two continuation boundaries, each
    from the cursors the one before left: within a pass no pack is read twice (across ranks, workers
    and epochs), every pass handed out whole is read whole, a worker's passes go up within an epoch,
    and all the workers of a rank end at the same cursor."""
    rng = np.random.default_rng(5)
    small = source_layout("small", [7, 9, 5, 11], rng.integers(1000, 4000, 32))
    big = source_layout("big", [40] * 10, rng.integers(1000, 4000, 400))
    ranks, batch = 2, 2
    cursors: list = [None] * ranks
    seen: dict[tuple[int, int], list[int]] = {}
    for workers, shares in [(2, (0.5, 0.5)), (2, (0.5, 0.5)), (4, (0.3, 0.7)), (1, (0.3, 0.7)), (3, (0.6, 0.4)),
                            (2, (0.6, 0.4))]:
        plans = _epoch([small, big], shares, slots=ranks * workers, batch=batch, seed=3, shuffle_buffer=8,
                       workers=workers, cursors=[cursors[s // workers] for s in range(ranks * workers)])
        for r in range(ranks):
            assert len({p.end for p in plans[r * workers:(r + 1) * workers]}) == 1
        cursors = [plans[r * workers].end for r in range(ranks)]
        for p in plans:
            for i in range(2):
                passes = p.pass_no[p.source == i]
                assert (np.diff(passes) >= 0).all()
                for q in np.unique(passes):
                    seen.setdefault((i, int(q)), []).extend(p.row[(p.source == i) & (p.pass_no == q)].tolist())
    for rows in seen.values():
        assert len(rows) == len(set(rows))  # within a pass nothing twice, finished or not
    for i, layout in enumerate((small, big)):
        whole = min(_open_pass(c[i]) for c in cursors)
        assert whole >= (10 if i == 0 else 2)  # the small source made many passes, the big one a few
        for q in range(whole):
            assert sorted(seen[(i, q)]) == list(range(layout.packs))
    assert any(c[1].held for c in cursors)  # the big source's blocks outlive an epoch


def test_a_worker_finishes_its_block_in_the_next_epoch():
    """A block a worker began (a held block of the rank's cursor) is that worker's to finish: its first
    packs of the source in the next epoch come from the block's reading positions."""
    layouts = _layouts(6, n=4000, shards=8)
    ranks, workers = 2, 3
    first = _epoch(layouts, (0.5, 0.5), slots=ranks * workers, batch=2, seed=2, workers=workers)
    second = _epoch(layouts, (0.5, 0.5), slots=ranks * workers, batch=2, seed=2, workers=workers,
                    cursors=[p.end for p in first])
    checked = 0
    for r in range(ranks):
        for i, layout in enumerate(layouts):
            for v, q, a, b, done in first[r * workers].end[i].held:
                share = pass_share(layout.counts, slots=ranks, slot=r, pass_no=q, seed=2, key=layout.key)
                starts = np.cumsum([0, *layout.counts])
                reading = np.concatenate([starts[x.shard] + np.arange(x.start, x.stop) for x in share])
                mine = second[r * workers + v]
                rows = mine.row[mine.source == i][:b - a - done]  # the rest of its block
                assert set(rows.tolist()) <= set(reading[a:b].tolist())
                assert (mine.pass_no[mine.source == i][:b - a - done] == q).all()
                checked += 1
    assert checked >= ranks * workers  # a block of the big source is held on every worker


@pytest.mark.parametrize(("workers", "batch"), [(2, 1), (2, 2), (3, 2), (4, 3)])
def test_workers_take_their_batches_of_the_rank_merge(workers, batch):
    """Equal packs within each source: the pack a source gives next weighs the same on every worker, so
    the rank's batches, in the DataLoader's round robin, are exactly the one merge of the rank (one
    sort, :func:`merge_sources`, with the rank's phases); a longer plan begins with the shorter one."""
    units = (4000, 1000, 2500)
    layouts = [source_layout(n, [30] * 4, np.full(120, u)) for n, u in zip("abc", units)]
    shares, ranks, per_slot = (0.5, 0.3, 0.2), 2, 12 * batch
    for r in range(ranks):
        plans = [plan_slot(layouts, shares, slot=r * workers + v, slots=ranks * workers, per_slot=per_slot, seed=0,
                           workers=workers, batch_size=batch) for v in range(workers)]
        got = np.concatenate([plans[t % workers].source[t // workers * batch:(t // workers + 1) * batch]
                              for t in range(per_slot // batch * workers)])
        offsets = [slot_phase(r, ranks, i) * u / w for i, (u, w) in enumerate(zip(units, shares))]
        want, _ = merge_sources([np.full(1000, u) for u in units], shares, len(got), offsets=offsets)
        assert got.tolist() == want.tolist()
        longer = plan_slot(layouts, shares, slot=r * workers + 1, slots=ranks * workers, per_slot=per_slot + batch + 1,
                           seed=0, workers=workers, batch_size=batch)
        for field in ("source", "row", "pass_no"):
            assert np.array_equal(getattr(longer, field)[:per_slot], getattr(plans[1], field))


def test_shares_of_a_pass_partition_it():
    counts = [7, 0, 9, 5, 11, 3]
    for pass_no in range(4):
        ranges = [r for s in range(5) for r in pass_share(counts, slots=5, slot=s, pass_no=pass_no, seed=1, key=2)]
        got = [(r.shard, k) for r in ranges for k in range(r.start, r.stop)]
        assert sorted(got) == [(s, k) for s, n in enumerate(counts) for k in range(n)]
        sizes = [sum(len(r) for r in pass_share(counts, slots=5, slot=s, pass_no=pass_no, seed=1, key=2))
                 for s in range(5)]
        assert max(sizes) - min(sizes) <= 1


def test_cursors_continue_across_epochs():
    layouts = _layouts(3, n=2000)
    first = _epoch(layouts, (0.4, 0.6), slots=2, batch=2, seed=1)
    second = _epoch(layouts, (0.4, 0.6), slots=2, batch=2, seed=1, cursors=[p.end for p in first])
    changed = _epoch(layouts, (0.9, 0.1), slots=2, batch=2, seed=1, cursors=[p.end for p in first])  # new weights
    for s in range(2):
        for i, layout in enumerate(layouts):
            a = first[s].row[first[s].source == i]
            b = second[s].row[second[s].source == i]
            c = changed[s].row[changed[s].source == i]
            passes, rows, end = slot_stream(layout, slot=s, slots=2, seed=1, packs=len(a) + len(b))
            assert np.array_equal(np.concatenate([a, b]), rows)  # nothing skipped, nothing read twice
            assert end == second[s].end[i]
            assert np.array_equal(c, slot_stream(layout, slot=s, slots=2, seed=1, packs=len(a) + len(c))[1][len(a):])
            assert np.array_equal(second[s].pass_no[second[s].source == i], passes[len(a):])


def test_merge_is_a_low_discrepancy_interleave():
    src, taken = merge_sources([np.full(8, 10), np.full(8, 10), np.full(8, 10)], [2, 1, 1], 8)
    assert src.tolist() == [0, 1, 2, 0, 0, 1, 2, 0] and taken.tolist() == [4, 2, 2]
    src, _ = merge_sources([np.full(20, 100), np.full(20, 50)], [1, 1], 12)  # in units: one big pack per two small
    assert src.tolist() == [1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1]
    src, _ = merge_sources([np.array([0, 0, 5, 5]), np.full(4, 5)], [1, 1], 6)  # 0-unit packs ride along
    assert src.tolist() == [0, 0, 0, 1, 0, 1]
    with pytest.raises(ConfigError, match="finite numbers > 0"):
        merge_sources([np.ones(3)], [0], 1)


def test_share_order_is_the_shuffle_buffer_order():
    for n, size in [(0, 4), (1, 4), (4, 4), (5, 4), (100, 1), (1000, 7), (5000, 256)]:
        fast = share_order(n, buffer_size=size, seed=3, key=9, pass_no=2, slot=1)
        slow = shuffle_order(n, buffer_size=size, rng=np.random.default_rng([3, 9, 2, 1, 0xB0F]))
        assert np.array_equal(fast, slow)


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_reads_cover_the_schedule_and_keep_the_request_economy(workers, capsys):
    """Each slot's reads cover its packs; a rank's workers never read the same pack in an epoch (each
    reads its own blocks); a rank-epoch makes at most Σ(shards + 3) requests (4 ranks, 3 epochs)."""
    layouts = _layouts(4, n=6000, shards=30, kinds=("uniform", "full", "wide"))
    ranks = 4
    budget = sum(len(x.counts) + 3 for x in layouts)  # Σ(shards + 3) requests per rank-epoch
    cursors, counts = None, []
    for _ in range(3):
        plans = _epoch(layouts, (0.5, 0.3, 0.2), slots=ranks * workers, batch=2, shuffle_buffer=64, workers=workers,
                       cursors=cursors)
        cursors = [p.end for p in plans]
        for r in range(ranks):
            mine = plans[r * workers:(r + 1) * workers]
            counts.append(sum(len(p.reads) for p in mine))
            assert counts[-1] <= budget
            spans = sorted((x.source, x.pass_no, x.shard, x.start, x.stop) for p in mine for x in p.reads)
            for a, b in itertools.pairwise(spans):
                assert a[:3] != b[:3] or a[4] <= b[3], (a, b)  # no pack read twice in the rank-epoch
            for p in mine:
                by_key: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
                for x in p.reads:
                    by_key.setdefault((x.source, x.pass_no, x.shard), []).append((x.start, x.stop))
                for i, q, sh, k in zip(p.source.tolist(), p.pass_no.tolist(), p.shard.tolist(), p.pack.tolist()):
                    assert any(a <= k < b for a, b in by_key[(i, q, sh)])
    with capsys.disabled():
        print(f"\n{ranks} ranks × {workers} workers: ranged reads per rank-epoch {min(counts)}-{max(counts)} "
              f"(budget Σ(shards + 3) = {budget})")


def test_cursor_from_another_layout_is_refused():
    layout = source_layout("a", [10, 10], np.ones(20, np.int64))
    with pytest.raises(ConfigError, match="saved under another layout"):
        plan_slot([layout], [1], slot=0, slots=4, per_slot=2, seed=0, cursors=[SourceCursor(0, 9)])
    # ranks of 10 packs: a block past a share's end, a frontier past it
    for bad in (SourceCursor(0, 0, ((0, 0, 3, 14, 1),), True), SourceCursor(0, 11, (), True)):
        with pytest.raises(ConfigError, match="saved under another layout of ranks"):
            plan_slot([layout], [1], slot=0, slots=4, per_slot=2, seed=0, workers=2, cursors=[bad])
    with pytest.raises(ConfigError, match=r"slots=5 must be ranks × workers with workers=2"):
        plan_slot([layout], [1], slot=0, slots=5, per_slot=2, seed=0, workers=2)
