"""Every pack/load combination of the image budget, and a loader that would stream no pixels.

Packed with ``max_images`` None (no limit) or N, with and without images; loaded with ``max_images``
None (the default), equal to it, larger (empty slots: one static shape across datasets) and smaller
(refused, naming both numbers and the fix). Real packs: the Pixtral tokenizer (``tekken_dir``) and
its template (``sample_config``, 16 ``[IMG]`` tokens per image), and in processor mode the real
Qwen2.5-VL processor class (``examples/tiny_vlm``), as ``tests/models/test_processor_mode.py`` builds it.

The chats follow LLaVA's published layout (haotian-liu/LLaVA ``docs/Finetune_Custom_Data.md``,
``llava_v1_5_mix665k.json``): ``id``, ``image`` (one path or a list), ``conversations`` of
``{"from": "human" | "gpt", "value"}`` with one ``<image>`` placeholder per image.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
from pathlib import Path

import pytest
import torch
from PIL import Image

import wdspack
from wdspack.cli import main
from wdspack.errors import ConfigError
from wdspack.format.dataset import iter_dataset_packs, open_dataset
from wdspack.format.manifest import MANIFEST_NAME, read_manifest, write_json_atomic
from wdspack.format.pack_index import INDEX_NAME
from wdspack.loader.wds import read_dataset, to_examples
from wdspack.ops.index import index_dataset
from wdspack.ops.inspect import dataset_stats, format_stats
from wdspack.ops.verify import verify_dataset
from wdspack.packer.config import PackConfig
from wdspack.packer.job import pack_dataset
from wdspack.packer.reshard import reshard_dataset

SEQ_LEN = 256
#: images per chat: packs of 2-4 chats then hold different numbers of images
IMAGES = (1, 3, 0, 2, 1, 3, 2, 0, 1, 2, 3, 1)
COLORS = ("red", "green", "blue", "yellow", "white")
FILLER = "every picture is small and plain, one colour from edge to edge, and nothing else is drawn in it. " * 3


def _png(color: str, size: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def _write_chats(folder: Path, *, images: bool) -> Path:
    """A LLaVA-layout JSON file (``image`` a path or a list, ``<image>`` per image) with PNGs beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    records = []
    for i, n in enumerate(IMAGES if images else (0,) * len(IMAGES)):
        names = []
        for k in range(n):
            name = f"images/{i:03d}-{k}.png"
            (folder / name).parent.mkdir(exist_ok=True)
            (folder / name).write_bytes(_png(COLORS[(i + k) % len(COLORS)], (24 + 8 * k, 16 + 4 * i)))
            names.append(name)
        record = {"id": f"chat-{i:03d}", "conversations": [
            {"from": "human", "value": "<image>\n" * n + f"Question {i}: what colours are there?"},
            {"from": "gpt", "value": f"Answer {i}: " + (", ".join(COLORS[(i + k) % len(COLORS)] for k in range(n))
                                                         or "none") + ". In short, " + FILLER[: 40 + 9 * i]}]}
        if n:
            record["image"] = names[0] if n == 1 else names
        records.append(record)
    path = folder / "llava.json"
    path.write_text(json.dumps(records, indent=1))
    return path


def _pack(tmp: Path, sample_config, *, images: bool, max_images: int | None) -> Path:
    source = _write_chats(tmp / "src", images=images)
    out = tmp / "packed"
    summary = pack_dataset([str(source)], out, sample_config=sample_config,
                           config=PackConfig(seq_len=SEQ_LEN, max_images=max_images, on_error="raise"))
    assert summary.samples_packed == len(IMAGES) and summary.packs >= 3, summary.lines()
    assert verify_dataset(str(out), sources=[str(source)]) == []
    return out


def _fullest(out: Path) -> int:
    """The images of the fullest pack, read from the packs themselves."""
    return max(pack.num_images for _, pack in iter_dataset_packs(*open_dataset(str(out))))


@pytest.fixture(scope="module")
def datasets(tmp_path_factory, sample_config) -> dict[tuple[bool, int | None], Path]:
    """(images?, max_images at pack time) -> a packed dataset."""
    out = {}
    for images in (True, False):
        for limit in (None, 3, 50):
            tmp = tmp_path_factory.mktemp(f"{'img' if images else 'txt'}-{limit}")
            out[images, limit] = _pack(tmp, sample_config, images=images, max_images=limit)
    return out


def _load(dataset: Path, **kw) -> list[dict]:
    loader = wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, shuffle=False, remainder="wrap", **kw)
    return list(loader)


# -- what the manifest records ----------------------------------------------------------------------


@pytest.mark.parametrize("images", [True, False])
@pytest.mark.parametrize("limit", [None, 3, 50])
def test_the_manifest_records_the_fullest_pack(datasets, images, limit):
    out = datasets[images, limit]
    m = read_manifest(out)
    assert m.max_images == limit
    assert m.totals["max_images_per_pack"] == m.max_images_per_pack == _fullest(out)
    assert (m.max_images_per_pack > 0) == images
    if limit is not None:
        assert m.max_images_per_pack <= limit


# -- pack x load ----------------------------------------------------------------------------------------


def _expected_default(m) -> int:
    return m.max_images if m.max_images is not None else m.max_images_per_pack


@pytest.mark.parametrize("images", [True, False])
@pytest.mark.parametrize("limit", [None, 3, 50])
@pytest.mark.parametrize("load", ["default", "equal", "fullest", "larger"])
def test_every_budget_that_holds_every_pack_loads_every_image(datasets, images, limit, load):
    out = datasets[images, limit]
    m = read_manifest(out)
    default, fullest = _expected_default(m), m.max_images_per_pack
    slots = {"default": None, "equal": default, "fullest": fullest, "larger": default + 3}[load]
    want = default if slots is None else slots
    transform = wdspack.make_image_transform(size=16) if images else None
    batches = _load(out, max_images=slots, image_transform=transform)
    assert len(batches) == m.num_packs
    assert {tuple(b["image_mask"].shape) for b in batches} == {(want,)}
    assert sum(int(b["image_mask"].sum()) for b in batches) == m.totals["images"]  # every image, none skipped
    if images:
        assert {tuple(b["pixel_values"].shape) for b in batches} == {(want, 3, 16, 16)}
        for b in batches:  # the slots past the real images stay zero
            assert not b["pixel_values"][~b["image_mask"]].any()


@pytest.mark.parametrize("images", [True, False])
@pytest.mark.parametrize("limit", [None, 3, 50])
def test_fewer_slots_than_the_fullest_pack_are_refused(datasets, images, limit):
    out = datasets[images, limit]
    m = read_manifest(out)
    fullest = m.max_images_per_pack
    if fullest == 0:
        with pytest.raises(ConfigError, match=r"max_images=-1 must be a non-negative integer"):
            wdspack.PackedDataset(str(out), max_images=-1)
        return
    with pytest.raises(ConfigError) as e:
        wdspack.PackedDataset(str(out), max_images=fullest - 1)
    text = str(e.value)
    assert f"max_images={fullest - 1}" in text and f"holds {fullest} images" in text
    assert f"pass max_images >= {fullest}" in text and f"default {_expected_default(m)}" in text


def test_the_default_is_the_fullest_pack_when_packed_without_a_limit(datasets):
    out = datasets[True, None]
    ds = wdspack.PackedDataset(str(out), image_transform=wdspack.make_image_transform(size=16))
    assert ds.max_images == _fullest(out) > 0
    assert wdspack.PackedDataset(str(datasets[False, None])).max_images == 0


def test_the_cli_story_pack_without_max_images_verify_inspect_load(tmp_path, tekken_dir, pixtral_template, capsys):
    """The issue's steps: ``pack`` without ``--max-images`` (unlimited), ``verify`` OK, then every pack loads."""
    source = _write_chats(tmp_path / "src", images=True)
    template = tmp_path / "pixtral.jinja"
    template.write_text(pixtral_template)
    out = tmp_path / "packed"
    assert main(["pack", str(source), "--output", str(out), "--tokenizer", str(tekken_dir), "--chat-template",
                 str(template), "--tokens-per-image", "16", "--image-token", "[IMG]", "--seq-len", str(SEQ_LEN),
                 "--quiet"]) == 0, capsys.readouterr().err
    assert main(["verify", str(out)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    fullest = _fullest(out)
    assert f"max_images unlimited (fullest pack {fullest})" in capsys.readouterr().out
    batches = _load(out, image_transform=wdspack.make_image_transform(size=16))
    assert len(batches) == read_manifest(out).num_packs
    assert sum(int(b["image_mask"].sum()) for b in batches) == sum(IMAGES)


def test_inspect_shows_the_limit_and_the_fullest_pack(datasets):
    line = format_stats(dataset_stats(str(datasets[True, 50])))[0]
    assert f"max_images 50 (fullest pack {_fullest(datasets[True, 50])})" in line


# -- manifests written before max_images_per_pack -----------------------------------------------------


def _strip_record(out: Path, *, index: bool) -> None:
    """Rewrite the manifest as an older wdspack wrote it: no max_images_per_pack (and no pack index)."""
    m = read_manifest(out)
    totals = {k: v for k, v in m.totals.items() if k != "max_images_per_pack"}
    m = dataclasses.replace(m, totals=totals, pack_index=m.pack_index if index else {})
    if not index:
        (out / INDEX_NAME).unlink()
    write_json_atomic(out / MANIFEST_NAME, m.to_json())


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for p in src.iterdir():
        if p.is_file():
            (dst / p.name).write_bytes(p.read_bytes())
    return dst


def test_an_older_manifest_takes_the_fullest_pack_from_its_pack_index(datasets, tmp_path, caplog):
    out = _copy(datasets[True, None], tmp_path / "old")
    fullest = _fullest(out)
    _strip_record(out, index=True)
    assert read_manifest(out).max_images_per_pack is None
    with caplog.at_level(logging.INFO, logger="wdspack.loader"):
        ds = wdspack.PackedDataset(str(out), text_only=True)
    assert ds.max_images == fullest and "its pack index gives" in caplog.text
    assert read_dataset(str(out)).max_images == fullest
    with pytest.raises(ConfigError, match=f"holds {fullest} images"):
        wdspack.PackedDataset(str(out), max_images=fullest - 1)


def test_an_older_manifest_without_an_index_names_the_fix(datasets, tmp_path):
    out = _copy(datasets[True, None], tmp_path / "old")
    fullest = _fullest(out)
    _strip_record(out, index=False)
    for make in (lambda: wdspack.PackedDataset(str(out), text_only=True), lambda: read_dataset(str(out))):
        with pytest.raises(ConfigError, match=r"packed without an image limit.*pass max_images=.*wdspack index"):
            make()
    # The user's own number is taken (nothing to check it against); the index restores the default.
    assert wdspack.PackedDataset(str(out), max_images=fullest + 1, text_only=True).max_images == fullest + 1
    index_dataset(out)
    assert wdspack.PackedDataset(str(out), text_only=True).max_images == fullest


def test_an_older_manifest_packed_with_a_limit_keeps_it(datasets, tmp_path):
    out = _copy(datasets[True, 50], tmp_path / "old")
    _strip_record(out, index=False)
    assert wdspack.PackedDataset(str(out), text_only=True).max_images == 50
    assert wdspack.PackedDataset(str(out), max_images=60, text_only=True).max_images == 60
    with pytest.raises(ConfigError, match="holds 50 images"):  # the limit is all it knows of its packs
        wdspack.PackedDataset(str(out), max_images=49, text_only=True)


def test_an_older_text_manifest_needs_no_index(datasets, tmp_path):
    out = _copy(datasets[False, None], tmp_path / "old")
    _strip_record(out, index=False)
    assert wdspack.PackedDataset(str(out)).max_images == 0


# -- reshard ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [None, 3])
def test_reshard_records_the_fullest_pack(datasets, tmp_path, limit):
    out = tmp_path / "re"
    reshard_dataset(str(datasets[True, None]), out, config=PackConfig(seq_len=2 * SEQ_LEN, max_images=limit))
    m = read_manifest(out)
    assert m.max_images == limit and m.max_images_per_pack == _fullest(out)
    batches = _load(out, image_transform=wdspack.make_image_transform(size=16))
    assert {tuple(b["image_mask"].shape) for b in batches} == {(_expected_default(m),)}
    assert sum(int(b["image_mask"].sum()) for b in batches) == sum(IMAGES)


# -- webdataset stages ------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [None, 50])
def test_webdataset_stages_take_the_same_budgets(datasets, limit):
    out = datasets[True, limit]
    m = read_manifest(out)
    info = read_dataset(str(out))
    assert info.max_images == _expected_default(m) and info.max_images_per_pack == m.max_images_per_pack
    assert info.images == sum(IMAGES)
    transform = wdspack.make_image_transform(size=16)
    fullest = m.max_images_per_pack
    for slots in (None, fullest, fullest + 2):
        to_examples(info, max_images=slots, image_transform=transform)
    with pytest.raises(ConfigError, match=rf"max_images={fullest - 1} .*holds {fullest} images"):
        to_examples(info, max_images=fullest - 1, image_transform=transform)


# -- no pixels -----------------------------------------------------------------------------------------


def _pixel_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "carry no pixels" in r.getMessage()]


def test_an_image_dataset_without_a_transform_is_warned_about_once(datasets, caplog):
    out = datasets[True, None]
    with caplog.at_level(logging.WARNING, logger="wdspack.loader"):
        batches = _load(out)
    (message,) = _pixel_warnings(caplog)  # once, when the loader is built, not per pack or batch
    assert str(out) in message and f"holds {sum(IMAGES)} images" in message
    assert "image_transform=wdspack.make_image_transform(" in message and "text_only=True" in message
    assert batches and all("pixel_values" not in b for b in batches)


@pytest.mark.parametrize("kw", [{"text_only": True}, {"image_transform": "transform"}])
def test_no_warning_with_pixels_or_text_only_on_purpose(datasets, caplog, kw):
    if "image_transform" in kw:
        kw = {"image_transform": wdspack.make_image_transform(size=16)}
    with caplog.at_level(logging.WARNING, logger="wdspack.loader"):
        batches = _load(datasets[True, None], **kw)
        _load(datasets[False, None])  # a text dataset has no pixels to miss
    assert _pixel_warnings(caplog) == []
    if "text_only" in kw:  # the text, and where the images were
        assert sum(int(b["image_mask"].sum()) for b in batches) == sum(IMAGES)
        assert all("pixel_values" not in b for b in batches)


def test_text_only_with_pixels_is_a_contradiction(datasets):
    with pytest.raises(ConfigError, match="text_only=True streams no pixels"):
        wdspack.PackedDataset(str(datasets[True, None]), text_only=True,
                              image_transform=wdspack.make_image_transform(size=16))
    with pytest.raises(ConfigError, match="text_only=True streams no pixels"):
        to_examples(read_dataset(str(datasets[True, None])), text_only=True,
                    image_transform=wdspack.make_image_transform(size=16))


def test_webdataset_stages_warn_too(datasets, caplog):
    info = read_dataset(str(datasets[True, 50]))
    with caplog.at_level(logging.WARNING, logger="wdspack.loader"):
        to_examples(info)
        to_examples(info, text_only=True)
    (message,) = _pixel_warnings(caplog)
    assert f"holds {sum(IMAGES)} images" in message


# -- processor mode ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """A Qwen2.5-VL dataset packed without an image limit (``vlm_harness.pack_chats``)."""
    from tests.support import vlm_harness as h
    from tiny_vlm import qwen2_5_vl

    folder = tmp_path_factory.mktemp("qwen-budgets")
    processor = qwen2_5_vl.processor(folder / "tok")
    dataset = h.pack_chats(folder, processor, seq_len=96, max_images=None)
    return processor, dataset, qwen2_5_vl


@pytest.mark.slow  # Qwen2.5-VL's processor and model
def test_processor_mode_without_a_limit_feeds_the_model(qwen):
    processor, dataset, qwen2_5_vl = qwen
    m = read_manifest(dataset)
    fullest = m.max_images_per_pack
    assert m.max_images is None and fullest == _fullest(dataset) >= 2  # the two-image chat
    model = qwen2_5_vl.model(processor, seed=0)
    for slots in (None, fullest + 2):
        loader = wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, shuffle=False, processor=processor,
                                     max_images=slots)
        assert loader.dataset.max_images == (fullest if slots is None else slots)
        images = 0
        for batch in loader:
            images += int(batch["image_mask"].sum())
            loss = model(**wdspack.model_inputs(batch, model)).loss  # raises if features and tokens disagree
            assert torch.isfinite(loss)
        assert images == m.totals["images"]
    with pytest.raises(ConfigError, match=f"holds {fullest} images"):
        wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, processor=processor, max_images=fullest - 1)


@pytest.mark.slow  # Qwen2.5-VL's processor
def test_a_processor_packed_dataset_without_its_processor_is_refused(qwen, caplog):
    _, dataset, _ = qwen
    m = read_manifest(dataset)
    with pytest.raises(ConfigError) as e:
        wdspack.make_loader(str(dataset), batch_size=1, num_workers=0)
    text = str(e.value)
    assert str(dataset) in text and f"holds {m.totals['images']} images" in text
    assert f"processor={m.image_policy['name']!r}" in text and "text_only=True" in text
    with pytest.raises(ConfigError, match="qwen2_5_vl processor"):
        to_examples(read_dataset(str(dataset)))
    with caplog.at_level(logging.WARNING, logger="wdspack.loader"):
        batches = list(wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, shuffle=False, text_only=True))
    assert batches and _pixel_warnings(caplog) == []
    assert sum(int(b["image_mask"].sum()) for b in batches) == m.totals["images"]
