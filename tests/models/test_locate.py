"""A tokenizer or processor name that cannot load is answered in one line, at once (issue #38, item 1).

The user's commands run as they would type them, in a child process with an empty Hugging Face cache:
the README's quick start (``--processor HuggingFaceTB/SmolVLM-Instruct``) with ``HF_HUB_OFFLINE=1`` and
with the Hub unreachable (``HF_ENDPOINT`` at a closed port on loopback), and a typo of a local folder.
Each exits 2 with one line that names the folder, the cache and the Hub, retries nothing (no retry
lines) and touches no output folder. A name in the cache, or a Hub that answers, goes on to load.
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading

import pytest

from tests.support import ROOT
from wdspack.errors import ConfigError
from wdspack.models.locate import locate_model

QUICK_START = "HuggingFaceTB/SmolVLM-Instruct"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


def _pack(tmp_path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    data = tmp_path / "data.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}\n')
    home = tmp_path / "hf-home"  # an empty cache
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    full.update(HF_HOME=str(home), **env)
    return subprocess.run([sys.executable, "-m", "wdspack", "pack", str(data), "--output", str(tmp_path / "out"),
                           "--seq-len", "512", *args], cwd=tmp_path, env=full, capture_output=True, text=True,
                          timeout=120)


def _one_line(done: subprocess.CompletedProcess, *words: str) -> str:
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "retry" not in lines[0].lower() and "Traceback" not in lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def test_the_quick_start_offline_is_one_line_naming_folder_cache_and_hub(tmp_path):
    done = _pack(tmp_path, "--processor", QUICK_START, env={"HF_HUB_OFFLINE": "1"})
    line = _one_line(done, f"--processor {QUICK_START!r}", "no such folder", "not in the Hugging Face cache",
                     str(tmp_path / "hf-home"), "HF_HUB_OFFLINE=1",
                     f"`hf download {QUICK_START} --local-dir DIR` where there is network, then --processor DIR")
    assert line.startswith("wdspack pack: error: ")
    assert not (tmp_path / "out").exists(), "refused before the output was touched"


def test_an_unreachable_hub_is_one_line_without_retries(tmp_path):
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    done = _pack(tmp_path, "--processor", QUICK_START, env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": endpoint})
    _one_line(done, "no such folder", "not in the Hugging Face cache", f"the Hub ({endpoint}) is unreachable")
    assert not (tmp_path / "out").exists()


def test_a_typo_of_a_local_folder_says_the_folder_does_not_exist(tmp_path):
    (tmp_path / "tok").mkdir()
    done = _pack(tmp_path, "--tokenizer", "tokk", "--tokens-per-image", "0", env={"HF_HUB_OFFLINE": "1"})
    _one_line(done, "--tokenizer 'tokk': no such folder")
    done = _pack(tmp_path, "--tokenizer", "./tokk/", "--tokens-per-image", "0", env={"HF_HUB_OFFLINE": "1"})
    line = _one_line(done, "--tokenizer './tokk/': no such folder. Give the folder")
    assert "cache" not in line, "a path is no model name: the cache is not where it could be"


def test_a_file_is_not_a_folder(tmp_path):
    (tmp_path / "tekken.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"--tokenizer '.*tekken.json' is a file; give the folder that holds it"):
        locate_model(tmp_path / "tekken.json", flag="--tokenizer")


def test_a_folder_or_a_cached_name_goes_on_to_load(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf

    locate_model(tmp_path, flag="--processor")  # a folder
    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError, match="not in the Hugging Face cache"):
        locate_model("org/model", flag="--processor")
    (tmp_path / "hub" / "models--org--model" / "snapshots" / "0123abc").mkdir(parents=True)
    locate_model("org/model", flag="--processor")  # cached: offline is no obstacle


def test_a_hub_that_answers_lets_transformers_download(tmp_path, monkeypatch):
    """Any HTTP answer (a 404 here) means the Hub is reachable: the name goes to transformers as before."""
    import huggingface_hub.constants as hf

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path / "hub"))
        monkeypatch.setattr(hf, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(hf, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        locate_model("org/model", flag="--processor")
    finally:
        server.shutdown()
        server.server_close()


def test_the_readme_quick_start_shows_the_offline_way():
    """The README's quick start fetches the processor into a folder (hf download) and packs with HF_HUB_OFFLINE=1."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = readme[readme.index("## Quick start"):]
    quick = quick[:quick.index("\n## ", 4)]
    assert "hf download HuggingFaceTB/SmolVLM-Instruct --local-dir smolvlm/" in quick
    assert "export HF_HUB_OFFLINE=1" in quick
    assert "--processor smolvlm/" in quick and "--processor HuggingFaceTB" not in quick
