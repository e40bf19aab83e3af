"""What a pack job is asked to do (:class:`PackConfig`) and what it did (:class:`PackSummary`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..media import KINDS
from .executors import EXECUTORS
from .planner import ALGORITHMS

__all__ = ["DEFAULT_MAX_DROP_FRACTION", "BudgetUse", "PackConfig", "PackSummary", "RunOptions", "budget_use",
           "dataset_budget_use", "read_text"]

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

    ``plan_group_partitions`` plans groups of that many consecutive partitions in tasks of the
    executor, each writing its own shards (0: one global plan; None, the default: chosen by the job's
    size, one global plan up to ``WDSPACK_PLAN_GROUPS_ABOVE`` records, 10 M, groups of about 200 k
    records above: :func:`~.partitioned.choose_plan_groups`), so the driver
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
    #: the context-parallel degree the data will be trained with (``--cp``): each sub-sample is planned at its
    #: length padded to a multiple of ``2·cp`` (TransformerEngine's split), and the manifest records it so the
    #: loader hands out segments that divide already. None: planned at the real lengths (the bytes as before).
    cp: int | None = None
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
        if self.plan_group_partitions is not None and self.plan_group_partitions < 0:
            raise ConfigError(f"plan_group_partitions must be >= 1 (0: one global plan; None: chosen by the job's "
                              f"size), got {self.plan_group_partitions}")
        if self.records_per_partition < 1:
            raise ConfigError(f"records_per_partition must be >= 1, got {self.records_per_partition}")
        if self.cp is not None:
            if isinstance(self.cp, bool) or not isinstance(self.cp, (int, np.integer)) or self.cp < 1:
                raise ConfigError(f"--cp {self.cp!r}: the context-parallel degree is a number of ranks, >= 1")
            if self.seq_len % (2 * self.cp):
                step = 2 * self.cp
                raise ConfigError(f"--seq-len {self.seq_len} is not a multiple of 2·cp = {step} (--cp {self.cp}): "
                                  f"a pack's padding would not split evenly; use --seq-len "
                                  f"{self.seq_len // step * step or step} or {-(-self.seq_len // step) * step}")
        if not isinstance(self.run, RunOptions):
            raise ConfigError(f"run={self.run!r}: pass a wdspack.RunOptions (workers, executor, ray_address, "
                              "max_drop_fraction)")

    def output_fields(self) -> dict[str, Any]:
        """The fields that decide the output (for resume fingerprints): all but ``run``."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "run"}
        if not out["plan_group_partitions"]:  # the global plan: fingerprints as before the field
            del out["plan_group_partitions"]
        if out["cp"] is None:  # not planned for CP: fingerprints as before the field
            del out["cp"]
        return out

    def planned_tokens(self, tokens: np.ndarray) -> np.ndarray:
        """Each sample's tokens as the plan counts them: padded to a multiple of ``2·cp`` when planned for
        context parallelism (``cp``), else as they are.

        Example:
            >>> PackConfig(seq_len=16, cp=2).planned_tokens(np.array([5, 8, 1])).tolist()
            [8, 8, 4]
        """
        if not self.cp:
            return tokens
        step = 2 * int(self.cp)
        return -(-np.asarray(tokens, np.int64) // step) * step


@dataclass(frozen=True, slots=True)
class BudgetUse:
    """Which budget closed the packs, counted pack by pack (:func:`budget_use`).

    A pack is *full of tokens* when its free tokens are fewer than the shortest sample's (no sample
    of the dataset would fit); else *at the image limit* when it holds ``max_images`` images; else
    *open*: a sample would have fit, but none was left that did.
    """

    packs: int
    #: packs whose free tokens are fewer than ``shortest``
    token_full: int
    #: packs at ``max_images`` with room for the shortest sample
    image_full: int
    #: packs neither full of tokens nor at the image limit
    open: int
    #: the fraction of the packs' ``seq_len`` slots that no token fills
    free_tokens: float
    seq_len: int
    max_images: int | None
    #: the shortest sample's tokens (the threshold of "full")
    shortest: int

    def line(self) -> str:
        """What binds and what to raise, one line (empty for a dataset without packs)."""
        if not self.packs:
            return ""
        share = {k: getattr(self, k) / self.packs for k in ("token_full", "image_full", "open")}
        if self.image_full and share["image_full"] >= max(share["token_full"], share["open"]):
            return (f"packs hit --max-images {self.max_images} ({share['image_full']:.0%} of packs) while "
                    f"{self.free_tokens:.0%} of tokens are free: raise --max-images or the fill stays low")
        if share["token_full"] >= share["open"]:
            images = (f"; {share['image_full']:.0%} of packs stopped at --max-images {self.max_images}"
                      if self.image_full else "")
            return (f"packs are full of tokens: {share['token_full']:.0%} have no room for the shortest sample "
                    f"({self.shortest} tokens) in seq_len {self.seq_len}{images}")
        return (f"no budget binds: {share['open']:.0%} of packs have room for the shortest sample "
                f"({self.shortest} tokens) but no sample was left that fit; more short samples would fill them")


def budget_use(tokens: np.ndarray, media: np.ndarray, *, seq_len: int, max_images: int | None,
               shortest: int) -> BudgetUse:
    """Count which budget closed each pack, from the packs' tokens and media items of every kind (what
    ``max_images`` counts; the pack index has both, its ``images`` column counting the media).

    Example:
        >>> budget_use(np.array([100, 40]), np.array([0, 4]), seq_len=100, max_images=4, shortest=10).image_full
        1
    """
    tokens, media = np.asarray(tokens, np.int64), np.asarray(media, np.int64)
    token_full = seq_len - tokens < shortest
    image_full = ~token_full & (media >= max_images) if max_images else np.zeros_like(token_full)
    packs = int(tokens.size)
    return BudgetUse(packs=packs, token_full=int(token_full.sum()), image_full=int(image_full.sum()),
                     open=packs - int(token_full.sum()) - int(image_full.sum()),
                     free_tokens=1.0 - float(tokens.sum()) / (packs * seq_len) if packs else 0.0,
                     seq_len=seq_len, max_images=max_images, shortest=int(shortest))


def dataset_budget_use(manifest: Any, index: np.ndarray) -> BudgetUse:
    """:func:`budget_use` of a packed dataset, from its manifest and pack index.

    "Full of tokens" is measured against ``totals["min_sample_tokens"]``; a manifest from before
    that key gives the smallest mean sample of a pack instead (at least the shortest sample).
    """
    from ..format.pack_index import COLUMNS

    tokens, media, samples = (index[:, COLUMNS.index(c)] for c in ("tokens", "images", "samples"))
    shortest = manifest.totals.get("min_sample_tokens")
    if shortest is None:
        shortest = int((tokens // np.maximum(samples, 1)).min()) if len(tokens) else 0
    return budget_use(tokens, media, seq_len=manifest.seq_len, max_images=manifest.max_images, shortest=shortest)


@dataclass(frozen=True, slots=True)
class PackSummary:
    """What a pack job did; :meth:`lines` is what the CLI prints.

    ``samples_read`` counts samples: a document cut into pieces (``--split-long-documents``) counts
    each piece; ``records_read`` (None: the same) the source records they came from.
    ``carried_by_reason``: drops a reshard inherited from the job it re-packs (None: not a reshard).
    """

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
    #: the source records the samples came from, when a document was cut into several samples
    records_read: int | None = None
    #: which budget closed the packs (None: not known)
    budget: BudgetUse | None = None
    #: a reshard's drops inherited from the source dataset, by reason (None: not a reshard)
    carried_by_reason: dict[str, int] | None = None
    #: how the job chose to plan, when it chose by its size (``planned in groups of ...``; empty: not said)
    plan: str = ""
    #: the items packed of each kind other than images (``{"video": 8}``; a kind with none is left out)
    media: dict[str, int] = field(default_factory=dict)

    @property
    def videos(self) -> int:
        """The videos packed (``media["video"]``)."""
        return self.media.get("video", 0)

    @property
    def samples_dropped(self) -> int:
        return sum(self.dropped_by_reason.values())

    def lines(self) -> list[str]:
        rate = self.samples_read / self.seconds if self.seconds > 0 else 0.0
        return [
            f"samples  read {read_text(self.samples_read, self.records_read)}  packed {self.samples_packed}  "
            f"dropped {self.samples_dropped} ({_reasons(self.dropped_by_reason)})",
            *self._carried_lines(),
            f"packs    {self.packs}  fill {self.fill_ratio:.2%}  tokens {self.tokens}  images {self.images}"
            + "".join(f"  {kind.plural} {self.media[kind.name]}" for kind in KINDS
                      if not kind.always_stored and self.media.get(kind.name)),
            *([f"budget   {self.budget.line()}"] if self.budget is not None and self.budget.packs else []),
            *self._media_lines(),
            *([f"plan     {self.plan}"] if self.plan else []),
            f"shards   {self.shards}  {_human_bytes(self.bytes)}  in {self.output}",
            f"time     {self.seconds:.1f} s  ({_rate(rate)} samples/s)"
            + (f"  resumed: {self.resumed_shards} shards kept" if self.resumed_shards else ""),
        ]

    def _media_lines(self) -> list[str]:
        """How image tokens were counted, and each other kind's settings (its room's ``settings_text``); a job
        of another kind alone (no image packed) names its processor on that kind's line and prints no images
        line."""
        policy = self.image_policy
        if not policy:
            return []
        others = [kind for kind in KINDS if not kind.always_stored and self.media.get(kind.name)]
        lines = [] if others and not self.images and policy.get("family") else [f"images   {_policy_text(policy)}"]
        for kind in others:
            assert kind.prepare is not None
            text = kind.prepare().settings_text(policy)
            if not lines:
                text = f"processor {policy['family']} ({policy.get('processor_class')}), {text}"
            lines.append(f"{kind.plural:<8} {text}")
        return lines

    def _carried_lines(self) -> list[str]:
        """A reshard's drops in two: inherited from the source dataset, and its own (new budgets)."""
        if self.carried_by_reason is None:
            return []
        carried = self.carried_by_reason
        own = {k: n - carried.get(k, 0) for k, n in self.dropped_by_reason.items() if n > carried.get(k, 0)}
        return [f"dropped  {sum(carried.values())} carried from the original job ({_reasons(carried)}); "
                f"{sum(own.values())} by this reshard ({_reasons(own)})"]


def read_text(samples: int, records: int | None) -> str:
    """``40 records = 48 samples (long documents cut into pieces)``, or ``48`` when they are the same.

    Example:
        >>> read_text(48, 40), read_text(5, None)
        ('40 records = 48 samples (long documents cut into pieces)', '5')
    """
    if records is None or records == samples:
        return str(samples)
    return f"{records} records = {samples} samples (long documents cut into pieces)"


def _reasons(by_reason: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(by_reason.items())) or "none"


def _rate(per_second: float) -> str:
    """``1234``, ``56``, or two significant digits under 10 (a small job is not "1 samples/s").

    Example:
        >>> _rate(1234.5), _rate(0.588), _rate(4.04)
        ('1234', '0.59', '4')
    """
    return f"{per_second:.0f}" if per_second >= 10 else f"{per_second:.2g}"


def _policy_text(policy: dict[str, Any]) -> str:
    """``fixed 64 tokens each`` or ``processor qwen2_5_vl (Qwen2_5_VLProcessor), tokens from each image's size``."""
    if policy.get("kind") == "fixed":
        return f"fixed {policy['tokens_per_image']} tokens each (--tokens-per-image)"
    if policy.get("kind") == "none":
        return "none: text only (no --tokens-per-image)"
    if policy.get("family"):
        text = f"processor {policy['family']} ({policy.get('processor_class')}), tokens from each image's size"
        image = policy.get("image") or {}  # absent from datasets packed before wdspack recorded it
        if image.get("settings_from"):
            size = ", ".join(f"{k} {v}" for k, v in sorted((image.get("size") or {}).items(), key=_size_order))
            text += f"; settings{f' (size {size})' if size else ''} from {image['settings_from']}"
        return text
    return f"image processor {policy.get('name')}, tokens from each image's size"


def _size_order(item: tuple[str, Any]) -> tuple[int, str]:
    """The bounds first, the lower one before the upper one (``shortest_edge 3136, longest_edge 50176``)."""
    first = ("shortest_edge", "longest_edge", "height", "width")
    return (first.index(item[0]) if item[0] in first else len(first), item[0])


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"
