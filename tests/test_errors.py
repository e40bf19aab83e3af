"""Every exception class wdspack defines is in ``errors.py``'s tree, and drawn in its docstring.

A caller catches :class:`~wdspack.errors.WdspackError` for everything wdspack raises on purpose
(the CLI maps it to one line and an exit code), so an exception defined beside the code that raises
it must still derive from it. Private classes (``_Stop``) are signals caught in their own module
and never reach a caller; they are left out.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import wdspack
from wdspack import errors
from wdspack.errors import WdspackError


@pytest.fixture(scope="module")
def exception_classes() -> dict[str, type[BaseException]]:
    """``{"wdspack.module.Name": class}`` for every exception class defined in the package."""
    found = {}
    for info in pkgutil.walk_packages(wdspack.__path__, "wdspack."):
        if info.name.rpartition(".")[2] == "__main__":  # importing it runs the CLI
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name:
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_public_exception_derives_from_wdspack_error(exception_classes):
    public = {path: cls for path, cls in exception_classes.items() if not path.rpartition(".")[2].startswith("_")}
    # the walk reaches the classes defined outside errors.py, so an empty check cannot pass for a full one
    assert {"wdspack.errors.NewerFormatError", "wdspack.format.tar.ShardError",
            "wdspack.storage.base.Transient"} <= set(public)
    outside = sorted(path for path, cls in public.items() if not issubclass(cls, WdspackError))
    assert outside == [], f"derive these from wdspack.errors.WdspackError (or one of its subclasses): {outside}"


def test_the_errors_docstring_draws_every_public_exception(exception_classes):
    drawn = set(errors.__doc__.split())
    missing = sorted(path for path in exception_classes
                     if not path.rpartition(".")[2].startswith("_") and path.rpartition(".")[2] not in drawn)
    assert missing == [], f"add these to the tree drawn in wdspack/errors.py's docstring: {missing}"


def test_errors_that_stand_for_a_bad_value_are_still_value_errors():
    # callers written against the builtin keep catching what they caught
    assert issubclass(errors.ConfigError, ValueError)
    from wdspack.models.compat import IncompatibleTransformersError

    assert issubclass(IncompatibleTransformersError, ValueError)
