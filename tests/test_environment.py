"""The environment is reproducible: the lock files pin every package ``make`` installs and name no path of this
machine, and the private transformers names wdspack uses fail with the tested range, not deep inside a step."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from wdspack.errors import ConfigError
from wdspack.models.compat import TESTED_TRANSFORMERS, IncompatibleTransformersError, call_private, private

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
TORCH_LOCK = ROOT / "requirements" / "torch.lock"


def _locked() -> dict[str, str]:
    text = LOCK.read_text(encoding="utf-8") + TORCH_LOCK.read_text(encoding="utf-8")
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, flags=re.M)
    return {name.lower().replace("_", "-"): version for name, version in pins}


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def test_every_locked_package_is_pinned_with_hashes():
    text = LOCK.read_text(encoding="utf-8") + TORCH_LOCK.read_text(encoding="utf-8")
    entries = re.findall(r"^[A-Za-z0-9_.-]+==\S+ \\\n((?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)", text, flags=re.M)
    assert len(entries) == len(_locked()) >= 50, "every pin carries at least one hash"
    pins = _locked()
    assert pins["torch"] == "2.13.0" and "torch" not in re.findall(r"^([a-z0-9_.-]+)==", LOCK.read_text(), flags=re.M)
    assert not any(name.startswith(("nvidia-", "cuda-", "triton")) for name in pins), "the CPU build's packages"


def test_torch_is_its_cpu_build_on_every_platform_the_readme_names():
    """requirements/torch.lock: one hash per wheel its header names, each a CPU build (PyTorch's +cpu wheels for
    Linux, PyPI's macOS arm64 ones: PyPI's Linux wheels are CUDA builds), for each platform and Python of README.md."""
    text = TORCH_LOCK.read_text(encoding="utf-8")
    named = dict(re.findall(r"^#\s+(torch-\S+\.whl)\s+sha256:([0-9a-f]{64})$", text, flags=re.M))
    hashes = re.findall(r"^    --hash=sha256:([0-9a-f]{64})", text, flags=re.M)
    assert sorted(hashes) == sorted(named.values()) and len(set(hashes)) == len(hashes)
    assert re.findall(r"^-.*$", text, flags=re.M) == ["--extra-index-url https://download.pytorch.org/whl/cpu"]
    cpu = re.compile(r"torch-2\.13\.0(\+cpu-cp3\d+-cp3\d+t?-manylinux_2_28_(x86_64|aarch64)"
                     r"|-cp3\d+-cp3\d+t?-macosx_\d+_\d+_arm64)\.whl")
    assert [name for name in named if not cpu.fullmatch(name)] == [], "only CPU builds"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for py in ("311", "312", "313"):
        assert f"3.{py[1:]}" in readme
        for platform in ("+cpu-cp{0}-cp{0}-manylinux_2_28_x86_64", "+cpu-cp{0}-cp{0}-manylinux_2_28_aarch64",
                         "-cp{0}-cp{0}-macosx_14_0_arm64"):
            assert f"torch-2.13.0{platform.format(py)}.whl" in named


def test_the_installed_environment_is_the_lock():
    from importlib.metadata import version

    for name in ("transformers", "tokenizers", "huggingface-hub", "numpy", "webdataset", "pillow", "build"):
        assert version(name) == _locked()[name], f"{name}: run `make env` (it installs requirements.lock)"
    # torch==2.13.0 matches the +cpu wheel PyTorch's CPU index has for Linux (its local label) and PyPI's macOS one
    assert version("torch").split("+")[0] == _locked()["torch"]
    if sys.platform == "linux":
        assert version("torch").endswith("+cpu"), "the CPU build"


def _machine_paths() -> set[str]:
    """The paths of this machine a lock could pick up: pip's configured find-links, local indexes and constraint
    files (its configuration files and PIP_* variables), the checkout and the environment."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                         check=True).stdout
    values = re.findall(r"(?:find-links|index-url|constraint|requirement)='([^']*)'", out)
    values += [v for k, v in os.environ.items() if k.startswith("PIP_") and
               k.endswith(("FIND_LINKS", "INDEX_URL", "CONSTRAINT", "REQUIREMENT"))]
    paths = {v.removeprefix("file://").rstrip("/") for value in values for v in value.split()
             if v.startswith(("/", "file:"))}
    return {p for p in paths | {str(ROOT), sys.prefix} if len(p) > 4}


def test_no_lock_file_names_a_path_of_this_machine():
    """The lock files hold only what a user's machine has: no option but a public index (https), no file: URL,
    no find-links, no absolute path; a test of the files, and of every tracked file against this machine's own."""
    from tools.lock import local_paths

    files = [LOCK, *sorted((ROOT / "requirements").iterdir())]
    assert TORCH_LOCK in files
    for path in files:
        text = path.read_text(encoding="utf-8")
        options = re.findall(r"^\s*(-[^-\s].*|--(?!hash)\S+.*)$", text, flags=re.M)
        assert all(re.fullmatch(r"--(extra-)?index-url https://\S+", o) for o in options), (path.name, options)
        assert not re.search(r"file:/|find-links|(^|\s)(/|~/)\w", text, flags=re.M), path.name
        assert local_paths(text) == [], path.name
    mine = _machine_paths()
    assert any(p.startswith("/") for p in mine)
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout: the tracked files are unknown")
    for name in tracked.stdout.split("\0"):
        path = ROOT / name
        if name and path.is_file() and path.stat().st_size < 5_000_000:
            text = path.read_text(encoding="utf-8", errors="replace")
            assert not [p for p in mine if p in text], f"{name} names a path of this machine"


def test_the_locked_transformers_is_in_the_tested_range():
    lo, hi = (_version(v) for v in TESTED_TRANSFORMERS)
    assert lo <= _version(_locked()["transformers"]) <= hi
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f"tested with {TESTED_TRANSFORMERS[0]} to {TESTED_TRANSFORMERS[1]}" in pyproject


def test_make_installs_from_the_lock_and_ci_runs_make_test():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "--require-hashes" in makefile and "requirements.lock" in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    # torch first, from a wheel at hand without asking an index; only then from torch.lock's index (PyTorch's)
    env = makefile.split("$(STAMP):", 1)[1].split("\nenv:", 1)[0]
    at_hand = env.index("--no-index -r $(TORCH_LOCK)")
    assert at_hand < env.index("|| $(BIN)/pip install") < env.index("-r $(LOCK)")
    assert "download.pytorch.org" not in LOCK.read_text(encoding="utf-8"), "asked for every package, were it here"


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
