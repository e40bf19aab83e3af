"""A slot's counters and what it does with a corrupt pack or a sample that does not decode: count, then warn
(``on_corrupt="skip"``) or raise; ``dataset.stats`` / ``loader.stats`` sum the counters (:func:`report_stats`)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence

from ..errors import FormatError
from ..format.tar import Handler
from ..media import KINDS
from .read import OnDrop

__all__ = ["LOAD_DROP_REASONS", "STAT_KEYS", "dropped_key", "make_handler", "make_on_drop", "report_stats"]

logger = logging.getLogger("wdspack.loader.dataset")  # the name the loader's warnings always had

#: Counters every slot keeps; ``dataset.stats`` / ``loader.stats`` sum them. ``dropped_samples``: sub-samples dropped
#: from their pack at load time (a medium of any kind that does not decode), also counted per source and reason
#: (:func:`dropped_key`).
STAT_KEYS = ("corrupt_packs", "dropped_samples", "truncated_shards", "ignored_members", "retries", "requests",
             "bytes_read")
#: Why a sub-sample is dropped at load time, each kind's in turn: the pack job's names for the same failures
#: (``DROP_REASONS``).
LOAD_DROP_REASONS = tuple(reason for kind in KINDS for reason in kind.load_drop_reasons)


def make_handler(on_corrupt: str, stats: Counter) -> Handler:
    """The stages' error handler: count ``kind``, then warn (``"skip"``) or raise (``"raise"``)."""

    def handler(kind: str, error: Exception) -> None:
        stats[kind] += 1
        if on_corrupt == "raise":
            raise error
        logger.warning("%s; skipped (%s: %d so far; on_corrupt='raise' stops instead)", error, kind, stats[kind])

    return handler


def make_on_drop(on_corrupt: str, stats: Counter, names: Sequence[str]) -> OnDrop:
    """What a slot does with a sub-sample whose medium (of any kind) does not decode: count it (``dropped_samples``,
    and per source and reason), then warn in one line and let the pack's other sub-samples train (``"skip"``),
    or raise (``"raise"``)."""

    def on_drop(where: str, source: int, sample_id: str, reason: str, error: Exception) -> None:
        stats["dropped_samples"] += 1
        stats[dropped_key(names[source], reason)] += 1
        if on_corrupt == "raise":
            raise FormatError(f"{where}: {type(error).__name__}: {error}")
        named = str(error) if str(error).startswith(f"sample {sample_id!r}") else f"sample {sample_id!r}: {error}"
        logger.warning("%s: %s; dropped from its pack (%s), whose other samples train (dropped_samples: %d so far; "
                       "on_corrupt='raise' stops instead)", where, named, reason, stats["dropped_samples"])

    return on_drop


def dropped_key(source: str, reason: str) -> str:
    """The stats key counting the sub-samples of ``source`` dropped at load time for ``reason``.

    Example:
        >>> dropped_key("llava", "unreadable_video")
        'dropped_samples/llava/unreadable_video'
    """
    return f"dropped_samples/{source}/{reason}"


def report_stats(total: Mapping[str, int]) -> dict[str, int]:
    """Summed counters as ``stats`` reports them: every :data:`STAT_KEYS` entry, then each non-zero
    :func:`dropped_key` count."""
    report = {k: int(total.get(k, 0)) for k in STAT_KEYS}
    report.update({k: int(v) for k, v in sorted(total.items()) if k.startswith("dropped_samples/") and v})
    return report
