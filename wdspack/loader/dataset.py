"""``PackedDataset``: one fixed-shape example per pack, streamed from tar shards.

    plan_epoch (or plan_epoch_balanced) ─► the slot's rounds ─► read.read_slot ─► example
      one dataset: lap 0, lap 1 (only to make up for drop/wrap/skips) ...; a mixture: mixture.read

Holds: a slot's stream is a pure function of ``(manifest, seed, epoch, slot)``, so its position
``(lap, emitted, yielded)`` is a complete checkpoint (restoring it rebuilds the shuffle buffer from
the bytes); another layout resumes elastically (:mod:`.elastic`); under the loader the built-in
image transform runs only its first half here (decode and resize to uint8), the collate function
normalises. docs/architecture.md#the-dataset tells more.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..errors import ConfigError, WdspackError
from ..format.dataset import ResolvedSource, read_pack_index, resolve_source
from ..format.pack import pad_samples
from ..format.tar import Handler
from ..storage.streams import open_stream
from ..storage.urls import is_remote
from .balance import RUNS, TARGET_WAITING, choose_run, plan_epoch_balanced, waiting
from .batch.budgets import check_pixels, cp_padding_note, dataset_budgets, media_token_budgets
from .batch.collate import META_KEY
from .elastic import SharedBasis, consumed_packs
from .mixture.read import slot_rounds
from .mixture.sources import MixedSources
from .mixture.spec import Mixture, default_name, is_mixture_spec
from .options import Balance, ReadOptions
from .plan import REMAINDER_POLICIES, EpochPlan, plan_epoch, plan_remainder, slot_order
from .read import Round, read_slot
from .stages import lap_source, reorder
from .stats import LOAD_DROP_REASONS, STAT_KEYS, dropped_key, make_handler, make_on_drop, report_stats

__all__ = ["LOAD_DROP_REASONS", "PackedDataset", "STAT_KEYS", "dropped_key", "report_stats"]

logger = logging.getLogger(__name__)

#: Private per-example key that carries a slot's position to :class:`~wdspack.loader.PackedLoader`.
_META_HEAD = ("worker", "epoch", "lap", "emitted", "yielded")
MAX_WORKERS = 256
_HEAD = 3  # epoch, has_resume, shift; then (lap, emitted, yielded) per worker
_CONTROL = _HEAD + 3 * MAX_WORKERS
ON_CORRUPT = ("skip", "raise")


class PackedDataset(IterableDataset):
    """Stream a packed dataset as fixed-shape examples (:func:`~.batch.collate.pack_to_example`), one per pack.

    Args:
        source: a dataset folder, a ``manifest.json`` path or URL, an ``https://`` dataset root,
            ``hf://datasets/ORG/NAME@REV[/path]``, or shards (a list, a local glob, a brace pattern);
            see :mod:`wdspack.format.dataset`. Or a mixture of such datasets (DESIGN.md section 8): a
            :class:`~wdspack.loader.Mixture`, a mixture file (``.yaml``/``.yml``/``.json`` with
            ``sources``) or a list of ``(path, weight)``; see :mod:`.mixture`. Its examples carry
            ``source_idx`` (the index in :attr:`source_names`); its image slots are the largest source's.
        seq_len: tokens per example; default the manifest's. A different value raises :class:`ConfigError`.
        max_images: image slots per example (``M``); default the manifest's ``max_images``, or for a
            dataset packed without an image limit the images of its fullest pack. More slots than
            that are allowed (they stay empty: one static shape across datasets); fewer raise
            :class:`ConfigError`.
        pad_token_id: default the manifest tokenizer's; needed only for shards without a manifest.
        shuffle: shuffle shard order per epoch and packs through a buffer (both seeded).
        seed: the shuffling seed (the same on every rank).
        shuffle_buffer: packs held by the shuffle buffer per worker (memory: that many packs).
        rank, world_size: default from ``torch.distributed`` when initialised, else 0 and 1.
        remainder: ``"drop"`` or ``"wrap"``: how ranks are evened out (see :mod:`wdspack.loader.plan`).
        on_corrupt: ``"skip"`` (count, warn, go on) or ``"raise"`` for corrupt packs, truncated shards and
            sub-samples whose image or video does not decode (skipped: dropped from their pack, whose other
            sub-samples are served; ``stats["dropped_samples"]``).
        image_transform: bytes → tensors (``wdspack.media.image.pixels.make_image_transform``); picklable.
            Without it (or ``processor``) an image dataset streams no pixels: the loader warns once,
            and refuses a dataset packed with a processor (its batches are useless without them).
        text_only: stream an image dataset's text without pixels on purpose (no warning, no
            refusal); ``input_ids`` keep the image tokens, ``image_mask`` / ``image_sample_idx`` say
            where the images were.
        processor: the model's processor (an object, a folder or a cached model name): examples then
            carry what the model's ``forward`` takes, in the processor's pixel layout, padded to static
            shapes (see :mod:`wdspack.models`; feed a batch with :func:`wdspack.model_inputs`). Use the
            processor the dataset was packed with (``wdspack pack --processor``).
        expect_tokenizer: the tokenizer the training uses: a name, or a dict like the manifest's
            ``tokenizer`` entry (only its keys are compared); a mismatch raises :class:`ConfigError`.
        read: how shards are read: a :class:`~wdspack.ReadOptions` or a dict of its fields (block
            size, retries and back-off, the network ``timeout``, ``storage_options``); default ``ReadOptions()``.
        batch_size: each slot yields a multiple of it, so a DataLoader with this batch size gives
            every rank the same number of full batches (:func:`make_loader` sets it).
        balance: ``"cost"`` (or a :class:`~wdspack.Balance`, or a dict of its fields: cost model,
            heaviest first, window, run) deals each step's packs so every rank's share costs about the
            same (see :func:`~wdspack.loader.balance.plan_epoch_balanced`); it reads the dataset's pack
            index (one request). Replaces the shuffle buffer's order (the window and run order are still
            seeded). None: the shuffle buffer's order.

    Example:
        >>> ds = PackedDataset("hf://datasets/my-org/llava-packed@main", seed=1)  # doctest: +SKIP
        >>> next(iter(ds))["input_ids"].shape  # doctest: +SKIP
        torch.Size([4096])
    """

    def __init__(self, source: str | os.PathLike[str] | Sequence[Any] | Mixture, *, seq_len: int | None = None,
                 max_images: int | None = None, pad_token_id: int | None = None, shuffle: bool = True,
                 seed: int = 0, shuffle_buffer: int = 256, rank: int | None = None, world_size: int | None = None,
                 remainder: str = "drop", on_corrupt: str = "skip",
                 image_transform: Callable[[Sequence[bytes]], dict[str, torch.Tensor]] | None = None,
                 expect_tokenizer: str | Mapping[str, Any] | None = None, batch_size: int = 1,
                 read: ReadOptions | Mapping[str, Any] | None = None, processor: Any = None,
                 balance: str | Balance | Mapping[str, Any] | None = None, text_only: bool = False) -> None:
        super().__init__()
        if remainder not in REMAINDER_POLICIES:
            raise ConfigError(f"remainder={remainder!r} is not one of {REMAINDER_POLICIES}")
        if on_corrupt not in ON_CORRUPT:
            raise ConfigError(f"on_corrupt={on_corrupt!r} is not one of {ON_CORRUPT}")
        if shuffle_buffer < 1 or batch_size < 1:
            raise ConfigError(f"shuffle_buffer ({shuffle_buffer}) and batch_size ({batch_size}) must be >= 1")
        self.read = ReadOptions.of(read)
        self._read: dict[str, Any] = self.read.stream_kwargs()
        self.mixture: MixedSources | None = None
        if is_mixture_spec(source):  # many datasets with weights: read through .mixture
            self.mixture = MixedSources.open(source, read=self.read, seq_len=seq_len, max_images=max_images,
                                             pad_token_id=pad_token_id)
            self._source: ResolvedSource = self.mixture.combined
            self.seq_len, self.max_images, self.pad_token_id = (self.mixture.seq_len, self.mixture.max_images,
                                                                self.mixture.pad_token_id)
        else:
            assert not isinstance(source, Mixture)  # is_mixture_spec says so
            self._source = resolve_source(source, storage_options=self.read.storage_options, **self._read)
            self.seq_len, self.max_images, self.pad_token_id = dataset_budgets(self._source, seq_len, max_images,
                                                                               pad_token_id, read=self._read)
        if expect_tokenizer is not None:
            check_tokenizer(self._source, expect_tokenizer)
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        self.shuffle, self.seed, self.shuffle_buffer = bool(shuffle), int(seed), int(shuffle_buffer)
        self.remainder, self.on_corrupt, self.batch_size = remainder, on_corrupt, int(batch_size)
        self.image_transform = image_transform
        m = self.manifest  # shards without one: their images are unknown, so only text_only's conflicts are checked
        check_pixels(self._source.display, m.image_policy if m is not None else {},
                     sum(s.images for s in m.shards) if m is not None else 0,
                     processor=processor, image_transform=image_transform, text_only=text_only)
        self.model_batcher = self._model_batcher(processor)
        #: the CP degree the packs were planned for (``wdspack pack --cp``): each sub-sample is padded to a
        #: multiple of ``2·cp`` as it loads, so the batch's segments split with no more padding (None: as stored)
        self.cp: int | None = m.cp if m is not None else None
        if self.cp and m is not None:
            logger.info(cp_padding_note(self._source.display, cp=self.cp, padding=int(m.totals.get("cp_padding") or 0),
                                        packs=m.num_packs, seq_len=self.seq_len))
        self._costs: list[np.ndarray] | None = None  # per shard, the packs' costs (balance="cost")
        self._offsets: list[np.ndarray] | None = None  # per shard, the packs' byte offsets (from the pack index)
        self._balance(Balance.of(balance))
        self.with_position = False  # PackedLoader turns it on: each example carries META_KEY
        self._control = torch.zeros(_CONTROL, dtype=torch.int64).share_memory_()
        self._stats_done: Counter = Counter()
        self._stats_live: Counter = Counter()
        self._progress: dict[int, tuple[int, int, int]] = {}
        self._elastic = SharedBasis()
        self._plans: dict[tuple[int, int, str], EpochPlan] = {}  # the last balanced or elastic plan
        self.packs_per_slot(1, 0)  # fail now, not in a worker, when there are too few packs for the ranks

    # -- what it holds --------------------------------------------------------------------------

    @property
    def manifest(self):
        """The dataset's :class:`~wdspack.format.manifest.Manifest` (None for shards without one)."""
        return self._source.manifest

    @property
    def source(self) -> ResolvedSource:
        """The resolved source: its shards (URL, packs), manifest, headers (a mixture: its sources combined)."""
        return self._source

    @property
    def shards(self) -> tuple[str, ...]:
        return tuple(s.url for s in self._source.shards)

    @property
    def num_packs(self) -> int:
        return sum(s.packs for s in self._source.shards)

    @property
    def source_names(self) -> tuple[str, ...]:
        """The sources' names, indexed by each batch's ``source_idx`` (one dataset: one name)."""
        return self.mixture.names if self.mixture is not None else (default_name(self._source.display),)

    @property
    def epoch(self) -> int:
        return int(self._control[0])

    @property
    def stats(self) -> dict[str, int]:
        """Counters of this process's iterations: skipped packs / shards, dropped samples, ignored members,
        retries, bytes; and, for each source and reason with a dropped sample, :func:`dropped_key`'s count.

        With DataLoader workers the counting happens in the workers: read ``loader.stats``.
        """
        return report_stats(self._stats_done + self._stats_live)

    @property
    def stat_keys(self) -> tuple[str, ...]:
        """The counters a slot reports with each example: :data:`STAT_KEYS`, then per source and reason
        the sub-samples dropped (:func:`dropped_key`)."""
        return STAT_KEYS + tuple(dropped_key(name, reason) for name in self.source_names
                                 for reason in LOAD_DROP_REASONS)

    def packs_per_slot(self, workers: int = 1, epoch: int | None = None) -> int:
        """Packs each ``(rank, worker)`` slot yields per epoch (the same for every slot)."""
        epoch = self.epoch if epoch is None else epoch
        if self.mixture is not None:
            return self.mixture.per_slot(self.world_size * workers, self.batch_size, epoch)
        elastic = self.elastic()
        if elastic is not None and elastic["epoch"] == epoch:
            return self._plan(workers, epoch).per_slot
        return self._count_plan(workers, epoch).per_slot

    # -- elastic resume ---------------------------------------------------------------------------

    def elastic(self) -> dict[str, Any] | None:
        """``{"epoch", "basis"}`` when the current epoch was resumed under another layout, else None."""
        return self._elastic.get()

    def set_elastic(self, elastic: Mapping[str, Any] | None) -> None:
        """Make the rest of ``elastic["epoch"]`` the packs its ``basis`` left unread, split over this layout.

        ``basis`` is ``{"world_size", "num_workers", "ranks": [[[lap, emitted, yielded] per worker]
        per rank], "basis": the basis before it or None}``: where every slot of the old layout
        stood. Workers (persistent ones too) read it from shared memory.
        """
        self._elastic.set(elastic)

    def consumed(self, epoch: int, basis: Mapping[str, Any]) -> list[np.ndarray]:
        """Per shard, the packs of ``epoch`` that the layout in ``basis`` has read, or never reads."""
        return consumed_packs(epoch, basis, counts=[s.packs for s in self._source.shards],
                              layout_plan=self.layout_plan, seed=self.seed, shuffle=self.shuffle,
                              shuffle_buffer=self.shuffle_buffer)

    def layout_plan(self, world: int, workers: int, epoch: int, prior: list[np.ndarray] | None) -> EpochPlan:
        """The plan of ``epoch`` under ``world`` ranks × ``workers``; of its rest when ``prior`` (per shard,
        the packs already read) is given."""
        counts = [s.packs for s in self._source.shards]
        if prior is not None:
            return plan_remainder(counts, prior, slots=world * workers, epoch=epoch, seed=self.seed,
                                  shuffle=self.shuffle, remainder=self.remainder, batch_size=self.batch_size)
        if self.balance is not None:
            assert self._costs is not None  # read with the balance (_balance)
            return plan_epoch_balanced(counts, self._costs, ranks=world, workers=workers, epoch=epoch,
                                       seed=self.seed, shuffle=self.shuffle, remainder=self.remainder,
                                       batch_size=self.batch_size, window=self.balance_window,
                                       run=self.balance_run(world, workers), heaviest_first=self.balance.heaviest_first)
        return plan_epoch(counts, slots=world * workers, epoch=epoch, seed=self.seed, shuffle=self.shuffle,
                          remainder=self.remainder, batch_size=self.batch_size)

    def pack_costs(self) -> list[np.ndarray] | None:
        """Each shard's pack costs under the cost model (``balance="cost"``), else None."""
        return self._costs

    def __repr__(self) -> str:
        return (f"PackedDataset({self._source.display!r}, shards={len(self._source.shards)}, packs={self.num_packs}, "
                f"seq_len={self.seq_len}, max_images={self.max_images}, shuffle={self.shuffle}, seed={self.seed}, "
                f"rank={self.rank}/{self.world_size}, remainder={self.remainder!r}, on_corrupt={self.on_corrupt!r})")

    # -- epochs and checkpoints -----------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` at its beginning on the next iteration (changes the shuffle)."""
        self.publish(epoch, None)

    def state_dict(self) -> dict[str, Any]:
        """Position of iteration in this process (no DataLoader workers); use ``loader.state_dict()`` with workers."""
        return {"epoch": self.epoch, "workers": [list(self._progress.get(0, (0, 0, 0)))]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume in-process iteration at ``state`` (from :meth:`state_dict`)."""
        self.publish(int(state["epoch"]), [tuple(w) for w in state["workers"]])

    def publish(self, epoch: int, positions: Sequence[tuple[int, ...]] | None, shift: int = 0) -> None:
        """Write what the next iteration starts from; workers (even persistent ones) read it then.

        ``shift`` rotates worker roles: DataLoader worker ``i`` plays worker ``(i + shift) % n``, so
        a fresh DataLoader, whose round robin always starts at worker 0, continues with the worker
        whose turn it was when the state was saved.
        """
        if positions is not None and len(positions) > MAX_WORKERS:
            raise ConfigError(f"{len(positions)} workers > {MAX_WORKERS}")
        self._control.zero_()
        self._control[0] = int(epoch)
        self._control[2] = int(shift)
        if positions is not None:
            self._control[1] = 1
            flat = torch.tensor([v for p in positions for v in p], dtype=torch.int64)
            self._control[_HEAD:_HEAD + flat.numel()] = flat
        self._progress = {}

    def _resume_point(self, worker: int) -> tuple[int, int, int]:
        if int(self._control[1]) == 0:
            return (0, 0, 0)
        lap, emitted, yielded = (int(v) for v in self._control[_HEAD + 3 * worker:_HEAD + 3 * worker + 3])
        return lap, emitted, yielded

    # -- iteration ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        worker = (worker + int(self._control[2])) % workers
        epoch = self.epoch
        slot = self.rank * workers + worker
        stats: Counter = Counter()
        if info is None:
            self._stats_done += self._stats_live
            self._stats_live = stats
        start = self._resume_point(worker)
        if info is None:
            self.load_offsets_if_split(1)
        handler = make_handler(self.on_corrupt, stats)
        yielded, per_slot, rounds = self._slot_rounds(slot=slot, slots=self.world_size * workers, workers=workers,
                                                      epoch=epoch, position=start, stats=stats, handler=handler)
        examples = read_slot(rounds, yielded=yielded, per_slot=per_slot, seq_len=self.seq_len,
                             max_images=self.max_images, handler=handler, to_example=self._to_example,
                             on_drop=make_on_drop(self.on_corrupt, stats, self.source_names))
        keys = self.stat_keys
        for example, position in examples:
            if info is None:
                self._progress[0] = position
            if self.with_position:
                values = [worker, epoch, *position] + [stats[k] for k in keys]
                example[META_KEY] = torch.tensor(values, dtype=torch.int64)
            yield example

    def _count_plan(self, workers: int, epoch: int) -> EpochPlan:
        return plan_epoch([s.packs for s in self._source.shards], slots=self.world_size * workers, epoch=epoch,
                          seed=self.seed, shuffle=self.shuffle, remainder=self.remainder, batch_size=self.batch_size)

    def _plan(self, workers: int, epoch: int) -> EpochPlan:
        """This layout's plan of ``epoch``: the rest of an elastically resumed epoch, balanced, or by count."""
        elastic = self.elastic()
        basis = elastic["basis"] if elastic is not None and elastic["epoch"] == epoch else None
        if basis is None and self.balance is None:
            return self._count_plan(workers, epoch)  # cheap: not cached
        key = (workers, epoch, json.dumps(basis, sort_keys=True))
        if key not in self._plans:
            done = self.consumed(epoch, basis) if basis is not None else None
            self._plans = {key: self.layout_plan(self.world_size, workers, epoch, done)}
        return self._plans[key]

    def load_offsets_if_split(self, workers: int, epochs: int = 4, *, force: bool = False) -> bool:
        """Read the pack index's offsets when this rank's slots read shards from the middle.

        A shard split between slots is read from the pack where each piece starts: with offsets
        that is one ranged request per piece and no bytes before it; without them the stream
        starts at byte 0 and walks the tar headers to the piece. Checked over the first ``epochs``
        epochs' plans; evenly dividing shards never split, and then nothing more is requested.
        Called by the main process (:class:`~wdspack.loader.PackedLoader`), so workers inherit it.
        """
        if self._offsets is not None or self.manifest is None or not self.manifest.pack_index:
            return self._offsets is not None
        slots = range(self.rank * workers, (self.rank + 1) * workers)
        split = force or any(r.start > 0 for e in range(epochs) for s in slots
                             for r in self._count_plan(workers, e).slots[s])
        if split and any(is_remote(s.url) for s in self._source.shards):
            from ..format.pack_index import COLUMNS

            index = read_pack_index(self._source, **self._read)
            self._offsets = [rows[:, COLUMNS.index("offset")].copy() for rows in index]
        return self._offsets is not None

    def _balance(self, balance: Balance | None) -> None:
        from ..format.pack_index import COLUMNS

        self.balance = balance
        self._runs: dict[tuple[int, int], int] = {}
        self._run_override: int | None = None
        if balance is None:
            return
        if self.balance_window < self.batch_size:
            raise ConfigError(f"the balance window ({self.balance_window} packs) must be >= batch_size "
                              f"({self.batch_size}); pass Balance(window=N) with N >= {self.batch_size}")
        if self.mixture is not None:  # passes dealt to the ranks by cost, each window run in cost bands
            self._balance_mixture(balance)
            return
        index = read_pack_index(self._source, **self._read)
        self._costs = [balance.cost_model.costs(rows) for rows in index]
        self._offsets = [rows[:, COLUMNS.index("offset")].copy() for rows in index]

    def _balance_mixture(self, balance: Balance) -> None:
        """A mixture's balance: its run length, if not given, is 1 where every source is local (requests are
        free), else the longest of :data:`~.balance.RUNS` whose epoch 0 on this many ranks (one worker
        each) keeps :func:`~.balance.waiting` within the target (the shortest when none does)."""
        mix = self.mixture
        assert mix is not None
        kw = dict(window=self.balance_window, heaviest_first=balance.heaviest_first)
        if balance.run is not None or not any(is_remote(s.url) for s in self._source.shards):
            mix.set_balance(balance.cost_model, run=balance.run or 1, **kw)  # type: ignore[arg-type]
            return
        for run in RUNS:
            mix.set_balance(balance.cost_model, run=run, **kw)  # type: ignore[arg-type]
            steps = mix.step_costs(mix.balance[0], ranks=self.world_size, workers=1,  # type: ignore[index]
                                   batch_size=self.batch_size, seed=self.seed, shuffle=self.shuffle,
                                   shuffle_buffer=self.shuffle_buffer)
            if waiting(steps) <= TARGET_WAITING:
                return

    def balance_run(self, world: int, workers: int) -> int:
        """Packs per request under the balance for ``world × workers`` slots: the balance's ``run``, the
        run of a restored state, or :func:`~.balance.choose_run`'s (computed once per layout)."""
        assert self.balance is not None and self._costs is not None
        if self.balance.run is not None or self._run_override is not None:
            return int(self.balance.run or self._run_override)  # type: ignore[arg-type]
        key = (world, workers)
        if key not in self._runs:
            remote = any(is_remote(s.url) for s in self._source.shards)
            self._runs[key] = choose_run([s.packs for s in self._source.shards], self._costs, remote=remote,
                                         ranks=world, workers=workers, batch_size=self.batch_size, seed=self.seed,
                                         shuffle=self.shuffle, remainder=self.remainder, window=self.balance_window,
                                         heaviest_first=self.balance.heaviest_first)
        return self._runs[key]

    def adopt_balance_run(self, run: int) -> None:
        """Resume with the run length a state was saved with (only where this balance chooses its own)."""
        assert self.balance is not None and self.balance.run is None
        self._run_override = int(run)

    @property
    def balance_window(self) -> int:
        """Packs a slot balances at a time: the balance's ``window``, else ``shuffle_buffer``."""
        window = self.balance.window if self.balance is not None else None
        return int(self.shuffle_buffer if window is None else window)

    def _model_batcher(self, processor: Any):
        if processor is None:
            return None
        if self.image_transform is not None:
            raise ConfigError("give processor= or image_transform=, not both: the processor lays out the pixels")
        from .batch.model import ModelBatcher

        totals = self.manifest.totals if self.manifest is not None else {}
        batcher = ModelBatcher(processor, seq_len=self.seq_len, max_images=self.max_images,
                               media_tokens=media_token_budgets(totals))
        policy = self.manifest.image_policy if self.manifest is not None else {}
        packed_for = policy.get("family")
        if packed_for is not None and packed_for != batcher.family.name:
            raise ConfigError(f"{self._source.display} was packed with a {packed_for} processor "
                              f"({policy.get('name')!r}); the loader's processor is {batcher.family.name} "
                              f"({type(batcher.processor).__name__}); load with the processor it was packed with")
        if policy.get("kind") == "fixed":
            logger.warning("%s was packed with a fixed %s tokens per image, not with a processor; the model's "
                           "processor may expect other image tokens (pack with --processor)",
                           self._source.display, policy.get("tokens_per_image"))
        return batcher

    def _to_example(self, pack) -> dict[str, Any]:
        """``pack_to_example``; under the loader, ``buffers.staged_example``: the pixels stay per pack
        for its collate to write straight into the batch (decode errors still surface here, where the
        slot drops a sub-sample whose image or video fails, or skips a bad pack: :mod:`.read`)."""
        from .batch.buffers import MODEL_KEY, staged_example
        from .batch.collate import pack_to_example

        if self.cp:  # planned for CP: the padding the plan counted goes in now (a pack of divisible lengths stays)
            pack = pad_samples(pack, multiple=2 * self.cp, pad_token_id=self.pad_token_id)
        if self.with_position or self.model_batcher is not None:
            example = staged_example(pack, seq_len=self.seq_len, max_images=self.max_images,
                                     pad_token_id=self.pad_token_id, image_transform=self.image_transform,
                                     batcher=self.model_batcher, defer_text=self.with_position)
            if not self.with_position:  # used without the loader: the processor's parts as plain tensors
                _, pixels, rows = example.pop(MODEL_KEY)
                example.update(self.model_batcher.padded(pixels))
                example.update(rows)
            return example
        return pack_to_example(pack, seq_len=self.seq_len, max_images=self.max_images,
                               pad_token_id=self.pad_token_id, image_transform=self.image_transform)

    def _slot_rounds(self, *, slot: int, slots: int, workers: int, epoch: int, position: tuple[int, int, int],
                     stats: Counter, handler: Handler) -> tuple[int, int, Iterator[Round]]:
        """The slot's reading as :func:`~.read.read_slot` takes it, ``(yielded, per_slot, rounds)``: a mixture's
        schedules (:func:`~.mixture.read.slot_rounds`), or this dataset's laps, the one-source case."""
        if self.mixture is not None:
            return slot_rounds(self.mixture, slot=slot, slots=slots, workers=workers, epoch=epoch, position=position,
                               batch_size=self.batch_size, seed=self.seed, shuffle=self.shuffle,
                               shuffle_buffer=self.shuffle_buffer, read=self._read, stats=stats, handler=handler)
        plan = self._plan(workers, epoch)
        return position[2], plan.per_slot, self._laps(plan, slot, epoch, position, stats, handler)

    def _laps(self, plan: EpochPlan, slot: int, epoch: int, position: tuple[int, int, int], stats: Counter,
              handler: Handler) -> Iterator[Round]:
        """One lap of the slot's packs per round, from ``position`` (``(lap, emitted, yielded)``); a lap
        that began fresh and gave nothing means the dataset is damaged."""
        ranges = plan.slots[slot]
        starts = np.cumsum([0] + [len(r) for r in ranges]).tolist()
        size = starts[-1]
        lap, emitted, _ = position
        shards = self._source.shards

        def where(pos: int) -> str:
            i = bisect.bisect_right(starts, pos) - 1
            return f"{shards[ranges[i].shard].url} pack {ranges[i].start + pos - starts[i]}"

        offsets = self._offsets

        def open_shard(index: int, pack: int):
            at = pack if offsets is not None and pack < len(offsets[index]) else 0
            offset = int(offsets[index][at]) if offsets is not None and at else 0
            return open_stream(shards[index].url, offset=offset, headers=self._source.headers, stats=stats,
                               **self._read), at

        while True:
            order = slot_order(plan, slot, seed=self.seed, epoch=epoch, lap=lap, shuffle=self.shuffle,
                               shuffle_buffer=self.shuffle_buffer)
            fresh = emitted == 0
            first = int(order[emitted:].min()) if emitted < size else size
            done = set(order[:emitted].tolist())
            src = lap_source(ranges, first=first, emitted=done, open_shard=open_shard,
                             shard_name=lambda s: shards[s].url, stats=stats, handler=handler)
            def at(k: int, order: np.ndarray = order) -> str:
                return where(int(order[k]))

            def reported(e: int, y: int, lap: int = lap) -> tuple[int, int, int]:
                return lap, e, y

            rnd = Round(emitted, reorder(src, order, start=emitted), at, reported, streams=(src,))
            yield rnd
            if fresh and rnd.got == 0:
                raise WdspackError(f"slot {slot} (rank {self.rank}) read a whole pass over its {size} packs and none "
                                   "was readable (see the warnings above); the dataset is damaged")
            lap, emitted = lap + 1, 0


def check_tokenizer(source: ResolvedSource, expected: str | Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` when the dataset was packed with another tokenizer or chat template."""
    if source.manifest is None:
        raise ConfigError("expect_tokenizer needs a manifest to compare with; these shards have none")
    have = source.manifest.tokenizer
    want = {"name": expected} if isinstance(expected, str) else dict(expected)
    diff = {k: (have[k], v) for k, v in want.items() if k in have and have[k] != v}
    if diff:
        detail = "; ".join(f"{k}: dataset {a!r}, expected {b!r}" for k, (a, b) in diff.items())
        raise ConfigError(f"{source.display} was packed with tokenizer {have.get('name')!r}, the training expects "
                          f"{want.get('name', have.get('name'))!r} ({detail}); re-pack with the training tokenizer "
                          "(`wdspack pack --tokenizer ...`) or fix expect_tokenizer")


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        r, w = dist.get_rank(), dist.get_world_size()
        if rank is not None and world_size is not None and 0 <= rank < world_size < w and w % world_size == 0:
            return int(rank), int(world_size)  # the data-parallel rank of a model-parallel layout (DP × CP)
        if (rank is not None and rank != r) or (world_size is not None and world_size != w):
            raise ConfigError(f"rank={rank}, world_size={world_size} disagree with torch.distributed "
                              f"(rank {r} of {w}); drop the arguments, or pass the data-parallel rank and size "
                              "(a divisor of the world) when ranks also split the model or the sequence")
        return r, w
    r, w = (0 if rank is None else int(rank)), (1 if world_size is None else int(world_size))
    if not 0 <= r < w:
        raise ConfigError(f"rank {r} is not in 0..{w - 1} (world_size {w})")
    return r, w
