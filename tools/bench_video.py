"""Video benchmark (issue #40, item 7): the header probe, what a pack stores per video, decode throughput.

    python -m tools.bench_video                  # 20 s 640×360 30 fps clips, h264/mp4 and vp9/webm (~2-4 min)
    python -m tools.bench_video --json docs/benchmarks/data/bench_video.json
    python -m tools.bench_video --small --repeats 1 --rounds 1     # tiny clips: the smoke test
    python -m tools.bench_video --parts pack,loader                # only items 4 and 5

Clips are made here with PyAV, deterministic: a photo-like texture (smoothed noise at three scales)
panned across the frame with a moving block on it. Plans are Qwen2.5-VL's (``plan_qwen2_vl`` with
its published video settings: 2 frames a second, 128 to 768 patches of 28 px per frame). Times are
medians over ``--repeats`` (the things compared timed in turn), one torch thread (as in a DataLoader worker);
every ratio compares figures of the same run.

1. **probe**: ``read_header`` per video (the mp4's header gives the frame count, its packets demuxed to find
   their data whole; the webm's packets are counted) against decoding the whole video with PyAV, frames to RGB
   and decode only.
2. **storage**: per video, (a) the original bytes plus the planned frame indices (int32) against
   (b) the planned frames themselves at the planned size (raw uint8, and PNG); the loader's cost
   for each: (a) decode the planned frames and resize them (each step alone too, and item 3's
   baseline's steps, ``pyav_decode`` and ``pyav_resize``), (b) read the stored frames.
3. **workers**: N processes side by side (fork, started at a barrier, one torch thread each as in a
   DataLoader worker), each decoding its share of the videos' planned frames and resizing them with
   wdspack's functions (``worker=``, a parameter: the loader-driven version swaps it), against N plain
   PyAV processes doing the same frames (``container.decode``, ``to_ndarray("rgb24")`` of the wanted
   frames, ``torch.nn.functional.interpolate``); aggregate frames/s, ``--rounds`` interleaved, the
   median round (``of_pyav``), and frames per CPU second (``of_pyav_cpu``, the median round: less moved
   by other work on the host). Both sides must give the same pixels (``same_pixels``).

4. **pack**: ``--chats`` video chats of those clips and ``--small-chats`` of 3 s 96×64 clips (LLaMA-Factory's
   layout, a clip file each) packed by ``pack_dataset`` with the tiny Qwen2.5-VL processor folder
   (``examples/tiny_vlm``) and ``VideoSettings(fps=2.0)``, one worker, in this process, against the floor:
   the same records rendered with the chat template, each video's tokens put in, tokenized once (what any
   packer must do); called in turn, samples/s wall and per CPU second. Per record, what the job does
   besides: the header probe, reading the records with their videos' bytes, writing those into a shard.
5. **loader**: ``make_loader(dataset, processor=folder, num_workers=N, batch_size=1)`` over the ``--chats``
   packed (a video a pack, a pack a shard), persistent workers started before the clock: the planned frames
   of its batches per second, against N plain PyAV processes (item 3's baseline) on the same videos, as in
   item 3 (CPU: the loader's workers and the main process). Then one epoch in this process under cProfile:
   ``ModelBatcher.pack_parts`` and its steps (``profile_1w``).

wdspack's decode and resize are ``wdspack.media.video.pixels.decode_frames`` / ``resize_frames``;
where that module is missing, a local equivalent stands in and ``decoder`` says so.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wdspack.media.video import prepare as video_prepare
from wdspack.media.video.plan import QwenVideoSampling, VideoPlan, plan_qwen2_vl, read_header

#: Qwen2.5-VL's published ``video_preprocessor_config.json``: 2 frames a second, 128-768 patches of 28 px
QWEN25_VL_VIDEO = QwenVideoSampling(do_sample_frames=True, fps=2.0, min_pixels=128 * 28 * 28, max_pixels=768 * 28 * 28)

#: the clips: (container, codec, encoder options)
KINDS = {"mp4": ("h264", {}), "webm": ("libvpx-vp9", {"deadline": "realtime", "cpu-used": "8"})}

#: the benchmark's parts, in the order they run (``--parts``)
PARTS = ("probe", "storage", "workers", "pack", "loader")
#: the packed datasets' tokens per pack: one 20 s clip's 5 980 video tokens and its chat fit, two do not
SEQ_LEN = 8192

#: a worker's task: one video's bytes and plan in, its frames resized out (``[T, 3, h, w]`` uint8)
Worker = Callable[[bytes, VideoPlan], torch.Tensor]


def _texture(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Photo-like: smooth noise at three scales (bilinear-upsampled), uint8 ``[height, width, 3]``."""
    out = torch.zeros(1, 3, height, width)
    for scale, amp in ((64, 110.0), (16, 60.0), (4, 30.0)):
        small = torch.from_numpy(rng.random((1, 3, height // scale + 2, width // scale + 2), dtype=np.float32))
        out += amp * torch.nn.functional.interpolate(small, size=(height, width), mode="bilinear")
    return out.clamp(0, 255).to(torch.uint8)[0].permute(1, 2, 0).contiguous().numpy()


def make_clip(kind: str, *, seconds: float, fps: int, width: int, height: int, seed: int = 0) -> bytes:
    """A clip of deterministic frames: a texture panned 2 px a frame (and bobbing), a red block crossing it.

    The webm's bytes are the same every run; x264 here varies by a few bytes from run to run.

    Example:
        >>> len(make_clip("mp4", seconds=1, fps=10, width=64, height=48)) > 0
        True
    """
    import av

    codec, options = KINDS[kind]
    frames = round(seconds * fps)
    texture = _texture(np.random.default_rng(seed), height + 32, width + 2 * frames)
    buf = io.BytesIO()
    with av.open(buf, "w", format=kind, options={"fflags": "+bitexact"}) as out:  # no random ids, no dates
        stream = out.add_stream(codec, rate=Fraction(fps))
        assert isinstance(stream, av.video.stream.VideoStream)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = dict(options)
        for k in range(frames):
            top = 16 + round(15 * np.sin(k / 20))
            pixels = texture[top: top + height, 2 * k: 2 * k + width].copy()
            side = max(4, height // 6)
            x = (k * 5) % max(1, width - side)
            pixels[height // 3: height // 3 + side, x: x + side] = (230, 40, 40)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


@functools.cache
def pixel_functions() -> tuple[Callable[..., np.ndarray], Callable[..., torch.Tensor], str]:
    """wdspack's ``decode_frames`` and ``resize_frames``, and where they came from."""
    try:
        from wdspack.media.video.pixels import decode_frames, resize_frames
    except ImportError:
        # the baseline's own steps stand in (the same frames, the same resize kernel)
        return pyav_decode, _resize_view, "local PyAV equivalent (wdspack.media.video.pixels missing)"
    return decode_frames, resize_frames, "wdspack.media.video.pixels"


def wdspack_worker(data: bytes, plan: VideoPlan) -> torch.Tensor:
    """The planned frames decoded and resized with wdspack's functions."""
    decode_frames, resize_frames, _ = pixel_functions()
    return resize_frames(decode_frames(data, plan.indices), plan.height, plan.width)


def _resize_view(frames: np.ndarray, height: int, width: int) -> torch.Tensor:
    """The baseline's resize: ``interpolate`` on the frames as they come (a channels-last view, no copy)."""
    x = torch.from_numpy(frames).permute(0, 3, 1, 2)
    return torch.nn.functional.interpolate(x, size=(height, width), mode="bicubic", antialias=True)


def pyav_decode(data: bytes, indices: Sequence[int]) -> np.ndarray:
    """The baseline's decode: ``container.decode`` in order, the wanted frames to RGB, up to the last one."""
    import av

    wanted, last, frames = set(indices), indices[-1], []
    with av.open(io.BytesIO(data), "r") as container:
        for k, frame in enumerate(container.decode(video=0)):
            if k in wanted:
                frames.append(frame.to_ndarray(format="rgb24"))
            if k >= last:
                break
    return np.stack(frames)


def pyav_worker(data: bytes, plan: VideoPlan) -> torch.Tensor:
    """The baseline: plain PyAV (``container.decode``, the wanted frames to RGB) and a torch resize."""
    return _resize_view(pyav_decode(data, plan.indices), plan.height, plan.width)


def median_ms(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Milliseconds of each ``fns[name]()``: the median of ``repeats`` calls, the functions called in turn
    (interleaved: a load that comes and goes on a shared host hits all alike), after one warm-up call each."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: round(statistics.median(t) * 1000, 2) for name, t in times.items()}


def decode_all(data: bytes, *, rgb: bool) -> int:
    """Every frame decoded (and converted to RGB with ``rgb``); the count."""
    import av

    count = 0
    with av.open(io.BytesIO(data), "r") as container:
        for frame in container.decode(video=0):
            if rgb:
                frame.to_ndarray(format="rgb24")
            count += 1
    return count


def measure_probe(data: bytes, repeats: int) -> dict:
    """``read_header`` against decoding the whole video (decode only; frames to RGB)."""
    header = read_header(data)
    decoded = decode_all(data, rgb=False)
    ms = median_ms({"probe": lambda: read_header(data), "decode": lambda: decode_all(data, rgb=False),
                    "decode_rgb": lambda: decode_all(data, rgb=True)}, repeats)
    return {"header_frames": header.frames, "decoded_frames": decoded, "probe_ms": ms["probe"],
            "decode_ms": ms["decode"], "decode_rgb_ms": ms["decode_rgb"],
            "decode_over_probe": round(ms["decode"] / ms["probe"], 1),
            "decode_rgb_over_probe": round(ms["decode_rgb"] / ms["probe"], 1)}


def stored_frames(frames: torch.Tensor) -> tuple[bytes, list[bytes]]:
    """What option (b) stores: the resized frames as raw uint8 ``[T, 3, h, w]``, and as one PNG each."""
    from PIL import Image

    pngs = []
    for f in frames.permute(0, 2, 3, 1).numpy():
        buf = io.BytesIO()
        Image.fromarray(f).save(buf, format="PNG")
        pngs.append(buf.getvalue())
    return frames.contiguous().numpy().tobytes(), pngs


def read_raw(raw: bytes, plan: VideoPlan) -> torch.Tensor:
    """Option (b), raw: the stored bytes copied out as ``[T, 3, h, w]``."""
    return torch.from_numpy(np.frombuffer(raw, np.uint8).reshape(len(plan.indices), 3, plan.height, plan.width).copy())


def read_pngs(pngs: list[bytes]) -> torch.Tensor:
    """Option (b), PNG: each stored frame decoded, as ``[T, 3, h, w]``."""
    from PIL import Image

    return torch.from_numpy(np.stack([np.asarray(Image.open(io.BytesIO(p))) for p in pngs])).permute(0, 3, 1, 2)


def measure_storage(data: bytes, plan: VideoPlan, repeats: int) -> dict:
    """Bytes per video and the loader's cost per video: (a) original + indices, (b) the planned frames stored."""
    frames = wdspack_worker(data, plan)
    raw, pngs = stored_frames(frames)
    if not (torch.equal(read_raw(raw, plan), frames) and torch.equal(read_pngs(pngs), frames)):
        raise AssertionError("the stored frames do not read back as the decoded ones")
    original = len(data) + len(np.asarray(plan.indices, np.int32).tobytes())
    png = sum(len(p) for p in pngs)
    decode_frames, resize_frames, _ = pixel_functions()
    decoded = decode_frames(data, plan.indices)
    ms = median_ms({"a_decode_resize": lambda: wdspack_worker(data, plan),
                    "a_decode": lambda: decode_frames(data, plan.indices),
                    "a_resize": lambda: resize_frames(decoded, plan.height, plan.width),
                    "pyav_decode": lambda: pyav_decode(data, plan.indices),
                    "pyav_resize": lambda: _resize_view(decoded, plan.height, plan.width),
                    "b_read_raw": lambda: read_raw(raw, plan), "b_read_png": lambda: read_pngs(pngs)}, repeats)
    return {"a_original_plus_indices_bytes": original, "b_raw_bytes": len(raw), "b_png_bytes": png,
            "raw_over_original": round(len(raw) / original, 2), "png_over_original": round(png / original, 2),
            **{f"{name}_ms": v for name, v in ms.items()},
            "decode_over_png_read": round(ms["a_decode_resize"] / ms["b_read_png"], 2),
            "decode_over_raw_read": round(ms["a_decode_resize"] / ms["b_read_raw"], 1)}


def _share(worker: Worker, jobs: list[tuple[bytes, VideoPlan]], share: slice, start, out) -> None:
    torch.set_num_threads(1)  # as a DataLoader worker runs
    mine = jobs[share]
    if mine:
        worker(*mine[0])  # warm: imports and first-call costs before the clock
    start.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    frames = sum(int(worker(data, plan).shape[0]) for data, plan in mine)
    out.put((t0, time.perf_counter(), frames, time.process_time() - c0))


def side_by_side(jobs: list[tuple[bytes, VideoPlan]], processes: int, *, worker: Worker = wdspack_worker
                 ) -> tuple[float, int, float]:
    """Aggregate frames/s of ``processes`` processes started together (fork), each running ``worker`` on
    every ``processes``-th video, from the first start to the last finish; the frames delivered; and
    the processes' CPU seconds (all their threads).

    Example:
        >>> rate, frames, cpu_s = side_by_side(jobs, 2, worker=pyav_worker)  # doctest: +SKIP
    """
    ctx = mp.get_context("fork")
    start, out = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_share, args=(worker, jobs, slice(i, None, processes), start, out))
             for i in range(processes)]
    for p in procs:
        p.start()
    got = [out.get() for _ in procs]
    for p in procs:
        p.join()
    frames = sum(g[2] for g in got)
    return frames / (max(g[1] for g in got) - min(g[0] for g in got)), frames, sum(g[3] for g in got)


def measure_workers(jobs: list[tuple[bytes, VideoPlan]], *, workers: Sequence[int], rounds: int,
                    worker: Worker = wdspack_worker, baseline: Worker = pyav_worker) -> dict:
    """``worker`` against ``baseline`` side by side at each process count, interleaved (which goes first
    alternates); the median round by frames/s, and the median ratio of frames per CPU second."""
    out: dict = {}
    runs: dict[int, list[tuple[float, float]]] = {n: [] for n in workers}
    cpu: dict[int, list[float]] = {n: [] for n in workers}
    frames: dict[int, int] = {}
    for r in range(rounds):  # interleaved: the host's load moves both alike
        for n in workers:
            pair = {}
            for name in (("baseline", "ours") if r % 2 == 0 else ("ours", "baseline")):
                pair[name] = side_by_side(jobs, n, worker=baseline if name == "baseline" else worker)
            frames[n] = pair["ours"][1]
            runs[n].append((pair["ours"][0], pair["baseline"][0]))
            cpu[n].append(pair["baseline"][2] / pair["ours"][2])  # the same frames: CPU seconds, inverted
    for n in workers:
        ratios = [o / b for o, b in runs[n]]
        mid = sorted(range(rounds), key=lambda k: ratios[k])[(rounds - 1) // 2]  # the median round
        ours, base = runs[n][mid]
        out[f"{n}w"] = {"frames": frames[n], "wdspack_frames_per_s": round(ours, 1),
                        "pyav_frames_per_s": round(base, 1), "of_pyav": round(ours / base, 3),
                        "of_pyav_cpu": round(statistics.median(cpu[n]), 3),
                        "of_pyav_runs": [round(x, 3) for x in ratios],
                        "of_pyav_cpu_runs": [round(x, 3) for x in cpu[n]]}
    return out


# ---- 4. the pack job on video chats, against the render + tokenize floor --------------------------------------


def write_video_chats(folder: Path, clips: Sequence[tuple[str, bytes]], chats: int, *, seed: int = 0) -> Path:
    """``chats.jsonl`` in LLaMA-Factory's ``mllm_video_demo.json`` layout (``<video>`` + ``videos``) and
    ``clips/``: chat ``k`` asks about ``clips[k % len(clips)]`` (a file of its own) and gets 10-60 words.

    Example:
        >>> write_video_chats(Path("/tmp/v"), [("mp4", clip)], 4)  # doctest: +SKIP
        PosixPath('/tmp/v/chats.jsonl')
    """
    rng = np.random.default_rng(seed)
    words = "the red block moves right across a textured scene while the view pans slowly and bobs".split()
    (folder / "clips").mkdir(parents=True, exist_ok=True)
    lines = []
    for k in range(chats):
        kind, data = clips[k % len(clips)]
        name = f"clips/c{k:04d}.{kind}"
        (folder / name).write_bytes(data)
        answer = " ".join(rng.choice(words, int(rng.integers(10, 61)))).capitalize() + "."
        lines.append(json.dumps({"id": f"v{k}", "messages": [
            {"role": "user", "content": "<video>What happens in this video?"},
            {"role": "assistant", "content": answer}], "videos": [name]}))
    path = folder / "chats.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def tiny_processor(folder: Path) -> Path:
    """The tiny Qwen2.5-VL processor (``examples/tiny_vlm``: the real classes, the tekken tokenizer), saved with
    :data:`QWEN25_VL_VIDEO` as its ``video_preprocessor_config.json`` (the pack job reads it as transformers does)."""
    from examples.tiny_vlm import qwen2_5_vl
    from wdspack.models import save_processor

    out = save_processor(qwen2_5_vl.processor(folder / "tok"), folder / "processor")
    v = QWEN25_VL_VIDEO
    (out / "video_preprocessor_config.json").write_text(json.dumps({
        "video_processor_type": "Qwen2VLVideoProcessor", "do_sample_frames": v.do_sample_frames, "fps": v.fps,
        "min_frames": v.min_frames, "max_frames": v.max_frames, "patch_size": v.patch_size,
        "temporal_patch_size": v.temporal_patch_size, "merge_size": v.merge_size,
        "size": {"shortest_edge": v.min_pixels, "longest_edge": v.max_pixels}}, indent=2) + "\n")
    return out


def video_sample_config(processor: Path) -> Any:
    """The pack job's settings here: the processor folder, videos at 2 frames a second (``--video-fps 2``)."""
    from wdspack.media.video.plan import VideoSettings
    from wdspack.packer.samples import SampleConfig

    return SampleConfig(processor=str(processor), video=VideoSettings(fps=2.0))


def _records(path: Path) -> list[Any]:
    from wdspack.packer.sources import list_partitions
    from wdspack.packer.sources.readers import iter_records

    return [r for p in list_partitions([str(path)], records_per_partition=10**9) for r in iter_records(p)]


def video_chat_floor(builder: Any, path: Path) -> tuple[Callable[[], int], int]:
    """The floor, what any packer must do per record: render the chat template once, put each video's
    tokens in its placeholder's place (computed beforehand: planning is not the floor's), tokenize the
    text once. Also the tokens the floor gives in all (the packed samples' count, checked by the caller)."""
    items = []
    for r in _records(path):
        _, plans = video_prepare.probe(builder, tuple(r.videos), r.sample_id)
        reps = [builder.video_side.replacement(builder.processor, p) for p in plans]
        items.append(([builder._message(m) for m in r.messages], reps))
    tok, template, holder = builder.tokenizer, builder.template, builder.video_token

    def run() -> int:
        tokens = 0
        for messages, reps in items:
            pieces = tok.apply_chat_template(messages, chat_template=template, tokenize=False).split(holder)
            tokens += len(tok("".join(p + r for p, r in zip(pieces, [*reps, ""])), add_special_tokens=False).input_ids)
        return tokens
    return run, run()


def pack_video_chats(path: Path, processor: Path, out: Path, *, seq_len: int, max_images: int,
                     shard_max_packs: int | None = None) -> Any:
    """``pack_dataset`` of the chats with the processor folder, one worker (in this process)."""
    from wdspack.packer.config import PackConfig, RunOptions
    from wdspack.packer.job import pack_dataset

    shutil.rmtree(out, ignore_errors=True)
    config = PackConfig(seq_len=seq_len, max_images=max_images, shard_max_packs=shard_max_packs, on_error="raise",
                        run=RunOptions(workers=1))
    return pack_dataset([str(path)], str(out), sample_config=video_sample_config(processor), config=config)


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def measure_pack(path: Path, processor: Path, work: Path, *, seq_len: int, repeats: int) -> dict:
    """The pack job's samples/s against the floor's (called in turn, ``repeats`` rounds; wall and this
    process's CPU seconds, medians), and per record what the job does besides: the header probe of its
    video, reading the records with their videos' bytes, writing those bytes into a shard."""
    from wdspack.format.tar import ShardWriter
    from wdspack.packer.samples import get_builder

    builder = get_builder(video_sample_config(processor))
    floor, floor_tokens = video_chat_floor(builder, path)
    out = work / "packed"
    summary = pack_video_chats(path, processor, out, seq_len=seq_len, max_images=16)  # warm: the builder is cached
    n = summary.samples_packed
    times: dict[str, list[tuple[float, float]]] = {"floor": [], "pack": []}
    for r in range(repeats):
        for name in (("floor", "pack") if r % 2 == 0 else ("pack", "floor")):
            fn = floor if name == "floor" else functools.partial(pack_video_chats, path, processor, out,
                                                                 seq_len=seq_len, max_images=16)
            times[name].append(_timed(fn))
    records = _records(path)
    videos = [v for r in records for v in r.videos]

    def write() -> None:
        with ShardWriter(str(work / "videos.tar")) as w:
            for k, v in enumerate(videos):
                w.add(f"{k:06d}", v, samples=1, tokens=0, images=0, videos=1)

    rest = median_ms({"probe": lambda: [read_header(v) for v in videos], "read": lambda: _records(path),
                      "write": write}, repeats)
    wall = {k: statistics.median(t[0] for t in v) for k, v in times.items()}
    cpu = {k: statistics.median(t[1] for t in v) for k, v in times.items()}
    return {"records": len(records), "videos": len(videos), "samples_packed": n,
            "tokens": summary.tokens, "floor_tokens": floor_tokens,
            "video_mb": round(sum(len(v) for v in videos) / 1e6, 2),
            "pack_samples_per_s": round(n / wall["pack"], 1), "floor_samples_per_s": round(n / wall["floor"], 1),
            "pack_of_floor": round(wall["floor"] / wall["pack"], 3),
            "pack_samples_per_cpu_s": round(n / cpu["pack"], 1), "floor_samples_per_cpu_s": round(n / cpu["floor"], 1),
            "pack_of_floor_cpu": round(cpu["floor"] / cpu["pack"], 3),
            "pack_of_floor_cpu_runs": [round(f[1] / p[1], 3) for f, p in zip(times["floor"], times["pack"])],
            "per_record_ms": {"pack": round(wall["pack"] * 1000 / n, 2), "floor": round(wall["floor"] * 1000 / n, 2),
                              **{k: round(v / len(records), 2) for k, v in rest.items()}}}


# ---- 5. the loader's frames/s, its workers against plain PyAV processes ---------------------------------------


def _children() -> set[int]:
    """This process's child processes (Linux ``/proc``)."""
    pids: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in (task / "children").read_text().split())
    return pids


def _cpu_seconds(pids: set[int]) -> float:
    """User + system CPU seconds of the processes so far (``/proc/PID/stat`` fields 14 and 15)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def planned_frames(batch: dict, temporal_patch_size: int = 2) -> int:
    """The frames a batch's videos were planned with: grid ``t`` × the temporal patch (Qwen2/2.5-VL's
    plans take an even count of frames, so this is the plan's count)."""
    grid, mask = batch["video_grid_thw"], batch["video_mask"]
    return int(grid[..., 0][mask].sum()) * temporal_patch_size


class LoaderRun:
    """A ``make_loader(dataset, processor=folder, num_workers=n, batch_size=1)`` kept alive (persistent
    workers) so each :meth:`epoch` times decoding alone, not the workers' start."""

    def __init__(self, dataset: Path, processor: Path, workers: int, *, pixel_dtype: str = "float32") -> None:
        from wdspack import make_loader

        before = _children()
        self.loader = make_loader(str(dataset), batch_size=1, num_workers=workers, shuffle=False,
                                  processor=str(processor), pixel_dtype=pixel_dtype)
        self.frames = self.epoch()[1]  # warm: workers started, the processor loaded in each
        self.pids = _children() - before

    def epoch(self) -> tuple[float, int, float]:
        """One epoch: frames/s (planned frames over wall time), the frames, and the CPU seconds of the
        workers and this process together."""
        pids: set[int] = getattr(self, "pids", set())
        t0, c0, w0 = time.perf_counter(), time.process_time(), _cpu_seconds(pids)
        frames = sum(planned_frames(b) for b in self.loader)
        wall = time.perf_counter() - t0
        return frames / wall, frames, time.process_time() - c0 + _cpu_seconds(pids) - w0


def measure_loader(dataset: Path, processor: Path, jobs: list[tuple[bytes, VideoPlan]], *, workers: Sequence[int],
                   rounds: int, pixel_dtype: str = "float32") -> dict:
    """The loader at each worker count against the plain PyAV processes (:func:`side_by_side` with
    :func:`pyav_worker`) on the same videos and plans, interleaved; reported as :func:`measure_workers` does.
    ``pixel_dtype="uint8"``: the workers ship the resized bytes (normalised later, on the device)."""
    runs = {n: LoaderRun(dataset, processor, n, pixel_dtype=pixel_dtype) for n in workers}
    want = sum(len(p.indices) for _, p in jobs)
    out: dict = {}
    for run in runs.values():
        if run.frames != want:
            raise AssertionError(f"the loader gave {run.frames} planned frames, the plain processes {want}")
    ratios: dict[int, list[tuple[float, float]]] = {n: [] for n in workers}
    cpu: dict[int, list[float]] = {n: [] for n in workers}
    for r in range(rounds):
        for n in workers:
            pair = {}
            for name in (("baseline", "loader") if r % 2 == 0 else ("loader", "baseline")):
                pair[name] = side_by_side(jobs, n, worker=pyav_worker) if name == "baseline" else runs[n].epoch()
            ratios[n].append((pair["loader"][0], pair["baseline"][0]))
            cpu[n].append(pair["baseline"][2] / pair["loader"][2])
    for n in workers:
        of = [a / b for a, b in ratios[n]]
        mid = sorted(range(rounds), key=lambda k: of[k])[(rounds - 1) // 2]
        ours, base = ratios[n][mid]
        out[f"{n}w"] = {"frames": want, "loader_frames_per_s": round(ours, 1), "pyav_frames_per_s": round(base, 1),
                        "of_pyav": round(ours / base, 3), "of_pyav_cpu": round(statistics.median(cpu[n]), 3),
                        "of_pyav_runs": [round(x, 3) for x in of], "of_pyav_cpu_runs": [round(x, 3) for x in cpu[n]]}
    return out


def profile_loader(dataset: Path, processor: Path) -> dict:
    """Where one worker's time goes: an epoch of the loader in this process (``num_workers=0``) under
    cProfile, the cumulative ms of ``ModelBatcher.pack_parts`` and of its steps (decode, resize,
    patchify: ``qwen_video_patches``; padding: ``_pad_videos``), and of the batch's collation."""
    import cProfile
    import pstats

    from wdspack import make_loader

    loader = make_loader(str(dataset), batch_size=1, num_workers=0, shuffle=False, processor=str(processor))
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    frames = sum(planned_frames(b) for b in loader)
    prof.disable()
    wall = time.perf_counter() - t0
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]

    def ms(name: str, where: str) -> float:  # where: the file, or for a compiled method part of its name
        return round(sum(v[3] for k, v in stats.items() if (k[2] == name and where in k[0])
                         or (k[0] == "~" and name in k[2] and where in k[2])) * 1000, 1)

    steps = {"pack_parts": ms("pack_parts", "batch/model.py"), "decode_frames": ms("_decode_frames", "video/pixels"),
             "resize_frames": ms("resize_frames", "video/pixels"),
             "qwen_video_patches": ms("qwen_video_patches", "video/pixels"),
             "normalize_video_rows": ms("normalize_video_rows", "video/pixels"),
             "pad_videos": ms("_pad_videos", "qwen_vl"),
             "collate": ms("collate", "batch/model.py"), "join_rows": ms("_join_rows", "batch/model.py"),
             "to_ndarray": ms("to_ndarray", "av."), "interpolate": ms("interpolate", "torch/nn/functional")}
    return {"frames": frames, "epoch_ms": round(wall * 1000, 1), "cumulative_ms": steps}


def _machine() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import av

    return {"cpu": model or platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__, "av": av.__version__,
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
            "shared": "the dev machine, shared with other work during the run"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="tiny clips (3 s of 96×64 at 10 fps): the smoke test")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per figure (the median is kept)")
    ap.add_argument("--rounds", type=int, default=5, help="side-by-side rounds (the median round is kept)")
    ap.add_argument("--videos", type=int, default=8, help="videos decoded per side-by-side run (mp4 and webm)")
    ap.add_argument("--chats", type=int, default=8,
                    help="video chats of the clips above, packed (4) and through the loader (5)")
    ap.add_argument("--small-chats", type=int, default=64, help="video chats of 3 s 96×64 clips, packed (4)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"which to run, of {','.join(PARTS)}")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    if parts - set(PARTS):
        ap.error(f"--parts {args.parts}: choose from {','.join(PARTS)}")

    torch.set_num_threads(1)  # one thread, as a DataLoader worker decodes
    seconds, fps, width, height = (3, 10, 96, 64) if args.small else (20, 30, 640, 360)
    res: dict = {"command": " ".join(["python -m tools.bench_video", *(argv if argv is not None else sys.argv[1:])]),
                 "machine": _machine(), "decoder": pixel_functions()[2],
                 "sampling": "Qwen2.5-VL: fps 2, min_pixels 128*28*28, max_pixels 768*28*28 (plan_qwen2_vl)",
                 "clips": {}}
    clips = {kind: make_clip(kind, seconds=seconds, fps=fps, width=width, height=height) for kind in KINDS}
    plans = {kind: plan_qwen2_vl(read_header(data), QWEN25_VL_VIDEO) for kind, data in clips.items()}
    for kind, data in clips.items():
        plan = plans[kind]
        res["clips"][kind] = {"codec": KINDS[kind][0], "seconds": seconds, "fps": fps, "width": width,
                              "height": height, "bytes": len(data), "kbit_per_s": round(len(data) * 8 / seconds / 1000),
                              "planned_frames": len(plan.indices), "planned_size": [plan.height, plan.width],
                              "grid": list(plan.grid), "tokens": plan.tokens}
        if "probe" in parts:
            res.setdefault("probe", {})[kind] = measure_probe(data, args.repeats)
        if "storage" in parts:
            res.setdefault("storage", {})[kind] = measure_storage(data, plan, args.repeats)
        print(kind, json.dumps({k: res[k][kind] for k in ("probe", "storage") if k in res}), flush=True)
    kinds = list(KINDS)
    if "workers" in parts:
        jobs = [(clips[kinds[(k // 2) % 2]], plans[kinds[(k // 2) % 2]]) for k in range(args.videos)]  # m m w w ...
        same = all(torch.equal(wdspack_worker(clips[k], plans[k]), pyav_worker(clips[k], plans[k])) for k in kinds)
        res["workers"] = {"videos": args.videos, "same_pixels": same,
                          **measure_workers(jobs, workers=(1, 2), rounds=args.rounds)}
        print(json.dumps(res["workers"]), flush=True)
    if "storage" in parts:
        storage = res["storage"]
        res["decision"] = {
            "store": "original" if all(s["png_over_original"] > 1 for s in storage.values()) else "frames",
            "min_raw_over_original": min(s["raw_over_original"] for s in storage.values()),
            "min_png_over_original": min(s["png_over_original"] for s in storage.values()),
            "max_decode_over_png_read": max(s["decode_over_png_read"] for s in storage.values()),
            # the source bitrate above which the original would outweigh the planned frames as PNG
            "break_even_kbit_per_s": min(round(s["b_png_bytes"] * 8 / seconds / 1000) for s in storage.values())}
    if parts & {"pack", "loader"}:
        with tempfile.TemporaryDirectory(prefix="bench-video-") as tmp:
            _pack_and_load(res, Path(tmp), parts, clips, plans, args)
    res["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


def _pack_and_load(res: dict, work: Path, parts: set[str], clips: dict[str, bytes], plans: dict[str, VideoPlan],
                   args: argparse.Namespace) -> None:
    """Parts 4 and 5: the chats written, packed against the floor, and streamed through the loader."""
    processor = tiny_processor(work / "qwen")
    chats = write_video_chats(work / "realistic", list(clips.items()), args.chats)
    if "pack" in parts:
        small = {kind: make_clip(kind, seconds=3, fps=10, width=96, height=64, seed=1) for kind in KINDS}
        sets = {"realistic": (chats, clips), "small": (write_video_chats(work / "small", list(small.items()),
                                                                           args.small_chats), small)}
        res["pack"] = {"processor": "tiny Qwen2.5-VL (examples/tiny_vlm), VideoSettings(fps=2.0)", "seq_len": SEQ_LEN}
        for name, (path, chosen) in sets.items():
            first = plan_qwen2_vl(read_header(next(iter(chosen.values()))), QWEN25_VL_VIDEO)
            res["pack"][name] = {"clip_bytes": {k: len(v) for k, v in chosen.items()}, "video_tokens": first.tokens,
                                 **measure_pack(path, processor, work / f"{name}-out", seq_len=SEQ_LEN,
                                                repeats=args.repeats)}
            print(name, json.dumps(res["pack"][name]), flush=True)
    if "loader" in parts:
        kinds = list(clips)
        dataset = work / "loader-packed"
        pack_video_chats(chats, processor, dataset, seq_len=SEQ_LEN, max_images=1, shard_max_packs=1)  # a video a pack
        jobs = [(clips[kinds[k % len(kinds)]], plans[kinds[k % len(kinds)]]) for k in range(args.chats)]  # m w m w
        for key, dtype in (("loader", "float32"), ("loader_uint8", "uint8")):
            res[key] = {"videos": args.chats, "pixel_dtype": dtype, **measure_loader(
                dataset, processor, jobs, workers=(1, 2), rounds=args.rounds, pixel_dtype=dtype)}
            print(key, json.dumps(res[key]), flush=True)
        res["loader"]["profile_1w"] = profile_loader(dataset, processor)
        print(json.dumps(res["loader"]["profile_1w"]), flush=True)


if __name__ == "__main__":
    sys.exit(main())
