"""Train a real VLM class on processor-exact packs: the last step of `make demo`, offline.

    python examples/train_tiny_vlm.py SOURCE... --workdir build/demo/qwen [--steps 8]

1. builds the real ``Qwen2_5_VLProcessor`` (the Pixtral tokenizer extended with Qwen's special
   tokens, ``Qwen2VLImageProcessor``, Qwen's chat template; ``examples/tiny_vlm``) and saves it;
2. ``wdspack pack SOURCE... --processor FOLDER``: every sample token for token what that
   processor gives, image tokens counted from the image headers;
3. streams ``make_loader(..., processor=FOLDER)`` batches (patches, ``image_grid_thw``,
   ``position_ids`` ``[4, B, L]``) into a tiny random-init ``Qwen2_5_VLForConditionalGeneration``
   and takes a few AdamW steps: ``loss = model(**wdspack.model_inputs(batch, model)).loss``.

With a real checkpoint the loop is the same: ``--processor Qwen/Qwen2.5-VL-3B-Instruct`` at pack
time, ``processor=`` the same name in the loader, and the model from ``from_pretrained``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sources", nargs="+")
    ap.add_argument("--workdir", default="build/demo/qwen")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--max-images", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--max-drop-fraction", type=float, default=0.1,
                    help="the demo chats' long tail runs past 1,024 tokens and a few records are bad on purpose: "
                         "about 5%% are dropped with their reasons (dropped.jsonl)")
    ap.add_argument("--video-fps", type=float, help="for video chats: sample frames at this rate (wdspack pack "
                                                   "--video-fps)")
    ap.add_argument("--video-max-pixels", type=int, help="for video chats: at most this many pixels a frame")
    ap.add_argument("--family", default="qwen2_5_vl", choices=["qwen2_5_vl", "qwen2_audio"],
                    help="the tiny model's family (examples/tiny_vlm): Qwen2.5-VL (images, video) or Qwen2-Audio")
    ap.add_argument("--varlen", action="store_true",
                    help="padding-free batches on PyTorch's varlen FlashAttention kernel "
                         "(wdspack.use_varlen_attention: CUDA, bfloat16); on a CPU the per-segment reference kernel")
    args = ap.parse_args(argv)

    import importlib

    import torch

    import wdspack
    from wdspack.cli import main as wdspack_main
    from wdspack.models import save_processor

    tiny = importlib.import_module(f"tiny_vlm.{args.family}")
    work = Path(args.workdir)
    processor = tiny.processor(work / "tokenizer")
    folder = save_processor(processor, work / "processor")
    packed = work / "packed"
    cmd = [*args.sources, "--output", str(packed), "--processor", str(folder), "--seq-len", str(args.seq_len),
           "--max-images", str(args.max_images), "--max-drop-fraction", str(args.max_drop_fraction), "--quiet"]
    for flag, value in (("--video-fps", args.video_fps), ("--video-max-pixels", args.video_max_pixels)):
        cmd += [flag, str(value)] if value is not None else []
    print("   wdspack pack " + " ".join(cmd))
    t0 = time.perf_counter()
    if (rc := wdspack_main(["pack", *cmd])) != 0:
        return rc
    print(f"   (pack took {time.perf_counter() - t0:.1f} s; the dropped samples and why: {packed / 'dropped.jsonl'})")

    model = tiny.model(processor, seed=0)
    model.config.save_pretrained(folder)  # as a checkpoint's folder: the loader reads the model's video positions
    params = sum(p.numel() for p in model.parameters())
    if args.varlen and torch.cuda.is_available():
        model = model.to("cuda", torch.bfloat16)
        wdspack.use_varlen_attention(model)
    elif args.varlen:
        from wdspack.models.varlen import reference_varlen_attn

        wdspack.use_varlen_attention(model, kernel=reference_varlen_attn)
    loader = wdspack.make_loader(str(packed), batch_size=1, num_workers=1, processor=str(folder), seed=0,
                                 padding_free=args.varlen)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model.train()
    weights = next(model.parameters())
    print(f"   {type(model).__name__}: random init, {params / 1e6:.1f} M parameters (most in the 131 k-token "
          f"embedding and head), {str(weights.dtype).removeprefix('torch.')} on {weights.device.type.upper()}"
          + (f", attention {model.config.get_text_config()._attn_implementation}" if args.varlen else ""))
    t0 = time.perf_counter()
    step = -1
    for step, batch in enumerate(loader):
        kwargs = wdspack.model_inputs(batch, model)
        if step == 0:
            tower = [k for k in kwargs if k.startswith("image_") and k != "image_grid_thw"]
            print("   keys fed to the model: " + ", ".join(f"{k} {tuple(v.shape)}" for k, v in kwargs.items()
                                                        if isinstance(v, torch.Tensor) and k not in tower)
                  + (f"; and the vision tower's bookkeeping, worked out on the host: {', '.join(tower)}"
                     if tower else ""))
        loss = model(**kwargs).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        videos = "".join(f"{int(batch[f'{kind}_mask'].sum())} {kind}s, " for kind in ("video", "audio")
                         if f"{kind}_mask" in batch)
        print(f"   step {step + 1}: loss {loss.item():.4f}  ({int(batch['num_tokens'].sum())} tokens, "
              f"{int(batch['image_mask'].sum())} images, {videos}{int(batch['num_samples'].sum())} samples in the "
              "pack)")
        if step + 1 >= args.steps:
            break
    print(f"   {step + 1} steps in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
