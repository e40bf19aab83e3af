"""What a pack job is asked to do (:class:`PackConfig`) and what it did (:class:`PackSummary`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import ConfigError
from .executors import EXECUTORS
from .planner import ALGORITHMS

__all__ = ["DEFAULT_MAX_DROP_FRACTION", "PackConfig", "PackSummary", "RunOptions"]

#: A job that drops more than this fraction of the samples it read fails (after writing dropped.jsonl).
DEFAULT_MAX_DROP_FRACTION = 0.05


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Where a pack job's tasks run, and whether it may go on after its drops.

    None of it changes the output bytes, so a job may be resumed under other values (a job stopped
    by the drop tolerance resumes with a higher ``max_drop_fraction``, its tokenized samples kept).

    Attributes:
        workers: processes (``"local"``) or concurrent tasks (``"ray"``), >= 1.
        executor: ``"local"`` (a process pool on this machine) or ``"ray"``.
        ray_address: the Ray cluster to join (``executor="ray"`` only); None: start or find one.
        max_drop_fraction: the job fails, after writing ``dropped.jsonl`` and before planning, when
            it drops more than this fraction of the samples it read (``1`` or ``None``: any); a job
            that would pack nothing always fails. Resume it with a higher value to accept the drops.

    Example:
        >>> RunOptions(workers=4).executor
        'local'
    """

    workers: int = 1
    executor: str = "local"
    ray_address: str | None = None
    max_drop_fraction: float | None = DEFAULT_MAX_DROP_FRACTION

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.workers}")
        if self.executor not in EXECUTORS:
            raise ConfigError(f"unknown --executor {self.executor!r}; choose one of {', '.join(EXECUTORS)}")
        if self.ray_address is not None and self.executor != "ray":
            raise ConfigError("--ray-address needs --executor ray")
        if self.max_drop_fraction is not None and not 0 <= self.max_drop_fraction <= 1:
            raise ConfigError(f"--max-drop-fraction must be in [0, 1] (0.05 = 5 %; 1 accepts any drops), "
                              f"got {self.max_drop_fraction}")


@dataclass(frozen=True, slots=True)
class PackConfig:
    """How to plan and write (everything but the tokenizer, which is :class:`~.samples.SampleConfig`).

    Every field but ``run`` decides the output bytes (and a resumed job must keep them); ``run``
    (:class:`RunOptions`) says where the tasks run and may change between runs of one job.

    ``plan_group_partitions`` (None: one global plan, the default) plans groups of that many
    consecutive partitions in tasks of the executor, each writing its own shards, so the driver
    holds no per-sample state (:mod:`~wdspack.packer.partitioned`): for jobs whose ids do not fit
    one process (``DRIVER_BYTES_PER_SAMPLE`` + the id per sample in the global plan). Fill stays
    within 0.1 % of the global plan for groups of 100 k samples or more
    (``tests/packer/test_partitioned.py``); the shards are named by group, so the bytes differ from the
    global plan's.

    Example:
        >>> PackConfig(seq_len=4096, max_images=16, run=RunOptions(workers=4)).run.workers
        4
    """

    seq_len: int
    max_images: int | None = None
    algorithm: str = "bfd"
    seed: int = 0
    shard_max_bytes: int = 512 * 10**6
    shard_max_packs: int | None = None
    on_error: str = "skip"
    split: str = "train"
    records_per_partition: int = 1000
    plan_group_partitions: int | None = None
    run: RunOptions = field(default_factory=RunOptions)

    def __post_init__(self) -> None:
        if self.seq_len <= 0:
            raise ConfigError(f"seq_len must be positive, got {self.seq_len}")
        if self.max_images is not None and self.max_images < 0:
            raise ConfigError(f"max_images must be >= 0, got {self.max_images}")
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"unknown --algorithm {self.algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
        if self.on_error not in ("skip", "raise"):
            raise ConfigError(f"--on-error must be 'skip' or 'raise', got {self.on_error!r}")
        if self.shard_max_bytes <= 0 or (self.shard_max_packs is not None and self.shard_max_packs <= 0):
            raise ConfigError("shard size limits must be positive")
        if self.plan_group_partitions is not None and self.plan_group_partitions < 1:
            raise ConfigError(f"plan_group_partitions must be >= 1 (or None: one global plan), "
                              f"got {self.plan_group_partitions}")
        if self.records_per_partition < 1:
            raise ConfigError(f"records_per_partition must be >= 1, got {self.records_per_partition}")
        if not isinstance(self.run, RunOptions):
            raise ConfigError(f"run={self.run!r}: pass a wdspack.RunOptions (workers, executor, ray_address, "
                              "max_drop_fraction)")

    def output_fields(self) -> dict[str, Any]:
        """The fields that decide the output (for resume fingerprints): all but ``run``."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "run"}
        if out["plan_group_partitions"] is None:  # the global plan: fingerprints as before the field
            del out["plan_group_partitions"]
        return out


@dataclass(frozen=True, slots=True)
class PackSummary:
    """What a pack job did; :meth:`lines` is what the CLI prints."""

    output: str
    samples_read: int
    samples_packed: int
    dropped_by_reason: dict[str, int]
    packs: int
    tokens: int
    images: int
    fill_ratio: float
    shards: int
    bytes: int
    seconds: float
    resumed_shards: int = 0
    #: how image tokens were counted (the manifest's ``image_policy``)
    image_policy: dict[str, Any] | None = None

    @property
    def samples_dropped(self) -> int:
        return sum(self.dropped_by_reason.values())

    def lines(self) -> list[str]:
        dropped = ", ".join(f"{k} {v}" for k, v in sorted(self.dropped_by_reason.items())) or "none"
        rate = self.samples_read / self.seconds if self.seconds > 0 else 0.0
        return [
            f"samples  read {self.samples_read}  packed {self.samples_packed}  "
            f"dropped {self.samples_dropped} ({dropped})",
            f"packs    {self.packs}  fill {self.fill_ratio:.2%}  tokens {self.tokens}  images {self.images}",
            *([f"images   {_policy_text(self.image_policy)}"] if self.image_policy else []),
            f"shards   {self.shards}  {_human_bytes(self.bytes)}  in {self.output}",
            f"time     {self.seconds:.1f} s  ({rate:.0f} samples/s)"
            + (f"  resumed: {self.resumed_shards} shards kept" if self.resumed_shards else ""),
        ]


def _policy_text(policy: dict[str, Any]) -> str:
    """``fixed 64 tokens each`` or ``processor qwen2_5_vl (Qwen2_5_VLProcessor), tokens from each image's size``."""
    if policy.get("kind") == "fixed":
        return f"fixed {policy['tokens_per_image']} tokens each (--tokens-per-image)"
    if policy.get("family"):
        return f"processor {policy['family']} ({policy.get('processor_class')}), tokens from each image's size"
    return f"image processor {policy.get('name')}, tokens from each image's size"


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"
