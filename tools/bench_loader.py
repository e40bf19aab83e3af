"""Loader benchmark: wdspack's pre-packed stream vs on-the-fly packing and naive padding.

    python -m tools.bench_loader          # 16000 text-only and 4000 image-bearing samples, seq_len 4096, B = 4
    python -m tools.bench_loader --samples 1500 --workers 2 --json bench.json
    python -m tools.bench_loader --only images --loaders wdspack     # the image-loader gap alone, quickly
    python -m tools.bench_loader --only images --loaders wdspack --workers 2 --json scale.json
                                     # N workers against N raw decoders side by side, float32 and uint8

The same seeded samples, written twice: as wdspack shards (one tar member per pack, planned
offline) and as a stock per-sample WebDataset (``.ids.npy`` + ``.0.jpg`` ... per record). Each
loader makes one full pass in one DataLoader worker (``--workers``); rates are per worker over the
whole pass, worker start-up included (a buffered packer front-loads its work, so timing from the
first batch would flatter it). All decode images with the same transform (Pillow, JPEG draft, 224 px).

- **wdspack**: ``make_loader`` over the packed shards (fixed ``[B, L]`` + ``[B·M, 3, 224, 224]``).
- **on-the-fly knapsack, tokenizing in the worker** (how nanoVLM does it): stock ``webdataset``
  streams samples with their raw text; the worker tokenizes it with the real Pixtral tokenizer
  (``transformers``, offline), decodes the images, fills a buffer of ``--buffer-rows × L``
  tokens and packs it with nanoVLM's balanced greedy knapsack (longest first, into the lightest
  bin that fits tokens and images; ``delta`` spare bins).
- **on-the-fly knapsack, pre-tokenized ids**: the same, reading token ids stored per sample
  (``.ids.npy``) instead of tokenizing: the most favourable case for on-the-fly packing.
- **naive padding**: the pre-tokenized stream, ``B`` samples per batch padded to the longest.

Token ids are the same everywhere (the text tokenized once by the same tokenizer).

Reported per dataset (text-only; image-bearing: 0–2 JPEGs of 320×240 per sample, 64 tokens
each): rows/s (packs, or padded samples for naive), real tokens/s, images/s, and the share of
batch tokens that is padding. ``raw decode`` is one process decoding the images alone (the same
transform, image by image, into one reused array): measured three times just before and three
times just after the wdspack image pass, the fastest of the six is the baseline (so a quiet moment
favours the baseline, never wdspack), and ``of_raw`` is wdspack's images/s over it.

With ``--loaders wdspack`` the image pass runs twice, ``pixel_dtype="float32"`` and ``"uint8"``,
and the baseline is the host's real limit for ``--workers N``: **N raw decoders side by side**, N
processes started together, each decoding and resizing its share of the same images to the same
size (``decode_resized``, no loader, no normalising). ``--rounds`` rounds of raw, float32 and uint8
back to back, each pass against its own round's raw run; the median round is reported. Both sides
are timed warm, as a training run sees them: the raw decoders from a barrier once all have started,
the loader (persistent workers, ``make_loader``'s default) over the rest of the epoch once each worker
has delivered its first batch (the warm-up's images are not counted; its time from a cold start is
``cold_start_s``). The workers' split is ``balance="cost"`` (``--balance``): a DataLoader hands out
batches in turn, so a worker whose batch is cheap waits for a slower one's turn unless each step's
batches cost about the same (on 2 cores the plain split kept the workers busy 72–75 % of the time, the
balanced one 91–94 %). ``of_raw_n`` is wdspack's aggregate images/s at N workers over the raw decoders'
aggregate; ``of_raw_cpu`` the same per CPU second (the workers' CPU read from ``/proc`` over the
timed part). Where the rest goes: ``cold_start_s``, ``main_cpu_s`` (CPU time
of the main process during the pass: receiving batches); per image delivered, the CPU split
(:mod:`decode_clock`, timed inside every worker): decoding (``decode_cpu_ms``, against the raw
decoders' own), the workers' own work besides it (``own_cpu_ms``), the main process's (``main_cpu_ms``),
how busy the workers were, and decoding's wall over its CPU (above 1: waiting for a core), printed
under each summary; and, with ``--profile``, a one-worker pass
profiled inside the worker (cProfile), split into decode + resize, placing the pixels (normalise or
copy), collating the text, and the rest (reading, unpacking, shuffling, waiting).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import multiprocessing as mp
import os
import pstats
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from tools.decode_clock import DecodeClock, per_image, since, split_line
from wdspack import plan_packs
from wdspack.format.manifest import Manifest, write_json_atomic
from wdspack.format.pack import Pack, encode_pack
from wdspack.format.tar import ShardWriter, shard_name
from wdspack.media.image.pixels import make_image_transform
from wdspack.ops.index import index_dataset

IMAGE_TOKENS, SIZE, MAX_IMAGES, PAD_ID, IMAGE_TOKEN_ID = 64, 224, 16, 11, 10


def load_tokenizer(folder: Path):
    """The Pixtral tokenizer shipped in mistral_common, loaded offline with transformers."""
    import shutil

    import mistral_common
    from transformers import AutoTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(mistral_common.__file__).parent / "data" / "tekken_240911.json", folder / "tekken.json")
    return AutoTokenizer.from_pretrained(str(folder))


def make_samples(n: int, *, images: bool, tokenizer, seed: int = 0
                 ) -> tuple[list[np.ndarray], list[list[bytes]], list[str]]:
    """Chat texts (long-tailed lengths, median ~300 tokens), their token ids with 64 image tokens per
    image, and, optionally, 0–2 JPEGs per sample."""
    rng = np.random.default_rng(seed)
    syllables = ["ka", "lo", "mi", "ne", "ta", "ri", "so", "vu", "de", "pa", "gi", "ho", "ze", "bu", "an", "el"]
    vocab = ["".join(rng.choice(syllables, int(rng.integers(1, 4)))) for _ in range(3000)]
    words = np.clip(rng.lognormal(np.log(200), 0.9, n), 10, 2000).astype(np.int64)
    texts = [" ".join(rng.choice(vocab, int(w))) + "." for w in words]
    counts = rng.choice(3, size=n, p=(0.2, 0.6, 0.2)) if images else np.zeros(n, np.int64)
    palette = [_photo_like(rng) for _ in range(32)] if images else []
    pics = [[palette[int(rng.integers(len(palette)))] for _ in range(int(c))] for c in counts]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    ids = [np.array(e + [IMAGE_TOKEN_ID] * (IMAGE_TOKENS * int(c)), np.uint32) for e, c in zip(encoded, counts)]
    return ids, pics, texts


def fitting(ids: list[np.ndarray], pics: list[list[bytes]], texts: list[str], *, seq_len: int,
            dataset: str = "") -> tuple[list[np.ndarray], list[list[bytes]], list[str]]:
    """The samples that fit one row of ``seq_len`` tokens and :data:`MAX_IMAGES` images, for every loader
    alike: the packer leaves the others out (a pack cannot hold them), the on-the-fly packers could not
    place them in a row, and a padded batch would be wider than the rows. Says how many were left out."""
    keep = [i for i, (x, p) in enumerate(zip(ids, pics)) if len(x) <= seq_len and len(p) <= MAX_IMAGES]
    if len(keep) < len(ids):
        longest = max(len(x) for x in ids)
        print(f"{dataset or 'samples'}: {len(ids) - len(keep)} of {len(ids)} samples do not fit a row of {seq_len} "
              f"tokens and {MAX_IMAGES} images (the longest has {longest} tokens) and are left out of every "
              "loader's data", flush=True)
    return [ids[i] for i in keep], [pics[i] for i in keep], [texts[i] for i in keep]


def _photo_like(rng: np.random.Generator) -> bytes:
    """A 320×240 JPEG with smooth structure and some noise (realistic size and decode cost)."""
    _, x = np.mgrid[0:240, 0:320] / 80.0
    base = np.stack([np.sin(x * rng.uniform(0.5, 3) + rng.uniform(0, 6)) for _ in range(3)], -1)
    img = (127 + 90 * base + rng.normal(0, 12, base.shape)).clip(0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def write_packed(root: Path, ids: list[np.ndarray], pics: list[list[bytes]], *, seq_len: int,
                 packs_per_shard: int = 64) -> int:
    """Plan offline (``plan_packs``, bfd) and write wdspack shards plus a manifest; return the pack count."""
    tok = np.array([len(x) for x in ids])
    img = np.array([len(p) for p in pics])
    plan = plan_packs(tok, img, seq_len=seq_len, max_images=MAX_IMAGES)
    infos = []
    for s in range(0, len(plan), packs_per_shard):
        with ShardWriter(root / shard_name("train", s // packs_per_shard)) as w:
            for k, group in enumerate(plan[s:s + packs_per_shard]):
                owners = [j for j, i in enumerate(group) for _ in pics[i]]
                pack = Pack(np.concatenate([ids[i] for i in group]), np.ones(int(tok[group].sum()), np.uint8),
                            tuple(int(tok[i]) for i in group), tuple(str(i) for i in group),
                            tuple(p for i in group for p in pics[i]), tuple(owners),
                            tuple(IMAGE_TOKENS for _ in owners))
                w.add(f"{s // packs_per_shard:06d}{k:06d}", encode_pack(pack, token_dtype="<u4"),
                      samples=len(group), tokens=pack.num_tokens, images=pack.num_images)
            infos.append(w.close())
    manifest = Manifest(
        seq_len=seq_len, max_images=MAX_IMAGES, algorithm="bfd", seed=0,
        tokenizer={"name": "tekken_240911", "vocab_size": 131_072, "pad_token_id": PAD_ID, "token_dtype": "<u4"},
        image_policy={"kind": "fixed", "tokens_per_image": IMAGE_TOKENS}, shards=tuple(infos),
        totals={"samples_read": len(ids), "samples_packed": len(ids), "samples_dropped": 0, "dropped_by_reason": {},
                "packs": len(plan), "tokens": int(tok.sum()), "images": int(img.sum()),
                "fill_ratio": int(tok.sum()) / (len(plan) * seq_len)})
    (root / "dropped.jsonl").write_text("")
    write_json_atomic(root / "manifest.json", manifest.to_json())
    index_dataset(root)  # the pack index, as `wdspack pack` writes it (balance="cost" reads the packs' costs)
    return len(plan)


def write_per_sample(root: Path, ids: list[np.ndarray], pics: list[list[bytes]], texts: list[str], *,
                     per_shard: int = 500) -> list[str]:
    """One record per sample with stock webdataset's TarWriter: ``ids.npy``, ``txt``, ``0.jpg``, ..."""
    import webdataset as wds

    urls = []
    for s in range(0, len(ids), per_shard):
        url = str(root / f"samples-{s // per_shard:06d}.tar")
        with wds.TarWriter(url) as w:
            for i in range(s, min(s + per_shard, len(ids))):
                w.write({"__key__": f"{i:08d}", "ids.npy": ids[i], "txt": texts[i],
                         **{f"{j}.jpg": p for j, p in enumerate(pics[i])}})
        urls.append(url)
    return urls


def balanced_greedy_knapsack(lengths: list[int], images: list[int], *, seq_len: int, max_images: int,
                             delta: int = 5) -> list[list[int]]:
    """nanoVLM's packer: longest first, each into the lightest bin that fits both budgets."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)
    bins = (sum(lengths) + seq_len - 1) // seq_len + delta
    load, imgs, groups = [0] * bins, [0] * bins, [[] for _ in range(bins)]
    for i in order:
        for b in sorted(range(len(load)), key=load.__getitem__):
            if load[b] + lengths[i] <= seq_len and imgs[b] + images[i] <= max_images:
                break
        else:
            b = len(load)
            load.append(0), imgs.append(0), groups.append([])
        groups[b].append(i)
        load[b] += lengths[i]
        imgs[b] += images[i]
    return [g for g in groups if g]


class PerSampleStream(torch.utils.data.IterableDataset):
    """Stock webdataset per-sample stream, packed on the fly (knapsack) or padded to the longest."""

    def __init__(self, urls: list[str], *, seq_len: int, batch_size: int, packed: bool, buffer_rows: int,
                 tokenizer: str | None = None) -> None:
        self.urls, self.L, self.B, self.packed, self.buffer_rows = urls, seq_len, batch_size, packed, buffer_rows
        self.transform = make_image_transform(size=SIZE)
        self.tokenizer = tokenizer  # a folder: tokenize ``txt`` in the worker (nanoVLM) instead of reading ids

    def _samples(self) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
        import webdataset as wds

        tok = None
        if self.tokenizer is not None:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(self.tokenizer)
        for rec in wds.WebDataset(self.urls, shardshuffle=False, empty_check=False).decode():
            pics = [rec[k] for k in sorted(k for k in rec if k.endswith(".jpg"))]
            if tok is None:
                ids = rec["ids.npy"]
            else:
                ids = np.array(tok(rec["txt"], add_special_tokens=False)["input_ids"]
                               + [IMAGE_TOKEN_ID] * (IMAGE_TOKENS * len(pics)), np.int64)
            yield ids, self.transform(pics)["pixel_values"]  # decoded in the worker, as nanoVLM does

    def _rows(self) -> Iterator[list[tuple[np.ndarray, torch.Tensor]]]:
        if not self.packed:
            for sample in self._samples():
                yield [sample]
            return
        buffer, tokens = [], 0
        for sample in self._samples():
            buffer.append(sample)
            tokens += len(sample[0])
            if tokens >= self.buffer_rows * self.L:
                yield from self._pack(buffer)
                buffer, tokens = [], 0
        yield from self._pack(buffer)

    def _pack(self, buffer):
        groups = balanced_greedy_knapsack([len(x) for x, _ in buffer], [len(p) for _, p in buffer], seq_len=self.L,
                                          max_images=MAX_IMAGES)
        for g in groups:
            yield [buffer[i] for i in g]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        batch = []
        for row in self._rows():
            batch.append(row)
            if len(batch) == self.B:
                yield self._collate(batch)
                batch = []

    def _collate(self, batch) -> dict[str, torch.Tensor]:
        width = self.L if self.packed else max(sum(len(x) for x, _ in row) for row in batch)
        ids = torch.full((len(batch), width), PAD_ID, dtype=torch.int64)
        for b, row in enumerate(batch):
            flat = np.concatenate([x for x, _ in row])
            ids[b, :flat.size] = torch.from_numpy(flat.astype(np.int64))
        pixels = [p for row in batch for _, p in row]
        return {"input_ids": ids, "num_tokens": torch.tensor([sum(len(x) for x, _ in row) for row in batch]),
                "pixel_values": torch.cat(pixels), "num_images": torch.tensor(sum(len(p) for p in pixels))}


def measure(loader, *, workers: int) -> dict[str, float]:
    """One full pass: rates over the whole pass (worker start-up included, so buffered packers
    are not flattered), per worker; ``first_batch_s`` is the start-up latency, ``main_cpu_s`` the
    main process's CPU time over the pass (receiving the batches, and this loop)."""
    rows = real = total = images = 0
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    first = None
    for b in loader:
        first = first or time.perf_counter() - t0
        rows += b["input_ids"].shape[0]
        total += b["input_ids"].numel()
        real += int(b["num_tokens"].sum())
        images += int(b["image_mask"].sum()) if "image_mask" in b else int(b["num_images"])
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    s = wall * workers
    return {"rows_per_s": rows / s, "tokens_per_s": real / s, "images_per_s": images / s,
            "padding": 1 - real / max(total, 1), "rows": rows, "first_batch_s": first or 0.0, "seconds": wall,
            "images": images, "images_per_s_all": images / wall,
            "main_cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)}


def _raw_worker(flat: list[bytes], share: slice, start, out) -> None:
    t = make_image_transform(size=SIZE)
    mine = flat[share]
    start.wait()
    t0, c0 = time.perf_counter(), time.thread_time()
    for p in mine:
        t.decode_resized([p])
    out.put((t0, time.perf_counter(), len(mine), time.thread_time() - c0))


def raw_side_by_side(pics: list[list[bytes]], processes: int,
                     per_process: int | None = None) -> tuple[float, int, dict[str, float]]:
    """Aggregate images/s of ``processes`` raw decoders started together (fork), each decoding and resizing
    (``decode_resized``: no loader, no normalising) every ``processes``-th of the same images (all of
    them, or the first ``processes × per_process``): from the first start to the last finish; the count;
    and decoding's CPU per image (ms) and its wall over its CPU (:func:`decode_clock.since`'s keys)."""
    flat = [p for ps in pics for p in ps]
    if per_process is not None:
        flat = (flat * (processes * per_process // max(1, len(flat)) + 1))[: processes * per_process]
    ctx = mp.get_context("fork")
    start, out = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_raw_worker, args=(flat, slice(i, None, processes), start, out))
             for i in range(processes)]
    for pr in procs:
        pr.start()
    got = [out.get() for _ in procs]
    for pr in procs:
        pr.join()
    cpu, wall = sum(g[3] for g in got), sum(g[1] - g[0] for g in got)
    return len(flat) / (max(g[1] for g in got) - min(g[0] for g in got)), len(flat), per_image(cpu, wall, len(flat))


def profile_worker(root: Path, *, batch_size: int, pixel_dtype: str) -> dict[str, float]:
    """One pass with one worker, profiled (cProfile) inside the worker: its seconds in decode + resize, in
    placing the pixels (normalise or copy into the recycled buffer), in collating the text, and in all."""
    from wdspack import make_loader

    with tempfile.TemporaryDirectory() as d:
        dump = Path(d) / "worker.prof"
        loader = make_loader(str(root), batch_size=batch_size, num_workers=1, shuffle=False, pin_memory=False,
                             image_transform=make_image_transform(size=SIZE), pixel_dtype=pixel_dtype,
                             persistent_workers=False)
        loader.dataloader.worker_init_fn = _ProfileWorker(str(dump))
        for _ in loader:
            pass
        del loader
        for _ in range(100):  # the worker writes its profile as it exits
            if dump.exists():
                break
            time.sleep(0.1)
        profile = pstats.Stats(str(dump))
    stats = profile.stats  # type: ignore[attr-defined]
    cumulative = {(Path(f).name, name): ct for (f, _, name), (_, _, _, ct, _) in stats.items()}

    def cum(module: str, name: str) -> float:
        return cumulative.get((module, name), 0.0)

    parts = {"decode_resize_s": cum("images.py", "decode_resized"),
             "place_pixels_s": cum("buffers.py", "write_pixel_slots"),
             "collate_text_s": cum("collate.py", "collate_packs"),
             "total_s": profile.total_tt}  # type: ignore[attr-defined]
    parts["rest_s"] = parts["total_s"] - parts["decode_resize_s"] - parts["place_pixels_s"] - parts["collate_text_s"]
    return parts


class _ProfileWorker:
    """``worker_init_fn``: profile the worker, and write the profile to ``path`` as it exits."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, worker_id: int) -> None:
        from multiprocessing import util

        prof = cProfile.Profile()
        prof.enable()
        util.Finalize(None, prof.dump_stats, args=(self.path,), exitpriority=100)


def raw_decode_rate(pics: list[list[bytes]], n: int = 300, repeats: int = 3) -> float:
    """Images/s of one process decoding, resizing and normalising ``n`` images one by one; the best of ``repeats``."""
    t = make_image_transform(size=SIZE)
    flat = [p for ps in pics for p in ps][:n]
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        for p in flat:
            t([p])
        best = max(best, len(flat) / (time.perf_counter() - t0))
    return best


def balance(args) -> str | None:
    """``make_loader``'s ``balance`` for ``--balance``: ``"cost"``, or ``None`` for the plain split."""
    return None if args.balance == "none" else args.balance


def warm_up(loader, batches: int) -> tuple[float, int]:
    """Take ``batches`` batches (one from each worker) and drop them; the seconds to the first from a cold
    start, and the images they held. The loader resumes after them on its next ``iter`` (its position is
    kept), with its workers warm."""
    t0 = time.perf_counter()
    it = iter(loader)
    cold, images = 0.0, 0
    for _ in range(batches):
        images += int(next(it)["image_mask"].sum())
        cold = cold or time.perf_counter() - t0
    it.close()
    return cold, images


def _children() -> list[int]:
    """The pids of this process's children (Linux ``/proc``)."""
    me, out = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:  # gone meanwhile
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                out.append(int(entry))
    return out


def _children_cpu(pids: list[int]) -> float:
    """User + system CPU seconds of the live processes ``pids`` so far (``/proc/PID/stat``)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def scaling(root: Path, pics: list[list[bytes]], args) -> list[dict]:
    """The image pass at ``--workers N``, float32 and uint8, against N raw decoders side by side.

    ``--rounds`` rounds of raw, float32, uint8 back to back (the order rotates by one each round);
    each loader pass is compared with the raw run of its own round (the host's load drifts between
    rounds). Besides wall-clock rates, each is also given per CPU second (the workers' and the main
    process's, or the raw decoders'), which a busy host disturbs less.
    """
    from wdspack import make_loader

    n = args.workers
    rounds: list[dict[str, dict]] = []
    for i in range(args.rounds):
        row: dict[str, dict] = {}
        order = ["raw", "float32", "uint8"]
        for what in order[i % 3:] + order[: i % 3]:
            if what == "raw":
                c0 = _cpu(resource.RUSAGE_CHILDREN)
                rate, count, split = raw_side_by_side(pics, n, args.raw_images)
                row["raw"] = {"images_per_s_all": rate, "images": count, **split,
                              "images_per_cpu_s": count / (_cpu(resource.RUSAGE_CHILDREN) - c0)}
                continue
            dtype, clock = what, DecodeClock(n)
            before = set(_children())
            with clock.installed():  # forked into the workers with them
                loader = make_loader(str(root), batch_size=args.batch_size, num_workers=n, shuffle=False,
                                     pin_memory=False, persistent_workers=True, balance=balance(args),
                                     image_transform=make_image_transform(size=SIZE), pixel_dtype=dtype)
                cold, warm_images = warm_up(loader, n)
                workers = [pid for pid in _children() if pid not in before]
                c0, decoded = _children_cpu(workers), clock.totals()
                r = measure(loader, workers=n)  # the rest of the epoch, with warm workers
                r["workers_cpu_s"] = _children_cpu(workers) - c0
                r.update(since(clock, decoded))
                del loader
            r["images_per_cpu_s"] = r["images"] / (r["workers_cpu_s"] + r["main_cpu_s"])
            # the workers' CPU besides decoding, and the main process's, per image delivered
            own_s = r["workers_cpu_s"] - r["decode_cpu_ms"] * r["decoded_images"] / 1e3
            per_image = 1e3 / max(r["images"], 1)
            r.update(own_cpu_ms=own_s * per_image, main_cpu_ms=r["main_cpu_s"] * per_image,
                     workers_busy=r["workers_cpu_s"] / (n * r["seconds"]))
            r.update(cold_start_s=cold, warm_up_images=warm_images, balance=args.balance)
            row[dtype] = r
        for dtype in ("float32", "uint8"):
            row[dtype]["of_raw_n"] = row[dtype]["images_per_s_all"] / row["raw"]["images_per_s_all"]
            row[dtype]["of_raw_cpu"] = row[dtype]["images_per_cpu_s"] / row["raw"]["images_per_cpu_s"]
        rounds.append(row)
    out = []
    print(f"\n| round | pixel_dtype | images/s, all {n} | raw × {n} side by side | of raw | per CPU s, of raw "
          "| cold start | main CPU |\n|---|---|---:|---:|---:|---:|---:|---:|")
    for i, row in enumerate(rounds):
        raw = row["raw"]["images_per_s_all"]
        for dtype in ("float32", "uint8"):
            r = row[dtype]
            r.update(dataset="image-bearing", loader=f"wdspack {dtype}", pixel_dtype=dtype, workers=n, round=i,
                     raw_n=raw)
            out.append(r)
            print(f"| {i} | {dtype} | {r['images_per_s_all']:.1f} | {raw:.1f} | {r['of_raw_n']:.1%} | "
                  f"{r['of_raw_cpu']:.1%} | {r['cold_start_s']:.2f} s | {r['main_cpu_s']:.2f} s of "
                  f"{r['seconds']:.1f} s |", flush=True)
        out.append({"dataset": "image-bearing", "loader": f"raw decode + resize, {n} side by side", "workers": n,
                    "round": i, **row["raw"]})
    for dtype in ("float32", "uint8"):
        wall = sorted(row[dtype]["of_raw_n"] for row in rounds)
        cpu = sorted(row[dtype]["of_raw_cpu"] for row in rounds)
        median = sorted(rounds, key=lambda row: row[dtype]["of_raw_n"])[len(rounds) // 2]
        summary = {"dataset": "image-bearing", "loader": f"summary {dtype}", "workers": n,
                   "of_raw_n_median": wall[len(wall) // 2], "of_raw_n_min": wall[0], "of_raw_n_max": wall[-1],
                   "of_raw_cpu_median": cpu[len(cpu) // 2],
                   "cpu_split": split_line(dtype, n, median[dtype], median["raw"])}  # of the median round
        out.append(summary)
        print(f"\n{dtype}, {n} workers: {summary['of_raw_n_median']:.1%} of {n} raw decoders side by side (median "
              f"of {len(wall)} rounds, {wall[0]:.1%}-{wall[-1]:.1%}); per CPU second "
              f"{summary['of_raw_cpu_median']:.1%}\n  {summary['cpu_split']}", end="", flush=True)
    print()
    if args.profile:
        print("\n| pixel_dtype | one worker, profiled | decode + resize | place pixels | collate text | rest |\n"
              "|---|---:|---:|---:|---:|---:|")
        for dtype in ("float32", "uint8"):
            prof = profile_worker(root, batch_size=args.batch_size, pixel_dtype=dtype)
            out.append({"dataset": "image-bearing", "loader": f"profile {dtype}", **prof})
            t = prof["total_s"]
            print(f"| {dtype} | {t:.2f} s | {prof['decode_resize_s'] / t:.1%} | {prof['place_pixels_s'] / t:.1%} | "
                  f"{prof['collate_text_s'] / t:.1%} | {prof['rest_s'] / t:.1%} |", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=4000, help="image-bearing samples")
    ap.add_argument("--text-samples", type=int, default=16000, help="text-only samples")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--buffer-rows", type=int, default=32, help="on-the-fly knapsack buffer, in rows of seq_len")
    ap.add_argument("--only", choices=("text", "images"), help="run one dataset only")
    ap.add_argument("--loaders", choices=("all", "wdspack"), default="all",
                    help="'wdspack': skip the per-sample comparison loaders")
    ap.add_argument("--raw-images", type=int, default=None,
                    help="images each side-by-side raw decoder decodes (--loaders wdspack; default: its share of all)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of raw, float32, uint8 (--loaders wdspack)")
    ap.add_argument("--balance", choices=("cost", "none"), default="cost",
                    help="the workers' split with --loaders wdspack: 'cost' (balance='cost': each step's batches of "
                         "about equal cost, so no worker waits on a slower one's turn) or 'none' (default cost)")
    ap.add_argument("--profile", action="store_true", help="also profile one in-process image pass per pixel dtype")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    results: list[dict] = []
    if args.loaders == "all" or args.only != "images":
        print("| dataset | loader | rows/s | real tokens/s | images/s | padding | rows | first batch |\n"
              "|---|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as d:  # the tokenizer's copy, gone afterwards
        results = run(args, Path(d), results)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


def run(args: argparse.Namespace, work: Path, results: list[dict]) -> list[dict]:
    """The passes ``main`` asked for; ``work`` holds the tokenizer."""
    from wdspack import make_loader

    tokenizer = load_tokenizer(work / "tokenizer")
    for images in (False, True):
        if args.only is not None and images != (args.only == "images"):
            continue
        name = "image-bearing" if images else "text-only"
        ids, pics, texts = make_samples(args.samples if images else args.text_samples, images=images,
                                        tokenizer=tokenizer)
        ids, pics, texts = fitting(ids, pics, texts, seq_len=args.seq_len, dataset=name)
        with tempfile.TemporaryDirectory() as d:
            root = Path(d)
            (root / "packed").mkdir()
            write_packed(root / "packed", ids, pics, seq_len=args.seq_len)
            urls = write_per_sample(root, ids, pics, texts) if args.loaders == "all" else []
            if images and args.loaders == "wdspack":
                results += scaling(root / "packed", pics, args)
                continue
            loaders = {"wdspack": make_loader(str(root / "packed"), batch_size=args.batch_size,
                                              num_workers=args.workers, shuffle=False, pin_memory=False,
                                              image_transform=make_image_transform(size=SIZE) if images else None)}
            others = (("on-the-fly knapsack, tokenizing in the worker", True, work / "tokenizer"),
                      ("on-the-fly knapsack, pre-tokenized ids", True, None),
                      ("naive pad-to-longest, pre-tokenized ids", False, None))
            for label, packed, tok in others if args.loaders == "all" else ():
                ds = PerSampleStream(urls[: max(1, len(urls) // args.workers) * args.workers], seq_len=args.seq_len,
                                     batch_size=args.batch_size, packed=packed, buffer_rows=args.buffer_rows,
                                     tokenizer=None if tok is None else str(tok))
                loaders[label] = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=args.workers)
            base = raw = None
            for label, loader in loaders.items():
                if images and label == "wdspack":
                    raw = raw_decode_rate(pics)
                r = measure(loader, workers=args.workers)
                if images and label == "wdspack":
                    raw = max(raw, raw_decode_rate(pics))
                    r["of_raw"] = share = r["images_per_s"] / raw
                base = base or r["tokens_per_s"]
                results.append({"dataset": name, "loader": label, **r})
                print(f"| {name} | {label} | {r['rows_per_s']:.1f} | {r['tokens_per_s']:,.0f} "
                      f"({r['tokens_per_s'] / base:.2f}×) | {r['images_per_s']:.1f} | {r['padding']:.1%} | "
                      f"{r['rows']} | {r['first_batch_s']:.2f} s |", flush=True)
            if images:
                results.append({"dataset": name, "loader": "raw decode", "images_per_s": raw})
                print(f"| {name} | raw decode + resize, one process | | | {raw:.1f} | | | |\n"
                      f"\nwdspack's images/s per worker: {share:.1%} of the raw rate", flush=True)
    return results


if __name__ == "__main__":
    sys.exit(main())
