"""Turn a ``source`` into shard URLs and pack counts, once, in the main process.

Accepted sources::

    packed/                                    a dataset folder (reads packed/manifest.json)
    packed/manifest.json                       the manifest itself
    https://host/data/packed/                  a dataset root over HTTP(S)
    hf://datasets/ORG/NAME@main[/sub/folder]   a Hub dataset (resolved with HfFileSystem); the
                                               revision is a branch, a tag or a commit, ``@main``
                                               when left out (always asked for by name)
    s3://bucket/packed/  gs://…  az://…         a dataset root in any fsspec store (its backend,
                                               e.g. s3fs, installed); ``storage_options`` go to
                                               the store's filesystem
    packed/train-{000000..000009}.tar          a brace pattern (local or remote)
    packed/train-*.tar                         a glob (local only: remote folders are never listed)
    ["a/train-000000.tar", "a/train-000001.tar"]  an explicit list

Shard lists take their pack counts from the ``manifest.json`` next to the first shard. Without
one, local shards are counted by reading their tar headers (a seek per member, no pack bytes), and
``seq_len``, ``max_images`` and ``pad_token_id`` must be passed; remote shards without a manifest
are refused (counting them would download them).

A Hub revision is pinned to its commit when resolved, so every worker and rank reads the same
snapshot even if the branch moves during training. Shard bytes are then streamed from the
revision's ``resolve`` URL with one ranged GET per shard (see :mod:`.streams`). An fsspec store's
shards are read the same way, one streaming (ranged) ``GetObject`` per shard on S3.
"""

from __future__ import annotations

import glob
import logging
import os
import posixpath
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError, ManifestError, SourceError
from ..manifest import MANIFEST_NAME, Manifest
from ..storage import with_hub_revision
from .stages import ShardError, shard_packs
from .streams import LocalStream, NotFoundError, is_fsspec, is_remote, read_all

__all__ = ["ResolvedSource", "ShardRef", "expand_braces", "resolve_source"]

logger = logging.getLogger("wdspack.loader")


@dataclass(frozen=True, slots=True)
class ShardRef:
    """One shard as workers get it: a readable URL (or path) and its pack count."""

    name: str
    url: str
    packs: int


@dataclass(frozen=True)
class ResolvedSource:
    """The shard list, read once.

    ``headers`` is what every shard request needs besides its URL, and is never printed: the HTTP
    headers of an http(s) or Hub source (a token), or the storage options of an fsspec source
    (keys, an endpoint), which each worker's stream hands to the store's filesystem.
    """

    display: str
    shards: tuple[ShardRef, ...]
    manifest: Manifest | None
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    root: str = ""  # the folder (URL) of the manifest, where its side files are


def expand_braces(pattern: str) -> list[str]:
    """Expand ``{a,b}`` alternatives and zero-padded ``{000..012}`` ranges.

    Example:
        >>> expand_braces("train-{000..002}.tar")
        ['train-000.tar', 'train-001.tar', 'train-002.tar']
    """
    m = re.search(r"\{(\d+\.\.\d+|[^{}]*,[^{}]*)\}", pattern)
    if not m:
        return [pattern]
    body = m.group(1)
    r = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if r:
        width = len(r.group(1)) if r.group(1).startswith("0") else 0
        items = [str(i).zfill(width) for i in range(int(r.group(1)), int(r.group(2)) + 1)]
    else:
        items = body.split(",")
    head, tail = pattern[:m.start()], pattern[m.end():]
    return [out for item in items for out in expand_braces(head + item + tail)]


def resolve_source(source: str | os.PathLike[str] | Sequence[str], *, storage_options: Mapping[str, Any] | None = None,
                   **read_kwargs: Any) -> ResolvedSource:
    """Resolve ``source`` (see the module docstring) to shard URLs and counts; reads the manifest once."""
    options = dict(storage_options or {})
    if isinstance(source, (str, os.PathLike)):
        text, urls = os.fspath(source), None
    else:
        urls = [os.fspath(u) for u in source]
        if not urls:
            raise ConfigError("source is an empty list of shards; pass shard URLs, a dataset folder or a manifest")
        text = urls[0]
    display = text if urls is None else f"{len(urls)} shards from {posixpath.dirname(text) or '.'}"
    if is_fsspec(text):
        headers, options = options, {}  # the store's options, for every stream (see ResolvedSource)
    else:
        headers = dict(options.pop("headers", {}) or {})
    if text.startswith("hf://"):
        named = [u for pattern in (urls or [text]) for u in expand_braces(pattern)]
        resolved, headers = _hf_to_http(named, options, headers)
        if urls is None and len(named) == 1 and not named[0].endswith(".tar"):
            text = resolved[0]  # a folder or a manifest
        else:
            urls = resolved
    elif options:
        raise ConfigError(f"storage_options keys {sorted(options)} only apply to hf:// and fsspec (s3://, gs://, "
                          "...) sources (use storage_options={'headers': {...}} for https)")
    read_kwargs = {**read_kwargs, "headers": headers}
    if urls is None:
        urls = _expand(text)
        if urls is None:  # a folder or a manifest file
            manifest_url = text if text.endswith(".json") else _join(text, MANIFEST_NAME)
            manifest = _read_manifest(manifest_url, read_kwargs, required=True)
            base = _dirname(manifest_url)
            shards = tuple(ShardRef(s.name, _join(base, s.name), s.packs) for s in manifest.shards)
            return ResolvedSource(display, shards, manifest, headers, root=base)
    return _from_shard_list(display, urls, read_kwargs, headers)


def _from_shard_list(display, urls, read_kwargs, headers) -> ResolvedSource:
    folders = {_dirname(u) for u in urls}
    if len(folders) > 1:
        raise ConfigError(f"the shards come from {len(folders)} folders ({sorted(folders)[:3]} ...); pass the shards "
                          "of one dataset at a time (pack counts come from its manifest.json)")
    folder = folders.pop()
    manifest = _read_manifest(_join(folder, MANIFEST_NAME), read_kwargs, required=False)
    if manifest is not None:
        counts = {s.name: s.packs for s in manifest.shards}
        missing = [u for u in urls if _basename(u) not in counts]
        if missing:
            raise ManifestError(f"{missing[0]} is not listed in {_join(folder, MANIFEST_NAME)} "
                                f"({len(missing)} such shards); pass shards of that dataset only")
        shards = tuple(ShardRef(_basename(u), u, counts[_basename(u)]) for u in urls)
        return ResolvedSource(display, shards, manifest, headers, root=folder)
    if any(is_remote(u) for u in urls):
        raise ManifestError(f"no {MANIFEST_NAME} next to {urls[0]}: the loader needs each shard's pack count to give "
                            "every rank the same number of batches; pass the dataset root (with its manifest) "
                            "or write one with `wdspack pack`")
    logger.warning("no %s next to %s: counting packs from tar headers (%d shards)", MANIFEST_NAME, urls[0], len(urls))
    shards = tuple(ShardRef(_basename(u), u, count_packs(u)) for u in urls)
    return ResolvedSource(display, shards, None, headers)


def read_pack_index(source: ResolvedSource, **read_kwargs: Any):
    """The pack index rows of ``source.shards`` (one ``[packs, columns]`` array per shard); one request.

    Raises :class:`ConfigError` when the dataset has none (packed before wdspack wrote one).
    """
    from ..pack_index import decode_index

    m = source.manifest
    if m is None or not m.pack_index:
        raise ConfigError(f"{source.display} has no pack index (pack_index.npy, written by `wdspack pack` and "
                          "`wdspack reshard` since the index was added), so pack costs are unknown; add one with "
                          "`wdspack index DATASET_FOLDER` (reads the shards once, rewrites nothing else), or load "
                          "without balance=")
    url = _join(source.root, m.pack_index["file"])
    if is_remote(url):
        data = read_all(url, **{**read_kwargs, "headers": source.headers})
    else:
        try:
            with open(url[len("file://"):] if url.startswith("file://") else url, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise ManifestError(f"{url} does not exist but the manifest names it; copy the whole dataset folder "
                                "(or re-create the index with `wdspack reshard`)") from None
    index = decode_index(data, m.pack_index, packs=m.num_packs, where=url)
    starts = dict(zip((s.name for s in m.shards), np.cumsum([0] + [s.packs for s in m.shards]).tolist()))
    return [index[starts[s.name]:starts[s.name] + s.packs] for s in source.shards]


def count_packs(path: str) -> int:
    """Packs in a local shard, from its tar headers only (pack bytes are seeked over)."""
    n = 0
    try:
        with LocalStream(path) as stream:
            for _ in shard_packs(stream, start=1 << 62, stop=1 << 62, stats=Counter(), where=path):
                pass
    except ShardError as e:
        m = re.search(r"after (\d+) packs", str(e))
        if m is None:
            raise
        n = int(m.group(1))
    return n


def _expand(text: str) -> list[str] | None:
    """Shard URLs named by a pattern or a single ``.tar``; None for a folder or manifest."""
    candidates = expand_braces(text)
    if len(candidates) == 1 and not candidates[0].endswith(".tar") and not glob.has_magic(candidates[0]):
        return None
    if is_remote(text):
        if any(glob.has_magic(c) for c in candidates):
            raise ConfigError(f"{text}: globs cannot be expanded on a remote store (folders are never listed); use "
                              "a brace pattern like train-{000000..000009}.tar or the dataset root")
        return candidates
    urls: list[str] = []
    for c in candidates:
        c = c[len("file://"):] if c.startswith("file://") else c
        if glob.has_magic(c):
            found = sorted(glob.glob(c))
            if not found:
                raise ConfigError(f"{c} matches no file")
            urls.extend(found)
        else:
            urls.append(c)
    return urls


def _read_manifest(url: str, read_kwargs, *, required: bool) -> Manifest | None:
    try:
        if is_remote(url):
            data = read_all(url, **read_kwargs)
        else:
            path = url[len("file://"):] if url.startswith("file://") else url
            if not os.path.exists(path):
                raise NotFoundError(path)
            with open(path, "rb") as f:
                data = f.read()
    except NotFoundError:
        if not required:
            return None
        raise ManifestError(f"{url} does not exist: the dataset is incomplete (the manifest is written last) or this "
                            "is not a wdspack dataset folder; pass the folder that holds manifest.json") from None
    return Manifest.from_json(data)


def _hf_to_http(urls: list[str], options: dict, headers: dict) -> tuple[list[str], dict[str, str]]:
    """``hf://datasets/ORG/NAME@REV/path`` → ``resolve`` URLs at the pinned commit, and the auth headers.

    HfFileSystem parses the paths, checks repo and revision and supplies endpoint and token (one
    request per repo); ``repo_info`` pins the revision to its commit (one more). No listing.
    The file system is a fresh instance, not fsspec's per-process cached one: that one remembers
    "repository not found" for the life of the process, so a repo created after a failed attempt
    (an upload still running) would never be found again, and it would make no request to say so.
    """
    from huggingface_hub import HfFileSystem
    from huggingface_hub.utils import build_hf_headers

    fs = HfFileSystem(**{**options, "skip_instance_cache": True})
    commits: dict[tuple[str, str, str], str] = {}
    out = [_hf_resolve_url(fs, url, commits) for url in urls]
    return out, {**headers, **build_hf_headers(token=fs.token)}


def _hf_resolve_url(fs, url: str, commits: dict[tuple[str, str, str], str]) -> str:
    """One ``hf://`` URL → its ``resolve`` URL at the commit its revision points to (``commits`` caches the pins)."""
    from huggingface_hub import HfApi, hf_hub_url

    if glob.has_magic(url):
        raise ConfigError(f"{url}: globs are not expanded on the Hub (folders are never listed); use a brace "
                          "pattern like train-{000000..000009}.tar or the dataset root")
    try:
        # A revision-less source reads @main, asked for by name: mirrors (olah) can only answer an
        # unnamed revision by asking huggingface.co, and the Hub's default branch is main anyway.
        resolved = fs.resolve_path(with_hub_revision(url))
        key = (resolved.repo_type, resolved.repo_id, resolved.revision)
        if key not in commits:
            info = HfApi(endpoint=fs.endpoint, token=fs.token).repo_info(
                resolved.repo_id, repo_type=resolved.repo_type, revision=resolved.revision)
            commits[key] = info.sha or resolved.revision
    except FileNotFoundError as e:
        raise SourceError(f"{url}: {e.args[0] if e.args else 'not found'}; check the repo name and the revision "
                          "(and that you are logged in for a private repo)") from None
    except (ConfigError, SourceError):
        raise
    except Exception as e:  # offline mode, network down, ...; the text never holds the token
        raise SourceError(f"{url}: cannot resolve the Hub repository: {type(e).__name__}: {e}") from None
    path = resolved.path_in_repo.strip("/")
    http = hf_hub_url(resolved.repo_id, path or MANIFEST_NAME, repo_type=resolved.repo_type,
                      revision=commits[key], endpoint=fs.endpoint)
    return http if path else http[: -len(MANIFEST_NAME)]


def _join(folder: str, name: str) -> str:
    if is_remote(folder):
        return folder.rstrip("/") + "/" + name
    return os.path.join(folder, name)


def _dirname(url: str) -> str:
    return posixpath.dirname(url) if is_remote(url) else os.path.dirname(url)


def _basename(url: str) -> str:
    return posixpath.basename(url)
