"""A real S3-compatible server on loopback for the remote-storage tests: ``moto``'s server mode.

``python -m moto.server`` answers the S3 REST API (buckets, ranged GETs, multipart uploads,
server-side copies) over HTTP on 127.0.0.1; s3fs talks to it as it would to AWS. The client side
is configured the way a user configures a real endpoint, through the environment
(:func:`S3.env`: ``AWS_ENDPOINT_URL`` and dummy keys), so processes the tests spawn (a process
pool, Ray workers) inherit it. Every request is one line of the server's log (``requests``).

Use from a test module::

    @pytest.fixture(scope="module")
    def s3(tmp_path_factory):
        server = start_s3(tmp_path_factory.mktemp("s3"))
        yield server
        server.stop()
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

__all__ = ["S3", "start_s3", "upload_folder"]

START_TIMEOUT_S = 60.0


class S3(NamedTuple):
    endpoint: str
    log: Path
    stop: Callable[[], None]

    def env(self) -> dict[str, str]:
        """What a user would export to point s3fs at this endpoint (the keys are dummies)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "wdspack-test",
                "AWS_SECRET_ACCESS_KEY": "wdspack-test-secret", "AWS_DEFAULT_REGION": "us-east-1"}

    def requests(self) -> list[str]:
        """The request lines the server has answered so far, e.g. ``GET /bkt/a.tar HTTP/1.1``."""
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
        return [line.split('"')[1] for line in text.splitlines() if line.count('"') >= 2 and "HTTP/" in line]


def start_s3(workdir: Path) -> S3:
    """Start the server on a free loopback port; ``stop()`` ends it by its pid."""
    port = _free_port()
    log = workdir / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            break
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"moto server not answering on port {port}: {log.read_text()[-2000:]}")
        time.sleep(0.1)

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    return S3(f"http://127.0.0.1:{port}", log, stop)


def upload_folder(fs, folder: Path, url: str) -> None:
    """Copy every file under ``folder`` to ``url`` (``s3://bucket/prefix``), keeping relative paths."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            fs.put_file(str(path), f"{url.rstrip('/')}/{path.relative_to(folder).as_posix()}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_s3(workdir: Path, bucket: str):
    """A moto server with ``bucket`` made, its endpoint and keys in the environment (as a user points
    s3fs at an endpoint) for the ``with`` block: yields ``(server, s3fs filesystem)``."""
    import pytest
    import s3fs

    server = start_s3(workdir)
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in server.env().items():
                mp.setenv(key, value)
            s3fs.S3FileSystem.clear_instance_cache()
            fs = s3fs.S3FileSystem()
            fs.mkdir(bucket)
            yield server, fs
            s3fs.S3FileSystem.clear_instance_cache()
    finally:
        server.stop()
