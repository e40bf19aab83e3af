"""The environment is reproducible: the lock file pins every package ``make`` installs, and the
private transformers names wdspack uses fail with the tested range, not deep inside a step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from wdspack.errors import ConfigError
from wdspack.models.compat import TESTED_TRANSFORMERS, IncompatibleTransformersError, call_private, private

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"


def _locked() -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", LOCK.read_text(encoding="utf-8"), flags=re.M)
    return {name.lower().replace("_", "-"): version for name, version in pins}


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def test_every_locked_package_is_pinned_with_hashes():
    text = LOCK.read_text(encoding="utf-8")
    entries = re.findall(r"^[A-Za-z0-9_.-]+==\S+ \\\n((?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)", text, flags=re.M)
    assert len(entries) == len(_locked()) >= 50, "every pin carries at least one hash"
    pins = _locked()
    assert pins["torch"] == "2.13.0+cpu", "the CPU build, not a CUDA one"
    assert not any(name.startswith("nvidia-") for name in pins)


def test_the_installed_environment_is_the_lock():
    from importlib.metadata import version

    for name in ("transformers", "tokenizers", "huggingface-hub", "numpy", "torch", "webdataset", "pillow"):
        assert version(name) == _locked()[name], f"{name}: run `make env` (it installs requirements.lock)"


def test_the_locked_transformers_is_in_the_tested_range():
    lo, hi = (_version(v) for v in TESTED_TRANSFORMERS)
    assert lo <= _version(_locked()["transformers"]) <= hi
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f"tested with {TESTED_TRANSFORMERS[0]} to {TESTED_TRANSFORMERS[1]}" in pyproject


def test_make_installs_from_the_lock_and_ci_runs_make_test():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "--require-hashes" in makefile and "requirements.lock" in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_a_missing_private_name_names_the_tested_range():
    with pytest.raises(IncompatibleTransformersError, match=r"no_such_helper does not exist in the installed "
                       r"transformers .*tested with transformers 5\.17\.0 to 5\.24\.0") as e:
        private("transformers.masking_utils", "and_masks", "no_such_helper")
    assert isinstance(e.value, ConfigError)
    with pytest.raises(IncompatibleTransformersError, match=r"module transformers\.no_such_module does not exist"):
        private("transformers.no_such_module", "x")


def test_a_changed_private_signature_names_the_tested_range():
    overlay = private("transformers.masking_utils", "sliding_window_overlay")
    assert call_private(overlay, sliding_window=4)(0, 0, 5, 2)
    with pytest.raises(IncompatibleTransformersError, match=r"sliding_window_overlay\(window\) cannot be called"):
        call_private(overlay, window=4)
