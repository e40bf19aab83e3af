"""Resuming a ``PackedTrainer`` run as docs/guides/train.md ("Resuming a Trainer run") says trains what the
uninterrupted run trains: the same learning rate at every step, the same batches, the same parameters.

One process, a tiny real Qwen2.5-VL (the session's ``vlm_family``) on its packed chats, 4 batches per
epoch, 3 optimizer steps with a warmup of one. Transformers' Trainer computes the schedule from
``max_steps`` and restores, with the optimizer, the rate the saved schedule had reached: a resume with
``max_steps`` raised would train its first step at the old schedule's rate (0.0 at the end of a linear
decay), so ``PackedTrainer`` refuses it in one line, unless the schedule does not depend on ``max_steps``.
"""

from __future__ import annotations

import hashlib

import pytest

#: The integration tier: 7 short Trainer runs, on the model family the family tests build once per session.
pytestmark = pytest.mark.slow

STEPS = 3
#: The checkpoint the interrupted runs resume from: in the middle of the loader's first epoch.
STOP = 1
QWEN = "qwen2_5_vl"


def _run(family, out, *, max_steps: int, schedule: str, stop_at: int | None = None, resume: bool = False) -> dict:
    """Train (or resume) in ``out``; the learning rate and the input_ids digest of each step, and a digest of
    the parameters at the end."""
    from transformers import TrainerCallback, TrainingArguments

    import wdspack
    from wdspack.train.trainers import PackedTrainer

    processor, model, dataset = family
    seen: dict = {"lr": [], "batches": []}

    class Record(TrainerCallback):
        def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
            seen["lr"].append(optimizer.param_groups[0]["lr"])

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == stop_at:  # a run that stops here, its checkpoint saved: a preemption
                control.should_save = control.should_training_stop = True

    class Trainer(PackedTrainer):
        def compute_loss(self, model, inputs, *args, **kwargs):
            seen["batches"].append(hashlib.sha256(inputs["input_ids"].numpy().tobytes()).hexdigest()[:12])
            return super().compute_loss(model, inputs, *args, **kwargs)

    loader = wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, processor=processor, seed=0)
    args = TrainingArguments(str(out), max_steps=max_steps, learning_rate=1e-2, lr_scheduler_type=schedule,
                             warmup_steps=1, save_strategy="steps", save_steps=STOP, ignore_data_skip=True,
                             use_cpu=True, report_to="none", disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, loader=loader, callbacks=[Record()])
    trainer.train(resume_from_checkpoint=True if resume else None)
    params = b"".join(p.detach().numpy().tobytes() for p in trainer.model.parameters())
    return {**seen, "steps": trainer.state.global_step, "params": hashlib.sha256(params).hexdigest()}


@pytest.mark.parametrize("schedule, first_max_steps", [
    ("linear", STEPS),  # the recipe: the same max_steps, stopped at any checkpoint
    ("constant_with_warmup", STOP),  # a schedule max_steps leaves alone: a raised max_steps continues exactly
])
def test_resumed_run_trains_like_the_uninterrupted_one(schedule, first_max_steps, vlm_family, tmp_path):
    """Each run gets a fresh copy of the same initial model (``vlm_family``)."""
    whole = _run(vlm_family(QWEN), tmp_path / "whole", max_steps=STEPS, schedule=schedule)
    first = _run(vlm_family(QWEN), tmp_path / "resumed", max_steps=first_max_steps, schedule=schedule, stop_at=STOP)
    rest = _run(vlm_family(QWEN), tmp_path / "resumed", max_steps=STEPS, schedule=schedule, resume=True)
    assert whole["lr"][0] < whole["lr"][1], "the schedule warms up: the test tells the steps apart"
    assert (first["steps"], rest["steps"]) == (STOP, STEPS)
    assert first["lr"] + rest["lr"] == whole["lr"], "the learning rate of every step"
    assert first["batches"] + rest["batches"] == whole["batches"], "the next pack after the checkpoint's"
    assert rest["params"] == whole["params"], "bit for bit the parameters of the uninterrupted run"


def test_resume_with_a_schedule_changed_by_max_steps_is_refused_in_one_line(vlm_family, tmp_path):
    """Raising max_steps under a linear decay: refused before anything loads, naming both values, the rate the
    first resumed step would get and the fix. What it would have done (a stock Trainer does it): train step
    2 at the rate the saved 1-step schedule ended on, 0.0, instead of the 3-step schedule's 0.01."""
    from wdspack.errors import ConfigError

    _run(vlm_family(QWEN), tmp_path / "out", max_steps=STOP, schedule="linear")
    with pytest.raises(ConfigError) as caught:
        _run(vlm_family(QWEN), tmp_path / "out", max_steps=STEPS, schedule="linear", resume=True)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'out' / 'checkpoint-1'} is step 1 of a run of max_steps=1; resuming it "
                               "with max_steps=3 changes its 'linear' learning-rate schedule")
    assert "step 2 would train at 0 (where the saved schedule stood) instead of 0.01," in message
    assert "resume with max_steps=1" in message and "docs/guides/train.md#resuming-a-trainer-run" in message
