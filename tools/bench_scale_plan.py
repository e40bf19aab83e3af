"""The partitioned pack job at scale: the real measure → plan → write path on caption shards.

    python -m tools.bench_scale_plan --samples 2000000 --work /tmp/scale [--workers 2] [--group-samples 200000]

Data: WebDataset caption shards (img2dataset layout: ``{key}.jpg`` + ``{key}.txt``) of
``--shard-samples`` pairs each, one real 8×8 JPEG reused (decoded by the check like any image) and
a caption of 4–40 words drawn from a 500-word list with a seeded generator; tokenized by the real
Pixtral tekken tokenizer shipped in ``mistral_common``, 16 tokens per image, seq_len 2048, no image
budget. The job runs in a child process (the driver) with ``plan_group_partitions`` set so a group
holds about ``--group-samples`` samples; its peak RSS (Linux ``VmHWM``) is the driver's memory (the
pool's workers are other processes). Then the shards are read back (the sub-sample lengths of every
pack) and one global ``plan_packs`` over the same samples gives the fill the global plan would have.

``--source documents`` is the fast source for the largest runs: JSONL files of text-only documents
(``{"id", "text"}``, the same 4–40-word texts, no image to check) and a small real tokenizer (a
``tokenizers`` WordLevel model over the 500 words, built into the work folder and loaded through
transformers like any tokenizer), so the measured cost is the pack job's own per-sample work.

Printed (one JSON line, and a summary): samples, driver peak RSS, time per stage (measure, bucket,
duplicates, select, plan+write) and per sample, the partitioned and global fills, and the estimate
for 1 B samples on a Ray cluster of ``--cpus`` CPUs from the measured CPU seconds per sample.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SEQ_LEN, TOKENS_PER_IMAGE, RECORDS_PER_PARTITION = 2048, 16, 1000


def _jpeg() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8), "RGB").save(buf, "JPEG")
    return buf.getvalue()


def _write_files(folder: Path, samples: int, per_file: int, suffix: str, write) -> list[str]:
    """Files of ``per_file`` texts of 4-40 words from a 500-word list (the last file shorter),
    deterministic; ``write(tmp_path, file_number, texts)`` writes one. Files already there are kept."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    words = np.asarray([f"w{k}" for k in range(500)])
    paths = []
    for s in range(-(-samples // per_file)):
        path = folder / f"{s:06d}{suffix}"
        paths.append(str(path))
        if path.exists():
            continue
        lengths = rng.integers(4, 41, min(per_file, samples - s * per_file))
        picks = words[rng.integers(0, len(words), int(lengths.sum()))]
        tmp = path.with_suffix(".tmp")
        write(tmp, s, [" ".join(text) for text in np.split(picks, np.cumsum(lengths)[:-1])])
        tmp.rename(path)
    return paths


def make_shards(folder: Path, samples: int, per_shard: int) -> list[str]:
    """Caption shards of ``per_shard`` pairs (the last one shorter), deterministic."""
    image = _jpeg()

    def write(tmp: Path, s: int, texts: list[str]) -> None:
        with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
            for k, text in enumerate(texts):
                for name, data in ((f"{s:06d}{k:05d}.jpg", image), (f"{s:06d}{k:05d}.txt", text.encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return _write_files(folder, samples, per_shard, ".tar", write)


def make_documents(folder: Path, samples: int, per_file: int) -> list[str]:
    """JSONL files of ``per_file`` text-only documents (the last one shorter), deterministic."""
    def write(tmp: Path, s: int, texts: list[str]) -> None:
        tmp.write_text("".join(f'{{"id": "d{s:06d}{k:05d}", "text": "{text}"}}\n' for k, text in enumerate(texts)))
    return _write_files(folder, samples, per_file, ".jsonl", write)


def _small_tokenizer(folder: Path) -> str:
    """A WordLevel tokenizer over the documents' 500 words, saved as a transformers tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<unk>", "<s>", "</s>", "[IMG]", *(f"w{k}" for k in range(500))])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            unk_token="<unk>", additional_special_tokens=["[IMG]"]).save_pretrained(folder)
    return str(folder)


def _tekken(folder: Path) -> str:
    import mistral_common

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(mistral_common.__file__).parent / "data" / "tekken_240911.json", folder / "tekken.json")
    return str(folder)


def driver(shards: list[str], out: str, tokenizer: str, workers: int, group: int) -> dict:
    """The pack job in this process (the driver), stage times recorded around the executor; the shards
    are given as one glob (one source: partitioned planning refuses several)."""
    from wdspack.packer import job
    from wdspack.packer.config import PackConfig, RunOptions
    from wdspack.packer.samples import SampleConfig
    from wdspack.packer.text import PretrainConfig

    seconds: dict[str, float] = {}
    original = job._run

    def timed(fn, tasks, config, *, desc, **kw):
        t = time.perf_counter()
        yield from original(fn, tasks, config, desc=desc, **kw)
        seconds[desc] = seconds.get(desc, 0.0) + time.perf_counter() - t

    job._run = timed
    sample_config = SampleConfig(tokenizer, tokens_per_image=TOKENS_PER_IMAGE, image_token="[IMG]",
                                 pretrain=PretrainConfig(eos_token="</s>"))
    config = PackConfig(seq_len=SEQ_LEN, records_per_partition=RECORDS_PER_PARTITION, plan_group_partitions=group,
                        run=RunOptions(workers=workers))
    start = time.perf_counter()
    pattern = "*.tar" if shards[0].endswith(".tar") else "*.jsonl"
    summary = job.pack_dataset([str(Path(shards[0]).parent / pattern)], out, sample_config=sample_config,
                               config=config)
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    return {"samples_read": summary.samples_read, "samples_packed": summary.samples_packed, "packs": summary.packs,
            "shards": summary.shards, "fill": summary.fill_ratio, "seconds": time.perf_counter() - start,
            "stages": seconds, "driver_peak_rss": hwm}


def global_fill(out: Path) -> tuple[float, int, float]:
    """The fill one global plan gives on the packed samples (their lengths read back from the shards)."""
    from wdspack.format.manifest import read_manifest
    from wdspack.format.pack import decode_pack
    from wdspack.packer.planner import plan_packs

    lengths = []
    for shard in read_manifest(out).shards:
        with tarfile.open(out / shard.name) as tar:
            for m in tar:
                lengths.extend(decode_pack(tar.extractfile(m).read()).seq_lens)
    tok = np.asarray(lengths, np.int64)
    t = time.perf_counter()
    packs = len(plan_packs(tok, seq_len=SEQ_LEN))
    return float(tok.sum() / (packs * SEQ_LEN)), packs, time.perf_counter() - t


def estimate(result: dict, samples: int, workers: int, cpus: int, target: int = 10**9,
             usd_per_cpu_hour: float = 0.05) -> dict:
    """1 B samples on ``cpus`` CPUs: task CPU seconds per sample (stage wall time × workers), scaled;
    the driver's memory: its measured peak less its per-shard and fixed parts scaled by shard count."""
    per_sample = {k: v * workers / samples for k, v in result["stages"].items()}
    shards_1b = result["shards"] * target / samples
    cpu_hours_per_million = sum(per_sample.values()) * 1e6 / 3600
    return {"cpu_seconds_per_sample": per_sample,
            "hours_on_cpus": sum(per_sample.values()) * target / cpus / 3600,
            "cpu_hours_per_million": cpu_hours_per_million,
            "usd_per_million": cpu_hours_per_million * usd_per_cpu_hour, "usd_per_cpu_hour": usd_per_cpu_hour,
            "shards": int(shards_1b),
            # per shard the driver keeps one ShardInfo (~0.5 KB with its name and digest) and one row
            # of group state; everything else it holds is fixed (imports, tokenizer, pool)
            "driver_bytes": int(result["driver_peak_rss"] + 1024 * shards_1b)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2_000_000)
    parser.add_argument("--shard-samples", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--group-samples", type=int, default=200_000)
    parser.add_argument("--cpus", type=int, default=1024, help="the Ray cluster of the 1 B estimate")
    parser.add_argument("--usd-per-cpu-hour", type=float, default=0.05,
                        help="the price of one CPU-hour for the cost per million samples (default 0.05)")
    parser.add_argument("--source", choices=("captions", "documents"), default="captions",
                        help="caption shards with the Pixtral tokenizer (default), or text-only JSONL documents "
                             "with a small WordLevel tokenizer (the fast source for the largest runs)")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--driver", nargs=3, metavar=("SHARDS_JSON", "OUT", "TOKENIZER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    group = max(1, args.group_samples // RECORDS_PER_PARTITION)
    if args.driver:  # the child: the driver alone
        shards = json.loads(Path(args.driver[0]).read_text())
        print(json.dumps(driver(shards, args.driver[1], args.driver[2], args.workers, group)))
        return
    t = time.perf_counter()
    if args.source == "documents":
        shards = make_documents(args.work / "documents", args.samples, args.shard_samples)
    else:
        shards = make_shards(args.work / "data", args.samples, args.shard_samples)
    made = time.perf_counter() - t
    listing = args.work / "shards.json"
    listing.write_text(json.dumps(shards))
    out = args.work / "packed"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, __file__, "--work", str(args.work), "--workers", str(args.workers),
           "--group-samples", str(args.group_samples), "--driver", str(listing), str(out),
           _small_tokenizer(args.work / "wordlevel") if args.source == "documents" else _tekken(args.work / "tok")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(done.stderr[-4000:])
    result = json.loads(done.stdout.splitlines()[-1])
    fill, packs, plan_seconds = global_fill(out)
    result.update(data_seconds=made, global_fill=fill, global_packs=packs, global_plan_seconds=plan_seconds,
                  fill_gap=fill - result["fill"], estimate_1b=estimate(result, args.samples, args.workers, args.cpus,
                                               usd_per_cpu_hour=args.usd_per_cpu_hour))
    print(json.dumps(result))
    e = result["estimate_1b"]
    print(f"{result['samples_read']:,} samples: driver peak {result['driver_peak_rss'] / 2**20:.0f} MiB, "
          f"{result['seconds']:.0f} s ({', '.join(f'{k} {v:.0f} s' for k, v in result['stages'].items())}); fill "
          f"{result['fill']:.4%} vs global plan {fill:.4%} (gap {result['fill_gap']:.4%}); 1 B samples on "
          f"{args.cpus} CPUs: ~{e['hours_on_cpus']:.1f} h, driver ~{e['driver_bytes'] / 2**30:.2f} GiB; "
          f"{e['cpu_hours_per_million']:.2f} CPU-hours per million samples (${e['usd_per_million']:.3f} at "
          f"${e['usd_per_cpu_hour']}/CPU-hour)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
