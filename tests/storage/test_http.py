"""The loader over HTTP from a real server on 127.0.0.1, with faults injected (see ``httpserver.py``).

Clean reads (one manifest GET, one GET per shard per epoch), resets resumed at the exact byte,
429/503 with ``Retry-After``, a server that ignores ``Range``, stalls cut short by ``timeout``,
missing shards and retries that run out, and auth headers that reach the server but no log,
error or ``repr``.
"""

from __future__ import annotations

import itertools
import logging
import time
import traceback
from collections import Counter

import pytest
import torch

from tests.support.httpserver import cut, ignore_range, redirect, serve, stall, status
from tests.support.synthetic import pack_numbers, write_dataset
from wdspack.errors import ConfigError, ManifestError, SourceError
from wdspack.format.manifest import MANIFEST_NAME
from wdspack.loader import PackedDataset, ReadOptions, make_loader
from wdspack.storage import base

MANIFEST = "/" + MANIFEST_NAME
SHARDS = [f"/train-{i:06d}.tar" for i in range(4)]
FAST = {"retries": 5, "backoff": 0.01}  # retry waits stay in milliseconds unless a test says otherwise


def fast(**read):
    """``read=`` with FAST's retries and back-off, plus ``read``."""
    return {"read": {**FAST, **read}}
SECRET = "Bearer s3cr3t-TOKEN-do-not-print"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    folder = tmp_path_factory.mktemp("http-ds")
    write_dataset(folder, shards=4, packs_per_shard=6, seed=1)
    return folder


@pytest.fixture
def server(root):
    with serve(root) as s:
        yield s


@pytest.fixture(scope="module")
def local_examples(root):
    return list(PackedDataset(root, shuffle=False))


def _numbers(ds) -> list[int]:
    return [pack_numbers(ex["input_ids"])[0] for ex in ds]


def _same_examples(got, want) -> bool:
    return len(got) == len(want) and all(
        a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(got, want))


def _gets(server, path: str) -> list[tuple[int | None, int]]:
    """``(range start, status)`` of each request for ``path``, in order."""
    return [(r.range_start, r.status) for r in server.requests(path)]


def _resumes_at_exact_byte(server, path: str) -> None:
    """Every request after a short body asks for exactly the byte the short body stopped at."""
    reqs = server.requests(path)
    size = (server.root / path.lstrip("/")).stat().st_size
    for before, after in itertools.pairwise(reqs):
        start = before.range_start or 0
        if before.status in (200, 206) and start + before.sent < size:
            resume = start + before.sent if before.status == 206 else before.sent
            assert after.range_start == resume, (path, reqs)


# -- clean reads ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
def test_clean_read_equals_the_local_folder_with_one_get_per_shard(root, server, shuffle):
    kw = {"shuffle": shuffle, "seed": 4, "shuffle_buffer": 5}
    remote = PackedDataset(server.url, **kw)
    got = list(remote)
    assert _same_examples(got, list(PackedDataset(root, **kw)))
    numbers = _numbers(got)
    assert sorted(numbers) == list(range(24)) and (numbers == list(range(24))) != shuffle
    assert remote.shards == tuple(server.url + p.lstrip("/") for p in SHARDS)
    assert _gets(server, MANIFEST) == [(None, 200)]
    assert all(_gets(server, p) == [(None, 200)] for p in SHARDS)
    assert len(server.log) == 5
    assert remote.stats["requests"] == 4 and remote.stats["retries"] == 0 and remote.stats["bytes_read"] > 0

    remote.set_epoch(1)
    assert sorted(_numbers(remote)) == list(range(24))
    assert len(server.requests(MANIFEST)) == 1  # resolved once, not per epoch
    assert all(_gets(server, p) == [(None, 200)] * 2 for p in SHARDS)


@pytest.mark.parametrize("workers", [1, 2])
def test_dataloader_workers_add_no_requests(server, workers):
    loader = make_loader(server.url, batch_size=3, num_workers=workers, seed=2, shuffle_buffer=4)
    for _ in range(2):
        seen = [n for batch in loader for n in pack_numbers(batch["input_ids"])]
        assert sorted(seen) == list(range(24))
    assert loader.epoch == 2
    assert len(server.requests(MANIFEST)) == 1  # the main process resolved it; workers never list or re-read
    assert {p: len(server.requests(p)) for p in SHARDS} == {p: 2 for p in SHARDS}  # one GET per shard per epoch
    assert loader.stats["requests"] == 8 and loader.stats["retries"] == 0


# -- faults the loader rides out ----------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [512, 1 << 20])
def test_connection_cut_mid_shard_resumes_at_the_exact_byte(root, server, local_examples, block_size):
    server.script(SHARDS[1], cut(3000))
    server.script(SHARDS[2], cut(1500), cut(3000))  # the second cut is in the resumed (ranged) body
    ds = PackedDataset(server.url, shuffle=False, **fast(block_size=block_size))
    assert _same_examples(list(ds), local_examples)
    assert _gets(server, SHARDS[1]) == [(None, 200), (3000, 206)]
    assert _gets(server, SHARDS[2]) == [(None, 200), (1500, 206), (4500, 206)]
    assert all(_gets(server, p) == [(None, 200)] for p in (SHARDS[0], SHARDS[3]))
    assert ds.stats["retries"] == 3 and ds.stats["requests"] == 7


@pytest.mark.parametrize("block_size", [512, 1 << 20])
def test_connection_reset_resumes_at_the_exact_byte(server, local_examples, caplog, block_size):
    server.script(SHARDS[0], cut(2500, reset=True))
    server.script(SHARDS[3], cut(700, reset=True), cut(2000, reset=True))
    ds = PackedDataset(server.url, shuffle=False, **fast(block_size=block_size))
    with caplog.at_level(logging.WARNING, logger="wdspack.storage"):
        got = list(ds)
    assert _same_examples(got, local_examples)
    # the bytes that arrived before the RST are kept, not re-requested (nor skipped)
    assert _gets(server, SHARDS[0]) == [(None, 200), (2500, 206)]
    assert _gets(server, SHARDS[3]) == [(None, 200), (700, 206), (2700, 206)]
    assert ds.stats["retries"] == 3 and ds.stats["requests"] == 7
    resets = [r.getMessage() for r in caplog.records if "ConnectionResetError" in r.getMessage()]
    assert len(resets) == 3 and all("retry 1/5" in m for m in resets)


def test_every_connection_reset_short_of_a_block_still_progresses(server, local_examples):
    server.script(SHARDS[2], then=cut(3000, reset=True))  # the block (1 MiB) never arrives whole
    ds = PackedDataset(server.url, shuffle=False, **fast())
    assert _same_examples(list(ds), local_examples)
    assert [s for s, _ in _gets(server, SHARDS[2])] == [None, 3000, 6000, 9000]


def test_throttling_waits_as_told_by_retry_after(server, local_examples):
    server.script(MANIFEST, status(429, retry_after="0"))
    server.script(SHARDS[0], status(503, retry_after="1"), status(429, retry_after="0"))
    server.script(SHARDS[2], status(503, retry_after="0"))
    began = time.monotonic()
    ds = PackedDataset(server.url, shuffle=False, read={"retries": 5, "backoff": 5.0})  # back-off would wait >= 2.5 s
    got = list(ds)
    elapsed = time.monotonic() - began
    assert _same_examples(got, local_examples)
    assert _gets(server, MANIFEST) == [(None, 429), (None, 200)]
    assert _gets(server, SHARDS[0]) == [(None, 503), (None, 429), (None, 200)]
    assert _gets(server, SHARDS[2]) == [(None, 503), (None, 200)]
    t = [r.at for r in server.requests(SHARDS[0])]
    assert 0.95 <= t[1] - t[0] < 2.0  # Retry-After: 1
    assert t[2] - t[1] < 1.0  # Retry-After: 0, not the 5 s back-off
    assert elapsed < 8.0  # back-off instead of Retry-After would take >= 12.5 s
    assert ds.stats["retries"] == 3  # the manifest's retry is not a shard's


def test_a_long_retry_after_is_capped(server, local_examples, monkeypatch):
    monkeypatch.setattr(base, "MAX_WAIT_S", 0.3)
    server.script(SHARDS[2], status(503, retry_after="20"))
    ds = PackedDataset(server.url, shuffle=False, read={"retries": 5, "backoff": 5.0})
    assert _same_examples(list(ds), local_examples)
    t = [r.at for r in server.requests(SHARDS[2])]
    assert len(t) == 2 and 0.25 <= t[1] - t[0] < 1.0


@pytest.mark.parametrize("second", [ignore_range(), ignore_range(cut_after=1000)],
                         ids=["whole-file", "cut-again-while-discarding"])
def test_server_ignoring_range_after_a_cut(server, local_examples, second):
    server.script(SHARDS[1], cut(3000), second, then=ignore_range())
    ds = PackedDataset(server.url, shuffle=False, **fast())
    assert _same_examples(list(ds), local_examples)
    gets = _gets(server, SHARDS[1])
    assert gets[:2] == [(None, 200), (3000, 200)]  # asked to resume, got the whole file: 3000 bytes discarded
    assert gets[2:] == ([] if second.cut_after is None else [(3000, 200)])
    assert ds.stats["retries"] == len(gets) - 1


@pytest.mark.parametrize("after", [None, 0, 2048], ids=["before-headers", "after-headers", "mid-body"])
def test_stalled_server_times_out_and_the_read_resumes(server, local_examples, after):
    server.script(SHARDS[2], stall(after, seconds=8))
    began = time.monotonic()
    ds = PackedDataset(server.url, shuffle=False, **fast(timeout=1))
    got = list(ds)
    assert time.monotonic() - began < 6.5  # the 1 s timeout, not the 8 s stall nor the default 60 s
    assert _same_examples(got, local_examples)
    first = (None, 0 if after is None else 200)  # status 0: no answer at all
    assert _gets(server, SHARDS[2]) == [first, (after or None, 206 if after else 200)]
    assert ds.stats["retries"] == 1


def test_timeout_must_be_positive(root):
    with pytest.raises(ConfigError, match=r"timeout=0 must be > 0"):
        PackedDataset(root, read={"timeout": 0})


# -- faults that must stop it -------------------------------------------------------------------------


def test_missing_shard_raises_naming_its_url_without_retrying(server):
    server.script(SHARDS[2], then=status(404))
    ds = PackedDataset(server.url, shuffle=False, **fast())
    seen = []
    with pytest.raises(SourceError) as info:
        for ex in ds:
            seen.extend(pack_numbers(ex["input_ids"]))
    assert isinstance(info.value, base.NotFoundError)
    assert f"{server.url}train-000002.tar: HTTP 404" in str(info.value)
    assert "dataset is incomplete" in str(info.value)
    assert seen == list(range(12))  # the shards before it were read
    assert len(server.requests(SHARDS[2])) == 1 and ds.stats["retries"] == 0


def test_missing_manifest_raises_naming_it(server):
    server.script(MANIFEST, then=status(404))
    with pytest.raises(ManifestError, match=rf"{server.url}manifest.json does not exist"):
        PackedDataset(server.url, **fast())
    assert len(server.log) == 1


@pytest.mark.parametrize("failure", [status(503, retry_after="0"), status(503), cut(0)],
                         ids=["503-retry-after", "503", "empty-body"])
def test_retries_run_out_with_a_clear_error(server, failure):
    server.script(SHARDS[1], then=failure)
    ds = PackedDataset(server.url, shuffle=False, read={"retries": 2, "backoff": 0.01})
    with pytest.raises(SourceError, match=r"train-000001\.tar failed at byte 0 after 2 retries: .*raise retries="):
        list(ds)
    assert len(server.requests(SHARDS[1])) == 3  # the first try and 2 retries, then it stops
    assert ds.stats["retries"] == 2


# -- headers and secrets ------------------------------------------------------------------------------


def _no_secret(*texts: str) -> None:
    token = SECRET.split()[-1]
    for text in texts:
        assert token not in text


def test_headers_reach_the_server_but_no_log_error_or_repr(server, local_examples, caplog):
    options = {"headers": {"Authorization": SECRET}}
    server.script(SHARDS[0], status(503, retry_after="0"))
    server.script(SHARDS[1], cut(3000))
    server.script(SHARDS[3], then=status(404))
    caplog.set_level(logging.DEBUG)
    ds = PackedDataset(server.url, shuffle=False, **fast(storage_options=options))
    with pytest.raises(SourceError) as info:
        list(ds)
    assert len(server.log) == 1 + 2 + 2 + 1 + 1
    assert all(r.headers.get("Authorization") == SECRET for r in server.log)
    exc = info.value
    _no_secret(caplog.text, *(str(r.args) for r in caplog.records), str(exc), repr(exc),
               "".join(traceback.format_exception(exc)), repr(exc.__context__), repr(ds), str(ds),
               repr(ds.source), repr(ds.stats))
    assert caplog.records and str(exc)  # there was something to look at

    server.clear()
    exhausted = PackedDataset(server.url, shuffle=False,
                              read=ReadOptions(retries=1, backoff=0.01, storage_options=options))
    server.script(SHARDS[0], then=status(503))
    with pytest.raises(SourceError, match="after 1 retries") as info:
        list(exhausted)
    _no_secret(caplog.text, str(info.value), "".join(traceback.format_exception(info.value)))


def test_redirect_to_another_host_drops_authorization_but_keeps_range(root, server, local_examples):
    with serve(root) as other:  # another port: another host as far as credentials go
        server.script(SHARDS[1], then=redirect(other.url + SHARDS[1].lstrip("/")))
        server.script(SHARDS[2], redirect(server.url + SHARDS[2].lstrip("/")))  # same host
        other.script(SHARDS[1], cut(3000))
        ds = PackedDataset(server.url, shuffle=False,
                           **fast(storage_options={"headers": {"Authorization": SECRET}}))
        assert _same_examples(list(ds), local_examples)
        assert _gets(other, SHARDS[1]) == [(None, 200), (3000, 206)]  # the resume went through the redirect
        assert all("Authorization" not in r.headers for r in other.log)
    assert _gets(server, SHARDS[1]) == [(None, 302), (3000, 302)]
    assert _gets(server, SHARDS[2]) == [(None, 302), (None, 200)]
    assert all(r.headers.get("Authorization") == SECRET for r in server.log)


def test_request_counts_over_a_whole_epoch_with_faults(server):
    """Bounded: every retry is a request the server saw; nothing loops."""
    server.script(SHARDS[0], cut(1000), cut(1000), cut(1000))
    server.script(SHARDS[3], status(503, retry_after="0"), cut(500))
    ds = PackedDataset(server.url, shuffle=True, seed=3, **fast())
    assert sorted(_numbers(ds)) == list(range(24))
    counts = Counter(r.path for r in server.log)
    assert counts == {MANIFEST: 1, SHARDS[0]: 4, SHARDS[1]: 1, SHARDS[2]: 1, SHARDS[3]: 3}
    assert ds.stats["retries"] == 5
    _resumes_at_exact_byte(server, SHARDS[0])
    _resumes_at_exact_byte(server, SHARDS[3])


def test_make_loader_takes_the_read_timeout_for_the_stream(server, local_examples):
    server.script(SHARDS[2], stall(2048, seconds=8))
    began = time.monotonic()
    loader = make_loader(server.url, batch_size=2, num_workers=0, shuffle=False, **fast(timeout=1))
    assert loader.dataset.read.timeout == 1.0 and loader.dataset.read.retries == 5
    got = [n for batch in loader for n in pack_numbers(batch["input_ids"])]
    assert time.monotonic() - began < 6.5 and sorted(got) == list(range(len(local_examples)))
