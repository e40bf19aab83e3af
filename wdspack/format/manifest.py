"""``manifest.json``: what a packed dataset holds, written last (its presence means complete).

The loader reads it once and never lists a remote folder again. Everything in it is
deterministic (no timestamps, no host names, no credentials), so two runs with the same inputs
and seed write the same bytes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import ManifestError
from ..media import KINDS
from .pack import FORMAT

__all__ = ["MANIFEST_NAME", "DROPPED_NAME", "Manifest", "ShardInfo", "image_token_budget", "read_manifest",
           "write_json_atomic"]

MANIFEST_NAME = "manifest.json"
DROPPED_NAME = "dropped.jsonl"


#: A shard entry's v1 spelling of each kind's numbers: ``images`` (items), ``videos`` and ``max_video_tokens``
#: (items, the most of its tokens in one pack), ... (images' most tokens are the totals' business).
_SHARD_MEDIA = {key: (kind.name, part) for kind in KINDS
                for key, part in ((kind.plural, 0), *(() if kind.always_stored else ((f"max_{kind.name}_tokens", 1),)))}
#: Its v1 positional order: after ``name, packs, samples, tokens``, the images, then bytes and sha256, then each
#: later kind's two numbers (the work folder keeps an entry as this row).
_SHARD_ORDER = ("images", "bytes", "sha256", *(key for key in _SHARD_MEDIA if key != "images"))


@dataclass(frozen=True, slots=True, init=False)
class ShardInfo:
    """One shard as the manifest lists it: its media by kind (``media["video"] = (items, most tokens in a
    pack)``), each kind's numbers also read and constructed by their v1 spelling (``info.images``,
    ``info.max_video_tokens``, ``ShardInfo(..., videos=2, max_video_tokens=90)``, or by position in
    :meth:`row`'s order).

    Example:
        >>> info = ShardInfo("train-000000.tar", 4, 9, 4000, 3, 1024, "ab", videos=2, max_video_tokens=90)
        >>> info.images, info.videos, info.media["video"], info.audios
        (3, 2, (2, 90), 0)
    """

    name: str
    packs: int
    samples: int
    tokens: int
    bytes: int
    sha256: str
    media: Mapping[str, tuple[int, int]]

    def __init__(self, name: str, packs: int, samples: int, tokens: int, *by_position: Any,
                 media: Mapping[str, tuple[int, int]] | None = None, **by_key: Any) -> None:
        if len(by_position) > len(_SHARD_ORDER):
            raise TypeError(f"ShardInfo() takes at most {4 + len(_SHARD_ORDER)} positional arguments")
        given = dict(zip(_SHARD_ORDER, by_position))
        for key, value in by_key.items():
            if key in given:
                raise TypeError(f"ShardInfo() got multiple values for argument {key!r}")
            if key not in _SHARD_ORDER:
                raise TypeError(f"ShardInfo() got an unexpected keyword argument {key!r}")
            given[key] = value
        for key in ("bytes", "sha256"):
            if key not in given:
                raise TypeError(f"ShardInfo() missing required argument: {key!r}")
        numbers = {kind.name: [0, 0] for kind in KINDS}
        for kind_name, (items, most) in (media or {}).items():
            numbers[kind_name] = [int(items), int(most)]
        for key, (kind_name, part) in _SHARD_MEDIA.items():
            if key in given:
                numbers[kind_name][part] = int(given[key])
        for field_name, value in (("name", name), ("packs", packs), ("samples", samples), ("tokens", tokens),
                                  ("bytes", given["bytes"]), ("sha256", given["sha256"]),
                                  ("media", {k: (n[0], n[1]) for k, n in numbers.items()})):
            object.__setattr__(self, field_name, value)

    def __getattr__(self, key: str) -> Any:  # a kind's numbers by their v1 spelling (info.videos)
        if key in _SHARD_MEDIA:
            kind_name, part = _SHARD_MEDIA[key]
            return self.media[kind_name][part]
        raise AttributeError(f"'ShardInfo' object has no attribute {key!r}")

    def row(self) -> list[Any]:
        """The entry as the work folder keeps it: ``name, packs, samples, tokens`` and the v1 order
        (``ShardInfo(*row)`` reads it back)."""
        head = [self.name, self.packs, self.samples, self.tokens]
        return head + [getattr(self, key) for key in _SHARD_ORDER]

    def to_dict(self) -> dict[str, Any]:
        """The manifest's JSON object: the v1 keys in their order; a kind not in every pack only where the shard
        holds some (a dataset without it keeps the manifest it always had)."""
        out: dict[str, Any] = {"name": self.name, "packs": self.packs, "samples": self.samples,
                               "tokens": self.tokens}
        for key in _SHARD_ORDER:
            kind_name = _SHARD_MEDIA.get(key, ("", 0))[0]
            if kind_name and kind_name != "image" and not self.media[kind_name][0]:
                continue
            out[key] = getattr(self, key)
        return out


@dataclass(frozen=True, slots=True)
class Manifest:
    """The dataset's table of contents and provenance.

    ``tokenizer`` holds name, vocab_size, pad_token_id, image_token, image_token_id,
    chat_template_sha256 and token_dtype. ``image_policy`` says how image token counts were
    decided (``{"kind": "fixed", "tokens_per_image": 64}``, ``{"kind": "processor", ...}``, or
    ``{"kind": "none"}``: text only).
    ``totals`` holds samples_read / samples_packed / samples_dropped / dropped_by_reason /
    packs / tokens / images / fill_ratio, and the fullest pack's max_samples_per_pack /
    max_images_per_pack / max_image_tokens_per_pack (what static batch shapes are sized from;
    ``max_images`` is None when packed without an image limit).
    """

    seq_len: int
    max_images: int | None
    algorithm: str
    seed: int
    tokenizer: dict[str, Any]
    image_policy: dict[str, Any]
    shards: tuple[ShardInfo, ...]
    totals: dict[str, Any]
    split: str = "train"
    sources: tuple[str, ...] = ()
    provenance: dict[str, Any] = field(default_factory=dict)
    dropped_file: str = DROPPED_NAME
    format: str = FORMAT
    wdspack_version: str = ""
    #: ``pack_index.npy`` beside the manifest (:mod:`wdspack.format.pack_index`): file, columns, bytes, sha256;
    #: {} if none
    pack_index: dict[str, Any] = field(default_factory=dict)
    #: The context-parallel degree the packs were planned for (``wdspack pack --cp``): every sub-sample's length
    #: padded to a multiple of ``2·cp`` fits the pack's ``seq_len`` (``totals["cp_padding"]`` tokens in all), and
    #: the loader inserts that padding. None (the key absent): planned at the real lengths.
    cp: int | None = None

    @property
    def num_packs(self) -> int:
        return sum(s.packs for s in self.shards)

    @property
    def max_images_per_pack(self) -> int | None:
        """The images of the fullest pack: ``totals["max_images_per_pack"]``, 0 for a dataset without
        images, None when unknown (a manifest written before the packer recorded it; the pack
        index's ``images`` column has it)."""
        recorded = self.totals.get("max_images_per_pack")
        if recorded is not None:
            return int(recorded)
        return 0 if not any(s.images for s in self.shards) else None

    def to_json(self) -> str:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["shards"] = [shard.to_dict() for shard in self.shards]
        order = ["format", "wdspack_version", "split", "seq_len", "max_images", "algorithm", "seed", "cp",
                 "tokenizer", "image_policy", "sources", "provenance", "totals", "dropped_file", "pack_index", "shards"]
        optional = ("pack_index", "cp")  # written where set: a manifest without them keeps its bytes
        return json.dumps({k: d[k] for k in order if k not in optional or d[k]}, indent=1, sort_keys=False,
                          ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        try:
            d = json.loads(text)
        except ValueError as e:
            raise ManifestError(f"manifest is not valid JSON: {e}") from None
        if not isinstance(d, dict):
            raise ManifestError("manifest is not a JSON object")
        if d.get("format") != FORMAT:
            raise ManifestError(f"manifest format {d.get('format')!r} is not supported by this reader, "
                                f"which reads {FORMAT!r}; upgrade wdspack or re-pack the data")
        try:
            shards = tuple(ShardInfo(**s) for s in d["shards"])
            return cls(
                seq_len=int(d["seq_len"]), max_images=d.get("max_images"), algorithm=d["algorithm"],
                seed=int(d["seed"]), tokenizer=dict(d["tokenizer"]), image_policy=dict(d["image_policy"]),
                shards=shards, totals=dict(d["totals"]), split=d.get("split", "train"),
                sources=tuple(d.get("sources", ())), provenance=dict(d.get("provenance", {})),
                dropped_file=d.get("dropped_file", DROPPED_NAME), format=d["format"],
                wdspack_version=d.get("wdspack_version", ""), pack_index=dict(d.get("pack_index") or {}),
                cp=int(d["cp"]) if d.get("cp") else None,
            )
        except (KeyError, TypeError) as e:
            raise ManifestError(f"manifest is missing or has a malformed field: {e}") from None


def image_token_budget(totals: Mapping[str, Any]) -> int | None:
    """The most image tokens one pack holds, as the batch's pixel rows are sized: ``max_image_tokens_per_pack``
    (which counts a pack's other media tokens with its images), or 0 where the dataset holds another kind (videos,
    audio) and no image (its batches then carry no image rows). None: not recorded.

    Example:
        >>> image_token_budget({"images": 0, "videos": 4, "max_image_tokens_per_pack": 1540})
        0
    """
    value = totals.get("max_image_tokens_per_pack")
    if value is not None and not totals.get("images") and any(totals.get(k.plural) for k in KINDS):
        return 0
    return None if value is None else int(value)


def read_manifest(root: str | os.PathLike[str]) -> Manifest:
    """Read ``manifest.json`` from a local dataset folder (or the path of the file itself)."""
    text = os.fspath(root)
    if "://" in text:
        raise ManifestError(f"{text}: this reads a local folder; download the dataset first (or pass the URL to "
                            "a command that streams it: inspect, verify, reshard, make_loader)")
    path = Path(text)
    if not path.exists():
        raise ManifestError(f"{text}: no such folder")
    if path.is_dir():
        path = path / MANIFEST_NAME
    if not path.exists():
        raise ManifestError(f"{text} holds no {MANIFEST_NAME}: not a packed dataset, or its pack job did not finish "
                            "(the manifest is written last: run the same `wdspack pack` command with --resume)")
    return Manifest.from_json(path.read_bytes())


def write_json_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write text to ``path`` through a temp name and ``os.replace`` (never half a file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
