"""The last step of `make lock`: pip-compile's output split into the two lock files a user's machine can install.

    python -m tools.lock requirements.lock --torch-lock requirements/torch.lock --wheels build/torch-wheel

``requirements.lock`` keeps every package but torch, and no option line (the index is pip's own: PyPI, or
the mirror the user's pip configuration names). ``requirements/torch.lock`` pins torch's CPU build with the
hashes of its wheels for every platform found: the CPU wheel pip-compile resolved against (``--wheels``), the
``+cpu`` wheels on PyTorch's CPU index (Linux; PyPI's Linux wheels are CUDA builds) and PyPI's macOS arm64
wheels (the CPU build), and those ``torch.lock`` already lists for that version (an index out of reach adds none).
A lock that names a local path (``--find-links``, a ``file:`` URL, an absolute path) is refused.
"""

from __future__ import annotations

import argparse
import hashlib
import html.parser
import json
import re
import sys
import urllib.parse
import urllib.request
from pathlib import Path

TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
PYPI_SIMPLE = "https://pypi.org/simple"

#: A path of the machine the lock was made on: a ``file:`` URL, or an absolute path in a line of the file.
LOCAL_PATH = re.compile(r"file:/|(?:^|[\s=,'\"(])(~|/[\w.+-]+)/[\w.+-]")
_PIN = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+)")


def base_version(version: str) -> str:
    """``"2.13.0+cpu"`` -> ``"2.13.0"``: the public version, which PyPI's and PyTorch's wheels share."""
    return version.split("+", 1)[0]


def split_torch(text: str) -> tuple[str, str]:
    """pip-compile's output -> (the lock without its option lines and torch's entry, the pinned torch version)."""
    kept: list[str] = []
    version = None
    in_torch = False
    for line in text.splitlines():
        pin = _PIN.match(line)
        if not line.startswith(" "):  # an entry's hashes and "# via" lines are indented; anything else ends it
            in_torch = pin is not None and pin.group(1).lower() == "torch"
            if pin is not None and in_torch:
                version = pin.group(2)
        if in_torch or (line.startswith("-") and not pin):
            continue  # torch's lines (requirements/torch.lock has them), and pip's options (the index is pip's own)
        kept.append(line)
    if version is None:
        raise SystemExit("tools.lock: pip-compile's output pins no torch")
    return "\n".join(kept).replace("\n\n\n", "\n\n") + "\n", version


NOTE = """\
# torch is in requirements/torch.lock (its CPU build; `make env` installs it first). No index line: the packages
# come from pip's own index (PyPI, or the mirror pip's configuration names).

"""


def add_note(lock: str) -> str:
    """``lock`` with :data:`NOTE` after pip-compile's header (its leading comment lines)."""
    lines = lock.splitlines(keepends=True)
    n = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    return "".join(lines[:n]) + NOTE + "".join(lines[n:])


def hash_wheels(folders: list[Path], version: str) -> dict[str, str]:
    """``wheel name -> sha256`` of torch ``version``'s wheels in ``folders`` (the one pip-compile resolved against)."""
    found = {}
    for folder in folders:
        for wheel in sorted(folder.glob(f"torch-{base_version(version)}*.whl")):
            found[wheel.name] = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return found


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.hrefs += [v for k, v in attrs if tag == "a" and k == "href" and v]


def index_wheels(page: str) -> dict[str, str]:
    """A PEP 503 project page -> ``wheel name -> sha256`` of the links that carry one (``#sha256=...``)."""
    parser = _Anchors()
    parser.feed(page)
    found = {}
    for href in parser.hrefs:
        url, _, fragment = href.partition("#")
        name = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        if name.endswith(".whl") and fragment.startswith("sha256="):
            found[name] = fragment.removeprefix("sha256=")
    return found


def cpu_wheels(found: dict[str, str], version: str) -> dict[str, str]:
    """The CPU builds of torch ``version`` among ``found``: the ``+cpu`` wheels and the macOS arm64 ones."""
    v = re.escape(base_version(version))
    cpu = re.compile(rf"torch-{v}\+cpu-.+\.whl|torch-{v}-.+-macosx_\d+_\d+_arm64\.whl")
    return {name: sha for name, sha in found.items() if cpu.fullmatch(name)}


def fetch(url: str, *, accept: str = "text/html", timeout: float = 15.0) -> str | None:
    """The page at ``url``, or None (with a line on stderr) when it is out of reach: one try, no retries."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": accept}), timeout=timeout) as r:
            return r.read().decode("utf-8")
    except OSError as e:
        print(f"tools.lock: {url} is out of reach ({e}); its wheels' hashes are not added", file=sys.stderr)
        return None


def pypi_wheels(index: str = PYPI_SIMPLE) -> dict[str, str]:
    """``wheel name -> sha256`` of every torch wheel on PyPI (its JSON simple API), {} when out of reach."""
    page = fetch(f"{index}/torch/", accept="application/vnd.pypi.simple.v1+json")
    if page is None:
        return {}
    return {f["filename"]: f["hashes"]["sha256"] for f in json.loads(page)["files"] if "sha256" in f["hashes"]}


def read_torch_lock(path: Path) -> tuple[str | None, dict[str, str]]:
    """The version ``path`` pins and the ``wheel name -> sha256`` its header lists (None, {} if there is none)."""
    if not path.exists():
        return None, {}
    text = path.read_text(encoding="utf-8")
    pin = re.search(r"^torch==(\S+)", text, flags=re.M)
    wheels = dict(re.findall(r"^#\s+(torch-\S+\.whl)\s+sha256:([0-9a-f]{64})$", text, flags=re.M))
    return (pin.group(1) if pin else None), wheels


def render_torch_lock(version: str, wheels: dict[str, str], index: str = TORCH_INDEX) -> str:
    """requirements/torch.lock: the index line, the pin and one hash a wheel, each wheel named in the header."""
    names = sorted(wheels)
    return "\n".join([
        "# torch's CPU build, for `make env` (it installs this file before requirements.lock); written by `make lock`.",
        "# PyPI's Linux wheels are CUDA builds: the Linux ones here are PyTorch's CPU index's (+cpu), the macOS",
        "# ones PyPI's. A platform or Python with no wheel here fails at install with the hash pip found:",
        "# `make lock` on that machine adds its wheel (README.md, Two commands). The hashes are of these wheels:",
        *(f"#   {name}  sha256:{wheels[name]}" for name in names),
        f"--extra-index-url {index}",
        "",
        f"torch=={base_version(version)} \\",
        " \\\n".join(f"    --hash=sha256:{wheels[name]}" for name in names),
        "",
    ])


def local_paths(text: str) -> list[str]:
    """The lines of ``text`` that name a path of the machine it was made on."""
    return [line for line in text.splitlines() if LOCAL_PATH.search(line)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("lock", type=Path, help="pip-compile's output, rewritten in place")
    ap.add_argument("--torch-lock", type=Path, required=True)
    ap.add_argument("--wheels", type=Path, action="append", default=[], help="a folder holding torch's CPU wheel")
    ap.add_argument("--torch-index", default=TORCH_INDEX)
    args = ap.parse_args(argv)

    rest, version = split_torch(args.lock.read_text(encoding="utf-8"))
    rest = add_note(rest)
    wheels = cpu_wheels(hash_wheels(args.wheels, version), version)
    if not wheels:
        raise SystemExit(f"tools.lock: no CPU wheel of torch {version} in {[str(w) for w in args.wheels]}")
    old_version, old = read_torch_lock(args.torch_lock)
    if old_version == base_version(version):
        wheels = {**old, **wheels}
    page = fetch(f"{args.torch_index}/torch/")
    wheels |= cpu_wheels(index_wheels(page), version) if page else {}
    wheels |= cpu_wheels(pypi_wheels(), version)

    torch_lock = render_torch_lock(version, wheels, args.torch_index)
    for path, text in ((args.lock, rest), (args.torch_lock, torch_lock)):
        if bad := local_paths(text):
            raise SystemExit(f"tools.lock: {path} would name a path of this machine: {bad[0]!r}")
    args.lock.write_text(rest, encoding="utf-8")
    args.torch_lock.write_text(torch_lock, encoding="utf-8")
    print(f"tools.lock: torch {base_version(version)}, {len(wheels)} CPU wheels: " + ", ".join(sorted(wheels)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
