"""The `make demo` walk-through, offline: generate a demo dataset, pack it, stream batches.

    python examples/demo.py --workdir build/demo

Uses the real Pixtral tokenizer (``tekken.json``) that ships inside the ``mistral_common``
package, so nothing is downloaded.
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="build/demo")
    ap.add_argument("--records", type=int, default=1500)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--max-images", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)

    from wdspack.cli import main as wdspack_main

    work = Path(args.workdir)
    data, packed = work / "data", work / "packed"
    shutil.rmtree(work / "data", ignore_errors=True)
    shutil.rmtree(packed, ignore_errors=True)

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
    return 0


if __name__ == "__main__":
    sys.exit(main())
