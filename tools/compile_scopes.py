"""What to compile (issue #41): ``torch.compile`` of the whole model against ``compile_decoder_layers``.

    python -m tools.compile_scopes                       # Qwen2.5-VL and LLaVA (~3 min on 2 CPU cores)
    python -m tools.compile_scopes qwen3_vl gemma3 --json out.json
    python -m tools.compile_scopes internvl             # any family of vlm_harness.ALL_FAMILIES

For each family (the tiny models and real processors of ``tests/support/vlm_harness.py``), an epoch of
one-pack batches whose contents differ (a text-only pack, packs of one to three images, a pack holding
one long sample; the first pack again at the end) goes forward and backward through two copies of the
model: one under ``torch.compile(model)``, one under
:func:`wdspack.models.compile.compile_decoder_layers`. Reported per scope: dynamo's graph count after
each step (a count that grows after the first step is a recompile), its graph breaks and their most
common reasons (the layers: one graph per kind of decoder layer, MiniCPM-V 4.6's linear- and full-attention
layers two). ``aot_eager``: dynamo and AOTAutograd decide graphs, breaks and recompiles as they do
for Inductor, without its code generation. What a compile buys in time is ``bench_train --compile``'s
subject.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

#: the families measured by default: one of each kind (Qwen's mRoPE and host-read grids, LLaVA's tiles)
DEFAULT_FAMILIES = ("qwen2_5_vl", "llava")


def epoch(name: str, work: Path) -> tuple[Any, list[dict]]:
    """The family's tiny model and its epoch of one-pack batches (test_compile's chats: with a long one)."""
    import wdspack
    from tests.support import vlm_harness as h

    processor, model, dataset = h.build_family(name, work / name, chats=h.with_a_long_chat)
    return model, list(wdspack.make_loader(str(dataset), batch_size=1, num_workers=0, shuffle=False,
                                           processor=processor))


def measure(model: Any, batches: list[dict], scope: str) -> dict[str, Any]:
    """Graphs after each step, graph breaks and their reasons, with ``scope`` ``model`` or ``layers`` compiled."""
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters

    import wdspack
    from wdspack.models.compile import compile_decoder_layers

    copied = copy.deepcopy(model)
    dynamo.reset()
    counters.clear()
    if scope == "model":
        compiled = torch.compile(copied, backend="aot_eager")
    else:
        compiled = compile_decoder_layers(copied, backend="aot_eager")
    graphs = []
    for batch in [*batches, batches[0]]:
        compiled(**wdspack.model_inputs(batch, copied)).loss.backward()
        graphs.append(int(counters["stats"]["unique_graphs"]))
    reasons = collections.Counter()
    for reason, n in counters["graph_break"].items():
        reasons[reason.splitlines()[0][:100]] += n
    return {"graphs_after_each_step": graphs, "recompiles_after_first_step": graphs[-1] - graphs[0],
            "graph_breaks": sum(reasons.values()), "break_reasons": dict(reasons.most_common(4))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("families", nargs="*", default=list(DEFAULT_FAMILIES),
                    help=f"tests/support/vlm_harness.py ALL_FAMILIES names (default {' '.join(DEFAULT_FAMILIES)})")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    out: dict[str, Any] = {"torch": torch.__version__, "backend": "aot_eager", "families": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.families:
            model, batches = epoch(name, Path(tmp))
            out["families"][name] = {"packs": len(batches),
                                     **{scope: measure(model, batches, scope) for scope in ("model", "layers")}}
            row = out["families"][name]
            print(f"{name}: {row['packs']} packs; whole model: graphs {row['model']['graphs_after_each_step']}, "
                  f"{row['model']['graph_breaks']} breaks; decoder layers: graphs "
                  f"{row['layers']['graphs_after_each_step']}, {row['layers']['graph_breaks']} breaks", flush=True)
    text = json.dumps(out, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
