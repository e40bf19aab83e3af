"""``examples/train_ddp.py``, ``examples/train_hf_trainer.py`` (``PackedTrainer``) and ``examples/train_accelerate.py``
under ``torchrun``: 2 CPU ranks (gloo) train a tiny real Qwen2.5-VL on processor-exact packs.

Each recipe, stopped at a checkpoint in the middle of an epoch and resumed, must end with the
very parameters an uninterrupted ``examples/train_ddp.py`` run trains (same losses, same parameter
digest on both ranks: the exact token mean over 3 accumulated micro-batches on 2 ranks), and must
feed each rank exactly the batches ``make_loader(..., rank=r, world_size=2)`` yields (accelerate
splits nothing again).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys

import pytest

from tests.support import vlm_harness as h
from tests.support.ranks import free_port

SCRIPTS = {"ddp": "train_ddp.py", "trainer": "train_hf_trainer.py", "accelerate": "train_accelerate.py"}
#: Each rank has 2 batches per epoch here, so steps of 3 micro-batches span epochs and the
#: checkpoint after step 1 is in the middle of epoch 1.
ACCUMULATION = 3
STEPS = 4


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    from tiny_vlm import qwen2_5_vl

    folder = tmp_path_factory.mktemp("trainers")
    processor = qwen2_5_vl.processor(folder / "tok")
    dataset = h.pack_chats(folder, processor, seq_len=96)
    return dataset, folder / "processor"


def _torchrun(recipe: str, dataset, processor, *extra) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(h.ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(h.ROOT / "examples" / SCRIPTS[recipe]), str(dataset),
           "--processor", str(processor), "--tiny", "--backend", "gloo", "--accumulation", str(ACCUMULATION),
           "--workers", "0", *extra]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def _losses(out: str) -> list[str]:
    return re.findall(r"^step \d+: loss ([\d.]+)", out, re.M)


def _digests(out: str) -> dict[int, str]:
    pattern = r"^rank (\d) finished \d+ steps; parameters sha256 ([0-9a-f]{16})$"
    return {int(r): d for r, d in re.findall(pattern, out, re.M)}


def _batches(out: str) -> dict[int, list[str]]:
    seen: dict[int, list[str]] = {0: [], 1: []}
    for r, ids in re.findall(r"^rank (\d) step \d+ batch input_ids ([0-9a-f]{12})$", out, re.M):
        seen[int(r)].append(ids)
    return seen


def _ids(batch) -> str:
    return hashlib.sha256(batch["input_ids"].numpy().tobytes()).hexdigest()[:12]


@pytest.fixture(scope="module")
def reference(packed):
    """train_ddp.py's uninterrupted run: (losses, parameter digests)."""
    out = _torchrun("ddp", *packed, "--steps", str(STEPS))
    losses, digests = _losses(out), _digests(out)
    assert len(losses) == STEPS and all(0 < float(x) < 20 for x in losses), out
    assert len(digests) == 2 and digests[0] == digests[1], out
    return losses, digests[0]


@pytest.fixture(scope="module")
def own_batches(packed):
    """Per rank, the input_ids digests of the first STEPS × ACCUMULATION batches ``make_loader`` gives that
    rank, epoch by epoch (the loader's own ``set_epoch``, not the integrations' stream)."""
    import wdspack

    dataset, processor = packed
    want = STEPS * ACCUMULATION
    out = {}
    for rank in range(2):
        loader = wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, processor=str(processor), seed=0,
                                     rank=rank, world_size=2)
        seen: list[str] = []
        epoch = 0
        while len(seen) < want:
            loader.set_epoch(epoch)
            seen += [_ids(b) for b in loader]
            epoch += 1
        out[rank] = seen[:want]
    assert out[0] != out[1] and not set(out[0]) & set(out[1]), "the ranks read different packs"
    return out


def test_ddp_recipe_stopped_mid_epoch_and_resumed_equals_its_uninterrupted_run(packed, reference, tmp_path):
    """train_ddp.py's own checkpoint (model, optimizer, each rank's loader state), saved in the middle of epoch 1:
    the resumed run logs the uninterrupted run's very losses and ends with its parameters."""
    ref_losses, ref_digest = reference
    ckpt = tmp_path / "ckpt"
    first = _torchrun("ddp", *packed, "--steps", "1", "--save-every", "1", "--checkpoint", str(ckpt))
    states = [json.loads((ckpt / f"loader-rank{r}.json").read_text()) for r in range(2)]
    assert [(s["epoch"], s["batches"]) for s in states] == [(1, 1), (1, 1)], "saved in the middle of epoch 1"
    resumed = _torchrun("ddp", *packed, "--steps", str(STEPS), "--checkpoint", str(ckpt), "--resume")
    assert _losses(first) + _losses(resumed) == ref_losses
    assert _digests(resumed) == {0: ref_digest, 1: ref_digest}, "stopped and resumed = uninterrupted"


@pytest.mark.parametrize("recipe", ["trainer", "accelerate"])
def test_recipe_stopped_mid_epoch_and_resumed_trains_like_ddp_on_its_own_batches(recipe, packed, reference,
                                                                                   own_batches, tmp_path):
    """The uninterrupted run to compare with is train_ddp.py's (bit for bit the same training)."""
    import transformers
    from packaging.version import Version

    from wdspack.train.trainers import RESUMES_ON_CPU_RANKS

    if recipe == "trainer" and Version(transformers.__version__) < Version(RESUMES_ON_CPU_RANKS):
        pytest.skip(f"transformers {transformers.__version__}'s Trainer cannot resume on several CPU ranks "
                    "(PackedTrainer refuses it: test_resume_refused_where_transformers_cannot_do_it)")
    ref_losses, ref_digest = reference
    ckpt = tmp_path / "ckpt"
    first = _torchrun(recipe, *packed, "--steps", "1", "--save-every", "1", "--checkpoint", str(ckpt), "--log-batches")
    folder = ckpt / "checkpoint-1" if recipe == "trainer" else ckpt
    states = [json.loads((folder / f"wdspack-loader-rank{r}.json").read_text()) for r in range(2)]
    assert [(s["epoch"], s["batches"], s["config"]["rank"]) for s in states] == [(1, 1, 0), (1, 1, 1)], \
        "saved in the middle of epoch 1, one state per rank"

    resumed = _torchrun(recipe, *packed, "--steps", str(STEPS), "--resume", "--checkpoint", str(ckpt), "--log-batches")
    losses = _losses(first) + _losses(resumed)
    assert len(losses) == STEPS, first + resumed
    assert [float(x) for x in losses] == pytest.approx([float(x) for x in ref_losses], abs=1.01e-4)
    assert _digests(first)[0] == _digests(first)[1]
    assert _digests(resumed) == {0: ref_digest, 1: ref_digest}, "the parameters of train_ddp.py's uninterrupted run"
    seen = {r: _batches(first)[r] + _batches(resumed)[r] for r in range(2)}
    assert seen == own_batches, "each rank trained on exactly its own make_loader batches, resumed at the next pack"


def test_first_step_loss_is_the_exact_token_mean(packed, reference, own_batches):
    """Step 1's logged loss (the same in all three recipes, see above) is Σ token losses / all targets over
    both ranks' 3 micro-batches, and not what Trainer's default would give for this model
    (``accepts_loss_kwargs = False``: each micro-batch's own mean, averaged)."""
    import torch

    import wdspack
    from tiny_vlm import qwen2_5_vl
    from wdspack.train.trainers import stream_batches

    dataset, processor = packed
    proc = wdspack.load_processor(processor)
    model = qwen2_5_vl.model(proc, seed=0).double().train()
    assert model.accepts_loss_kwargs is False, "the pitfall this guards against is still there"
    total, targets, means = 0.0, 0, []
    with torch.no_grad():
        for rank in range(2):
            loader = wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, processor=proc, seed=0, rank=rank,
                                         world_size=2)
            batches = [b for _, b in zip(range(ACCUMULATION), stream_batches(loader))]
            assert [_ids(b) for b in batches] == own_batches[rank][:ACCUMULATION]
            for b in batches:
                kwargs = wdspack.model_inputs(b, model)
                losses = wdspack.token_losses(model(**kwargs).logits, kwargs["labels"])
                total += float(losses.sum())
                n = int((kwargs["labels"] != -100).sum())
                targets += n
                means.append(float(losses.sum()) / n)
    exact = total / targets
    assert float(reference[0][0]) == pytest.approx(exact, abs=1.01e-4)
    assert abs(sum(means) / len(means) - exact) > 1e-3, "the test tells the two normalisations apart"


def test_packed_trainer_refuses_what_would_break_resume(packed, tmp_path):
    from transformers import TrainingArguments

    import wdspack
    from tiny_vlm import qwen2_5_vl
    from wdspack.errors import ConfigError
    from wdspack.train.trainers import PackedTrainer

    dataset, processor = packed
    proc = wdspack.load_processor(processor)
    model = qwen2_5_vl.model(proc, seed=0)
    loader = wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, processor=proc, seed=0)
    common = {"output_dir": str(tmp_path), "report_to": "none", "use_cpu": True}
    with pytest.raises(ConfigError, match="max_steps"):
        PackedTrainer(model=model, args=TrainingArguments(ignore_data_skip=True, **common), loader=loader)
    with pytest.raises(ConfigError, match="ignore_data_skip=True"):
        PackedTrainer(model=model, args=TrainingArguments(max_steps=2, **common), loader=loader)
    trainer = PackedTrainer(model=model, args=TrainingArguments(max_steps=2, ignore_data_skip=True, **common),
                            loader=loader)
    stream = trainer.get_train_dataloader()
    assert not hasattr(stream, "__len__") and not hasattr(stream, "set_epoch")
    with pytest.raises(ConfigError, match="no checkpoint"):
        trainer.train(resume_from_checkpoint=True)


def test_resume_refused_where_transformers_cannot_do_it(monkeypatch):
    """transformers 5.17's Trainer loads the optimizer state onto ``cpu:0`` on several CPU ranks, which torch
    cannot restore; PackedTrainer says so before loading anything. 5.18 and later, GPUs and one rank resume."""
    from types import SimpleNamespace

    import torch
    import transformers

    from wdspack.errors import ConfigError
    from wdspack.train.trainers import _check_resumable

    ranks = SimpleNamespace(world_size=2, device=torch.device("cpu", 0))
    monkeypatch.setattr(transformers, "__version__", "5.17.0")
    with pytest.raises(ConfigError, match=r"transformers 5\.17\.0's Trainer cannot resume a run of 2 CPU ranks.*"
                                          r"'cpu:0'.*transformers>=5\.18"):
        _check_resumable(ranks)
    _check_resumable(SimpleNamespace(world_size=1, device=torch.device("cpu")))
    _check_resumable(SimpleNamespace(world_size=2, device=torch.device("cuda", 0)))
    monkeypatch.setattr(transformers, "__version__", "5.18.0")
    _check_resumable(ranks)


def test_loader_state_files_round_trip(packed, tmp_path):
    import wdspack
    from wdspack.errors import ConfigError
    from wdspack.train.trainers import load_loader_state, save_loader_state, stream_batches

    dataset, processor = packed
    proc = wdspack.load_processor(processor)

    def make(rank):
        return wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, processor=proc, seed=0, rank=rank,
                                   world_size=2)

    loader = make(1)
    stream = stream_batches(loader)
    [next(stream) for _ in range(3)]  # mid-epoch 1
    path = save_loader_state(loader, tmp_path / "ck")
    assert path.name == "wdspack-loader-rank1.json" and [p.name for p in path.parent.iterdir()] == [path.name]
    after = [_ids(next(stream)) for _ in range(3)]
    again = make(1)
    load_loader_state(again, tmp_path / "ck")
    assert [_ids(b) for _, b in zip(range(3), stream_batches(again))] == after
    with pytest.raises(ConfigError, match="no loader state for rank 0"):
        load_loader_state(make(0), tmp_path / "ck")
