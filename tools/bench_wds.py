"""make_loader vs a plain webdataset pipeline with wdspack's stages: same data, same run, same server.

    python -m tools.bench_wds                                  # ~2 min: 16 uneven shards, B = 8, 0/1/2 workers, 2 ranks
    python -m tools.bench_wds --json docs/benchmarks/data/bench_wds.json
    python -m tools.bench_wds --shards 8 --packs 20 60 --repeats 1     # quicker

One seeded synthetic dataset (``tests/support/synthetic.py``; shards of uneven pack counts, as byte-cut
shards are; up to ``--max-images`` small PNG/JPEG images per pack, decoded and resized to
``--image-size`` by the same transform) is served by ``tests/support/httpserver.py`` on loopback, which
logs every request. Two readers make full passes over it:

- **make_loader**: ``wdspack.make_loader(URL, batch_size=B, num_workers=W, seed=0)`` (shard order
  and a 256-pack buffer shuffled, seeded).
- **webdataset + wdspack.loader.wds**: ``read_dataset(URL)`` (the manifest), then
  ``DataPipeline(SimpleShardList, detshuffle, split_by_node, split_by_worker, tarfile_to_samples,
  shuffle(256), to_examples, batched(B))`` in ``wds.WebLoader(num_workers=W)``; webdataset opens
  ``http://`` shards with ``curl``.

Reported per reader and worker count: batches/s and packs/s over the whole pass (worker start-up
included; the best of ``--repeats`` passes), requests per epoch (GETs, of which ranged), and, for
two simulated ranks (``rank=``/``world_size=``; ``RANK``/``WORLD_SIZE`` for ``split_by_node``),
the steps each rank gets. A last row cuts one shard's response once, mid-body (the server's
``cut`` fault), and counts the packs each reader still delivers.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

import webdataset as wds  # noqa: E402

import wdspack  # noqa: E402
from wdspack.loader.wds import batched, read_dataset, to_examples  # noqa: E402


def write_data(folder: Path, *, shards: int, packs: tuple[int, int], seq_len: int, max_images: int,
               seed: int) -> list[int]:
    from tests.support.synthetic import write_dataset

    rng = np.random.default_rng(seed)
    counts = [int(c) for c in rng.integers(packs[0], packs[1] + 1, size=shards)]
    write_dataset(folder, shards=shards, packs_per_shard=counts, seq_len=seq_len, max_images=max_images, seed=seed,
                  pack_index=True)
    return counts


def wds_pipeline(url: str, *, batch_size: int, transform, seed: int = 0) -> wds.DataPipeline:
    info = read_dataset(url)
    return wds.DataPipeline(
        wds.SimpleShardList(list(info.urls)), wds.detshuffle(bufsize=len(info.urls), seed=seed),
        wds.split_by_node, wds.split_by_worker,
        wds.tarfile_to_samples(handler=wds.warn_and_continue), wds.shuffle(256, initial=256),
        to_examples(info, image_transform=transform, handler=wds.warn_and_continue), batched(batch_size, dataset=info))


def make_reader(kind: str, url: str, *, batch_size: int, workers: int, transform, rank: int = 0, world: int = 1):
    if kind == "make_loader":
        return wdspack.make_loader(url, batch_size=batch_size, num_workers=workers, seed=0, image_transform=transform,
                                   rank=rank, world_size=world)
    return wds.WebLoader(wds_pipeline(url, batch_size=batch_size, transform=transform), batch_size=None,
                         num_workers=workers)


def one_pass(kind: str, server, *, batch_size: int, workers: int, transform, rank: int = 0, world: int = 1) -> dict:
    """Build the reader and read one epoch; time, batches, packs and the requests it made."""
    from tests.support.synthetic import pack_numbers

    mark = len(server.log)
    env = {"RANK": str(rank), "WORLD_SIZE": str(world)} if world > 1 and kind != "make_loader" else {}
    os.environ.update(env)
    try:
        t0 = time.perf_counter()
        reader = make_reader(kind, server.url, batch_size=batch_size, workers=workers, transform=transform,
                             rank=rank, world=world)
        batches = packs = 0
        seen: list[int] = []
        for batch in reader:
            batches += 1
            numbers = pack_numbers(batch["input_ids"])
            packs += len(numbers)
            seen.extend(numbers)
            if kind == "make_loader" and batches == len(reader):
                break  # one epoch (the loader would go on into the next)
        seconds = time.perf_counter() - t0
    finally:
        for k in env:
            os.environ.pop(k, None)
    del reader
    gc.collect()
    log = server.log[mark:]
    shard_gets = [r for r in log if r.path.endswith(".tar")]
    return {"seconds": round(seconds, 3), "batches": batches, "packs": packs, "distinct_packs": len(set(seen)),
            "batches_per_s": round(batches / seconds, 1), "packs_per_s": round(packs / seconds, 1),
            "requests": len(log), "shard_gets": len(shard_gets),
            "ranged": sum(r.range_start is not None for r in shard_gets)}


def best(kind: str, server, repeats: int, **kw) -> dict:
    runs = [one_pass(kind, server, **kw) for _ in range(repeats)]
    top = max(runs, key=lambda r: r["batches_per_s"])
    return {**top, "batches_per_s_all": [r["batches_per_s"] for r in runs]}


def with_a_cut(kind: str, server, *, shard: str, at: int, batch_size: int, transform) -> dict:
    """One pass with the first response for ``shard`` cut after ``at`` body bytes."""
    from tests.support.httpserver import cut

    server.script(f"/{shard}", cut(at))
    try:
        out = one_pass(kind, server, batch_size=batch_size, workers=1, transform=transform)
    finally:
        server.script(f"/{shard}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--packs", type=int, nargs=2, default=(30, 110), metavar=("MIN", "MAX"), help="packs per shard")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--max-images", type=int, default=4)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="0: in this process")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from tests.support.httpserver import serve

    transform = wdspack.make_image_transform(size=args.image_size)
    kinds = ("make_loader", "webdataset + wdspack.loader.wds")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "packed"
        counts = write_data(folder, shards=args.shards, packs=tuple(args.packs), seq_len=args.seq_len,
                            max_images=args.max_images, seed=args.seed)
        total = sum(counts)
        size = sum(p.stat().st_size for p in folder.glob("*.tar"))
        print(f"{args.shards} shards, packs per shard {min(counts)}-{max(counts)} "
              f"({total} packs, {size / 1e6:.1f} MB), "
              f"seq_len {args.seq_len}, <= {args.max_images} images per pack at {args.image_size} px, "
              f"B = {args.batch_size}", flush=True)
        rows, ranks, faults = [], [], []
        with serve(folder) as server:
            for workers in args.workers:
                for kind in kinds:
                    r = best(kind, server, args.repeats, batch_size=args.batch_size, workers=workers,
                             transform=transform)
                    rows.append({"reader": kind, "workers": workers, **r})
                    print(f"  {kind:26s} workers {workers}: {r['batches_per_s']:7.1f} batches/s "
                          f"({r['packs_per_s']:.0f} packs/s), {r['batches']} batches, {r['requests']} requests "
                          f"({r['shard_gets']} shard GETs, {r['ranged']} ranged)", flush=True)
            for kind in kinds:
                steps = [one_pass(kind, server, batch_size=args.batch_size, workers=1, transform=transform,
                                  rank=rank, world=2) for rank in range(2)]
                ranks.append({"reader": kind, "steps": [s["batches"] for s in steps],
                              "packs": [s["packs"] for s in steps], "requests": [s["requests"] for s in steps]})
                print(f"  {kind:26s} 2 ranks: steps {ranks[-1]['steps']}, packs {ranks[-1]['packs']}", flush=True)
            victim = min(folder.glob("*.tar"))
            for kind in kinds:
                f = with_a_cut(kind, server, shard=victim.name, at=victim.stat().st_size // 2,
                               batch_size=args.batch_size, transform=transform)
                faults.append({"reader": kind, "cut": f"{victim.name} at byte {victim.stat().st_size // 2}",
                               **{k: f[k] for k in ("batches", "packs", "distinct_packs", "shard_gets", "ranged")}})
                print(f"  {kind:26s} one response cut mid-shard: {f['distinct_packs']} distinct packs of {total}, "
                      f"{f['shard_gets']} shard GETs ({f['ranged']} ranged)", flush=True)
    result = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch": __import__("torch").__version__, "webdataset": wds.__version__},
        "data": {"shards": args.shards, "packs_per_shard": counts, "packs": total, "bytes": size,
                 "seq_len": args.seq_len, "max_images": args.max_images, "image_size": args.image_size,
                 "batch_size": args.batch_size},
        "throughput": rows, "two_ranks": ranks, "cut_response": faults,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
