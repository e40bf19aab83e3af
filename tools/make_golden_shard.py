"""Write the golden shard checked into ``tests/golden/`` — the only way it should change.

    python -m tools.make_golden_shard          # rewrite tests/golden/train-000000.tar
    python -m tools.make_golden_shard --check  # exit 1 if the checked-in bytes differ

The packs are built by hand (no tokenizer), so the bytes depend only on pack format v1 and the
shard writer. ``tests/format/test_pack.py`` decodes the file and compares it with :func:`golden_packs`.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from wdspack.format.pack import Pack, encode_pack
from wdspack.format.tar import ShardWriter

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden" / "train-000000.tar"


def _png(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 3), color).save(buf, format="PNG")
    return buf.getvalue()


def golden_packs() -> list[tuple[Pack, str]]:
    """Three packs: two sub-samples with an image, one text-only, one with a <u4 vocabulary."""
    a = Pack(
        input_ids=np.array([1, 3, 10, 10, 22177, 4, 1091, 2, 1, 3, 1050, 4, 1052, 2], np.uint32),
        loss_mask=np.array([0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1], np.uint8),
        seq_lens=(8, 6), sample_ids=("llava:0", "llava:1"),
        images=(_png((255, 0, 0)),), image_sample=(0,), image_tokens=(2,),
    )
    b = Pack(input_ids=np.array([1, 3, 500, 4, 600, 2], np.uint32),
             loss_mask=np.array([0, 0, 0, 0, 1, 1], np.uint8), seq_lens=(6,), sample_ids=("text:7",))
    c = Pack(input_ids=np.array([1, 70000, 70001, 2], np.uint32), loss_mask=np.array([0, 0, 1, 1], np.uint8),
             seq_lens=(4,), sample_ids=("big-vocab",), images=(_png((0, 0, 255)), _png((0, 255, 0))),
             image_sample=(0, 0), image_tokens=(0, 0))
    return [(a, "<u2"), (b, "<u2"), (c, "<u4")]


def write_golden(path: Path) -> None:
    with ShardWriter(path) as w:
        for k, (pack, dtype) in enumerate(golden_packs()):
            w.add(f"{0:06d}{k:06d}", encode_pack(pack, token_dtype=dtype),
                  samples=pack.num_samples, tokens=pack.num_tokens, images=pack.num_images)
        w.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args(argv)
    if args.check:
        with tempfile.TemporaryDirectory() as d:
            fresh = Path(d) / GOLDEN.name
            write_golden(fresh)
            same = fresh.read_bytes() == GOLDEN.read_bytes()
        print("golden shard matches" if same else "golden shard DIFFERS from what this code writes")
        return 0 if same else 1
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    write_golden(GOLDEN)
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
