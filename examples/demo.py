"""The `make demo` walk-through, offline: generate a demo dataset, pack it, stream batches, train.

    python examples/demo.py --workdir build/demo

Uses the real Pixtral tokenizer (``tekken.json``) that ships inside the ``mistral_common``
package, so nothing is downloaded; the Alpaca and tool-calling files are packed with Mistral-Nemo's
tokenizer (also in ``mistral_common``) and its published chat template, which renders tool calls.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load_generator():
    spec = importlib.util.spec_from_file_location("make_demo_data", HERE / "make_demo_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prepare_tokenizer(folder: Path) -> Path:
    """Copy the Pixtral tokenizer shipped in mistral_common into ``folder/tekken.json``."""
    import mistral_common

    src = Path(mistral_common.__file__).parent / "data" / "tekken_240911.json"
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "tekken.json").exists():
        shutil.copyfile(src, folder / "tekken.json")
    return folder


def prepare_nemo_tokenizer(folder: Path) -> Path:
    """Mistral-Nemo-Instruct-2407's tokenizer (``tekken_240718.json`` in mistral_common), with the special
    tokens its published ``tokenizer_config.json`` names (its chat template needs ``eos_token``)."""
    import json

    import mistral_common

    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "tekken.json").exists():
        shutil.copyfile(Path(mistral_common.__file__).parent / "data" / "tekken_240718.json", folder / "tekken.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                              "unk_token": "<unk>"}))
    return folder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="build/demo")
    ap.add_argument("--records", type=int, default=1500)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--max-images", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--steps", type=int, default=8, help="training steps of the tiny VLM at the end")
    args = ap.parse_args(argv)

    from wdspack.cli import main as wdspack_main

    work = Path(args.workdir)
    data, packed = work / "data", work / "packed"
    shutil.rmtree(work / "data", ignore_errors=True)
    shutil.rmtree(packed, ignore_errors=True)
    shutil.rmtree(work / "formats", ignore_errors=True)
    shutil.rmtree(work / "qwen" / "packed", ignore_errors=True)

    print(f"== 1. generate {args.records} demo records (Pillow images, long-tailed chats, a few bad ones)")
    _load_generator().main([str(data), "--records", str(args.records)])
    tokenizer = prepare_tokenizer(work / "tokenizer")

    print("\n== 2. wdspack pack  (Pixtral tokenizer, 64 tokens per image)")
    cmd = [
        str(data / "llava.jsonl"), str(data / "messages.jsonl"), "--output", str(packed),
        "--tokenizer", str(tokenizer), "--chat-template", str(HERE / "chat_templates" / "pixtral.jinja"),
        "--image-token", "[IMG]", "--tokens-per-image", "64",
        "--seq-len", str(args.seq_len), "--max-images", str(args.max_images),
        "--workers", str(args.workers), "--shard-size", "4MB",
    ]
    print("   wdspack pack " + " ".join(cmd))
    t0 = time.perf_counter()
    rc = wdspack_main(["pack", *cmd])
    if rc != 0:
        return rc
    print(f"   (pack took {time.perf_counter() - t0:.1f} s, tokenizer load included)")

    print("\n== 2b. wdspack pack  Alpaca (instruction/input/output) and tool calling (function_call/observation),")
    print("       Mistral-Nemo's tokenizer and its own chat template: tool calls trained, tool results not")
    formats = work / "formats"
    cmd = [
        str(data / "alpaca.json"), str(data / "tools.jsonl"), "--output", str(formats),
        "--tokenizer", str(prepare_nemo_tokenizer(work / "nemo-tokenizer")),
        "--chat-template", str(HERE / "chat_templates" / "mistral_nemo.jinja"),
        "--image-token", "[IMG]", "--tokens-per-image", "64", "--seq-len", str(args.seq_len),
        "--max-images", str(args.max_images), "--quiet",  # one process: one tokenizer load (~15 s)
    ]
    print("   wdspack pack " + " ".join(cmd))
    if (rc := wdspack_main(["pack", *cmd])) != 0:
        return rc
    show_tool_sample(formats)

    print("\n== 3. wdspack inspect")
    wdspack_main(["inspect", str(packed), "--plot", str(work / "inspect.png"), "--ranks", "8"])
    print("\n== 3b. wdspack show  (the first pack as text, trained tokens marked: 3 samples)")
    wdspack_main(["show", str(packed), "--samples", "3", "--max-chars", "300"])

    print("\n== 4. stream batches (make_loader: 2 workers, 4 packs per batch, images decoded to 224 px)")
    stream(packed, batches=args.batches)

    print("\n== 5. train a real VLM class: pack with Qwen2.5-VL's own processor, stream model-ready batches,")
    print("      a few AdamW steps of a tiny random-init Qwen2_5_VLForConditionalGeneration")
    sys.path.insert(0, str(HERE))
    from train_tiny_vlm import main as train_main

    rc = train_main([str(data / "messages.jsonl"), "--workdir", str(work / "qwen"), "--steps", str(args.steps)])
    if rc != 0:
        return rc

    print("\n== 6. video: the same processor packs LLaMA-Factory's video chats (each video planned from its header:")
    print("      2 frames a second, token for token Qwen2.5-VL's own), the loader decodes only the planned frames")
    shutil.rmtree(work / "qwen-video" / "packed", ignore_errors=True)
    rc = train_main([str(data / "videos.jsonl"), "--workdir", str(work / "qwen-video"), "--steps", "3",
                     "--seq-len", "512", "--video-fps", "2", "--video-max-pixels", str(28 * 28 * 16)])
    if rc != 0:
        return rc

    print("\n== 7. audio: Qwen2-Audio's own processor packs LLaMA-Factory's audio chats (WAV, FLAC, MP3 at 8 to")
    print("      44.1 kHz; each one's samples counted from the file, 25 tokens a second as the processor gives them),")
    print("      the loader decodes and resamples each to 16 kHz and computes its Whisper features")
    shutil.rmtree(work / "qwen-audio" / "packed", ignore_errors=True)
    rc = train_main([str(data / "audios.jsonl"), "--workdir", str(work / "qwen-audio"), "--steps", "2",
                     "--seq-len", "256", "--max-images", "3", "--family", "qwen2_audio"])
    if rc != 0:
        return rc
    wdspack_main(["show", str(work / "qwen-audio" / "packed"), "--samples", "1", "--max-chars", "300"])
    return 0


def show_tool_sample(packed: Path) -> None:
    """Print one packed tool-calling sample, the trained tokens in «…» (the tool list elided)."""
    import itertools
    import tarfile

    from transformers import AutoTokenizer

    from wdspack import decode_pack, read_manifest
    from wdspack.ops.show import render_tokens  # what `wdspack show` prints, here with «» marks

    tok = AutoTokenizer.from_pretrained(str(packed.parent / "nemo-tokenizer"))
    image_token_id = read_manifest(packed).tokenizer.get("image_token_id")
    for shard in read_manifest(packed).shards:
        with tarfile.open(packed / shard.name) as tar:
            for member in tar.getmembers():
                pack = decode_pack(tar.extractfile(member).read())
                starts = [0, *itertools.accumulate(pack.seq_lens)]
                for k, sid in enumerate(pack.sample_ids):
                    ids = pack.input_ids[starts[k]:starts[k + 1]].tolist()
                    if sid.startswith("tools.jsonl") and tok.convert_tokens_to_ids("[TOOL_CALLS]") in ids:
                        text = render_tokens(tok, ids, pack.loss_mask[starts[k]:starts[k + 1]],
                                             image_token_id=image_token_id, marks=("«", "»"))
                        tools_end = text.find("[/AVAILABLE_TOOLS]")
                        shown = text[:20] + "…" + text[tools_end:] if tools_end > 0 else text
                        print(f"   {sid}, trained tokens in «»:\n     {shown}")
                        return


def stream(packed: Path, *, batches: int) -> None:
    """Iterate the loader and print the batch shapes, real-token share and throughput."""
    import torch

    from wdspack import make_image_transform, make_loader

    loader = make_loader(str(packed), batch_size=4, num_workers=2, seed=0,
                         image_transform=make_image_transform(size=224))
    shapes = None
    real = total = images = packs = 0
    t0 = time.perf_counter()
    for step, batch in enumerate(loader):
        if step == 0:
            t0 = time.perf_counter()  # exclude worker start-up
            shapes = {k: (tuple(v.shape), str(v.dtype).replace("torch.", "")) for k, v in batch.items()
                      if isinstance(v, torch.Tensor)}
        else:
            real += int(batch["num_tokens"].sum())
            total += batch["input_ids"].numel()
            images += int(batch["image_mask"].sum())
            packs += batch["input_ids"].shape[0]
        if step + 1 >= batches:
            break
    seconds = time.perf_counter() - t0
    for key in ("input_ids", "labels", "position_ids", "seq_idx", "cu_seqlens", "pixel_values", "image_mask"):
        print(f"   {key:<14} {shapes[key][0]!s:<22} {shapes[key][1]}")
    print(f"   {batches} batches ({len(loader)} per epoch): real tokens {real / max(total, 1):.1%} of every batch; "
          f"{packs / seconds:.1f} packs/s, {real / seconds:,.0f} tokens/s, {images / seconds:.1f} images/s "
          "(2 workers, decode + resize included)")


if __name__ == "__main__":
    sys.exit(main())
