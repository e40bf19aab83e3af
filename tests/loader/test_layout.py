"""The module map in ``wdspack/loader/__init__.py`` names every module of the loader and its subpackages."""

from __future__ import annotations

import pkgutil
import re
from pathlib import Path

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


def _imports() -> dict[str, set[str]]:
    """Each loader module's imports of other loader modules (lazy ones too; not those only for type checking)."""
    import ast
    import importlib
    import importlib.util

    edges: dict[str, set[str]] = {}
    for name in _modules() | {ROOT}:
        module = importlib.import_module(name)
        path = module.__file__
        assert path is not None
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in
                       ast.unparse(node.test) for n in ast.walk(node)}
        package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and id(node) not in typing_only:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    found.add(target if importlib.util.find_spec(target.rsplit(".", 1)[0]) and target in _modules()
                              else base)
        edges[name] = {t for t in found if t.startswith(ROOT) and t != name}
    return edges


def test_no_import_circle_in_the_loader():
    edges = _imports()
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            assert state.get(nxt) != 1, f"import circle: {' -> '.join(path[path.index(nxt):] + [nxt])}"
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])


def test_the_batch_folder_imports_nothing_else_of_the_loader():
    """A new batch key has one place: batch/ depends on the format and the models, not on the loader's rooms."""
    outside = {name: sorted(t for t in targets if not t.startswith(f"{ROOT}.batch"))
               for name, targets in _imports().items() if name.startswith(f"{ROOT}.batch")}
    assert not any(outside.values()), {k: v for k, v in outside.items() if v}
