"""A mixture of packed datasets read as one stream, in data-flow order:

* :mod:`.spec` — the mixture: its sources and weights, compatibility, one mixture epoch
* :mod:`.streams` — one source's stream on a rank, its blocks, and where a rank stands in it
* :mod:`.merge` — the merge of the sources' streams: each slot's packs of an epoch
* :mod:`.cursors` — the rank's cursors at any point of the merge, as JSON
* :mod:`.rest` — the rest of the passes after an elastic resume
* :mod:`.continuation` — where the stream goes on from after a resume under another mixture or layout
* :mod:`.sources` — the sources opened and each slot's schedule planned (:class:`~.sources.MixedSources`)
* :mod:`.read` — a slot's packs read in the schedule's order

The pure parts (spec to rest) see integers only; only :mod:`.sources` and :mod:`.read` open data.
"""

from .merge import SlotSchedule, plan_slot
from .spec import Mixture, MixtureEpoch, MixtureSource, check_compatible, is_mixture_spec, mixture_epoch
from .streams import SourceCursor

__all__ = ["Mixture", "MixtureEpoch", "MixtureSource", "SlotSchedule", "SourceCursor", "check_compatible",
           "is_mixture_spec", "mixture_epoch", "plan_slot"]
