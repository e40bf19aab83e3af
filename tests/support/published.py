"""The round trip every published-layout test makes: pack, verify, load, decode what is trained.

The layout tests write small files in other projects' published layouts (LLaMA-Factory, LLaVA,
InternVL, ms-swift, TRL, MiniCPM-V, the_cauldron, ...), run them through :func:`round_trip` and
check the decoded targets: that the assistant's words are trained, and nothing else.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from wdspack.format.dataset import open_dataset
from wdspack.format.manifest import read_manifest
from wdspack.ops.verify import verify_dataset
from wdspack.packer.config import PackConfig, PackSummary, RunOptions
from wdspack.packer.job import pack_dataset
from wdspack.packer.samples import SampleConfig, get_builder


def image_bytes(fmt: str = "PNG", color: str = "red", size: tuple[int, int] = (32, 24)) -> bytes:
    """A small real image, encoded."""
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format=fmt)
    return buf.getvalue()


def write_image(path: Path, fmt: str = "PNG", color: str = "red", size: tuple[int, int] = (32, 24)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(image_bytes(fmt, color, size))
    return path


@dataclass
class RoundTrip:
    """What a packed source gives back: the job's summary, its manifest, and per packed sample
    (by id) the decoded trained text, the decoded whole text, and its image count."""

    summary: PackSummary
    manifest: Any
    trained: dict[str, str]
    text: dict[str, str]
    images: dict[str, int]


def round_trip(sources: Sequence[str], out: Path, sample_config: SampleConfig, *, image_root: str | None = None,
               seq_len: int = 2048, max_images: int | None = None, max_drop_fraction: float | None = 0.0,
               **pack: Any) -> RoundTrip:
    """Pack ``sources``, check ``verify`` is clean, stream every pack back through ``make_loader``
    and decode, per sub-sample, the tokens its labels train and all its tokens."""
    from wdspack import make_loader

    summary = pack_dataset(list(sources), out, sample_config=sample_config, image_root=image_root,
                           config=PackConfig(seq_len=seq_len, max_images=max_images,
                                             run=RunOptions(max_drop_fraction=max_drop_fraction), **pack))
    problems = verify_dataset(str(out), sources=list(sources), image_root=image_root)
    assert problems == [], problems
    manifest = read_manifest(out)
    from wdspack.format.dataset import iter_dataset_packs

    ids_of = {}  # a pack's tokens -> its sub-samples' ids (the loader's batches carry no ids)
    for _, pack in iter_dataset_packs(*open_dataset(str(out))):
        ids_of[pack.input_ids.tobytes()] = (pack.sample_ids, pack.input_ids.dtype)
    tok = get_builder(sample_config).tokenizer
    trained, text, images = {}, {}, {}
    # Text and image counts are what is checked: no pixels, on purpose (a processor-packed dataset is refused without)
    loader = make_loader(str(out), batch_size=1, num_workers=0, shuffle=False, remainder="wrap", text_only=True)
    for batch in loader:
        ids, labels, seq = batch["input_ids"][0], batch["labels"][0], batch["seq_idx"][0]
        key = next(k for k, (_, dtype) in ids_of.items()
                   if ids[: len(k) // dtype.itemsize].numpy().astype(dtype).tobytes() == k)
        for k, sid in enumerate(ids_of[key][0]):
            rows = seq == k
            trained[sid] = tok.decode(labels[rows][labels[rows] != -100].tolist())
            text[sid] = tok.decode(ids[rows].tolist())
            # image slots are [B·M], pack-major; with B = 1 every slot belongs to this pack
            images[sid] = int((batch["image_sample_idx"] == k).sum()) if "image_sample_idx" in batch else 0
    assert set(trained) == {s for sids, _ in ids_of.values() for s in sids}
    return RoundTrip(summary, manifest, trained, text, images)
