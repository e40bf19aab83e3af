"""Stages for a ``webdataset`` pipeline you already have: pack records in, ``make_loader``'s batches out.

    wds.SimpleShardList(info.urls) ─► split_by_node ─► split_by_worker ─► tarfile_to_samples
        ─► to_examples(info, ...)         one fixed-shape example per pack ("mp" bytes or a decoded dict)
        ─► [wds.shuffle(...), your filters]
        ─► batched(8, dataset=info)       collate: the batch contract of DESIGN.md §4

    info = read_dataset("hf://datasets/org/packed@main")   # the manifest, once: shard URLs and budgets

Holds: the same tensors :func:`wdspack.make_loader` yields for the same packs in the same order (a
dataset planned for context parallelism, ``--cp N``, padded per sub-sample to ``2·N`` as it loads, the same);
every stage a plain generator, none imports ``webdataset``; a sample's error goes to the
pipeline's ``handler``, a setup error always raises; never ``.decode()`` the shards (the stages
read the ``mp`` bytes with wdspack's own reader); a mixture is refused (:func:`read_dataset`).
docs/architecture.md#webdataset-stages tells why, and what ``make_loader`` adds.
"""

from __future__ import annotations

import functools
import logging
import numbers
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import msgpack
import torch

from ..errors import ConfigError, FormatError, WdspackError
from ..format.pack import Pack, decode_pack, pad_samples
from ..media import IMAGE, KINDS

__all__ = ["DatasetInfo", "batched", "collate", "decode_packs", "read_dataset", "to_examples"]

logger = logging.getLogger(__name__)

#: ``handler(exn) -> bool``: webdataset's error convention (True: skip and go on; False: stop; or raise).
Handler = Callable[[Exception], bool]
#: The member extension of a pack (DESIGN.md §2): ``{key}.mp``.
PACK_KEY = "mp"


@dataclass(frozen=True, slots=True)
class DatasetInfo:
    """What a pipeline needs from a dataset's manifest, read once (:func:`read_dataset`).

    ``urls`` are the shards in the manifest's order, ready for ``wds.SimpleShardList``: local
    paths, ``https://`` URLs, or for a Hub source ``hf://datasets/ORG/NAME@COMMIT/...`` pinned to
    the commit the revision pointed to (webdataset's own ``hf://`` opener reads them).
    ``max_images`` is the image slots of each example: the manifest's ``max_images``, or for a
    dataset packed without an image limit the images of its fullest pack (``max_images_per_pack``,
    the fewest slots any stage may be given). ``media`` counts the dataset's items of each kind and
    ``media_tokens`` holds, per kind, the most of its tokens one pack holds
    (:func:`~.batch.budgets.media_token_budgets`); a kind's entries also read as ``info.images``,
    ``info.videos`` (its count) and ``info.max_image_tokens``, ``info.max_video_tokens`` (its tokens).
    ``cp``: the context-parallel degree the packs were planned for (``wdspack pack --cp``; None: not
    planned), ``cp_padding`` the tokens that padding every sub-sample to ``2·cp`` adds (the manifest's).
    """

    urls: tuple[str, ...]
    packs: tuple[int, ...]
    seq_len: int
    max_images: int
    pad_token_id: int
    max_samples_per_pack: int | None = None
    image_policy: Mapping[str, Any] = field(default_factory=dict)
    display: str = ""
    max_images_per_pack: int | None = None
    #: the dataset's items of each kind (``{"image": 120, "video": 0}``)
    media: Mapping[str, int] = field(default_factory=dict)
    #: per kind, the most of its tokens in one pack (the images' None: not recorded; another kind's 0: none)
    media_tokens: Mapping[str, int | None] = field(default_factory=dict)
    cp: int | None = None
    cp_padding: int = 0

    def __getattr__(self, key: str) -> Any:  # a kind's entries by name: info.images, info.max_video_tokens
        if key in ("media", "media_tokens"):  # not set yet (unpickling): not a kind's entry
            raise AttributeError(key)
        for kind in KINDS:
            if key == kind.plural:
                return int(self.media.get(kind.name, 0))
            if key == f"max_{kind.name}_tokens":
                return self.media_tokens.get(kind.name, None if kind is IMAGE else 0)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {key!r}")

    @property
    def num_packs(self) -> int:
        return sum(self.packs)


def read_dataset(source: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None,
                 hf_urls: bool = True) -> DatasetInfo:
    """Read a dataset's manifest once: shard URLs, pack counts, budgets and pad id.

    Args:
        source: a dataset folder, its ``manifest.json``, an ``https://`` dataset root or
            ``hf://datasets/ORG/NAME@REV[/sub]`` (anything :func:`wdspack.make_loader` takes that has a manifest).
            Not a mixture: that raises :class:`ConfigError` naming :func:`wdspack.make_loader` (see the
            module docstring).
        storage_options: for ``hf://``: HfFileSystem options (``endpoint``, ``token``); never printed.
        hf_urls: for a Hub source, give ``hf://...@COMMIT/...`` shard URLs (webdataset's ``hf://``
            opener adds the token); False gives the ``https://.../resolve/COMMIT/...`` URLs, which
            need the token in a header for a private repo.

    Example:
        >>> info = read_dataset("packed/")  # doctest: +SKIP
        >>> info.urls[0], info.seq_len, info.max_images, info.pad_token_id  # doctest: +SKIP
        ('packed/train-000000.tar', 4096, 16, 0)
    """
    from ..format.dataset import resolve_source
    from .batch.budgets import image_budget, media_token_budgets
    from .mixture.spec import is_mixture_spec

    if is_mixture_spec(source):
        raise ConfigError(_mixture_refusal(source))
    text = os.fspath(source)
    resolved = resolve_source(text, storage_options=storage_options)
    m = resolved.manifest
    if m is None:
        raise ConfigError(f"{resolved.display} has no manifest.json; pass seq_len=, max_images= and pad_token_id= "
                          "to the stages yourself")
    pad = m.tokenizer.get("pad_token_id")
    if pad is None:
        raise ConfigError(f"the manifest of {resolved.display} names no pad_token_id; pass pad_token_id= to "
                          "to_examples")
    slots, least = image_budget(resolved)
    urls = tuple(s.url for s in resolved.shards)
    if text.startswith("hf://") and hf_urls:
        urls = tuple(_pinned_hf_url(text, u) for u in urls)
    return DatasetInfo(urls=urls, packs=tuple(s.packs for s in resolved.shards), seq_len=int(m.seq_len),
                       max_images=slots, pad_token_id=int(pad),
                       max_samples_per_pack=m.totals.get("max_samples_per_pack"),
                       image_policy=dict(m.image_policy), display=resolved.display, max_images_per_pack=least,
                       media={kind.name: sum(getattr(s, kind.plural) for s in m.shards) for kind in KINDS},
                       media_tokens=media_token_budgets(m.totals), cp=m.cp,
                       cp_padding=int(m.totals.get("cp_padding") or 0))


def decode_packs(dataset: DatasetInfo | None = None, *, seq_len: int | None = None, max_images: int | None = None,
                 handler: Handler | None = None) -> Callable[[Iterable[Any]], Iterator[Pack]]:
    """A stage: samples (``{"mp": bytes | dict, ...}``) → validated :class:`~wdspack.Pack` records.

    Example:
        >>> import numpy as np
        >>> from wdspack.format.pack import encode_pack
        >>> p = Pack(np.array([1, 5, 2]), np.array([0, 1, 1], np.uint8), (3,), ("a",))
        >>> stage = decode_packs(seq_len=8, max_images=0)
        >>> [q.seq_lens for q in stage([{"__key__": "0", "mp": encode_pack(p, token_dtype="<u2")}])]
        [(3,)]
    """
    L, M, _ = _budgets(dataset, seq_len, max_images, 0)
    return functools.partial(_decode_stage, seq_len=L, max_images=M, handler=handler)


def to_examples(dataset: DatasetInfo | None = None, *, seq_len: int | None = None, max_images: int | None = None,
                pad_token_id: int | None = None,
                image_transform: Callable[[Sequence[bytes]], dict[str, torch.Tensor]] | None = None,
                processor: Any = None, max_image_tokens: int | None = None, handler: Handler | None = None,
                text_only: bool = False, cp: int | None = None) -> Callable[[Iterable[Any]], Iterator[dict[str, Any]]]:
    """A stage: samples (or :class:`~wdspack.Pack` records) → one fixed-shape example per pack.

    The examples are for :func:`collate` / :func:`batched`: with the built-in image transform the
    images are decoded and resized here and normalised by the collate straight into the batch
    tensor (as :func:`wdspack.make_loader` does); with ``processor`` the example carries the
    processor's parts, which the collate joins. A dataset planned for context parallelism
    (``wdspack pack --cp N``: ``info.cp``) has every sub-sample padded at its end to a multiple of
    ``2·N`` here (pad id, no target), as ``make_loader`` does, so ``cu_seqlens`` split over ``N`` CP
    ranks with no more padding; the stage logs once what that padding costs.

    Args:
        dataset: the dataset's :class:`DatasetInfo`; its budgets and pad id are the defaults, and a
            different value raises :class:`ConfigError` (``max_images`` may be larger: extra slots
            stay empty). Without it pass the three numbers.
        seq_len, max_images, pad_token_id: ``L``, ``M`` and the padding id.
        image_transform: bytes → tensors (:func:`wdspack.make_image_transform`). Without it (or
            ``processor``) an image dataset's examples carry no pixels: a warning, or for a dataset
            packed with a processor a :class:`ConfigError`, as ``make_loader`` does.
        processor: the model's processor (object, folder or cached name) for model-ready keys, as
            ``make_loader(..., processor=...)``; the one the dataset was packed with.
        max_image_tokens: the most image tokens in a pack (default the manifest's); sizes the
            processor's pixel tensors.
        handler: webdataset's ``handler(exn)`` for bad samples; default: raise.
        text_only: the text of an image dataset without pixels, on purpose (no warning).
        cp: the CP degree the packs were planned for (default: the manifest's ``cp``); without
            ``dataset``, pass it for packs planned with ``--cp``. With ``dataset``, another value raises
            :class:`ConfigError` (``wdspack reshard --cp N`` re-plans a dataset for another degree).

    Example:
        >>> info = read_dataset("packed/")  # doctest: +SKIP
        >>> stage = to_examples(info, image_transform=wdspack.make_image_transform(size=224))  # doctest: +SKIP
        >>> pipeline = wds.DataPipeline(wds.SimpleShardList(info.urls), wds.split_by_node, wds.split_by_worker,
        ...                             wds.tarfile_to_samples(), stage, batched(8, dataset=info))  # doctest: +SKIP
    """
    L, M, pad = _budgets(dataset, seq_len, max_images, pad_token_id)
    if pad is None:
        raise ConfigError("pad_token_id is needed (the id written into padding); pass it, or dataset=read_dataset(...)")
    cp = _planned_cp(dataset, cp)
    if processor is not None and image_transform is not None:
        raise ConfigError("give processor= or image_transform=, not both: the processor lays out the pixels")
    from .batch.budgets import check_pixels

    check_pixels(dataset.display if dataset is not None else "the dataset",
                 dataset.image_policy if dataset is not None else {}, dataset.images if dataset is not None else 0,
                 processor=processor, image_transform=image_transform, text_only=text_only)
    batcher = None
    if processor is not None:
        from .batch.model import ModelBatcher

        tokens = dict(dataset.media_tokens) if dataset is not None else {}
        if max_image_tokens is not None:
            tokens[IMAGE.name] = max_image_tokens
        batcher = ModelBatcher(processor, seq_len=L, max_images=M, media_tokens=tokens)
        packed_for = dataset.image_policy.get("family") if dataset is not None else None
        if dataset is not None and packed_for is not None and packed_for != batcher.family.name:
            raise ConfigError(f"{dataset.display} was packed with a {packed_for} processor; this processor is "
                              f"{batcher.family.name} ({type(batcher.processor).__name__}); use the one it was "
                              "packed with")
    return functools.partial(_example_stage, seq_len=L, max_images=M, pad_token_id=pad,
                             image_transform=image_transform, batcher=batcher, handler=handler, cp=cp)


def collate(examples: Sequence[dict[str, Any]], *, attention_mask: str | None = None, padding_free: bool = False,
            max_segments: int | None = None) -> dict[str, Any]:
    """:func:`to_examples` outputs → one batch, the same tensors as ``make_loader``'s (DESIGN.md §4).

    For ``wds.batched(B, collation_fn=functools.partial(collate, max_segments=...), partial=False)``;
    :func:`batched` does the same and fills ``max_segments`` from the manifest.

    Args:
        examples: ``B`` examples from :func:`to_examples` (not changed).
        attention_mask, padding_free, max_segments: as :func:`wdspack.collate_packs`.
    """
    from .batch.buffers import collate_staged

    return collate_staged(examples, attention_mask=attention_mask, padding_free=padding_free,
                          max_segments=max_segments)[0]


def batched(batch_size: int, *, dataset: DatasetInfo | None = None, attention_mask: str | None = None,
            padding_free: bool = False, max_segments: int | str | None = "auto",
            partial: bool = False) -> Callable[[Iterable[dict[str, Any]]], Iterator[dict[str, Any]]]:
    """A stage: examples → batches of ``batch_size`` (:func:`collate`); a short last batch is dropped.

    Args:
        batch_size: ``B``.
        dataset: for ``max_segments="auto"``: ``B × (max_samples_per_pack + 1)`` from the manifest, so
            ``cu_seqlens`` has a static length as in :func:`wdspack.make_loader`.
        attention_mask, padding_free: as :func:`collate`.
        max_segments: ``"auto"``, ``None`` (only the real segments) or an int.
        partial: True yields the short last batch too (its shapes differ).

    Example:
        >>> stage = batched(2)
        >>> [b["input_ids"].shape for b in stage(examples)]  # doctest: +SKIP
        [torch.Size([2, 4096]), ...]
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} must be >= 1")
    if max_segments == "auto":
        most = dataset.max_samples_per_pack if dataset is not None else None
        max_segments = None if most is None else batch_size * (int(most) + 1)
    elif max_segments is not None and not (isinstance(max_segments, int) and max_segments >= 1):
        raise ConfigError(f"max_segments={max_segments!r}: give 'auto', None or a positive int")
    return functools.partial(_batch_stage, batch_size=int(batch_size), partial=bool(partial),
                             options={"attention_mask": attention_mask, "padding_free": padding_free,
                                      "max_segments": max_segments})


# -- the stages ---------------------------------------------------------------------------------


def _decode_stage(src: Iterable[Any], *, seq_len: int, max_images: int, handler: Handler | None) -> Iterator[Pack]:
    handler = handler or _reraise
    for sample in src:
        try:
            pack = _pack_of(sample, seq_len=seq_len, max_images=max_images, handler=handler)
        except _Stop:
            return
        except ConfigError:
            raise
        except Exception as exn:  # webdataset convention: the handler decides
            if handler(exn):
                continue
            return
        yield pack


def _example_stage(src: Iterable[Any], *, seq_len: int, max_images: int, pad_token_id: int, image_transform: Any,
                   batcher: Any, handler: Handler | None, cp: int | None) -> Iterator[dict[str, Any]]:
    handler = handler or _reraise
    for sample in src:
        try:
            pack = _pack_of(sample, seq_len=seq_len, max_images=max_images, handler=handler)
            if cp:  # planned for CP: the padding the plan counted goes in now, as make_loader puts it
                pack = pad_samples(pack, multiple=2 * cp, pad_token_id=pad_token_id)
            example = _example(pack, seq_len=seq_len, max_images=max_images, pad_token_id=pad_token_id,
                               image_transform=image_transform, batcher=batcher, where=_where(sample))
        except _Stop:
            return
        except ConfigError:
            raise  # set up unlike the dataset (budgets, another processor): not the sample's fault
        except Exception as exn:  # webdataset convention: the handler decides
            if handler(exn):
                continue
            return
        yield example


def _batch_stage(src: Iterable[dict[str, Any]], *, batch_size: int, partial: bool,
                 options: dict[str, Any]) -> Iterator[dict[str, Any]]:
    group: list[dict[str, Any]] = []
    for example in src:
        group.append(example)
        if len(group) == batch_size:
            yield collate(group, **options)
            group = []
    if group and partial:
        yield collate(group, **options)


class _Stop(Exception):
    """The handler said stop (returned False) for a member that is not a pack."""


def _pack_of(sample: Any, *, seq_len: int, max_images: int, handler: Handler) -> Pack:
    """The pack in one sample; a member that is not a pack goes through ``handler``.

    A sample holding only other members (``x.pickle``) raises :class:`FormatError` (the handler
    then skips it or not). Other members next to a pack's ``mp`` (same key) are never read: the
    handler hears of them and, if it returns True, the pack goes on.
    """
    from ..format.tar import FOREIGN_RULE

    if isinstance(sample, Pack):
        return sample
    if not isinstance(sample, Mapping):
        raise FormatError(f"a pipeline sample is a {type(sample).__name__}, not a dict with an {PACK_KEY!r} entry; "
                          "put to_examples right after tarfile_to_samples (or WebDataset) without .to_tuple()")
    foreign = sorted(k for k in sample if not k.startswith("__") and k != PACK_KEY)
    if PACK_KEY not in sample:
        raise FormatError(f"{_where(sample)}: member(s) {['.' + k for k in foreign]} and no pack; {FOREIGN_RULE}")
    if foreign and not handler(FormatError(f"{_where(sample)}: member(s) {['.' + k for k in foreign]} beside the "
                                           f"pack, not read; {FOREIGN_RULE}")):
        raise _Stop
    data = sample[PACK_KEY]
    if isinstance(data, Mapping):  # decoded upstream (.decode()): back to bytes, then the same checks
        data = msgpack.packb(dict(data), use_bin_type=True)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise FormatError(f"{_where(sample)}: the {PACK_KEY!r} entry is a {type(data).__name__}, not bytes")
    try:
        return decode_pack(bytes(data), seq_len=seq_len, max_images=max_images)
    except FormatError as e:
        raise FormatError(f"{_where(sample)}: {e}") from None


def _example(pack: Pack, *, seq_len: int, max_images: int, pad_token_id: int, image_transform: Any, batcher: Any,
             where: str) -> dict[str, Any]:
    """``buffers.staged_example``, as the loader makes it (images kept per pack for :func:`collate`)."""
    from .batch.buffers import staged_example

    try:
        return staged_example(pack, seq_len=seq_len, max_images=max_images, pad_token_id=pad_token_id,
                              image_transform=image_transform, batcher=batcher)
    except ConfigError:
        raise
    except (WdspackError, OSError, ValueError) as e:
        raise FormatError(f"{where}: {type(e).__name__}: {e}") from None


# -- helpers ------------------------------------------------------------------------------------


def _budgets(dataset: DatasetInfo | None, seq_len, max_images, pad_token_id) -> tuple[int, int, int | None]:
    if dataset is None:
        missing = [n for n, v in (("seq_len", seq_len), ("max_images", max_images)) if v is None]
        if missing:
            raise ConfigError(f"pass {' and '.join(missing)} (or dataset=read_dataset(...) to take them from the "
                              "manifest)")
        return int(seq_len), int(max_images), None if pad_token_id is None else int(pad_token_id)
    have = {"seq_len": dataset.seq_len, "pad_token_id": dataset.pad_token_id}
    given = {"seq_len": seq_len, "pad_token_id": pad_token_id}
    for name, value in given.items():
        if value is not None and int(value) != int(have[name]):
            fix = f" or re-pack with `wdspack reshard --seq-len {value}`" if name == "seq_len" else ""
            raise ConfigError(f"{name}={value} does not match the dataset's {name} {have[name]} ({dataset.display}); "
                              f"drop the argument{fix}")
    if max_images is None:
        return dataset.seq_len, dataset.max_images, dataset.pad_token_id
    least = dataset.max_images_per_pack if dataset.max_images_per_pack is not None else dataset.max_images
    if isinstance(max_images, bool) or not isinstance(max_images, numbers.Integral):
        raise ConfigError(f"max_images={max_images!r} must be a non-negative integer (image slots per example)")
    if max_images < least:
        raise ConfigError(f"max_images={max_images!r} is too few image slots for {dataset.display}: its fullest pack "
                          f"holds {least} images; pass max_images >= {least} (extra slots stay empty) or leave it "
                          f"out (default {dataset.max_images})")
    return dataset.seq_len, int(max_images), dataset.pad_token_id


def _planned_cp(dataset: DatasetInfo | None, cp: int | None) -> int | None:
    """The CP degree the packs were planned for: the manifest's (``cp`` must agree), else ``cp``; said once."""
    if cp is not None and (isinstance(cp, bool) or not isinstance(cp, numbers.Integral) or cp < 1):
        raise ConfigError(f"cp={cp!r}: the CP degree the packs were planned for is a number of ranks, >= 1")
    if dataset is None:
        return None if cp is None else int(cp)
    if cp is not None and cp != dataset.cp:
        planned = f"planned for cp {dataset.cp}" if dataset.cp else "not planned for CP"
        raise ConfigError(f"cp={cp} does not match {dataset.display}, {planned}; drop the argument, or re-plan it "
                          f"with `wdspack reshard {dataset.display} OUT --seq-len {dataset.seq_len} --cp {cp}`")
    if dataset.cp:
        from .batch.budgets import cp_padding_note

        logger.info(cp_padding_note(dataset.display, cp=dataset.cp, padding=dataset.cp_padding,
                                    packs=dataset.num_packs, seq_len=dataset.seq_len))
    return dataset.cp


def _mixture_refusal(source: Any) -> str:
    what = repr(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else f"this {type(source).__name__}"
    return (f"read_dataset reads one packed dataset, and {what} is a mixture: a webdataset pipeline reads whole "
            "shards in its own order, so it cannot follow the mixture's token-exact schedule (single packs of every "
            "source interleaved, each source read in pieces of its own seeded passes); stream the mixture with "
            "wdspack.make_loader(mixture, ...), which gives the same batches with source_idx, or give each source's "
            "folder to read_dataset for a pipeline of its own")


def _where(sample: Any) -> str:
    if not isinstance(sample, Mapping):
        return "a sample"
    url, key = sample.get("__url__"), sample.get("__key__")
    return f"{url or '?'} member {key!r}" if url or key else "a sample"


def _reraise(exn: Exception) -> bool:
    raise exn


def _pinned_hf_url(source: str, resolved: str) -> str:
    """``hf://datasets/ORG/NAME@REV/...`` + its ``.../resolve/COMMIT/path`` → ``hf://datasets/ORG/NAME@COMMIT/path``."""
    m = re.search(r"/resolve/([^/]+)/(.+)$", resolved)
    repo = re.match(r"hf://((?:datasets/|spaces/|models/)?[^/@]+/[^/@]+)", source)
    if m is None or repo is None:
        raise ConfigError(f"cannot turn {resolved} back into an hf:// URL; pass hf_urls=False")
    return f"hf://{repo.group(1)}@{unquote(m.group(1))}/{m.group(2)}"
