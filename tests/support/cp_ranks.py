"""One rank of the context-parallel exactness runs (``tests/train/test_cp_exact.py`` starts four at once).

``python -m tests.support.cp_ranks SPEC.json RANK`` joins a gloo group of ``world`` ranks, runs the attention
cases, imports the model classes of ``preload`` and waits for the spec's ``families`` file (the test writes it
once the models and batches are saved: the ranks start meanwhile), then runs every family's cases, writing
``out/<case>-rank<R>.npz`` (the loss sum over this rank's targets, its target count and, after the gradients'
all-reduce, a digest of every parameter's gradient; rank 0 also the gradients). Cases:

- ``attention``: random queries, keys and values over segments some shorter than ``2·cp``, through
  :func:`~wdspack.train.cp_attention.cp_attention` (SDPA with the mask, on CPU) and through the varlen path over
  the reference kernel (``varlen_`` outputs), output and gradients gathered back to the unsplit order;
- ``<family>-cp2`` / ``<family>-cp4`` / ``<family>-cp4-varlen``: a family's model (``save_pretrained`` in float64)
  on one loader batch (every pack), split over 2 ranks (each pair of ranks a CP group) or the 4 ranks, under
  :func:`~wdspack.train.cp_attention.cp_attention` / the varlen path
  over :func:`~wdspack.models.varlen.reference_varlen_attn`;
- ``<family>-dpcp``: 2 DP × 2 CP, each DP rank its own loader batches (one pack each), the step's target count
  from :func:`wdspack.num_items_in_batch` over the DP group.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

import wdspack
from wdspack.models.varlen import reference_varlen_attn
from wdspack.train.cp import cp_layout, split_tokens
from wdspack.train.cp_attention import (
    CP_LAYOUT_KEY,
    all_reduce_gradients,
    context_parallel,
    cp_attention,
    cp_varlen_attention,
    use_cp_attention,
)


def groups(world: int, cp: int) -> tuple[Any, Any]:
    """This rank's CP group (consecutive ranks) and DP group (the same CP rank of every CP group); every rank
    creates every group, as ``new_group`` asks."""
    rank = dist.get_rank()
    cp_group = dp_group = None
    for start in range(0, world, cp):
        g = dist.new_group(list(range(start, start + cp)))
        if start <= rank < start + cp:
            cp_group = g
    for r in range(cp):
        g = dist.new_group(list(range(r, world, cp)))
        if rank % cp == r:
            dp_group = g
    return cp_group, dp_group


def attention_case(cp: int, group: Any) -> dict[str, np.ndarray]:
    """CP attention (both paths) against per-segment SDPA on the unsplit tokens; returns the gathered outputs and
    gradients (the varlen path's with a ``varlen_`` prefix)."""
    lens = [3, 13, 1, 7, 16]  # 3, 1 and 7 are shorter than 2·cp for cp = 4
    gen = torch.Generator().manual_seed(7)
    N, H, Hkv, D = sum(lens), 4, 2, 8
    q, k, v = (torch.randn(N, h, D, generator=gen, dtype=torch.float64) for h in (H, Hkv, Hkv))
    rank = dist.get_rank(group)
    layout = cp_layout(lens, cp=cp, rank=rank, group=group)

    class Layer(torch.nn.Module):
        is_causal = True

    real = (layout.source[layout.index] >= 0)[None, :, None, None]  # padding has no loss: no weight
    src = layout.source[layout.index]
    found: dict[str, np.ndarray] = {}
    for prefix, attend in (("", cp_attention), ("varlen_", cp_varlen_attention(reference_varlen_attn))):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        share = [split_tokens(t.transpose(0, 1)[None], layout, dim=2) for t in leaves]  # [1, h, n, D]
        out, _ = attend(Layer(), *share, scaling=0.3, **{CP_LAYOUT_KEY: layout})
        weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(100 + rank), dtype=torch.float64)
        (out * weight * real).sum().backward()
        found |= {f"{prefix}out": out[0][src >= 0].detach().numpy(),
                  **{f"{prefix}grad_{n}": _all_reduced(t.grad, group).numpy() for n, t in zip("qkv", leaves)}}
    # the same on the unsplit tokens, with every rank's weights put back at their tokens
    cu = torch.tensor([0, *np.cumsum(lens)], dtype=torch.int32)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = reference_varlen_attn(*ref_leaves, cu, cu, max(lens), max(lens), scale=0.3, window_size=(-1, 0),
                                enable_gqa=True)
    full_w = torch.zeros_like(ref)
    for r in range(cp):
        lay = cp_layout(lens, cp=cp, rank=r)
        w = torch.randn((1, lay.index.numel(), H, D), generator=torch.Generator().manual_seed(100 + r),
                        dtype=torch.float64)[0]
        src_r = lay.source[lay.index]
        full_w[src_r[src_r >= 0]] = w[src_r >= 0]
    (ref * full_w).sum().backward()
    return {**found, "want_out": ref[src[src >= 0]].detach().numpy(),
            **{f"want_grad_{n}": t.grad.numpy() for n, t in zip("qkv", ref_leaves)}}


def _all_reduced(x: torch.Tensor, group: Any) -> torch.Tensor:
    x = x.clone()
    dist.all_reduce(x, group=group)
    return x


def model_step(model: Any, batches: list[dict], *, cp: int, group: Any) -> torch.Tensor:
    """This rank's CP loss sum over ``batches`` (each micro-batch split) and its backward. The sum, not
    ``loss / N``: the models' RMS norms cast to float32 (``.to(torch.float32)`` even in a float64 model) and
    round the gradient there, so a ``1 / N`` scale before the backward moves it by ~1e-7 relative; the
    harness's reference sums as well, and the test divides both by ``N``."""
    total = torch.zeros((), dtype=torch.float64)
    for batch in batches:
        layout = cp_layout(batch["cu_seqlens"], cp=cp, rank=dist.get_rank(group), group=group, cu_seqlens=True)
        kwargs = wdspack.model_inputs(batch, model)
        with context_parallel(model, layout) as share:
            logits = model(**kwargs).logits
        loss = F.cross_entropy(logits[0].double(), share.labels[0], ignore_index=-100, reduction="sum")
        loss.backward()
        total += loss.detach()
    return total


def main(spec_path: str, rank_arg: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    rank, world, out = int(rank_arg), int(spec["world"]), Path(spec["out"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{spec['port']}", rank=rank, world_size=world)
    made = {cp: groups(world, cp) for cp in (2, 4)}
    for cp in (2, 4):
        np.savez(out / f"attention-cp{cp}-rank{rank}.npz", **attention_case(cp, made[cp][0]))
    from transformers import AutoModelForImageTextToText

    for name in spec["preload"]:
        importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    for fam in _wait_for(Path(spec["families"])):
        model = AutoModelForImageTextToText.from_pretrained(fam["model"], dtype=torch.float64)
        batches = torch.load(fam["batches"], weights_only=False)
        for case in fam["cases"]:
            use_cp_attention(model, kernel=reference_varlen_attn if case.endswith("-varlen") else None)
            model.zero_grad()
            if case.startswith("cp"):  # cp2 (two CP groups of 2 ranks, each the whole batch) or cp4
                cp = int(case[2])
                loss = model_step(model, batches["whole"], cp=cp, group=made[cp][0])
                all_reduce_gradients(model, made[cp][0])
                n = batches["count"]
            else:  # dpcp: 2 DP x 2 CP, each DP rank its own packs; the step's target count from the exact-loss helper
                cp_group, dp_group = made[2]
                mine = batches["dp"][rank // 2]
                n = wdspack.num_items_in_batch(mine, group=dp_group)
                loss = model_step(model, mine, cp=2, group=cp_group)
                all_reduce_gradients(model)  # DP x CP: every rank
            _save(out / f"{fam['name']}-{case}-rank{rank}.npz", model, loss, n, rank=rank)
    dist.destroy_process_group()


def _wait_for(path: Path, timeout: float = 600.0) -> list[dict]:
    """The families the test writes to ``path`` (atomically) once their models and batches are saved."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path} after {timeout:.0f} s: the test did not get its models ready")
        time.sleep(0.05)
    return json.loads(path.read_text())


def _save(path: Path, model: Any, loss: torch.Tensor, n: torch.Tensor | int, *, rank: int) -> None:
    """The loss sum, the target count and a digest of every gradient's bytes; rank 0 also the gradients (the
    all-reduce leaves them equal on every rank, which the digests show: the tiny models' float64 embedding
    gradients are tens of MB, written once)."""
    grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).numpy() for p in model.parameters()]
    digest = hashlib.sha256()
    for g in grads:
        digest.update(np.ascontiguousarray(g).tobytes())
    np.savez(path, loss=loss.numpy(), n=np.asarray(int(n)), digest=np.asarray(digest.hexdigest()),
             **({f"grad{k}": g for k, g in enumerate(grads)} if rank == 0 else {}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
