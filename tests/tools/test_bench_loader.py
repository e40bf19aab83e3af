"""tools/bench_loader.py's side-by-side mode runs and reports what it says; speed is the tool's to measure."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    return importlib.import_module("tools.bench_loader")


def test_side_by_side_raw_decoders_decode_every_image_once():
    tool = _tool()
    jpeg = tool._photo_like(np.random.default_rng(0))
    pics = [[jpeg] * 2, [], [jpeg] * 3]
    rate, count, split = tool.raw_side_by_side(pics, 2)
    assert count == 5 and rate > 0
    # each decoder timed its own loop: CPU per image, and a wall that cannot be under its CPU
    assert split["decode_cpu_ms"] > 0 and split["decode_wall_over_cpu"] >= 0.99
    assert tool.raw_side_by_side(pics, 2, per_process=4)[1] == 8  # cycled to 2 × 4


def test_samples_that_fit_no_row_are_left_out_of_every_loader_alike(capsys):
    """At a short seq_len some generated samples fit no row: each loader gets the same rest (the packer
    would leave them out, the on-the-fly packers could not place them, a padded batch outgrows its rows)."""
    tool = _tool()
    ids = [np.zeros(n, np.uint32) for n in (10, 40, 20, 41)]
    pics = [[], [b"j"], [b"j"] * (tool.MAX_IMAGES + 1), []]
    texts = ["a", "b", "c", "d"]
    kept = tool.fitting(ids, pics, texts, seq_len=40, dataset="text-only")
    assert [len(x) for x in kept[0]] == [10, 40] and kept[1] == [[], [b"j"]] and kept[2] == ["a", "b"]
    said = capsys.readouterr().out
    assert f"2 of 4 samples do not fit a row of 40 tokens and {tool.MAX_IMAGES} images (the longest has 41" in said
    assert tool.fitting(ids[:1], pics[:1], texts[:1], seq_len=40) == (ids[:1], pics[:1], texts[:1])
    assert capsys.readouterr().out == ""


def test_the_decode_clock_sums_decoding_and_takes_itself_away():
    from tools.decode_clock import DecodeClock, since
    from wdspack.media.image.pixels import ImageTransform, make_image_transform

    jpeg = _tool()._photo_like(np.random.default_rng(0))
    transform, original = make_image_transform(size=32), ImageTransform.decode_resized
    clock = DecodeClock(2)
    with clock.installed():
        before = clock.totals()
        assert [p.shape for p in transform.decode_resized([jpeg] * 3)] == [(3, 32, 32)] * 3
        got = since(clock, before)
    assert ImageTransform.decode_resized is original
    assert got["decoded_images"] == 3 and got["decode_cpu_ms"] > 0 and got["decode_wall_over_cpu"] >= 0.99
    transform.decode_resized([jpeg])  # not counted once taken away
    assert clock.totals()[2] == 3


def test_scaling_reports_both_dtypes_against_the_raw_decoders(tmp_path, capsys):
    out = tmp_path / "scale.json"
    assert _tool().main(["--only", "images", "--loaders", "wdspack", "--samples", "60", "--seq-len", "1024",
                         "--workers", "2", "--rounds", "1", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    passes = {r["pixel_dtype"]: r for r in results if r["loader"].startswith("wdspack ")}
    assert sorted(passes) == ["float32", "uint8"]
    assert passes["float32"]["images"] == passes["uint8"]["images"] > 0
    assert passes["float32"]["warm_up_images"] == passes["uint8"]["warm_up_images"]
    raw = [r for r in results if r["loader"] == "raw decode + resize, 2 side by side"]
    assert len(raw) == 1 and raw[0]["images_per_s_all"] == passes["uint8"]["raw_n"]
    for r in passes.values():
        assert r["of_raw_n"] == r["images_per_s_all"] / r["raw_n"] and 0 < r["of_raw_cpu"]
        assert r["workers_cpu_s"] > 0 and r["main_cpu_s"] > 0 and r["cold_start_s"] > 0
        # timed warm: the warm-up's batches (one per worker) are not counted; the raw decoders also decode
        # the packs an epoch leaves over (fewer than one batch per worker)
        assert 0 < r["warm_up_images"] and r["images"] + r["warm_up_images"] <= raw[0]["images"]
        assert r["balance"] == "cost"
        # the workers' CPU, split: decoding (timed inside them) fits within it (/proc counts 10 ms ticks)
        assert r["decoded_images"] > 0 and r["decode_cpu_ms"] > 0 and 0 < r["workers_busy"]
        assert r["decode_cpu_ms"] * r["decoded_images"] / 1e3 <= r["workers_cpu_s"] + 0.02 * 2
        assert r["own_cpu_ms"] == pytest.approx(
            1e3 * (r["workers_cpu_s"] - r["decode_cpu_ms"] * r["decoded_images"] / 1e3) / r["images"])
        assert r["main_cpu_ms"] == pytest.approx(1e3 * r["main_cpu_s"] / r["images"])
    summaries = {r["loader"]: r for r in results if r["loader"].startswith("summary ")}
    assert "CPU per image: decoding" in summaries["summary uint8"]["cpu_split"]
    printed = capsys.readouterr().out
    assert "float32, 2 workers:" in printed and "uint8, 2 workers:" in printed
    assert "uint8, 2 workers, CPU per image: decoding" in printed
