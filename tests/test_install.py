"""The package as users install it: ``python -m build`` makes an sdist and, from it, a wheel; the wheel with its
``video`` extra goes into a fresh venv that sees none of the checkout, and the README's quick start runs there
offline (pack the demo dataset with a tokenizer folder, inspect it, stream a batch).

The fresh venv borrows the dependencies already installed in ``.venv`` (a ``.pth`` line naming a folder of links
to them, the editable wdspack left out) so nothing is downloaded; pip installs the wheel alone, offline, and
resolves its requirements and the extra against them.
"""

from __future__ import annotations

import email.parser
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

import wdspack
from tests.support import ROOT

#: Not copied to the build's source folder: environments, outputs, caches.
_NOT_SOURCE = (".git", ".venv", "build", "dist", "__pycache__", "*.egg-info", ".pytest_cache", ".hypothesis",
               ".mypy_cache", ".ruff_cache")


def _run(cmd: list, *, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{cmd[:3]} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path, Path]:
    """``(sdist, wheel, source)``: ``python -m build`` on a copy of the checkout (it writes into its source)."""
    tmp = tmp_path_factory.mktemp("build")
    source = tmp / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE), symlinks=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # --no-isolation: the build backend (setuptools) from .venv, nothing downloaded
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", tmp / "dist", source], cwd=tmp, env=env)
    (sdist,) = (tmp / "dist").glob("*.tar.gz")
    (wheel,) = (tmp / "dist").glob("*.whl")
    return sdist, wheel, source


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A fresh venv holding the wheel (``[video]``), and the environment to run it in: offline, no checkout."""
    tmp = tmp_path_factory.mktemp("venv")
    deps = tmp / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("wdspack", "__editable__", "__pycache__")) and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp, env=dict(os.environ))
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = Path(_run([venv / "bin" / "python", "-c", where], cwd=tmp, env=dict(os.environ)).strip())
    (purelib / "wdspack-test-deps.pth").write_text(f"{deps}\n")
    # offline: no index, no pip configuration (its find-links), no checkout on the path
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"HF_HUB_OFFLINE": "1", "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1",
            "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    _, wheel, _ = built
    _run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-cache-dir", "--disable-pip-version-check",
          f"{wheel}[video]"], cwd=tmp, env=env)
    return venv, env


def test_the_sdist_holds_what_a_build_needs_and_none_of_the_tests(built):
    sdist, wheel, source = built
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    top = {name.split("/", 1)[0] for name in names}
    assert top == {"LICENSE", "MANIFEST.in", "PKG-INFO", "README.md", "pyproject.toml", "setup.cfg", "wdspack",
                   "wdspack.egg-info"}, "no tests, data, docs, tools or examples"
    package = {p.relative_to(source).as_posix() for p in (source / "wdspack").rglob("*.py")}
    assert package <= names and "wdspack/py.typed" in names
    # build made the wheel from the unpacked sdist: all the modules are in it
    with zipfile.ZipFile(wheel) as whl:
        assert package <= set(whl.namelist())


def test_the_metadata_users_see(built):
    _, wheel, _ = built
    with zipfile.ZipFile(wheel) as whl:
        (meta_name,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        meta = email.parser.Parser().parsestr(whl.read(meta_name).decode())
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in whl.namelist())
    assert meta["Name"] == "wdspack" and meta["Version"] == wdspack.__version__
    assert wheel.name == f"wdspack-{wdspack.__version__}-py3-none-any.whl"
    assert meta["License-Expression"] == "Apache-2.0" and meta["License-File"] == "LICENSE"
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().startswith("# wdspack\n") and meta["Summary"]
    requires = SpecifierSet(meta["Requires-Python"])
    versions = [c.rsplit(" ", 1)[1] for c in meta.get_all("Classifier")
                if c.startswith("Programming Language :: Python :: 3.")]
    assert "3.11" in versions and all(v in requires for v in versions) and "3.9" not in requires
    assert "video" in meta.get_all("Provides-Extra")
    assert 'av>=14; extra == "video"' in meta.get_all("Requires-Dist")


def test_the_readme_quick_start_runs_on_the_installed_wheel_offline(venv, tekken_dir, demo_data, tmp_path):
    venv, env = venv
    bin_ = venv / "bin"
    assert _run([bin_ / "wdspack", "--version"], cwd=tmp_path, env=env).strip() == f"wdspack {wdspack.__version__}"
    template = shutil.copy(ROOT / "examples" / "chat_templates" / "pixtral.jinja", tmp_path / "chat.jinja")
    _run([bin_ / "wdspack", "pack", demo_data / "llava.jsonl", demo_data / "messages.jsonl", "--output", "packed",
          "--tokenizer", tekken_dir, "--chat-template", template, "--image-token", "[IMG]", "--tokens-per-image", "16",
          "--seq-len", "2048", "--max-images", "6", "--workers", "1", "--max-drop-fraction", "1", "--quiet"],
         cwd=tmp_path, env=env)
    assert "packs" in _run([bin_ / "wdspack", "inspect", "packed"], cwd=tmp_path, env=env)
    stream = """if True:
        import json, sys, wdspack
        loader = wdspack.make_loader("packed", batch_size=2, num_workers=0, seed=0,
                                     image_transform=wdspack.make_image_transform(size=64))
        batch = next(iter(loader))
        print(json.dumps({"file": wdspack.__file__, "path": sys.path, "input_ids": list(batch["input_ids"].shape),
                          "pixel_values": list(batch["pixel_values"].shape), "tokens": int(batch["num_tokens"].sum())}))
    """
    out = json.loads(_run([bin_ / "python", "-c", stream], cwd=tmp_path, env=env).splitlines()[-1])
    assert Path(out["file"]).is_relative_to(venv), out["file"]
    assert not any(Path(p).resolve() == ROOT for p in out["path"] if p), "the checkout is not on sys.path"
    assert out["input_ids"] == [2, 2048] and 0 < out["tokens"] <= 2 * 2048
    assert out["pixel_values"][-2:] == [64, 64]
