"""CONSUME: stream packed shards back as fixed-shape training batches.

:class:`PackedDataset` yields one fixed-shape example per pack; :func:`make_loader` wraps it
in a resumable DataLoader (:class:`PackedLoader`). The modules, in data-flow order:

* :mod:`wdspack.format.dataset` — the source → shard URLs and pack counts (main process, once;
  never lists remote folders)
* :mod:`.plan` — the split of packs over ``(rank, worker)`` slots and the shuffle order (pure
  functions); :mod:`.balance` — the same split dealt by cost (``balance="cost"``)
* :mod:`.mixture` — a mixture of packed datasets (one folder): :mod:`.mixture.spec` — its record,
  compatibility and epoch; :mod:`.mixture.streams` — one source's stream on a rank and its cursor;
  :mod:`.mixture.merge` — each slot's packs of a mixture epoch; :mod:`.mixture.cursors` — the rank's
  cursors at any point, as JSON; :mod:`.mixture.rest` — the rest of the passes after an elastic resume
  (pure functions, all five); :mod:`.mixture.continuation` — where a resumed stream goes on from;
  :mod:`.mixture.sources` — the sources opened, each slot's schedule; :mod:`.mixture.read` — a slot's
  packs read in the schedule's order
* :mod:`wdspack.storage` — sequential, retrying byte streams (local, HTTP(S), Hub, fsspec stores)
* :mod:`.stages` — the generator stages: tar members → packs → shuffle buffer → decoded packs
* :mod:`.batch` — a pack becomes a batch (the batch contract, one folder): :mod:`.batch.budgets` — the
  budgets and pixels a dataset asks for; :mod:`.batch.collate` — packs → fixed-shape tensors;
  :mod:`.batch.text` — the text keys in one pass; :mod:`.batch.images` — image bytes → pixels;
  :mod:`.batch.model` — a model processor's keys; :mod:`.batch.buffers` — the staged pixels and the
  shared memory a batch travels in; :mod:`.batch.collate_fn` — the DataLoader's ``collate_fn`` and its
  batch options; :mod:`.batch.packed_with` — the processor checked against the dataset's at build time
* :mod:`.options` — the grouped options (:class:`ReadOptions`, :class:`Balance`)
* :mod:`.dataset` — :class:`PackedDataset`;  :mod:`.dataloader` — :func:`make_loader`; :mod:`.elastic` —
  resuming under another layout
* :mod:`.wds` — the same batches as stages of a ``webdataset`` pipeline you already have

It reads through :mod:`wdspack.format` and :mod:`wdspack.storage`, and never imports the packer.
"""

from ..format.dataset import ResolvedSource, ShardRef, resolve_source
from ..storage.urls import expand_braces
from .dataloader import PackedLoader, make_loader
from .dataset import STAT_KEYS, PackedDataset
from .mixture.merge import SlotSchedule, plan_slot
from .mixture.spec import Mixture, MixtureEpoch, MixtureSource, check_compatible, is_mixture_spec, mixture_epoch
from .mixture.streams import SourceCursor
from .options import Balance, ReadOptions
from .plan import EpochPlan, PackRange, plan_epoch, shuffle_order

__all__ = [
    "Balance",
    "EpochPlan",
    "Mixture",
    "MixtureEpoch",
    "MixtureSource",
    "PackRange",
    "PackedDataset",
    "PackedLoader",
    "ReadOptions",
    "ResolvedSource",
    "STAT_KEYS",
    "ShardRef",
    "SlotSchedule",
    "SourceCursor",
    "check_compatible",
    "expand_braces",
    "is_mixture_spec",
    "make_loader",
    "mixture_epoch",
    "plan_epoch",
    "plan_slot",
    "resolve_source",
    "shuffle_order",
]
