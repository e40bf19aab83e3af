"""Several datasets in one job: each source with its own image root, and the meta files that list them.

A SOURCE is written ``PATH[#NAMES][::ROOT]``::

    llava.jsonl                          a file, folder or glob; images relative to --image-root
                                         (default: the file's folder)
    ai2d.jsonl::imgs/ai2d                its own image root
    shell/data/finetune.json             an InternVL meta file: every dataset it lists, each with
                                         its own ``root``
    data/dataset_info.json#mllm_demo,identity
                                         LLaMA-Factory's dataset list: the datasets named
    scripts/train/single_image.yaml::/data/images
                                         a LLaVA-NeXT data YAML: its ``json_path`` files, images
                                         under the root given (LLaVA's --image_folder)

=====================  =======================================================================
meta file              read
=====================  =======================================================================
InternVL meta JSON     ``{"name": {"root", "annotation", "repeat_time", ...}}``; ``root`` is the
                       image root (``""``: the SOURCE's root); ``data_augment``, ``length``,
                       ``max_dynamic_patch`` and the other training knobs are ignored;
                       ``repeat_time`` other than 1 is refused (a repeated record is a duplicate)
LLaMA-Factory          ``dataset_info.json``: ``file_name`` (relative to its folder, which is also
                       the image root, LLaMA-Factory's ``media_dir``), ``formatting`` alpaca or
                       sharegpt, ``columns`` renamed onto wdspack's fields, ``tags`` (role and
                       content keys, role values); hub entries, preference (``ranking``) and KTO
                       data are refused naming the key
LLaVA-NeXT data YAML   ``datasets: [{json_path, sampling_strategy}]``; ``"all"`` only
=====================  =======================================================================

Relative paths in a meta file are looked up next to the meta file, then in the current folder
(InternVL and LLaVA-NeXT publish theirs relative to the folder training runs in).

Every source has a name: a meta file's dataset name, else its path relative to the folder that
holds all the plain sources of the job (extension dropped), e.g. ``ai2d`` and ``chartqa`` for
``cauldron/ai2d cauldron/chartqa``. When one id appears in two sources of a job (InternVL counts
from 0 in every file; the_cauldron's subsets share file names, so ``{file}:{row}`` ids repeat),
those samples are packed as ``{source}/{id}`` (:func:`namespaced`); ids unique in the job keep
their own name.

Example:
    >>> parse_source("ai2d.jsonl::imgs/ai2d")
    Source(path='ai2d.jsonl', image_root='imgs/ai2d', name=None, datasets=(), row_map=None)
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ...errors import ConfigError, SourceError
from ...storage.fsspec import filesystem
from ...storage.location import open_input
from ...storage.urls import is_url, local_path
from .records import ROLE_ALIASES

__all__ = ["RowMap", "Source", "collision_key", "expand_sources", "namespaced", "parse_source"]

ROOT_SEPARATOR = "::"
_META_MAX_BYTES = 16 << 20  # a meta file lists datasets; a bigger .json is data, never parsed whole here
_DATA_EXTENSIONS = (".jsonl", ".json", ".parquet", ".arrow", ".tar")
_LF_HUB_KEYS = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")
# LLaMA-Factory's tags (role values) -> the role names wdspack's reader takes.
_LF_ROLE_TAGS = {"user_tag": "user", "assistant_tag": "assistant", "observation_tag": "observation",
                 "function_tag": "function_call", "system_tag": "system"}
_LF_TAG_DEFAULTS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                    "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system"}
# LLaMA-Factory column keys -> wdspack's field, per formatting (None: not SFT data, refused).
_LF_ALPACA = {"prompt": "instruction", "query": "input", "response": "output", "history": "history",
              "system": "system", "tools": "tools", "images": "images", "videos": "videos", "audios": "audios"}
_LF_SHAREGPT = {"messages": "conversations", "system": "system", "tools": "tools", "images": "images",
                "videos": "videos", "audios": "audios"}
_LF_NOT_SFT = ("chosen", "rejected", "kto_tag")


@dataclass(frozen=True, slots=True)
class RowMap:
    """How one dataset's rows are renamed onto wdspack's record layout (LLaMA-Factory's ``columns``
    and ``tags``). Only the mapped columns (and ``id``) are kept, as LLaMA-Factory reads only them.

    Attributes:
        columns: ``(their column, wdspack field)`` pairs.
        messages: their conversation column (ShareGPT), rewritten as ``conversations`` turns
            ``{"from", "value"}``; None for Alpaca rows.
        role_tag, content_tag: the keys of a turn's role and content.
        roles: ``(their role value, wdspack role)`` pairs; other role values pass unchanged.

    Example:
        >>> m = RowMap(columns=(("dialog", "conversations"),), messages="dialog", role_tag="speaker",
        ...            content_tag="text", roles=(("A", "user"), ("B", "assistant")))
        >>> m.apply({"dialog": [{"speaker": "A", "text": "Hi"}, {"speaker": "B", "text": "Hello"}]})
        {'conversations': [{'from': 'user', 'value': 'Hi'}, {'from': 'assistant', 'value': 'Hello'}]}
    """

    columns: tuple[tuple[str, str], ...]
    messages: str | None = None
    role_tag: str = "from"
    content_tag: str = "value"
    roles: tuple[tuple[str, str], ...] = ()

    def apply(self, row: Any) -> Any:
        """The row renamed; anything that is not an object passes unchanged (the reader drops it)."""
        if not isinstance(row, Mapping):
            return row
        out: dict[str, Any] = {"id": row["id"]} if "id" in row else {}
        for theirs, ours in self.columns:
            if theirs in row:
                out[ours] = self._turns(row[theirs]) if theirs == self.messages else row[theirs]
        return out

    def _turns(self, turns: Any) -> Any:
        if not isinstance(turns, list):
            return turns  # the reader names the wrong type
        roles = dict(self.roles)
        out = []
        for t in turns:
            if isinstance(t, Mapping):
                role = t.get(self.role_tag)
                t = {"from": roles.get(role, role) if isinstance(role, str) else role,
                     "value": t.get(self.content_tag)}
            out.append(t)
        return out


@dataclass(frozen=True, slots=True)
class Source:
    """One SOURCE of a pack job, in Python (the CLI's ``PATH[#NAMES][::ROOT]``).

    Attributes:
        path: a file, folder, glob or brace pattern, local or a URL; or a meta file.
        image_root: the folder (or URL) its image paths are relative to; None: ``image_root=``
            of the job, else each file's folder.
        name: the name its ids are prefixed with when they collide with another source's
            (default: derived from the path, see the module's docstring).
        datasets: for a meta file, the datasets to take (default: all it lists).
        row_map: column renames (set when a LLaMA-Factory entry needs them).

    Example:
        >>> str(Source("ai2d.jsonl", image_root="imgs/ai2d"))
        'ai2d.jsonl::imgs/ai2d'
    """

    path: str
    image_root: str | None = None
    name: str | None = None
    datasets: tuple[str, ...] = ()
    row_map: RowMap | None = None

    def __str__(self) -> str:
        text = self.path + (f"#{','.join(self.datasets)}" if self.datasets else "")
        return text + (f"{ROOT_SEPARATOR}{self.image_root}" if self.image_root is not None else "")


def parse_source(text: str | os.PathLike[str]) -> Source:
    """A SOURCE string ``PATH[#NAMES][::ROOT]`` as a :class:`Source`.

    ``#NAMES`` (comma-separated) selects datasets of a meta file; a ``#`` that is part of an
    existing path is left alone.

    Raises:
        ConfigError: more than one ``::``, or an empty PATH, ROOT or NAMES.

    Example:
        >>> parse_source("data/dataset_info.json#mllm_demo,identity").datasets
        ('mllm_demo', 'identity')
    """
    text = os.fspath(text)
    parts = text.split(ROOT_SEPARATOR)
    if len(parts) > 2 or not parts[0] or (len(parts) == 2 and not parts[1]):
        raise ConfigError(f"source {text!r}: write it as PATH or PATH::IMAGE_ROOT (one '::', both sides "
                          "non-empty)")
    path, root = parts[0], (parts[1] if len(parts) == 2 else None)
    datasets: tuple[str, ...] = ()
    head, sep, names = path.rpartition("#")
    if sep and head and "/" not in names and not (not is_url(path) and os.path.exists(local_path(path))):
        datasets = tuple(n.strip() for n in names.split(","))
        if not all(datasets):
            raise ConfigError(f"source {text!r}: name the datasets after '#', separated by commas "
                              "(e.g. dataset_info.json#mllm_demo,identity)")
        path = head
    return Source(path, image_root=root, datasets=datasets)


def collision_key(sample_id: str) -> str:
    """The id that decides a collision: a split document's pieces ``{id}#{k}`` count as ``id``.

    Example:
        >>> collision_key("doc-3#2"), collision_key("chat.jsonl:7")
        ('doc-3', 'chat.jsonl:7')
    """
    base, sep, k = sample_id.rpartition("#")
    return base if sep and base and k.isdigit() else sample_id


def namespaced(source: str, sample_id: str) -> str:
    """A sample id made unique in its job by its source's name.

    Example:
        >>> namespaced("chartqa", "0")
        'chartqa/0'
    """
    return f"{source}/{sample_id}"


def expand_sources(sources: Sequence[str | os.PathLike[str] | Source]) -> list[Source]:
    """Each source as a named :class:`Source`, meta files replaced by the datasets they list, in order.

    Raises:
        ConfigError: a malformed SOURCE, ``#NAMES`` on a source that is not a meta file, or a
            name that a meta file does not list.
        SourceError: a meta file that cannot be read, or that asks for what wdspack does not do
            (the error names the dataset, the key and the fix).

    Example:
        >>> [s.name for s in expand_sources(["cauldron/ai2d", "cauldron/chartqa"])]  # doctest: +SKIP
        ['ai2d', 'chartqa']
    """
    out: list[Source] = []
    for given in sources:
        src = given if isinstance(given, Source) else parse_source(given)
        kind = _meta_kind(src.path)
        if kind is None:
            if src.datasets:
                raise ConfigError(f"source {str(src)!r}: '#{','.join(src.datasets)}' selects datasets of a "
                                  "meta file (InternVL meta JSON, LLaMA-Factory dataset_info.json, LLaVA-NeXT "
                                  f"YAML), and {src.path!r} is not one; remove the '#...'")
            out.append(src)
            continue
        if src.name is not None:
            raise ConfigError(f"source {src.path!r} is a meta file: its datasets are named by it, so it takes "
                              "no name of its own; leave name= out")
        out.extend(_READERS[kind](src))
    return _named(out)


# ---- detection ------------------------------------------------------------------------------


def _meta_kind(path: str) -> str | None:
    """``"internvl" | "llamafactory" | "llava_next"`` for a meta file, None for data."""
    import glob

    lower = path.lower()
    if lower.endswith((".yaml", ".yml")):
        return "llava_next"
    if not lower.endswith(".json") or glob.has_magic(path):
        return None
    doc = _small_json(path)
    if not (isinstance(doc, dict) and doc and all(isinstance(v, dict) for v in doc.values())):
        return None
    if any(k in v for v in doc.values() for k in ("annotation", "root", "repeat_time")):
        return "internvl"
    if any(k in v for v in doc.values() for k in ("file_name", *_LF_HUB_KEYS)):
        return "llamafactory"
    return None


def _small_json(path: str) -> Any:
    """The parsed file when it is small and one JSON object (a meta file's shape); None otherwise."""
    try:
        if is_url(path):
            fs, inner = filesystem(path)
            if not fs.isfile(inner) or (fs.size(inner) or 0) > _META_MAX_BYTES:
                return None
        elif not os.path.isfile(local_path(path)) or os.path.getsize(local_path(path)) > _META_MAX_BYTES:
            return None
        with open_input(path) as f:
            head = f.read(1 << 16)
            if not head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{"):
                return None  # a JSON array: data
            data = head + f.read()
    except OSError:
        return None  # the partitioner reports the path
    try:
        return json.loads(data.decode("utf-8-sig"))
    except ValueError:
        return None  # JSON Lines (or broken): read as data


def _read_text(path: str, what: str) -> str:
    try:
        with open_input(path) as f:
            return f.read().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"{what} {path!r} cannot be read: {e}") from None


# ---- paths ----------------------------------------------------------------------------------


def _folder(path: str) -> str:
    return posixpath.dirname(path) if is_url(path) else os.path.dirname(local_path(path))


def _resolve(ref: str, meta: str, what: str) -> str:
    """A path named in a meta file: absolute or a URL as written; relative, next to the meta file,
    else in the current folder (where InternVL and LLaVA-NeXT run)."""
    if is_url(ref) or (not is_url(meta) and os.path.isabs(os.path.expanduser(ref))):
        return ref
    if is_url(meta):
        return posixpath.join(_folder(meta), ref)
    beside = os.path.join(_folder(meta), ref)
    if os.path.exists(beside) or not os.path.exists(ref):
        if not os.path.exists(beside):
            raise SourceError(f"{what} {ref!r} does not exist: looked in {_folder(meta)} (the meta file's "
                              f"folder) and {os.getcwd()} (the current folder); fix the path in {meta}")
        return beside
    return os.path.abspath(ref)


def _select(src: Source, names: list[str], kind: str) -> list[str]:
    if not src.datasets:
        return names
    missing = [n for n in src.datasets if n not in names]
    if missing:
        raise ConfigError(f"{kind} {src.path!r} lists no dataset named {missing[0]!r}; it lists "
                          f"{', '.join(names[:20])}{' ...' if len(names) > 20 else ''}")
    return list(dict.fromkeys(src.datasets))


# ---- InternVL -------------------------------------------------------------------------------


def _internvl(src: Source) -> list[Source]:
    """An InternVL meta file (internvl_chat/shell/data/*.json) as one source per dataset."""
    doc = json.loads(_read_text(src.path, "InternVL meta file"))
    out = []
    for name in _select(src, list(doc), "InternVL meta file"):
        entry = doc[name]
        where = f"InternVL meta file {src.path!r}, dataset {name!r}"
        if not isinstance(entry.get("annotation"), str) or not entry["annotation"]:
            raise SourceError(f"{where} has no 'annotation' path; give the JSONL file of its records")
        repeat = entry.get("repeat_time", 1)
        if repeat != 1:
            fix = ("weight it when training instead (pack it as its own dataset and give it a weight in the "
                   "mixture), or set repeat_time 1" if isinstance(repeat, (int, float)) and repeat > 1 else
                   "write the part to use to its own file and name that one, or set repeat_time 1")
            raise SourceError(f"{where} has repeat_time {repeat!r}; wdspack packs every record once (a "
                              f"repeated record is a duplicate id, a fraction is a subset): {fix}")
        root = entry.get("root") or None
        out.append(Source(_resolve(entry["annotation"], src.path, f"{where}: annotation"),
                          image_root=_resolve(root, src.path, f"{where}: root") if root else src.image_root,
                          name=name))
    return out


# ---- LLaMA-Factory --------------------------------------------------------------------------


def _llamafactory(src: Source) -> list[Source]:
    """LLaMA-Factory's ``data/dataset_info.json`` as one source per (selected) dataset."""
    doc = json.loads(_read_text(src.path, "LLaMA-Factory dataset_info.json"))
    data_dir = _folder(src.path)
    out = []
    for name in _select(src, list(doc), "LLaMA-Factory dataset_info.json"):
        where = f"LLaMA-Factory dataset_info.json {src.path!r}, dataset {name!r}"
        entry = doc[name]
        hub = next((k for k in _LF_HUB_KEYS if entry.get(k)), None)
        if hub is not None:
            raise SourceError(f"{where} is read from {hub} {entry[hub]!r}, not from a file here; download it "
                              "and pass its files as a SOURCE, or pick local datasets with "
                              f"'{src.path}#NAME,NAME'")
        if not isinstance(entry.get("file_name"), str) or not entry["file_name"]:
            raise SourceError(f"{where} has no 'file_name'; name its file or folder (relative to {data_dir})")
        row_map = _lf_row_map(entry, where)
        path = (entry["file_name"] if is_url(entry["file_name"]) or os.path.isabs(entry["file_name"])
                else (posixpath.join if is_url(data_dir) else os.path.join)(data_dir, entry["file_name"]))
        if not is_url(path) and not os.path.exists(path):
            raise SourceError(f"{where}: file_name {entry['file_name']!r} does not exist in {data_dir}; fix "
                              f"the entry, or leave the dataset out ('{src.path}#NAME,NAME' picks datasets)")
        media = entry.get("media_dir")  # newer LLaMA-Factory: this dataset's own media folder
        root = src.image_root if src.image_root is not None else (
            _resolve(media, src.path, f"{where}: media_dir") if media else data_dir)
        out.append(Source(path, image_root=root, name=name, row_map=row_map))
    return out


def _lf_row_map(entry: Mapping[str, Any], where: str) -> RowMap | None:
    """The renames an entry needs; None where wdspack reads its rows as they are."""
    known = {"file_name", "formatting", "columns", "tags", "split", "ranking", "subset", "folder", "num_samples",
             "media_dir"}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise SourceError(f"{where} has key {unknown[0]!r}, which wdspack does not read; remove it")
    if entry.get("ranking"):
        raise SourceError(f"{where} has 'ranking': true (preference data: chosen/rejected); wdspack packs "
                          "supervised chats: pack the chosen conversations as a chat file instead")
    for key, ok in (("split", "train"), ("subset", None), ("folder", None), ("num_samples", None)):
        if entry.get(key) not in (None, ok):
            fix = ("write the subset to its own file and name that one" if key == "num_samples"
                   else "name the file of that part directly")
            raise SourceError(f"{where} has {key} {entry[key]!r}; wdspack packs a local file whole: {fix}, "
                              f"and remove {key!r}")
    formatting = entry.get("formatting", "alpaca")
    if formatting not in ("alpaca", "sharegpt"):
        raise SourceError(f"{where} has formatting {formatting!r}; LLaMA-Factory's formats are 'alpaca' and "
                          "'sharegpt'")
    columns = entry.get("columns") or {}
    tags = entry.get("tags") or {}
    if not isinstance(columns, dict) or not isinstance(tags, dict):
        raise SourceError(f"{where}: 'columns' and 'tags' must be objects")
    fields = _LF_ALPACA if formatting == "alpaca" else _LF_SHAREGPT
    for key in columns:
        if key in _LF_NOT_SFT:
            raise SourceError(f"{where} has column {key!r} ({'KTO' if key == 'kto_tag' else 'preference'} "
                              "data); wdspack packs supervised chats: remove it and its column, or pack the "
                              "conversations as a chat file")
        if key not in fields:
            raise SourceError(f"{where} has column {key!r}, which the {formatting} format does not use; "
                              f"its columns are {', '.join(fields)}")
    for key in tags:
        if formatting != "sharegpt":
            raise SourceError(f"{where} has 'tags', which only the sharegpt format uses; remove them")
        if key not in _LF_TAG_DEFAULTS:
            raise SourceError(f"{where} has tag {key!r}; LLaMA-Factory's tags are {', '.join(_LF_TAG_DEFAULTS)}")
    if formatting == "alpaca":
        # LLaMA-Factory: with "columns", the columns not listed are unset (not their defaults); without
        # a response column the rows are pre-training text (its "pt" stage reads only the prompt).
        mapping = columns if "columns" in entry else {"prompt": "instruction", "query": "input", "response": "output"}
        if "prompt" in mapping and "response" not in mapping:
            cols: tuple[tuple[str, str], ...] = ((mapping["prompt"], "text"),)
        else:
            cols = tuple((mapping[k], _LF_ALPACA[k]) for k in _LF_ALPACA if k in mapping)
        return None if all(a == b for a, b in cols) else RowMap(columns=cols)
    t = {**_LF_TAG_DEFAULTS, **{k: str(v) for k, v in tags.items() if v is not None}}
    messages = columns.get("messages", "conversations")
    cols = tuple((columns.get(k, "conversations") if k == "messages" else columns[k], _LF_SHAREGPT[k])
                 for k in _LF_SHAREGPT if k == "messages" or k in columns)
    roles = tuple((t[k], ours) for k, ours in _LF_ROLE_TAGS.items())
    native = (messages in ("conversations", "messages") and t["role_tag"] in ("from", "role")
              and t["content_tag"] in ("value", "content")
              and all(ROLE_ALIASES.get(theirs.lower()) == ROLE_ALIASES[ours] and
                      (ours != "function_call" or theirs.lower() == "function_call") for theirs, ours in roles)
              and all(a == b for a, b in cols if a != messages))
    if native:
        return None
    return RowMap(columns=cols, messages=messages, role_tag=t["role_tag"], content_tag=t["content_tag"],
                  roles=roles)


# ---- LLaVA-NeXT -----------------------------------------------------------------------------


def _llava_next(src: Source) -> list[Source]:
    """A LLaVA-NeXT data YAML (scripts/train/*.yaml) as one source per ``json_path``."""
    import yaml

    try:
        doc = yaml.safe_load(_read_text(src.path, "LLaVA-NeXT data YAML"))
    except yaml.YAMLError as e:
        raise SourceError(f"LLaVA-NeXT data YAML {src.path!r} is not valid YAML: {e}") from None
    entries = doc.get("datasets") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise SourceError(f"{src.path!r} is not a LLaVA-NeXT data YAML: expected 'datasets:' with a list of "
                          "{json_path, sampling_strategy} entries")
    by_name: dict[str, dict] = {}
    for k, entry in enumerate(entries):
        if not isinstance(entry.get("json_path"), str):
            raise SourceError(f"LLaVA-NeXT data YAML {src.path!r}: dataset {k} has no 'json_path'")
        stem = posixpath.splitext(posixpath.basename(entry["json_path"]))[0]
        name, n = stem, 1
        while name in by_name:
            n += 1
            name = f"{stem}~{n}"
        by_name[name] = entry
    out = []
    for name in _select(src, list(by_name), "LLaVA-NeXT data YAML"):
        entry = by_name[name]
        where = f"LLaVA-NeXT data YAML {src.path!r}, dataset {entry['json_path']!r}"
        strategy = str(entry.get("sampling_strategy", "all")).strip()
        if strategy != "all":
            raise SourceError(f"{where} has sampling_strategy {strategy!r}; wdspack packs every record of a "
                              "file: write the part to use to its own file and name that one, or use \"all\"")
        out.append(Source(_resolve(entry["json_path"], src.path, f"{where}: json_path"), image_root=src.image_root,
                          name=name))
    return out


_READERS = {"internvl": _internvl, "llamafactory": _llamafactory, "llava_next": _llava_next}


# ---- names ----------------------------------------------------------------------------------


def _named(sources: list[Source]) -> list[Source]:
    """Names for the sources without one (relative to the folder holding them all), all unique."""
    unnamed = [s.path for s in sources if s.name is None]
    derived = iter(_derive_names(unnamed))
    out, taken = [], set()
    for s in sources:
        base = s.name if s.name is not None else next(derived)
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}~{n}"
        taken.add(name)
        out.append(s if s.name == name else replace(s, name=name))
    return out


def _derive_names(paths: list[str]) -> list[str]:
    """``cauldron/ai2d``, ``cauldron/chartqa`` -> ``ai2d``, ``chartqa``: each path relative to the
    deepest folder above all of them, data extensions dropped."""
    parts = [[p for p in (path if is_url(path) else local_path(path)).replace(os.sep, "/").split("/") if p]
             for path in paths]
    parents = [p[:-1] for p in parts]
    common = 0
    if parents:
        while all(len(p) > common and p[common] == parents[0][common] for p in parents):
            common += 1
    names = []
    for p in parts:
        rel = "/".join(p[common:]) or (p[-1] if p else "source")
        for ext in _DATA_EXTENSIONS:
            if rel.lower().endswith(ext):
                rel = rel[: -len(ext)]
                break
        names.append(rel or "source")
    return names
