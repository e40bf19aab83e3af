"""The whole bad-input matrix through the real packer (issue 5: reliability).

One dataset holds one bad record per case plus good records; after ``pack_dataset`` every bad
record is in ``dropped.jsonl`` with its reason, every good one in exactly one pack, and the
manifest's counts add up. ``--on-error raise`` stops at the first bad record, naming it. An
unwritable output (a full disk, simulated with ``RLIMIT_FSIZE``) is a clear error that leaves
nothing half-written under a final name.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from tests.support import ROOT
from tests.support.bad_input import (
    MAX_IMAGES,
    SEQ_LEN,
    TOKENS_PER_IMAGE,
    build_bad_dataset,
    check_nothing_half_written,
    pack_argv,
    run_with_file_size_limit,
)
from tests.support.demo import read_files
from wdspack import cli
from wdspack.errors import DROP_REASONS, SampleError
from wdspack.format.manifest import read_manifest
from wdspack.format.pack import decode_pack
from wdspack.packer.config import PackConfig, RunOptions
from wdspack.packer.job import WORK_DIR, pack_dataset


@pytest.fixture(scope="module")
def bad_dataset(tmp_path_factory):
    return build_bad_dataset(tmp_path_factory.mktemp("bad"))


def _config(**kw) -> PackConfig:
    # The matrix is mostly bad records on purpose: accept any drop fraction (the default 5 % would stop
    # the job, rightly, before it writes the packs these tests inspect).
    return PackConfig(**{"seq_len": SEQ_LEN, "max_images": MAX_IMAGES, "shard_max_packs": 2,
                         "records_per_partition": 7, "run": RunOptions(max_drop_fraction=1.0), **kw})


def _packed_ids(out: Path) -> list[str]:
    ids = []
    for shard in read_manifest(out).shards:
        with tarfile.open(out / shard.name) as tar:
            for m in tar.getmembers():
                ids.extend(decode_pack(tar.extractfile(m).read(), seq_len=SEQ_LEN, max_images=MAX_IMAGES).sample_ids)
    return ids


def test_every_bad_record_is_dropped_with_its_reason(bad_dataset, sample_config, tmp_path, capsys):
    path, images, bad, good, lines = bad_dataset
    # every reason but unmaskable_turn, which needs a template that rewrites earlier turns
    # (tests/packer/test_render.py), and video_too_short / video_too_large, which need a video family's
    # processor (this matrix packs with --tokenizer): real records in tests/packer/test_video_bad_input.py;
    # the sources' video reasons (missing, escaping, empty) are rows here; so are the sources' audio reasons
    # (missing, escaping), the others need an audio family's processor: tests/packer/test_audio_bad_input.py
    elsewhere = {"unmaskable_turn", "video_too_short", "video_too_large", "unreadable_audio", "audio_too_large",
                 "audio_too_short", "no_audio_track"}
    assert {reason for _, reason in bad} == set(DROP_REASONS) - elsewhere, "the matrix covers every reason"
    out = tmp_path / "ds"
    summary = pack_dataset([str(path)], out, sample_config=sample_config, config=_config(), image_root=str(images))
    dropped = [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]
    got = {}
    for d in dropped:
        assert d["id"] not in got, f"{d['id']} dropped twice"
        got[d["id"]] = d["reason"]
    with capsys.disabled():
        print("\n  id                          expected              got")
        for sid, reason in bad:
            print(f"  {sid:27s} {reason:21s} {got.get(sid, '— (not dropped)')}")
    assert got == dict(bad), "every bad record dropped once, with its reason, and nothing else"
    for d in dropped:
        assert d["detail"] and "0x7f" not in d["detail"], d  # details name the value, never an address
    packed = _packed_ids(out)
    assert sorted(packed) == sorted(good), "every good record is in exactly one pack"
    t = read_manifest(out).totals
    assert t["samples_read"] == lines == summary.samples_read
    assert t["samples_packed"] == len(packed) == len(good)
    assert t["samples_dropped"] == len(dropped) == len(bad)
    assert t["samples_read"] == t["samples_packed"] + t["samples_dropped"]
    assert sum(t["dropped_by_reason"].values()) == t["samples_dropped"]
    assert not (out / WORK_DIR).exists()


def test_the_first_duplicate_is_kept(bad_dataset, sample_config, tmp_path):
    path, images, *_ = bad_dataset
    out = tmp_path / "ds"
    pack_dataset([str(path)], out, sample_config=sample_config, config=_config(), image_root=str(images))
    from wdspack.packer.samples import get_builder

    tok = get_builder(sample_config).tokenizer
    for shard in read_manifest(out).shards:
        with tarfile.open(out / shard.name) as tar:
            for m in tar.getmembers():
                pack = decode_pack(tar.extractfile(m).read())
                starts = np.cumsum((0,) + pack.seq_lens)
                for k, sid in enumerate(pack.sample_ids):
                    if sid == "dup":
                        answer = tok.decode(pack.input_ids[starts[k]:starts[k + 1]][
                            pack.loss_mask[starts[k]:starts[k + 1]].astype(bool)].tolist())
                        assert answer.startswith("First."), answer
    from wdspack.ops.verify import verify_dataset

    assert verify_dataset(str(out)) == []  # the dropped later copy is not a packed-and-dropped conflict


def test_on_error_raise_names_the_first_bad_record(bad_dataset, sample_config, tmp_path):
    path, images, bad, *_ = bad_dataset
    with pytest.raises(SampleError) as e:
        pack_dataset([str(path)], tmp_path / "ds", sample_config=sample_config, config=_config(on_error="raise"),
                     image_root=str(images))
    first_id, first_reason = bad[0]
    assert e.value.sample_id == first_id and e.value.reason == first_reason
    assert repr(first_id) in str(e.value) and "nope.png" in str(e.value) and "--on-error skip" in str(e.value)


@pytest.mark.parametrize("keep, reason", [
    (("good-1", "too-long"), "too_long"),
    (("good-1", "dup"), "duplicate_id"),
    (("good-1", "not-utf8"), "malformed_record"),
])
def test_on_error_raise_for_budget_and_duplicate_drops(bad_dataset, sample_config, tmp_path, keep, reason):
    """Budgets and duplicates are found after measuring; ``raise`` still names the record."""
    path, images, *_ = bad_dataset
    src = tmp_path / "some.jsonl"
    src.write_bytes(b"".join(line + b"\n" for line in path.read_bytes().splitlines()
                             if any(f'"id": "{k}"'.encode() in line for k in keep)))
    with pytest.raises(SampleError) as e:
        pack_dataset([str(src)], tmp_path / "ds", sample_config=sample_config, config=_config(on_error="raise"),
                     image_root=str(images))
    assert e.value.reason == reason
    assert e.value.sample_id in (*keep, "some.jsonl:1") and repr(e.value.sample_id) in str(e.value)


def test_cli_on_error_raise_is_one_line_exit_1(bad_dataset, tekken_dir, tmp_path, capsys):
    path, images, *_ = bad_dataset
    code = cli.main(["pack", str(path), "--output", str(tmp_path / "ds"), "--tokenizer", str(tekken_dir),
                     "--chat-template", str(ROOT / "examples" / "chat_templates" / "pixtral.jinja"),
                     "--image-token", "[IMG]", "--tokens-per-image", str(TOKENS_PER_IMAGE), "--seq-len",
                     str(SEQ_LEN), "--max-images", str(MAX_IMAGES), "--image-root", str(images),
                     "--on-error", "raise", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.count("\n") == 0 and err.startswith("wdspack pack: error: sample 'missing-image'"), err


@pytest.mark.slow  # CLI processes
def test_full_disk_is_a_clear_error_and_leaves_nothing_half_written(bad_dataset, tekken_dir, tmp_path):
    path, images, *_ = bad_dataset
    out = tmp_path / "ds"
    done = run_with_file_size_limit(3000, pack_argv([str(path)], out, tekken_dir, images))
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("wdspack pack: error: cannot write") and "File too large" in lines[0], lines[0]
    assert "--resume" in lines[0]
    check_nothing_half_written(out)
    # with room again, --resume finishes the job: the same result as a run that never failed
    assert cli.main(pack_argv([str(path)], out, tekken_dir, images) + ["--resume"]) == 0
    reference = tmp_path / "reference"
    assert cli.main(pack_argv([str(path)], reference, tekken_dir, images)) == 0
    assert read_files(out) == read_files(reference)


def test_unwritable_output_is_a_clear_error(bad_dataset, tekken_dir, tmp_path, capsys):
    path, images, *_ = bad_dataset
    blocker = tmp_path / "file"
    blocker.write_text("a file where a folder should be")
    code = cli.main(pack_argv([str(path)], blocker / "ds", tekken_dir, images))
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.count("\n") == 0 and "cannot create" in err, err
