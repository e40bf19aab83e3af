"""``make_loader``: a ready, resumable DataLoader of fixed-shape batches.

    worker w (slot rank × workers + w) ─► batch + its position (lap, emitted, yielded), counters ─┐
    DataLoader: the workers' batches in turn ◄──────────────────────────────────────────────────────┘
    PackedLoader: strips the position, notes it per worker ─► your batch; state_dict() from the notes

Holds: a checkpoint is what was *consumed* (not prefetched), three integers per worker; a restore
reaches the workers, persistent ones too, through shared memory; every worker yields the same number
of full batches, so every rank has ``len(loader)`` batches per epoch. The state and the kinds of
restore: :mod:`.resume`; a batch's journey and shared memory: :mod:`.batch.buffers`.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader

from ..errors import ConfigError, suggest_keywords
from .batch.buffers import PixelBuffers
from .batch.collate import META_KEY
from .batch.collate_fn import LoaderCollate, check_pixel_dtype, resolve_max_segments
from .batch.packed_with import check_packed_with
from .dataset import PackedDataset
from .mixture.spec import Mixture
from .options import Balance, ReadOptions
from .resume import LoaderPosition, LoaderState, restore, save_state
from .stats import report_stats

__all__ = ["PackedLoader", "make_loader"]

logger = logging.getLogger(__name__)


@suggest_keywords
def make_loader(source: str | os.PathLike[str] | Sequence[Any] | Mixture | PackedDataset, *, batch_size: int,
                num_workers: int = 2, seed: int = 0, shuffle: bool = True, shuffle_buffer: int = 256,
                rank: int | None = None, world_size: int | None = None, remainder: str = "drop",
                seq_len: int | None = None, max_images: int | None = None, pad_token_id: int | None = None,
                image_transform: Callable[[Sequence[bytes]], dict[str, torch.Tensor]] | None = None,
                processor: Any = None, text_only: bool = False,
                expect_tokenizer: str | Mapping[str, Any] | None = None, on_corrupt: str = "skip",
                read: ReadOptions | Mapping[str, Any] | None = None,
                balance: str | Balance | Mapping[str, Any] | None = None,
                attention_mask: str | None = None, padding_free: bool = False,
                max_segments: int | str | None = "auto", pin_memory: bool | None = None,
                persistent_workers: bool | None = None, prefetch_factor: int | None = None,
                multiprocessing_context: Any = None, timeout: float = 0,
                reuse_buffers: bool = True, pixel_dtype: str = "float32") -> PackedLoader:
    """A DataLoader of fixed-shape batches over a packed dataset, with ``state_dict`` / ``load_state_dict``.

    Args:
        source: anything :class:`PackedDataset` takes (one dataset or a mixture), or a dataset built
            already (then the dataset options below must stay at their defaults: they were the dataset's to take).
        batch_size: packs per batch (``B``); every batch is full.
        num_workers: DataLoader worker processes (0: read in this process).
        seed: the shuffling seed (the same on every rank).
        shuffle: shuffle shard order per epoch and packs through a buffer (both seeded).
        shuffle_buffer: packs held by the shuffle buffer per worker.
        rank: default from ``torch.distributed`` when initialised, else 0.
        world_size: default from ``torch.distributed`` when initialised, else 1.
        remainder: ``"drop"`` or ``"wrap"``: how ranks are evened out.
        seq_len: tokens per example; default the manifest's.
        max_images: image slots per example; default the manifest's.
        pad_token_id: default the manifest tokenizer's.
        image_transform: image bytes → tensors (``wdspack.make_image_transform``), for pixels.
        processor: the model's processor, for what its ``forward`` takes: the one the dataset was packed
            with (a processor with another image token or image layout is refused here, not in a worker:
            :mod:`.batch.packed_with`).
        text_only: stream an image dataset's text without pixels on purpose.
        expect_tokenizer: the tokenizer the training uses; a mismatch raises :class:`ConfigError`.
        on_corrupt: ``"skip"`` or ``"raise"`` for corrupt packs and truncated shards.
        read: how shards are read, a :class:`~wdspack.ReadOptions` or a dict of its fields
            (``read={"timeout": 10}`` is the network timeout, which ``timeout`` here is not).
        balance: ``"cost"``, a :class:`~wdspack.Balance` or a dict of its fields; evens out ranks and workers
            (batches are taken from workers in turn: 2 workers on image packs, busy 74 % → 92 % of the time).
        attention_mask, padding_free: passed to ``collate.collate_packs``.
        max_segments: ``cu_seqlens`` gets ``max_segments + 1`` entries in every batch (static shapes),
            padded with empty segments. ``"auto"``: ``batch_size × (max_samples_per_pack + 1)`` from
            the manifest (each pack's sub-samples plus its padding tail); ``None``: only the real segments.
        pin_memory: default True when CUDA is available.
        persistent_workers: default True when ``num_workers > 0``.
        prefetch_factor, multiprocessing_context, timeout: passed to the DataLoader (``timeout``: seconds
            to wait for a worker's batch).
        reuse_buffers: with workers, each keeps ``prefetch_factor + 3`` ``pixel_values`` tensors in
            shared memory and writes a later batch into one once this process holds no view of it
            any more (new shared memory costs a page fault per 4 KiB: about a third of a worker's
            time). Pass False if batches go on to *other* processes uncopied (the main process
            cannot see when those let go).
        pixel_dtype: ``"float32"``: ``pixel_values`` arrive normalised. ``"uint8"``: the workers ship
            the decoded, resized bytes un-normalised, a quarter of the bytes through shared memory and
            to the device; finish each batch there with :func:`wdspack.normalize_pixels` (equal to the
            float32 path to float rounding; empty slots and padding rows zero in both). With the
            built-in ``image_transform``, or a ``processor`` of the Qwen-VL families (flattened
            patches); other processors lay out float pixels themselves and refuse it.

    Example:
        >>> loader = make_loader("hf://datasets/my-org/llava-packed@main", batch_size=8)  # doctest: +SKIP
        >>> for step, batch in enumerate(loader):  # doctest: +SKIP
        ...     loss = model(**batch).loss
        ...     if step % 1000 == 0:
        ...         torch.save({"model": model.state_dict(), "data": loader.state_dict()}, "ckpt.pt")
    """
    options = {"seed": seed, "shuffle": shuffle, "shuffle_buffer": shuffle_buffer, "rank": rank,
               "world_size": world_size, "remainder": remainder, "seq_len": seq_len, "max_images": max_images,
               "pad_token_id": pad_token_id, "image_transform": image_transform, "processor": processor,
               "text_only": text_only, "expect_tokenizer": expect_tokenizer, "on_corrupt": on_corrupt,
               "read": read, "balance": balance}
    if isinstance(source, PackedDataset):
        given = sorted(k for k, v in options.items() if v is not _DATASET_DEFAULTS[k] and v != _DATASET_DEFAULTS[k])
        if given:
            raise ConfigError(f"dataset options {given} were given with a dataset built already; "
                              "pass them to PackedDataset instead")
        if source.batch_size != batch_size:
            raise ConfigError(f"the dataset was built with batch_size={source.batch_size}, the loader has "
                              f"{batch_size}; they must agree so every rank gets the same number of full batches")
        dataset = source
    else:
        dataset = PackedDataset(source, batch_size=batch_size, **options)
    return PackedLoader(dataset, batch_size=batch_size, num_workers=num_workers, attention_mask=attention_mask,
                        padding_free=padding_free, max_segments=max_segments, pin_memory=pin_memory,
                        persistent_workers=persistent_workers,
                        prefetch_factor=prefetch_factor, multiprocessing_context=multiprocessing_context,
                        timeout=timeout, reuse_buffers=reuse_buffers, pixel_dtype=pixel_dtype)


#: PackedDataset's defaults of the options make_loader passes on (to tell "given" from "left alone").
_DATASET_DEFAULTS = {name: p.default for name, p in inspect.signature(PackedDataset.__init__).parameters.items()
                     if p.default is not inspect.Parameter.empty}


class PackedLoader:
    """Iterate batches; ``state_dict()`` after any batch, ``load_state_dict()`` in a fresh loader to continue.

    Each ``for batch in loader`` continues the stream where the last one stopped (after a
    ``break`` too) and moves to the next epoch once an epoch is consumed; ``set_epoch`` jumps.

    What may change between save and restore: the data's location (a local copy instead of the
    Hub, a mirror), ``block_size``, ``retries``, ``pin_memory``, ``prefetch_factor``, the image
    transform, ``pixel_dtype`` and the process. What may not (restore refuses, naming the field): the dataset's
    shards, ``seed``, ``shuffle``, ``shuffle_buffer``, ``remainder``, ``batch_size`` and the balance
    settings. Rank, world size and ``num_workers`` may: the rest of the epoch is then re-split
    (elastic resume, see :meth:`load_state_dict`).
    """

    def __init__(self, dataset: PackedDataset, *, batch_size: int, num_workers: int = 2,
                 attention_mask: str | None = None, padding_free: bool = False,
                 max_segments: int | str | None = "auto", pin_memory: bool | None = None,
                 persistent_workers: bool | None = None, prefetch_factor: int | None = None,
                 multiprocessing_context: Any = None, timeout: float = 0, reuse_buffers: bool = True,
                 pixel_dtype: str = "float32") -> None:
        if num_workers < 0:
            raise ConfigError(f"num_workers={num_workers} must be >= 0")
        self.pixel_dtype = check_pixel_dtype(pixel_dtype, dataset)
        check_packed_with(dataset)  # here, not in worker 0's first batch
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.num_workers = int(num_workers)
        self._workers = max(1, self.num_workers)
        dataset.with_position = True
        self.max_segments = resolve_max_segments(max_segments, dataset, self.batch_size)
        extra = {} if self.num_workers == 0 else {
            "persistent_workers": True if persistent_workers is None else persistent_workers,
            "prefetch_factor": prefetch_factor, "multiprocessing_context": multiprocessing_context}
        reuse = reuse_buffers and self.num_workers > 0
        buffers = PixelBuffers(self.num_workers, (prefetch_factor or 2) + 3) if reuse else None
        self.dataloader = DataLoader(
            dataset, batch_size=self.batch_size, num_workers=self.num_workers, drop_last=True, timeout=timeout,
            collate_fn=LoaderCollate(attention_mask=attention_mask, padding_free=padding_free,
                                max_segments=self.max_segments, buffers=buffers, pixel_dtype=self.pixel_dtype),
            pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory, **extra)
        self._epoch = dataset.epoch
        self._positions: list[tuple[int, ...]] = [(0, 0, 0)] * self._workers  # (lap, emitted, yielded) per worker
        self._batches = 0
        self._resume = False
        self._stats_base: Counter = Counter()
        self._stats_live: dict[int, Counter] = {}
        len(self)  # fail now when there are too few packs for ranks × workers × batch_size
        dataset.load_offsets_if_split(self._workers)  # before workers copy the dataset

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        return self._workers * self.dataset.packs_per_slot(self._workers, self._epoch) // self.batch_size

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def source_names(self) -> tuple[str, ...]:
        """The sources' names, indexed by each batch's ``source_idx`` (one dataset: one name)."""
        return self.dataset.source_names

    @property
    def stats(self) -> dict[str, int]:
        """Counters summed over workers and epochs: corrupt_packs, dropped_samples, truncated_shards, ignored_members,
        retries, ...; and per source and reason the dropped samples (:func:`~.stats.dropped_key`)."""
        total = Counter(self._stats_base)
        for c in self._stats_live.values():
            total.update(c)
        return report_stats(total)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning at the next iteration."""
        mix = self.dataset.mixture
        if mix is not None and mix.mid_continuation(int(epoch)):
            raise ConfigError(f"epoch {epoch} began under another mixture or layout (a resume began inside it), so its "
                              f"beginning cannot be replayed here; go on with it, or set_epoch({int(epoch) + 1})")
        self.dataset.set_elastic(None)
        self._epoch, self._batches, self._resume = int(epoch), 0, False
        self._positions = [(0, 0, 0)] * self._workers

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        self._fold_stats()
        self.dataset.publish(self._epoch, self._positions if self._batches or self._resume else None,
                              shift=self._batches % self._workers)
        epoch_len = len(self)
        if epoch_len == 0:  # an elastic resume that left nothing for this layout: go on with the next epoch
            self._next_epoch()
            self.dataset.publish(self._epoch, None)
            epoch_len = len(self)
        mix = self.dataset.mixture
        if (mix is not None and self.num_workers > 0 and getattr(self.dataloader, "_iterator", None) is None
                and not mix.mid_continuation(self._epoch)):
            ds = self.dataset  # the epoch's start cursors, computed once here: the workers inherit them
            mix.epoch_start(rank=ds.rank, slots=ds.world_size * self._workers, workers=self._workers,
                            epoch=self._epoch, batch_size=self.batch_size, seed=ds.seed, shuffle=ds.shuffle,
                            shuffle_buffer=ds.shuffle_buffer)
        for batch in self.dataloader:
            meta = batch.pop(META_KEY)
            self._note(meta)
            if self._batches >= epoch_len:
                self._next_epoch()
            yield batch

    def _note(self, meta: torch.Tensor) -> None:
        last = [int(v) for v in meta[-1]]
        worker, epoch = last[0], last[1]
        if epoch != self._epoch:
            raise RuntimeError(f"a batch of epoch {epoch} arrived in epoch {self._epoch}; this is a wdspack bug")
        self._positions[worker] = (last[2], last[3], last[4])
        self._stats_live[worker] = Counter(dict(zip(self.dataset.stat_keys, last[5:])))
        self._batches += 1

    def _next_epoch(self) -> None:
        self._epoch += 1
        self._batches, self._resume = 0, False
        self._positions = [(0, 0, 0)] * self._workers

    def _fold_stats(self) -> None:
        for c in self._stats_live.values():
            self._stats_base.update(c)
        self._stats_live = {}

    # -- checkpoints ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """A small JSON-able dict: epoch, batches consumed in it, each worker's position, counters, config.

        After an elastic resume, until that epoch ends, it also holds the layout the epoch came from.
        """
        at = LoaderPosition(epoch=self._epoch, batches=self._batches, workers=tuple(self._positions),
                            resume=self._resume, stats=self.stats)
        return save_state(self.dataset, at, batch_size=self.batch_size, num_workers=self.num_workers).to_json()

    def load_state_dict(self, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Continue from ``state`` at the next iteration; refuses a state from another setup.

        The state of a run with other ranks or workers resumes **elastically**: the rest of the
        saved epoch (every pack it has not read yet) is split over this layout, and later epochs
        follow this layout. Pass the states of *all* the saved ranks (a list, any order) for an
        exact rest; one state alone also works when no pack was skipped as corrupt (every rank
        consumed the same batches, so the others' positions follow from this one's).

        A mixture resumes under another number of workers from this rank's state (its cursor per
        source), and under another number of ranks from *all* the saved ranks' states: each source's
        unfinished passes continue as their rest (the packs no saved rank consumed) split over the new
        ranks, then the following passes as usual, nothing within a pass read twice or skipped, and
        the saved ranks' batches left shared out evenly (``MixedSources.elastic_continuation``). One state
        alone is refused there unless the others follow from it (no continuation began and no pack was
        skipped).
        """
        states = [state] if isinstance(state, Mapping) else list(state)
        if not states:
            raise ConfigError("load_state_dict got an empty list of states")
        saved = [LoaderState.from_json(s) for s in states]
        at = restore(self.dataset, saved, batch_size=self.batch_size, num_workers=self.num_workers,
                     started=getattr(self.dataloader, "_iterator", None) is not None)
        self._epoch, self._batches, self._resume = at.epoch, at.batches, at.resume
        self._positions = list(at.workers)
        self._stats_base, self._stats_live = Counter(at.stats), {}
