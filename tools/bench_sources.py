"""Pre-training sources benchmark: reading caption pairs, and packing a caption-like distribution.

    python -m tools.bench_sources                       # 4000 pairs, n=100k for packing
    python -m tools.bench_sources --pairs 1000 --json docs/benchmarks/data/bench_sources.json

1. **Reading.** The same image + caption pairs (JPEGs of 8-40 KB, img2dataset layout: ``.jpg``,
   ``.txt``, ``.json`` per key) as WebDataset shards of 1000 samples, and as a JSONL file of
   ``messages`` records whose images sit in a folder, one file each. Both go through
   ``wdspack.packer.sources`` (list_partitions + iter_records): records with their image bytes, no
   image decoded, no tokenizing. Samples/s is the best of ``--repeats`` passes after a warm-up
   pass (files in the page cache: it measures the reader, not the disk).
2. **Packing fill.** Caption-like samples, one image of 64 tokens + 10-60 text tokens (+1 for
   end-of-text), planned with ``bfd`` at ``max_images`` 8 and 16 and seq_len 2048 and 4096:
   packs against ``wdspack.packer.planner.lower_bound`` (the image bound dominates: a pack holds at most
   ``max_images`` captions), and the fill ratio that bound allows.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from wdspack.packer.planner import lower_bound, plan_packs
from wdspack.packer.sources import iter_records, list_partitions


def make_pairs(n: int, seed: int = 0) -> list[tuple[str, bytes, str]]:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (160, 160, 3), np.uint8)
    out = []
    for k in range(n):
        noise = rng.integers(0, 256, (160, 160, 3), np.uint8)
        mix = float(rng.uniform(0.05, 0.6))  # noisier images compress worse: 8-40 KB
        img = Image.fromarray((base * (1 - mix) + noise * mix).astype(np.uint8))
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=85)
        words = " ".join(f"word{int(w)}" for w in rng.integers(0, 5000, int(rng.integers(5, 30))))
        out.append((f"{k:09d}", buf.getvalue(), f"A photo of {words}."))
    return out


def write_shards(pairs, folder: Path, per_shard: int = 1000) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(0, len(pairs), per_shard):
        path = folder / f"{s // per_shard:05d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for key, jpg, caption in pairs[s:s + per_shard]:
                meta = json.dumps({"key": key, "caption": caption, "width": 160, "height": 160}).encode()
                for ext, data in (("jpg", jpg), ("txt", caption.encode()), ("json", meta)):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size, info.mtime = len(data), 0
                    tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


def write_jsonl(pairs, folder: Path) -> str:
    (folder / "images").mkdir(parents=True, exist_ok=True)
    with open(folder / "captions.jsonl", "w", encoding="utf-8") as f:
        for key, jpg, caption in pairs:
            (folder / "images" / f"{key}.jpg").write_bytes(jpg)
            f.write(json.dumps({"id": key, "images": [f"images/{key}.jpg"], "messages": [
                {"role": "user", "content": "<image>"}, {"role": "assistant", "content": caption}]}) + "\n")
    return str(folder / "captions.jsonl")


def read_rate(sources: list[str], repeats: int) -> dict:
    def one_pass() -> tuple[int, int, float]:
        t = time.perf_counter()
        n = nbytes = 0
        for p in list_partitions(sources):
            for r in iter_records(p):
                n += 1
                nbytes += sum(len(b) for b in r.images)
        return n, nbytes, time.perf_counter() - t

    one_pass()  # warm-up: page cache
    runs = [one_pass() for _ in range(repeats)]
    n, nbytes, best = min(runs, key=lambda r: r[2])
    return {"samples": n, "image_mb": round(nbytes / 1e6, 1), "seconds": round(best, 3),
            "samples_per_s": round(n / best, 1), "mb_per_s": round(nbytes / 1e6 / best, 1)}


def caption_fill(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    tokens = 64 + rng.integers(10, 61, n) + 1
    images = np.ones(n, np.int64)
    rows = []
    for seq_len in (2048, 4096):
        for max_images in (8, 16):
            t = time.perf_counter()
            packs = plan_packs(tokens, images, seq_len=seq_len, max_images=max_images, algorithm="bfd", seed=seed)
            seconds = time.perf_counter() - t
            lb = lower_bound(tokens, images, seq_len=seq_len, max_images=max_images)
            token_lb = lower_bound(tokens, seq_len=seq_len)
            rows.append({"seq_len": seq_len, "max_images": max_images, "samples": n, "packs": len(packs),
                         "lower_bound": lb, "token_lower_bound": token_lb,
                         "packs_over_lb": round(len(packs) / lb, 4),
                         "fill": round(float(tokens.sum()) / (len(packs) * seq_len), 4),
                         "fill_at_lb": round(float(tokens.sum()) / (lb * seq_len), 4),
                         "plan_seconds": round(seconds, 2)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=4000)
    ap.add_argument("--packing-samples", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    pairs = make_pairs(args.pairs)
    with tempfile.TemporaryDirectory() as tmp:
        shards = write_shards(pairs, Path(tmp) / "wds")
        jsonl = write_jsonl(pairs, Path(tmp) / "jsonl")
        wds = read_rate(shards, args.repeats)
        folder = read_rate([jsonl], args.repeats)
    print(f"== reading {args.pairs} caption pairs (records with image bytes, no decoding; best of {args.repeats})")
    for name, r in (("webdataset shards", wds), ("jsonl + image folder", folder)):
        print(f"   {name:22s} {r['samples_per_s']:>9,.0f} samples/s  {r['mb_per_s']:>7,.1f} MB/s  "
              f"({r['samples']} samples, {r['image_mb']} MB of images, {r['seconds']} s)")
    print(f"   shards / folder: {wds['samples_per_s'] / folder['samples_per_s']:.2f}x")
    fill = caption_fill(args.packing_samples)
    print(f"== packing caption-like samples (64 image tokens + 10-60 text + 1), bfd, n={args.packing_samples}")
    for r in fill:
        print(f"   seq_len {r['seq_len']:>5}  max_images {r['max_images']:>3}: packs {r['packs']:>6} "
              f"(LB {r['lower_bound']}, token LB {r['token_lower_bound']}, x{r['packs_over_lb']:.4f})  "
              f"fill {r['fill']:.2%} (at LB {r['fill_at_lb']:.2%})  plan {r['plan_seconds']} s")
    if args.json:
        result = {"machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                              "cpus": os.cpu_count()},
                  "reading": {"pairs": args.pairs, "webdataset": wds, "jsonl_image_folder": folder,
                              "ratio": round(wds["samples_per_s"] / folder["samples_per_s"], 2)},
                  "packing": fill}
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
