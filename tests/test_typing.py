"""The face as a type checker sees it: every name of ``wdspack.__all__`` has its real type, not ``Any``.

The names ``wdspack/__init__.py`` loads lazily come through its module ``__getattr__``, typed
``Any``; only its ``TYPE_CHECKING`` imports give them their real types. Mypy runs on a snippet
that reveals each name: a lazy name missing from those imports shows up as ``Any`` here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import wdspack

ROOT = Path(__file__).resolve().parents[1]

# Only wdspack is analysed (silently: `make lint` reports its errors); third-party modules are not
# followed, so the check takes seconds, not the minutes torch's and transformers' types take.
MYPY_INI = """\
[mypy]
python_version = 3.11
follow_imports = skip
[mypy-wdspack,wdspack.*]
follow_imports = silent
"""


def _revealed(tmp_path: Path, names: list[str]) -> dict[str, str]:
    snippet = tmp_path / "snippet.py"
    snippet.write_text("import wdspack\n" + "".join(f"reveal_type(wdspack.{n})\n" for n in names))
    ini = tmp_path / "mypy.ini"
    ini.write_text(MYPY_INI)
    run = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ini), "--no-error-summary",
                          "--cache-dir", str(ROOT / ".mypy_cache" / "test_typing"), str(snippet)],
                         cwd=ROOT, env={**os.environ, "MYPYPATH": str(ROOT)}, capture_output=True, text=True,
                         check=False, timeout=300)
    found = re.findall(r"snippet\.py:(\d+): note: Revealed type is \"(.*)\"$", run.stdout, re.M)
    assert len(found) == len(names), run.stdout + run.stderr
    return {names[int(line) - 2]: revealed for line, revealed in found}


def test_every_public_name_has_its_real_type(tmp_path):
    pytest.importorskip("mypy", reason="mypy comes with the lint extra (requirements.lock installs it)")
    revealed = _revealed(tmp_path, list(wdspack.__all__))
    untyped = sorted(n for n, t in revealed.items() if t == "Any")
    assert not untyped, f"{untyped} are Any to type checkers: import them under TYPE_CHECKING in wdspack/__init__.py"
    assert revealed["make_loader"].startswith("def (source: ")
    assert revealed["make_loader"].endswith("-> wdspack.loader.dataloader.PackedLoader")
    assert revealed["PackedDataset"].endswith("-> wdspack.loader.dataset.PackedDataset")
    assert revealed["__version__"] == "str"


def test_all_is_curated():
    assert len(wdspack.__all__) == len(set(wdspack.__all__)), "a name is listed twice"
    assert set(wdspack._LAZY) <= set(wdspack.__all__), "a lazily loaded name is not exported"
