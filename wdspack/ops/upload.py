"""Publish a packed dataset to the Hugging Face Hub (``wdspack upload``).

Resumable: the files already on the Hub with the same size and sha256 are skipped, so a broken
upload re-run sends only what is missing. Shards go first, in commits of a few files each; the
dataset card, the stats plot, ``dropped.jsonl`` and ``manifest.json`` go last, so a reader never
sees a manifest that lists shards the repo does not have yet.

The token comes from ``token=`` or the usual places (``HF_TOKEN``, ``hf auth login``)
and is handed to ``huggingface_hub`` only: it never reaches logs, errors or the manifest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ManifestError, OutputError, WdspackError
from ..format.manifest import MANIFEST_NAME, read_manifest
from .inspect import dataset_stats, plot_stats

__all__ = ["dataset_card", "upload_dataset"]

PLOT_NAME = "wdspack_stats.png"
CARD_NAME = "README.md"


def upload_dataset(root: str | Path, repo_id: str, *, private: bool = False, revision: str | None = None,
                   token: str | None = None, api: Any = None, files_per_commit: int = 20,
                   log: Callable[[str], None] = print) -> dict[str, int]:
    """Upload a local packed dataset to ``datasets/{repo_id}``; returns counts of uploaded / skipped files.

    Args:
        root: the local dataset folder (with ``manifest.json``).
        repo_id: ``ORG/NAME``.
        private: create the repo private.
        revision: branch to commit to (default: the repo's default branch).
        token: a Hub token; default: ``HF_TOKEN`` or the stored login.
        api: an ``huggingface_hub.HfApi``-like client (tests inject one).
        files_per_commit: shards per commit.
        log: where progress lines go (never the token).

    Example:
        >>> upload_dataset("packed/", "my-org/llava-packed-4096")  # doctest: +SKIP
        {'uploaded': 9, 'skipped': 0}
    """
    from huggingface_hub import CommitOperationAdd, HfApi

    root = Path(root)
    manifest = read_manifest(root)
    _check_complete(root, manifest)
    api = api or HfApi(token=token)
    _, plot = _write_card(root, repo_id, revision)
    try:
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        if revision:
            api.create_branch(repo_id, repo_type="dataset", branch=revision, exist_ok=True)
        remote = _remote_files(api, repo_id, revision)
        shards = [s.name for s in manifest.shards]
        index = manifest.pack_index.get("file")
        tail = [p for p in (plot, CARD_NAME, manifest.dropped_file, index, MANIFEST_NAME) if p]
        todo = [n for n in shards + tail if not _same(root / n, remote.get(n))]
        skipped = len(shards) + len(tail) - len(todo)
        todo_shards = [n for n in todo if n in shards]
        for start in range(0, len(todo_shards), files_per_commit):
            batch = todo_shards[start:start + files_per_commit]
            api.create_commit(repo_id, [CommitOperationAdd(n, str(root / n)) for n in batch], repo_type="dataset",
                              revision=revision, commit_message=f"wdspack: shards {batch[0]} … {batch[-1]}")
            log(f"uploaded {start + len(batch)}/{len(todo_shards)} shards")
        todo_tail = [n for n in todo if n not in shards]
        if todo_tail:
            api.create_commit(repo_id, [CommitOperationAdd(n, str(root / n)) for n in todo_tail],
                              repo_type="dataset", revision=revision,
                              commit_message="wdspack: manifest, dataset card and stats")
    except WdspackError:
        raise
    except Exception as e:  # huggingface_hub's errors; their text never holds the token
        raise OutputError(f"upload to datasets/{repo_id} failed: {type(e).__name__}: {_scrub(str(e), token)}; "
                          "re-run the same command to upload what is missing") from None
    log(f"datasets/{repo_id}: {len(todo)} files uploaded, {skipped} already there")
    return {"uploaded": len(todo), "skipped": skipped}


def _check_complete(root: Path, manifest) -> None:
    """Refuse, before anything is sent, a folder that lacks a file its manifest names.

    Found mid-upload instead, the missing file stopped the upload after the shards were committed,
    with huggingface_hub's "not a file" error and advice to re-run, which can never succeed.
    """
    names = [s.name for s in manifest.shards]
    names += [n for n in (manifest.dropped_file, manifest.pack_index.get("file")) if n]
    missing = [n for n in names if not (root / n).is_file()]
    if missing:
        raise ManifestError(f"{root / missing[0]} is named by {root / MANIFEST_NAME} but does not exist "
                            f"({len(missing)} such files); the dataset folder is incomplete, nothing was uploaded: "
                            "restore the files or pack the dataset again, and check it with `wdspack verify`")


def _remote_files(api: Any, repo_id: str, revision: str | None) -> dict[str, tuple[int, str, str]]:
    """``name -> (size, kind, digest)`` of the files at the repo root: the LFS sha256 where the
    file is in LFS, else the git blob id."""
    out = {}
    for entry in api.list_repo_tree(repo_id, repo_type="dataset", revision=revision):
        size = getattr(entry, "size", None)
        if size is None:  # a folder
            continue
        lfs = getattr(entry, "lfs", None)
        sha = (lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)) if lfs else None
        out[entry.path] = (size, "sha256", sha) if sha else (size, "git", getattr(entry, "blob_id", ""))
    return out


def _same(path: Path, remote: tuple[int, str, str] | None) -> bool:
    """Whether the remote file has exactly this file's bytes."""
    if remote is None or not path.exists() or path.stat().st_size != remote[0]:
        return False
    size, kind, digest = remote
    if kind == "sha256":
        return _digest(path, hashlib.sha256()) == digest
    return _digest(path, hashlib.sha1(f"blob {size}\0".encode())) == digest  # git's blob id


def _digest(path: Path, h) -> str:
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _scrub(text: str, token: str | None) -> str:
    import os

    for secret in (token, os.environ.get("HF_TOKEN")):
        if secret:
            text = text.replace(secret, "***")
    return text


def _write_card(root: Path, repo_id: str, revision: str | None) -> tuple[Path, str | None]:
    """Write ``README.md`` (and the stats plot when matplotlib is there) into the dataset folder."""
    stats = dataset_stats(str(root), deep=True)
    plot: str | None = PLOT_NAME
    try:
        plot_stats(stats, str(root / PLOT_NAME))
    except ImportError:
        plot = None
    card = root / CARD_NAME
    card.write_text(dataset_card(stats, repo_id, revision=revision, plot=plot), encoding="utf-8")
    return card, plot


def dataset_card(stats: dict[str, Any], repo_id: str, *, revision: str | None = None,
                 plot: str | None = PLOT_NAME) -> str:
    """The dataset card: YAML metadata, packing statistics, the plot, and a loading snippet.

    Example:
        >>> dataset_card(dataset_stats("packed/", deep=True), "org/name").startswith("---")  # doctest: +SKIP
        True
    """
    rev = f"@{revision}" if revision else ""
    pp = stats.get("per_pack", {})
    dropped = "\n".join(f"| {k} | {v} |" for k, v in stats["dropped_by_reason"].items()) or "| none | 0 |"
    lines = [
        "---",
        "tags:", "- wdspack", "- webdataset", "- packed", "- vision-language",
        "configs:", "- config_name: default", "  data_files:", "  - split: train", "    path: train-*.tar",
        "---",
        f"# {repo_id}",
        "",
        f"Pre-packed with [wdspack](https://pypi.org/project/wdspack/): every record is a pack of "
        f"up to {stats['seq_len']} tokens and {stats['max_images']} images, planned with "
        f"`{stats['algorithm']}`; tokenized with `{stats['tokenizer']}`.",
        "",
        "| | |", "|---|---|",
        f"| packs | {stats['packs']} in {stats['shards']} shard{'s' * (stats['shards'] != 1)} "
        f"({stats['bytes'] / 1e6:.1f} MB) |",
        f"| samples | {stats['samples']} packed of {stats['samples_read']} read |",
        f"| tokens | {stats['tokens']} |",
        f"| images | {stats['images']} |",
        f"| fill ratio | {stats['fill_ratio']:.2%} |",
    ]
    if pp:
        lines += [
            f"| samples per pack | mean {pp['samples']['mean']:.1f}, max {pp['samples']['max']} |",
            f"| images per pack | mean {pp['images']['mean']:.1f}, max {pp['images']['max']} |",
            f"| padding (packed / pad-to-longest) | {stats['padding_waste']:.1%} / "
            f"{stats['naive_padding_waste']:.1%} |",
        ]
    lines += ["", "Dropped samples by reason (ids in `dropped.jsonl`):", "", "| reason | samples |",
              "|---|---|", dropped, ""]
    if plot:
        lines += [f"![packing statistics]({plot})", ""]
    lines += [
        "## Load", "", "```python", "import wdspack", "",
        f'loader = wdspack.make_loader("hf://datasets/{repo_id}{rev}", batch_size=8, num_workers=4)',
        "for batch in loader:",
        "    ...  # input_ids / labels / position_ids [B, L], pixel_values [B*M, C, H, W]",
        "```", "",
    ]
    return "\n".join(lines)
