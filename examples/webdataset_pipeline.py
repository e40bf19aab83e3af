"""A stock webdataset pipeline over a packed dataset, with wdspack's stages: make_loader's batches.

    python examples/webdataset_pipeline.py build/demo/packed
    python examples/webdataset_pipeline.py build/demo/packed --batch-size 4 --workers 2 --steps 3
    python examples/webdataset_pipeline.py hf://datasets/my-org/llava-packed@main     # webdataset's hf:// opener

The manifest is read once (shard URLs, seq_len, max_images, pad id); shards go through
``split_by_node`` / ``split_by_worker`` and webdataset's own tar reader; ``wdspack.loader.wds`` turns each
pack record into the fixed-shape batch ``make_loader`` gives. No ``.decode()``: webdataset's
default decoders would unpickle ``.pickle`` members, and the stages need no decoder.
"""

from __future__ import annotations

import argparse

import torch
import webdataset as wds

import wdspack
from wdspack.loader.wds import batched, read_dataset, to_examples


def make_pipeline(source: str, *, batch_size: int, image_size: int, shuffle: int = 0,
                  processor: str | None = None) -> wds.DataPipeline:
    """The documented pipeline: shards → node / worker split → tar samples → examples → batches."""
    info = read_dataset(source)
    images = ({"processor": processor} if processor
              else {"image_transform": wdspack.make_image_transform(size=image_size)})
    return wds.DataPipeline(
        wds.SimpleShardList(list(info.urls)),
        wds.split_by_node,
        wds.split_by_worker,
        wds.tarfile_to_samples(handler=wds.warn_and_continue),   # raw bytes: {"__key__", "mp": bytes}
        *([wds.shuffle(shuffle)] if shuffle else []),
        to_examples(info, handler=wds.warn_and_continue, **images),
        batched(batch_size, dataset=info),                          # full batches only; static cu_seqlens
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", help="a packed dataset: folder, https:// root or hf://datasets/ORG/NAME@REV")
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers (wds.WebLoader)")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--processor", help="a processor folder for model-ready batches (instead of --image-size)")
    ap.add_argument("--shuffle", type=int, default=0, help="a pack shuffle buffer (0: file order)")
    ap.add_argument("--steps", type=int, default=2, help="batches to print")
    args = ap.parse_args(argv)

    pipeline = make_pipeline(args.source, batch_size=args.batch_size, image_size=args.image_size,
                             shuffle=args.shuffle, processor=args.processor)
    loader = wds.WebLoader(pipeline, batch_size=None, num_workers=args.workers)
    for step, batch in enumerate(loader):
        if step >= args.steps:
            break
        print(f"batch {step}:")
        for key, value in batch.items():
            shape = (f"{list(value.shape)} {str(value.dtype).replace('torch.', '')}" if torch.is_tensor(value)
                     else repr(value))
            print(f"  {key:20s} {shape}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
