"""The loader's one-pass text batch equals pack_to_example + collate_packs, key for key, byte for byte."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
import torch

from wdspack.errors import ConfigError, FormatError
from wdspack.format.pack import Pack
from wdspack.loader.batch.collate import SOURCE_KEY, collate_packs, pack_to_example
from wdspack.loader.batch.text import text_batch

L, M, PAD = 64, 4, 7


def _pack(rng: np.random.Generator, *, fill: float, subs: int, images: int) -> Pack:
    n = max(subs, int(L * fill))
    cuts = np.sort(rng.choice(np.arange(1, n), subs - 1, replace=False)) if subs > 1 else np.array([], np.int64)
    lens = np.diff(np.concatenate([[0], cuts, [n]])).astype(int)
    owners = np.sort(rng.integers(0, subs, images)) if images else np.array([], np.int64)
    return Pack(rng.integers(0, 1000, n).astype(np.uint32), rng.integers(0, 2, n).astype(np.uint8),
                tuple(int(x) for x in lens), tuple(f"s{i}" for i in range(subs)),
                images=tuple(b"x" for _ in range(images)), image_sample=tuple(int(o) for o in owners),
                image_tokens=tuple(int(t) for t in rng.integers(1, 5, images)))


def _reference(packs, sources, **options):
    examples = [pack_to_example(p, seq_len=L, max_images=M, pad_token_id=PAD, pad_images=False) for p in packs]
    for e, s in zip(examples, sources):
        e[SOURCE_KEY] = torch.tensor(s)
    return collate_packs(examples, share_memory=False, **options)


def _assert_same(got, want):
    assert list(got) == list(want), "the same keys in the same order"
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
            assert torch.equal(got[key], value), key
        else:
            assert got[key] == value, key


BATCHES = {
    "mixed": [dict(fill=0.9, subs=3, images=2), dict(fill=1.0, subs=1, images=0), dict(fill=0.5, subs=5, images=4)],
    "full rows": [dict(fill=1.0, subs=2, images=1), dict(fill=1.0, subs=4, images=0)],
    "one sub-sample each": [dict(fill=0.3, subs=1, images=1)] * 3,
    "many short": [dict(fill=0.95, subs=20, images=3)],
}


@pytest.mark.parametrize("options", [{}, {"attention_mask": "2d"}, {"attention_mask": "4d"},
                                     {"padding_free": True}, {"padding_free": True, "attention_mask": "4d"},
                                     {"max_segments": 48}, {"padding_free": True, "max_segments": 48}],
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
@pytest.mark.parametrize("shape", sorted(BATCHES))
def test_one_pass_equals_the_reference(shape, options):
    rng = np.random.default_rng(sorted(BATCHES).index(shape))
    packs = [_pack(rng, **spec) for spec in BATCHES[shape]]
    sources = [int(s) for s in rng.integers(0, 3, len(packs))]
    _assert_same(text_batch(packs, sources, seq_len=L, max_images=M, pad_token_id=PAD, **options),
                 _reference(packs, sources, **options))


def test_the_same_errors_as_the_reference():
    rng = np.random.default_rng(0)
    ok, crowded = _pack(rng, fill=0.5, subs=2, images=1), _pack(rng, fill=0.5, subs=2, images=M + 1)
    with pytest.raises(FormatError, match=r"images > max_images 4"):
        text_batch([ok, crowded], [0, 0], seq_len=L, max_images=M, pad_token_id=PAD)
    with pytest.raises(FormatError, match=r"tokens > seq_len 16"):
        text_batch([ok], [0], seq_len=16, max_images=M, pad_token_id=PAD)
    with pytest.raises(ConfigError, match="padding_free=True"):
        text_batch([ok], [0], seq_len=L, max_images=M, pad_token_id=PAD, padding_free=True, attention_mask="2d")
    with pytest.raises(ConfigError, match="max_segments 1"):
        text_batch([ok], [0], seq_len=L, max_images=M, pad_token_id=PAD, max_segments=1)


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    """36 packs of 0-3 real images each, in 3 shards (M = 3)."""
    from tests.support.synthetic import write_dataset

    root = tmp_path_factory.mktemp("pictures-textbatch")
    write_dataset(root, shards=3, packs_per_shard=12, max_images=3, seed=5)
    return root


@pytest.mark.parametrize("options", [{}, {"padding_free": True, "attention_mask": "4d"}],
                         ids=["default", "padding_free-4d"])
def test_the_loaders_workers_batch_the_text_as_the_reference_does(pictures, options, monkeypatch):
    """Through real workers: the one-pass text (recycled buffers), the stacked per-pack tensors (workers
    that send new shared memory, ``reuse_buffers=False``) and a loader with the one-pass path switched off
    all give the same batches, pixels included."""
    from wdspack.loader import make_loader
    from wdspack.loader.batch import buffers
    from wdspack.media.image.pixels import make_image_transform

    def batches(**kw):
        loader = make_loader(pictures, batch_size=2, num_workers=2, seed=3, pin_memory=False,
                             image_transform=make_image_transform(size=16), **options, **kw)
        return [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()} for b in loader]

    calls, real = multiprocessing.get_context("fork").Value("i", 0), buffers.text_batch  # counted across fork

    def counted(*args, **kwargs):
        with calls.get_lock():
            calls.value += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(buffers, "text_batch", counted)
    one_pass = batches()
    assert calls.value == 18, "the workers with recycled buffers took the one-pass path for every batch"
    reference = batches(reuse_buffers=False)
    assert calls.value == 18, "workers sending new shared memory stack per-pack tensors straight into it"
    monkeypatch.setattr(buffers, "_ONE_PASS_KEYS", frozenset())  # every example falls back to pack_to_example
    stacked = batches()
    assert len(one_pass) == len(reference) == len(stacked) == 18
    for got, ref, old in zip(one_pass, reference, stacked):
        _assert_same(got, ref)
        _assert_same(got, old)
