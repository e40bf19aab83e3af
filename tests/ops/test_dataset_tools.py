"""reshard, verify, inspect and upload on a real packed dataset."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.demo import demo_sources
from wdspack.cli import main
from wdspack.errors import OutputError
from wdspack.format.manifest import read_manifest
from wdspack.format.pack import decode_pack
from wdspack.ops.inspect import dataset_stats, naive_padding_waste
from wdspack.ops.upload import upload_dataset
from wdspack.ops.verify import verify_dataset
from wdspack.packer.config import PackConfig, RunOptions
from wdspack.packer.job import pack_dataset
from wdspack.packer.reshard import reshard_dataset

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def packed(tmp_path_factory, demo_data, sample_config):
    """The same data (conftest's demo) packed directly at 1024, 2048 and 4096 tokens."""
    base = tmp_path_factory.mktemp("packed")
    out = {}
    for seq_len in (1024, 2048, 4096):
        out[seq_len] = base / f"p{seq_len}"
        pack_dataset(demo_sources(demo_data), out[seq_len], sample_config=sample_config,
                     # the demo's bad records, many too long at 1024
                     config=PackConfig(seq_len=seq_len, max_images=8, shard_max_bytes=200_000,
                                       run=RunOptions(max_drop_fraction=1.0)))
    return out


def _samples(root: Path) -> dict[str, tuple]:
    got = {}
    for shard in read_manifest(root).shards:
        with tarfile.open(root / shard.name) as tar:
            for m in tar.getmembers():
                p = decode_pack(tar.extractfile(m).read())
                start = 0
                for k, (sid, n) in enumerate(zip(p.sample_ids, p.seq_lens)):
                    imgs = tuple((p.images[j], p.image_tokens[j]) for j, o in enumerate(p.image_sample) if o == k)
                    got[sid] = (p.input_ids[start:start + n].tolist(), p.loss_mask[start:start + n].tolist(), imgs)
                    start += n
    return got


def _dropped(root: Path) -> dict[str, str]:
    return {d["id"]: d["reason"] for d in map(json.loads, (root / "dropped.jsonl").read_text().splitlines())}


@pytest.mark.parametrize("new_len", [4096, 1024])
def test_reshard_equals_a_direct_pack(packed, tmp_path, new_len):
    src = packed[2048]
    out = tmp_path / f"r{new_len}"
    summary = reshard_dataset(str(src), out, config=PackConfig(seq_len=new_len, max_images=8,
                                                                   run=RunOptions(max_drop_fraction=1.0)))
    direct, resharded = _samples(packed[new_len]), _samples(out)
    # Samples too long for 2048 were dropped by the source job and stay dropped.
    lost_at_2048 = {sid for sid, r in _dropped(src).items() if r == "too_long"}
    assert set(resharded) == set(direct) - lost_at_2048
    for sid, value in resharded.items():
        assert value == direct[sid], sid
    m, s = read_manifest(out), read_manifest(src)
    assert m.totals["samples_read"] == s.totals["samples_read"] == summary.samples_read
    assert m.totals["samples_packed"] + m.totals["samples_dropped"] == m.totals["samples_read"]
    assert m.provenance["resharded_from"]["seq_len"] == 2048
    assert m.tokenizer == s.tokenizer and m.seq_len == new_len
    assert verify_dataset(str(out)) == []
    if new_len == 1024:
        assert m.totals["dropped_by_reason"]["too_long"] > s.totals["dropped_by_reason"]["too_long"]


def test_verify_ok_and_with_sources(packed, demo_data):
    assert verify_dataset(str(packed[2048])) == []
    assert verify_dataset(str(packed[2048]), sources=demo_sources(demo_data)) == []
    extra = demo_data.parent / "extra.jsonl"
    extra.write_text(json.dumps({"id": "never-packed", "conversations": [
        {"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}) + "\n")
    problems = verify_dataset(str(packed[2048]), sources=demo_sources(demo_data) + [str(extra)])
    assert len(problems) == 1 and "in no pack and not dropped" in problems[0] and "never-packed" in problems[0]


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def test_verify_catches_damage(packed, tmp_path, capsys):
    src = packed[2048]
    first = read_manifest(src).shards[0].name

    flipped = _copy(src, tmp_path / "flipped")
    data = bytearray((flipped / first).read_bytes())
    data[700] ^= 0xFF
    (flipped / first).write_bytes(bytes(data))
    problems = verify_dataset(str(flipped))
    assert any(first in p and "sha256" in p for p in problems)

    truncated = _copy(src, tmp_path / "truncated")
    (truncated / first).write_bytes((truncated / first).read_bytes()[:1500])
    assert any(first in p and ("truncated" in p or "bytes, manifest says" in p) for p in verify_dataset(str(truncated)))

    missing = _copy(src, tmp_path / "missing")
    (missing / first).unlink()
    assert verify_dataset(str(missing)) == [f"{first}: missing (listed in the manifest)"]

    duplicated = _copy(src, tmp_path / "duplicated")
    with tarfile.open(duplicated / first) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(duplicated / first, "w", format=tarfile.USTAR_FORMAT) as tar:
        for m, blob in members + members[:1]:
            tar.addfile(m, io.BytesIO(blob))
    problems = verify_dataset(str(duplicated))
    assert any("appears twice" in p for p in problems)
    assert any("more than one pack" in p for p in problems)

    assert main(["verify", str(duplicated)]) == 1
    out = capsys.readouterr().out
    assert all(line.startswith("FAIL ") for line in out.splitlines())
    assert main(["verify", str(src)]) == 0


def test_inspect_numbers_and_plot(packed, tmp_path, capsys):
    stats = dataset_stats(str(packed[4096]), deep=True)
    m = read_manifest(packed[4096])
    assert stats["packs"] == m.num_packs and stats["fill_ratio"] == m.totals["fill_ratio"]
    assert stats["per_pack"]["tokens"]["max"] <= 4096
    assert stats["per_pack"]["images"]["max"] <= 8
    assert sum(stats["_arrays"]["samples"]) == m.totals["samples_packed"]
    assert stats["naive_padding_waste"] > stats["padding_waste"]
    plot = tmp_path / "fill.png"
    assert main(["inspect", str(packed[4096]), "--plot", str(plot)]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000
    text = capsys.readouterr().out
    assert "fill" in text and "pad-to-longest" in text
    assert main(["inspect", str(packed[4096]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["packs"] == m.num_packs


def test_naive_padding_waste():
    import numpy as np

    assert naive_padding_waste(np.array([4, 4, 4, 4]), batch_size=2) == 0.0
    assert naive_padding_waste(np.array([1, 3]), batch_size=2) == pytest.approx(1 - 4 / 6)


class FakeHub:
    """An in-memory stand-in for ``huggingface_hub.HfApi`` (no network): it stores committed bytes
    and answers ``list_repo_tree`` with LFS sha256 for large files and git blob ids for small ones."""

    def __init__(self, fail_after_commits: int | None = None):
        self.repos: dict[str, dict[str, bytes]] = defaultdict(dict)
        self.commits: list[list[str]] = []
        self.fail_after = fail_after_commits

    def create_repo(self, repo_id, repo_type, private, exist_ok):
        assert repo_type == "dataset"
        self.repos[repo_id]

    def create_branch(self, *a, **k):
        pass

    def list_repo_tree(self, repo_id, repo_type, revision):
        for path, data in self.repos[repo_id].items():
            if len(data) > 10_000:
                yield SimpleNamespace(path=path, size=len(data), lfs={"sha256": hashlib.sha256(data).hexdigest()})
            else:
                blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
                yield SimpleNamespace(path=path, size=len(data), lfs=None, blob_id=blob)

    def create_commit(self, repo_id, operations, repo_type, revision, commit_message):
        if self.fail_after is not None and len(self.commits) >= self.fail_after:
            raise ConnectionError("connection reset by peer (token=hf_secret_value)")
        names = []
        for op in operations:
            self.repos[repo_id][op.path_in_repo] = Path(op.path_or_fileobj).read_bytes()
            names.append(op.path_in_repo)
        self.commits.append(names)


def test_upload_is_resumable_and_keeps_the_token_out(packed, tmp_path, monkeypatch):
    ds = _copy(packed[1024], tmp_path / "ds")
    shards = [s.name for s in read_manifest(ds).shards]
    assert len(shards) >= 3
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    hub = FakeHub(fail_after_commits=1)
    logs: list[str] = []
    with pytest.raises(OutputError) as e:
        upload_dataset(ds, "org/packed", api=hub, files_per_commit=2, log=logs.append)
    assert "hf_secret_value" not in str(e.value) and "re-run" in str(e.value)
    assert "manifest.json" not in hub.repos["org/packed"], "the manifest goes last"
    hub.fail_after = None
    counts = upload_dataset(ds, "org/packed", api=hub, files_per_commit=2, log=logs.append)
    assert counts["skipped"] == 2  # the two shards of the first commit
    repo = hub.repos["org/packed"]
    for name in shards + ["manifest.json", "dropped.jsonl", "pack_index.npy", "README.md", "wdspack_stats.png"]:
        assert repo[name] == (ds / name).read_bytes(), name
    assert hub.commits[-1][-1] == "manifest.json"
    again = upload_dataset(ds, "org/packed", api=hub, log=logs.append)
    assert again == {"uploaded": 0, "skipped": len(shards) + 5}
    card = repo["README.md"].decode()
    assert card.startswith("---\n") and "wdspack.make_loader(\"hf://datasets/org/packed\"" in card
    assert "fill ratio" in card and "wdspack_stats.png" in card
    assert not any("hf_secret_value" in line for line in logs)
    assert "hf_secret_value" not in (ds / "manifest.json").read_text()


def test_inspect_gives_the_global_batch_in_packs(packed, capsys):
    """NeVA's rule: a per-sample global batch of N is N / (mean samples per pack) packs."""
    m = read_manifest(packed[4096])
    mean = m.totals["samples_packed"] / m.totals["packs"]
    stats = dataset_stats(str(packed[4096]), samples_per_step=256)
    assert stats["mean_samples_per_pack"] == pytest.approx(mean, abs=1e-4)
    assert stats["packs_per_step"] == max(1, round(256 / stats["mean_samples_per_pack"]))
    assert main(["inspect", str(packed[4096]), "--samples-per-step", "256"]) == 0
    out = capsys.readouterr().out
    assert f"≈ {stats['packs_per_step']} packs per step" in out and "samples per pack  mean" in out
    assert main(["inspect", str(packed[4096]), "--samples-per-step", "0"]) == 2


def test_the_card_counts_in_words_and_the_help_names_the_installed_login(demo_packed, capsys):
    """'1 shard', not '1 shards'; `wdspack upload --help` names `hf auth login`, which the installed
    huggingface_hub ships (its `huggingface-cli` is gone) (#38 items 6 and 7)."""
    from wdspack.ops.upload import dataset_card

    stats = dataset_stats(str(demo_packed[0]), deep=True)
    assert f"in {stats['shards']} shards (" in dataset_card(stats, "org/name") and stats["shards"] > 1
    assert "in 1 shard (" in dataset_card({**stats, "shards": 1}, "org/name")
    assert main(["upload", "--help"]) == 0
    text = capsys.readouterr().out
    assert "`hf auth login`" in text and "huggingface-cli" not in text
    from importlib.metadata import entry_points

    assert entry_points(group="console_scripts", name="hf"), "the installed huggingface_hub ships `hf`"


def test_upload_messages_count_in_words(packed, tmp_path):
    """'uploaded 1/1 shard' and '1 file uploaded', not '1 shards' / '1 files' (#38 item 7)."""
    ds = _copy(packed[1024], tmp_path / "ds")
    hub, logs = FakeHub(), []
    upload_dataset(ds, "org/packed", api=hub, log=logs.append)
    first = read_manifest(ds).shards[0].name
    del hub.repos["org/packed"][first]
    logs.clear()
    assert upload_dataset(ds, "org/packed", api=hub, log=logs.append)["uploaded"] == 1
    assert logs[0] == "uploaded 1/1 shard" and logs[-1].startswith("datasets/org/packed: 1 file uploaded, "), logs
