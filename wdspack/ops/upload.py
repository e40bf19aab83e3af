"""Publish a packed dataset to the Hugging Face Hub (``wdspack upload``).

Resumable: the files already on the Hub with the same size and sha256 are skipped, so a broken
upload re-run sends only what is missing. Shards go first, in commits of a few files each; the
dataset card, the stats plot, ``dropped.jsonl`` and ``manifest.json`` go last, so a reader never
sees a manifest that lists shards the repo does not have yet. The card and plot are made in a temp
folder and copied beside the dataset once the upload went through: a failed upload writes nothing there.

The token comes from ``token=`` or the usual places (``HF_TOKEN``, ``hf auth login``)
and is handed to ``huggingface_hub`` only: it never reaches logs, errors or the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ManifestError, OutputError, WdspackError
from ..format.manifest import MANIFEST_NAME, read_manifest
from .inspect import dataset_stats, plot_stats

__all__ = ["dataset_card", "load_example", "upload_dataset"]

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

    _check_repo_id(repo_id)
    root = Path(root)
    manifest = read_manifest(root)
    _check_complete(root, manifest)
    api = api or HfApi(token=token)
    with tempfile.TemporaryDirectory(prefix="wdspack-card-") as staging:
        # the card and plot are written beside the dataset only once the upload went through: a failed
        # one leaves the folder as it was
        made = _write_card(root, Path(staging), repo_id, revision, log=log)

        def local(name: str) -> Path:
            return made.get(name, root / name)

        try:
            api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
            if revision:
                api.create_branch(repo_id, repo_type="dataset", branch=revision, exist_ok=True)
            remote = _remote_files(api, repo_id, revision)
            shards = [s.name for s in manifest.shards]
            index = manifest.pack_index.get("file")
            tail = [p for p in (PLOT_NAME if PLOT_NAME in made else None, CARD_NAME, manifest.dropped_file, index,
                                MANIFEST_NAME) if p]
            todo = [n for n in shards + tail if not _same(local(n), remote.get(n))]
            skipped = len(shards) + len(tail) - len(todo)
            todo_shards = [n for n in todo if n in shards]
            for start in range(0, len(todo_shards), files_per_commit):
                batch = todo_shards[start:start + files_per_commit]
                api.create_commit(repo_id, [CommitOperationAdd(n, str(local(n))) for n in batch],
                                  repo_type="dataset", revision=revision,
                                  commit_message=f"wdspack: shards {batch[0]} … {batch[-1]}")
                log(f"uploaded {start + len(batch)}/{_count(len(todo_shards), 'shard')}")
            todo_tail = [n for n in todo if n not in shards]
            if todo_tail:
                api.create_commit(repo_id, [CommitOperationAdd(n, str(local(n))) for n in todo_tail],
                                  repo_type="dataset", revision=revision,
                                  commit_message="wdspack: manifest, dataset card and stats")
        except WdspackError:
            raise
        except Exception as e:  # huggingface_hub's errors; their text never holds the token
            detail = " ".join(_scrub(str(e), token).split())  # one line, whatever the server said
            raise OutputError(f"upload to datasets/{repo_id} failed: {type(e).__name__}: {detail}; "
                              f"{_advice(e, getattr(api, 'endpoint', None))}") from None
        for path in made.values():  # the folder now holds what the repo holds
            try:
                _replace(path, root / path.name)
            except OSError as e:
                log(f"{path.name} is on the Hub but not in {root}: {e}")
    log(f"datasets/{repo_id}: {_count(len(todo), 'file')} uploaded, {skipped} already there")
    return {"uploaded": len(todo), "skipped": skipped}


def _check_repo_id(repo_id: str) -> None:
    """Refuse a repo id the Hub would refuse, before the card is made (huggingface_hub's own rule)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if "/" not in repo_id:
        raise ConfigError(f"repo id {repo_id!r} names no owner; give ORG/NAME (your user name or an organisation)")
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise ConfigError(f"repo id {repo_id!r} is not a Hub repository name; give ORG/NAME: two parts of letters, "
                          "digits, '-', '_' or '.' (neither starting nor ending with '-' or '.'), at most 96 "
                          "characters in all, e.g. my-org/llava-packed") from None


def _advice(error: Exception, endpoint: str | None) -> str:
    """What to do about a failed upload, from what failed."""
    status = getattr(getattr(error, "response", None), "status_code", None)
    if status in (401, 403):
        return ("check the token (HF_TOKEN, `hf auth login` or --token) and that it may write to the repository, "
                "then re-run the same command")
    if isinstance(error, (ConnectionError, TimeoutError)) or "connect" in type(error).__name__.lower():
        return f"check the network{f' and the endpoint {endpoint}' if endpoint else ''}, then re-run the same command"
    return "re-run the same command to upload what is missing"


def _count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless one.

    Example:
        >>> _count(1, "shard"), _count(3, "shard")
        ('1 shard', '3 shards')
    """
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _replace(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` through a temp name (never half a file)."""
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


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
    for secret in (token, os.environ.get("HF_TOKEN")):
        if secret:
            text = text.replace(secret, "***")
    return text


def _write_card(root: Path, folder: Path, repo_id: str, revision: str | None, *,
                log: Callable[[str], None] = print) -> dict[str, Path]:
    """Write ``README.md`` (and the stats plot when matplotlib is there) into ``folder``; ``name -> path``."""
    stats = dataset_stats(str(root), deep=True)
    made = {}
    try:
        plot_stats(stats, str(folder / PLOT_NAME))
        made[PLOT_NAME] = folder / PLOT_NAME
    except ImportError:
        pass
    example = load_example(root)
    if example["batch"] is None:
        log(f"the dataset card gives no batch shapes: {example['why']}")
    card = folder / CARD_NAME
    card.write_text(dataset_card(stats, repo_id, revision=revision, plot=PLOT_NAME if made else None,
                                 example=example), encoding="utf-8")
    made[CARD_NAME] = card
    return made


#: The card's loading example: a batch of at most this many packs.
CARD_BATCH_SIZE = 8
#: The built-in image transform the card's example uses for a dataset packed with a fixed image-token count.
CARD_IMAGE_SIZE = 224


def load_example(source: str | Path) -> dict[str, Any]:
    """The card's ``make_loader`` call for this dataset, and the keys and shapes of the batch it gives.

    The arguments follow from the manifest: ``processor=`` the processor a processor-packed dataset
    was packed with, the built-in image transform for other image datasets, and a batch size the
    dataset has packs for under the default two workers. The shapes are read off a real batch of the
    dataset (``num_workers=0``, the same shapes).

    Returns:
        ``{"batch_size", "args": [(name, python source)], "note": str, "batch": {key: (shape, dtype)}
        or None, "why": why there is no batch}``; ``shape`` is a tuple, or None for a plain int.

    Example:
        >>> load_example("packed/")["args"]  # doctest: +SKIP
        [('batch_size', '8'), ('image_transform', 'wdspack.make_image_transform(size=224)')]
    """
    from ..loader import make_loader
    from ..media.image.pixels import make_image_transform

    manifest = read_manifest(source)
    policy, images = manifest.image_policy, manifest.totals.get("images") or sum(s.images for s in manifest.shards)
    options: dict[str, Any] = {}
    args: list[tuple[str, str]] = []
    note, why = "", ""
    if images and policy.get("family"):
        name = str(policy.get("name"))
        args.append(("processor", json.dumps(name)))
        note = (f"Packed with the {policy['family']} processor `{name}` ({policy.get('processor_class')}): pass "
                "`processor=` that name, a folder it is saved in, or the loaded processor object; a processor "
                "with other settings (patch size, merge size, min/max pixels, tokenizer) is refused.")
        try:
            from ..models import load_processor

            options["processor"] = load_processor(name)
        except WdspackError as e:
            why = f"the processor {name!r} does not load here ({e})"
            options["text_only"] = True  # the batch size still follows from the packs
    elif images:
        args.append(("image_transform", f"wdspack.make_image_transform(size={CARD_IMAGE_SIZE})"))
        options["image_transform"] = make_image_transform(size=CARD_IMAGE_SIZE)
        note = (f"Packed with {_image_tokens(manifest)}; `make_image_transform` takes your vision encoder's input "
                "size (and mean/std).")
    short = ""
    for batch_size in (CARD_BATCH_SIZE, 4, 2, 1):  # the most packs per batch that two workers have packs for
        try:
            make_loader(source, batch_size=batch_size, **options)
            break
        except ConfigError as e:
            short = str(e)
    else:
        why = why or short
    args.insert(0, ("batch_size", str(batch_size)))
    if why:
        return {"batch_size": batch_size, "args": args, "note": note, "batch": None, "why": why}
    try:
        loader = make_loader(source, batch_size=batch_size, num_workers=0, shuffle=False, pin_memory=False,
                             **options)
        batch = next(iter(loader))
    except (WdspackError, OSError) as e:  # the card is still worth having; the workers will say it again
        return {"batch_size": batch_size, "args": args, "note": note, "batch": None, "why": str(e)}
    shapes = {k: (tuple(v.shape), str(v.dtype).removeprefix("torch.")) if hasattr(v, "shape") else
              (None, type(v).__name__) for k, v in batch.items()}
    return {"batch_size": batch_size, "args": args, "note": note, "batch": shapes, "why": ""}


def _image_tokens(manifest: Any) -> str:
    policy = manifest.image_policy
    if policy.get("kind") == "fixed":
        return f"{_count(int(policy.get('tokens_per_image') or 0), 'token')} per image"
    return f"image tokens counted by `{policy.get('name')}`"


def dataset_card(stats: dict[str, Any], repo_id: str, *, revision: str | None = None,
                 plot: str | None = PLOT_NAME, example: dict[str, Any] | None = None) -> str:
    """The dataset card: YAML metadata, packing statistics, the plot, and a loading example.

    Args:
        stats: :func:`~wdspack.ops.inspect.dataset_stats` of the local dataset (``deep=True``).
        example: :func:`load_example` of it; default: computed from ``stats["source"]``.

    Example:
        >>> dataset_card(dataset_stats("packed/", deep=True), "org/name").startswith("---")  # doctest: +SKIP
        True
    """
    example = load_example(stats["source"]) if example is None else example
    pp = stats.get("per_pack", {})
    dropped = "\n".join(f"| {k} | {v} |" for k, v in stats["dropped_by_reason"].items()) or "| none | 0 |"
    most = stats["max_images"]
    lines = [
        "---",
        "tags:", "- wdspack", "- webdataset", "- packed", "- vision-language",
        "configs:", "- config_name: default", "  data_files:", "  - split: train", "    path: train-*.tar",
        "---",
        f"# {repo_id}",
        "",
        f"Pre-packed with [wdspack](https://pypi.org/project/wdspack/): every record is a pack of "
        f"up to {_count(stats['seq_len'], 'token')} and "
        f"{'any number of images' if most is None else _count(most, 'image')}, planned with "
        f"`{stats['algorithm']}`; tokenized with `{stats['tokenizer']}`.",
        "",
        "| | |", "|---|---|",
        f"| packs | {stats['packs']} in {_count(stats['shards'], 'shard')} ({stats['bytes'] / 1e6:.1f} MB) |",
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
    return "\n".join(lines + _load_section(example, repo_id, revision))


def _load_section(example: dict[str, Any], repo_id: str, revision: str | None) -> list[str]:
    """The card's "Load" section: the ``make_loader`` call, runnable as written, and the batch it gives."""
    rev = f"@{revision}" if revision else ""
    call = "loader = wdspack.make_loader("
    args = [f'"hf://datasets/{repo_id}{rev}"'] + [f"{name}={value}" for name, value in example["args"]]
    lines = ["## Load", "", "```python", "import wdspack", "",
             call + ",\n".join(args).replace("\n", "\n" + " " * len(call)) + ")",
             "batch = next(iter(loader))  # in training: for batch in loader: ...",
              "for key, value in batch.items():",
              "    print(key, tuple(value.shape) if hasattr(value, \"shape\") else value)", "```", ""]
    if example["note"]:
        lines += [example["note"], ""]
    batch = example["batch"]
    if batch:
        lines += [f"Every batch (`batch_size={example['batch_size']}`) holds, at every step:", "",
                  "| key | shape | dtype |", "|---|---|---|"]
        lines += [f"| `{k}` | {list(shape) if shape is not None else '-'} | {dtype} |"
                  for k, (shape, dtype) in batch.items()]
        lines.append("")
    return lines
