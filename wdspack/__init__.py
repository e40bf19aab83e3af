"""wdspack: pre-packed WebDataset shards for vision-language training.

The light parts (planner, format, manifest, errors) import eagerly; the parts that pull in
transformers or torch are imported on first use, so ``import wdspack`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from .format.pack import FORMAT, Pack, decode_pack, encode_pack
from ._version import __version__
from .errors import (
    ConfigError,
    Dropped,
    FormatError,
    ManifestError,
    OutputError,
    SampleError,
    SourceError,
    TooManyDropsError,
    WdspackError,
)
from .format.manifest import Manifest, ShardInfo, read_manifest
from .packer.planner import ALGORITHMS, lower_bound, plan_packs

_LAZY = {
    "PackConfig": "packer.config", "PackSummary": "packer.config", "pack_dataset": "packer.job",
    "SampleConfig": "packer.samples", "Sample": "packer.samples", "SampleBuilder": "packer.samples",
    "Record": "packer.sources", "list_partitions": "packer.sources", "iter_records": "packer.sources",
    "reshard_dataset": "packer.reshard", "verify_dataset": "ops.verify", "dataset_stats": "ops.inspect",
    "upload_dataset": "ops.upload",
    "PackedDataset": "loader", "make_loader": "loader",
    "pack_to_example": "loader.collate", "collate_packs": "loader.collate", "make_image_transform": "loader.images",
    "model_inputs": "models", "load_processor": "models",
    "CostModel": "format.pack_index",
    "num_items_in_batch": "train.loss", "num_samples_in_batch": "train.loss", "sample_mean_loss": "train.loss",
    "token_losses": "train.loss",
}

__all__ = [
    "ALGORITHMS", "FORMAT", "ConfigError", "Dropped", "FormatError", "Manifest", "ManifestError",
    "OutputError", "Pack", "SampleError", "ShardInfo", "SourceError", "TooManyDropsError", "WdspackError",
    "__version__",
    "decode_pack", "encode_pack", "lower_bound", "plan_packs", "read_manifest", *sorted(_LAZY),
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'wdspack' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
