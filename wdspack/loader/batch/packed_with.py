"""Whether the loader's processor is the one the dataset was packed with, asked when the loader is built.

    manifest: tokenizer (image token, its id, vocab size) ──► compared with the processor's tokenizer
    first pack with images: header sizes, image_tokens     ──► family.image.replacements(processor, sizes)
                                                               must fill as many feature tokens
"""

from __future__ import annotations

import io
import logging
from collections import Counter
from typing import Any

from ...errors import ConfigError, WdspackError
from ...format.pack import Pack, decode_pack
from ...format.tar import shard_packs
from ...storage.streams import open_stream

__all__ = ["check_packed_with", "packed_with"]

logger = logging.getLogger(__name__)
#: Packs read (at most) to find one with images; the first shard with images usually has one first.
PROBE_PACKS = 64


def packed_with(manifest: Any) -> str:
    """What the manifest says the dataset was packed with, in words.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> packed_with(NS(image_policy={"kind": "fixed", "tokens_per_image": 16}, tokenizer={"name": "tok/"}))
        "the tokenizer 'tok/' with 16 tokens per image"
    """
    policy, tok = manifest.image_policy, manifest.tokenizer
    if policy.get("family"):
        return f"the {policy['family']} processor {policy.get('name')!r} ({policy.get('processor_class')})"
    if policy.get("kind") == "fixed":
        return f"the tokenizer {tok.get('name')!r} with {policy.get('tokens_per_image')} tokens per image"
    return f"the tokenizer {tok.get('name')!r} with image tokens counted by {policy.get('name')!r}"


def check_packed_with(dataset: Any) -> None:
    """Raise :class:`ConfigError` (one line) when ``dataset``'s processor, or its lack of one, does not fit
    how the dataset was packed: another tokenizer (image token, its id, vocabulary), or an image
    processor that lays the same image out in another number of tokens (patch size, merge size,
    min/max pixels). Reads the manifest and, for the token counts, packs up to the first with images."""
    m = dataset.manifest
    if m is None or dataset.mixture is not None:  # shards alone say nothing; a mixture's sources are checked apart
        return
    policy, display = m.image_policy, dataset.source.display
    batcher = dataset.model_batcher
    if batcher is None:
        _check_transform(dataset, m, display)
        return
    processor, family = batcher.processor, batcher.family
    given = f"the loader's processor {type(processor).__name__} ({family.name})"
    fix = (f"pass processor={policy['name']!r} (or that processor object)" if policy.get("family") and
           policy.get("name") else "pass the processor whose tokenizer packed it")
    repack = "or re-pack with this one (`wdspack pack --processor ...`)"
    tok = processor.tokenizer
    if family.image is None:  # a family without images (audio alone): its tokenizer is checked by vocabulary only
        if m.tokenizer.get("vocab_size") not in (None, len(tok)):
            raise ConfigError(f"{display} was packed with {packed_with(m)}; {given} has another tokenizer "
                              f"(vocab_size: packed {m.tokenizer['vocab_size']!r}, given {len(tok)!r}); {fix}, "
                              f"{repack}")
        return
    feature = family.image.feature_token(processor)
    have = {"image_token": feature, "image_token_id": tok.convert_tokens_to_ids(feature), "vocab_size": len(tok)}
    want = m.tokenizer
    diff = [f"{k}: packed {want[k]!r}, given {have[k]!r}" for k in have
            if want.get(k) is not None and want[k] != have[k]]
    if diff:
        raise ConfigError(f"{display} was packed with {packed_with(m)}; {given} has another image token or "
                          f"tokenizer ({'; '.join(diff)}); {fix}, {repack}")
    pack = _first_image_pack(dataset)
    if pack is None:
        return
    try:
        sizes = [_size(data) for data in pack.images]
        reps = []  # per sample, as packing laid them out (a family may lay a sample's images out together)
        owners = list(pack.image_sample) or [0] * len(sizes)
        for owner in dict.fromkeys(owners):
            reps += family.image.replacements(processor, [z for z, o in zip(sizes, owners) if o == owner])
    except Exception as e:  # an unreadable image, or the processor refusing a size: the worker reports it
        logger.debug("cannot check the image token counts: %s", e)
        return
    feature_id = have["image_token_id"]
    counts = [tok(rep, add_special_tokens=False)["input_ids"].count(feature_id) for rep in reps]
    if counts != list(pack.image_tokens):
        k = next((i for i, (a, b) in enumerate(zip(counts, pack.image_tokens)) if a != b), 0)
        h, w = sizes[k]
        raise ConfigError(f"{display} was packed with {packed_with(m)}, which gave a {w}x{h} image "
                          f"{pack.image_tokens[k]} tokens; {given} gives it {counts[k]} (another patch size, merge "
                          f"size or min/max pixels); {fix}, {repack}")


def _check_transform(dataset: Any, m: Any, display: str) -> None:
    """A dataset packed with a model's processor, read through the built-in resize-to-a-square transform:
    its image tokens were laid out for the processor's pixels, which that transform does not make."""
    from ...media.image.pixels import ImageTransform

    policy, transform = m.image_policy, dataset.image_transform
    if not (policy.get("family") and isinstance(transform, ImageTransform) and transform.processor is None):
        return
    raise ConfigError(f"{display} was packed with {packed_with(m)}, but the loader has image_transform= and no "
                      f"processor=, so its pixels would not match the image tokens; pass "
                      f"processor={policy.get('name')!r} instead of image_transform=")


def _first_image_pack(dataset: Any) -> Pack | None:
    """The first pack with images in the first shard that has any (None: none, or the shard cannot be read
    now; the workers report that with their own handling)."""
    src = dataset.source
    infos = {s.name: s for s in dataset.manifest.shards}
    shard = next((s for s in src.shards if getattr(infos.get(s.name), "images", 1)), None)
    if shard is None:
        return None
    stats: Counter = Counter()
    try:
        with open_stream(shard.url, headers=src.headers, stats=stats, **dataset._read) as stream:
            for _, data in shard_packs(stream, start=0, stop=min(shard.packs, PROBE_PACKS), stats=stats,
                                       where=shard.url):
                pack = decode_pack(data)
                if pack.images:
                    return pack
    except (WdspackError, OSError, ValueError) as e:
        logger.debug("cannot read %s to check the processor: %s", shard.url, e)
    return None


def _size(data: bytes) -> tuple[int, int]:
    """``(height, width)`` from the image's header (no pixels decoded)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
    return h, w
