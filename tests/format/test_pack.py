"""Pack format v1: golden bytes, mirrors, invariants, stock webdataset compatibility."""

from __future__ import annotations

import hashlib
import importlib.util
import pickle
import tarfile
from pathlib import Path

import msgpack
import numpy as np
import pytest

from wdspack.errors import FormatError, NewerFormatError
from wdspack.format.pack import FORMAT, Pack, decode_pack, encode_pack, token_dtype_for, validate_pack
from wdspack.format.tar import ShardWriter

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "train-000000.tar"
GOLDEN_SHA256 = "9e92393043bdd8617a0fede5da669924ba1cc9526fd8aaddf01523fa0cc5f499"


def _tool():
    return importlib.import_module("tools.make_golden_shard")


def test_golden_shard_bytes_are_pinned(tmp_path):
    # The checked-in file is what the format and writer produce, byte for byte...
    assert hashlib.sha256(GOLDEN.read_bytes()).hexdigest() == GOLDEN_SHA256
    fresh = tmp_path / "train-000000.tar"
    _tool().write_golden(fresh)
    assert fresh.read_bytes() == GOLDEN.read_bytes(), "format changed: run tools/make_golden_shard.py on purpose"


def test_golden_shard_decodes_to_the_packs():
    expected = _tool().golden_packs()
    with tarfile.open(GOLDEN) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["000000000000.mp", "000000000001.mp", "000000000002.mp"]
        for m, (pack, dtype) in zip(members, expected):
            assert (m.mtime, m.uid, m.gid, m.mode) == (0, 0, 0, 0o444)
            got = decode_pack(tar.extractfile(m).read())
            assert got.input_ids.dtype == np.dtype(dtype)
            assert got.input_ids.tolist() == pack.input_ids.tolist()
            assert got.loss_mask.tolist() == pack.loss_mask.tolist()
            assert (got.seq_lens, got.sample_ids, got.images, got.image_sample, got.image_tokens) == (
                pack.seq_lens, pack.sample_ids, pack.images, pack.image_sample, pack.image_tokens)


def test_stock_webdataset_decodes_packs_as_dicts():
    import webdataset as wds

    packs = list(wds.WebDataset(str(GOLDEN), shardshuffle=False, empty_check=False).decode())
    assert len(packs) == 3
    record = packs[0]["mp"]
    assert record["format"] == FORMAT and record["seq_lens"] == [8, 6]
    assert np.frombuffer(record["input_ids"], record["token_dtype"]).tolist()[:3] == [1, 3, 10]


def _pack(**kw):
    base = dict(input_ids=np.array([1, 2, 3, 4]), loss_mask=np.array([0, 1, 0, 1]), seq_lens=(2, 2),
                sample_ids=("a", "b"), images=(b"x",), image_sample=(1,), image_tokens=(1,))
    base.update(kw)
    return Pack(**base)


def test_encode_is_deterministic_and_mirrors_decode():
    p = _pack()
    blob = encode_pack(p, token_dtype="<u2")
    assert blob == encode_pack(p, token_dtype="<u2")
    q = decode_pack(blob)
    assert q.input_ids.tolist() == [1, 2, 3, 4] and q.sample_ids == ("a", "b") and q.images == (b"x",)
    assert list(msgpack.unpackb(blob, raw=False)) == ["format", "token_dtype", "input_ids", "loss_mask",
                                                      "seq_lens", "sample_ids", "images", "image_sample",
                                                      "image_tokens"]


def test_token_dtype_choice():
    assert token_dtype_for(65536) == "<u2" and token_dtype_for(65537) == "<u4"
    with pytest.raises(FormatError, match="does not fit token_dtype '<u2'"):
        encode_pack(_pack(input_ids=np.array([1, 2, 3, 70000])), token_dtype="<u2")


def test_unknown_format_names_both_versions():
    blob = msgpack.packb({"format": "wdspack/2"}, use_bin_type=True)
    with pytest.raises(FormatError, match=r"'wdspack/2'.*'wdspack/1'"):
        decode_pack(blob)


def test_a_newer_format_is_its_own_error_naming_both_versions_and_the_fix():
    record = msgpack.unpackb(encode_pack(_pack(), token_dtype="<u2"), raw=False)
    record["format"] = "wdspack/2"  # a whole, valid pack but for the version a later wdspack writes
    with pytest.raises(NewerFormatError) as e:
        decode_pack(msgpack.packb(record, use_bin_type=True))
    assert isinstance(e.value, FormatError) and (e.value.found, e.value.supported) == ("wdspack/2", FORMAT)
    assert str(e.value) == ("pack format 'wdspack/2' is newer than this wdspack reads ('wdspack/1'); upgrade "
                            "wdspack (pip install -U wdspack)")
    again = pickle.loads(pickle.dumps(e.value))  # as a worker process hands it back
    assert type(again) is NewerFormatError and str(again) == str(e.value) and again.found == "wdspack/2"
    assert str(NewerFormatError("a worker's traceback")) == "a worker's traceback"  # DataLoader's re-raise


@pytest.mark.parametrize("fmt", ["wdspack/0", "wdspack/x", "wdspack/", "wdspack/²", "other/2", None, 2])
def test_a_format_that_is_no_later_version_is_plain_corruption(fmt):
    record = msgpack.unpackb(encode_pack(_pack(), token_dtype="<u2"), raw=False)
    record["format"] = fmt
    with pytest.raises(FormatError, match=f"pack format {fmt!r} is not 'wdspack/1'") as e:
        decode_pack(msgpack.packb(record, use_bin_type=True))
    assert not isinstance(e.value, NewerFormatError)


def test_extra_keys_are_ignored():
    record = msgpack.unpackb(encode_pack(_pack(), token_dtype="<u2"), raw=False)
    record["future_field"] = [1, 2, 3]
    assert decode_pack(msgpack.packb(record, use_bin_type=True)).seq_lens == (2, 2)


@pytest.mark.parametrize("change, match", [
    (dict(seq_lens=(3, 2)), "do not sum"),
    (dict(loss_mask=np.array([0, 1, 0])), "disagree"),
    (dict(sample_ids=("a",)), "sample_ids"),
    (dict(image_sample=(2,)), "outside"),
    (dict(image_tokens=(1, 1)), "must agree"),
    (dict(loss_mask=np.array([0, 2, 0, 1])), "other than 0 and 1"),
])
def test_invariants_are_enforced(change, match):
    with pytest.raises(FormatError, match=match):
        validate_pack(_pack(**change))


def test_budgets_checked_on_request():
    with pytest.raises(FormatError, match="seq_len 3"):
        validate_pack(_pack(), seq_len=3)
    with pytest.raises(FormatError, match="max_images 0"):
        validate_pack(_pack(), max_images=0)


@pytest.mark.parametrize("blob", [b"", b"\xc1", b"\x93\x01\x02\x03", msgpack.packb({"format": "wdspack/1"}),
                                  msgpack.packb({"format": "wdspack/1", "token_dtype": "<u2", "input_ids": "str",
                                                 "loss_mask": b"", "seq_lens": [], "sample_ids": [], "images": [],
                                                 "image_sample": [], "image_tokens": []})])
def test_garbage_is_a_format_error(blob):
    with pytest.raises(FormatError):
        decode_pack(blob)


def test_writer_renames_only_when_complete(tmp_path):
    path = tmp_path / "train-000000.tar"
    w = ShardWriter(path)
    w.add("000000000000", b"abc", samples=1, tokens=3, media={"image": 0})
    assert not path.exists() and (tmp_path / ".train-000000.tar.tmp").exists()
    info = w.close()
    assert path.exists() and not (tmp_path / ".train-000000.tar.tmp").exists()
    assert info.bytes == path.stat().st_size and info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (info.packs, info.samples, info.tokens) == (1, 1, 3)


def test_writer_abort_leaves_nothing(tmp_path):
    path = tmp_path / "train-000001.tar"
    with pytest.raises(RuntimeError), ShardWriter(path) as w:
        w.add("k", b"abc", samples=1, tokens=3, media={"image": 0})
        raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []
