"""A real HTTP file server on loopback for streaming tests, with scripted faults.

It serves one folder at ``http://127.0.0.1:{port}/`` from a background thread, honours
``Range: bytes=N-`` (206 + ``Content-Range``; 416 past the end) and logs every request. Each path
can be given a script: what its k-th request gets (``None``: a normal answer), and what every
request after the script gets (``then``)::

    with serve(root) as server:
        server.script("/train-000001.tar", cut(3000), status(503, retry_after="0"))
        ds = PackedDataset(server.url, ...)
        [r.range_start for r in server.requests("/train-000001.tar")]   # [None, 3000, 3000]

Faults:

    ============================  ==========================================================
    ``cut(n)``                    full ``Content-Length``, ``n`` body bytes, then FIN
    ``cut(n, reset=True)``        the same, then RST (``SO_LINGER`` 0): a reset connection
    ``stall(n, seconds)``         headers and ``n`` body bytes, then silence for ``seconds``
    ``stall(None, seconds)``      silence for ``seconds`` before the status line
    ``status(code, retry_after)`` an error status (429, 503, 404) with an empty body
    ``ignore_range()``            200 and the whole file, even to a ``Range`` request
    ``redirect(url)``             302 to ``url``
    ============================  ==========================================================

Only ``127.0.0.1`` is ever bound; the port is picked by the OS.
"""

from __future__ import annotations

import http.server
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Fault", "Request", "Server", "cut", "ignore_range", "redirect", "serve", "stall", "status"]


@dataclass(frozen=True, slots=True)
class Fault:
    """What one request gets instead of a clean answer (build it with the functions below)."""

    status: int | None = None  # an error status with an empty body
    retry_after: str | None = None
    location: str | None = None  # with status 302
    ignore_range: bool = False
    cut_after: int | None = None  # body bytes sent before the connection ends early
    reset: bool = False  # end it with RST instead of FIN
    stall_s: float = 0.0  # silence before the early end


def cut(after: int, *, reset: bool = False) -> Fault:
    return Fault(cut_after=after, reset=reset)


def stall(after: int | None, seconds: float) -> Fault:
    """``after=None``: silence before the status line (logged with status 0)."""
    return Fault(cut_after=after, stall_s=seconds)


def status(code: int, *, retry_after: str | None = None) -> Fault:
    return Fault(status=code, retry_after=retry_after)


def ignore_range(*, cut_after: int | None = None) -> Fault:
    return Fault(ignore_range=True, cut_after=cut_after)


def redirect(url: str) -> Fault:
    return Fault(status=302, location=url)


@dataclass(frozen=True, slots=True)
class Request:
    """One request as the server saw it; ``sent`` is the body bytes it (tried to) send."""

    path: str
    range_start: int | None
    status: int
    sent: int
    at: float  # time.monotonic() on arrival
    headers: dict[str, str] = field(repr=False)


class ScriptedServer:
    """A threaded HTTP server on ``127.0.0.1`` (a free port) with per-path fault scripts and a request
    log; ``handler`` is a ``BaseHTTPRequestHandler`` subclass that reads them through ``owner``."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler], name: str) -> None:
        self.log: list[Any] = []
        self._scripts: dict[str, tuple[list[Any], Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (handler,), {"owner": self}))
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"{name}-{self.port}", daemon=True)

    def script(self, path: str, *faults: Any, then: Any = None) -> None:
        """The k-th next request for ``path`` gets ``faults[k]``; every later one gets ``then``."""
        with self._lock:
            self._scripts[path] = (list(faults), then)

    def clear(self) -> None:
        with self._lock:
            self.log.clear()
            self._scripts.clear()

    def close(self) -> None:
        self._stop.set()  # wakes stalled handlers
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _next_fault(self, path: str) -> Any:
        with self._lock:
            faults, then = self._scripts.get(path, ([], None))
            return faults.pop(0) if faults else then

    def _record(self, request: Any) -> None:
        with self._lock:
            self.log.append(request)


class Server(ScriptedServer):
    """Serves the files under ``root`` (see the module docstring)."""

    def __init__(self, root: str | Path) -> None:
        super().__init__(_Handler, "httpserver")
        self.root = Path(root)
        self.url = f"http://127.0.0.1:{self.port}/"

    def requests(self, path: str | None = None) -> list[Request]:
        return [r for r in list(self.log) if path is None or r.path == path]

    def start(self) -> Server:
        self._thread.start()
        return self


@contextmanager
def serve(root: str | Path) -> Iterator[Server]:
    """Serve ``root`` on ``127.0.0.1`` (a free port) for the ``with`` block."""
    server = Server(root).start()
    try:
        yield server
    finally:
        server.close()


class _Handler(http.server.BaseHTTPRequestHandler):
    owner: Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args) -> None:  # quiet: the test reads ``Server.log`` instead
        pass

    def do_GET(self) -> None:
        arrived = time.monotonic()
        self.close_connection = True
        path = self.path.split("?", 1)[0]
        m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        start = int(m.group(1)) if m else None
        fault = self.owner._next_fault(path)
        file = self.owner.root / path.lstrip("/")
        if fault is None:
            fault = Fault()
        if fault.status is None and (".." in path or not file.is_file()):
            fault = Fault(status=404)

        def record(code: int, sent: int) -> None:
            self.owner._record(Request(path, start, code, sent, arrived, dict(self.headers.items())))

        if fault.stall_s and fault.cut_after is None:
            record(0, 0)
            self.owner._stop.wait(fault.stall_s)
            return
        if fault.status is not None:
            record(fault.status, 0)
            self._send_status(fault)
            return
        data = file.read_bytes()
        if start is not None and start >= len(data) and not fault.ignore_range:
            record(416, 0)
            self._send_status(Fault(status=416), content_range=f"bytes */{len(data)}")
            return
        ranged = start is not None and not fault.ignore_range
        body = data[start:] if ranged else data
        sent = len(body) if fault.cut_after is None else min(fault.cut_after, len(body))
        record(206 if ranged else 200, sent)
        self.send_response(206 if ranged else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        if ranged:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            self.wfile.write(body[:sent])
            self.wfile.flush()
            if fault.cut_after is not None:
                self._end_early(fault)
        except OSError:  # the client hung up first (it stops reading after the last pack it needs)
            pass

    def _send_status(self, fault: Fault, content_range: str | None = None) -> None:
        self.send_response(fault.status)
        if fault.retry_after is not None:
            self.send_header("Retry-After", fault.retry_after)
        if fault.location is not None:
            self.send_header("Location", fault.location)
        if content_range is not None:
            self.send_header("Content-Range", content_range)
        self.send_header("Content-Length", "0")
        self.send_header("Connection", "close")
        self.end_headers()

    def _end_early(self, fault: Fault) -> None:
        end_early(self, fault)


def end_early(handler: http.server.BaseHTTPRequestHandler, fault: Any) -> None:
    """End ``handler``'s answer before its body is complete: after ``fault.stall_s`` seconds of silence
    (cut short by the server's close), with RST if ``fault.reset`` else FIN."""
    if fault.stall_s:
        handler.owner._stop.wait(fault.stall_s)
    if fault.reset:
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        handler.connection.close()
    else:
        handler.connection.shutdown(socket.SHUT_WR)
