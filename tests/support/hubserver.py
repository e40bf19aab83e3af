"""A real Hub-compatible server on loopback for streaming tests: ``olah`` serving local git repos.

``olah`` (a Hugging Face mirror) answers the Hub's API and ``resolve`` routes from git
repositories under ``MIRRORS/datasets/ORG/NAME``; in ``offline`` mode it never forwards a request
upstream, and its upstream host is set to a closed loopback port besides, so nothing here can
reach huggingface.co. Every request the server answers is appended, as one JSON line, to a
request log the tests read to count requests::

    {"method": "GET", "path": "/api/datasets/org/packed/revision/main", "query": "",
     "status": 200, "range": null, "auth": "5b1f0c9d4e2a7f83"}

``auth`` is a digest of the ``Authorization`` header (:func:`auth_digest`), never the header
itself, so a test can check that a token arrived without the token being written anywhere.

Use from a test module::

    from tests.support.hubserver import publish, start_hub

    @pytest.fixture(scope="module")
    def hub(tmp_path_factory):
        mirrors = tmp_path_factory.mktemp("mirrors")
        endpoint, requests, stop = start_hub(mirrors, workdir=tmp_path_factory.mktemp("olah"))
        yield endpoint, requests, mirrors
        stop()

    sha = publish(mirrors, "org/packed", dataset_folder)      # a git commit on ``main``
    PackedDataset("hf://datasets/org/packed@main", read={"storage_options": {"endpoint": endpoint}})

Name the revision (``@main``) in every Hub call made to olah: a revision-less repo lookup
(``/api/datasets/ORG/NAME``) is one it can only answer from upstream, so offline it answers 401.
wdspack's loader asks for ``main`` by name when a source leaves the revision out.

Known olah quirks (0.5.4, local mirrors): ``Range`` is ignored (200 with the whole file, chunked,
no ``Content-Length``); a missing revision is answered like a missing repo (401 RepoNotFound); a
missing file in an existing repo is a 500. Run as a script, this file is the server process
itself: olah's CLI with :class:`RequestRecorder` as the app's outermost middleware.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

__all__ = ["Hub", "auth_digest", "commit_files", "loopback_only", "publish", "start_hub"]

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class Hub(NamedTuple):
    """A running server: its endpoint, a reader of its request log, and how to stop it."""

    endpoint: str
    requests: Callable[[], list[dict]]
    stop: Callable[[], None]


def auth_digest(value: str) -> str:
    """What the request log records for an ``Authorization`` header value (16 hex digits of its sha256)."""
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def start_hub(mirrors: str | os.PathLike[str], *, workdir: str | os.PathLike[str]) -> Hub:
    """Start olah on a free loopback port, serving the git repos under ``mirrors``; wait until it answers.

    Args:
        mirrors: the folder holding ``datasets/ORG/NAME`` git repositories (see :func:`publish`);
            repositories added while the server runs are served too.
        workdir: where the config, olah's own logs (``logs/olah.log``), its cache, the server's
            output (``server.out``) and the request log (``requests.jsonl``) go.

    Example:
        >>> endpoint, requests, stop = start_hub("/tmp/mirrors", workdir="/tmp/olah")  # doctest: +SKIP
        >>> endpoint  # doctest: +SKIP
        'http://127.0.0.1:40513'
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    request_log = workdir / "requests.jsonl"
    request_log.touch()
    last_error = ""
    for _ in range(3):  # a free port can be taken between choosing and binding it
        port = _free_port()
        config = _write_config(workdir, Path(mirrors), port)
        proc = _spawn(workdir, config, request_log)
        error = _wait_until_listening(proc, port, workdir / "server.out")
        if error is None:
            return Hub(f"http://127.0.0.1:{port}", lambda: _read_requests(request_log),
                       lambda proc=proc: _stop(proc))
        _stop(proc)
        last_error = error
    raise RuntimeError(f"olah did not start: {last_error}")


def publish(mirrors: str | os.PathLike[str], repo_id: str, folder: str | os.PathLike[str], *,
            branch: str = "main", message: str = "wdspack test data") -> str:
    """Make ``folder``'s files the whole tree of ``mirrors/datasets/{repo_id}`` in one commit; return its sha.

    The repo is created when missing; on an existing one the commit goes on top and removes what
    ``folder`` lacks.

    Example:
        >>> publish("/tmp/mirrors", "org/packed", "packed/")  # doctest: +SKIP
        '3f1c0b2e...'
    """
    repo = _open_repo(mirrors, repo_id, branch)
    for entry in repo.iterdir():
        if entry.name != ".git":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    shutil.copytree(folder, repo, dirs_exist_ok=True)
    return _commit(repo, message)


def commit_files(mirrors: str | os.PathLike[str], repo_id: str, files: Mapping[str, str | os.PathLike[str]], *,
                 branch: str = "main", message: str = "wdspack test data") -> str:
    """Add or overwrite ``{path in repo: local file}`` in one commit on ``branch`` (the repo is created,
    with an empty first commit, when missing); return the commit's sha. What a Hub upload does."""
    repo = _open_repo(mirrors, repo_id, branch)
    for name, source in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, repo / name)
    return _commit(repo, message)


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """Refuse, in this process, any name lookup or connection to a host other than loopback.

    A guard for tests that must never reach the internet: a stray ``huggingface.co`` lookup
    raises ``OSError`` naming the host instead of leaving the machine. Forked DataLoader workers
    inherit it.
    """
    real_getaddrinfo, real_connect = socket.getaddrinfo, socket.socket.connect

    def getaddrinfo(host, *args, **kwargs):
        if host not in _LOOPBACK and host is not None:
            raise OSError(f"test guard: lookup of {host!r} refused; only loopback may be contacted")
        return real_getaddrinfo(host, *args, **kwargs)

    def connect(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in _LOOPBACK:
            raise OSError(f"test guard: connection to {address[0]!r} refused; only loopback may be contacted")
        return real_connect(sock, address)

    socket.getaddrinfo, socket.socket.connect = getaddrinfo, connect
    try:
        yield
    finally:
        socket.getaddrinfo, socket.socket.connect = real_getaddrinfo, real_connect


# -- the client side's helpers ----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_config(workdir: Path, mirrors: Path, port: int) -> Path:
    # offline: answer from the mirrors (and olah's cache) only. The upstream is a closed loopback
    # port as well, so even a code path that ignores offline cannot leave the machine.
    config = workdir / "olah.toml"
    config.write_text("\n".join([
        "[basic]",
        'host = "127.0.0.1"',
        f"port = {port}",
        f"repos-path = {json.dumps(str(workdir / 'cache'))}",
        f"mirrors-path = [{json.dumps(str(mirrors))}]",
        'hf-scheme = "http"',
        'hf-netloc = "127.0.0.1:9"',
        'hf-lfs-netloc = "127.0.0.1:9"',
        "[accessibility]",
        "offline = true",
        "",
    ]), encoding="utf-8")
    return config


def _spawn(workdir: Path, config: Path, request_log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env["HOME"] = str(workdir)  # olah may create ~/.olah
    with open(workdir / "server.out", "ab") as out:
        return subprocess.Popen([sys.executable, os.path.abspath(__file__), str(config), str(workdir / "logs"),
                                 str(request_log)], cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def _wait_until_listening(proc: subprocess.Popen, port: int, output: Path) -> str | None:
    """None once the port accepts connections; else why not (with the server's last output)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"exited with {proc.returncode}: {_tail(output)}"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return None
        time.sleep(0.1)
    return f"port {port} not answering after {START_TIMEOUT_S:.0f}s: {_tail(output)}"


def _tail(path: Path, chars: int = 2000) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[-chars:] if path.exists() else ""


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _read_requests(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def _open_repo(mirrors, repo_id: str, branch: str) -> Path:
    repo = Path(mirrors) / "datasets" / repo_id
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        _git(repo, "init", "-q", "-b", branch)
        _commit(repo, "initial commit")  # the Hub creates a repo with a first commit, so main exists
    else:
        _git(repo, "checkout", "-q", branch)
    return repo


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    cmd = ["git", "-c", "user.name=wdspack tests", "-c", "user.email=tests@wdspack.invalid",
           "-c", "commit.gpgsign=false", *args]
    done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} in {repo} failed: {done.stderr.strip()}")
    return done.stdout.strip()


# -- the server process -----------------------------------------------------------------------------


class RequestRecorder:
    """ASGI wrapper: append one JSON line per answered request to ``path``, when the response starts.

    Written before the status line reaches the client, so a client that has its answer can read
    the log without waiting.
    """

    def __init__(self, app, path: str) -> None:
        self.app = app
        self.log = open(path, "a", encoding="utf-8")  # noqa: SIM115  (the server's log, open while it runs)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        started = False

        def record(status: int) -> None:
            auth = headers.get("authorization")
            self.log.write(json.dumps({
                "method": scope["method"], "path": scope["path"],
                "query": scope.get("query_string", b"").decode("latin-1"), "status": status,
                "range": headers.get("range"), "auth": auth_digest(auth) if auth else None}) + "\n")
            self.log.flush()

        async def recording_send(message):
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                record(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        except Exception:
            if not started:
                record(500)
            raise


def _serve(config: str, log_dir: str, request_log: str) -> None:
    import olah.server as server

    server.app.add_middleware(RequestRecorder, path=request_log)  # outermost: sees every answer
    sys.argv = ["olah-cli", "--config", config, "--log-path", log_dir]
    server.cli()


if __name__ == "__main__":
    _serve(*sys.argv[1:4])
