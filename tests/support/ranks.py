"""Processes on loopback for the multi-rank tests: a free port, and run-all-or-fail."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Mapping, Sequence

__all__ = ["free_port", "run_all"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_all(commands: Sequence[Sequence[str]], *, env: Mapping[str, str], timeout: float) -> list[str]:
    """Start every command at once (one per rank), wait for all, fail with the stderr of one that failed;
    return their standard outputs. Processes still running at the timeout are killed."""
    procs = [subprocess.Popen(list(c), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE) for c in commands]
    try:
        results = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err.decode()[-3000:]
    return [out.decode() for out, _ in results]
