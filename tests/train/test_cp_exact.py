"""Context parallelism is exact: 4 gloo ranks, started once (``tests/support/cp_ranks.py``), run CP attention
alone and two real families' training steps split over 2 and 4 CP ranks; the loss summed over the ranks and
divided by the step's target count, and the gradients after the all-reduce, equal the unsplit packed step
(the harness's, float64, SDPA).

Qwen2.5-VL (images, 3-D mRoPE positions computed on the whole pack before the split), Qwen2.5-VL on video chats
(LLaMA-Factory's video layout, a video beside an image in one chat; each video's time axis in its positions) and
Mistral 3 with a sliding window of 8 (images, 1-D positions, the window's mask across ranks). Each split pads
segments to a multiple of ``2·cp``; the attention case holds segments of 3, 1 and 7 tokens, shorter than
``2·cp = 8``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import wdspack
from tests.support import vlm_harness as h
from tests.support.ranks import free_port
from tests.support.video_chats import ROWS, source_folder
from wdspack.media.video.plan import VideoSettings
from wdspack.models import save_processor
from wdspack.packer.config import PackConfig
from wdspack.packer.job import pack_dataset
from wdspack.packer.samples import SampleConfig
from wdspack.train.cp import cp_layout

FAMILIES = ("qwen2_5_vl", "mistral3_sliding")
#: Qwen2.5-VL's model on packs of video chats (tests/support/video_chats.py's, as the video family tests pack them)
VIDEO = "qwen2_5_vl_video"
WORLD = 4


def _video_dataset(processor, folder):
    """The video chats (LLaMA-Factory's layout: a video alone, two turns, a video beside an image, text) packed
    with Qwen2.5-VL's processor at 4 frames a second, small frames, two or more packs."""
    src = source_folder(folder)
    rows = {sid: row for sid, row in ROWS.items() if "videos" in row or "video" not in row}
    (src / "chats.jsonl").write_text("".join(json.dumps({"id": sid, **row}) + "\n" for sid, row in rows.items()))
    config = SampleConfig(processor=str(save_processor(processor, folder / "processor")),
                          video=VideoSettings(fps=4.0, max_pixels=28 * 28 * 4))
    dataset = folder / "packed"
    summary = pack_dataset([str(src / "chats.jsonl")], str(dataset), sample_config=config, progress=False,
                           config=PackConfig(seq_len=112, max_images=3, on_error="raise"))
    assert summary.samples_packed == len(rows) and summary.packs >= 2, summary.lines()
    return dataset


@pytest.fixture(scope="module")
def ranks(vlm_family, tmp_path_factory):
    """Start the ranks, compute each family's unsplit packed step here meanwhile, wait for the ranks;
    ``(out folder, {family: (model, whole batch, per-DP-rank batches, reference)})``."""
    folder = tmp_path_factory.mktemp("cp")
    out = folder / "out"
    out.mkdir()
    families, built = [], {}
    for name in (*FAMILIES, VIDEO):
        if name == VIDEO:
            processor, model, _ = vlm_family("qwen2_5_vl")
            dataset = _video_dataset(processor, folder / "video")
        else:
            processor, model, dataset = vlm_family(name)
        model = model.double()
        model.set_attn_implementation("sdpa")
        model.save_pretrained(folder / name)
        whole = h.loader_batches(dataset, processor)
        dp = [list(wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, shuffle=False, processor=processor,
                                       rank=r, world_size=2)) for r in range(2)]
        torch.save({"whole": whole, "dp": dp, "count": wdspack.num_items_in_batch(whole)}, folder / f"{name}.pt")
        families.append({"name": name, "model": str(folder / name), "batches": str(folder / f"{name}.pt")})
        built[name] = (model, whole, dp)
    spec = folder / "spec.json"
    spec.write_text(json.dumps({"world": WORLD, "port": free_port(), "out": str(out), "families": families}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(h.ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.support.cp_ranks", str(spec), str(r)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for r in range(WORLD)]
    try:
        refs = {name: (*b, h.packed(b[0], b[1])) for name, b in built.items()}
        errors = [p.communicate(timeout=600)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, err in zip(procs, errors):
        assert p.returncode == 0, err.decode()[-3000:]
    return out, refs


def _load(out, case: str) -> list[dict]:
    return [dict(np.load(out / f"{case}-rank{r}.npz")) for r in range(WORLD)]


@pytest.mark.parametrize("cp", [2, 4])
def test_attention_across_ranks_equals_each_segments_causal_attention(ranks, cp):
    for rank in _load(ranks[0], f"attention-cp{cp}"):
        np.testing.assert_allclose(rank["out"], rank["want_out"], rtol=1e-12, atol=1e-13)
        for n in "qkv":
            np.testing.assert_allclose(rank[f"grad_{n}"], rank[f"want_grad_{n}"], rtol=1e-12, atol=1e-13,
                                       err_msg=f"d{n}")


def _got(model, results: list[dict]) -> tuple:
    """The ranks' (loss sum, target count, gradients): the loss summed over ranks, the gradients all-reduced."""
    grads = [torch.from_numpy(results[0][f"grad{k}"]) for k in range(len(list(model.parameters())))]
    for r in results[1:]:
        for k, g in enumerate(grads):
            np.testing.assert_array_equal(r[f"grad{k}"], g.numpy(), err_msg="the all-reduce leaves every rank equal")
    return torch.tensor(sum(float(r["loss"]) for r in results), dtype=torch.float64), int(results[0]["n"]), grads


@pytest.mark.parametrize("family", (*FAMILIES, VIDEO))
def test_four_cp_ranks_equal_the_unsplit_packed_step(ranks, family):
    out, refs = ranks
    model, whole, _, want = refs[family]
    lens = [b - a for batch in whole for a, b in zip(batch["cu_seqlens"].tolist(), batch["cu_seqlens"].tolist()[1:])]
    assert any(n % 8 for n in lens), "some segment is padded to a multiple of 2·cp"
    if family == VIDEO:
        assert sum(int(b["video_mask"].sum()) for b in whole) == 3, "the packs hold the three videos"
        assert sum(int(b["image_mask"].sum()) for b in whole) == 1, "and the picture beside one of them"
    else:
        assert sum(int(b["image_mask"].sum()) for b in whole) >= 4, "the packs hold images"
    h.assert_same(model, _got(model, _load(out, f"{family}-cp4")), want)


@pytest.mark.parametrize("family", (*FAMILIES, VIDEO))
def test_two_dp_by_two_cp_ranks_equal_one_process_over_every_batch(ranks, family):
    """Each DP rank its own packs, split over its 2 CP ranks; ``num_items_in_batch`` over the DP group counts
    the step's targets once, and the gradients summed over all 4 ranks are the step's (the DP ranks' packs
    together are the whole batch's, so the unsplit step is the same)."""
    out, refs = ranks
    model, whole, dp, want = refs[family]
    rows = sorted(tuple(b["input_ids"][0].tolist()) for batches in dp for b in batches)
    assert all(dp) and rows == sorted(tuple(r) for r in whole[0]["input_ids"].tolist()), "the DP ranks share the packs"
    h.assert_same(model, _got(model, _load(out, f"{family}-dpcp")), want)


def test_the_padding_of_these_packs_is_what_the_layout_reports(ranks):
    """The cost the split reports: 2·cp padding per segment, the same on every rank's layout."""
    _, refs = ranks
    whole = refs["qwen2_5_vl"][1]
    for batch in whole:
        for cp in (2, 4):
            lays = [cp_layout(batch["cu_seqlens"], cp=cp, rank=r, cu_seqlens=True) for r in range(cp)]
            assert {lay.padding for lay in lays} == {sum(lays[0].padded_lens) - int(batch["input_ids"].numel())}
            assert all(lay.index.numel() * cp == sum(lay.padded_lens) for lay in lays)
