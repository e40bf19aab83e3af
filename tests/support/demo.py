"""Helpers for tests that run the pack job on the generated demo dataset.

``generate_demo`` writes ``examples/make_demo_data.py``'s dataset (LLaVA and messages JSONL,
Pillow images, a few deliberately bad records); ``demo_sources`` names its two files;
``read_files`` reads a dataset folder's files for byte-for-byte comparisons.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

from tests.support import ROOT

__all__ = ["DEMO_PACK", "ROOT", "demo_pack_config", "demo_sources", "generate_demo", "read_files"]



@lru_cache(maxsize=1)
def _generator():
    spec = importlib.util.spec_from_file_location("make_demo_data", ROOT / "examples" / "make_demo_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def generate_demo(out: Path, *, records: int, seed: int) -> Path:
    """Write ``records`` demo records (seeded) into ``out`` and return it."""
    _generator().generate(out, records=records, seed=seed)
    return out


def demo_sources(folder: Path) -> list[str]:
    return [str(folder / "llava.jsonl"), str(folder / "messages.jsonl")]


def read_files(root: Path) -> dict[str, bytes]:
    """``name -> bytes`` of the files directly in ``root`` (shards, manifest, dropped list)."""
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


#: How ``demo_packed`` packs the demo: several shards, and the deliberately bad records dropped.
DEMO_PACK = dict(seq_len=2048, max_images=6, shard_max_bytes=150_000, records_per_partition=40,
                 run={"max_drop_fraction": 1.0})


def demo_pack_config():
    """:data:`DEMO_PACK` as a ``PackConfig``."""
    from wdspack.packer.config import PackConfig, RunOptions

    return PackConfig(**{**DEMO_PACK, "run": RunOptions(**DEMO_PACK["run"])})
