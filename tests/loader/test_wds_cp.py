"""The webdataset stages on a dataset planned for context parallelism (``--cp N``): every sub-sample padded to
``2·N`` as it loads, the same batches as ``make_loader`` (which pads the same way), the same one-line note of
what that padding costs, and a ``cp=`` unlike the manifest's refused."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

import wdspack
from tests.support.synthetic import plan_for_cp, write_dataset
from wdspack.errors import ConfigError
from wdspack.loader.wds import batched, read_dataset, to_examples

wds = pytest.importorskip("webdataset")

CP = 2
B = 2


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """A synthetic dataset (``seq_len`` 64: each pack padded to 4 a sub-sample fits) marked planned for
    ``cp = 2``, the padding counted as the pack job counts it; its packs as stored and padded."""
    folder = tmp_path_factory.mktemp("cp-wds")
    write_dataset(folder, shards=2, packs_per_shard=5, seed=7)
    packs, padded = plan_for_cp(folder, cp=CP)
    assert any(q.num_tokens > p.num_tokens for p, q in zip(packs, padded))
    return folder, packs, padded


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) > 0, (len(a), len(b))
    for x, y in zip(a, b):
        assert list(x) == list(y)
        for k in x:
            assert torch.equal(x[k], y[k]) if isinstance(x[k], torch.Tensor) else x[k] == y[k], k


@pytest.mark.parametrize("options", [{}, {"padding_free": True}])
def test_planned_packs_load_padded_as_make_loader_loads_them(planned, caplog, options):
    folder, _, padded = planned
    info = read_dataset(folder)
    assert info.cp == CP and info.cp_padding > 0
    with caplog.at_level(logging.INFO, logger="wdspack"):
        expected = list(wdspack.make_loader(folder, batch_size=B, num_workers=0, shuffle=False, text_only=True,
                                            **options))
        got = list(wds.DataPipeline(wds.SimpleShardList(list(info.urls)), wds.tarfile_to_samples(),
                                    to_examples(info, text_only=True), batched(B, dataset=info, **options)))
    _same(got, expected)
    # the padded sub-samples, segment for segment: each divides by 2·cp (the packs' tails too: seq_len does)
    seg = torch.cat([b["cu_seqlens"][1:] - b["cu_seqlens"][:-1] for b in got])
    assert seg.numel() and bool((seg % (2 * CP) == 0).all())
    if not options:  # [B, L] rows: each pack's padded sub-samples, then its tail (padding-free: one tail a batch)
        segments = [n for p in padded[:len(got) * B] for n in [*p.seq_lens, 64 - p.num_tokens] if n]
        assert [int(n) for n in seg if n] == segments
    notes = [r.getMessage() for r in caplog.records if "planned for 2 CP ranks" in r.getMessage()]
    assert len(notes) == 2 and notes[0] == notes[1], notes  # make_loader's and the stage's: one line, the same
    assert f"{info.cp_padding} tokens in all" in notes[0]


def test_a_cp_unlike_the_manifest_is_refused_and_one_without_a_manifest_pads(planned):
    folder, packs, padded = planned
    info = read_dataset(folder)
    with pytest.raises(ConfigError, match=r"cp=4 does not match .*planned for cp 2.*reshard .* --seq-len 64 --cp 4"):
        to_examples(info, cp=4, text_only=True)
    plain = dataclasses.replace(info, cp=None, cp_padding=0)
    with pytest.raises(ConfigError, match="not planned for CP"):
        to_examples(plain, cp=2, text_only=True)
    with pytest.raises(ConfigError, match="cp=0"):
        to_examples(seq_len=64, max_images=2, pad_token_id=0, cp=0, text_only=True)
    # no manifest: the caller says what the packs were planned for, and the stage pads them the same
    stage = to_examples(seq_len=64, max_images=2, pad_token_id=0, cp=CP, text_only=True)
    (example,) = stage(iter(packs[:1]))
    assert padded[0].num_tokens > packs[0].num_tokens
    assert example["input_ids"][: padded[0].num_tokens].tolist() == padded[0].input_ids.tolist()
