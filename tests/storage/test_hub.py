"""``hf://`` streaming and upload against a real Hub-compatible server (olah) on loopback.

The server (:mod:`hubserver`) serves git repositories as Hub datasets and logs every request it
answers, so these tests check what the loader asks for, not only what it yields::

    main process   GET /api/datasets/org/packed/revision/main        HfFileSystem: repo and revision exist
                   GET /api/datasets/org/packed/revision/main        repo_info: pin main to its commit
                   GET /datasets/org/packed/resolve/<sha>/manifest.json
    each epoch     GET /datasets/org/packed/resolve/<sha>/train-00000N.tar   once per shard, from a worker

Nothing here leaves the machine: the server runs offline with a loopback upstream, and this
process refuses any non-loopback lookup or connection while these tests run.
"""

from __future__ import annotations

import logging
import re
import shutil
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.support.hubserver import auth_digest, commit_files, loopback_only, publish, start_hub
from tests.support.synthetic import pack_numbers, write_dataset
from wdspack.errors import ConfigError, ManifestError, SourceError
from wdspack.loader import PackedDataset, make_loader
from wdspack.ops.upload import upload_dataset
from wdspack.storage.http import HttpStream

TOKEN = "hf_SECRETTOKEN123"
SHARDS, PACKS_PER_SHARD = 4, 6
PACKS = SHARDS * PACKS_PER_SHARD


@dataclass(frozen=True)
class HubSite:
    """The running server, where its repos live, and its request log."""

    endpoint: str
    requests: Callable[[], list[dict]]
    mirrors: Path
    workdir: Path

    def options(self, **extra) -> dict:
        return {"endpoint": self.endpoint, **extra}


@pytest.fixture(scope="session")
def hub(tmp_path_factory) -> HubSite:
    mirrors, workdir = tmp_path_factory.mktemp("mirrors"), tmp_path_factory.mktemp("olah")
    endpoint, requests, stop = start_hub(mirrors, workdir=workdir)
    try:
        yield HubSite(endpoint, requests, mirrors, workdir)
    finally:
        stop()


@pytest.fixture(scope="module", autouse=True)
def _no_internet():
    """Loopback only, and huggingface_hub online towards it: ``make test`` exports
    ``HF_HUB_OFFLINE=1`` (nothing may reach the real Hub), which would refuse the local server too."""
    from huggingface_hub import constants

    offline = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = False
    try:
        with loopback_only():
            yield
    finally:
        constants.HF_HUB_OFFLINE = offline


@pytest.fixture(scope="module")
def packed(hub, tmp_path_factory) -> tuple[Path, str]:
    """A 4 × 6-pack dataset, as a local folder and as the repo ``org/packed`` (its commit sha)."""
    folder = tmp_path_factory.mktemp("packed")
    write_dataset(folder, shards=SHARDS, packs_per_shard=PACKS_PER_SHARD, seed=1)
    return folder, publish(hub.mirrors, "org/packed", folder)


def _numbers(examples) -> list[int]:
    return [n for ex in examples for n in pack_numbers(ex["input_ids"])]


def _same_tensors(a: list[dict], b: list[dict]) -> bool:
    def same(x, y):
        return torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y

    return len(a) == len(b) and all(x.keys() == y.keys() and all(same(x[k], y[k]) for k in x) for x, y in zip(a, b))


def _new(hub: HubSite) -> Callable[[], list[dict]]:
    """The requests answered from now on."""
    mark = len(hub.requests())
    return lambda: hub.requests()[mark:]


def _resolve(sha: str, name: str, repo: str = "org/packed") -> str:
    return f"/datasets/{repo}/resolve/{sha}/{name}"


# -- streaming --------------------------------------------------------------------------------------


def test_hub_dataset_equals_the_local_folder(hub, packed):
    folder, sha = packed
    ds = PackedDataset("hf://datasets/org/packed@main", read={"storage_options": hub.options()}, seed=7)
    assert ds.shards == tuple(f"{hub.endpoint}{_resolve(sha, f'train-{i:06d}.tar')}" for i in range(SHARDS))
    remote, local = list(ds), list(PackedDataset(folder, seed=7))
    assert sorted(_numbers(remote)) == list(range(PACKS))
    assert _numbers(remote) == _numbers(local) and _same_tensors(remote, local)

    def batches(source, **options):
        return list(make_loader(source, batch_size=4, num_workers=2, seed=7, **options))

    remote, local = batches("hf://datasets/org/packed@main", read={"storage_options": hub.options()}), batches(folder)
    assert sorted(_numbers(remote)) == list(range(PACKS))
    assert _same_tensors(remote, local)


@pytest.mark.parametrize("workers", [1, 2])
def test_requests_per_epoch_do_not_grow_with_workers(hub, packed, workers):
    _, sha = packed
    new = _new(hub)
    loader = make_loader("hf://datasets/org/packed@main", read={"storage_options": hub.options()}, batch_size=4,
                         num_workers=workers, seed=7)
    # Resolving happens once, in this process: HfFileSystem checks that repo and revision exist,
    # repo_info pins main to its commit (the same route, asked twice: 2 requests), and the
    # manifest is read from that commit (1). Workers get the shard list and never ask again.
    assert [(r["method"], r["path"], r["status"]) for r in new()] == [
        ("GET", "/api/datasets/org/packed/revision/main", 200),
        ("GET", "/api/datasets/org/packed/revision/main", 200),
        ("GET", _resolve(sha, "manifest.json"), 200)]
    for epoch in range(2):
        new = _new(hub)
        assert sorted(_numbers(loader)) == list(range(PACKS))
        # Exactly one GET per shard per epoch, whatever the worker count: the plan hands whole
        # shards to slots (4 equal shards: 2 per worker, or 4 for one), and each is read front
        # to back in one response, so no Range request is needed (olah ignores Range anyway).
        got = new()
        assert sorted(r["path"] for r in got) == [_resolve(sha, f"train-{i:06d}.tar") for i in range(SHARDS)]
        assert all(r["method"] == "GET" and r["status"] == 200 and r["range"] is None for r in got), got
        assert loader.epoch == epoch + 1


def test_sub_folder_and_brace_patterns(hub, packed, tmp_path):
    folder, sha = packed
    shutil.copytree(folder, tmp_path / "nested" / "v1" / "train")
    nested = publish(hub.mirrors, "org/nested", tmp_path / "nested")
    ds = PackedDataset("hf://datasets/org/nested@main/v1/train", read={"storage_options": hub.options()})
    assert ds.shards[0] == f"{hub.endpoint}{_resolve(nested, 'v1/train/train-000000.tar', 'org/nested')}"
    assert sorted(_numbers(ds)) == list(range(PACKS))

    new = _new(hub)
    ds = PackedDataset("hf://datasets/org/packed@main/train-{000000..000003}.tar",
                       read={"storage_options": hub.options()})
    assert sorted(_numbers(ds)) == list(range(PACKS))
    # Four shard names still cost one existence check and one pin (per repo and revision), then the manifest.
    assert [r["path"] for r in new()][:3] == ["/api/datasets/org/packed/revision/main"] * 2 + [
        _resolve(sha, "manifest.json")]

    ds = PackedDataset("hf://datasets/org/packed@main/train-{000001..000002}.tar",
                       read={"storage_options": hub.options()})
    assert sorted(_numbers(ds)) == list(range(6, 18))
    ds = PackedDataset("hf://datasets/org/nested@main/v1/train/train-{000000,000003}.tar",
                       read={"storage_options": hub.options()})
    assert sorted(_numbers(ds)) == [*range(6), *range(18, 24)]


def test_globs_missing_repos_and_revisions_are_refused_clearly(hub, packed):
    new = _new(hub)
    with pytest.raises(ConfigError, match=r"train-\*\.tar: globs are not expanded.*brace pattern"):
        PackedDataset("hf://datasets/org/packed@main/train-*.tar", read={"storage_options": hub.options()})
    assert new() == [], "a glob is refused before any request"
    with pytest.raises(SourceError, match=r"hf://datasets/org/missing@main: .*check the repo name"):
        PackedDataset("hf://datasets/org/missing@main", read={"storage_options": hub.options()})
    # olah answers an unknown revision as an unknown repo (401 RepoNotFound); the error names both.
    with pytest.raises(SourceError, match=r"hf://datasets/org/packed@nobranch: .*check the repo name and the revision"):
        PackedDataset("hf://datasets/org/packed@nobranch", read={"storage_options": hub.options()})


def test_a_repo_published_after_a_failed_lookup_is_found(hub, packed):
    # Regression: fsspec's per-process HfFileSystem instance remembered "repository not found",
    # so the repo stayed missing (without a request) after it was uploaded.
    folder, _ = packed
    with pytest.raises(SourceError, match="org/late@main"):
        PackedDataset("hf://datasets/org/late@main", read={"storage_options": hub.options()})
    sha = publish(hub.mirrors, "org/late", folder)
    ds = PackedDataset("hf://datasets/org/late@main", read={"storage_options": hub.options()})
    assert ds.shards[0].endswith(f"/resolve/{sha}/train-000000.tar")


def test_a_source_without_revision_asks_for_main_by_name(hub, packed):
    _, sha = packed
    new = _new(hub)
    ds = PackedDataset("hf://datasets/org/packed", read={"storage_options": hub.options()})
    assert ds.shards[0].endswith(f"/resolve/{sha}/train-000000.tar")
    api = [r["path"] for r in new() if r["path"].startswith("/api/")]
    assert api == ["/api/datasets/org/packed/revision/main"] * 2, "never a revision-less lookup"


# -- upload, then stream ----------------------------------------------------------------------------


class GitMirrorHub:
    """The ``api`` that ``upload_dataset`` is given: it reads the repo tree from the server with the
    real ``HfApi`` and writes each commit as a git commit in the served repo (olah is read-only)."""

    def __init__(self, endpoint: str, mirrors: Path) -> None:
        from huggingface_hub import HfApi

        self.api, self.mirrors = HfApi(endpoint=endpoint), mirrors
        self.commits: list[list[str]] = []

    def create_repo(self, repo_id, repo_type, private, exist_ok):
        assert repo_type == "dataset" and exist_ok
        commit_files(self.mirrors, repo_id, {}, message="create the repo")

    def create_branch(self, *args, **kwargs):
        raise AssertionError("upload_dataset was given no revision; it must not create a branch")

    def list_repo_tree(self, repo_id, repo_type, revision):
        return self.api.list_repo_tree(repo_id, repo_type=repo_type, revision=revision or "main")

    def create_commit(self, repo_id, operations, repo_type, revision, commit_message):
        commit_files(self.mirrors, repo_id, {op.path_in_repo: op.path_or_fileobj for op in operations},
                     branch=revision or "main", message=commit_message)
        self.commits.append([op.path_in_repo for op in operations])


def test_upload_then_stream(hub, tmp_path):
    from huggingface_hub import HfFileSystem

    folder = tmp_path / "ds"
    write_dataset(folder, shards=3, packs_per_shard=[5, 4, 3], seed=5)
    client = GitMirrorHub(hub.endpoint, hub.mirrors)
    # The manifest names dropped.jsonl (`wdspack pack` always writes it; the synthetic writer does not):
    # refused before anything is sent, naming the file.
    with pytest.raises(ManifestError, match=r"dropped\.jsonl is named by .*manifest\.json.*nothing was uploaded"):
        upload_dataset(folder, "org/uploaded", api=client, log=lambda line: None)
    assert client.commits == [] and not (hub.mirrors / "datasets" / "org" / "uploaded").exists()
    (folder / "dropped.jsonl").write_text("")
    counts = upload_dataset(folder, "org/uploaded", api=client, files_per_commit=2, log=lambda line: None)
    shards = [f"train-{i:06d}.tar" for i in range(3)]
    assert client.commits[:2] == [shards[:2], shards[2:]] and client.commits[-1][-1] == "manifest.json"
    tree = {f.path: f for f in client.api.list_repo_tree("org/uploaded", repo_type="dataset", revision="main")}
    assert sorted(tree) == sorted(n for c in client.commits for n in c) and counts["uploaded"] == len(tree)
    # The resume check runs against the server's real tree (git blob ids): nothing is sent again.
    again = upload_dataset(folder, "org/uploaded", api=client, log=lambda line: None)
    assert again == {"uploaded": 0, "skipped": len(tree)}

    fs = HfFileSystem(endpoint=hub.endpoint, skip_instance_cache=True)
    card = fs.read_text("datasets/org/uploaded@main/README.md")
    assert card == (folder / "README.md").read_text()
    snippet = re.search(r'wdspack\.make_loader\("([^"]+)",\s+batch_size=\d+', card)
    assert snippet and snippet.group(1) == "hf://datasets/org/uploaded"
    for source in ("hf://datasets/org/uploaded@main", snippet.group(1)):
        loader = make_loader(source, read={"storage_options": hub.options()}, batch_size=2, num_workers=2, seed=3)
        assert sorted(_numbers(loader)) == list(range(12)), source


# -- the token --------------------------------------------------------------------------------------


def test_the_token_reaches_the_server_and_nowhere_else(hub, packed, caplog):
    caplog.set_level(logging.DEBUG)
    new = _new(hub)
    ds = PackedDataset("hf://datasets/org/packed@main", read={"storage_options": hub.options(token=TOKEN)},
                       batch_size=4, seed=7)
    assert sorted(_numbers(ds)) == list(range(PACKS))  # in this process: its stream logs reach caplog
    loader = make_loader(ds, batch_size=4, num_workers=2)
    assert sorted(_numbers(loader)) == list(range(PACKS))
    sent = new()
    assert len(sent) == 3 + 2 * SHARDS  # resolve, then one GET per shard in each of the two passes
    assert {r["auth"] for r in sent} == {auth_digest(f"Bearer {TOKEN}")}, "every request carries the token"

    errors = []
    for source, error in [("hf://datasets/org/missing@main", SourceError),
                          ("hf://datasets/org/packed@main/*.tar", ConfigError)]:
        with pytest.raises(error) as e:
            PackedDataset(source, read={"storage_options": hub.options(token=TOKEN)})
        errors.append(e.value)
    stream = HttpStream(f"{hub.endpoint}/datasets/org/missing/resolve/main/x.tar", headers=ds.source.headers,
                        retries=0)
    with pytest.raises(SourceError, match="HTTP 401, not authorised") as e:
        stream.read(1)
    errors.append(e.value)

    texts = [record.getMessage() for record in caplog.records]
    texts += ["".join(traceback.format_exception(error)) for error in errors]
    texts += [repr(ds), repr(ds.source), repr(stream), repr(loader.state_dict()), str(ds.stats)]
    texts += [(hub.workdir / "requests.jsonl").read_text(), (hub.workdir / "logs" / "olah.log").read_text()]
    assert caplog.records and len(texts) > len(caplog.records)
    leaks = [text for text in texts if TOKEN in text]
    assert not leaks, leaks[0][:500]


def test_inspect_verify_and_reshard_read_a_hub_dataset(hub, tmp_path, monkeypatch):
    """The tools take ``hf://`` sources too (fsspec's ``hf`` protocol, at the server's endpoint)."""
    from huggingface_hub import HfFileSystem, constants

    from wdspack.ops.inspect import dataset_stats
    from wdspack.ops.verify import verify_dataset
    from wdspack.packer.config import PackConfig
    from wdspack.packer.reshard import reshard_dataset

    folder = tmp_path / "tools"
    write_dataset(folder, shards=2, packs_per_shard=5, seed=4)
    (folder / "dropped.jsonl").write_text("")
    publish(hub.mirrors, "org/tools", folder)
    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)  # what HF_ENDPOINT sets at import time
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    HfFileSystem.clear_instance_cache()
    url = "hf://datasets/org/tools@main"
    local, remote = dataset_stats(str(folder), deep=True), dataset_stats(url, deep=True)
    assert remote["packs"] == 10 and {k: v for k, v in remote.items() if k != "source"} == \
        {k: v for k, v in local.items() if k != "source"}
    assert verify_dataset(url) == []
    reshard_dataset(url, tmp_path / "re", config=PackConfig(seq_len=128, max_images=4))
    before = sum(int(ex["num_samples"]) for ex in PackedDataset(folder, shuffle=False))
    after = sum(int(ex["num_samples"]) for ex in PackedDataset(tmp_path / "re", shuffle=False))
    assert after == before > 10  # every sample re-packed (at 128 tokens: none is too long)
    assert sum(1 for r in hub.requests() if "/org/tools/resolve/" in r["path"] and r["path"].endswith(".tar")) >= 2


def test_pack_reads_sources_and_images_from_the_hub(hub, tmp_path, monkeypatch, sample_config):
    """``wdspack pack hf://datasets/ORG/NAME@main/...``: the records and their images are read from
    the repo (images relative to it), and the shards equal those packed from the same files on disk.

    One partition per file: olah ignores ``Range`` and HfFileSystem's block cache then hands back
    the file's first bytes for any offset, so ranged reads are tested against S3 (``tests/packer/test_job_remote.py``).
    """
    from huggingface_hub import HfFileSystem, constants

    from tests.support.demo import demo_sources, generate_demo, read_files
    from wdspack.packer.config import PackConfig, RunOptions
    from wdspack.packer.job import pack_dataset

    data = generate_demo(tmp_path / "chats", records=60, seed=3)
    publish(hub.mirrors, "org/chats", data)
    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)  # what HF_ENDPOINT sets at import time
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    HfFileSystem.clear_instance_cache()
    config = PackConfig(seq_len=2048, max_images=6, shard_max_bytes=100_000, records_per_partition=1000,
                        run=RunOptions(max_drop_fraction=1.0))  # 60 demo records hold its 6 deliberately bad ones
    pack_dataset(demo_sources(data), tmp_path / "local", sample_config=sample_config, config=config)
    seen = _new(hub)
    sources = ["hf://datasets/org/chats/llava.jsonl", "hf://datasets/org/chats@main/messages.jsonl"]
    pack_dataset(sources, tmp_path / "hub", sample_config=sample_config, config=config)
    local, remote = read_files(tmp_path / "local"), read_files(tmp_path / "hub")
    shards = sorted(n for n in local if n.endswith(".tar"))
    assert len(shards) >= 2 and shards == sorted(n for n in remote if n.endswith(".tar"))
    assert all(remote[n] == local[n] for n in shards)
    paths = [r["path"] for r in seen()]
    assert sum("/images/" in p for p in paths) >= 30  # the images came from the server, one GET each
    assert not [p for p in paths if p.startswith("/api/datasets/org/chats") and "/revision/" not in p
                and "/tree/" not in p and "/paths-info/" not in p]  # never a revision-less repo lookup


def test_balanced_loader_reads_the_pack_index_once_and_equals_the_local_folder(hub, tmp_path):
    folder = tmp_path / "indexed"
    write_dataset(folder, shards=SHARDS, packs_per_shard=PACKS_PER_SHARD, seed=3, pack_index=True)
    sha = publish(hub.mirrors, "org/indexed", folder)
    options = dict(batch_size=2, num_workers=2, seed=7, balance={"window": 6, "run": 3, "heaviest_first": True})
    new = _new(hub)
    remote = make_loader("hf://datasets/org/indexed@main", read={"storage_options": hub.options()}, **options)
    index_gets = [r for r in new() if r["path"] == _resolve(sha, "pack_index.npy", "org/indexed")]
    assert len(index_gets) == 1
    new = _new(hub)
    got = list(remote)
    plan = remote.dataset._plan(2, 0)
    shard_gets = [r for r in new() if r["path"].endswith(".tar")]
    assert len(shard_gets) == sum(len(s) for s in plan.slots) == remote.stats["requests"]  # one per run
    assert _same_tensors(got, list(make_loader(folder, **options)))



@pytest.mark.parametrize("workers", [1, 2, 4])
def test_requests_stay_flat_in_workers_and_a_split_shard_costs_one_ranged_read_per_piece(hub, tmp_path, workers):
    """8 shards: evenly divided, shards + 3 requests per rank and epoch for 1, 2 or 4 workers and 1 or 2 ranks;
    unevenly divided (as byte-cut shards are), one request per piece, starting at the piece's own pack."""
    import numpy as np

    for name, counts in (("even8", [6] * 8), ("uneven8", [5, 9, 7, 6, 8, 4, 7, 10])):
        folder = tmp_path / name
        if not folder.exists():
            write_dataset(folder, shards=8, packs_per_shard=counts, seed=3, pack_index=True)
        sha = publish(hub.mirrors, f"org/{name}-{workers}", folder)
        offsets = np.load(folder / "pack_index.npy")[:, 0]
        starts = np.cumsum([0] + counts)
        for ranks in (1, 2):
            for rank in range(ranks):
                new = _new(hub)
                loader = make_loader(f"hf://datasets/org/{name}-{workers}@main",
                                     read={"storage_options": hub.options()}, batch_size=1, num_workers=workers,
                                     seed=7, rank=rank, world_size=ranks)
                assert len(list(loader)) == len(loader)
                got = new()
                shard_gets = [r for r in got if r["path"].endswith(".tar")]
                pieces = [g for w in range(workers) for g in loader.dataset._plan(workers, 0).slots[rank * workers + w]]
                assert len(shard_gets) == len(pieces), (name, ranks, rank)
                if name == "even8":
                    assert len(got) == 3 + len(pieces) <= 8 + 3 and all(g.start == 0 for g in pieces)
                    continue
                index_gets = [r for r in got if r["path"].endswith("pack_index.npy")]
                assert len(got) == 3 + len(index_gets) + len(pieces)
                for g in pieces:
                    path = _resolve(sha, f"train-{g.shard:06d}.tar", f"org/{name}-{workers}")
                    want = None if g.start == 0 else f"bytes={int(offsets[starts[g.shard] + g.start])}-"
                    assert want in [r["range"] for r in shard_gets if r["path"] == path], (g, shard_gets)
