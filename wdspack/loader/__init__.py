"""CONSUME: stream packed shards back as fixed-shape training batches.

:class:`PackedDataset` yields one fixed-shape example per pack; :func:`make_loader` wraps it
in a resumable DataLoader (:class:`PackedLoader`). The modules, in data-flow order:

* :mod:`wdspack.format.dataset` — the source → shard URLs and pack counts (main process, once;
  never lists remote folders); :mod:`.budgets` — the budgets and pixels a dataset asks for
* :mod:`.plan` — the split of packs over ``(rank, worker)`` slots and the shuffle order (pure
  functions); :mod:`.balance` — the same split dealt by cost (``balance="cost"``)
* :mod:`.mixture` — a mixture of packed datasets: its record, compatibility and epoch;
  :mod:`.schedule` — each slot's packs of a mixture epoch (pure functions)
* :mod:`wdspack.storage` — sequential, retrying byte streams (local, HTTP(S), Hub, fsspec stores)
* :mod:`.stages` — the generator stages: tar members → packs → shuffle buffer → decoded packs
* :mod:`.collate` — packs → fixed-shape tensors (the batch contract); :mod:`.images` — image bytes
  → pixels; :mod:`.batching` — a model processor's keys; :mod:`.buffers` — the staged pixels and
  the shared memory a batch travels in
* :mod:`.options` — the grouped options (:class:`ReadOptions`, :class:`Balance`)
* :mod:`.dataset` — :class:`PackedDataset`;  :mod:`.dataloader` — :func:`make_loader`;
  :mod:`.loader_collate` — its ``collate_fn`` and the batch options that take; :mod:`.elastic` — resuming
  under another layout
* :mod:`.wds` — the same batches as stages of a ``webdataset`` pipeline you already have

It reads through :mod:`wdspack.format` and :mod:`wdspack.storage`, and never imports the packer.
"""

from ..format.dataset import ResolvedSource, ShardRef, resolve_source
from ..storage.urls import expand_braces
from .dataloader import PackedLoader, make_loader
from .dataset import STAT_KEYS, PackedDataset
from .mixture import Mixture, MixtureEpoch, MixtureSource, check_compatible, is_mixture_spec, mixture_epoch
from .options import Balance, ReadOptions
from .plan import EpochPlan, PackRange, plan_epoch, shuffle_order
from .schedule import SlotSchedule, SourceCursor, plan_slot

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
