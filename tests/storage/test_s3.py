"""The loader over S3: a real S3 API (moto's server) on loopback, with a fault-injecting proxy in front.

Every test compares against the same dataset read from local disk: same batches in the same order
with 0/1/2 DataLoader workers, one manifest GET and one GET per shard per epoch (counted in the
server's log), connection cuts, resets, stalls and throttling resumed at the exact byte and
counted as retries (botocore's own retries are off), a missing shard failing at once, exact
resume from ``loader.state_dict()``, and credentials that reach no log, error or ``repr``.

The proxy (:class:`FaultProxy`) forwards every request to moto unchanged (moto does not check
signatures, so the signed ``Host`` of the proxy is fine) and breaks the ones a test scripts.
"""

from __future__ import annotations

import http.client
import http.server
import importlib.util
import logging
import re
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np
import pytest
import torch

from tests.support.httpserver import ScriptedServer, end_early
from tests.support.s3server import running_s3, upload_folder
from tests.support.synthetic import pack_numbers, write_dataset
from wdspack.errors import ConfigError, ManifestError, SourceError
from wdspack.format.dataset import read_pack_index
from wdspack.loader import PackedDataset, make_loader, resolve_source
from wdspack.storage.base import NotFoundError
from wdspack.storage.fsspec import FsspecStream
from wdspack.storage.streams import open_stream

pytest.importorskip("s3fs")
if importlib.util.find_spec("moto") is None:  # not imported here: moto patches botocore when imported
    pytest.skip("moto is not installed", allow_module_level=True)

BUCKET = "wds-loader"
SHARDS = 4
PACKS_PER_SHARD = 6
FAST = {"retries": 5, "backoff": 0.01}  # retry waits in milliseconds


def fast(**read):
    """``read=`` with FAST's retries and back-off, plus ``read``."""
    return {"read": {**FAST, **read}}
SECRET = "wdspack-S3CR3T-do-not-print"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


# -- a fault-injecting proxy in front of moto -------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Fault:
    status: int | None = None  # an S3 error answer with this status and ``code``
    code: str = ""
    cut_after: int | None = None  # body bytes sent (with the full Content-Length) before the end
    reset: bool = False  # end with RST instead of FIN
    stall_s: float = 0.0  # silence before the early end


@dataclass(frozen=True, slots=True)
class Seen:
    method: str
    path: str
    range_start: int | None
    status: int


class FaultProxy(ScriptedServer):
    """Forwards to ``upstream``; the k-th next GET of a scripted path gets that path's k-th fault."""

    def __init__(self, upstream: str) -> None:
        super().__init__(_ProxyHandler, "s3-proxy")
        self.upstream = urlsplit(upstream)
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread.start()

    def gets(self, path: str) -> list[tuple[int | None, int]]:
        """``(range start, status)`` of each GET of ``path``."""
        return [(r.range_start, r.status) for r in list(self.log) if r.method == "GET" and r.path == path]


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"
    _HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server"})

    def log_message(self, format, *args) -> None:
        pass

    def do_GET(self) -> None:
        self._forward()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        payload = self.rfile.read(length) if length else None
        path = urlsplit(self.path).path
        m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        start = int(m.group(1)) if m else None
        fault = (self.owner._next_fault(path) if self.command == "GET" else None) or Fault()
        if fault.status is not None:
            self._record(path, start, fault.status)
            body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{fault.code}</Code>'
                    f"<Message>injected by the test proxy</Message></Error>").encode()
            self.send_response(fault.status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        up = http.client.HTTPConnection(self.owner.upstream.hostname, self.owner.upstream.port, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
            up.request(self.command, self.path, body=payload, headers=headers)
            resp = up.getresponse()
            data = resp.read()
            status, upstream_headers = resp.status, resp.getheaders()
        finally:
            up.close()
        self._record(path, start, status)
        self.send_response(status)
        for k, v in upstream_headers:
            if k.lower() not in self._HOP:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        if fault.cut_after is not None:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command == "HEAD":
            return
        try:
            self.wfile.write(data if fault.cut_after is None else data[:fault.cut_after])
            self.wfile.flush()
            if fault.cut_after is not None:
                end_early(self, fault)
        except OSError:  # the client hung up first (a stream closed before its end)
            pass

    def _record(self, path: str, start: int | None, status: int) -> None:
        self.owner._record(Seen(self.command, path, start, status))


# -- fixtures -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with running_s3(tmp_path_factory.mktemp("s3"), BUCKET) as server_and_fs:
        yield server_and_fs


@pytest.fixture(scope="module")
def proxy(s3):
    p = FaultProxy(s3[0].endpoint)
    yield p
    p.close()


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ds")
    write_dataset(folder, shards=SHARDS, packs_per_shard=PACKS_PER_SHARD, seed=5, pack_index=True)
    return folder


@pytest.fixture(scope="module")
def remote(s3, local) -> str:
    upload_folder(s3[1], local, f"s3://{BUCKET}/ds")
    return f"s3://{BUCKET}/ds"


@pytest.fixture
def via_proxy(proxy):
    """storage_options that reach moto through the proxy, with a secret to look for in logs."""
    proxy.clear()
    yield {"endpoint_url": proxy.url, "key": "wdspack-test", "secret": SECRET}
    proxy.clear()


def cut(after: int, *, reset: bool = False) -> Fault:
    """``after`` body bytes, a moment for the client to take them, then FIN (or RST).

    Without the moment the bytes and the end arrive together, and aiohttp (under s3fs) raises the
    error before handing over the bytes it holds: the retry is then still exact, from the last byte
    the stream got, but that byte is not ``after``.
    """
    return Fault(cut_after=after, reset=reset, stall_s=0.2)


def _server_gets(server, since: int) -> list[str]:
    """Paths of the GETs moto answered after its ``since``-th logged request."""
    lines = [ANSI.sub("", line) for line in server.requests()[since:]]
    return [line.split()[1] for line in lines if line.startswith("GET ")]


def _batches(loader) -> list[dict[str, torch.Tensor]]:
    return [{k: v.clone() for k, v in b.items() if isinstance(v, torch.Tensor)} for b in loader]


def _same(got, want) -> bool:
    return len(got) == len(want) and all(a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
                                         for a, b in zip(got, want))


def _shard(i: int) -> str:
    return f"/{BUCKET}/ds/train-{i:06d}.tar"


# -- clean reads --------------------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, 1, 2])
def test_s3_streams_like_local_with_one_get_per_shard_per_epoch(s3, local, remote, workers):
    server, _ = s3
    kw = dict(batch_size=2, num_workers=workers, seed=3)
    local_loader = make_loader(local, **kw)
    want = [_batches(local_loader), _batches(local_loader)]  # two epochs (the second reshuffled)
    before = len(server.requests())
    loader = make_loader(remote + "/", **kw)  # credentials and endpoint from the environment
    got = [_batches(loader), _batches(loader)]
    assert _same(got[0], want[0]) and _same(got[1], want[1]) and len(got[0]) == SHARDS * PACKS_PER_SHARD // 2
    assert not _same(got[0], got[1])
    gets = _server_gets(server, before)
    assert gets.count(f"/{BUCKET}/ds/manifest.json") == 1  # read once, in the main process
    assert sorted(g for g in gets if g.endswith(".tar")) == sorted([_shard(i) for i in range(SHARDS)] * 2)
    assert len(gets) == 1 + 2 * SHARDS  # nothing else: no listing, no HEAD, no pack index (no shard is split)
    assert loader.stats["requests"] == 2 * SHARDS and loader.stats["retries"] == 0
    assert loader.stats["bytes_read"] == 2 * sum(p.stat().st_size for p in local.glob("*.tar"))


def test_moto_honours_range_and_a_stream_opens_at_any_byte(s3, remote, local, via_proxy, proxy):
    data = (local / "train-000001.tar").read_bytes()
    with open_stream(remote + "/train-000001.tar", offset=1000, headers=via_proxy, block_size=4096) as s:
        assert isinstance(s, FsspecStream) and s.read(5000) == data[1000:6000]
        s.skip(len(data))  # a long jump drops the connection; reading past the end gives nothing
        assert s.read(10) == b""
    assert proxy.gets(_shard(1)) == [(1000, 206)]  # one ranged GET, answered 206 by moto


def test_dataset_packed_to_s3_streams_like_its_local_copy(s3, sample_config, tmp_path):
    """``pack_dataset(output="s3://...")`` then the loader on that URL: the batches of the folder
    packed locally from the same inputs."""
    from tests.support.demo import demo_sources, generate_demo
    from wdspack.packer.config import PackConfig, RunOptions
    from wdspack.packer.job import pack_dataset

    demo = generate_demo(tmp_path / "demo", records=60, seed=2)
    config = PackConfig(seq_len=2048, max_images=6, shard_max_bytes=120_000, records_per_partition=30,
                        run=RunOptions(max_drop_fraction=0.5))  # the demo inputs hold bad records on purpose
    pack_dataset(demo_sources(demo), tmp_path / "packed", sample_config=sample_config, config=config)
    url = f"s3://{BUCKET}/packed"
    pack_dataset(demo_sources(demo), url, sample_config=sample_config, config=config)
    kw = dict(batch_size=2, num_workers=0, seed=1, image_transform=None)
    want, got = _batches(make_loader(tmp_path / "packed", **kw)), _batches(make_loader(url, **kw))
    assert len(got) > 0 and _same(got, want)


def test_shard_lists_braces_and_the_manifest_url(s3, remote, local):
    names = [f"train-{i:06d}.tar" for i in range(SHARDS)]
    for source in (f"{remote}/manifest.json", f"{remote}/train-{{000000..000003}}.tar",
                   [f"{remote}/{n}" for n in names]):
        resolved = resolve_source(source)
        assert [s.name for s in resolved.shards] == names and [s.packs for s in resolved.shards] == [6] * SHARDS
        assert resolved.shards[0].url == f"{remote}/{names[0]}" and resolved.root == remote
    with pytest.raises(ConfigError, match="brace pattern"):
        resolve_source(f"{remote}/train-*.tar")  # folders are never listed
    with pytest.raises(ManifestError, match="does not exist"):
        resolve_source(f"s3://{BUCKET}/no-such-dataset/")


def test_pack_index_and_balance_from_s3(s3, remote, local):
    """pack_index.npy is read from the store (one GET), and balance='cost' reads runs by ranged GETs."""
    server, _ = s3
    want = read_pack_index(resolve_source(local))
    got = read_pack_index(resolve_source(remote))
    assert len(got) == SHARDS and all(np.array_equal(a, b) for a, b in zip(got, want))
    kw = dict(batch_size=2, num_workers=0, seed=4, balance={"run": 2})
    expected = _batches(make_loader(local, **kw))
    before = len(server.requests())
    loader = make_loader(remote, **kw)
    assert _same(_batches(loader), expected)
    gets = _server_gets(server, before)
    assert gets.count(f"/{BUCKET}/ds/manifest.json") == 1 and gets.count(f"/{BUCKET}/ds/pack_index.npy") == 1
    assert loader.stats["requests"] == sum(g.endswith(".tar") for g in gets) >= SHARDS


# -- faults -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def clean(local):
    return _batches(make_loader(local, batch_size=2, num_workers=0, shuffle=False))


def _faulty_loader(remote, options, **kw):
    return make_loader(remote, batch_size=2, num_workers=0, shuffle=False, **fast(storage_options=options, **kw))


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "reset"])
def test_a_cut_mid_shard_resumes_at_the_exact_byte(remote, clean, via_proxy, proxy, reset):
    proxy.script(_shard(1), cut(3000, reset=reset))
    loader = _faulty_loader(remote, via_proxy)
    assert _same(_batches(loader), clean)
    assert proxy.gets(_shard(1)) == [(None, 200), (3000, 206)]
    assert loader.stats["retries"] == 1 and loader.stats["requests"] == SHARDS + 1


def test_throttling_and_server_errors_are_retried_by_us_and_counted(remote, clean, via_proxy, proxy):
    """503 SlowDown and 500 InternalError on the GET, then a cut: three retries, all ours (botocore's are
    off, so the proxy sees exactly one request per attempt)."""
    proxy.script(_shard(2), Fault(status=503, code="SlowDown"), Fault(status=500, code="InternalError"),
                 cut(5000))
    loader = _faulty_loader(remote, via_proxy)
    assert _same(_batches(loader), clean)
    assert proxy.gets(_shard(2)) == [(None, 503), (None, 500), (None, 200), (5000, 206)]
    assert loader.stats["retries"] == 3 and loader.stats["requests"] == SHARDS + 1


def test_a_stalled_read_times_out_and_resumes(remote, clean, via_proxy, proxy):
    proxy.script(_shard(0), Fault(cut_after=2048, stall_s=5.0))
    start = time.monotonic()
    loader = _faulty_loader(remote, via_proxy, timeout=1.0)
    assert _same(_batches(loader), clean)
    assert proxy.gets(_shard(0)) == [(None, 200), (2048, 206)]
    assert loader.stats["retries"] == 1 and time.monotonic() - start < 4.5


def test_retries_run_out_with_a_message_naming_the_shard(remote, via_proxy, proxy):
    proxy.script(_shard(3), then=Fault(status=503, code="SlowDown"))
    loader = _faulty_loader(remote, via_proxy, retries=2)
    with pytest.raises(SourceError, match=r"train-000003\.tar failed at byte 0 after 2 retries: HTTP 503 SlowDown"):
        _batches(loader)
    assert len(proxy.gets(_shard(3))) == 3


def test_a_missing_shard_fails_at_once_naming_it(s3, local, via_proxy, proxy):
    _, fs = s3
    upload_folder(fs, local, f"s3://{BUCKET}/holey")
    fs.rm(f"{BUCKET}/holey/train-000002.tar")
    loader = _faulty_loader(f"s3://{BUCKET}/holey", via_proxy, retries=5, backoff=2.0)
    start = time.monotonic()
    with pytest.raises(NotFoundError, match=r"s3://wds-loader/holey/train-000002\.tar: not found \(NoSuchKey\); "
                                            r"the manifest lists it.*copy the whole dataset folder"):
        _batches(loader)
    assert time.monotonic() - start < 1.5  # no back-off: a missing object is not retried
    assert proxy.gets(f"/{BUCKET}/holey/train-000002.tar") == [(None, 404)]
    assert loader.stats["retries"] == 0


# -- resume and secrets -------------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_continues_exactly(local, remote, via_proxy, workers, caplog):
    """Also: forking workers leaves the main process's connections working (no read times out: see
    ``streams._store`` for what closing the parent's filesystem in a worker used to do)."""
    kw = dict(batch_size=2, num_workers=workers, seed=7, **fast(storage_options=via_proxy, timeout=5.0))
    whole = _batches(make_loader(local, batch_size=2, num_workers=workers, seed=7))
    first = make_loader(remote, **kw)
    it = iter(first)
    head = [{k: v.clone() for k, v in next(it).items() if isinstance(v, torch.Tensor)} for _ in range(5)]
    state = first.state_dict()
    del it, first
    second = make_loader(remote, **kw)
    second.load_state_dict(state)
    tail = _batches(second)
    assert _same(head + tail, whole)
    assert [pack_numbers(b["input_ids"]) for b in head + tail] == [pack_numbers(b["input_ids"]) for b in whole]
    assert "retry" not in caplog.text


def test_credentials_reach_no_log_error_or_repr(s3, local, remote, via_proxy, proxy, caplog):
    caplog.set_level(logging.DEBUG)
    proxy.script(_shard(1), cut(1000))
    ds = PackedDataset(remote, shuffle=False, batch_size=2, **fast(storage_options=via_proxy))
    loader = make_loader(ds, batch_size=2, num_workers=0)
    _batches(loader)
    assert loader.stats["retries"] == 1 and "retry 1/5 at byte 1000" in caplog.text
    texts = [caplog.text, repr(ds), repr(loader), repr(ds.source), str(ds.source.shards)]
    with open_stream(remote + "/train-000000.tar", headers=via_proxy) as s:
        texts.append(repr(s))
    for source in (f"s3://{BUCKET}/missing/", f"s3://{BUCKET}/missing/train-000000.tar"):
        with pytest.raises((ManifestError, SourceError)) as e:
            resolve_source(source, storage_options=via_proxy)
        texts.append(str(e.value))
    proxy.script(_shard(0), then=Fault(status=403, code="AccessDenied"))
    with pytest.raises(SourceError, match="not authorised; give credentials through storage_options") as e:
        _batches(make_loader(remote, batch_size=2, num_workers=0, shuffle=False,
                             **fast(storage_options=via_proxy)))
    texts.append(str(e.value))
    assert all(SECRET not in t for t in texts)


# -- any fsspec store ---------------------------------------------------------------------------------

def test_memory_store_streams_like_local(local):
    """A store without s3fs's fast path (fs.open, no cache, seeked to the byte): memory://."""
    import fsspec

    fs = fsspec.filesystem("memory")
    for p in sorted(local.iterdir()):
        fs.pipe_file(f"/wdspack-test/ds/{p.name}", p.read_bytes())
    try:
        kw = dict(batch_size=2, num_workers=0, seed=2)
        assert _same(_batches(make_loader("memory://wdspack-test/ds", **kw)), _batches(make_loader(local, **kw)))
        data = (local / "train-000002.tar").read_bytes()
        with open_stream("memory://wdspack-test/ds/train-000002.tar", offset=777, block_size=512) as s:
            assert s.read(3000) == data[777:3777]
        with pytest.raises(NotFoundError, match="not found"):
            open_stream("memory://wdspack-test/ds/train-000009.tar").read(1)
        with pytest.raises(ConfigError, match="only apply to hf:// and fsspec"):
            resolve_source(local, storage_options={"key": "x"})
    finally:
        fs.rm("/wdspack-test", recursive=True)
