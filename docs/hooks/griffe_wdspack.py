"""Griffe extension for wdspack's API reference (listed under ``extensions`` in ``mkdocs.yml``).

- The lazily imported names of the package face: ``wdspack/__init__.py`` maps them to their
  modules in ``_LAZY`` and imports them on first use (so ``import wdspack`` stays fast), which
  static analysis cannot see. Each becomes an alias of the object it resolves to, so that
  ``::: wdspack.make_loader`` documents the function (fields, annotations and all) without the
  pages naming the module it lives in. Names the face already imports are left alone.
- ``Example:`` sections: wdspack's docstrings carry one literal example under ``Example:``
  (STYLE.md), which Napoleon reads as the examples section; griffe knows only the plural and would
  render the ``>>>`` lines as Markdown text.
- Sphinx roles (``:class:`~wdspack.packer.samples.SampleConfig```) become inline code (``SampleConfig``),
  as Sphinx would show them, instead of the literal role text.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", flags=re.MULTILINE)
_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj|const):`(~?)([^`]+)`")


def _role_as_code(match: re.Match) -> str:
    target = match[2]
    return f"`{target.rsplit('.', 1)[-1] if match[1] else target}`"


def _lazy_names(module: griffe.Module) -> dict[str, str]:
    """``{name: submodule}`` from the ``_LAZY = {...}`` literal of ``module``'s source, if it has one."""
    try:
        tree = ast.parse(module.filepath.read_text(encoding="utf-8"))  # type: ignore[union-attr]
    except (OSError, AttributeError, SyntaxError):
        return {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return {}
            return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}
    return {}


class WdspackFace(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path != "wdspack":
            return
        for name, submodule in _lazy_names(pkg).items():
            if name not in pkg.members:
                pkg.set_member(name, griffe.Alias(name, f"wdspack.{submodule.lstrip('.')}.{name}", parent=pkg))

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_role_as_code, _EXAMPLE.sub(r"\1Examples:", obj.docstring.value))
