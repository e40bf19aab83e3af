"""The budgets a loader's examples are shaped by, and whether they carry pixels.

    manifest ─► seq_len, pad id (the dataset's) and M image slots: max_images, else the fullest pack's
                (a caller may ask for more slots, never fewer)
    images without image_transform= / processor= ─► check_pixels: refused (processor-packed) or warned once
    manifest totals ─► media_token_budgets: per kind, the most of its tokens one pack holds (pixel rows)
    manifest cp ─► cp_padding_note: what padding each sub-sample to 2·cp as it loads costs (said once)
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Mapping
from typing import Any

from ...errors import ConfigError
from ...format.dataset import ResolvedSource, read_pack_index
from ...format.manifest import image_token_budget
from ...media import IMAGE, KINDS

__all__ = ["check_pixels", "cp_padding_note", "dataset_budgets", "image_budget", "media_token_budgets"]

logger = logging.getLogger(__name__)


def dataset_budgets(source: ResolvedSource, seq_len: int | None, max_images: int | None, pad_token_id: int | None,
                    *, read: Mapping[str, Any]) -> tuple[int, int, int]:
    """``(seq_len, M, pad_token_id)`` of the examples: each given value checked against the manifest,
    each missing one taken from it (:func:`image_budget` for ``M``).

    Example:
        >>> dataset_budgets(resolve_source("packed/"), None, None, None, read={})  # doctest: +SKIP
        (4096, 16, 0)
    """
    m = source.manifest
    if m is None:
        if seq_len is None or max_images is None or pad_token_id is None:
            missing = [n for n, v in (("seq_len", seq_len), ("max_images", max_images), ("pad_token_id", pad_token_id))
                       if v is None]
            raise ConfigError(f"{source.display} has no manifest, so pass {', '.join(missing)} explicitly")
        return int(seq_len), int(max_images), int(pad_token_id)
    have_pad = m.tokenizer.get("pad_token_id")
    if seq_len is not None and int(seq_len) != m.seq_len:
        raise ConfigError(f"seq_len={seq_len} does not match the dataset's seq_len {m.seq_len} ({source.display} was "
                          f"packed for {m.seq_len}); drop the argument or re-pack with "
                          f"`wdspack reshard --seq-len {seq_len}`")
    if pad_token_id is not None and have_pad is not None and int(pad_token_id) != int(have_pad):
        raise ConfigError(f"pad_token_id={pad_token_id} does not match the dataset's pad_token_id {have_pad} (the "
                          f"manifest of {source.display}); drop the argument")
    pad = have_pad if pad_token_id is None else pad_token_id
    if pad is None:
        raise ConfigError(f"the manifest of {source.display} names no pad_token_id; pass pad_token_id=")
    slots, _ = image_budget(source, max_images, **read)
    return int(m.seq_len), slots, int(pad)


def image_budget(source: ResolvedSource, max_images: int | None = None, **read_kwargs: Any) -> tuple[int, int | None]:
    """``(M, least)``: the image slots of each example, and the fewest that hold every pack (None: unknown).

    ``M`` is ``max_images`` when given, else the manifest's ``max_images``, else (a dataset packed
    without an image limit) the images of its fullest pack: the manifest's ``max_images_per_pack``,
    or for a manifest written before it was recorded, the pack index's ``images`` column (one
    request). ``max_images`` below ``least`` raises :class:`ConfigError`; above it the extra slots
    stay empty (one static shape across datasets).

    Example:
        >>> image_budget(resolve_source("packed/"))  # doctest: +SKIP
        (5, 5)
    """
    m = source.manifest
    if m is None:
        if max_images is None:
            raise ConfigError(f"{source.display} has no manifest, so pass max_images= explicitly")
        return int(max_images), None
    least = m.max_images_per_pack
    if least is None and m.max_images is not None:
        least = m.max_images  # an older manifest: every pack fits the budget it was packed for
    if least is None and m.pack_index:
        from ...format.pack_index import COLUMNS

        column = COLUMNS.index("images")
        least = max((int(rows[:, column].max(initial=0)) for rows in read_pack_index(source, **read_kwargs)),
                    default=0)
        logger.info("%s: the manifest does not record max_images_per_pack (written by an older wdspack); its pack "
                    "index gives %d", source.display, least)
    default = m.max_images if m.max_images is not None else least
    if max_images is None:
        if default is None:
            raise ConfigError(f"{source.display} was packed without an image limit and its manifest (written by an "
                              "older wdspack, without a pack index) does not say how many images its fullest pack "
                              "holds; pass max_images= at least that many, or add the index with "
                              "`wdspack index DATASET_FOLDER` and load again")
        return int(default), least
    if isinstance(max_images, bool) or not isinstance(max_images, numbers.Integral) or max_images < 0:
        raise ConfigError(f"max_images={max_images!r} must be a non-negative integer (image slots per example)")
    if least is not None and max_images < least:
        raise ConfigError(f"max_images={max_images} is too few image slots for {source.display}: its fullest pack "
                          f"holds {least} images; pass max_images >= {least} (extra slots stay empty) or leave it "
                          f"out (default {default})")
    return int(max_images), least


def check_pixels(display: str, image_policy: Mapping[str, Any], images: int, *, processor: Any,
                 image_transform: Any, text_only: bool) -> None:
    """Refuse, or warn once, when a loader over an image dataset would stream no pixels.

    A dataset packed with a processor (its ``image_policy`` names a family) is refused: its
    ``input_ids`` hold the processor's feature tokens for every image, which the model fills from
    pixels it would never get, so such batches train nothing useful (or fail deep in the model's
    forward). Any other image dataset gets a warning: the text alone may be what the run wants.
    ``text_only=True`` says so on purpose (no warning, no refusal).

    Example:
        >>> check_pixels("packed/", {"kind": "fixed", "tokens_per_image": 64}, 0, processor=None,
        ...              image_transform=None, text_only=False)  # no images: nothing to say
    """
    if text_only:
        if processor is not None or image_transform is not None:
            raise ConfigError("text_only=True streams no pixels; drop processor= / image_transform=, or text_only=")
        return
    if not images or processor is not None or image_transform is not None:
        return
    name = image_policy.get("name")
    if image_policy.get("kind") == "processor" and image_policy.get("family"):
        raise ConfigError(f"{display} holds {images} images packed with the {image_policy['family']} processor "
                          f"{name!r}, but the loader has no processor=, so its batches would carry the image tokens "
                          f"and no pixels; pass processor={name!r} (the processor it was packed with), or "
                          "text_only=True to stream the text alone on purpose")
    fix = (f"processor={name!r}" if image_policy.get("kind") == "processor" and name
           else "image_transform=wdspack.make_image_transform(size=...)")
    logger.warning("%s holds %d images, but the loader has neither image_transform= nor processor=, so its batches "
                   "carry no pixels; pass %s, or text_only=True to stream the text alone without this warning",
                   display, images, fix)


def media_token_budgets(totals: Mapping[str, Any]) -> dict[str, int | None]:
    """Per kind, the most of its tokens one pack holds, as a batch's pixel rows are sized: the images'
    :func:`~wdspack.format.manifest.image_token_budget` (None: not recorded); another kind's
    ``max_{name}_tokens_per_pack`` (0: the dataset holds none).

    Example:
        >>> media_token_budgets({"images": 3, "max_image_tokens_per_pack": 64})
        {'image': 64, 'video': 0, 'audio': 0}
    """
    return {kind.name: image_token_budget(totals) if kind is IMAGE
            else int(totals.get(f"max_{kind.name}_tokens_per_pack") or 0) for kind in KINDS}


def cp_padding_note(display: str, *, cp: int, padding: int, packs: int, seq_len: int) -> str:
    """The line a loader logs once for a dataset planned for ``cp`` context-parallel ranks: each sub-sample is
    padded to a multiple of ``2·cp`` as it loads, ``padding`` tokens in all, and their share of the packs'
    ``seq_len`` budget (the plan counted them, so no pack grows past ``seq_len``).

    Example:
        >>> "30 tokens in all, 1.00% of the packs' seq_len budget" in cp_padding_note(
        ...     "packed/", cp=2, padding=30, packs=3, seq_len=1000)
        True
    """
    share = padding / (packs * seq_len) if packs and seq_len else 0.0
    return (f"{display} was planned for {cp} CP ranks (--cp {cp}): each sub-sample is padded to a multiple of "
            f"{2 * cp} tokens as it loads, {padding} tokens in all, {share:.2%} of the packs' seq_len budget "
            "(counted in the plan: no pack grows past it)")
