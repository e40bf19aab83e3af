"""Exact loss normalisation: the token mean (and the per-sample mean) of one optimizer step is the
same with 2 ranks × 2 accumulation steps as in one process over the same 4 batches.

Two real ranks (gloo on loopback) train a tiny ``transformers`` Llama under DDP in float64; each
takes two micro-batches from ``make_loader``, divides its summed token losses by
``wdspack.num_items_in_batch`` (every rank, every micro-batch) and scales by the world size (DDP
averages gradients). The test process then runs the same 4 batches one after another and compares
every parameter's gradient.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.ranks import free_port, run_all
from tests.support.synthetic import write_dataset
from wdspack.loader.batch.collate import collate_packs, pack_to_example
from wdspack.train.loss import num_items_in_batch, num_samples_in_batch, token_losses

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 1100  # synthetic ids are < 1000, pack markers 1000 + pack number

MODEL = r"""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

def tiny_llama():
    config = LlamaConfig(vocab_size=1100, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return LlamaForCausalLM(config).to(torch.float64).eval()
"""

RANK_SCRIPT = MODEL + r"""
import sys
from contextlib import nullcontext
import numpy as np
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import wdspack
from wdspack.train.loss import num_items_in_batch, num_samples_in_batch, sample_mean_loss, token_losses

root, port, rank, out, mode = sys.argv[1:6]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=int(rank), world_size=2)
model = tiny_llama()
ddp = DDP(model)
loader = wdspack.make_loader(root, batch_size=1, num_workers=0, shuffle=False)
micro = [b for _, b in zip(range(2), loader)]
world = dist.get_world_size()
n = num_items_in_batch(micro) if mode == "token" else num_samples_in_batch(micro)
own = []
for i, b in enumerate(micro):
    with ddp.no_sync() if i == 0 else nullcontext():
        out_ = ddp(input_ids=b["input_ids"], position_ids=b["position_ids"], use_cache=False,
                   labels=b["labels"], num_items_in_batch=n if mode == "token" else None)
        if mode == "token":
            loss = token_losses(out_.logits, b["labels"]).sum() / n
            own.append(float(out_.loss) - float(loss))  # transformers' own (float32) loss, same convention
        else:
            loss = sample_mean_loss(out_.logits, b, n)
        (loss * world).backward()
np.savez(out, n=int(n), own=np.array(own), **{f"grad{k}": p.grad.numpy() for k, p in enumerate(model.parameters())},
         **{f"{key}{i}": b[key].numpy() for i, b in enumerate(micro)
            for key in ("input_ids", "labels", "position_ids", "seq_idx")})
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("loss-dist")
    write_dataset(root, shards=2, packs_per_shard=4, seq_len=64, max_images=0, seed=7)
    return root


def _run_ranks(root: Path, tmp_path: Path, mode: str) -> list[dict]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    outs = [tmp_path / f"{mode}{r}.npz" for r in range(2)]
    run_all([[sys.executable, "-c", RANK_SCRIPT, str(root), str(port), str(r), str(outs[r]), mode] for r in range(2)],
            env=env, timeout=240)
    return [dict(np.load(o)) for o in outs]


def _tiny_llama():
    scope: dict = {}
    exec(MODEL, scope)  # the very model the ranks build
    return scope["tiny_llama"]()


def _batches(ranks: list[dict]) -> list[dict[str, torch.Tensor]]:
    return [{key: torch.from_numpy(r[f"{key}{i}"]) for key in ("input_ids", "labels", "position_ids", "seq_idx")}
            for r in ranks for i in range(2)]


def _grads(model) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.slow  # two rank processes (gloo)
@pytest.mark.parametrize("mode", ["token", "sample"])
def test_two_ranks_two_accumulation_steps_equal_one_process(dataset, tmp_path, mode):
    ranks = _run_ranks(dataset, tmp_path, mode)
    batches = _batches(ranks)
    assert len({b["input_ids"][0, 0].item() for b in batches}) == 4, "four different packs"
    targets = [int((b["labels"] != -100).sum()) for b in batches]
    assert len(set(targets)) > 1, "the packs carry different numbers of targets (else any mean would do)"

    model = _tiny_llama()
    model.zero_grad()
    if mode == "token":
        assert int(ranks[0]["n"]) == int(ranks[1]["n"]) == sum(targets)
        total = sum(token_losses(model(input_ids=b["input_ids"], position_ids=b["position_ids"],
                                       use_cache=False).logits, b["labels"]).sum() for b in batches)
        (total / sum(targets)).backward()
        assert np.abs(np.concatenate([r["own"] for r in ranks])).max() < 1e-5  # transformers' num_items_in_batch
    else:
        # Independently: every sub-sample's mean token loss, averaged over all sub-samples of the step.
        means = []
        for b in batches:
            losses = token_losses(model(input_ids=b["input_ids"], position_ids=b["position_ids"],
                                        use_cache=False).logits, b["labels"])[0]
            owner, target = b["seq_idx"][0].roll(-1), (b["labels"][0] != -100).roll(-1)
            means += [losses[target & (owner == s)].mean() for s in owner[target].unique().tolist()]
        assert int(ranks[0]["n"]) == len(means)
        (sum(means) / len(means)).backward()
    for k, want in enumerate(_grads(model)):
        for r in ranks:
            np.testing.assert_allclose(r[f"grad{k}"], want.numpy(), rtol=1e-9, atol=1e-12)


def test_naive_per_batch_means_are_not_the_token_mean(dataset, tmp_path):
    """The check above can fail: averaging per-micro-batch means gives other gradients."""
    model = _tiny_llama()
    loader_batches = []
    import wdspack

    for b in wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, shuffle=False):
        loader_batches.append(b)
        if len(loader_batches) == 4:
            break
    losses = [token_losses(model(input_ids=b["input_ids"], position_ids=b["position_ids"], use_cache=False).logits,
                           b["labels"]).sum() for b in loader_batches]
    counts = [int((b["labels"] != -100).sum()) for b in loader_batches]
    exact = sum(losses) / sum(counts)
    naive = sum(loss / c for loss, c in zip(losses, counts)) / len(counts)
    assert not torch.allclose(exact, naive, rtol=1e-6)


def test_batches_carry_target_counts_per_pack_and_segment(dataset):
    import wdspack

    loader = wdspack.make_loader(str(dataset), batch_size=2, num_workers=0, shuffle=False)
    for b in loader:
        targets = b["labels"] != -100
        assert b["num_targets"].tolist() == targets.sum(dim=1).tolist()
        assert int(b["segment_targets"].sum()) == int(targets.sum()) == int(num_items_in_batch([b]))
        assert b["segment_targets"].shape[0] == b["cu_seqlens"].shape[0] - 1
        seg = torch.repeat_interleave(torch.arange(b["cu_seqlens"].shape[0] - 1), torch.diff(b["cu_seqlens"]))
        per_segment = torch.bincount(seg[targets.reshape(-1)], minlength=b["segment_targets"].shape[0])
        assert torch.equal(per_segment, b["segment_targets"])
        assert int(num_samples_in_batch([b])) == int((b["segment_targets"] > 0).sum())


def test_segment_targets_follow_cu_seqlens_padded_and_padding_free(dataset):
    import tarfile

    from wdspack.format.pack import decode_pack

    with tarfile.open(next(dataset.glob("*.tar"))) as tar:
        packs = [decode_pack(tar.extractfile(m).read()) for m in tar.getmembers()[:3]]
    per_sample = []  # targets of each sub-sample: its loss mask without its first token
    for p in packs:
        starts = np.cumsum((0,) + p.seq_lens)
        per_sample.append([int(p.loss_mask[a + 1:b].sum()) for a, b in itertools.pairwise(starts)])
    examples = [pack_to_example(p, seq_len=64, max_images=0, pad_token_id=0) for p in packs]
    plain = collate_packs(examples, max_segments=16)
    free = collate_packs(examples, padding_free=True, max_segments=16)
    want_plain = [x for p, counts in zip(packs, per_sample) for x in counts + ([0] if p.num_tokens < 64 else [])]
    want_free = [x for counts in per_sample for x in counts] + [0]  # one padding segment at the end
    assert plain["segment_targets"].tolist() == want_plain + [0] * (16 - len(want_plain))
    assert free["segment_targets"].tolist() == want_free + [0] * (16 - len(want_free))
    assert plain["num_targets"].tolist() == free["num_targets"].tolist() == [sum(c) for c in per_sample]
