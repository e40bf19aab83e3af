"""wdspack: pre-packed WebDataset shards for vision-language training.

The light parts (planner, format, manifest, errors) import eagerly; the parts that pull in
transformers or torch are imported on first use, so ``import wdspack`` stays fast. Type checkers
see every name with its real type (the ``TYPE_CHECKING`` imports below).

The package, bottom up (an import only points down; DESIGN.md §7): :mod:`wdspack.errors`;
:mod:`wdspack.storage` (bytes in and out); :mod:`wdspack.format` (the pack format, shards, manifest,
pack index) and :mod:`wdspack.models` (one module per model family in ``families/``); :mod:`wdspack.packer` (produce)
and :mod:`wdspack.loader` (consume), which never import each other; :mod:`wdspack.train` and
:mod:`wdspack.ops` (inspect, verify, upload, index); :mod:`wdspack.cli` and this face.
"""

from __future__ import annotations

import importlib
import typing
from typing import Any

from ._version import __version__
from .errors import (
    ConfigError,
    Dropped,
    FormatError,
    ManifestError,
    NewerFormatError,
    OutputError,
    SampleError,
    SourceError,
    TooManyDropsError,
    WdspackError,
)
from .format.manifest import Manifest, ShardInfo, read_manifest
from .format.pack import FORMAT, Pack, decode_pack, encode_pack
from .packer.planner import ALGORITHMS, lower_bound, plan_packs

if typing.TYPE_CHECKING:  # the names _LAZY loads on first use, as type checkers should see them
    from .format.pack_index import CostModel
    from .loader import PackedDataset, make_loader
    from .loader.batch.buffers import normalize_pixels
    from .loader.batch.collate import collate_packs, pack_to_example
    from .loader.mixture.spec import Mixture, MixtureSource
    from .loader.options import Balance, ReadOptions
    from .media.image.pixels import make_image_transform
    from .models import load_processor, model_inputs
    from .models.varlen import use_varlen_attention
    from .ops.inspect import dataset_stats
    from .ops.upload import upload_dataset
    from .ops.verify import verify_dataset
    from .packer.config import PackConfig, PackSummary, RunOptions
    from .packer.job import pack_dataset
    from .packer.reshard import reshard_dataset
    from .packer.samples import Sample, SampleBuilder, SampleConfig
    from .packer.sources import Record, iter_records, list_partitions
    from .train.loss import num_items_in_batch, num_samples_in_batch, sample_mean_loss, token_losses

#: Name -> the module (below this package) it is loaded from on first use.
_LAZY = {
    # pack
    "PackConfig": "packer.config", "PackSummary": "packer.config", "RunOptions": "packer.config",
    "pack_dataset": "packer.job",
    "SampleConfig": "packer.samples", "Sample": "packer.samples", "SampleBuilder": "packer.samples",
    "Record": "packer.sources", "list_partitions": "packer.sources", "iter_records": "packer.sources",
    "reshard_dataset": "packer.reshard",
    # operations on a packed dataset
    "verify_dataset": "ops.verify", "dataset_stats": "ops.inspect", "upload_dataset": "ops.upload",
    "CostModel": "format.pack_index",
    # load and train
    "PackedDataset": "loader", "make_loader": "loader", "ReadOptions": "loader.options", "Balance": "loader.options",
    "Mixture": "loader.mixture.spec", "MixtureSource": "loader.mixture.spec",
    "pack_to_example": "loader.batch.collate", "collate_packs": "loader.batch.collate",
    "make_image_transform": "media.image.pixels", "normalize_pixels": "loader.batch.buffers",
    "model_inputs": "models", "load_processor": "models", "use_varlen_attention": "models.varlen",
    "num_items_in_batch": "train.loss", "num_samples_in_batch": "train.loss", "sample_mean_loss": "train.loss",
    "token_losses": "train.loss",
}

__all__ = [
    # errors
    "ConfigError", "Dropped", "FormatError", "ManifestError", "NewerFormatError", "OutputError", "SampleError",
    "SourceError", "TooManyDropsError", "WdspackError",
    # the format
    "FORMAT", "Manifest", "Pack", "ShardInfo", "decode_pack", "encode_pack", "read_manifest",
    # pack
    "ALGORITHMS", "PackConfig", "PackSummary", "Record", "RunOptions", "Sample", "SampleBuilder", "SampleConfig",
    "iter_records", "list_partitions", "lower_bound", "pack_dataset", "plan_packs", "reshard_dataset",
    # operations on a packed dataset
    "CostModel", "dataset_stats", "upload_dataset", "verify_dataset",
    # load and train
    "Balance", "Mixture", "MixtureSource", "PackedDataset", "ReadOptions", "collate_packs", "load_processor",
    "make_image_transform", "make_loader", "model_inputs", "num_items_in_batch", "num_samples_in_batch",
    "normalize_pixels", "pack_to_example", "sample_mean_loss",
    "token_losses", "use_varlen_attention",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'wdspack' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
