"""The model families are found by listing ``wdspack/models/families/``, one module each."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import wdspack.models
from wdspack.models import family_for, known_families


def test_the_families_are_what_the_modules_of_the_folder_declare():
    folder = Path(wdspack.models.__file__).parent / "families"
    names = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    declared = tuple(f for n in names for f in importlib.import_module(f"wdspack.models.families.{n}").FAMILIES)
    assert known_families() == declared
    assert {f.name for f in declared} == {"gemma3", "idefics3", "smolvlm", "llava", "llava_onevision", "mistral3",
                                          "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen2_audio", "qwen2_5_omni",
                                          "qwen3_omni_moe", "gemma4", "glm4v", "glm46v",
                                          "internvl", "minicpmv4_6"}
    assert family_for("qwen3_vl").name == "qwen3_vl"


def test_no_helper_module_beside_the_folder_declares_a_family():
    helpers = [m.name for m in pkgutil.iter_modules(wdspack.models.__path__) if not m.ispkg]
    assert "family" in helpers and "compat" in helpers
    declaring = [n for n in helpers if hasattr(importlib.import_module(f"wdspack.models.{n}"), "FAMILIES")]
    assert declaring == [], f"move these into wdspack/models/families/: {declaring}"
