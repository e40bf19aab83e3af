"""Find the source files and cut them into partitions, units of work for one worker.

================  ==================================  =====================================
kind              ``start`` / ``stop``                cut
================  ==================================  =====================================
``jsonl``         byte offsets, line-aligned          every ``records_per_partition`` lines
``json``          byte offsets inside the array       every ``records_per_partition`` elements
``parquet``       row-group indices                   row groups merged up to the target
``arrow``         row indices, batch-aligned          record batches merged up to the target
``wds``           byte offsets of tar member headers  every ``records_per_partition`` samples
                                                      (a remote shard is one partition)
================  ==================================  =====================================

``first_row`` is the row index of the partition's first record in its file, so ids
(``{name}:{row}``) do not depend on where the cuts fall. Nothing here parses a record.
Brace patterns (``shards/{000000..000099}.tar``, ``{a,b}.jsonl``) expand, as webdataset expands
them, into one source each, in order.
"""

from __future__ import annotations

import glob
import json
import os
import posixpath
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import ConfigError, SourceError
from ...storage.fsspec import filesystem, url_of
from ...storage.hf import with_hub_revision
from ...storage.location import copy_to_local, open_input
from ...storage.urls import is_url, local_path
from .documents import DOCUMENT_COLUMNS
from .meta import RowMap, Source, expand_sources
from .records import TEXT_COLUMNS
from .scan import array_separators, jsonl_boundaries
from .webdataset import scan_groups

__all__ = ["FORMATS", "Partition", "arrow_batches", "list_partitions"]

#: What a source may be, for error messages.
FORMATS = ("JSON (a list of records, or one record per line), JSONL, Parquet, a Hugging Face "
           "save_to_disk folder (dataset_info.json/state.json + data-*.arrow), WebDataset .tar shards of image + "
           "caption pairs, or a folder, glob or brace pattern of these")
_EXTENSIONS = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".tar": "wds"}
_BRACES = re.compile(r"\{[^{}]*(?:\.\.|,)[^{}]*\}")
# Hugging Face metadata, never records: skipped when a folder is searched.
_METADATA = {"dataset_dict.json", "dataset_info.json", "dataset_infos.json", "state.json"}


@dataclass(frozen=True, slots=True)
class Partition:
    """A slice of one source file that one worker reads; picklable and cheap.

    Attributes:
        path: the file (an absolute path, or a URL: see :mod:`wdspack.storage`).
        kind: ``"jsonl" | "json" | "parquet" | "arrow" | "wds"``.
        start, stop: where the slice begins and ends (see the module's table).
        first_row: row index, in the file, of the slice's first record.
        image_root: the resolved folder (or URL) image paths are relative to.
        name: the file's name relative to the source root (the basename for a file named
            directly); it prefixes the ids of records without an ``id`` field.
        absolute_images: absolute image paths are read where they point (no image root was
            given, so ``image_root`` is only the file's folder); relative paths stay confined.
        source: the name of the source (dataset) the file belongs to; ids that collide across
            the sources of a job are prefixed with it (:mod:`.meta`).
        row_map: column renames its rows need (a LLaMA-Factory entry's ``columns``/``tags``).

    Example:
        >>> p = Partition("/data/llava.jsonl", "jsonl", 0, 52_311, 0, "/data", "llava.jsonl")
        >>> f"{p.name}:{p.first_row}"
        'llava.jsonl:0'
    """

    path: str
    kind: str
    start: int
    stop: int
    first_row: int
    image_root: str
    name: str = ""
    absolute_images: bool = False
    source: str = ""
    row_map: RowMap | None = None


#: ``map_files(fn, tasks)``: ``fn(*task)`` for each task, in order (:func:`list_partitions`).
MapFiles = Callable[[Callable[..., list[Partition]], list[tuple[Any, ...]]], Iterable[list[Partition]]]


@dataclass(frozen=True, slots=True)
class _SourceFile:
    path: str
    kind: str
    name: str


def list_partitions(sources: Sequence[str | Source], *, image_root: str | None = None,
                    records_per_partition: int = 1000, map_files: MapFiles | None = None) -> list[Partition]:
    """Partitions covering every record of the sources exactly once, in a deterministic order.

    Sources keep the order given; files found in a folder or by a glob are sorted. A file
    reached twice is read once (by the first source that reaches it).

    Args:
        sources: files, folders (searched recursively for ``.json``/``.jsonl``/``.parquet``
            files and ``save_to_disk`` folders; names starting with ``.`` are skipped) and globs;
            local paths or fsspec URLs (``s3://…``, ``hf://datasets/ORG/NAME@REV/…``). A remote
            JSON, JSONL or Arrow file is copied to the temp folder once to find its records;
            Parquet needs only its footer. ``SOURCE::ROOT`` (or a :class:`~.meta.Source`) gives
            a source its own image root; InternVL meta files, LLaMA-Factory ``dataset_info.json``
            and LLaVA-NeXT data YAMLs expand into the datasets they list (:mod:`.meta`).
        image_root: the folder image paths are relative to (a path or URL), for the sources
            without their own; default: each file's folder.
        records_per_partition: about how many records one partition holds.
        map_files: runs the cutting of files into partitions (reading JSONL line ends, tar headers,
            Parquet footers): ``map_files(fn, tasks)`` yields ``fn(*task)`` for each task in order;
            default: one after the other here. The pack job passes its executor, so a job of many
            files lists them in its tasks, not in the driver.

    Raises:
        SourceError: a path that does not exist, a glob that matches nothing, a file of an
            unknown format, or a JSON file that is not an array of records.
        ConfigError: ``records_per_partition`` < 1.

    Example:
        >>> list_partitions(["data/llava.jsonl"], records_per_partition=1000)  # doctest: +SKIP
        [Partition(path='/abs/data/llava.jsonl', kind='jsonl', start=0, stop=1048576, first_row=0, ...), ...]
    """
    if records_per_partition < 1:
        raise ConfigError(f"records_per_partition is {records_per_partition}; it must be at least 1")
    job_root = _image_root(image_root) if image_root is not None else None
    seen: set[str] = set()
    files: list[tuple[_SourceFile, str, int]] = []
    marks: list[tuple[str, bool, RowMap | None]] = []  # per file: its source, absolute image paths, renames
    for src in expand_sources(sources):
        root = _image_root(src.image_root, given=f"{src}") if src.image_root is not None else job_root
        for f in (f for s in _expand_braces(src.path) for f in _expand(s)):
            real = f.path if is_url(f.path) else os.path.realpath(f.path)
            if real in seen:
                continue
            seen.add(real)
            if src.row_map is not None and f.kind not in ("json", "jsonl"):
                raise SourceError(f"dataset {src.name!r} renames columns ({dict(src.row_map.columns)}), which "
                                  f"wdspack does for JSON/JSONL files, and {f.path!r} is {f.kind}; rename the "
                                  "columns in the file, or convert it to JSONL")
            files.append((f, root or _folder_of(f.path), records_per_partition))
            # No root given: an absolute image path means what it says (LLaVA-style files often hold them).
            marks.append((src.name or "", not root, src.row_map))
    run = map_files if map_files is not None and len(files) > 1 else (lambda fn, tasks: (fn(*t) for t in tasks))
    out: list[Partition] = []
    for parts, (name, absolute, row_map) in zip(run(_partition_file, files), marks):
        out.extend(replace(p, absolute_images=absolute, source=name, row_map=row_map) for p in parts)
    return out


def _expand_braces(source: str) -> list[str]:
    """``{000..003}`` and ``{a,b}`` expanded (webdataset's rule), unless the path exists as written."""
    if not _BRACES.search(source) or (not is_url(source) and os.path.exists(local_path(source))):
        return [source]
    import braceexpand

    return list(braceexpand.braceexpand(source))


def _folder_of(path: str) -> str:
    if is_url(path):
        fs, inner = filesystem(path)
        return url_of(fs, posixpath.dirname(inner))
    return os.path.realpath(os.path.dirname(path))


def _image_root(path: str, *, given: str | None = None) -> str:
    if is_url(path):
        return with_hub_revision(path.rstrip("/"))
    real = os.path.realpath(os.path.expanduser(path))
    if not os.path.isdir(real):
        where = f"of source {given!r} (SOURCE::ROOT)" if given else "(--image-root)"
        raise SourceError(f"image root {path!r} {where} is not a folder; give the folder the image paths in "
                          "the records are relative to")
    return real


def _expand(source: str) -> Iterator[_SourceFile]:
    if is_url(source):
        yield from _expand_url(source)
        return
    path = local_path(source)
    if glob.has_magic(source):
        matches = sorted(glob.glob(path, recursive=True))
        if not matches:
            raise SourceError(f"source glob {source!r} matches nothing; check the pattern (quote it so the "
                              "shell does not expand it)")
        base = _glob_base(path)
        found = [f for m in matches for f in _expand_path(m, base, explicit=False)]
        if not found:
            raise SourceError(f"source glob {source!r} matches {len(matches)} path(s) but no source files; "
                              f"expected {FORMATS}")
        yield from found
    elif not os.path.exists(path):
        raise SourceError(f"source {source!r} does not exist; sources are {FORMATS}")
    else:
        yield from _expand_path(path, None, explicit=True)


def _expand_url(source: str) -> Iterator[_SourceFile]:
    """The source files a URL names: one file, a folder (searched as locally) or a glob."""
    fs, path = filesystem(source)
    try:
        if glob.has_magic(path):
            matches = sorted(fs.glob(path))
            if not matches:
                raise SourceError(f"source glob {source!r} matches nothing; check the pattern (quote it so "
                                  "the shell does not expand it)")
            parts = path.split("/")
            base = "/".join(parts[:next(i for i, p in enumerate(parts) if glob.has_magic(p))])
            found = [f for m in matches for f in _remote_files(fs, m, base, explicit=False)]
            if not found:
                raise SourceError(f"source glob {source!r} matches {len(matches)} path(s) but no source "
                                  f"files; expected {FORMATS}")
            yield from found
        else:
            try:
                fs.info(path)
            except FileNotFoundError:
                raise SourceError(f"source {source!r} does not exist; sources are {FORMATS}") from None
            yield from _remote_files(fs, path, posixpath.dirname(path), explicit=True)
    except OSError as e:  # unreachable, offline, no credentials
        raise SourceError(f"source URL {source!r} cannot be read: {e.strerror or e}") from None


def _remote_files(fs, path: str, base: str, *, explicit: bool) -> Iterator[_SourceFile]:
    """:func:`_expand_path` for a path inside an fsspec filesystem: the same files, order and names."""
    if not fs.isdir(path):
        kind = _kind_of(url_of(fs, path), explicit=explicit)
        if kind is not None:
            yield _SourceFile(url_of(fs, path), kind, posixpath.relpath(path, base))
        return
    top = path.rstrip("/")
    rels = sorted((posixpath.relpath(p, top) for p in fs.find(top)), key=lambda r: r.split("/"))
    saved = _saved_folders(rels)
    if "" in saved:  # the folder itself was written by save_to_disk
        yield from _remote_saved(fs, top, base)
        return
    name_base = top if explicit else base
    emitted: set[str] = set()
    found = False
    for rel in rels:  # sorted by components: the order of a sorted walk
        parts = rel.split("/")
        if any(p.startswith(".") for p in parts):
            continue
        owner = next(("/".join(parts[:k]) for k in range(1, len(parts)) if "/".join(parts[:k]) in saved), None)
        if owner is not None:
            if owner not in emitted:
                emitted.add(owner)
                found = True
                yield from _remote_saved(fs, f"{top}/{owner}", name_base)
            continue
        kind = _EXTENSIONS.get(posixpath.splitext(rel)[1].lower())
        if parts[-1] in _METADATA or kind is None:
            continue
        found = True
        yield _SourceFile(url_of(fs, f"{top}/{rel}"), kind, posixpath.relpath(f"{top}/{rel}", name_base))
    if not found and explicit:
        raise SourceError(f"folder {url_of(fs, top)!r} holds no source files; expected {FORMATS}")


def _saved_folders(rels: list[str]) -> set[str]:
    """The folders (relative, ``""`` for the top) that hold Hugging Face metadata and ``.arrow`` files."""
    meta = {posixpath.dirname(r) for r in rels if posixpath.basename(r) in ("state.json", "dataset_info.json")}
    return {posixpath.dirname(r) for r in rels if r.endswith(".arrow") and posixpath.dirname(r) in meta}


def _remote_saved(fs, folder: str, base: str) -> Iterator[_SourceFile]:
    """:func:`_saved_dataset_files` for a remote ``save_to_disk`` folder."""
    state = posixpath.join(folder, "state.json")
    names: list[str] = []
    if fs.exists(state):
        try:
            names = [d["filename"] for d in json.loads(fs.cat_file(state)).get("_data_files", [])]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise SourceError(f"{url_of(fs, state)} cannot be read ({e}); re-save the dataset with "
                              "save_to_disk") from None
    if not names:
        names = sorted(posixpath.basename(p) for p in fs.glob(posixpath.join(folder, "data-*.arrow")))
    for n in names:
        path = posixpath.join(folder, n)
        yield _SourceFile(url_of(fs, path), "arrow", posixpath.relpath(path, base))


def _glob_base(pattern: str) -> str:
    parts = pattern.split(os.sep)
    fixed = next(i for i, p in enumerate(parts) if glob.has_magic(p))
    return os.sep.join(parts[:fixed]) or os.sep


def _expand_path(path: str, base: str | None, *, explicit: bool) -> Iterator[_SourceFile]:
    """The source files at ``path``; names are relative to ``base`` (default: its parent)."""
    base = base if base is not None else os.path.dirname(path)
    if os.path.isdir(path):
        if _is_saved_dataset(path):
            yield from _saved_dataset_files(path, base)
            return
        found = False
        for f in _walk(path, path if explicit else base):
            found = True
            yield f
        if not found and explicit:
            raise SourceError(f"folder {path!r} holds no source files; expected {FORMATS}")
        return
    kind = _kind_of(path, explicit=explicit)
    if kind is not None:
        yield _SourceFile(path, kind, _relname(path, base))


def _kind_of(path: str, *, explicit: bool) -> str | None:
    """The format a file's name says; None to skip it (found by a search), an error if named."""
    kind = _EXTENSIONS.get(posixpath.splitext(path)[1].lower())
    if kind is None and path.lower().endswith(".arrow") and explicit:
        kind = "arrow"
    if kind is None and explicit:
        raise SourceError(f"source {path!r} has an unknown format; expected {FORMATS}")
    return kind


def _walk(folder: str, base: str) -> Iterator[_SourceFile]:
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name.startswith(".") or entry.name in _METADATA:
            continue
        if entry.is_dir():
            if _is_saved_dataset(entry.path):
                yield from _saved_dataset_files(entry.path, base)
            else:
                yield from _walk(entry.path, base)
        elif entry.is_file() and os.path.splitext(entry.name)[1].lower() in _EXTENSIONS:
            yield from _expand_path(entry.path, base, explicit=False)


def _is_saved_dataset(folder: str) -> bool:
    has_meta = any(os.path.isfile(os.path.join(folder, n)) for n in ("state.json", "dataset_info.json"))
    return has_meta and bool(glob.glob(os.path.join(glob.escape(folder), "*.arrow")))


def _saved_dataset_files(folder: str, base: str) -> Iterator[_SourceFile]:
    """The ``data-*.arrow`` files of a ``save_to_disk`` folder, in the order ``state.json`` lists."""
    names: list[str] = []
    state = os.path.join(folder, "state.json")
    if os.path.isfile(state):
        try:
            with open(state, encoding="utf-8") as f:
                names = [d["filename"] for d in json.load(f).get("_data_files", [])]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise SourceError(f"{state} cannot be read ({e}); re-save the dataset with "
                              "save_to_disk") from None
    if not names:
        pattern = os.path.join(glob.escape(folder), "data-*.arrow")
        names = sorted(os.path.basename(p) for p in glob.glob(pattern))
    if not names:
        raise SourceError(f"{folder!r} looks like a save_to_disk folder but has no data-*.arrow files; "
                          "re-save the dataset with save_to_disk, or name its files directly")
    for n in names:
        path = os.path.join(folder, n)
        if not os.path.isfile(path):
            raise SourceError(f"{state} lists {n!r}, which is missing from {folder}; re-save the dataset")
        yield _SourceFile(path, "arrow", _relname(path, base))


def _relname(path: str, base: str) -> str:
    return os.path.relpath(path, base).replace(os.sep, "/")


def _partition_file(f: _SourceFile, image_root: str, per: int) -> list[Partition]:
    cut = {"jsonl": _cut_jsonl, "json": _cut_json, "parquet": _cut_parquet, "arrow": _cut_arrow,
           "wds": _cut_wds}[f.kind]
    try:
        if f.kind in ("parquet", "wds"):  # the footer, or tar headers, are enough: read where the file is
            return cut(f, image_root, per, f.path)
        with copy_to_local(f.path) as local:  # scans need the whole file: remote ones are copied once
            return cut(f, image_root, per, local)
    except OSError as e:
        raise SourceError(f"source {f.path!r} cannot be read: {e.strerror or e}") from None


def _cut_jsonl(f: _SourceFile, root: str, per: int, local: str) -> list[Partition]:
    bounds = jsonl_boundaries(local, every=per)
    size = os.path.getsize(local)
    stops = [b[0] for b in bounds[1:]] + [size]
    return [Partition(f.path, "jsonl", start, stop, row, root, f.name)
            for (start, row), stop in zip(bounds, stops)]


def _cut_json(f: _SourceFile, root: str, per: int, local: str) -> list[Partition]:
    if _looks_like_jsonl(local):
        return _cut_jsonl(_SourceFile(f.path, "jsonl", f.name), root, per, local)
    layout = array_separators(local)
    if isinstance(layout, str):
        raise SourceError(f"source {f.path!r} is not a JSON array of records: {layout}; fix the file, or "
                          "write one record per line (JSONL)")
    seps = layout.separators
    return [Partition(f.path, "json", int(seps[k]) + 1, int(seps[min(k + per, layout.count)]), k, root,
                      f.name) for k in range(0, layout.count, per)]


def _looks_like_jsonl(path: str) -> bool:
    """A ``.json`` file whose first line is a whole JSON object is JSON Lines."""
    with open(path, "rb") as fh:
        head = fh.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
        if not head.startswith(b"{"):
            return False
        fh.seek(0)
        first = fh.readline().lstrip(b"\xef\xbb\xbf")
    try:
        return isinstance(json.loads(first), dict)
    except ValueError:
        return False


def _cut_parquet(f: _SourceFile, root: str, per: int, where: str) -> list[Partition]:
    try:
        with open_input(where) as fh:
            meta = pq.ParquetFile(fh).metadata
    except (pa.ArrowException, ValueError) as e:
        raise SourceError(f"source {f.path!r} is not a readable Parquet file ({e})") from None
    _check_columns(meta.schema.to_arrow_schema().names, f.path)
    rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    return [Partition(f.path, "parquet", a, b, first, root, f.name) for a, b, first in _merge(rows, per)]


def _cut_arrow(f: _SourceFile, root: str, per: int, local: str) -> list[Partition]:
    rows: list[int] = []
    for batch in arrow_batches(local, shown=f.path):
        if not rows:
            _check_columns(batch.schema.names, f.path)
        rows.append(batch.num_rows)
    return [Partition(f.path, "arrow", first, first + sum(rows[a:b]), first, root, f.name)
            for a, b, first in _merge(rows, per)]


def _cut_wds(f: _SourceFile, root: str, per: int, where: str) -> list[Partition]:
    """Local shards are cut at sample boundaries found from tar headers; a remote one is one partition."""
    if is_url(where):
        fs, inner = filesystem(where)
        return [Partition(f.path, "wds", 0, int(fs.size(inner)), 0, root, f.name)]
    bounds, _ = scan_groups(where, every=per)
    size = os.path.getsize(where)
    stops = [b[0] for b in bounds[1:]] + [size]
    return [Partition(f.path, "wds", start, stop, row, root, f.name) for (start, row), stop in zip(bounds, stops)] \
        or [Partition(f.path, "wds", 0, size, 0, root, f.name)]


def _check_columns(names: list[str], path: str) -> None:
    wanted = (*TEXT_COLUMNS, *DOCUMENT_COLUMNS)
    if not any(c in names for c in wanted):
        raise SourceError(f"source {path!r} has columns {names[:12]} but none of "
                          f"{list(wanted)}; rename the column that holds the conversation or the text")


def _merge(rows: list[int], per: int) -> Iterator[tuple[int, int, int]]:
    """Group consecutive units (row groups, batches) into runs of about ``per`` rows:
    ``(first unit, stop unit, first row)``; empty units join their neighbours."""
    start = first = total = 0
    for i, n in enumerate(rows):
        total += n
        if total - first >= per:
            yield start, i + 1, first
            start, first = i + 1, total
    if total > first:
        yield start, len(rows), first


def arrow_batches(path: str, *, shown: str | None = None) -> Iterator[pa.RecordBatch]:
    """The record batches of an Arrow IPC file, streaming format (what ``save_to_disk`` writes)
    or file format; a local file is memory-mapped, so batches that are skipped cost nothing
    (a remote one is read from its start). ``shown`` names the file in errors.

    Raises:
        SourceError: the file is not Arrow IPC.
    """
    shown = shown or path
    opened = open_input(path) if is_url(path) else pa.memory_map(path)
    with opened as source:  # batches keep a mapping alive after close
        try:
            try:
                reader = pa.ipc.open_stream(source)
            except pa.ArrowInvalid:
                source.seek(0)
                file_reader = pa.ipc.open_file(source)
                yield from (file_reader.get_batch(i) for i in range(file_reader.num_record_batches))
                return
            yield from reader
        except pa.ArrowInvalid as e:
            raise SourceError(f"source {shown!r} is not a readable Arrow IPC file ({e}); expected the "
                              "data-*.arrow files of a save_to_disk folder") from None
