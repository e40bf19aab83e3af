"""Training on a mixture (issue #21, items 3 and 4): ``PackedTrainer`` logs the loss and the target
tokens of each source, and ``examples/train_mixture.py`` trains a tiny real Qwen2.5-VL on a
two-source mixture and prints them.

Two small datasets packed with the same processor: ``chats`` (multi-turn chats with long answers,
one to two images) and ``captions`` (an image and a one-line caption), mixed 50/50 in tokens by a
YAML file. Every per-source figure is checked against the token losses of the very batches the
loader gives, computed here by hand from the same initial weights."""

from __future__ import annotations

import copy
import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.support.ranks import free_port

ROOT = Path(__file__).resolve().parents[2]


NAMES = ("chats", "captions")
#: (id, turns, image sizes): long answers over several turns ...
CHATS = [
    (f"chat-{k}", (("user", "<image>What is in the picture, and what colour is it?"),
                   ("assistant", "A square in the middle of a grey field, painted a deep red with a thin black edge."),
                   ("user", "Anything else?"),
                   ("assistant", f"Nothing else: the rest is plain grey, number {k}.")), ((64 + 8 * k, 40),))
    for k in range(4)
]
#: ... and short captions.
CAPTIONS = [(f"cap-{k}", (("user", "<image>Caption."), ("assistant", f"A bar, {k}.")), ((36, 56 + 4 * k),))
            for k in range(6)]
SEQ_LEN = 128


def _pack(folder, processor_dir, chats):
    """``chats`` as a messages JSONL with PNG images, packed with the processor saved in ``processor_dir``."""
    from wdspack.packer.config import PackConfig
    from wdspack.packer.job import pack_dataset
    from wdspack.packer.samples import SampleConfig

    (folder / "src").mkdir(parents=True)
    lines = []
    for sid, turns, sizes in chats:
        images = []
        for k, (w, h) in enumerate(sizes):
            pixels = np.random.default_rng(sum(map(ord, sid)) + k).integers(0, 256, (h, w, 3), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, format="PNG")
            (folder / "src" / f"{sid}-{k}.png").write_bytes(buf.getvalue())
            images.append(f"{sid}-{k}.png")
        messages = []
        for role, text in turns:
            parts: list[dict] = []
            for j, piece in enumerate(text.split("<image>")):
                if j:
                    parts.append({"type": "image", "image": images.pop(0)})
                if piece:
                    parts.append({"type": "text", "text": piece})
            messages.append({"role": role, "content": parts})
        lines.append(json.dumps({"id": sid, "messages": messages}))
    (folder / "src" / "chats.jsonl").write_text("\n".join(lines) + "\n")
    summary = pack_dataset([str(folder / "src" / "chats.jsonl")], str(folder / "packed"),
                           sample_config=SampleConfig(processor=str(processor_dir)),
                           config=PackConfig(seq_len=SEQ_LEN, max_images=4, on_error="raise"), progress=False)
    assert summary.samples_packed == len(chats), summary.lines()
    return folder / "packed"


@pytest.fixture(scope="module")
def mixture(tmp_path_factory):
    """(the mixture file, the processor folder)."""
    from tiny_vlm import qwen2_5_vl
    from wdspack.models import save_processor

    base = tmp_path_factory.mktemp("train-mixture")
    processor_dir = save_processor(qwen2_5_vl.processor(base / "tok"), base / "processor")
    _pack(base / "chats", processor_dir, CHATS)
    _pack(base / "captions", processor_dir, CAPTIONS)
    path = base / "mix.yaml"
    path.write_text("unit: tokens\nsources:\n  - {path: chats/packed, weight: 0.5, name: chats}\n"
                    "  - {path: captions/packed, weight: 0.5, name: captions}\n")
    return path, processor_dir


def _loader(source, processor, **options):
    import wdspack

    return wdspack.make_loader(str(source), batch_size=1, num_workers=0, processor=processor, seed=0, **options)


def _reference(model, batches) -> tuple[list[float], list[int]]:
    """Per source: the token mean loss and the target tokens of ``batches``, by hand."""
    import wdspack
    from wdspack.train.mixture import source_totals

    total, number = torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.int64)
    with torch.no_grad():
        for batch in batches:
            kwargs = wdspack.model_inputs(batch, model)
            losses = wdspack.token_losses(model(**kwargs).logits.double(), kwargs["labels"])
            t, n = source_totals(losses, batch, 2)
            total += t
            number += n
            assert int(n.sum()) == int((batch["labels"] != -100).sum()), "every target counted once"
    return (total / number).tolist(), number.tolist()


def _train(source, processor, tmp_path, *, steps, accumulation, lr=1e-3, own_loss=False):
    """A PackedTrainer run in this process; (its logs with a loss, the initial weights, the final ones).
    ``own_loss``: pass a ``compute_loss_func`` (the model's own loss, as a user's function would be)."""
    from transformers import TrainingArguments

    import wdspack
    from tiny_vlm import qwen2_5_vl
    from wdspack.train.trainers import PackedTrainer, causal_lm_loss

    model = qwen2_5_vl.model(wdspack.load_processor(processor), seed=0)
    options = {}
    if own_loss:
        def loss(outputs, labels, num_items_in_batch=None):
            return causal_lm_loss(model, outputs["logits"], labels, num_items_in_batch)

        options["compute_loss_func"] = loss
    initial = copy.deepcopy(model.state_dict())
    args = TrainingArguments(str(tmp_path / "out"), max_steps=steps, gradient_accumulation_steps=accumulation,
                             learning_rate=lr, lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
                             ignore_data_skip=True, use_cpu=True, report_to="none", disable_tqdm=True, seed=0)
    trainer = PackedTrainer(model=model, args=args, loader=_loader(source, processor), **options)
    trainer.train()
    return [h for h in trainer.state.log_history if "loss" in h], initial, model.state_dict()


@pytest.mark.slow
def test_trainer_logs_each_sources_exact_loss_and_tokens(mixture, tmp_path):
    """Each step's log: loss/<name> and tokens/<name> of both sources; their token-weighted mean is
    Trainer's loss, the tokens sum to the step's targets, and step 1's figures are the hand-computed ones."""
    from tiny_vlm import qwen2_5_vl
    from wdspack.train.trainers import stream_batches

    path, processor = mixture
    steps, accumulation = 3, 2
    logs, initial, _ = _train(path, processor, tmp_path, steps=steps, accumulation=accumulation)
    assert len(logs) == steps
    stream = stream_batches(_loader(path, processor))
    batches = [[next(stream) for _ in range(accumulation)] for _ in range(steps)]
    for log, micro in zip(logs, batches):
        # a source without targets in a step has no loss that step (not a NaN), and 0 tokens
        want = {f"tokens/{n}" for n in NAMES} | {f"loss/{n}" for n in NAMES if log[f"tokens/{n}"]}
        assert {k for k in log if "/" in k} == want, log
        assert all(math.isfinite(log[f"loss/{n}"]) for n in NAMES if log[f"tokens/{n}"]), log
        assert sum(log[f"tokens/{n}"] for n in NAMES) == sum(int((b["labels"] != -100).sum()) for b in micro)
        weighted = sum(log.get(f"loss/{n}", 0) * log[f"tokens/{n}"] for n in NAMES) / sum(log[f"tokens/{n}"]
                                                                                          for n in NAMES)
        assert weighted == pytest.approx(log["loss"], rel=1e-5), "one step per log: the same token mean"
    model = qwen2_5_vl.model(__import__("wdspack").load_processor(processor), seed=0)
    model.load_state_dict(initial)
    means, tokens = _reference(model.train(), batches[0])
    assert [logs[0][f"tokens/{n}"] for n in NAMES] == tokens
    assert [logs[0].get(f"loss/{n}", math.nan) for n in NAMES] == pytest.approx(means, rel=1e-5, nan_ok=True)
    assert all(sum(log[f"tokens/{n}"] for log in logs) > 0 for n in NAMES), "both sources trained on"


@pytest.mark.slow
def test_a_loss_function_of_your_own_gets_the_same_figures_and_trains_the_same(mixture, tmp_path):
    """With the model's own loss_function (PackedTrainer reads the token losses once, in the graph) and
    with a compute_loss_func of one's own (the token losses once more, outside it): the same logs and
    the same trained weights."""
    path, processor = mixture
    own, _, trained = _train(path, processor, tmp_path / "a", steps=2, accumulation=2)
    theirs, _, trained_theirs = _train(path, processor, tmp_path / "b", steps=2, accumulation=2, own_loss=True)
    for a, b in zip(own, theirs):
        assert {k: v for k, v in a.items() if "/" in k} == pytest.approx({k: v for k, v in b.items() if "/" in k},
                                                                          rel=1e-6)
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    for key in trained:
        torch.testing.assert_close(trained[key], trained_theirs[key], rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_one_dataset_logs_nothing_new(mixture, tmp_path):
    _, processor = mixture
    one = mixture[0].parent / "chats" / "packed"
    logs, _, _ = _train(one, processor, tmp_path, steps=1, accumulation=1)
    assert len(logs) == 1 and not [k for k in logs[0] if "/" in k], logs


def _parse(out: str) -> list[dict]:
    """The example's log lines as {"step", "loss", "loss/<name>", "tokens/<name>"}."""
    logs = []
    for line in re.findall(r"^step \d+: .*$", out, re.M):
        head, *parts = line.split(" | ")
        step, loss = re.fullmatch(r"step (\d+): loss ([\d.]+)", head).groups()
        log: dict = {"step": int(step), "loss": float(loss)}
        for part in parts:
            name, value, tokens = re.fullmatch(r"(\w+): loss ([\d.]+|nan|inf) over (\d+) target tokens", part).groups()
            log[f"loss/{name}"], log[f"tokens/{name}"] = float(value), int(tokens)
        logs.append(log)
    return logs


@pytest.mark.slow  # torchrun: 2 gloo ranks on the CPU
def test_example_over_two_ranks_logs_exact_per_source_means(mixture):
    """``examples/train_mixture.py`` under torchrun, 2 ranks × 2 micro-batches per step, a log every 2
    steps: each source's logged loss is its token mean over all 8 batches of both ranks since the
    last log, and its tokens those batches' targets (the learning rate is 0, so every batch's loss
    can be computed here from the initial weights)."""
    import wdspack
    from tiny_vlm import qwen2_5_vl
    from wdspack.train.trainers import stream_batches

    path, processor = mixture
    steps, accumulation, every = 4, 2, 2
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(ROOT / "examples" / "train_mixture.py"), str(path),
           "--processor", str(processor), "--tiny", "--device", "cpu", "--steps", str(steps),
           "--accumulation", str(accumulation), "--log-every", str(every), "--lr", "0", "--workers", "0",
           "--output", str(path.parent / "example-out")]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "sources chats, captions;" in run.stdout
    logs = _parse(run.stdout)
    assert [log["step"] for log in logs] == [2, 4], run.stdout
    for log in logs:
        assert all(math.isfinite(log[f"loss/{n}"]) and log[f"tokens/{n}"] > 0 for n in NAMES), log

    model = qwen2_5_vl.model(wdspack.load_processor(processor), seed=0).train()
    per_log = accumulation * every
    intervals: list[list] = [[] for _ in logs]
    for rank in range(2):
        stream = stream_batches(_loader(path, processor, rank=rank, world_size=2))
        for k in range(len(logs)):
            intervals[k] += [next(stream) for _ in range(per_log)]
    for log, batches in zip(logs, intervals):
        means, tokens = _reference(model, batches)
        assert [log[f"tokens/{n}"] for n in NAMES] == tokens
        assert sum(tokens) == sum(int((b["labels"] != -100).sum()) for b in batches), "the tokens sum to the total"
        assert [log[f"loss/{n}"] for n in NAMES] == pytest.approx(means, abs=1.01e-4)  # printed to 4 decimals
