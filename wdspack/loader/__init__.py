"""CONSUME: stream packed shards back as fixed-shape training batches.

    make_loader ─► PackedLoader (dataloader; its state: resume, elastic)
                     └─ DataLoader over PackedDataset (dataset) ─ one (rank, worker) slot each
                          plan / balance ─► the slot's packs      mixture/ ─► a mixture's schedule
                          read: rounds of packs ─► stages (tar members → packs → shuffle → decode)
                          batch/ ─► fixed-shape tensors (the batch contract)

The modules: :mod:`.plan` — packs split over slots, the shuffle order; :mod:`.balance` — the same
dealt by cost; :mod:`.options` — ReadOptions, Balance; :mod:`.stages` — the generator stages;
:mod:`.read` — the one read loop of a slot (one dataset: its laps; a mixture: its schedules); :mod:`.stats` — the
slot's counters, its corrupt-pack handler and load-time drops;
:mod:`.dataset` — PackedDataset; :mod:`.dataloader` — make_loader, PackedLoader; :mod:`.resume` —
the loader's state and its kinds of restore; :mod:`.elastic` — a layout's rest after an elastic
resume; :mod:`.wds` — the same batches as webdataset stages. :mod:`.mixture` — :mod:`.mixture.spec`,
:mod:`.mixture.streams`, :mod:`.mixture.merge`, :mod:`.mixture.cursors`, :mod:`.mixture.rest`,
:mod:`.mixture.continuation`, :mod:`.mixture.sources`, :mod:`.mixture.read`. :mod:`.batch` —
:mod:`.batch.budgets`, :mod:`.batch.collate`, :mod:`.batch.text`,
:mod:`.batch.model`, :mod:`.batch.buffers`, :mod:`.batch.collate_fn`, :mod:`.batch.packed_with`.
It reads through :mod:`wdspack.format` and :mod:`wdspack.storage` and never imports the packer
(docs/architecture.md tells why each piece is as it is).
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
