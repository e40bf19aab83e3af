"""A small real packed dataset for tests: written with the codec, ShardWriter and Manifest.

Import it with ``from tests.support.synthetic import write_dataset`` (tests and tools alike).

Every pack is recognisable from its tensors: its first token is ``PACK_ID_BASE + n`` where
``n`` is the pack's global number (shard-major order), so tests can check coverage from a batch
without any side channel::

    input_ids  [1000+n, 3, 3, 3, 3, 17, 402, ...] [1000+n, 88, ...]
    seq_lens   [a, b]           sample_ids ["s0002-p005-0", "s0002-p005-1"]
    images     [<png>]          image_sample [0]      image_tokens [4]

Deterministic by seed: the same arguments give byte-identical shards.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from wdspack.format.manifest import MANIFEST_NAME, Manifest, write_json_atomic
from wdspack.format.pack import Pack, encode_pack
from wdspack.format.pack_index import COLUMNS, INDEX_NAME, encode_index, index_entry, pack_row
from wdspack.format.tar import ShardWriter, shard_name

__all__ = ["PACK_ID_BASE", "PAD_ID", "IMAGE_TOKEN_ID", "TOKENIZER", "pack_numbers", "plan_for_cp", "tiny_image",
           "write_dataset"]

PACK_ID_BASE = 1000
PAD_ID = 0
IMAGE_TOKEN_ID = 3
TOKENS_PER_IMAGE = 4
VOCAB_SIZE = 60_000
TOKENIZER = {
    "name": "synthetic/tok", "vocab_size": VOCAB_SIZE, "pad_token_id": PAD_ID, "image_token": "<image>",
    "image_token_id": IMAGE_TOKEN_ID,
    "chat_template_sha256": hashlib.sha256(b"synthetic template").hexdigest(), "token_dtype": "<u2",
}


def tiny_image(rng: np.random.Generator, *, fmt: str = "PNG", size: int = 8) -> bytes:
    """Real encoded image bytes (PNG or JPEG), ``size``×``size`` RGB noise."""
    from PIL import Image

    pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format=fmt)
    return buf.getvalue()


def _make_pack(rng: np.random.Generator, number: int, name: str, *, seq_len: int, max_images: int) -> Pack:
    n_samples = int(rng.integers(1, 4))
    n_images = int(rng.integers(0, max_images + 1))
    owners = sorted(int(rng.integers(0, n_samples)) for _ in range(n_images))
    budget = seq_len - 4 * n_samples
    ids: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    seq_lens: list[int] = []
    images: list[bytes] = []
    for j in range(n_samples):
        mine = owners.count(j)
        text = int(rng.integers(2, max(3, budget // n_samples - mine * TOKENS_PER_IMAGE)))
        body = rng.integers(10, 1000, size=text).astype(np.int64)
        head = np.array([PACK_ID_BASE + number if j == 0 else 1], dtype=np.int64)
        img = np.full(mine * TOKENS_PER_IMAGE, IMAGE_TOKEN_ID, dtype=np.int64)
        tokens = np.concatenate([head, img, body])
        mask = np.zeros(tokens.size, dtype=np.uint8)
        mask[1 + img.size + text // 2:] = 1  # the second half of the text is the "answer"
        ids.append(tokens)
        masks.append(mask)
        seq_lens.append(int(tokens.size))
        fmt = "PNG" if (number + j) % 2 == 0 else "JPEG"
        images.extend(tiny_image(rng, fmt=fmt) for _ in range(mine))
    return Pack(
        input_ids=np.concatenate(ids), loss_mask=np.concatenate(masks), seq_lens=tuple(seq_lens),
        sample_ids=tuple(f"{name}-{j}" for j in range(n_samples)), images=tuple(images),
        image_sample=tuple(owners), image_tokens=(TOKENS_PER_IMAGE,) * n_images,
    )


def write_dataset(root: str | Path, *, shards: int = 4, packs_per_shard: int | Sequence[int] = 6, seq_len: int = 64,
                  max_images: int = 2, seed: int = 0, split: str = "train", tokenizer: dict | None = None,
                  write_manifest: bool = True, pack_index: bool = False) -> Manifest:
    """Write ``shards`` shards into ``root`` (created) and return the manifest.

    Args:
        root: the dataset folder.
        shards: number of shards.
        packs_per_shard: packs in every shard, or one count per shard (uneven shards).
        seq_len: token budget; every pack has at most this many tokens.
        max_images: image budget per pack.
        seed: everything random (tokens, lengths, pixels) comes from it.
        split: shard name prefix.
        tokenizer: the manifest's ``tokenizer`` entry (default :data:`TOKENIZER`).
        write_manifest: False leaves only the shards (a folder without a manifest).
        pack_index: also write ``pack_index.npy`` (offsets and costs of every pack) and name it in the manifest.

    Example:
        >>> m = write_dataset("/tmp/ds", shards=2, packs_per_shard=[3, 5])  # doctest: +SKIP
        >>> m.num_packs  # doctest: +SKIP
        8
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    counts = [packs_per_shard] * shards if isinstance(packs_per_shard, int) else list(packs_per_shard)
    if len(counts) != shards:
        raise ValueError(f"packs_per_shard has {len(counts)} counts for {shards} shards")
    rng = np.random.default_rng(seed)
    infos, rows = [], []
    number = most = 0
    for s, count in enumerate(counts):
        with ShardWriter(root / shard_name(split, s)) as writer:
            for p in range(count):
                name = f"s{s:04d}-p{p:03d}"
                pack = _make_pack(rng, number, name, seq_len=seq_len, max_images=max_images)
                writer.add(f"{s:06d}{p:06d}", encode_pack(pack, token_dtype="<u2"), samples=pack.num_samples,
                           tokens=pack.num_tokens, images=pack.num_images)
                rows.append(pack_row(writer.offsets[-1], pack))
                number += 1
                most = max(most, pack.num_samples)
            infos.append(writer.close())
    tokens = sum(i.tokens for i in infos)
    packs = sum(i.packs for i in infos)
    manifest = Manifest(
        seq_len=seq_len, max_images=max_images, algorithm="synthetic", seed=seed,
        tokenizer=dict(tokenizer or TOKENIZER), image_policy={"kind": "fixed", "tokens_per_image": TOKENS_PER_IMAGE},
        shards=tuple(infos), split=split, sources=("synthetic",),
        totals={"samples_read": sum(i.samples for i in infos), "samples_packed": sum(i.samples for i in infos),
                "samples_dropped": 0, "dropped_by_reason": {}, "packs": packs, "tokens": tokens,
                "images": sum(i.images for i in infos),
                "fill_ratio": round(tokens / (packs * seq_len), 6) if packs else 0.0, "max_samples_per_pack": most},
    )
    if pack_index:
        data = encode_index(np.asarray(rows, np.int64).reshape(-1, len(COLUMNS)))
        (root / INDEX_NAME).write_bytes(data)
        manifest = dataclasses.replace(manifest, pack_index=index_entry(data))
    if write_manifest:
        write_json_atomic(root / MANIFEST_NAME, manifest.to_json())
    return manifest


def plan_for_cp(root: str | Path, *, cp: int) -> tuple[list[Pack], list[Pack]]:
    """Mark the dataset in ``root`` as planned for ``cp`` context-parallel ranks (``wdspack pack --cp``): its
    manifest gets ``"cp"`` and ``totals["cp_padding"]`` as the pack job counts them. Returns its packs as stored
    and each padded to ``2·cp`` per sub-sample (as the loader loads them); every padded pack must fit
    ``seq_len`` (``seq_len`` 64 and ``cp`` 2 do: a pack leaves 4 tokens a sample).
    """
    from wdspack.format.dataset import iter_dataset_packs, open_dataset
    from wdspack.format.pack import pad_samples

    manifest, where = open_dataset(str(root))
    packs = [p for _, p in iter_dataset_packs(manifest, where)]
    padded = [pad_samples(p, multiple=2 * cp, pad_token_id=PAD_ID) for p in packs]
    if any(q.num_tokens > manifest.seq_len for q in padded):
        raise ValueError(f"a pack padded to 2·cp = {2 * cp} exceeds seq_len {manifest.seq_len}")
    padding = sum(q.num_tokens - p.num_tokens for p, q in zip(packs, padded))
    manifest = dataclasses.replace(manifest, cp=cp, totals={**manifest.totals, "cp_padding": padding})
    write_json_atomic(Path(root) / MANIFEST_NAME, manifest.to_json())
    return packs, padded


def pack_numbers(input_ids) -> list[int]:
    """The global pack numbers of a batch (or one example) from the first token of each row."""
    ids = np.asarray(input_ids)
    if ids.ndim == 1:
        ids = ids[None]
    return [int(row[0]) - PACK_ID_BASE for row in ids]


#: The three small sources the mixture tests read: packs per shard of each.
MIXTURE_COUNTS = {"a": [5, 7, 6], "b": [9, 4], "c": [4, 4, 4]}


def write_mixture_sources(base: Path, counts: dict[str, list[int]] = MIXTURE_COUNTS) -> Path:
    """One dataset per name under ``base``, each with a pack index; only the first holds images
    (a text-only source can join an image mix). Returns ``base``."""
    for k, (name, shard_counts) in enumerate(counts.items()):
        write_dataset(base / name, shards=len(shard_counts), packs_per_shard=shard_counts, seq_len=64,
                      max_images=2 if k == 0 else 0, seed=10 + k, pack_index=True)
    return base
