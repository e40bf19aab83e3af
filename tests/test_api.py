"""The public surface: ``wdspack.__all__`` is exactly the public top-level names, and each resolves."""

from __future__ import annotations

import types

import wdspack


def test_all_names_resolve():
    for name in wdspack.__all__:
        assert getattr(wdspack, name) is not None, name


def test_all_is_exactly_the_public_names():
    public = {n for n in dir(wdspack) if not n.startswith("_") and not isinstance(getattr(wdspack, n), types.ModuleType)
              and n not in ("annotations", "importlib", "Any")}
    assert public == set(wdspack.__all__) - {"__version__"}


def test_entry_points_the_readme_uses():
    for name in ("plan_packs", "pack_dataset", "PackConfig", "SampleConfig", "PackedDataset", "make_loader",
                 "reshard_dataset", "verify_dataset", "dataset_stats", "upload_dataset", "decode_pack"):
        assert name in wdspack.__all__, name
    assert wdspack.plan_packs([3, 3, 3], seq_len=6) == [[0, 1], [2]]
