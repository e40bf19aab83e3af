"""Loaders over the three synthetic sources ``a``, ``b``, ``c`` and what their batches read, pass by pass.

Every pack's first token is 1000 + its row in its dataset (``synthetic.write_mixture_sources``), so a
batch tells which pack of which source each row is; the pass of each pack comes from the schedule the
loader follows (``planned``), checked against the batches (``with_passes``). Used by the mixture tests
(``tests/loader/mixture/``): continuations, elastic resume, balance.
"""

from __future__ import annotations

from collections import defaultdict

from tests.support.synthetic import MIXTURE_COUNTS, pack_numbers
from wdspack.loader import make_loader

__all__ = ["COUNTS", "M1", "OPTIONS", "check_passes", "mixture_loader", "planned", "read_batches", "with_passes"]

COUNTS = MIXTURE_COUNTS
OPTIONS = dict(batch_size=2, shuffle_buffer=9, seed=3, text_only=True)
M1 = {"a": 0.5, "b": 0.3, "c": 0.2}


def mixture_loader(roots, weights, *, workers, rank=0, world=1):
    return make_loader([(str(roots / n), w) for n, w in weights.items()], num_workers=workers, rank=rank,
                       world_size=world, **OPTIONS)


def planned(loader, epoch: int) -> dict[int, list[tuple[str, int, int]]]:
    """Rank batch index -> its packs as (source name, pass, row), from the mixture's schedule of ``epoch``
    (the continuation's, when one began inside it), in the order the DataLoader yields them."""
    ds, b = loader.dataset, loader.batch_size
    mix, w_ = ds.mixture, max(1, loader.num_workers)
    slots = ds.world_size * w_
    per = mix.per_slot(slots, b, epoch)
    continuation = mix.continuation()
    before = continuation.before if mix.mid_continuation(epoch) else [0] * w_
    plans = {w: mix.schedule(slot=ds.rank * w_ + w, slots=slots, workers=w_, epoch=epoch, positions=per - before[w],
                             batch_size=b, seed=ds.seed, shuffle=ds.shuffle, shuffle_buffer=ds.shuffle_buffer)
             for w in range(w_)}
    taken = dict.fromkeys(range(w_), 0)
    first = sum(before) // b
    out = {}
    for t in range(first, w_ * per // b):
        w = t % w_
        p, k = plans[w], taken[w]
        out[t] = [(mix.names[int(p.source[i])], int(p.pass_no[i]), int(p.row[i])) for i in range(k, k + b)]
        taken[w] = k + b
    return out


def read_batches(loader, n: int | None = None) -> list[tuple[int, int, list[tuple[str, int]]]]:
    """(epoch, batch index, [(source name, row)]) of the next ``n`` batches (default: to the epoch's end)."""
    out = []
    epoch, t = loader.epoch, loader._batches
    for batch in loader:
        names = [loader.source_names[s] for s in batch["source_idx"].tolist()]
        out.append((epoch, t, list(zip(names, pack_numbers(batch["input_ids"])))))
        t += 1
        if loader.epoch != epoch:  # that was the epoch's last batch
            if n is None:
                break
            epoch, t = loader.epoch, 0
        if n is not None and len(out) == n:
            break
    return out


def with_passes(loader, got) -> list[tuple[str, int, int]]:
    """The batches ``got`` as (source, pass, row), checked against the loader's schedule."""
    out = []
    plans: dict[int, dict] = {}
    for epoch, t, rows in got:
        plan = plans.setdefault(epoch, planned(loader, epoch))[t]
        assert [(s, r) for s, _, r in plan] == rows, (epoch, t)
        out += plan
    return out


def check_passes(packs: list[tuple[str, int, int]], sources=("a", "b", "c")) -> None:
    """Within every pass of every source no pack twice; every pass before the last two of a source whole."""
    seen: dict[tuple[str, int], list[int]] = defaultdict(list)
    for s, p, r in packs:
        seen[s, p].append(r)
    for (s, p), rows in seen.items():
        assert len(rows) == len(set(rows)), f"source {s} pass {p} read a pack twice"
        last = max(q for (t, q) in seen if t == s)
        if p < last - 1:
            assert sorted(rows) == list(range(sum(COUNTS[s]))), f"source {s} pass {p} skipped packs"
    assert {s for s, _ in seen} <= set(sources)
