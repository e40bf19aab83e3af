"""Audio benchmark (issue #50, item 7): the pack-time probe against a full decode, the loader's audio seconds per
second against plain decode + resample + feature-extractor processes, and what a pack stores per audio.

    python -m tools.bench_audio                  # 20 s clips; 32 chats of 3-25 s clips (~5 min)
    python -m tools.bench_audio --json docs/benchmarks/data/bench_audio.json
    python -m tools.bench_audio --small --repeats 1 --rounds 1     # 1 s clips, 4 chats: the smoke test
    python -m tools.bench_audio --parts loader                     # only item 2

Clips are made here with PyAV, deterministic: a speech-like signal (a voiced tone of 20 harmonics whose pitch
glides between 100 and 250 Hz, shaped by a 4 Hz syllable envelope, over noise 30 dB down), encoded as **wav**
(PCM 16-bit, 44.1 kHz stereo), **flac** (16 kHz mono), **mp3** (LAME, 44.1 kHz stereo, with its Xing/LAME tag),
**mp3_notag** (the same without the tag: FFmpeg's ``write_xing=0``), **opus** (Ogg, 48 kHz mono) and **m4a**
(AAC in MP4, 44.1 kHz stereo). Plans are Qwen2-Audio's (16 kHz, a 30 s window). Times are medians over
``--repeats`` calls (the things compared called in turn), one torch thread (as in a DataLoader worker); every
ratio compares figures of the same run.

1. **probe**: per file, the pack-time probe (``wdspack.media.audio.header.probe_audio`` and
   ``wdspack.media.audio.prepare.plan``: the exact sample count, from the header where it is exact, else from a
   decode) against a full decode counting the samples (PyAV, decode only), and against the loader's decode and
   resample to 16 kHz (``decode_audio``). The probe's count must be the decode's (``exact``).
2. **loader**: ``--chats`` audio chats (LLaMA-Factory's ``mllm_audio_demo.json`` layout, a clip file each, 3-25 s,
   the six formats in turn) packed with the tiny Qwen2-Audio processor (``examples/tiny_vlm/qwen2_audio.py``: the
   real ``Qwen2AudioProcessor``, Whisper features of 128 mel bins over the published 30 s window), streamed by
   ``make_loader(dataset, processor=..., num_workers=N, batch_size=1)`` (persistent workers started before the
   clock): the audio seconds of its batches per second, against N plain processes side by side (fork, started
   at a barrier, one torch thread each) each doing, for its share of the same packs' audio, a plain PyAV decode
   (to float, channels averaged, resampled to 16 kHz, forced to ``ceil(N·16000/rate)`` samples as transformers'
   ``load_audio`` does) and the same feature-extractor call the family makes (a pack's audio in one call,
   ``padding="max_length"``, with the attention mask). ``--rounds`` interleaved, the median round
   (``of_plain``), and audio seconds per CPU second (``of_plain_cpu``: the workers and the main process against
   the plain processes). Then where the time goes: per audio, each step alone (``steps_ms``), and one epoch in
   this process under cProfile (``profile_1w``).
3. **storage**: the packed shards of item 2 against the source files: each stored audio is the source's bytes
   (checked), and what a pack adds for it besides (its plan record, token count and owner, msgpack framing:
   the pack encoded with and without its audio); the shards' bytes against the sources' in all.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import multiprocessing as mp
import os
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

from tools.bench_video import _children, _cpu_seconds, _machine, median_ms
from wdspack.media.audio.decode import decode_audio
from wdspack.media.audio.header import probe_audio
from wdspack.media.audio.prepare import plan as plan_audio
from wdspack.media.audio.record import resampled_length
from wdspack.media.audio.tokens import AUDIO_RULES

#: the clips: name -> (container, codec, rate, channels, container options, file extension)
KINDS: dict[str, tuple[str, str, int, int, dict[str, str], str]] = {
    "wav": ("wav", "pcm_s16le", 44_100, 2, {}, "wav"),
    "flac": ("flac", "flac", 16_000, 1, {}, "flac"),
    "mp3": ("mp3", "libmp3lame", 44_100, 2, {}, "mp3"),
    "mp3_notag": ("mp3", "libmp3lame", 44_100, 2, {"write_xing": "0"}, "mp3"),
    "opus": ("ogg", "libopus", 48_000, 1, {}, "opus"),
    "m4a": ("ipod", "aac", 44_100, 2, {}, "m4a"),
}
#: the benchmark's parts, in the order they run (``--parts``)
PARTS = ("probe", "loader", "storage")
#: Qwen2-Audio's rule (16 kHz, the 30 s window): what the probe plans with
RULE = AUDIO_RULES["qwen2_audio"]
RATE = 16_000
#: the packed dataset's tokens per pack (four 25 s clips' 625 tokens and their chats fit)
SEQ_LEN = 4096

#: a side-by-side worker: one pack's audio files in, the seconds of 16 kHz audio it made features for out
Worker = Callable[[Sequence[bytes]], float]


def speechlike(n: int, rate: int, channels: int = 1, *, seed: int = 0) -> np.ndarray:
    """``n`` samples at ``rate`` of a speech-like signal, float32 ``[channels, n]``: 20 harmonics (up to the
    Nyquist rate) of a pitch gliding between 100 and 250 Hz, a 4 Hz syllable envelope, noise 30 dB down; the
    channels differ by a little delay.

    Example:
        >>> speechlike(1600, 16000, 2).shape
        (2, 1600)
    """
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    pitch = 175 + 75 * np.sin(2 * np.pi * 0.3 * t + rng.uniform(0, 6))
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 21) if k * 250 < rate / 2)
    envelope = np.clip(np.sin(2 * np.pi * 4 * t + rng.uniform(0, 6)), 0, None) ** 2
    mono = 0.25 * voiced * envelope / 1.5 + 0.008 * rng.standard_normal(n)
    return np.stack([np.roll(mono, 7 * c) for c in range(channels)]).astype(np.float32)


def make_clip(kind: str, *, seconds: float, seed: int = 0) -> bytes:
    """A ``kind`` clip (:data:`KINDS`) of ``seconds`` of :func:`speechlike` audio, as the file's bytes.

    Example:
        >>> len(make_clip("flac", seconds=0.5)) > 0
        True
    """
    import av

    fmt, codec, rate, channels, options, _ = KINDS[kind]
    signal = speechlike(round(seconds * rate), rate, channels, seed=seed)
    layout = "mono" if channels == 1 else "stereo"
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt, options={"fflags": "+bitexact", **options}) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        stream.format = stream.codec_context.codec.audio_formats[0].name
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(signal), format="fltp", layout=layout)
        frame.sample_rate, frame.pts, frame.time_base = rate, 0, Fraction(1, rate)
        resampler = av.AudioResampler(format=stream.format.name, layout=layout, rate=rate,
                                      frame_size=stream.codec_context.frame_size or 1024)
        for piece in resampler.resample(frame) + resampler.resample(None):
            for packet in stream.encode(piece):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


# ---- 1. the pack-time probe against a full decode ------------------------------------------------------------


def pack_probe(data: bytes) -> Any:
    """What the pack job does per audio file: the exact sample count (``probe_audio``) and Qwen2-Audio's plan."""
    return plan_audio(RULE, probe_audio(data, sample_id="bench"))


def decode_count(data: bytes) -> int:
    """A full decode of the first audio stream with PyAV (decode only): the samples per channel."""
    import av

    with av.open(io.BytesIO(data)) as container:
        return sum(int(frame.samples) for frame in container.decode(container.streams.audio[0]))


def open_container(data: bytes, **options: str) -> int:
    """Only PyAV's ``av.open`` of the bytes (FFmpeg's stream-info probing, ``options`` its format options): the
    first audio stream's rate."""
    import av

    with av.open(io.BytesIO(data), options=options) as container:
        return int(container.streams.audio[0].codec_context.sample_rate)


def measure_probe(data: bytes, repeats: int) -> dict:
    """The pack-time probe against a full decode (and the loader's decode + resample to 16 kHz); where the probe's
    time goes: opening the container (``av.open``, FFmpeg's stream-info probing) as the probe does, and with
    ``probesize=32`` (what the probe would cost if it opened so)."""
    found = probe_audio(data, sample_id="bench")
    planned = plan_audio(RULE, found)
    decoded = decode_count(data)

    def loader_decode() -> np.ndarray:
        return decode_audio(data, rate=RATE, frames=found.frames, source_rate=found.rate, sample_id="bench")

    ms = median_ms({"probe": lambda: pack_probe(data), "decode": lambda: decode_count(data),
                    "decode_resample": loader_decode, "open": lambda: open_container(data),
                    "open_probesize_32": lambda: open_container(data, probesize="32")}, repeats)
    return {"measured": found.measured, "header_or_probe_frames": found.frames, "decoded_frames": decoded,
            "exact": found.frames == decoded, "tokens": planned.tokens, "samples_16k": planned.record.samples,
            "probe_ms": ms["probe"], "decode_ms": ms["decode"], "decode_resample_ms": ms["decode_resample"],
            "open_ms": ms["open"], "open_probesize_32_ms": ms["open_probesize_32"],
            "decode_over_probe": round(ms["decode"] / ms["probe"], 1),
            "decode_resample_over_probe": round(ms["decode_resample"] / ms["probe"], 1)}


# ---- 2. the loader's audio seconds per second, against plain processes ----------------------------------------


def write_audio_chats(folder: Path, chats: int, *, small: bool, seed: int = 0) -> tuple[Path, list[bytes]]:
    """``chats.jsonl`` in LLaMA-Factory's ``mllm_audio_demo.json`` layout (``<audio>`` + ``audios``) and ``clips/``:
    chat ``k`` asks about a clip of its own in the ``k % 6``-th format of :data:`KINDS`, 3-25 s long (1-3 s
    ``small``), and gets 10-40 words. Also the clips' bytes, in order.

    Example:
        >>> write_audio_chats(Path("/tmp/a"), 6, small=True)[0]  # doctest: +SKIP
        PosixPath('/tmp/a/chats.jsonl')
    """
    rng = np.random.default_rng(seed)
    words = "a voice hums a gliding tone in short syllables over a faint hiss".split()
    (folder / "clips").mkdir(parents=True, exist_ok=True)
    lines, clips = [], []
    kinds = list(KINDS)
    for k in range(chats):
        kind = kinds[k % len(kinds)]
        seconds = float(rng.uniform(1, 3) if small else rng.uniform(3, 25))
        data = make_clip(kind, seconds=seconds, seed=seed * 1000 + k)
        name = f"clips/a{k:04d}.{KINDS[kind][5]}"
        (folder / name).write_bytes(data)
        clips.append(data)
        answer = " ".join(rng.choice(words, int(rng.integers(10, 41)))).capitalize() + "."
        lines.append(json.dumps({"id": f"a{k}", "messages": [
            {"role": "user", "content": "<audio>What do you hear?"},
            {"role": "assistant", "content": answer}], "audios": [name]}))
    path = folder / "chats.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, clips


def tiny_processor(folder: Path) -> Path:
    """The tiny Qwen2-Audio processor (``examples/tiny_vlm``: the real classes, the tekken tokenizer, the published
    30 s window), saved as the pack job and the loader read it."""
    from examples.tiny_vlm import qwen2_audio
    from wdspack.models import save_processor

    return save_processor(qwen2_audio.processor(folder / "tok"), folder / "processor")


def pack_audio_chats(path: Path, processor: Path, out: Path, *, max_audios: int) -> Any:
    """``pack_dataset`` of the chats with the processor folder, at most ``max_audios`` a pack, one worker (in this
    process)."""
    from wdspack.packer.config import PackConfig, RunOptions
    from wdspack.packer.job import pack_dataset
    from wdspack.packer.samples import SampleConfig

    shutil.rmtree(out, ignore_errors=True)
    config = PackConfig(seq_len=SEQ_LEN, max_images=max_audios, on_error="raise", run=RunOptions(workers=1))
    return pack_dataset([str(path)], str(out), sample_config=SampleConfig(processor=str(processor)), config=config,
                        progress=False)


def read_packs(dataset: Path) -> list[tuple[bytes, Any]]:
    """Every pack of the dataset's shards, in order: its bytes as stored and the pack."""
    import tarfile

    from wdspack.format.pack import decode_pack

    packs = []
    for shard in sorted(dataset.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                f = tar.extractfile(member)
                if f is not None and member.name.endswith(".mp"):
                    raw = f.read()
                    packs.append((raw, decode_pack(raw)))
    return packs


def plain_decode(data: bytes, rate: int = RATE) -> np.ndarray:
    """The baseline's decode: PyAV's frames to float32 ``[C, n]``, the channels averaged, PyAV's resampler to
    ``rate`` (flushed), the length forced to ``ceil(n · rate / src_rate)`` (as transformers' ``load_audio``)."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        to_float: Any = None
        chunks = []
        for frame in container.decode(stream):
            if to_float is None:
                src = int(frame.sample_rate)
                to_float = av.AudioResampler(format="fltp", layout=frame.layout, rate=src)
            chunks += [f.to_ndarray() for f in to_float.resample(frame)]
        chunks += [f.to_ndarray() for f in to_float.resample(None)]
    mono = np.concatenate(chunks, axis=1).mean(axis=0, dtype=np.float32)
    want = resampled_length(len(mono), src, rate)
    if src != rate:
        frame = av.AudioFrame.from_ndarray(mono[None, :], format="flt", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = src, 0, Fraction(1, src)
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        pieces = resampler.resample(frame) + resampler.resample(None)
        mono = np.concatenate([f.to_ndarray().reshape(-1) for f in pieces])
    out = np.zeros(want, np.float32)
    out[: min(want, len(mono))] = mono[:want]
    return out


def features(extractor: Any, waves: Sequence[np.ndarray]) -> dict[str, torch.Tensor]:
    """The family's feature call (``Qwen2AudioProcessor``'s): one list of waveforms, padded to the window."""
    out = extractor(list(waves), sampling_rate=RATE, return_attention_mask=True, padding="max_length",
                    return_tensors="pt")
    return {"input_features": out["input_features"], "feature_attention_mask": out["attention_mask"]}


class PlainWorker:
    """The baseline: :func:`plain_decode` of each of a pack's audios, then :func:`features` on them together; the
    seconds of 16 kHz audio made."""

    def __init__(self, processor: Any) -> None:
        self.extractor = processor.feature_extractor

    def __call__(self, datas: Sequence[bytes]) -> float:
        waves = [plain_decode(d) for d in datas]
        features(self.extractor, waves)
        return sum(len(w) for w in waves) / RATE


def _share(worker: Worker, jobs: list[list[bytes]], share: slice, start: Any, out: Any) -> None:
    torch.set_num_threads(1)  # as a DataLoader worker runs
    mine = jobs[share]
    if mine:
        worker(mine[0])  # warm: imports and first-call costs before the clock
    start.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    seconds = sum(worker(datas) for datas in mine)
    out.put((t0, time.perf_counter(), seconds, time.process_time() - c0))


def side_by_side(jobs: list[list[bytes]], processes: int, *, worker: Worker) -> tuple[float, float, float]:
    """Aggregate audio seconds per second of ``processes`` processes started together (fork), each running
    ``worker`` on every ``processes``-th pack, from the first start to the last finish; the audio seconds made;
    the processes' CPU seconds.

    Example:
        >>> rate, seconds, cpu_s = side_by_side(jobs, 2, worker=PlainWorker(folder))  # doctest: +SKIP
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
    seconds = sum(g[2] for g in got)
    return seconds / (max(g[1] for g in got) - min(g[0] for g in got)), seconds, sum(g[3] for g in got)


class LoaderRun:
    """A ``make_loader(dataset, processor=processor, num_workers=n, batch_size=1)`` kept alive (persistent
    workers) so each :meth:`epoch` times decoding and features alone, not the workers' start. ``processor``: the
    folder's processor, loaded once (``load_processor``; the workers inherit it)."""

    def __init__(self, dataset: Path, processor: Any, workers: int) -> None:
        from wdspack import make_loader

        before = _children()
        self.loader = make_loader(str(dataset), batch_size=1, num_workers=workers, shuffle=False,
                                  processor=processor)
        self.audios = self.epoch()[1]  # warm: workers started, the processor loaded in each
        self.pids = _children() - before

    def epoch(self) -> tuple[float, int, float]:
        """One epoch: its wall seconds, the audios its batches hold (``audio_mask``), and the CPU seconds of the
        workers and this process together."""
        pids: set[int] = getattr(self, "pids", set())
        t0, c0, w0 = time.perf_counter(), time.process_time(), _cpu_seconds(pids)
        audios = sum(int(b["audio_mask"].sum()) for b in self.loader)
        wall = time.perf_counter() - t0
        return wall, audios, time.process_time() - c0 + _cpu_seconds(pids) - w0


def measure_loader(dataset: Path, processor: Any, jobs: list[list[bytes]], seconds: float, *,
                   workers: Sequence[int], rounds: int) -> dict:
    """The loader at each worker count against :class:`PlainWorker` processes side by side on the same packs'
    audio, interleaved (which goes first alternates); the median round by audio seconds per second, and the
    median ratio per CPU second."""
    runs = {n: LoaderRun(dataset, processor, n) for n in workers}
    want = sum(len(j) for j in jobs)
    for n, run in runs.items():
        if run.audios != want:
            raise AssertionError(f"the loader at {n} workers gave {run.audios} audios, the packs hold {want}")
    plain = PlainWorker(processor)
    pairs: dict[int, list[tuple[float, float]]] = {n: [] for n in workers}
    cpu: dict[int, list[float]] = {n: [] for n in workers}
    made: dict[int, float] = {}
    for r in range(rounds):  # interleaved: the host's load moves both alike
        for n in workers:
            got: dict[str, tuple[float, float]] = {}
            for name in (("plain", "loader") if r % 2 == 0 else ("loader", "plain")):
                if name == "plain":
                    rate, made[n], cpu_s = side_by_side(jobs, n, worker=plain)
                    got[name] = (rate, cpu_s)
                else:
                    wall, audios, cpu_s = runs[n].epoch()
                    if audios != want:
                        raise AssertionError(f"an epoch at {n} workers gave {audios} audios of {want}")
                    got[name] = (seconds / wall, cpu_s)
            pairs[n].append((got["loader"][0], got["plain"][0]))
            cpu[n].append(got["plain"][1] / got["loader"][1])  # the same audio: CPU seconds, inverted
    out: dict = {}
    for n in workers:
        ratios = [a / b for a, b in pairs[n]]
        mid = sorted(range(rounds), key=lambda k: ratios[k])[(rounds - 1) // 2]  # the median round
        ours, base = pairs[n][mid]
        out[f"{n}w"] = {"audios": want, "audio_seconds": round(seconds, 3), "plain_audio_seconds": round(made[n], 3),
                        "loader_audio_s_per_s": round(ours, 1), "plain_audio_s_per_s": round(base, 1),
                        "of_plain": round(ours / base, 3), "of_plain_cpu": round(statistics.median(cpu[n]), 3),
                        "of_plain_runs": [round(x, 3) for x in ratios],
                        "of_plain_cpu_runs": [round(x, 3) for x in cpu[n]]}
    return out


def measure_steps(packs: list[Any], processor: Any, repeats: int) -> dict:
    """Per audio (ms, medians of ``repeats`` passes over every audio, the steps called in turn): wdspack's decode
    and resample against the baseline's, and the feature call on one audio alone; and how close the features of
    the two decodes are (the same call on each)."""
    plain = PlainWorker(processor)
    items = [(d, p) for pack in packs for d, p in zip(pack.media["audio"].data, pack.media["audio"].plans)]

    def ours() -> list[np.ndarray]:
        return [decode_audio(d, rate=p.target_rate, frames=p.frames, source_rate=p.rate, keep=p.kept, sample_id="")
                for d, p in items]

    waves = ours()
    ms = median_ms({"wdspack_decode_resample": ours,
                    "plain_decode_resample": lambda: [plain_decode(d) for d, _ in items],
                    "features": lambda: [features(plain.extractor, [w]) for w in waves]}, repeats)
    a = features(plain.extractor, waves)["input_features"]
    b = features(plain.extractor, [plain_decode(d) for d, _ in items])["input_features"]
    return {"audios": len(items), **{k: round(v / len(items), 2) for k, v in ms.items()},
            "same_lengths": all(len(w) == p.kept for w, (_, p) in zip(waves, items)),
            "max_feature_diff": float((a - b).abs().max())}


def profile_loader(dataset: Path, processor: Any) -> dict:
    """Where one worker's time goes: an epoch of the loader in this process (``num_workers=0``) under cProfile,
    the cumulative ms of ``ModelBatcher.pack_parts`` and its audio steps (decode and resample:
    ``decode_audio``; the feature extractor's call and its STFT; padding into the slots), and of collation."""
    import cProfile
    import pstats

    from wdspack import make_loader

    loader = make_loader(str(dataset), batch_size=1, num_workers=0, shuffle=False, processor=processor)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    audios = sum(int(b["audio_mask"].sum()) for b in loader)
    prof.disable()
    wall = time.perf_counter() - t0
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]

    def ms(name: str, where: str) -> float:  # where: the file, or for a compiled method part of its name
        return round(sum(v[3] for k, v in stats.items() if (k[2] == name and where in k[0])
                         or (k[0] == "~" and name in k[2] and where in k[2])) * 1000, 1)

    steps = {"pack_parts": ms("pack_parts", "batch/model.py"), "decode_audio": ms("decode_audio", "audio/decode"),
             "feature_extractor": ms("__call__", "feature_extraction_whisper"),
             "fbank": ms("_torch_extract_fbank_features", "feature_extraction_whisper"),
             "pad": ms("_pad", "families/qwen2_audio"), "collate": ms("collate", "batch/model.py"),
             "join_rows": ms("_join_rows", "batch/model.py")}
    return {"audios": audios, "epoch_ms": round(wall * 1000, 1), "cumulative_ms": steps}


# ---- 3. bytes per audio in the shards against the source files --------------------------------------------------


def measure_storage(dataset: Path, sources: Sequence[bytes]) -> dict:
    """Each stored audio against its source file: the same bytes (checked), and what its pack adds for it besides
    (the pack's msgpack with its audio against without: the plan, token count and owner, the keys and framing);
    the shards' bytes against the sources' (text tokens, tar headers and the manifest besides)."""
    from wdspack.format.pack import encode_pack
    from wdspack.media.kind import Media

    packs = read_packs(dataset)
    stored = [d for _, p in packs for d in p.media["audio"].data]
    added = 0
    for raw, pack in packs:
        token_dtype = "<u4" if max(pack.input_ids, default=0) > 65535 else "<u2"
        if encode_pack(pack, token_dtype=token_dtype) != raw:
            raise AssertionError("a pack does not encode back to its stored bytes")
        bare = dataclasses.replace(pack, media={**pack.media, "audio": Media()})
        added += len(raw) - len(encode_pack(bare, token_dtype=token_dtype))
    data = sum(len(d) for d in stored)
    extra = added - data
    shards = sum(p.stat().st_size for p in dataset.glob("*.tar"))
    source = sum(len(s) for s in sources)
    return {"audios": len(stored), "packs": len(packs), "same_bytes": sorted(stored) == sorted(sources),
            "source_bytes": source, "stored_audio_bytes": data, "pack_bytes_for_audio": added,
            "extra_bytes_per_audio": round(extra / len(stored), 1),
            "extra_of_source": round(extra / source, 6), "shard_bytes": shards,
            "shards_over_sources": round(shards / source, 4)}


# ---- the run -----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="1 s probe clips, 1-3 s chats: the smoke test")
    ap.add_argument("--seconds", type=float, default=20.0, help="the probe's clips' length (ignored with --small)")
    ap.add_argument("--repeats", type=int, default=7, help="timed calls per figure (the median is kept)")
    ap.add_argument("--rounds", type=int, default=5, help="side-by-side rounds (the median round is kept)")
    ap.add_argument("--chats", type=int, default=32, help="audio chats packed and streamed (2, 3)")
    ap.add_argument("--max-audios", type=int, default=4, help="audios a pack holds at most (2, 3)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"which to run, of {','.join(PARTS)}")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    if parts - set(PARTS):
        ap.error(f"--parts {args.parts}: choose from {','.join(PARTS)}")

    torch.set_num_threads(1)  # one thread, as a DataLoader worker decodes
    seconds = 1.0 if args.small else args.seconds
    res: dict = {"command": " ".join(["python -m tools.bench_audio", *(argv if argv is not None else sys.argv[1:])]),
                 "machine": _machine(), "plan": "Qwen2-Audio: 16 kHz mono, a 30 s window, 25 tokens a second",
                 "clips": {k: {"container": v[0], "codec": v[1], "rate": v[2], "channels": v[3], "options": v[4]}
                           for k, v in KINDS.items()}}
    if "probe" in parts:
        res["probe"] = {}
        for kind in KINDS:
            data = make_clip(kind, seconds=seconds)
            kbit = round(len(data) * 8 / seconds / 1000)
            res["probe"][kind] = {"seconds": seconds, "bytes": len(data), "kbit_per_s": kbit,
                                  **measure_probe(data, args.repeats)}
            print(kind, json.dumps(res["probe"][kind]), flush=True)
    if parts & {"loader", "storage"}:
        with tempfile.TemporaryDirectory(prefix="bench-audio-") as tmp:
            _pack_and_load(res, Path(tmp), parts, args)
    res["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


def _pack_and_load(res: dict, work: Path, parts: set[str], args: argparse.Namespace) -> None:
    """Parts 2 and 3: the chats written and packed, streamed through the loader, the shards weighed."""
    folder = tiny_processor(work / "qwen2-audio")
    path, clips = write_audio_chats(work / "chats", args.chats, small=args.small)
    dataset = work / "packed"
    t0 = time.perf_counter()
    summary = pack_audio_chats(path, folder, dataset, max_audios=args.max_audios)
    packs = [p for _, p in read_packs(dataset)]
    jobs = [list(p.media["audio"].data) for p in packs]
    audio_seconds = sum(plan.kept / plan.target_rate for p in packs for plan in p.media["audio"].plans)
    res["dataset"] = {"chats": args.chats, "samples_packed": summary.samples_packed, "packs": len(packs),
                      "audios": sum(len(j) for j in jobs), "audio_seconds": round(audio_seconds, 3),
                      "seq_len": SEQ_LEN, "max_audios_per_pack": args.max_audios,
                      "pack_job_s": round(time.perf_counter() - t0, 2),
                      "processor": "tiny Qwen2-Audio (examples/tiny_vlm/qwen2_audio.py), 30 s window"}
    print("dataset", json.dumps(res["dataset"]), flush=True)
    if "loader" in parts:
        from wdspack.models import load_processor

        loaded = load_processor(str(folder))
        res["loader"] = measure_loader(dataset, loaded, jobs, audio_seconds, workers=(1, 2), rounds=args.rounds)
        print("loader", json.dumps(res["loader"]), flush=True)
        res["loader"]["steps_ms"] = measure_steps(packs, loaded, args.repeats)
        res["loader"]["profile_1w"] = profile_loader(dataset, loaded)
        print(json.dumps({k: res["loader"][k] for k in ("steps_ms", "profile_1w")}), flush=True)
    if "storage" in parts:
        res["storage"] = measure_storage(dataset, clips)
        print("storage", json.dumps(res["storage"]), flush=True)


if __name__ == "__main__":
    sys.exit(main())
