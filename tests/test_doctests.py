"""The examples in wdspack's docstrings run and print what they say (``>>>`` blocks; ``+SKIP`` ones are shown,
not run). One test for the package: a docstring that drifts from its code fails here, named."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import wdspack


def test_every_docstring_example_prints_what_it_says():
    finder = doctest.DocTestFinder()
    failed: list[str] = []
    examples = 0
    for info in pkgutil.walk_packages(wdspack.__path__, prefix="wdspack."):
        if info.name == "wdspack.__main__":  # runs the CLI when imported
            continue
        module = importlib.import_module(info.name)
        for test in finder.find(module, module.__name__):
            if not test.examples:
                continue
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
            result = runner.run(test, out=lambda text: None)
            examples += result.attempted
            if result.failed:
                failed.append(test.name)
    assert examples > 100, examples  # the walk found the package's examples
    assert not failed, f"docstring examples that no longer print what they say: {failed}"
