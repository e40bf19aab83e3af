"""The pack job's speed per process against the tokenizer's floor, side by side in one run.

    python -m tools.bench_pack_speed                          # 2000 LLaVA records + 2000 captions
    python -m tools.bench_pack_speed --quick                  # a few hundred: a smoke run
    python -m tools.bench_pack_speed --json docs/benchmarks/data/bench_pack_speed.json
    python -m tools.bench_pack_speed --photos --captions 0 --no-processor   # chats with photo-sized JPEGs

1. **Chat (LLaVA / ShareGPT with ``<image>``).** Held-out-style records: one JPEG each (256-640 px,
   Pillow-drawn, saved as files; ``--photos``: photo-like ones, 640 px wide and about 85 KB), 1-5
   rounds of question and answer with long-tailed answers, the real Pixtral tokenizer (``tekken.json``
   from mistral_common) and its chat template, 16 images per pack. The **floor** is what any packer
   pays: render each record's chat template once and tokenize the text once
   (``apply_chat_template(..., tokenize=False)`` then ``tokenizer(text)``), records
   already in memory. Against it: ``pack_dataset(..., RunOptions(workers=1))`` end to end (read,
   check images, tokenize, spool, plan, write shards), and its **measure** stage alone (the same
   partitions through the pack job's own measure task: read, images checked, tokenized, spooled).
   The builder (tokenizer, template) is loaded before timing: start-up is paid once per process,
   and is reported on its own.
2. **Processor mode** (``SampleConfig(processor=...)``: the real ``Qwen2_5_VLProcessor`` class of
   ``examples/tiny_vlm``, each image 4-64 tokens by its size) on the same records. Its floor renders
   each record once, puts each image's tokens in place of its placeholder (the processor's rule,
   computed beforehand) and tokenizes the expanded text once.
3. **Captions (WebDataset shards).** ``.jpg`` + ``.txt`` pairs; the floor tokenizes each caption
   once; the pack job and its measure stage as above.

Each figure is samples per CPU second of this process, the best of ``--repeats`` rounds that run the
floor, the measure stage and the pack job in turn (so drift in this host's speed touches all three);
ratios are pack / floor, and ``*_vs_floor_median`` the median of each round's own ratio.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

WORDS = ("the a an image shows picture photo scene object color red green blue yellow bright dark small large left "
         "right top bottom center near far person dog cat car tree sky road building window table chart graph value "
         "trend increase decrease because therefore however first second finally answer question describe explain "
         "count how many what where why which is are was were has have this that these those with without under "
         "over between inside outside").split()
QUESTIONS = ("What is the man doing in the picture?", "Describe the image in detail.",
             "What color is the largest object?", "How many people are visible?", "Where might this photo be taken?",
             "What can you infer about the weather?", "Is there anything unusual here?")


def _text(rng: np.random.Generator, n: int) -> str:
    words = [WORDS[int(k)] for k in rng.integers(0, len(WORDS), n)]
    out, i = [], 0
    while i < len(words):  # sentences of 6-20 words
        j = i + int(rng.integers(6, 21))
        out.append(" ".join(words[i:j]).capitalize() + ".")
        i = j
    return " ".join(out)


def _jpeg(rng: np.random.Generator) -> bytes:
    w, h = (int(v) for v in rng.integers(256, 641, 2))
    img = Image.new("RGB", (w, h), tuple(int(c) for c in rng.integers(0, 256, 3)))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 9))):
        x0, y0 = int(rng.integers(0, w - 20)), int(rng.integers(0, h - 20))
        box = (x0, y0, x0 + int(rng.integers(10, w // 2)), y0 + int(rng.integers(10, h // 2)))
        draw.ellipse(box, fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=85)
    return buf.getvalue()


def _photo(rng: np.random.Generator) -> bytes:
    """A JPEG that costs what a photo does to decode: COCO's size (640 wide, 360-640 high), smooth colour
    plus sensor-like noise, quality 85 (about 85 KB, where the drawn ones are about 9 KB)."""
    w, h = 640, int(rng.integers(360, 641))
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * rng.uniform(0.1, 0.4) + y * rng.uniform(0.1, 0.4) + rng.uniform(0, 255)) % 256
                     for _ in range(3)], -1)
    img = Image.fromarray(np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=85)
    return buf.getvalue()


def make_llava(folder: Path, n: int, seed: int = 0, photos: bool = False) -> Path:
    """``n`` LLaVA records (``folder/llava.jsonl``) with one JPEG each under ``folder/images``
    (drawn shapes, or with ``photos`` :func:`_photo`'s)."""
    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    with open(folder / "llava.jsonl", "w", encoding="utf-8") as f:
        for k in range(n):
            name = f"images/{k:07d}.jpg"
            (folder / name).write_bytes(_photo(rng) if photos else _jpeg(rng))
            turns = []
            for r in range(int(rng.choice([1, 1, 2, 3, 4, 5]))):  # LLaVA-Instruct: many single, a tail of rounds
                q = QUESTIONS[int(rng.integers(len(QUESTIONS)))] + (" " + _text(rng, int(rng.integers(0, 12))))
                turns.append({"from": "human", "value": ("<image>\n" if r == 0 else "") + q.strip()})
                answer = int(min(400, rng.lognormal(3.6, 0.8)))  # median ~37 words, a long tail
                turns.append({"from": "gpt", "value": _text(rng, max(3, answer))})
            f.write(json.dumps({"id": f"llava-{k}", "image": name, "conversations": turns}) + "\n")
    return folder / "llava.jsonl"


def make_captions(folder: Path, n: int, seed: int = 1, per_shard: int = 1000) -> list[str]:
    """``n`` image + caption pairs as WebDataset shards (``.jpg``, ``.txt``)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(0, n, per_shard):
        path = folder / f"{s // per_shard:05d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for k in range(s, min(n, s + per_shard)):
                for ext, data in (("jpg", _jpeg(rng)), ("txt", _text(rng, int(rng.integers(5, 40))).encode())):
                    info = tarfile.TarInfo(f"{k:09d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


def _best(fn, repeats: int) -> float:
    """The least CPU time of ``repeats`` runs: one process does all the work, and CPU time is what
    other jobs on a shared machine disturb least (wall time moved 2x between runs here)."""
    best = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def chat_floor(builder, path: Path) -> tuple[list[list[dict]], callable]:
    """The records as the template takes them, and the floor: one render + one tokenize per record."""
    convs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        convs.append([{"role": "user" if t["from"] == "human" else "assistant",
                       "content": t["value"].replace("<image>", builder.image_token)} for t in rec["conversations"]])
    tok, template = builder.tokenizer, builder.template

    def run() -> None:
        for messages in convs:
            text = tok.apply_chat_template(messages, chat_template=template, tokenize=False)
            tok(text, add_special_tokens=False)
    return convs, run


def caption_floor(builder, paths: list[str]) -> callable:
    captions = []
    for p in paths:
        with tarfile.open(p) as tar:
            captions += [tar.extractfile(m).read().decode() for m in tar.getmembers() if m.name.endswith(".txt")]
    tok = builder.tokenizer
    return lambda: [tok(c, add_special_tokens=False) for c in captions]


def measure_stage(sources: list[str], sample_config, config, work: Path) -> callable:
    """The pack job's measure task over every partition, in this process (what workers=1 runs)."""
    from wdspack.packer.job import _measure_partition
    from wdspack.packer.sources import list_partitions

    parts = list_partitions(sources, records_per_partition=config.records_per_partition)

    def run() -> None:
        shutil.rmtree(work, ignore_errors=True)
        (work / "spool").mkdir(parents=True)
        for i, p in enumerate(parts):
            _measure_partition(i, p, sample_config, "skip", config.seq_len, config.max_images, str(work))
    return run


def _probe_images(builder, images, sid):
    """The images checked from their headers as a chat's are (the image kind's pack-time ``probe``)."""
    from wdspack.media.image import prepare

    return prepare.probe(builder, tuple(images), sid)


def chat_stages(builder, path: Path, repeats: int) -> dict:
    """Where a chat record's measure time goes, CPU ms per 1,000 records: reading the records (JSON
    lines, image files), checking their images, and the text (render with the assistant spans,
    tokenize with offsets, the loss mask and image tokens) by the builder, which is the floor's work."""
    from wdspack.packer.fastpath import span_mask
    from wdspack.packer.sources import list_partitions
    from wdspack.packer.sources.readers import iter_records

    parts = list_partitions([str(path)], records_per_partition=10**9)
    records = [r for p in parts for r in iter_records(p)]
    checked = [(r, _probe_images(builder, r.images, r.sample_id)) for r in records]
    messages = [[builder._message(m) for m in r.messages] for r in records]

    def text() -> None:  # in the job's stages (SampleBuilder.build_chats): render 128, tokenize them, finish them
        for a in range(0, len(records), 128):
            chunk = list(zip(checked[a:a + 128], messages[a:a + 128]))
            rendered = [builder._render(m, r.sample_id) for (r, _), m in chunk]
            encoded = [builder._encoder(t) for t, _ in rendered]
            for ((r, (images, counts)), _), (_, spans), (ids, offsets) in zip(chunk, rendered, encoded):
                builder._expand(r.sample_id, ids, span_mask(offsets, spans), images, counts)

    n = len(records) / 1000
    return {"read_ms": _best(lambda: [r for p in parts for r in iter_records(p)], repeats) * 1000 / n,
            "images_ms": _best(lambda: [_probe_images(builder, r.images, r.sample_id) for r in records],
                               repeats) * 1000 / n,
            "text_ms": _best(text, repeats) * 1000 / n}


def processor_floor(builder, path: Path) -> callable:
    """Render once, splice each image's replacement (computed beforehand), tokenize the expanded text once."""
    from wdspack.packer.sources import list_partitions
    from wdspack.packer.sources.readers import iter_records

    records = [r for p in list_partitions([str(path)], records_per_partition=10**9) for r in iter_records(p)]
    items = []
    for r in records:
        _, sizes = _probe_images(builder, r.images, r.sample_id)
        reps = builder.family.image.replacements(builder.processor, sizes)
        items.append(([builder._message(m) for m in r.messages], reps))
    tok, template, ph = builder.tokenizer, builder.template, builder.image_token

    def run() -> None:
        for messages, reps in items:
            pieces = tok.apply_chat_template(messages, chat_template=template, tokenize=False).split(ph)
            tok("".join(p + r for p, r in zip(pieces, [*reps, ""])), add_special_tokens=False)
    return run


def pack_run(sources: list[str], sample_config, config, out: Path) -> callable:
    from wdspack.packer.job import pack_dataset

    def run() -> None:
        shutil.rmtree(out, ignore_errors=True)
        pack_dataset(sources, out, sample_config=sample_config, config=config)
    return run


def bench(n_chat: int, n_captions: int, repeats: int, work: Path, n_processor: bool = True,
          photos: bool = False) -> dict:
    import mistral_common

    from wdspack.packer.config import PackConfig, RunOptions
    from wdspack.packer.samples import SampleConfig, get_builder
    from wdspack.packer.text import PretrainConfig

    tok_dir = work / "tekken"
    tok_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(mistral_common.__file__).parent / "data" / "tekken_240911.json", tok_dir / "tekken.json")
    template = (Path(__file__).resolve().parents[1] / "examples" / "chat_templates" / "pixtral.jinja").read_text()
    config = PackConfig(seq_len=4096, max_images=16, run=RunOptions(workers=1))
    result: dict = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
                    "repeats": repeats}

    chat_cfg = SampleConfig(str(tok_dir), chat_template=template, tokens_per_image=64, image_token="[IMG]")
    t = time.perf_counter()
    builder = get_builder(chat_cfg)
    result["startup_s"] = round(time.perf_counter() - t, 3)
    path = make_llava(work / "llava", n_chat, photos=photos)
    convs, floor = chat_floor(builder, path)
    floor()  # warm-up: the template compiled, the page cache filled
    row = {"records": n_chat, "rounds_mean": round(float(np.mean([len(c) / 2 for c in convs])), 2),
           "images": "photo-like" if photos else "drawn"}
    row.update(_rounds(n_chat, repeats, floor, measure_stage([str(path)], chat_cfg, config, work / "spool-chat"),
                       pack_run([str(path)], chat_cfg, config, work / "out-chat")))
    row["stages_ms_per_1000"] = {k: round(v, 1) for k, v in chat_stages(builder, path, repeats).items()}
    row["stages_ms_per_1000"]["floor_ms"] = round(1e6 / row["floor_sps"], 1)
    result["chat"] = _ratios(row)

    if n_processor:
        from examples.tiny_vlm import qwen2_5_vl
        from wdspack.models import save_processor

        proc_cfg = SampleConfig(processor=str(save_processor(qwen2_5_vl.processor(work / "qwen-tok"),
                                                             work / "qwen-processor")))
        floor = processor_floor(get_builder(proc_cfg), path)
        floor()
        row = {"records": n_chat, **_rounds(n_chat, repeats, floor,
                                            measure_stage([str(path)], proc_cfg, config, work / "spool-proc"),
                                            pack_run([str(path)], proc_cfg, config, work / "out-proc"))}
        result["processor"] = _ratios(row)

    if n_captions:
        cap_cfg = SampleConfig(str(tok_dir), tokens_per_image=64, image_token="[IMG]",
                               pretrain=PretrainConfig(eos_token="</s>"))
        get_builder(cap_cfg)
        shards = make_captions(work / "captions", n_captions)
        floor = caption_floor(get_builder(cap_cfg), shards)
        floor()
        row = {"records": n_captions, **_rounds(n_captions, repeats, floor,
                                                measure_stage(shards, cap_cfg, config, work / "spool-cap"),
                                                pack_run(shards, cap_cfg, config, work / "out-cap"))}
        result["captions"] = _ratios(row)
    return result


def _rounds(n: int, repeats: int, floor, measure, pack) -> dict:
    """Floor, measure and pack run in turn, ``repeats`` rounds: this host's speed drifts by tens of
    percent within minutes, so the three share each stretch of it. The best of each, and per round
    the ratios to that round's floor (their median says how much the drift moved them)."""
    times: dict[str, list[float]] = {"floor": [], "measure": [], "pack": []}
    for _ in range(repeats):
        for name, fn in (("floor", floor), ("measure", measure), ("pack", pack)):
            t = time.process_time()
            fn()
            times[name].append(time.process_time() - t)
    out = {f"{k}_sps": n / min(v) for k, v in times.items()}
    for k in ("measure", "pack"):
        out[f"{k}_vs_floor_median"] = round(float(np.median([f / t for f, t in zip(times["floor"], times[k])])), 3)
    return out


def _ratios(row: dict) -> dict:
    for k in ("floor_sps", "measure_sps", "pack_sps"):
        row[k] = round(row[k], 1)
    row["measure_vs_floor"] = round(row["measure_sps"] / row["floor_sps"], 3)
    row["pack_vs_floor"] = round(row["pack_sps"] / row["floor_sps"], 3)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2000, help="LLaVA records")
    ap.add_argument("--captions", type=int, default=2000, help="caption pairs (0: skip)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of floor, measure and pack, in turn")
    ap.add_argument("--no-processor", action="store_true", help="skip the processor-mode row")
    ap.add_argument("--photos", action="store_true",
                    help="chat records with photo-like JPEGs (COCO's size, ~85 KB) instead of drawn ones (~9 KB)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 120 records, 120 captions, one pass")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    if args.quick:
        args.records, args.captions, args.repeats = 120, 120, 1
    with tempfile.TemporaryDirectory(prefix="bench_pack_speed_") as tmp:
        result = bench(args.records, args.captions, args.repeats, Path(tmp), n_processor=not args.no_processor,
                       photos=args.photos)
    for name in ("chat", "processor", "captions"):
        if name in result:
            r = result[name]
            print(f"{name:10s} floor {r['floor_sps']:8.1f}/s  measure {r['measure_sps']:8.1f}/s "
                  f"({r['measure_vs_floor']:.0%})  pack {r['pack_sps']:8.1f}/s ({r['pack_vs_floor']:.0%})")
    if "chat" in result:
        st = result["chat"]["stages_ms_per_1000"]
        print(f"chat, CPU ms per 1000 records: floor {st['floor_ms']:.0f} | the job's text work {st['text_ms']:.0f} "
              f"({st['text_ms'] / st['floor_ms']:.0%} of the floor), reading records {st['read_ms']:.0f}, "
              f"checking images {st['images_ms']:.0f}")
    print(f"start-up (tokenizer + template checks): {result['startup_s']:.2f} s per process")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
