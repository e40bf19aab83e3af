"""Open a packed dataset: its manifest, its shard URLs and pack counts, its pack index.

:func:`resolve_source` turns a ``source`` into shard URLs and pack counts, once, in the main
process (the loader, ``wdspack.loader.wds``). :func:`open_dataset` and :func:`iter_dataset_packs`
read a whole dataset through fsspec (``wdspack inspect``, ``verify``, ``reshard``).

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
revision's ``resolve`` URL with one ranged GET per shard (see :mod:`wdspack.storage`). An fsspec store's
shards are read the same way, one streaming (ranged) ``GetObject`` per shard on S3.
"""

from __future__ import annotations

import glob
import logging
import os
import posixpath
import re
import tarfile
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import numpy as np

from ..errors import ConfigError, ManifestError
from ..storage.base import NotFoundError
from ..storage.hf import resolve_hub_urls
from ..storage.local import LocalStream
from ..storage.streams import read_all
from ..storage.urls import basename_url, dirname_url, expand_braces, is_fsspec, is_remote, join_url
from .manifest import MANIFEST_NAME, Manifest
from .pack import Pack, decode_pack
from .tar import ShardError, shard_packs

__all__ = ["ResolvedSource", "ShardRef", "count_packs", "iter_dataset_packs", "open_dataset", "read_pack_index",
           "resolve_source"]

logger = logging.getLogger(__name__)

#: Files people pass by mistake for a packed dataset: the data before packing.
_DATA_SUFFIXES = (".jsonl", ".parquet", ".arrow", ".csv", ".tsv", ".txt", ".jsonl.gz", ".zst")


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
        if len(urls) > 1 and not any(u.endswith(".tar") for u in urls):
            raise ConfigError(f"source {urls[:3]} is a list of {len(urls)} datasets, not of shards: to read them as "
                              "one stream pass (path, weight) pairs, a mixture (e.g. "
                              f"[({urls[0]!r}, 1), ({urls[1]!r}, 1)]); for one dataset pass its folder")
        text = urls[0]
    display = text if urls is None else f"{len(urls)} shards from {posixpath.dirname(text) or '.'}"
    if is_fsspec(text):
        headers, options = options, {}  # the store's options, for every stream (see ResolvedSource)
    else:
        headers = dict(options.pop("headers", {}) or {})
    if text.startswith("hf://"):
        named = [u for pattern in (urls or [text]) for u in expand_braces(pattern)]
        resolved, headers = resolve_hub_urls(named, options, headers, folder_file=MANIFEST_NAME)
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
            if text.lower().endswith(_DATA_SUFFIXES) and not is_remote(text) and os.path.isfile(text):
                raise ConfigError(f"{text} is a data file, not a packed dataset: pack it first (wdspack pack {text} "
                                  "--output packed/ ...) and pass the packed folder")
            manifest_url = text if text.endswith(".json") else join_url(text, MANIFEST_NAME)
            manifest = _read_manifest(manifest_url, read_kwargs, required=True)
            base = dirname_url(manifest_url)
            shards = tuple(ShardRef(s.name, join_url(base, s.name), s.packs) for s in manifest.shards)
            return ResolvedSource(display, shards, manifest, headers, root=base)
    return _from_shard_list(display, urls, read_kwargs, headers)


def _from_shard_list(display, urls, read_kwargs, headers) -> ResolvedSource:
    folders = {dirname_url(u) for u in urls}
    if len(folders) > 1:
        raise ConfigError(f"the shards come from {len(folders)} folders ({sorted(folders)[:3]} ...); pass the shards "
                          "of one dataset at a time (pack counts come from its manifest.json)")
    folder = folders.pop()
    manifest = _read_manifest(join_url(folder, MANIFEST_NAME), read_kwargs, required=False)
    if manifest is not None:
        counts = {s.name: s.packs for s in manifest.shards}
        missing = [u for u in urls if basename_url(u) not in counts]
        if missing:
            raise ManifestError(f"{missing[0]} is not listed in {join_url(folder, MANIFEST_NAME)} "
                                f"({len(missing)} such shards); pass shards of that dataset only")
        shards = tuple(ShardRef(basename_url(u), u, counts[basename_url(u)]) for u in urls)
        return ResolvedSource(display, shards, manifest, headers, root=folder)
    if any(is_remote(u) for u in urls):
        raise ManifestError(f"no {MANIFEST_NAME} next to {urls[0]}: the loader needs each shard's pack count to give "
                            "every rank the same number of batches; pass the dataset root (with its manifest) "
                            "or write one with `wdspack pack`")
    logger.warning("no %s next to %s: counting packs from tar headers (%d shards)", MANIFEST_NAME, urls[0], len(urls))
    shards = tuple(ShardRef(basename_url(u), u, count_packs(u)) for u in urls)
    return ResolvedSource(display, shards, None, headers)


def read_pack_index(source: ResolvedSource, **read_kwargs: Any):
    """The pack index rows of ``source.shards`` (one ``[packs, columns]`` array per shard); one request.

    Raises :class:`ConfigError` when the dataset has none (packed before wdspack wrote one).
    """
    from .pack_index import decode_index

    m = source.manifest
    if m is None or not m.pack_index:
        raise ConfigError(f"{source.display} has no pack index (pack_index.npy, written by `wdspack pack` and "
                          "`wdspack reshard` since the index was added), so pack costs are unknown; add one with "
                          "`wdspack index DATASET_FOLDER` (reads the shards once, rewrites nothing else), or load "
                          "without balance=")
    url = join_url(source.root, m.pack_index["file"])
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


@overload
def _read_manifest(url: str, read_kwargs, *, required: Literal[True]) -> Manifest: ...
@overload
def _read_manifest(url: str, read_kwargs, *, required: bool) -> Manifest | None: ...


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
    try:
        return Manifest.from_json(data)
    except ManifestError as e:
        if basename_url(url) == MANIFEST_NAME:
            raise
        raise ConfigError(f"{url} is not a packed dataset ({e}); it reads as a data file: pack it first (wdspack pack "
                          f"{url} --output packed/ ...) and pass the packed folder") from None


# ---------------------------------------------------------------------------------------------
# Whole datasets, read through fsspec (inspect, verify, reshard)


def open_dataset(source: str) -> tuple[Manifest, str]:
    """Read the manifest of a local folder, ``https://`` or ``hf://`` dataset; return it and the root URL.

    Example:
        >>> manifest, root = open_dataset("build/demo/packed")  # doctest: +SKIP
    """
    import fsspec

    root = source[: -len(MANIFEST_NAME)].rstrip("/") if source.endswith(MANIFEST_NAME) else source.rstrip("/")
    url = f"{root}/{MANIFEST_NAME}"
    try:
        with fsspec.open(url, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        if "://" not in root and not os.path.isdir(root):
            raise ManifestError(f"{root}: no such folder") from None
        raise ManifestError(f"{url} does not exist: not a packed dataset, or its pack job did not finish (the "
                            "manifest is written last)") from None
    except Exception as e:  # the network down, the Hub offline, a refused connection: one line, no traceback
        if "://" not in url or url.startswith("file://"):
            raise
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ManifestError(f"cannot read {url}: {type(e).__name__}: {text}; check the URL and the network "
                            "(HF_ENDPOINT, HF_HUB_OFFLINE, a proxy)") from None
    return Manifest.from_json(data), root


def iter_dataset_packs(manifest: Manifest, root: str) -> Iterator[tuple[str, Pack]]:
    """Yield ``(shard name, pack)`` for every pack, streaming each shard once, in manifest order."""
    import fsspec

    for shard in manifest.shards:
        with fsspec.open(f"{root}/{shard.name}", "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
            for member in tar:
                if member.isfile() and member.name.endswith(".mp"):
                    data = tar.extractfile(member)
                    assert data is not None  # a regular file
                    yield shard.name, decode_pack(data.read())
