"""Context parallelism is exact: 4 gloo ranks (``tests/support/cp_ranks.py``, started first: they import while the
models are built here) run CP attention alone and two real families' training steps split over 2 and 4 CP ranks;
the loss summed over the ranks and divided by the step's target count, and the gradients after the all-reduce,
equal the unsplit packed step (the harness's, float64, SDPA), under both paths of CP attention: SDPA with each
rank's mask, and the varlen path (each rank's chunks as query sequences over their key prefix) on the reference
kernel, which also equals the SDPA path.

Qwen2.5-VL on packs of video chats (LLaMA-Factory's video layout, a video beside an image in one chat, a picture
alone, each video's time axis in its 3-D mRoPE positions computed on the whole pack before the split, and a text
sample of 2 tokens: a real sub-sample shorter than ``2·cp``) and Mistral 3 with a sliding window of 8 (images,
1-D positions, the window's mask across ranks). Each split pads segments to a multiple of ``2·cp``; the attention
case holds segments of 3, 1 and 7 tokens, shorter than ``2·cp = 8``.
"""

from __future__ import annotations

import itertools
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
from wdspack.packer.config import PackConfig
from wdspack.packer.job import pack_dataset
from wdspack.packer.samples import SampleConfig
from wdspack.packer.text import PretrainConfig
from wdspack.train.cp import cp_layout

#: Qwen2.5-VL's model on packs of video chats (tests/support/video_chats.py's, as the video family tests pack them)
VIDEO = "qwen2_5_vl_video"
#: family -> the cases its ranks run (cp_ranks.py): 2 and 4 CP ranks under SDPA, 4 under the varlen path,
#: 2 DP x 2 CP
CASES = {"mistral3_sliding": ("cp2", "cp4", "cp4-varlen"), VIDEO: ("cp4", "cp4-varlen", "dpcp")}
WORLD = 4
#: A text sample (a pre-training document) of 2 tokens in the video packs: shorter than 2·cp for cp = 2 and 4
SHORT = {"id": "short", "text": "Hi"}
PICTURE = {"id": "picture", "messages": [{"role": "user", "content": "<image>What is this?"},
                                         {"role": "assistant", "content": "Noise."}], "images": ["images/p.png"]}


def _video_dataset(processor, processor_dir, folder):
    """The video chats (LLaMA-Factory's layout: a video alone, two turns, a video beside an image, text), a picture
    alone and a 2-token text sample, packed with Qwen2.5-VL's processor at 4 frames a second, small frames, two or
    more packs."""
    src = source_folder(folder)
    rows = [{"id": sid, **row} for sid, row in ROWS.items() if "videos" in row or "video" not in row]
    rows += [PICTURE, SHORT]
    (src / "chats.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = SampleConfig(processor=str(processor_dir),
                          video=VideoSettings(fps=4.0, max_pixels=28 * 28 * 4),
                          pretrain=PretrainConfig(eos_token="<|im_end|>"))
    dataset = folder / "packed"
    summary = pack_dataset([str(src / "chats.jsonl")], str(dataset), sample_config=config, progress=False,
                           config=PackConfig(seq_len=120, max_images=3, on_error="raise"))
    assert summary.samples_packed == len(rows) and summary.packs >= 2, summary.lines()
    return dataset


@pytest.fixture(scope="module")
def ranks(vlm_family, tiny_processors, tmp_path_factory):
    """Start the ranks, build each family's model and batches here meanwhile, then compute their unsplit packed
    steps while the ranks run theirs; ``(out folder, {family: (model, whole batch, DP ranks' batches, reference)})``."""
    folder = tmp_path_factory.mktemp("cp")
    out = folder / "out"
    out.mkdir()
    spec = folder / "spec.json"
    ready = folder / "families.json"
    spec.write_text(json.dumps({"world": WORLD, "port": free_port(), "out": str(out), "families": str(ready),
                                "preload": ["qwen2_5_vl", "mistral3"]}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(h.ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.support.cp_ranks", str(spec), str(r)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for r in range(WORLD)]
    try:
        families, built = [], {}
        for name, cases in CASES.items():
            if name == VIDEO:
                processor = tiny_processors.family("qwen2_5_vl")  # its model, not the image chats' dataset
                model = h.family_model("qwen2_5_vl", processor)
                dataset = _video_dataset(processor, tiny_processors.folder(processor), folder / "video")
            else:
                processor, model, dataset = vlm_family(name)
            model = model.double()
            model.set_attn_implementation("sdpa")
            model.save_pretrained(folder / name)
            whole = h.loader_batches(dataset, processor)
            dp = [list(wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, shuffle=False,
                                           processor=processor, rank=r, world_size=2))
                  for r in range(2)] if "dpcp" in cases else []
            torch.save({"whole": whole, "dp": dp, "count": wdspack.num_items_in_batch(whole)}, folder / f"{name}.pt")
            families.append({"name": name, "model": str(folder / name), "batches": str(folder / f"{name}.pt"),
                             "cases": list(cases)})
            built[name] = (model, whole, dp)
        (folder / "families.tmp").write_text(json.dumps(families))
        (folder / "families.tmp").rename(ready)  # the ranks start on the models
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
    """Both paths equal the unsplit segments' causal attention, and each other."""
    for rank in _load(ranks[0], f"attention-cp{cp}"):
        for path in ("", "varlen_"):
            np.testing.assert_allclose(rank[f"{path}out"], rank["want_out"], rtol=1e-12, atol=1e-13, err_msg=path)
            for n in "qkv":
                np.testing.assert_allclose(rank[f"{path}grad_{n}"], rank[f"want_grad_{n}"], rtol=1e-12, atol=1e-13,
                                           err_msg=f"{path}d{n}")
        np.testing.assert_allclose(rank["varlen_out"], rank["out"], rtol=1e-13, atol=1e-14)


def _got(model, results: list[dict]) -> tuple:
    """The ranks' (loss sum, target count, gradients): the loss summed over ranks, the gradients all-reduced (rank
    0's, the same bytes on every rank)."""
    assert len({str(r["digest"]) for r in results}) == 1, "the all-reduce leaves every rank's gradients equal"
    grads = [torch.from_numpy(results[0][f"grad{k}"]) for k in range(len(list(model.parameters())))]
    return torch.tensor(sum(float(r["loss"]) for r in results), dtype=torch.float64), int(results[0]["n"]), grads


def _segments(batch: dict) -> list[tuple[int, bool]]:
    """Each segment's length, and whether it is a sub-sample (not a pack's padding tail)."""
    cu = batch["cu_seqlens"].tolist()
    L = batch["input_ids"].shape[1]
    ends = [row * L + int(n) for row, n in enumerate(batch["num_tokens"])]
    return [(b - a, any(row * L <= a < end for row, end in enumerate(ends))) for a, b in itertools.pairwise(cu)]


@pytest.mark.parametrize(("family", "cp"), [(family, int(case[2])) for family, cases in CASES.items()
                                             for case in cases if case in ("cp2", "cp4")])
def test_cp_ranks_equal_the_unsplit_packed_step(ranks, family, cp):
    out, refs = ranks
    model, whole, _, want = refs[family]
    segments = [s for batch in whole for s in _segments(batch)]
    assert any(n % (2 * cp) for n, _ in segments), "some segment is padded to a multiple of 2·cp"
    if family == VIDEO:
        assert sum(int(b["video_mask"].sum()) for b in whole) == 3, "the packs hold the three videos"
        assert sum(int(b["image_mask"].sum()) for b in whole) == 2, "and the picture beside one of them and alone"
        short = [n for n, real in segments if real and n < 4]
        assert short, f"a sub-sample shorter than 2·cp for cp = 2 (the text sample), in {segments}"
    else:
        assert sum(int(b["image_mask"].sum()) for b in whole) >= 4, "the packs hold images"
    results = _load(out, f"{family}-cp{cp}")  # at cp 2: two CP groups of 2 ranks, each the whole step
    assert len({str(r["digest"]) for r in results}) == 1, "every group's gradients are the same"
    h.assert_same(model, _got(model, results[:cp]), want)


@pytest.mark.parametrize("family", CASES)
def test_the_varlen_path_equals_the_sdpa_path_and_the_unsplit_step(ranks, family):
    """The varlen path (the reference kernel, ``cu_seqlens_q`` ≠ ``cu_seqlens_k``) over the same 4 ranks: Mistral 3's
    sliding window as the kernel's bottom-right window, Qwen2.5-VL's short sample as chunks of one token."""
    out, refs = ranks
    model, _, _, want = refs[family]
    got = _got(model, _load(out, f"{family}-cp4-varlen"))
    h.assert_same(model, got, want)
    h.assert_same(model, got, _got(model, _load(out, f"{family}-cp4")), rtol=1e-12, atol=1e-14)


def test_two_dp_by_two_cp_ranks_equal_one_process_over_every_batch(ranks):
    """Each DP rank its own packs, split over its 2 CP ranks; ``num_items_in_batch`` over the DP group counts
    the step's targets once, and the gradients summed over all 4 ranks are the step's (the DP ranks' packs
    together are the whole batch's, so the unsplit step is the same)."""
    out, refs = ranks
    model, whole, dp, want = refs[VIDEO]
    rows = sorted(tuple(b["input_ids"][0].tolist()) for batches in dp for b in batches)
    assert all(dp) and rows == sorted(tuple(r) for r in whole[0]["input_ids"].tolist()), "the DP ranks share the packs"
    h.assert_same(model, _got(model, _load(out, f"{VIDEO}-dpcp")), want)


def test_the_padding_of_these_packs_is_what_the_layout_reports(ranks):
    """The cost the split reports: 2·cp padding per segment, the same on every rank's layout."""
    _, refs = ranks
    whole = refs[VIDEO][1]
    for batch in whole:
        for cp in (2, 4):
            lays = [cp_layout(batch["cu_seqlens"], cp=cp, rank=r, cu_seqlens=True) for r in range(cp)]
            assert {lay.padding for lay in lays} == {sum(lays[0].padded_lens) - int(batch["input_ids"].numel())}
            assert all(lay.index.numel() * cp == sum(lay.padded_lens) for lay in lays)
