"""Make ``tests/data/checkpoints/``: loader states saved by an older wdspack, and the batches that follow them.

Issue #20 item 6: a loader checkpoint saved before the re-layout loads after it. This script is
run with the **old** code first on the path (5796b65, the last commit before #20 touched the
package; its modules were flat: ``wdspack/pipeline.py``, ``wdspack/loader/``), from the root of
the current checkout (it reads ``examples/`` from here, which the re-layout did not change)::

    git worktree add /tmp/oldtree 5796b65
    PYTHONPATH=/tmp/oldtree HF_HUB_OFFLINE=1 .venv/bin/python -m tools.make_checkpoint_fixture
    git worktree remove /tmp/oldtree

It generates the demo dataset (``examples/make_demo_data.py``: 150 records, seed 11) and packs it
as ``tests/conftest.py``'s ``demo_packed`` does (mistral_common's Pixtral tokenizer,
``examples/chat_templates/pixtral.jinja``, 16 ``[IMG]`` tokens per image, :data:`DEMO_PACK`);
then, per case of :data:`CASES`, it iterates ``make_loader(...)`` for ``after`` batches, saves
``state_dict()``, and records a digest of every batch that follows: the rest of that epoch and
the first :data:`NEXT_EPOCH_BATCHES` of the next. A fresh loader given the state must yield the
same batches (checked here too, where the layout is the same). One JSON file per case.

The state is JSON already (``PackedLoader.state_dict`` holds ints, strings and lists), so it is
stored as it is: no pickle, no ``torch.load``. Run with today's code instead of the old one, the
script writes the same states and digests (only ``made_by`` differs); what
``tests/loader/test_checkpoint_compat.py`` asserts is stronger: today's loader, given the old states,
yields the recorded batches.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "checkpoints"

#: The demo dataset: ``examples/make_demo_data.py``'s records and seed, as ``tests/conftest.py``'s ``demo_data``.
DEMO = {"records": 150, "seed": 11}
#: How ``demo_packed`` packs it (tests/conftest.py; ``max_drop_fraction`` keeps the deliberately bad records out).
DEMO_PACK = {"seq_len": 2048, "max_images": 6, "shard_max_bytes": 150_000, "records_per_partition": 40}
#: Batches recorded from the epoch after the one the state was saved in.
NEXT_EPOCH_BATCHES = 3

_ONE = {"batch_size": 2, "seed": 7, "shuffle": True, "text_only": True, "num_workers": 0}
_TWO = {**_ONE, "num_workers": 2}
_COST = {**_ONE, "balance": "cost"}
#: name -> the loader that saves the state, the batches it reads first, the loader that resumes.
CASES: dict[str, dict[str, Any]] = {
    "workers0": {"saved_with": _ONE, "after": 5, "resumed_with": _ONE},
    "workers2": {"saved_with": _TWO, "after": 5, "resumed_with": _TWO},
    # elastic: the rest of the saved epoch is dealt over the new layout (one process instead of two workers)
    "workers2-to-0": {"saved_with": _TWO, "after": 3, "resumed_with": _ONE},
    # balance="cost", the simple form issue #20 item 3 keeps; its options are part of the saved config
    "balance": {"saved_with": _COST, "after": 4, "resumed_with": _COST},
}


def batch_digest(batch: Mapping[str, Any]) -> dict[str, str]:
    """Per key of a batch, the first 16 hex digits of a sha256 over its dtype, shape and bytes
    (a tensor) or its JSON (anything else).

    Example:
        >>> import torch
        >>> batch_digest({"input_ids": torch.tensor([[1, 2]]), "max_seqlen": 2})["max_seqlen"]
        'd4735e3a265e16ee'
    """
    out = {}
    for key in sorted(batch):
        value, h = batch[key], hashlib.sha256()
        if hasattr(value, "numpy"):
            h.update(f"{value.dtype} {tuple(value.shape)} ".encode())
            h.update(value.contiguous().numpy().tobytes())
        else:
            h.update(json.dumps(value, sort_keys=True).encode())
        out[key] = h.hexdigest()[:16]
    return out


def following_batches(loader: Any, iterator: Iterator[Mapping[str, Any]] | None = None) -> list[dict[str, str]]:
    """Digests of the rest of the current epoch (from ``iterator``, or a new one) and of the first
    :data:`NEXT_EPOCH_BATCHES` batches of the next."""
    rest = [batch_digest(b) for b in (iter(loader) if iterator is None else iterator)]
    nxt = []
    for batch in loader:
        nxt.append(batch_digest(batch))
        if len(nxt) == NEXT_EPOCH_BATCHES:
            break
    return rest + nxt


def pack_demo(folder: Path) -> Path:
    """The demo dataset packed as ``demo_packed``, with whichever wdspack is on the path."""
    import mistral_common

    import wdspack

    spec = importlib.util.spec_from_file_location("make_demo_data", ROOT / "examples" / "make_demo_data.py")
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    generator.generate(folder / "demo", **DEMO)
    (folder / "tekken").mkdir()
    shutil.copyfile(Path(mistral_common.__file__).parent / "data" / "tekken_240911.json",
                    folder / "tekken" / "tekken.json")
    template = (ROOT / "examples" / "chat_templates" / "pixtral.jinja").read_text(encoding="utf-8")
    sample_config = wdspack.SampleConfig(tokenizer=str(folder / "tekken"), chat_template=template,
                                         tokens_per_image=16, image_token="[IMG]")
    if hasattr(wdspack, "RunOptions"):  # since #20 item 3, where the tasks run is its own record
        config = wdspack.PackConfig(**DEMO_PACK, run=wdspack.RunOptions(max_drop_fraction=1.0))
    else:
        config = wdspack.PackConfig(**DEMO_PACK, max_drop_fraction=1.0)
    sources = [str(folder / "demo" / "llava.jsonl"), str(folder / "demo" / "messages.jsonl")]
    wdspack.pack_dataset(sources, folder / "ds", sample_config=sample_config, config=config)
    return folder / "ds"


def record(dataset: Path, name: str, case: Mapping[str, Any]) -> dict[str, Any]:
    """Save the state of ``case`` and the digests of what follows it."""
    import wdspack

    loader = wdspack.make_loader(str(dataset), **case["saved_with"])
    it = iter(loader)
    for _ in range(case["after"]):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))  # a JSON round trip: what a checkpoint file holds
    if case["saved_with"] == case["resumed_with"]:
        expected = following_batches(loader, it)
        fresh = wdspack.make_loader(str(dataset), **case["resumed_with"])
        fresh.load_state_dict(state)
        assert following_batches(fresh) == expected, f"{name}: a resumed loader differs from the uninterrupted one"
    else:
        del it, loader  # the saving loader's workers go; the state is all that is left of it
        fresh = wdspack.make_loader(str(dataset), **case["resumed_with"])
        fresh.load_state_dict(state)
        expected = following_batches(fresh)
    return {"case": name, "made_by": _made_by(), "demo": DEMO, "demo_pack": DEMO_PACK,
            "saved_with": case["saved_with"], "after": case["after"], "resumed_with": case["resumed_with"],
            "state": state, "next_epoch_batches": NEXT_EPOCH_BATCHES, "following": expected}


def _made_by() -> str:
    import wdspack

    folder = Path(wdspack.__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return f"wdspack {wdspack.__version__} at {commit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT, help="where the JSON files go (default: %(default)s)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        dataset = pack_demo(Path(tmp))
        for name, case in CASES.items():
            path = args.out / f"{name}.json"
            path.write_text(json.dumps(record(dataset, name, case), indent=1, sort_keys=True) + "\n", encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


if __name__ == "__main__":
    main()
