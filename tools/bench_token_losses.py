"""Time ``wdspack.token_losses`` against the transposed layout it used before #20.

Before, the shifted logits went to ``cross_entropy`` as ``[R, V, T - 1]`` (a transpose of a slice),
which reads the vocabulary with a stride of ``T``; now they go as a flat ``[R * T, V]`` view. The
values agree to float rounding (the flat one is closer to a float64 reference).

    .venv/bin/python -m tools.bench_token_losses --rows 1 --seq-len 1024 --vocab 131072   # ~1 minute

On the 2-core dev machine (CPU, shared with other jobs, best of 3, two runs): float32 3.3-6.3 s ->
0.37-0.57 s, bfloat16 3.1-5.5 s -> 0.57-0.91 s; with ``--vocab 32768`` (~15 s) 1.0 s -> 0.15 s and
1.1 s -> 0.27 s.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from wdspack.loader.batch.collate import IGNORE_INDEX
from wdspack.train.loss import token_losses


def transposed_token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``token_losses`` as it was: cross entropy over ``[R, V, T - 1]``."""
    x = logits[:, :-1]
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    return F.pad(F.cross_entropy(x.transpose(1, 2), labels[:, 1:], ignore_index=IGNORE_INDEX, reduction="none"),
                 (0, 1))


def best_of(fn: Callable[..., torch.Tensor], *args: torch.Tensor, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=131072)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    logits32 = torch.randn(args.rows, args.seq_len, args.vocab, generator=gen)
    labels = torch.randint(0, args.vocab, (args.rows, args.seq_len), generator=gen)
    labels[:, ::7] = IGNORE_INDEX
    reference = token_losses(logits32.double(), labels)
    print(f"logits {args.rows} x {args.seq_len} x {args.vocab}, {torch.get_num_threads()} threads")
    for dtype in (torch.float32, torch.bfloat16):
        logits = logits32.to(dtype)
        before, after = transposed_token_losses(logits, labels), token_losses(logits, labels)
        assert before.dtype == after.dtype and before.shape == after.shape
        slow = best_of(transposed_token_losses, logits, labels, repeats=args.repeats)
        fast = best_of(token_losses, logits, labels, repeats=args.repeats)
        print(f"{dtype!s:15s} transposed {slow:6.2f} s   flat {fast:6.2f} s"
              f"   max|flat - transposed| {float((after - before).abs().max()):.2g}")
    errors = [float((fn(logits32, labels).double() - reference).abs().max())
              for fn in (transposed_token_losses, token_losses)]
    print(f"float32 max error against float64: transposed {errors[0]:.2g}, flat {errors[1]:.2g}")


if __name__ == "__main__":
    main()
