"""Fuzzing the two readers of untrusted bytes: the pack codec and the loader's tar reader.

Whatever the bytes — random, truncated, flipped, or a header that claims gigabytes — the readers
raise only their own errors (``FormatError`` / ``ShardError``, or count a skip), never hang, and
never allocate what a header claims before the bytes are there.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import tarfile
import tracemalloc
from collections import Counter
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.synthetic import write_dataset
from wdspack.errors import FormatError
from wdspack.format.pack import Pack, decode_pack, encode_pack
from wdspack.format.tar import ShardError, shard_packs, tar_entries
from wdspack.loader import PackedDataset
from wdspack.storage.local import LocalStream

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
_MB = 1 << 20


def _pack() -> bytes:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 60_000, size=40)
    mask = (np.arange(40) % 3 == 0).astype(np.uint8)
    return encode_pack(Pack(ids, mask, (25, 15), ("a", "b"), images=(b"\x89PNG fake", b"jpeg?"),
                            image_sample=(0, 1), image_tokens=(4, 4)), token_dtype="<u2")


VALID = _pack()


def _decode_only_format_errors(data: bytes) -> None:
    with contextlib.suppress(FormatError):
        decode_pack(data, seq_len=64, max_images=4)


class _Peak:
    """Peak Python heap growth (tracemalloc) inside the block, in bytes."""

    def __enter__(self):
        tracemalloc.start()
        tracemalloc.reset_peak()
        self._base = tracemalloc.get_traced_memory()[0]
        return self

    def __exit__(self, *exc):
        self.bytes = tracemalloc.get_traced_memory()[1] - self._base
        tracemalloc.stop()


# -- (a) the codec ---------------------------------------------------------------------------------


def test_valid_pack_decodes():
    assert decode_pack(VALID).sample_ids == ("a", "b")


@FUZZ
@given(st.binary(max_size=2048))
def test_decode_random_bytes(data):
    _decode_only_format_errors(data)


@FUZZ
@given(st.integers(0, len(VALID) - 1))
def test_decode_truncated_pack(cut):
    with pytest.raises(FormatError):
        decode_pack(VALID[:cut])


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(1, 255)), min_size=1, max_size=8))
def test_decode_flipped_bytes(flips):
    data = bytearray(VALID)
    for pos, xor in flips:
        data[pos] ^= xor
    _decode_only_format_errors(bytes(data))


@FUZZ
@given(st.dictionaries(st.sampled_from(["format", "token_dtype", "input_ids", "loss_mask", "seq_lens", "sample_ids",
                                        "images", "image_sample", "image_tokens", "extra"]),
                       st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats()
                                    | st.text(max_size=8) | st.binary(max_size=16),
                                    lambda inner: st.lists(inner, max_size=4)
                                    | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=12)))
def test_decode_well_formed_msgpack_of_the_wrong_shape(fields):
    """Valid msgpack, every key possibly present with any value: still only FormatError."""
    record = msgpack.unpackb(VALID, raw=False)
    record.update(fields)
    _decode_only_format_errors(msgpack.packb(record, use_bin_type=True))


@pytest.mark.parametrize("name, data", [
    ("4 GiB bin at the top", b"\xc6\xff\xff\xff\xff" + b"x" * 16),
    ("4 GiB input_ids", b"\x81\xa9input_ids\xc6\xff\xff\xff\xff" + b"x" * 16),
    ("2 GiB - 1 input_ids (under the bin limit)", b"\x81\xa9input_ids\xc6\x7f\xff\xff\xff" + b"x" * 16),
    ("4 G-element array", b"\xdd\xff\xff\xff\xff" + b"\x00" * 16),
    ("4 G-entry map", b"\xdf\xff\xff\xff\xff" + b"\xa1a\x00" * 4),
    ("4 GiB string", b"\xdb\xff\xff\xff\xff" + b"x" * 16),
    ("ext type", b"\xc7\x10\x01" + b"x" * 16),
    ("1000 nested 4M-element arrays", b"\xdd\x00\x40\x00\x00" * 1000),
    ("deep nesting past the unpacker's stack", b"\x91" * 100_000),
])
def test_a_huge_claim_is_refused_without_allocating_it(name, data):
    with _Peak() as peak, pytest.raises(FormatError):
        decode_pack(data)
    # msgpack pre-sizes a list at most ~10k slots per nesting level (≤ 1024 levels): tens of MB, never GBs
    assert peak.bytes < 128 * _MB, f"{name}: {peak.bytes / _MB:.0f} MB"


def test_an_oversized_pack_is_refused_before_parsing(monkeypatch):
    import wdspack.format.pack as codec

    monkeypatch.setattr(codec, "MAX_PACK_BYTES", len(VALID) - 1)
    with pytest.raises(FormatError, match="exceeds"):
        decode_pack(VALID)


# -- (b) the loader's tar reader -------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz") / "ds"
    write_dataset(root, shards=2, packs_per_shard=3, seq_len=64, max_images=2)
    return root


class _Bytes(bytes):
    """Shard bytes that hypothesis reports by size, not by 10 kB of repr."""

    def __repr__(self) -> str:
        return f"<{len(self)} shard bytes>"


@pytest.fixture(scope="module")
def shard_bytes(dataset) -> bytes:
    return _Bytes((dataset / "train-000000.tar").read_bytes())


def _read_shard(tmp_path: Path, data: bytes) -> tuple[list[tuple[int, int]], Counter]:
    """Every (index, size) ``shard_packs`` yields from ``data``, or ShardError; nothing else may escape."""
    path = tmp_path / "x.tar"
    path.write_bytes(data)
    stats: Counter = Counter()
    got = []
    with LocalStream(str(path), block_size=4096) as stream:
        for index, pack in shard_packs(stream, start=0, stop=3, stats=stats, where="x.tar"):
            got.append((index, len(pack)))
            _decode_only_format_errors(pack)
    return got, stats


def _entries(tmp_path: Path, data: bytes) -> list:
    path = tmp_path / "e.tar"
    path.write_bytes(data)
    with LocalStream(str(path)) as stream:
        out = []
        for entry in tar_entries(stream, where="e.tar"):
            out.append(entry)
            stream.skip(entry.size)
        return out


def _survives(tmp_path: Path, data: bytes) -> None:
    for reader in (_read_shard, _entries):
        with contextlib.suppress(ShardError):
            reader(tmp_path, data)


@FUZZ
@given(data=st.data())
def test_truncated_shard(tmp_path, shard_bytes, data):
    cut = data.draw(st.integers(0, len(shard_bytes) - 1))
    try:
        got, _ = _read_shard(tmp_path, shard_bytes[:cut])
    except ShardError:
        return
    # the reader stops right after the last pack it owes: a cut past it loses nothing
    assert [i for i, _ in got] == [0, 1, 2]
    with tarfile.open(fileobj=io.BytesIO(shard_bytes)) as tar:
        last = tar.getmembers()[-1]
    assert cut >= last.offset_data + last.size


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=6))
def test_flipped_bytes_in_a_shard(tmp_path, shard_bytes, flips):
    data = bytearray(shard_bytes)
    for pos, xor in flips:
        data[pos % len(data)] ^= xor
    _survives(tmp_path, bytes(data))


@FUZZ
@given(st.binary(max_size=3000))
def test_random_bytes_as_a_shard(tmp_path, data):
    _survives(tmp_path, data)


def _with_header_field(shard: bytes, member: int, start: int, value: bytes) -> bytes:
    """The shard with one field of member ``member``'s header replaced, checksum fixed (so it parses)."""
    offsets = []
    with tarfile.open(fileobj=io.BytesIO(shard)) as tar:
        offsets = [m.offset for m in tar.getmembers()]
    at = offsets[member]
    header = bytearray(shard[at:at + 512])
    header[start:start + len(value)] = value
    header[148:156] = b" " * 8
    header[148:156] = f"{sum(header):06o}\0 ".encode()
    return shard[:at] + bytes(header) + shard[at + 512:]


@FUZZ
@given(member=st.integers(0, 2), size=st.one_of(st.integers(0, 2**33), st.integers(0, 2**88 - 1)),
       base256=st.booleans())
def test_a_header_with_any_size_never_allocates_it(tmp_path, shard_bytes, member, size, base256):
    field = (b"\x80" + size.to_bytes(11, "big")) if base256 or size >= 8**11 else f"{size:011o}\0".encode()
    data = _with_header_field(shard_bytes, member, 124, field)
    with _Peak() as peak:
        _survives(tmp_path, data)
    assert peak.bytes < 64 * _MB, f"{size}-byte claim cost {peak.bytes / _MB:.0f} MB"


@pytest.mark.parametrize("field", [f"{8 << 30:011o}\0".encode(), b"\x80" + (2**80).to_bytes(11, "big"),
                                   b"-0000000005\0", b"zzzzzzzzzzz\0"])
def test_garbled_sizes_are_shard_errors(tmp_path, shard_bytes, field):
    data = _with_header_field(shard_bytes, 1, 124, field)
    with _Peak() as peak, pytest.raises(ShardError, match=r"x\.tar"):
        _read_shard(tmp_path, data)
    assert peak.bytes < 64 * _MB


def _mutate(shard: bytes, how: str, rng: np.random.Generator) -> bytes:
    if how == "truncate":
        return shard[:int(rng.integers(0, len(shard)))]
    if how == "flip":
        data = bytearray(shard)
        for pos in rng.integers(0, len(shard), size=4):
            data[pos] ^= int(rng.integers(1, 256))
        return bytes(data)
    if how == "random":
        return rng.bytes(len(shard))
    return _with_header_field(shard, int(rng.integers(0, 3)), 124, f"{int(rng.integers(0, 8**11)):011o}\0".encode())


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(how=st.sampled_from(["truncate", "flip", "random", "size"]), seed=st.integers(0, 2**32 - 1))
def test_packed_dataset_over_a_mutated_shard(tmp_path_factory, dataset, how, seed):
    """The whole loader: it skips and counts (``skip``) or raises FormatError (``raise``), never more."""
    root = tmp_path_factory.mktemp("mutated") / "ds"
    shutil.copytree(dataset, root)
    shard = root / "train-000001.tar"
    shard.write_bytes(_mutate(shard.read_bytes(), how, np.random.default_rng(seed)))
    ds = PackedDataset(root, shuffle=False)
    got = list(ds)
    assert len(got) == 6, "a rank always yields its full count, making up for skipped packs"
    damage = ds.stats["corrupt_packs"] + ds.stats["truncated_shards"]
    try:
        strict = list(PackedDataset(root, shuffle=False, on_corrupt="raise"))
    except FormatError:  # ShardError is a FormatError
        assert damage > 0
    else:
        assert len(strict) == 6


def test_a_shard_that_reads_nothing_at_all_is_an_error_not_a_hang(tmp_path, dataset):
    root = tmp_path / "ds"
    shutil.copytree(dataset, root)
    for shard in root.glob("*.tar"):
        shard.write_bytes(b"\0" * 100)
    from wdspack.errors import WdspackError

    with pytest.raises(WdspackError, match="none was readable"):
        list(PackedDataset(root, shuffle=False))
