"""The dataset card ``wdspack upload`` writes: its loading example runs as written and gives exactly the
batch the card states (issue #38, item 7); a failed upload leaves the dataset folder as it was."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from wdspack.cli import main
from wdspack.ops.inspect import dataset_stats
from wdspack.ops.upload import dataset_card, load_example

ROOT = Path(__file__).resolve().parents[2]
REPO_URL = '"hf://datasets/org/name"'


def _card(root: Path) -> str:
    return dataset_card(dataset_stats(str(root), deep=True), "org/name", example=load_example(root))


def _python_block(card: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", card, flags=re.S)
    assert len(blocks) == 1, card
    return blocks[0]


def _stated_batch(card: str) -> dict[str, tuple[list[int] | None, str]]:
    """``key -> (shape, dtype)`` from the card's table of the batch."""
    rows = re.findall(r"^\| `(\w+)` \| (\[[\d, ]*\]|-) \| (\w+) \|$", card, flags=re.M)
    assert rows, card
    return {k: (None if shape == "-" else [int(x) for x in re.findall(r"\d+", shape)], dtype)
            for k, shape, dtype in rows}


def _run(code: str, **names) -> tuple[dict, list[str]]:
    """Execute the card's code; its namespace and printed lines."""
    out = io.StringIO()
    space = dict(names)
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<card>", "exec"), space)
    return space, out.getvalue().splitlines()


def _check_runs_as_stated(card: str, code: str, **names) -> dict:
    stated = _stated_batch(card)
    space, printed = _run(code, **names)
    batch = space["batch"]
    assert list(batch) == list(stated)
    for key, value in batch.items():
        shape, dtype = stated[key]
        if shape is None:
            assert not hasattr(value, "shape") and type(value).__name__ == dtype, key
        else:
            assert list(value.shape) == shape and str(value.dtype) == f"torch.{dtype}", key
    assert printed == [f"{k} {tuple(v.shape) if hasattr(v, 'shape') else v}" for k, v in batch.items()]
    return batch


def test_the_card_of_a_tokenizer_packed_dataset_runs_as_written(demo_packed):
    root = demo_packed[0]
    card = _card(root)
    code = _python_block(card)
    assert code.count(REPO_URL) == 1 and "image_transform=wdspack.make_image_transform(size=224)" in code
    assert "processor=" not in code and "16 tokens per image" in card
    batch = _check_runs_as_stated(card, code.replace(REPO_URL, repr(str(root))))
    B = int(re.search(r"batch_size=(\d+)", code).group(1))
    assert batch["input_ids"].shape == (B, 2048) and batch["pixel_values"].shape == (B * 6, 3, 224, 224)
    assert "up to 2048 tokens and 6 images" in card and re.search(r"\| packs \| \d+ in \d+ shards \(", card)


@pytest.mark.slow  # Qwen2.5-VL's processor
def test_the_card_of_a_processor_packed_dataset_runs_as_written(tmp_path_factory):
    """The card names the processor it was packed with; given as the card says (here the loaded object),
    the example gives the family's keys at the shapes the card states."""
    from tests.support import vlm_harness as h
    from tiny_vlm import qwen2_5_vl

    folder = tmp_path_factory.mktemp("qwen-card")
    processor = qwen2_5_vl.processor(folder / "tok")
    root = h.pack_chats(folder, processor, seq_len=96)
    card = _card(root)
    code = _python_block(card)
    named = f'processor="{folder / "processor"}"'
    assert code.count(REPO_URL) == 1 and code.count(named) == 1 and "image_transform" not in code, code
    assert "Packed with the qwen2_5_vl processor" in card and "the loaded processor object" in card
    code = code.replace(REPO_URL, repr(str(root))).replace(named, "processor=processor")
    batch = _check_runs_as_stated(card, code, processor=processor)
    assert {"pixel_values", "image_grid_thw", "patch_mask"} <= set(batch) and batch["input_ids"].shape[1] == 96


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listing(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(root.rglob("*"))}


def test_a_failed_upload_leaves_the_dataset_folder_as_it_was(demo_packed, tmp_path):
    """An unreachable Hub: one line, a failing exit code, and not a byte written into the folder (the card and
    plot are made in a temp folder and copied beside the dataset only once the upload went through)."""
    root = tmp_path / "ds"
    shutil.copytree(demo_packed[0], root)
    before = _listing(root)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_HUB_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{_closed_port()}", HF_TOKEN="hf_not_a_real_token",
               HF_HOME=str(tmp_path / "hf-home"))  # huggingface_hub reads them when imported: a new process
    run = subprocess.run([sys.executable, "-m", "wdspack", "upload", str(root), "org/name"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    lines = run.stderr.strip().splitlines()
    assert run.returncode != 0 and len(lines) == 1, run.stderr
    assert lines[0].startswith("wdspack upload: error: upload to datasets/org/name failed: ") and "re-run" in lines[0]
    assert "hf_not_a_real_token" not in run.stderr + run.stdout
    assert _listing(root) == before


@pytest.mark.parametrize("repo_id, says", [("org/not a repo", "is not a Hub repository name"),
                                           ("a/b/c", "is not a Hub repository name"),
                                           ("llava-packed", "names no owner")])
def test_an_invalid_repo_id_is_answered_before_anything_is_made(demo_packed, tmp_path, capsys, repo_id, says):
    root = tmp_path / "ds"
    shutil.copytree(demo_packed[0], root)
    before = _listing(root)
    assert main(["upload", str(root), repo_id]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "ORG/NAME" in err[0], err
    assert _listing(root) == before
