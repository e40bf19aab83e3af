"""Draw what a packed model-ready batch looks like to the model: docs/packed_attention.png.

    python -m tools.plot_packed_attention [--out docs/packed_attention.png]

One pack of three chats (two with an image) made with the real ``Gemma3Processor`` (tiny sizes,
``examples/tiny_vlm``), streamed by ``make_loader(..., processor=...)``; the picture shows the
masks ``wdspack.model_inputs`` hands Gemma 3 (full-attention and sliding-window layers: each
sub-sample sees only itself, causally, and each image's soft tokens see each other both ways),
and the same pack's tokens coloured by kind.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHATS = [
    ("cat", [("user", "<image>What is this?"), ("assistant", "A cat on a mat.")], [(48, 32)]),
    ("sum", [("user", "Two plus two?"), ("assistant", "Four.")], []),
    ("bars", [("user", "<image>Which bar is tallest?"), ("assistant", "The left one.")], [(32, 48)]),
]


def _write(folder: Path) -> Path:
    import numpy as np
    from PIL import Image

    (folder / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    rng = np.random.default_rng(0)
    for sid, turns, sizes in CHATS:
        names = []
        for k, (w, h) in enumerate(sizes):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
            (folder / "images" / f"{sid}{k}.png").write_bytes(buf.getvalue())
            names.append(f"images/{sid}{k}.png")
        msgs = []
        for role, text in turns:
            parts = [{"type": "image", "image": names.pop(0)}] if text.startswith("<image>") else []
            parts.append({"type": "text", "text": text.removeprefix("<image>")})
            msgs.append({"role": role, "content": parts})
        lines.append(json.dumps({"id": sid, "messages": msgs}))
    (folder / "chats.jsonl").write_text("\n".join(lines) + "\n")
    return folder / "chats.jsonl"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "docs" / "packed_attention.png"))
    args = ap.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    import wdspack
    from examples.tiny_vlm import gemma3
    from wdspack.models import save_processor
    from wdspack.packer.config import PackConfig
    from wdspack.packer.job import pack_dataset
    from wdspack.packer.samples import SampleConfig

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        processor = gemma3.processor(work / "tok")
        model = gemma3.model(processor, sliding_window=8)
        folder = save_processor(processor, work / "processor")
        pack_dataset([str(_write(work / "src"))], str(work / "packed"),
                     sample_config=SampleConfig(processor=str(folder)),
                     config=PackConfig(seq_len=128, max_images=4), progress=False)
        (batch,) = list(wdspack.make_loader(str(work / "packed"), batch_size=1, num_workers=0, processor=processor,
                                            shuffle=False))
        kwargs = wdspack.model_inputs(batch, model)
    n = int(batch["num_tokens"][0])
    masks = {name: m[0, 0, :n, :n].numpy() for name, m in kwargs["attention_mask"].items()}
    kind = np.where(batch["token_type_ids"][0, :n].numpy() == 1, 2,
                    np.where(batch["labels"][0, :n].numpy() != -100, 1, 0))
    fig, axes = plt.subplots(1, 3, figsize=(15, 5.4), gridspec_kw={"width_ratios": [1, 1, 0.08]})
    for ax, (name, mask) in zip(axes[:2], masks.items()):
        ax.imshow(mask, cmap="Greys", interpolation="nearest")
        ax.set_title(f"Gemma 3 {name.replace('_', ' ')} layers (black: attends)")
        ax.set_xlabel("key token")
        ax.set_ylabel("query token")
        for b in np.cumsum([0] + [int(x) for x in np.bincount(batch["seq_idx"][0, :n].numpy())])[1:-1]:
            ax.axhline(b - 0.5, color="tab:red", lw=0.8)
            ax.axvline(b - 0.5, color="tab:red", lw=0.8)
    axes[2].imshow(kind[:, None], aspect="auto",
                   cmap=matplotlib.colors.ListedColormap(["#dddddd", "#2b8cbe", "#e6550d"]),
                   vmin=0, vmax=2, interpolation="nearest")
    axes[2].set_xticks([])
    axes[2].set_title("token", fontsize=9)
    axes[2].yaxis.tick_right()
    fig.text(0.5, 0.01, f"one pack of {n} tokens, 3 sub-samples (red lines): grey = context, blue = loss targets, "
             "orange = image soft tokens (they see each other both ways, only inside their own image)", ha="center")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
