"""Training with Hugging Face ``Trainer`` and with ``accelerate`` on a wdspack loader.

Both libraries split data over ranks themselves; a wdspack loader has done that already (each
rank streams its own packs, the same number of batches on every rank). The pieces here keep them
from doing it again, save each rank's loader position in every checkpoint, and keep the loss the
exact token mean of each optimizer step over all its micro-batches on all ranks
(:mod:`wdspack.train.loss`):

==============================  ==========================================================
piece                           what it does
==============================  ==========================================================
:class:`PackedTrainer`          ``Trainer`` over the loader as is: no ``accelerator.prepare``
                                of the data, no ``set_epoch``, no batch skipping on resume;
                                the loss is the model's causal-LM loss over the step's targets;
                                over a mixture it logs ``loss/<name>``, ``tokens/<name>``
:class:`LoaderStateCallback`    writes ``wdspack-loader-rank{R}.json`` into each checkpoint
:func:`save_loader_state`,      the same file in any checkpoint folder, on every rank
:func:`load_loader_state`       (``accelerator.save_state`` writes registered objects from
                                the main process only: one rank's state for all ranks)
:func:`stream_batches`          the loader as one endless stream, epoch after epoch
:func:`step_batches`            the stream in lists of ``accumulation`` micro-batches
:func:`accumulate_gradients`    one step's forward + backward under ``accelerate``, exact mean
==============================  ==========================================================

How the Trainer sees the loader: as one endless stream without a length (so ``max_steps`` is
required). An optimizer step's micro-batches may then span two epochs, as in
``examples/train_ddp.py``, and a resume is exact at any step: Trainer's epochs would end with a
short accumulation step whenever ``len(loader)`` is not a multiple of the accumulation, which a
mid-epoch resume with ``ignore_data_skip`` puts out of step. The ``epoch`` Trainer logs is the
loader's (2.5: half-way through the third epoch). On resume, the model weights are restored even
where Trainer's own load misses them (renamed VLM weights, transformers#43701).

transformers and accelerate are imported on first use: :class:`PackedTrainer` and
:class:`LoaderStateCallback` are built when first looked up; :class:`PackedTrainerMixin` adds the
same behaviour to another ``Trainer`` subclass (TRL's, your own).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import ConfigError, WdspackError
from ..loader.batch.collate import IGNORE_INDEX
from ..models import model_inputs
from .loss import num_items_in_batch, token_losses
from .mixture import source_totals

if TYPE_CHECKING:
    from ..loader import PackedLoader

__all__ = ["LOADER_STATE_FILE", "LoaderStateCallback", "PackedTrainer", "PackedTrainerMixin", "accumulate_gradients",
           "causal_lm_loss", "load_loader_state", "save_loader_state", "step_batches", "stream_batches"]

#: Each rank's loader state inside a checkpoint folder (``rank`` from the loader's dataset).
LOADER_STATE_FILE = "wdspack-loader-rank{rank}.json"


# -- the loader as a stream ----------------------------------------------------------------------

def stream_batches(loader: PackedLoader) -> Iterator[dict[str, torch.Tensor]]:
    """The loader's batches epoch after epoch, endlessly, from wherever the loader stands.

    Each ``for batch in loader`` continues where the last one stopped and moves to the next epoch
    once one is consumed, so this is the loader's own order; ``loader.state_dict()`` after any
    batch resumes it.

    Example:
        >>> batches = stream_batches(loader)  # doctest: +SKIP
        >>> first = next(batches)  # doctest: +SKIP
    """
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise WdspackError(f"the loader yielded no batch in epoch {loader.epoch}; len(loader) = {len(loader)}")


def step_batches(loader: PackedLoader, accumulation: int) -> Iterator[list[dict[str, torch.Tensor]]]:
    """:func:`stream_batches` in lists of ``accumulation`` micro-batches, one list per optimizer step.

    A step may take the end of one epoch and the start of the next.

    Example:
        >>> for micro in step_batches(loader, 4):  # doctest: +SKIP
        ...     accumulate_gradients(accelerator, model, micro)
    """
    if accumulation < 1:
        raise ConfigError(f"accumulation={accumulation} must be >= 1")
    stream = stream_batches(loader)
    while True:
        yield [next(stream) for _ in range(accumulation)]


# -- loader state in checkpoints -----------------------------------------------------------------

def save_loader_state(loader: PackedLoader, folder: str | os.PathLike[str]) -> Path:
    """Write ``loader.state_dict()`` to ``folder/wdspack-loader-rank{R}.json`` (atomically); return the path.

    Call it on every rank, next to the model and optimizer (``accelerator.save_state(folder)``,
    ``Trainer``'s checkpoint folder): each rank has its own position.

    Example:
        >>> accelerator.save_state("ckpt/step-1000")  # doctest: +SKIP
        >>> save_loader_state(loader, "ckpt/step-1000")  # doctest: +SKIP
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOADER_STATE_FILE.format(rank=loader.dataset.rank)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(loader.state_dict(), f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def load_loader_state(loader: PackedLoader, folder: str | os.PathLike[str]) -> None:
    """Restore the state :func:`save_loader_state` wrote for this rank; the next batch is the one after it.

    Example:
        >>> accelerator.load_state("ckpt/step-1000")  # doctest: +SKIP
        >>> load_loader_state(loader, "ckpt/step-1000")  # doctest: +SKIP
    """
    path = Path(folder) / LOADER_STATE_FILE.format(rank=loader.dataset.rank)
    if not path.is_file():
        raise ConfigError(f"{path} does not exist: the checkpoint has no loader state for rank {loader.dataset.rank}; "
                          "save it with save_loader_state (or PackedTrainer) on every rank, and resume with the "
                          "world size it was saved with")
    loader.load_state_dict(json.loads(path.read_text(encoding="utf-8")))


# -- the exact loss --------------------------------------------------------------------------------

def causal_lm_loss(model: Any, logits: torch.Tensor, labels: torch.Tensor,
                   num_items: torch.Tensor | int | None) -> torch.Tensor:
    """The model's own causal-LM loss of ``logits`` over ``num_items`` targets: ``Σ loss / num_items``.

    The same arithmetic as ``model(..., labels=labels, num_items_in_batch=num_items).loss`` (the
    model's ``loss_function``), without relying on the model to pass ``num_items_in_batch`` on:
    transformers marks many VLMs ``accepts_loss_kwargs = False`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL,
    Gemma 3), and ``Trainer`` then averages each micro-batch on its own. ``None``: the mean over
    this batch's targets.

    Example:
        >>> out = model(**{k: v for k, v in kwargs.items() if k != "labels"})  # doctest: +SKIP
        >>> loss = causal_lm_loss(model, out.logits, kwargs["labels"], num_items_in_batch(micro))  # doctest: +SKIP
    """
    if isinstance(num_items, torch.Tensor):  # a window of padding alone (its samples dropped at load): 0, not 0 / 0
        num_items = num_items.clamp(min=1)
    elif num_items is not None:
        num_items = max(int(num_items), 1)
    return model.loss_function(logits=logits, labels=labels, vocab_size=logits.shape[-1], num_items_in_batch=num_items)


def accumulate_gradients(accelerator: Any, model: Any, micro_batches: list[Mapping[str, Any]]) -> torch.Tensor:
    """Forward and backward of one optimizer step's micro-batches under ``accelerate``, the exact token mean.

    The loss of every micro-batch is divided by the step's target count on all ranks
    (:func:`wdspack.num_items_in_batch`, one ``all_reduce``) and multiplied by the number of
    processes, since DDP averages the gradients; gradients are synchronised on the last
    micro-batch only. Leave ``Accelerator(gradient_accumulation_steps=1)``: ``accelerator.backward``
    divides by it, and the target count already spans the step.

    Args:
        accelerator: the ``accelerate.Accelerator``.
        model: the model ``accelerator.prepare`` returned.
        micro_batches: this rank's batches of the step, straight from the loader (not prepared by
            accelerate: the loader gives every rank its own packs already).

    Returns:
        This rank's share of the step's loss, float64; ``accelerator.reduce(share, "sum")`` is the
        step's token mean over all ranks.

    Example:
        >>> model, optimizer = accelerator.prepare(model, optimizer)  # doctest: +SKIP
        >>> for micro in step_batches(loader, 4):  # doctest: +SKIP
        ...     share = accumulate_gradients(accelerator, model, micro)
        ...     optimizer.step(); optimizer.zero_grad()
    """
    if accelerator.gradient_accumulation_steps != 1:
        raise ConfigError(f"Accelerator(gradient_accumulation_steps={accelerator.gradient_accumulation_steps}): "
                          "accumulate_gradients normalises over the whole step already; use 1")
    inner = accelerator.unwrap_model(model)
    n = num_items_in_batch(micro_batches)
    share: torch.Tensor | None = None  # summed on the device, read once (no host sync per micro-batch)
    for i, batch in enumerate(micro_batches):
        sync = contextlib.nullcontext() if i == len(micro_batches) - 1 else accelerator.no_sync(model)
        with sync:
            kwargs = model_inputs(batch, inner)
            labels = kwargs.pop("labels")
            loss = causal_lm_loss(inner, model(**kwargs).logits, labels, n)
            accelerator.backward(loss * accelerator.num_processes)
        part = loss.detach().to(torch.float64)
        share = part if share is None else share + part
    return torch.zeros((), dtype=torch.float64) if share is None else share.cpu()


# -- Trainer ---------------------------------------------------------------------------------------

class _Stream:
    """What ``Trainer`` iterates: :func:`stream_batches` with no ``__len__`` and no ``set_epoch``.

    No ``set_epoch``, because Trainer calls it at the start of each of its epochs and
    ``PackedLoader.set_epoch`` restarts an epoch from its first batch: a resumed run would replay
    the epoch. No length, so Trainer does not cut the stream into epochs of its own.
    """

    def __init__(self, loader: PackedLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return stream_batches(self.loader)


class PackedTrainerMixin:
    """``Trainer`` behaviour for a wdspack loader; :class:`PackedTrainer` is this plus ``transformers.Trainer``.

    * ``get_train_dataloader`` returns the loader as one endless stream, not passed to
      ``accelerator.prepare`` (which would split the already-split batches again);
    * ``compute_loss`` maps each batch to the model's arguments (:func:`wdspack.model_inputs`);
    * the loss is :func:`causal_lm_loss` over Trainer's ``num_items_in_batch`` (targets of the
      accumulation window, summed over ranks), set as ``compute_loss_func`` unless you pass one;
    * a :class:`LoaderStateCallback` saves each rank's loader state in every checkpoint, and
      ``train(resume_from_checkpoint=...)`` restores it before Trainer restores the rest; resume with
      the run's own ``max_steps``: one that changes the learning-rate schedule (a ``linear`` or
      ``cosine`` decay is computed from it) is refused;
    * over a mixture (DESIGN.md section 8), every training log also has ``loss/<name>`` and
      ``tokens/<name>`` per source (:meth:`log`); one dataset logs nothing more.

    Needs ``TrainingArguments(max_steps=N, ignore_data_skip=True)``: the stream has no length,
    and the loader resumes from its own state instead of Trainer re-reading the batches seen.

    Example:
        >>> class MySFTTrainer(PackedTrainerMixin, SFTTrainer): ...  # doctest: +SKIP
    """

    if TYPE_CHECKING:  # what the Trainer this is mixed into provides
        args: Any
        model: Any
        accelerator: Any

        def add_callback(self, callback: Any) -> None: ...

    def __init__(self, *args: Any, loader: PackedLoader, **kwargs: Any) -> None:
        self.loader = loader
        # Over a mixture: per source, the loss sum and the target count since the last log
        # (float64, exact for counts below 2**53), one row each; None for one dataset.
        self._source_totals: torch.Tensor | None = None
        self._step_losses: torch.Tensor | None = None  # the token losses _packed_loss computed, for compute_loss
        kwargs.setdefault("compute_loss_func", self._packed_loss)
        super().__init__(*args, **kwargs)
        _check_training_args(self.args, loader)
        self.add_callback(__getattr__("LoaderStateCallback")(loader))

    def get_train_dataloader(self) -> Any:
        return _Stream(self.loader)

    def compute_loss(self, model: Any, inputs: Mapping[str, Any], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None) -> Any:
        kwargs = model_inputs(inputs, self.accelerator.unwrap_model(model))
        if self.loader.dataset.mixture is None or not model.training:  # one dataset, or evaluation
            # super() is the Trainer this is mixed into, which mypy cannot see from the mixin: hence the ignore
            return super().compute_loss(model, kwargs, return_outputs=return_outputs,  # type: ignore[misc]
                                        num_items_in_batch=num_items_in_batch)
        self._step_losses = None
        loss, outputs = super().compute_loss(model, kwargs, return_outputs=True,  # type: ignore[misc]
                                             num_items_in_batch=num_items_in_batch)
        losses, self._step_losses = self._step_losses, None
        if losses is None:  # a compute_loss_func of your own: the token losses once more, outside the graph
            with torch.no_grad():
                losses = token_losses(outputs["logits"].detach(), inputs["labels"].to(outputs["logits"].device))
        self._count_sources(losses, inputs)
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """Trainer's ``log``; over a mixture, a training log (one with ``loss``) also gets, per source:

        * ``loss/<name>``: the token mean of the source's target tokens since the last log, over
          every micro-batch of every step and every rank (left out where the source had none);
        * ``tokens/<name>``: those target tokens (they sum to all the targets since the last log).

        The sums add up on each rank step after step and are reduced over the ranks here: one
        ``all_reduce`` per log, in the log Trainer makes on every rank at the same step. Trainer's
        own ``loss`` is the mean of the steps' token means, so with ``logging_steps`` > 1 it differs
        from the token-weighted mean of the ``loss/<name>`` slightly; with ``logging_steps=1`` they agree.
        """
        if self.loader.dataset.mixture is not None and "loss" in logs:
            logs.update(self._source_logs())
        super().log(logs, *args, **kwargs)  # type: ignore[misc]

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        checkpoint: str | None
        if resume_from_checkpoint is True:
            from transformers.trainer_utils import get_last_checkpoint

            checkpoint = get_last_checkpoint(self.args.output_dir)
            if checkpoint is None:
                raise ConfigError(f"resume_from_checkpoint=True, but {self.args.output_dir} has no checkpoint-* folder")
        else:
            checkpoint = resume_from_checkpoint or None
        if checkpoint:
            _check_resumable(self.args)
            # Trainer's own schedule only: one passed in with optimizers=(..., scheduler) is yours to continue
            if getattr(self, "lr_scheduler", None) is None or getattr(self, "_created_lr_scheduler", False):
                _check_same_schedule(self.args, checkpoint)
            load_loader_state(self.loader, checkpoint)
            _restore_renamed_weights(self.accelerator.unwrap_model(self.model), checkpoint)
        # super() is the Trainer this is mixed into, which mypy cannot see from the mixin: hence the ignore
        return super().train(checkpoint, *args, **kwargs)  # type: ignore[misc]

    def _packed_loss(self, outputs: Any, labels: torch.Tensor,
                     num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
        model = self.accelerator.unwrap_model(self.model)
        if self.loader.dataset.mixture is None or not model.training or not _stock_causal_lm_loss(model):
            return causal_lm_loss(model, outputs["logits"], labels, num_items_in_batch)
        # Over a mixture, the per-source sums need each token's loss: computed once, in the graph,
        # the model's loss is their sum over the step's targets (transformers' ForCausalLMLoss,
        # written out), so the logits are read once, not once more for the accounting.
        losses = token_losses(outputs["logits"], labels)
        self._step_losses = losses.detach()
        count = (labels != IGNORE_INDEX).sum() if num_items_in_batch is None else num_items_in_batch
        if torch.is_tensor(count):
            count = count.to(losses.device)
        return losses.sum() / count

    def _count_sources(self, losses: torch.Tensor, batch: Mapping[str, Any]) -> None:
        total, number = source_totals(losses, batch, len(self.loader.source_names))
        step = torch.stack([total.to(torch.float64), number.to(torch.float64)])
        self._source_totals = step if self._source_totals is None else self._source_totals + step

    def _source_logs(self) -> dict[str, float]:
        """Per source, the token mean loss and the target tokens since the last log, over all ranks."""
        totals = self._source_totals
        if totals is None:  # no step since the last log; every rank still joins the reduction
            totals = torch.zeros(2, len(self.loader.source_names), dtype=torch.float64, device=self.args.device)
        sums = self.accelerator.reduce(totals, reduction="sum").tolist()
        self._source_totals = None
        logs: dict[str, float] = {}
        for name, total, number in zip(self.loader.source_names, *sums):
            if number:
                logs[f"loss/{name}"] = total / number
            logs[f"tokens/{name}"] = int(number)
        return logs


def _stock_causal_lm_loss(model: Any) -> bool:
    """Whether the model's ``loss_function`` is transformers' own causal-LM loss (not one of its own)."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    return getattr(model, "loss_function", None) is ForCausalLMLoss


def _restore_renamed_weights(model: Any, folder: str | os.PathLike[str]) -> None:
    """Load a Trainer checkpoint's weights whose names ``save_pretrained`` changed (transformers#43701).

    ``save_pretrained`` writes many VLMs' weights under their original checkpoint names
    (Qwen2.5-VL's ``model.language_model.*`` as ``model.*``), and ``Trainer`` resumes with a
    non-strict ``load_state_dict`` of those names as they are: nothing loads, with a warning, and
    training goes on from the initial weights. When the names differ, ``from_pretrained`` (which
    renames them back) loads the checkpoint and every weight is copied in; Trainer's own load then
    finds nothing to change (its missing-keys warning remains).
    """
    from safetensors import safe_open

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        saved = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
    elif (folder / "model.safetensors").is_file():
        with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
            saved = set(f.keys())
    else:
        return  # adapters, FSDP, .bin: Trainer's own paths
    if saved <= set(model.state_dict()):
        return
    loaded = type(model).from_pretrained(str(folder), dtype=next(model.parameters()).dtype)
    model.load_state_dict(loaded.state_dict())


#: The first transformers whose Trainer resumes a run of several CPU ranks (5.17 maps the optimizer state to
#: ``cpu:0``, which torch cannot restore).
RESUMES_ON_CPU_RANKS = "5.18"


def _check_resumable(args: Any) -> None:
    """Refuse, before anything is loaded, a resume that transformers 5.17's Trainer cannot do: with several
    ranks on CPU it loads the optimizer state with ``map_location`` ``cpu:0``, which torch cannot restore
    (fixed in 5.18, which maps to plain ``cpu``)."""
    import transformers
    from packaging.version import Version

    device = getattr(args, "device", None)
    indexed_cpu = getattr(device, "type", None) == "cpu" and getattr(device, "index", None) is not None
    if (getattr(args, "world_size", 1) > 1 and indexed_cpu
            and Version(transformers.__version__) < Version(RESUMES_ON_CPU_RANKS)):
        raise ConfigError(f"transformers {transformers.__version__}'s Trainer cannot resume a run of "
                          f"{args.world_size} CPU ranks: it loads the optimizer state onto {str(device)!r}, which "
                          "torch refuses ('don't know how to restore data location'); upgrade to transformers >= "
                          f"{RESUMES_ON_CPU_RANKS} (pip install 'transformers>={RESUMES_ON_CPU_RANKS}'), or resume on "
                          "GPUs or one rank")


def _check_same_schedule(args: Any, checkpoint: str | os.PathLike[str]) -> None:
    """Refuse a resume whose ``max_steps`` changes the learning-rate schedule the checkpoint's run followed.

    Trainer computes the schedule from ``max_steps`` (a linear or cosine decay, a warmup given as a
    fraction) and restores, with the optimizer, the learning rate the saved schedule had reached: the
    first resumed step trains at that rate (0.0 at the end of a linear decay), the next ones on the new
    schedule. A schedule ``max_steps`` leaves alone (``constant``, ``constant_with_warmup`` with a warmup
    in steps) resumes with any ``max_steps``. docs/guides/train.md, "Resuming a Trainer run": figures, fixes.
    """
    from transformers.trainer import TRAINER_STATE_NAME

    path = Path(checkpoint) / TRAINER_STATE_NAME
    if not path.is_file():
        return  # Trainer's own message
    state = json.loads(path.read_text(encoding="utf-8"))
    saved, step = state.get("max_steps"), state.get("global_step", 0)
    if not saved or saved == args.max_steps:
        return
    old, new = _lr_factors(args, saved), _lr_factors(args, args.max_steps)
    if old is None or new is None:
        return  # not a per-step schedule (reduce_lr_on_plateau), or one Trainer will refuse itself
    probes = sorted({0, step, *range(0, step + 1, max(1, step // 64))})
    if all(abs(old(k) - new(k)) <= 1e-12 for k in probes):
        return
    lr, name = args.learning_rate, str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
    raise ConfigError(
        f"{checkpoint} is step {step} of a run of max_steps={saved}; resuming it with max_steps={args.max_steps} "
        f"changes its {name!r} learning-rate schedule, which Trainer computes from max_steps: step {step + 1} would "
        f"train at {lr * old(step):.4g} (where the saved schedule stood) instead of {lr * new(step):.4g}, and the "
        f"rest on a schedule the first {step} steps did not follow. To finish that run, resume with "
        f"max_steps={saved}; to train longer, plan max_steps for the whole run from the start, use "
        "lr_scheduler_type='constant_with_warmup', or start a new run from the checkpoint "
        "(docs/guides/train.md#resuming-a-trainer-run)")


def _lr_factors(args: Any, max_steps: int) -> Callable[[int], float] | None:
    """Step -> learning-rate factor of the schedule Trainer builds for ``args`` and ``max_steps``; None
    where it is not a per-step function (or cannot be built here)."""
    from transformers.optimization import get_scheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    try:
        scheduler = get_scheduler(args.lr_scheduler_type, optimizer=optimizer,
                                  num_warmup_steps=args.get_warmup_steps(max_steps), num_training_steps=max_steps,
                                  scheduler_specific_kwargs=args.lr_scheduler_kwargs)
    except (ValueError, TypeError):
        return None
    lambdas = getattr(scheduler, "lr_lambdas", None)
    return lambdas[0] if lambdas else None


def _check_training_args(args: Any, loader: PackedLoader) -> None:
    if args.max_steps is None or args.max_steps <= 0:
        per_step = args.gradient_accumulation_steps
        raise ConfigError(f"TrainingArguments(max_steps={args.max_steps}): PackedTrainer needs max_steps, since the "
                          f"loader reaches Trainer as one endless stream ({len(loader)} batches per epoch on each "
                          f"rank: E epochs are max_steps = E * {len(loader)} // {per_step})")
    if not args.ignore_data_skip:
        raise ConfigError("TrainingArguments(ignore_data_skip=False): pass ignore_data_skip=True; the loader resumes "
                          "from the state saved in the checkpoint, and Trainer's skipping would re-read the batches")
    if args.world_size > 1 and not args.average_tokens_across_devices:
        raise ConfigError("TrainingArguments(average_tokens_across_devices=False): the loss would be each rank's own "
                          "token mean, averaged over ranks; pass True for the exact token mean")


class _LoaderStateEvents:
    """``TrainerCallback`` events: save the loader state with each checkpoint, log the loader's epoch."""

    def __init__(self, loader: PackedLoader) -> None:
        self.loader = loader

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        position = self.loader.state_dict()
        state.epoch = position["epoch"] + position["batches"] / len(self.loader)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        save_loader_state(self.loader, Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")


_DOCS = {
    "PackedTrainer": """``transformers.Trainer`` training from a wdspack loader as is (see :class:`PackedTrainerMixin`).

    Example:
        >>> args = TrainingArguments("out", max_steps=1000, save_steps=100, ignore_data_skip=True)  # doctest: +SKIP
        >>> trainer = PackedTrainer(model=model, args=args, loader=loader)  # doctest: +SKIP
        >>> trainer.train(resume_from_checkpoint=True)  # doctest: +SKIP
    """,
    "LoaderStateCallback": """A ``TrainerCallback``: each rank writes its loader state into every checkpoint folder
    (:func:`save_loader_state`); the ``epoch`` Trainer logs becomes the loader's.

    Example:
        >>> trainer.add_callback(LoaderStateCallback(loader))  # doctest: +SKIP
    """,
}

if TYPE_CHECKING:  # what __getattr__ builds, for type checkers
    from transformers import Trainer, TrainerCallback

    class PackedTrainer(PackedTrainerMixin, Trainer): ...

    class LoaderStateCallback(_LoaderStateEvents, TrainerCallback): ...


def __getattr__(name: str) -> Any:
    if name not in _DOCS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name in globals():
        return globals()[name]
    import transformers

    bases = {"PackedTrainer": (PackedTrainerMixin, transformers.Trainer),
             "LoaderStateCallback": (_LoaderStateEvents, transformers.TrainerCallback)}
    for key, parents in bases.items():
        globals()[key] = type(key, parents, {"__doc__": _DOCS[key], "__module__": __name__})
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_DOCS))
