"""The module map in ``wdspack/loader/__init__.py`` names every module of the loader and its subpackages."""

from __future__ import annotations

import pkgutil
import re

import wdspack.loader

ROOT = wdspack.loader.__name__

#: ``:mod:`.batch.collate``` (relative to the loader) or ``:mod:`wdspack.format.dataset``` (absolute).
_MOD = re.compile(r":mod:`~?([\w.]+)`")


def _named() -> set[str]:
    doc = wdspack.loader.__doc__ or ""
    return {ROOT + name if name.startswith(".") else name for name in _MOD.findall(doc)}


def _modules() -> set[str]:
    """Every module and subpackage under ``wdspack.loader``, found by walking it (subpackages imported)."""
    return {info.name for info in pkgutil.walk_packages(wdspack.loader.__path__, prefix=ROOT + ".")}


def test_the_map_names_every_module():
    missing = sorted(_modules() - _named())
    assert not missing, f"wdspack/loader/__init__.py's module map does not name {missing}: add a line for each"


def test_the_map_names_no_module_that_is_gone():
    stale = sorted(name for name in _named() if name.startswith(ROOT + ".") and name not in _modules())
    assert not stale, f"wdspack/loader/__init__.py's module map names {stale}, which are not in wdspack/loader/"


def test_the_development_page_names_every_module():
    """docs/development.md's repository layout names each module of the loader (by its own name)."""
    from tests.support import ROOT as REPO

    text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    block = text[text.index("           loader/"):text.index("           train/")]
    words = set(re.findall(r"\w+", block))
    missing = sorted(name for name in _modules() if name.rsplit(".", 1)[-1] not in words)
    assert not missing, f"docs/development.md's repository layout does not name {missing}"
