"""Training-throughput benchmark: real tokens/s through forward + backward of a real VLM class.

    python -m tools.bench_train --json docs/benchmarks/data/bench_train.json  # default: ~5 min on 2 idle CPU cores
    python -m tools.bench_train --quick                           # a smoke run, well under a minute
    python -m tools.bench_train --device cuda --records 2000 --seq-len 4096 --hidden 1024 --layers 8

The same samples go through forward + backward of the same model, three ways:

- **packed**: wdspack's shards (planned offline, best-fit decreasing) through
  ``make_loader(dataset, batch_size=B, processor=...)`` and ``model(**wdspack.model_inputs(batch, model))``:
  ``[B, L]`` rows of whole sub-samples, each attending only to itself (the model reads the
  sub-sample boundaries from the restarting ``position_ids``).
- **pad-to-longest**: the plain processor → model path, the standard collator: ``b`` samples per
  step through ``processor.apply_chat_template(..., padding=True)`` (right padding, an attention
  mask), ``b`` chosen so a step holds the same real tokens as a packed step on average.
- **on-the-fly packing**: what an in-training packer does (nanoVLM / TRL style): the samples in
  arrival order, each into the first of ``--otf-rows`` open rows of ``L`` tokens with room (tokens
  and images), the oldest row sent off when none has; ``--otf-rows 1`` is next-fit. The rows go
  through wdspack's own collate, so the forward is the packed one; only the plan differs.

Data: the demo generator (``examples/make_demo_data.py``: long-tailed chats, 20 % text-only,
Pillow images of 64-640 px), packed with the real ``Qwen2_5_VLProcessor`` (``examples/tiny_vlm``;
4 to 64 tokens per image, so the vision tower stays small on a CPU). The samples are those of the
packed loader's full batches (it drops fewer than ``B`` packs at the end of an epoch); pad-to-longest
and on-the-fly packing take them in one seeded shuffled order (the arrival order).

Model: ``Qwen2_5_VLForConditionalGeneration`` with random weights, ``--hidden``/``--layers`` deep,
the tokenizer's 131k vocabulary (padded to a multiple of 128). No optimizer step (the weights stay
fixed, so every mode and round computes the same function, and its per-step cost is not per token);
float32 on a CPU, bfloat16 on CUDA. On CUDA with ``flash_attn`` installed a fourth mode runs: packed, padding-free
(``[1, B·L]``) with FlashAttention-2's varlen kernel.

Attention of the packed and on-the-fly modes (``--attention``; pad-to-longest always runs SDPA with
its padding mask, the baseline):

- ``sdpa`` (default): ``[B, L]`` rows; transformers builds the block-causal mask from the restarting
  positions each step.
- ``varlen``: ``wdspack.use_varlen_attention`` (PyTorch's FlashAttention varlen kernel, no extra
  package) on ``padding_free=True`` batches, segments from the batch's ``cu_seqlens``: no mask at all;
  the vision tower on the same kernel, one call per layer instead of one per window.
  On a CPU the kernel is ``reference_varlen_attn`` (per-segment SDPA: the same numbers, not the
  kernel's speed), so the plumbing can be checked anywhere.
- ``flex``: transformers' ``flex_attention`` (a ``BlockMask`` from the positions; CUDA only, torch
  has no FlexAttention backward on a CPU).

Several, comma-separated (``--attention varlen,sdpa,flex``): the first is the packed mode's, each other
adds a mode ``packed_<name>`` (the same batches, a copy of the model) timed in the same rounds, with
its own ratio over pad-to-longest: one run compares the attentions on the same drift.

``--compile [MODE]`` adds a mode ``packed_compiled``: the packed batches through a copy of the model whose
text decoder layers are compiled once (``wdspack.models.compile.compile_decoder_layers``, the vision tower
eager; ``--compile-backend``, default Inductor; MODE ``reduce-overhead`` for CUDA graphs), timed in the same
rounds. Its first step is timed apart (``config.compile.compile_seconds``: that step less an eager packed
step on the same batch), and dynamo's graphs made after it are reported (``recompiles_after_first_step``: 0).

``--cp N`` adds figures, no process started: what context parallelism over ``N`` ranks holds per rank. Each packed
step's segments (every pack's sub-samples and its padding tail, the loader's ``cu_seqlens``) go through
``wdspack.train.cp.cp_layout``: the tokens each CP rank holds after the split (max and mean over ranks and
steps; real tokens and with the ``2·cp`` padding) and what that padding costs (tokens, share), for the packs
as planned (padded at load time) and for the same data packed with ``--cp N`` (the padding in the plan's
budget, none at load time).

``--long-video`` plans only (no model, no training step: padding and per-rank tokens are facts of the plan and of
the loader's ``cu_seqlens``) the same figures on a long-video mix, for every ``--cp`` degree (default 2,4,8)::

    python -m tools.bench_train --long-video --json docs/benchmarks/data/bench_train_cp_video.json  # ~2 min, 2 cores

The mix: ``--videos`` chats (default 40) in LLaMA-Factory's video layout, each about a clip of 1 to 5 minutes
(seeded, in steps of 30 s; h264/mp4 made with PyAV, 160×90 at 4 fps, the texture clips of ``tools.bench_video``),
and ``--records`` of the demo's chats (default 200: short chats, a fifth text-only, with images), packed at
``seq_len`` 65,536 by the tiny Qwen2.5-VL processor with Qwen2.5-VL's published video settings (2 frames a
second, 128 to 768 merged patches a frame: so small a frame is scaled up to the 128-patch floor, 144 tokens a
second, 8,640 a minute). That dataset loads with the padding at load time; each degree's planned dataset is it
resharded with ``--cp N`` (``wdspack reshard``: the same samples, re-planned). A step is ``--batch-size`` packs
(default 1).

``--family NAME`` builds another family's tiny processor and model instead (``examples/tiny_vlm/<module>``:
its real processor class packs the demo's data, its real ``*ForConditionalGeneration`` class with the example's
fixed tiny sizes, so ``--hidden``/``--layers`` are Qwen2.5-VL's alone): :data:`FAMILIES`. With ``--compile`` it
shows the family's decoder layers compile once over a packed epoch, its loss eager's::

    python -m tools.bench_train --quick --family internvl --compile --compile-backend aot_eager

Model FLOPs utilisation: ``6 · N · real tokens / seconds / peak`` (``N`` every parameter, attention
FLOPs left out, so a lower bound), with ``--peak-tflops`` (default by device name: H100/H200 989,
A100 312, the dense bf16 figures; none on a CPU). ``--profile FILE`` writes a torch profiler table of
three packed steps (by CUDA or CPU time).

Counting: a mode's real tokens are the tokens of the samples it trained (padding never counts),
the same number for every mode, and so are the trained targets and, with fixed weights, the summed
loss (checked). Timing: batches are built before the clock starts (the loader's cost is
``bench_loader.py``'s subject); each round runs every mode over all its batches, interleaved step by
step (the mode furthest behind goes next), so the host's drift (±20 % here) falls on all modes
alike. Ratios are taken within a round; the report gives the median and the spread over rounds.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import io
import json
import platform
import resource
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]

#: ``--quick``: a smoke run (tiny data and model, one round).
QUICK = {"records": 12, "seq_len": 512, "batch_size": 2, "hidden": 32, "layers": 1, "rounds": 1}
DEFAULT = {"records": 40, "seq_len": 1024, "batch_size": 1, "hidden": 256, "layers": 4, "rounds": 2}
#: ``--long-video``: the mix (``--quick``: a smoke run of the same path, short clips and packs); clips of
#: ``seconds[0]`` to ``seconds[1]`` in steps of ``seconds[2]``.
LONG_VIDEO = {"videos": 40, "records": 200, "seq_len": 65536, "seconds": (60, 300, 30)}
LONG_VIDEO_QUICK = {"videos": 3, "records": 12, "seq_len": 8192, "seconds": (10, 30, 10)}
#: the long-video clips: frames so small that Qwen2.5-VL's floor (128 merged patches) sets their size, 252×448:
#: 144 tokens a second of video
LONG_VIDEO_CLIP = {"width": 160, "height": 90, "fps": 4}
#: ``--attention``'s choices for the packed modes.
ATTENTIONS = ("sdpa", "varlen", "flex")
#: ``--family``: name -> (``examples/tiny_vlm`` module, its processor's options, its model's options); the names
#: and options of ``tests/support/vlm_harness.py``'s ``ALL_FAMILIES``. Qwen2.5-VL's model is :func:`build_model`'s
#: (sized by ``--hidden``/``--layers``; its model options unused); the others are their example's tiny model.
FAMILIES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "qwen2_5_vl": ("qwen2_5_vl", {"cls": "Qwen2_5_VLProcessor"}, {"cls": "Qwen2_5_VLForConditionalGeneration"}),
    "internvl": ("internvl", {}, {}),
    "glm4v": ("glm4v", {"cls": "Glm4vProcessor"}, {}),
    "minicpmv4_6": ("minicpmv", {}, {}),
}


@dataclass(frozen=True, slots=True)
class Step:
    """One prepared training step: the model's keyword arguments and what it holds."""

    kwargs: dict[str, Any]
    samples: int
    real_tokens: int  # the samples' tokens; padding excluded
    slots: int  # token positions computed (rows × width), padding included
    targets: int  # trained tokens (labels after the shift)


@dataclass(frozen=True, slots=True)
class SubSample:
    input_ids: np.ndarray
    loss_mask: np.ndarray
    images: tuple[bytes, ...]
    image_tokens: tuple[int, ...]


# ---------------------------------------------------------------------------------------------- data


#: The embedding and LM head rows, rounded up to a multiple of this as released checkpoints do (Qwen2.5-VL
#: 151,936, Pixtral 131,072): the tokenizer's 131,079 sent the LM head's products on an H200 to sm75 CUTLASS
#: kernels (unaligned rows), half of a packed step's GPU time.
VOCAB_MULTIPLE = 128


def build_model(processor: Any, *, hidden: int, layers: int, seed: int = 0) -> Any:
    """A random-init ``Qwen2_5_VLForConditionalGeneration`` (the real class), ``hidden`` wide, its vocabulary
    the tokenizer's rounded up to :data:`VOCAB_MULTIPLE`."""
    import transformers

    tok = processor.tokenizer
    ids = {name: tok.convert_tokens_to_ids(t) for name, t in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    heads = 4
    half = hidden // heads // 2  # mRoPE splits half the head dimension into (t, h, w)
    vocab = -(-len(tok) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    text = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=2, max_position_embeddings=32768,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                 "mrope_section": [half - 2 * (half // 4), half // 4, half // 4]},
                pad_token_id=tok.pad_token_id, bos_token_id=None, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    vision = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, patch_size=14, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=hidden, window_size=56, fullatt_block_indexes=[1])
    config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return transformers.Qwen2_5_VLForConditionalGeneration(config)


def read_packs(dataset: Path) -> list[Any]:
    """Every pack of the dataset, shard by shard, in stored order (the unshuffled loader's order)."""
    from wdspack.format.pack import decode_pack

    packs = []
    for shard in sorted(dataset.glob("*.tar")):
        with tarfile.open(shard) as tar:
            packs += [decode_pack(tar.extractfile(m).read()) for m in tar.getmembers() if m.name.endswith(".mp")]
    return packs


def sub_samples(packs: list[Any]) -> dict[str, SubSample]:
    """``id -> SubSample``: the packs split at their stored boundaries."""
    out = {}
    for pack in packs:
        starts = np.cumsum((0,) + pack.seq_lens)
        for s, sid in enumerate(pack.sample_ids):
            own = [j for j, o in enumerate(pack.image_sample) if o == s]
            span = slice(int(starts[s]), int(starts[s + 1]))
            out[sid] = SubSample(pack.input_ids[span].astype(np.int64), pack.loss_mask[span],
                                 tuple(pack.images[j] for j in own), tuple(pack.image_tokens[j] for j in own))
    return out


def cp_figures(packs: list[Any], *, seq_len: int, batch_size: int, cp: int, planned: bool = False) -> dict[str, Any]:
    """Per-rank activation tokens and the ``2·cp`` padding of the packed steps (``batch_size`` packs each, in
    stored order, the loader's ``cu_seqlens``: each pack's sub-samples, then its padding tail), split over ``cp``
    ranks by :func:`wdspack.train.cp.cp_layout`. ``planned``: packs of a dataset packed with ``--cp``, whose
    sub-samples the loader pads to ``2·cp`` as they load (that padding is the plan's, not counted here).
    ``steps_over_static``: the steps whose segments, padded, hold more than ``B·L`` tokens (a rank past ``B·L / cp``).

    Example:
        >>> from wdspack.format.pack import Pack
        >>> p = Pack(np.arange(13), np.ones(13), (5, 8), ("a", "b"))
        >>> cp_figures([p], seq_len=16, batch_size=1, cp=2)["padding_tokens"]  # 3 + 1 (the tail of 3 tokens)
        4
    """
    from wdspack.train.cp import cp_layout

    step = 2 * cp
    held, real, padding, tokens, over = [], [], 0, 0, 0
    for k in range(0, len(packs) - batch_size + 1, batch_size):  # the loader's full batches
        lens, loaded = [], []  # each segment's real tokens, and as the loader hands it out
        for p in packs[k:k + batch_size]:
            padded = [-(-n // step) * step if planned else n for n in p.seq_lens]
            tail = seq_len - sum(padded)
            lens += [*p.seq_lens, tail] if tail else list(p.seq_lens)
            loaded += [*padded, tail] if tail else padded
        for r in range(cp):
            lay = cp_layout(loaded, cp=cp, rank=r)
            mine = lay.index
            held.append(int(mine.numel()))
            real.append(int((lay.offset[mine] < torch.tensor(lens)[lay.segment[mine]]).sum()))
        padding += lay.padding
        tokens += sum(loaded)
        over += sum(lay.padded_lens) > batch_size * seq_len  # past the static shape: some rank holds > B·L / cp
    return {"cp": cp, "steps": len(held) // cp, "steps_over_static": over,
            "rank_tokens": {"max": max(held, default=0), "mean": round(float(np.mean(held)), 1) if held else 0.0},
            "rank_real_tokens": {"max": max(real, default=0), "mean": round(float(np.mean(real)), 1) if real else 0.0},
            "padding_tokens": padding, "padding_share": round(padding / (tokens + padding), 4) if tokens else 0.0}


def cp_report(packs: list[Any], planned: Path, *, seq_len: int, batch_size: int, cp: int,
              padding_in_plan: int) -> dict[str, Any]:
    """:func:`cp_figures` of the bench's packs (padded at load time) and of the same data packed with ``--cp``
    (``planned``: no padding at load time; ``padding_in_plan`` tokens counted in its budget)."""
    again = read_packs(planned)
    figures = cp_figures(again, seq_len=seq_len, batch_size=batch_size, cp=cp, planned=True)
    return {"cp": cp, "load_time": cp_figures(packs, seq_len=seq_len, batch_size=batch_size, cp=cp),
            "planned": {**figures, "packs": len(again), "padding_in_plan": padding_in_plan},
            "packs": len(packs)}


def write_long_video_chats(folder: Path, *, videos: int, seconds: tuple[int, int, int], seed: int = 0) -> Path:
    """``chats.jsonl`` in LLaMA-Factory's video layout and ``clips/``: chat ``k`` (id ``lv{k}``) asks about a clip
    of a seeded length (``seconds``: lo, hi, step), one clip file per length (``tools.bench_video.make_clip``)."""
    from tools.bench_video import make_clip

    rng = np.random.default_rng([seed, 52])
    lo, hi, step = seconds
    lengths = [int(x) for x in rng.choice(np.arange(lo, hi + 1, step), videos)]
    words = "the red block moves right across a textured scene while the view pans slowly and bobs".split()
    (folder / "clips").mkdir(parents=True, exist_ok=True)
    for n in sorted(set(lengths)):
        (folder / "clips" / f"d{n:03d}s.mp4").write_bytes(make_clip("mp4", seconds=n, seed=n, **LONG_VIDEO_CLIP))
    lines = []
    for k, n in enumerate(lengths):
        answer = " ".join(rng.choice(words, int(rng.integers(20, 121)))).capitalize() + "."
        lines.append(json.dumps({"id": f"lv{k}", "messages": [
            {"role": "user", "content": "<video>Describe what happens in this video, minute by minute."},
            {"role": "assistant", "content": answer}], "videos": [f"clips/d{n:03d}s.mp4"]}))
    path = folder / "chats.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def cp_planning(dataset: Path, work: Path, *, cps: list[int], seq_len: int, max_images: int,
                batch_size: int) -> dict[str, Any]:
    """Per CP degree, :func:`cp_report` of ``dataset`` (padded at load time) and of it resharded with ``--cp N``
    (``wdspack reshard``: the same samples re-planned, the padding in the budget)."""
    from wdspack.packer.config import PackConfig, RunOptions
    from wdspack.packer.reshard import reshard_dataset

    packs = read_packs(dataset)
    out = {}
    for cp in cps:
        target = work / f"cp{cp}"
        reshard_dataset(str(dataset), target, config=PackConfig(seq_len=seq_len, max_images=max_images, cp=cp,
                                                                run=RunOptions(max_drop_fraction=1.0)))
        totals = json.loads((target / "manifest.json").read_text())["totals"]
        out[str(cp)] = cp_report(packs, target, seq_len=seq_len, batch_size=batch_size, cp=cp,
                                 padding_in_plan=int(totals["cp_padding"]))
        out[str(cp)]["planned"]["samples_packed"] = int(totals["samples_packed"])
        shutil.rmtree(target)
    return out


def long_video(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """``--long-video``: the mix packed (padded at load time) and planned for each ``--cp``; no model."""
    from examples.make_demo_data import generate
    from tools.bench_video import QWEN25_VL_VIDEO, tiny_processor, video_sample_config
    from wdspack.packer.config import PackConfig, RunOptions
    from wdspack.packer.job import pack_dataset

    t0 = time.perf_counter()
    generate(work / "data", records=args.records, seed=args.seed)
    chats = write_long_video_chats(work / "video", videos=args.videos, seconds=args.seconds, seed=args.seed)
    sources = [str(chats), str(work / "data" / "llava.jsonl"), str(work / "data" / "messages.jsonl")]
    folder = tiny_processor(work)
    summary = pack_dataset(sources, str(work / "packed"), sample_config=video_sample_config(folder),
                           config=PackConfig(seq_len=args.seq_len, max_images=args.max_images,
                                             run=RunOptions(max_drop_fraction=1.0)),
                           progress=False)  # the demo's deliberately bad records
    packs = read_packs(work / "packed")
    lens = {i: n for p in packs for i, n in zip(p.sample_ids, p.seq_lens)}
    video = np.array([n for i, n in lens.items() if i.startswith("lv")])
    other = np.array([n for i, n in lens.items() if not i.startswith("lv")])
    tokens = int(sum(lens.values()))
    prepared = time.perf_counter() - t0
    figures = cp_planning(work / "packed", work, cps=args.cp, seq_len=args.seq_len, max_images=args.max_images,
                          batch_size=args.batch_size)
    v = QWEN25_VL_VIDEO
    return {"config": {
        "mix": {"video_chats": int(video.size), "clip_seconds": list(args.seconds), "clip": LONG_VIDEO_CLIP,
                "demo_records": args.records,
                "video_chat_tokens": {"min": int(video.min()), "mean": round(float(video.mean()), 1),
                                      "max": int(video.max())} if video.size else None,
                "demo_chats": int(other.size),
                "demo_chat_tokens": {"min": int(other.min()), "mean": round(float(other.mean()), 1),
                                     "max": int(other.max())} if other.size else None},
        "processor": "tiny Qwen2.5-VL (examples/tiny_vlm) with Qwen2.5-VL's published video settings: fps "
                     f"{v.fps}, {v.min_pixels // 784} to {v.max_pixels // 784} patches of 28 px a frame",
        "seq_len": args.seq_len, "max_images": args.max_images, "batch_size": args.batch_size,
        "packs": len(packs), "samples_packed": summary.samples_packed, "tokens": tokens,
        "fill": round(tokens / (len(packs) * args.seq_len), 4) if packs else 0.0, "seed": args.seed,
        "training_step": False, "prepare_seconds": round(prepared, 1)},
        "cp": figures, "seconds_total": round(time.perf_counter() - t0, 1)}


def print_long_video(res: dict[str, Any]) -> None:
    c = res["config"]
    print(f"long-video mix: {c['mix']['video_chats']} video chats ({c['mix']['video_chat_tokens']}) and "
          f"{c['mix']['demo_chats']} demo chats in {c['packs']} packs of {c['seq_len']} tokens, fill {c['fill']:.2%}")
    print("\n| cp | load time: max / mean tokens a rank | padding (share) | steps past B·L | "
          "planned: max / mean a rank | padding in the plan | packs |\n|---:|---:|---:|---:|---:|---:|---:|")
    for cp, r in res["cp"].items():
        lt, pl = r["load_time"], r["planned"]
        print(f"| {cp} | {lt['rank_tokens']['max']:,} / {lt['rank_tokens']['mean']:,} | {lt['padding_tokens']} "
              f"({lt['padding_share']:.3%}) | {lt['steps_over_static']} of {lt['steps']} | "
              f"{pl['rank_tokens']['max']:,} / {pl['rank_tokens']['mean']:,} | {pl['padding_in_plan']} | "
              f"{pl['packs']} / {r['packs']} |")


def read_records(sources: list[str]) -> dict[str, Any]:
    from wdspack.errors import Dropped
    from wdspack.packer.sources import iter_records, list_partitions

    return {r.sample_id: r for part in list_partitions(sources) for r in iter_records(part)
            if not isinstance(r, Dropped)}


# ---------------------------------------------------------------------------------------------- the three feeds


def _targets(labels: torch.Tensor) -> int:
    return int((labels[..., 1:] != -100).sum())


def packed_steps(dataset: Path, processor_dir: Path, model: Any, *, batch_size: int, packs: list[Any],
                 padding_free: bool = False, logits: str = "all") -> tuple[list[Step], list[str]]:
    """The loader's batches of one epoch (unshuffled, in this process) as model inputs, and the
    ids of the sub-samples they hold (checked against the stored packs, batch by batch)."""
    import wdspack

    loader = wdspack.make_loader(str(dataset), batch_size=batch_size, num_workers=0, shuffle=False,
                                 processor=str(processor_dir), padding_free=padding_free, pin_memory=False)
    steps, ids = [], []
    for k, batch in enumerate(loader):
        mine = packs[k * batch_size:(k + 1) * batch_size]
        if batch["num_tokens"].tolist() != [p.num_tokens for p in mine]:
            raise AssertionError(f"batch {k}: the loader's packs are not the stored packs {k * batch_size}...")
        ids += [sid for p in mine for sid in p.sample_ids]
        kwargs = wdspack.model_inputs(batch, model, logits=logits)
        steps.append(Step(kwargs, int(batch["num_samples"].sum()), int(batch["num_tokens"].sum()),
                          int(batch["input_ids"].numel()), _targets(kwargs["labels"])))
    return steps, ids


def plan_on_the_fly(tokens: list[int], images: list[int], *, seq_len: int, max_images: int,
                    open_rows: int) -> list[list[int]]:
    """An in-training packer: items in arrival order, each into the first of ``open_rows`` open rows
    with room for its tokens and images; with none, the oldest row is sent off and a new one opened.

    Example:
        >>> plan_on_the_fly([6, 5, 3, 4], [0, 0, 0, 0], seq_len=10, max_images=1, open_rows=1)
        [[0], [1, 2], [3]]
        >>> plan_on_the_fly([6, 5, 3, 4], [0, 0, 0, 0], seq_len=10, max_images=1, open_rows=2)
        [[0, 2], [1, 3]]
    """
    done: list[list[int]] = []
    rows: list[tuple[list[int], int, int]] = []  # (items, tokens, images)
    for i, (t, m) in enumerate(zip(tokens, images)):
        for r, (items, used_t, used_m) in enumerate(rows):
            if used_t + t <= seq_len and used_m + m <= max_images:
                rows[r] = (items + [i], used_t + t, used_m + m)
                break
        else:
            if len(rows) == open_rows:
                done.append(rows.pop(0)[0])
            rows.append(([i], t, m))
    return done + [items for items, _, _ in rows]


def on_the_fly_steps(subs: dict[str, SubSample], order: list[str], processor_dir: Path, model: Any, *,
                     batch_size: int, seq_len: int, max_images: int, pad_token_id: int, open_rows: int
                     ) -> tuple[list[Step], list[list[str]]]:
    """Rows from :func:`plan_on_the_fly`, ``batch_size`` per step (the last step may hold fewer),
    through wdspack's own collate (what its loader does per batch), then ``model_inputs``."""
    import wdspack
    from wdspack.format.pack import Pack
    from wdspack.loader.batch.collate import collate_packs, pack_to_example
    from wdspack.loader.batch.model import ModelBatcher

    plan = plan_on_the_fly([len(subs[s].input_ids) for s in order], [len(subs[s].images) for s in order],
                           seq_len=seq_len, max_images=max_images, open_rows=open_rows)
    rows = [[order[i] for i in group] for group in plan]
    packs = [_pack_of(Pack, [subs[s] for s in row], row) for row in rows]
    batcher = ModelBatcher(str(processor_dir), seq_len=seq_len, max_images=max_images,
                           max_image_tokens=max(sum(p.image_tokens) for p in packs))
    steps = []
    for k in range(0, len(packs), batch_size):
        examples, parts = [], []
        for pack in packs[k:k + batch_size]:
            examples.append(pack_to_example(pack, seq_len=seq_len, max_images=max_images, pad_token_id=pad_token_id))
            parts.append(batcher.pack_parts(pack, examples[-1]["input_ids"]))
        batch, _ = batcher.collate(dict(collate_packs(examples)), parts)
        kwargs = wdspack.model_inputs(batch, model)
        steps.append(Step(kwargs, int(batch["num_samples"].sum()), int(batch["num_tokens"].sum()),
                          int(batch["input_ids"].numel()), _targets(kwargs["labels"])))
    return steps, rows


def _pack_of(pack_cls: Any, parts: list[SubSample], ids: list[str]) -> Any:
    owners = tuple(j for j, s in enumerate(parts) for _ in s.images)
    return pack_cls(np.concatenate([s.input_ids for s in parts]), np.concatenate([s.loss_mask for s in parts]),
                    tuple(len(s.input_ids) for s in parts), tuple(ids),
                    tuple(im for s in parts for im in s.images), owners,
                    tuple(n for s in parts for n in s.image_tokens))


def padded_steps(records: dict[str, Any], subs: dict[str, SubSample], order: list[str], processor: Any,
                 model: Any, *, batch_size: int) -> list[Step]:
    """``batch_size`` samples per step through the processor's own batched ``apply_chat_template``
    (padded to the longest, right side); labels are the samples' assistant turns, as packed."""
    from PIL import Image

    from wdspack.models.vision_meta import precomputed_vision_kwargs
    from wdspack.packer.samples import _typed_content

    processor.tokenizer.padding_side = "right"
    device = next(model.parameters()).device
    steps = []
    for k in range(0, len(order), batch_size):
        names = order[k:k + batch_size]
        chats = []
        for sid in names:
            pool = iter([Image.open(io.BytesIO(b)) for b in records[sid].images])
            # the parts as the packer hands them to a template that renders images itself (the source's
            # newline after an image is the template's to write: wdspack.packer.samples._typed_content)
            chats.append([{"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else
                           [dict(p, image=next(pool)) if p["type"] == "image" else p
                            for p in _typed_content(m["content"])]}
                          for m in records[sid].messages])
        inputs = dict(processor.apply_chat_template(chats, tokenize=True, return_dict=True, padding=True,
                                                    padding_side="right", return_tensors="pt"))  # InternVL's: left
        labels = torch.full_like(inputs["input_ids"], -100)
        for row, sid in enumerate(names):
            s = subs[sid]
            n = len(s.input_ids)
            if (inputs["input_ids"][row, :n].tolist() != s.input_ids.tolist()
                    or int(inputs["attention_mask"][row].sum()) != n):
                raise AssertionError(f"{sid}: the processor's tokens differ from the packed sub-sample's")
            mask = torch.from_numpy(s.loss_mask.astype(bool))
            mask[0] = False
            labels[row, :n] = torch.where(mask, torch.from_numpy(s.input_ids), -100)
        if "image_grid_thw" in inputs:  # the tower's bookkeeping on the host, as model_inputs gives packed steps
            inputs |= precomputed_vision_kwargs(model, inputs["image_grid_thw"])
        kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()} | {
            "labels": labels.to(device), "use_cache": False}
        steps.append(Step(kwargs, len(names), int(inputs["attention_mask"].sum()), int(inputs["input_ids"].numel()),
                          _targets(labels)))
    return steps


# ---------------------------------------------------------------------------------------------- attention

#: Dense bf16 tensor-core peaks (TFLOP/s) by a substring of the device name; the first match wins.
PEAK_TFLOPS = (("H200", 989.0), ("H100", 989.0), ("A100", 312.0), ("L40S", 362.0), ("L4", 121.0), ("A10", 125.0))


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()


def default_peak(device: torch.device) -> float | None:
    """The device's dense bf16 peak in TFLOP/s, where :data:`PEAK_TFLOPS` knows it (``None`` on a CPU)."""
    name = device_name(device) if device.type == "cuda" else ""
    return next((peak for key, peak in PEAK_TFLOPS if key in name), None)


def with_attention(model: Any, attention: str, device: torch.device) -> Any:
    """``model`` itself for ``sdpa``; otherwise a copy (the same weights) under the packed attention."""
    if attention == "sdpa":
        return model
    import wdspack

    other = copy.deepcopy(model)
    if attention == "varlen":
        from wdspack.models.varlen import reference_varlen_attn

        wdspack.use_varlen_attention(other, kernel=reference_varlen_attn if device.type == "cpu" else None)
    elif attention == "flex":
        if device.type != "cuda":
            raise SystemExit("--attention flex needs CUDA (torch has no FlexAttention backward on a CPU); "
                             "use --attention sdpa or varlen")
        other.set_attn_implementation({"text_config": "flex_attention"})
    return other


def compiled_model(model: Any, attention: str, device: torch.device, *, mode: str, backend: str) -> Any:
    """A copy of ``model`` under the packed attention with its text decoder layers compiled once
    (:func:`wdspack.models.compile.compile_decoder_layers`; ``mode`` ``default`` or torch.compile's, e.g.
    ``reduce-overhead`` for CUDA graphs); on a CPU under varlen the reference kernel as a custom op."""
    import wdspack
    from wdspack.models.compile import compile_decoder_layers, traceable_kernel

    if attention == "varlen" and device.type == "cpu":
        from wdspack.models.varlen import reference_varlen_attn

        other = copy.deepcopy(model)
        wdspack.use_varlen_attention(other, kernel=traceable_kernel(reference_varlen_attn))
    else:
        other = with_attention(model, attention, device)
        other = copy.deepcopy(model) if other is model else other
    return compile_decoder_layers(other, backend=backend, mode=None if mode == "default" else mode)


def measure_compile(modes: dict[str, tuple[Any, list[Step]]], *, sync: bool) -> dict[str, Any]:
    """The compile time: the compiled mode's first step less a warm eager packed step on the same batch (a cold
    one, paying its own first-call costs, made a tiny model's compile read negative); and
    dynamo's graph count then (``recompiles_after_first_step`` is the count at the end less this)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    (model, steps), (compiled, _) = modes["packed"], modes["packed_compiled"]
    train_step(model, steps[0].kwargs, sync=sync)  # the eager model's own first-call costs, not the reference's
    eager, _ = train_step(model, steps[0].kwargs, sync=sync)
    first, _ = train_step(compiled, steps[0].kwargs, sync=sync)
    return {"compile_seconds": round(first - eager, 2), "first_step_seconds": round(first, 2),
            "graphs_after_first_step": int(counters["stats"]["unique_graphs"])}


#: CUDA runtime calls in which the host waits for the GPU (the profiler lists them among its CPU events).
#: ``cudaMemcpyAsync`` is not one: a ``.item()`` is a ``cudaMemcpyAsync`` and then a ``cudaStreamSynchronize``,
#: counted once by the latter, and a host-to-device copy of pageable memory returns without waiting.
HOST_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")

#: The profiler's device kinds whose events are the GPU's own work (kernels, copies, memsets).
_DEVICE_KINDS = ("CUDA", "PrivateUse1", "XPU", "MTIA")


def gpu_busy_us(events: Any) -> float:
    """The device's own time in ``events`` (``key_averages()``): the kernels, copies and memsets alone.
    An operator's row (``aten::mm``) carries its kernels' time again as its "self" device time; counted
    with them it doubles the figure (a profile of H200 packed steps read 49 ms busy for 25 ms of kernels)."""
    return float(sum(e.self_device_time_total for e in events if getattr(e.device_type, "name", "") in _DEVICE_KINDS))


def host_waits(events: Any) -> int:
    """How often the host waited for the GPU in ``events``: the synchronising runtime calls
    (:data:`HOST_WAITS`, ``cudaMemcpy`` by its exact name)."""
    return int(sum(e.count for e in events if e.key in HOST_WAITS))


def profile_packed(model: Any, steps: list[Step], path: Path, *, sync: bool) -> dict[str, float]:
    """Three packed steps (after one untimed): their wall time unprofiled, then a torch profiler table by
    device time and one by the host's own time, headed by where a step's time goes: the GPU busy (its
    kernels' time, :func:`gpu_busy_us`) and the host's own CPU time (profiled, so above its unprofiled
    share) against the wall, and the host's waits for the GPU per step besides the two of the bench's
    own (:func:`train_step`'s closing synchronize and its reading of the loss). A GPU busy far less than
    the wall means the host sets the pace: the step costs what launching its kernels costs, whatever the
    tokens. Returns those figures."""
    from torch.profiler import ProfilerActivity, profile

    few = steps[:3]
    train_step(model, few[0].kwargs, sync=sync)
    wall = sum(train_step(model, step.kwargs, sync=sync)[0] for step in few) / len(few)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if sync else [])
    with profile(activities=activities, record_shapes=False) as prof:
        for step in few:
            train_step(model, step.kwargs, sync=sync)
    events = prof.key_averages()
    host_us = sum(e.self_cpu_time_total for e in events)
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx"))
    figures = {"step_wall_ms": round(wall * 1e3, 2), "gpu_busy_ms": round(gpu_busy_us(events) / 1e3 / len(few), 2),
               "host_cpu_ms": round(host_us / 1e3 / len(few), 2),
               "kernel_launches_per_step": round(launches / len(few), 1),
               "host_waits_per_step": round(host_waits(events) / len(few) - 2 * int(sync), 1)}
    busy, wall_ms = figures["gpu_busy_ms"], figures["step_wall_ms"]
    head = (f"packed step: {wall_ms:.1f} ms wall (unprofiled), GPU busy {busy:.1f} ms ({busy / wall_ms:.0%}), "
            f"the host's own CPU {figures['host_cpu_ms']:.1f} ms (profiled), "
            f"{figures['kernel_launches_per_step']:g} kernel launches, "
            f"the host waits on the GPU {figures['host_waits_per_step']:g} times per step")
    by_device = events.table(sort_by="self_device_time_total" if sync else "self_cpu_time_total", row_limit=30)
    by_host = events.table(sort_by="self_cpu_time_total", row_limit=30)
    path.write_text(f"{head}\n\nby device time:\n{by_device}\n\nby the host's own time:\n{by_host}\n")
    print(f"profile of {len(few)} packed steps: {path}\n{head}", flush=True)
    return figures


# ---------------------------------------------------------------------------------------------- timing


def train_step(model: Any, kwargs: dict[str, Any], *, sync: bool) -> tuple[float, float]:
    """Forward + backward (no optimizer step); ``(seconds, loss × targets)``."""
    t0 = time.perf_counter()
    model.zero_grad(set_to_none=True)
    loss = model(**kwargs).loss
    loss.backward()
    if sync:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return seconds, float(loss.detach())


def run_rounds(modes: dict[str, tuple[Any, list[Step]]], *, rounds: int, sync: bool, warmup_passes: int = 0,
               each: Callable[[dict[str, dict]], Any] | None = None,
               warm: Callable[[], Any] | None = None) -> dict[str, dict]:
    """``rounds`` passes over every mode's steps, interleaved step by step (the mode with the
    smallest share done goes next); per mode and round the seconds, and the summed loss. ``each`` is
    called with the timing so far after every round, ``warm`` once before the first. Untimed first:
    one step of every mode (allocator, thread pools), then ``warmup_passes`` whole passes (on CUDA,
    cuDNN builds a plan for every new attention shape: the first pass of pad-to-longest took 1.5-4x
    the next on an H200)."""

    def one_pass() -> tuple[dict[str, float], dict[str, float]]:
        done = dict.fromkeys(modes, 0)
        seconds = dict.fromkeys(modes, 0.0)
        loss = dict.fromkeys(modes, 0.0)
        while any(done[m] < len(modes[m][1]) for m in modes):
            name = min((m for m in modes if done[m] < len(modes[m][1])), key=lambda m: done[m] / len(modes[m][1]))
            model, steps = modes[name]
            step = steps[done[name]]
            s, mean = train_step(model, step.kwargs, sync=sync)
            seconds[name] += s
            loss[name] += mean * step.targets
            done[name] += 1
        return seconds, loss

    for model, steps in modes.values():
        train_step(model, steps[0].kwargs, sync=sync)
    for w in range(warmup_passes):
        seconds, _ = one_pass()
        print(f"warm-up pass {w + 1}/{warmup_passes} (untimed): " + ", ".join(f"{m} {seconds[m]:.1f} s" for m in modes),
              flush=True)
    if warm is not None:
        warm()
    out = {name: {"seconds": [], "loss_sum": []} for name in modes}
    for r in range(rounds):
        seconds, loss = one_pass()
        for name in modes:
            out[name]["seconds"].append(seconds[name])
            out[name]["loss_sum"].append(loss[name])
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{m} {seconds[m]:.1f} s" for m in modes), flush=True)
        if each is not None:
            each(out)
    return out


def summarize(modes: dict[str, tuple[Any, list[Step]]], timing: dict[str, dict], *,
              peak_tflops: float | None = None) -> dict[str, dict]:
    """Per mode: work, fill, tokens/s (best and median round), and with ``peak_tflops`` the model FLOPs
    utilisation ``6 · N · real tokens / seconds / peak`` of the best round."""
    res = {}
    for name, (model, steps) in modes.items():
        real, samples = sum(s.real_tokens for s in steps), sum(s.samples for s in steps)
        secs = timing[name]["seconds"]
        params = sum(p.numel() for p in model.parameters())
        res[name] = {"steps": len(steps), "samples": samples, "real_tokens": real,
                     "targets": sum(s.targets for s in steps), "computed_tokens": sum(s.slots for s in steps),
                     "fill": round(real / sum(s.slots for s in steps), 4),
                     "tokens_per_s": round(real / min(secs), 1),
                     "tokens_per_s_median": round(real / statistics.median(secs), 1),
                     "samples_per_s": round(samples / min(secs), 3), "seconds": [round(s, 2) for s in secs],
                     "loss_sum": timing[name]["loss_sum"][0],
                     "mfu": None if not peak_tflops else round(6 * params * real / min(secs) / (peak_tflops * 1e12), 4)}
    return res


def ratio(timing: dict[str, dict], a: str, b: str) -> dict[str, Any]:
    """Tokens/s of ``a`` over ``b`` per round (same real tokens, so the inverse ratio of seconds)."""
    per = [tb / ta for ta, tb in zip(timing[a]["seconds"], timing[b]["seconds"])]
    return {"median": round(statistics.median(per), 3), "min": round(min(per), 3), "max": round(max(per), 3),
            "per_round": [round(x, 3) for x in per]}


# ---------------------------------------------------------------------------------------------- main


def prepare(args: argparse.Namespace, work: Path, device: torch.device) -> tuple[dict, dict]:
    """Data, processor, model and every mode's steps; the configuration record."""
    from examples.make_demo_data import generate
    from wdspack.models import save_processor
    from wdspack.packer.config import PackConfig, RunOptions
    from wdspack.packer.job import pack_dataset
    from wdspack.packer.samples import SampleConfig

    generate(work / "data", records=args.records, seed=args.seed)
    sources = [str(work / "data" / "llava.jsonl"), str(work / "data" / "messages.jsonl")]
    name, proc_opts, model_opts = FAMILIES[args.family]
    tiny = importlib.import_module(f"examples.tiny_vlm.{name}")
    processor = tiny.processor(work / "tok", **proc_opts)
    folder = save_processor(processor, work / "processor")
    summary = pack_dataset(sources, str(work / "packed"), sample_config=SampleConfig(processor=str(folder)),
                           config=PackConfig(seq_len=args.seq_len, max_images=args.max_images,
                                             run=RunOptions(max_drop_fraction=1.0)),
                           progress=False)  # the demo's deliberately bad records, and chats over seq_len
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    built = (build_model(processor, hidden=args.hidden, layers=args.layers) if args.family == "qwen2_5_vl"
             else tiny.model(processor, **model_opts))
    model = built.to(device, dtype).train()
    model.set_attn_implementation("sdpa")
    attention, *others = args.attention.split(",")
    packed_model = with_attention(model, attention, device)
    packs = read_packs(work / "packed")
    subs = sub_samples(packs)
    steps, ids = packed_steps(work / "packed", folder, packed_model, batch_size=args.batch_size, packs=packs,
                              padding_free=attention == "varlen")
    order = [ids[i] for i in np.random.default_rng(args.seed).permutation(len(ids))]  # the arrival order
    lens = np.array([len(subs[s].input_ids) for s in ids])
    fill = sum(s.real_tokens for s in steps) / sum(s.slots for s in steps)
    b = args.padded_batch_size or max(1, round(args.batch_size * args.seq_len * fill / lens.mean()))
    modes = {"packed": (packed_model, steps),
             "pad_to_longest": (model, padded_steps(read_records(sources), subs, order, processor, model,
                                                    batch_size=b))}
    otf, _ = on_the_fly_steps(subs, order, folder, packed_model, batch_size=args.batch_size, seq_len=args.seq_len,
                              max_images=args.max_images, pad_token_id=processor.tokenizer.pad_token_id,
                              open_rows=args.otf_rows)
    modes["on_the_fly"] = (packed_model, otf)
    for other in others:  # the same packs under another attention (same batches, another model copy)
        alt = with_attention(model, other, device)
        modes[f"packed_{other}"] = (alt, packed_steps(work / "packed", folder, alt, batch_size=args.batch_size,
                                                      packs=packs, padding_free=other == "varlen")[0])
    if args.target_logits:  # the same batches and model, the LM head and loss on the target positions only
        modes["packed_target_logits"] = (packed_model, packed_steps(
            work / "packed", folder, packed_model, batch_size=args.batch_size, packs=packs,
            padding_free=attention == "varlen", logits="targets")[0])
    if args.compile:  # the same batches, a copy of the packed model with its decoder layers compiled once
        modes["packed_compiled"] = (compiled_model(model, attention, device, mode=args.compile,
                                                   backend=args.compile_backend), steps)
    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        fa2 = copy.deepcopy(model)
        fa2.set_attn_implementation("flash_attention_2")
        modes["packed_padding_free_fa2"] = (fa2, packed_steps(work / "packed", folder, fa2, batch_size=args.batch_size,
                                                              packs=packs, padding_free=True)[0])
    cp = None
    if args.cp:  # the same data packed for CP: its padding in the plan's budget
        again = pack_dataset(sources, str(work / "packed-cp"), sample_config=SampleConfig(processor=str(folder)),
                             config=PackConfig(seq_len=args.seq_len, max_images=args.max_images, cp=args.cp,
                                               run=RunOptions(max_drop_fraction=1.0)), progress=False)
        padding = json.loads((work / "packed-cp" / "manifest.json").read_text())["totals"]["cp_padding"]
        cp = cp_report(packs, work / "packed-cp", seq_len=args.seq_len, batch_size=args.batch_size, cp=args.cp,
                       padding_in_plan=padding)
        cp["planned"]["samples_packed"] = again.samples_packed
    images = sum(len(subs[s].images) for s in ids)
    params = sum(p.numel() for p in model.parameters())
    config = {
        "device": str(device), "device_name": device_name(device), "dtype": str(dtype).removeprefix("torch."),
        "attention": attention + (" (reference kernel on CPU)" if attention == "varlen" and
                                  device.type == "cpu" else ""),
        "other_attention": others, "target_logits": bool(args.target_logits),
        "compile": {"mode": args.compile, "backend": args.compile_backend} if args.compile else None,
        "peak_tflops": args.peak_tflops,
        "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        "model": {"class": type(model).__name__, "params": params, "hidden": args.hidden, "layers": args.layers,
                  "vocab": model.config.text_config.vocab_size,
                  "vision": "depth 2, hidden 64; 4-64 tokens per image"} if args.family == "qwen2_5_vl" else
                 {"class": type(model).__name__, "params": params, "family": args.family,
                  "hidden": model.config.text_config.hidden_size, "layers": model.config.text_config.num_hidden_layers,
                  "vocab": model.config.text_config.vocab_size, "vision": f"examples/tiny_vlm/{name}.py's tiny tower"},
        "data": {"records": args.records, "samples": len(ids),
                 "dropped_by_packer": summary.samples_read - summary.samples_packed,
                 "real_tokens": int(lens.sum()), "images": images,
                 "text_only_share": round(sum(not subs[s].images for s in ids) / len(ids), 3),
                 "tokens_mean": round(float(lens.mean()), 1), "tokens_median": int(np.median(lens)),
                 "tokens_p90": int(np.percentile(lens, 90)), "tokens_max": int(lens.max())},
        "seq_len": args.seq_len, "max_images": args.max_images, "batch_size": args.batch_size,
        "padded_batch_size": b, "otf_rows": args.otf_rows, "rounds": args.rounds,
        "warmup_passes": args.warmup_passes, "seed": args.seed,
        "optimizer_step": False,
    }
    if cp is not None:
        config["cp"] = cp
    return modes, config


def cp_list(text: str) -> list[int]:
    """``--cp``: ``N`` or ``N,M,...`` (each >= 1)."""
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cp {text!r}: a number of ranks, or several comma-separated") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"--cp {text!r}: every degree is a number of ranks, >= 1")
    return out


def family_name(text: str) -> str:
    """``--family``: a name of :data:`FAMILIES`."""
    if text not in FAMILIES:
        raise argparse.ArgumentTypeError(f"{text!r}: give one of {', '.join(FAMILIES)}")
    return text


def attention_list(text: str) -> str:
    """``--attention``: one of sdpa, varlen, flex, or several joined by commas (the first is the packed
    mode's; each other one adds a mode ``packed_<name>`` over the same batches)."""
    names = text.split(",")
    bad = [n for n in names if n not in ATTENTIONS]
    if bad or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more of {', '.join(ATTENTIONS)}, comma-separated, "
                                         "each once (e.g. varlen,sdpa)")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run: " + json.dumps(QUICK))
    ap.add_argument("--records", type=int, help=f"demo records to generate (default {DEFAULT['records']})")
    ap.add_argument("--seq-len", type=int, help=f"L (default {DEFAULT['seq_len']})")
    ap.add_argument("--max-images", type=int, default=16)
    ap.add_argument("--batch-size", type=int, help=f"packs per packed step, B (default {DEFAULT['batch_size']})")
    ap.add_argument("--padded-batch-size", type=int, help="samples per padded step (default: the same real tokens "
                                                          "per step as a packed step, on average)")
    ap.add_argument("--otf-rows", type=int, default=4, help="open rows of the on-the-fly packer (1: next-fit)")
    ap.add_argument("--hidden", type=int, help=f"text model width (default {DEFAULT['hidden']})")
    ap.add_argument("--layers", type=int, help=f"text model layers (default {DEFAULT['layers']})")
    ap.add_argument("--family", type=family_name, default="qwen2_5_vl",
                    help="the tiny processor and model of examples/tiny_vlm to pack and train (module docstring): "
                         + ", ".join(FAMILIES) + "; --hidden/--layers size qwen2_5_vl's alone")
    ap.add_argument("--rounds", type=int, help=f"timed passes over every mode (default {DEFAULT['rounds']})")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--attention", type=attention_list, default="sdpa",
                    help="attention of the packed and on-the-fly modes, or several comma-separated (module docstring; "
                         "pad-to-longest: sdpa)")
    ap.add_argument("--peak-tflops", type=float, help="the device's peak TFLOP/s for the model FLOPs utilisation "
                                                      "(default by device name: H100 989, A100 312; none on a CPU)")
    ap.add_argument("--target-logits", action="store_true",
                    help="add a mode packed_target_logits: the packed batches through model_inputs(..., "
                         "logits='targets'), the LM head and loss on the target positions only (one-row batches)")
    ap.add_argument("--compile", nargs="?", const="default", metavar="MODE",
                    help="add a mode packed_compiled: the packed batches through a copy of the model whose text "
                         "decoder layers are compiled once (wdspack.models.compile.compile_decoder_layers); MODE: "
                         "torch.compile's (default; reduce-overhead: CUDA graphs); the compile time is reported")
    ap.add_argument("--compile-backend", default="inductor", help="torch.compile's backend for --compile")
    ap.add_argument("--profile", help="write a torch profiler table of three packed steps to this file")
    ap.add_argument("--warmup-passes", type=int, help="untimed passes over every mode before the rounds (default: 1 "
                    "on CUDA, where cuDNN plans each new attention shape once; 0 on a CPU)")
    ap.add_argument("--cp", type=cp_list, metavar="N",
                    help="add context-parallel figures for N ranks (per-rank activation tokens and the 2·cp padding, "
                         "load-time and planned with --cp N; no processes): config.cp; with --long-video several, "
                         "comma-separated (default 2,4,8)")
    ap.add_argument("--long-video", action="store_true",
                    help="plan only (no model, no training step): the --cp figures on a long-video mix (module "
                         f"docstring; defaults {json.dumps(LONG_VIDEO)}, --quick {json.dumps(LONG_VIDEO_QUICK)})")
    ap.add_argument("--videos", type=int, help="--long-video: the video chats")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    if args.long_video and args.family != "qwen2_5_vl":
        raise SystemExit(f"--long-video plans with Qwen2.5-VL's video settings, not --family {args.family}'s; "
                         "leave --family out")
    if args.long_video:
        return long_video_main(args)
    if args.cp and len(args.cp) > 1:
        raise SystemExit(f"--cp {','.join(map(str, args.cp))}: one degree with the training modes (several with "
                         "--long-video)")
    args.cp = args.cp[0] if args.cp else None
    sized = [f"--{k}" for k in ("hidden", "layers") if getattr(args, k) is not None]
    if args.family != "qwen2_5_vl" and sized:
        raise SystemExit(f"{' and '.join(sized)}: --family {args.family}'s tiny model has its example's sizes "
                         f"(examples/tiny_vlm/{FAMILIES[args.family][0]}.py); leave them out, or use --family "
                         "qwen2_5_vl")
    for key, value in (QUICK if args.quick else DEFAULT).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.target_logits and not args.attention.startswith("varlen") and args.batch_size != 1:
        raise SystemExit(f"--target-logits needs one-row batches: --attention varlen (padding-free) or --batch-size 1 "
                         f"(not {args.batch_size} rows under {args.attention.split(',')[0]})")
    device = torch.device(args.device)
    if args.warmup_passes is None:
        args.warmup_passes = int(device.type == "cuda")
    if args.peak_tflops is None:
        args.peak_tflops = default_peak(device)
    work = Path(tempfile.mkdtemp(prefix="bench-train-"))
    try:
        t0 = time.perf_counter()
        modes, config = prepare(args, work, device)
        print(f"prepared in {time.perf_counter() - t0:.0f} s: " + json.dumps(config), flush=True)
        if args.compile:
            config["compile"].update(measure_compile(modes, sync=device.type == "cuda"))
            print(f"compiled in {config['compile']['compile_seconds']:.1f} s", flush=True)

        def profile() -> None:  # after the warm-up: the steady state
            config["profile"] = profile_packed(*modes["packed"], Path(args.profile), sync=device.type == "cuda")

        latest: dict[str, Any] = {}

        def record(timing: dict[str, dict]) -> None:  # after every round: a run stopped early keeps what it did
            latest.update(results(modes, timing, config, peak_tflops=args.peak_tflops,
                                  seconds=time.perf_counter() - t0))
            if args.json:
                Path(args.json).write_text(json.dumps(latest, indent=1) + "\n")

        run_rounds(modes, rounds=args.rounds, sync=device.type == "cuda", warmup_passes=args.warmup_passes, each=record,
                   warm=profile if args.profile else None)
        print_table(latest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def long_video_main(args: argparse.Namespace) -> int:
    for key, value in (LONG_VIDEO_QUICK if args.quick else LONG_VIDEO).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.cp = args.cp or [2, 4, 8]
    args.batch_size = args.batch_size or 1
    for cp in args.cp:
        if args.seq_len % (2 * cp):
            raise SystemExit(f"--seq-len {args.seq_len} is not a multiple of 2·cp = {2 * cp} (--cp {cp})")
    work = Path(tempfile.mkdtemp(prefix="bench-train-video-"))
    try:
        res = long_video(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    print_long_video(res)
    return 0


def results(modes: dict[str, tuple[Any, list[Step]]], timing: dict[str, dict], config: dict, *,
            peak_tflops: float | None, seconds: float) -> dict[str, Any]:
    """The bench's record from the rounds timed so far."""
    res = {"config": config, "modes": summarize(modes, timing, peak_tflops=peak_tflops),
           "ratios": {"packed_vs_pad_to_longest": ratio(timing, "packed", "pad_to_longest"),
                      "packed_vs_on_the_fly": ratio(timing, "packed", "on_the_fly")},
           "fill_bound": round(modes_fill(modes, "packed") / modes_fill(modes, "pad_to_longest"), 3),
           "rounds_done": len(timing["packed"]["seconds"]),
           "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
           "seconds_total": round(seconds, 1)}
    for name in modes:
        if name.startswith("packed_") and name != "packed_padding_free_fa2":
            res["ratios"][f"{name}_vs_pad_to_longest"] = ratio(timing, name, "pad_to_longest")
    if "packed_target_logits" in modes:
        res["ratios"]["packed_target_logits_vs_packed"] = ratio(timing, "packed_target_logits", "packed")
    if "packed_compiled" in modes:
        from torch._dynamo.utils import counters

        res["ratios"]["packed_compiled_vs_packed"] = ratio(timing, "packed_compiled", "packed")
        res["recompiles_after_first_step"] = (int(counters["stats"]["unique_graphs"])
                                              - config["compile"]["graphs_after_first_step"])
    if "packed_padding_free_fa2" in modes:
        res["ratios"]["fa2_padding_free_vs_pad_to_longest"] = ratio(timing, "packed_padding_free_fa2", "pad_to_longest")
    return res


def modes_fill(modes: dict[str, tuple[Any, list[Step]]], name: str) -> float:
    steps = modes[name][1]
    return sum(s.real_tokens for s in steps) / sum(s.slots for s in steps)


def print_table(res: dict) -> None:
    print("\n| mode | steps | real tokens | fill | real tokens/s | samples/s | MFU |\n"
          "|---|---:|---:|---:|---:|---:|---:|")
    for name, m in res["modes"].items():
        mfu = "-" if m["mfu"] is None else f"{m['mfu']:.1%}"
        print(f"| {name} | {m['steps']} | {m['real_tokens']:,} | {m['fill']:.1%} | {m['tokens_per_s']:,.0f} | "
              f"{m['samples_per_s']:.2f} | {mfu} |")
    for name, r in res["ratios"].items():
        print(f"{name}: {r['median']:.2f}× (rounds {r['min']:.2f}-{r['max']:.2f})")
    if "cp" in res["config"]:
        c = res["config"]["cp"]
        for key in ("load_time", "planned"):
            f = c[key]
            print(f"cp {c['cp']} ({key.replace('_', ' ')}): tokens per rank max {f['rank_tokens']['max']} mean "
                  f"{f['rank_tokens']['mean']} (real max {f['rank_real_tokens']['max']} mean "
                  f"{f['rank_real_tokens']['mean']}); 2·cp padding at load {f['padding_tokens']} tokens "
                  f"({f['padding_share']:.2%})" + (f", {f['padding_in_plan']} in the plan's budget, {f['packs']} packs "
                                                    f"vs {c['packs']}" if key == "planned" else ""))
    print(f"fill bound (packed fill / pad-to-longest fill): {res['fill_bound']:.2f}×; packed reaches "
          f"{res['ratios']['packed_vs_pad_to_longest']['median'] / res['fill_bound']:.2f} of it")
    if "packed_compiled_vs_pad_to_longest" in res["ratios"]:
        reached = res["ratios"]["packed_compiled_vs_pad_to_longest"]["median"] / res["fill_bound"]
        print(f"packed_compiled reaches {reached:.2f} of the fill bound; recompiles after its first step: "
              f"{res['recompiles_after_first_step']}")
        compiled, eager = res["modes"]["packed_compiled"]["loss_sum"], res["modes"]["packed"]["loss_sum"]
        print(f"summed loss: packed_compiled {compiled:.6f}, packed (eager) {eager:.6f} "
              f"(relative difference {abs(compiled - eager) / abs(eager):.1e})")


if __name__ == "__main__":
    sys.exit(main())
