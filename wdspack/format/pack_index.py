"""The pack index: each pack's byte offset and costs, readable without opening a shard.

``pack_index.npy`` sits beside ``manifest.json``: one row per pack, in manifest order (shard by
shard, packs in key order), ``int64`` columns :data:`COLUMNS`:

============== =================================================================================
offset         byte offset of the pack's tar header in its shard (a reader starts there: one
               ranged request reaches any pack, no bytes before it are read)
tokens         tokens of the pack (without padding)
attention      Σ over sub-samples of length²: what attention costs, up to a constant
samples        sub-samples
images         images and videos (the visual inputs ``max_images`` counts)
image_tokens   tokens the images and videos occupy (what the vision encoder sees, up to a constant)
targets        trained tokens (labels other than -100, the first token of a sub-sample excluded)
============== =================================================================================

The manifest names it under ``pack_index`` (file, columns, bytes, sha256). A reader that does not
know the key ignores it; wdspack checks the digest and the shape before it trusts a row. The file
is a plain ``.npy`` loaded with ``allow_pickle=False``.

:class:`CostModel` turns the columns into one cost per pack (``PackedDataset(balance="cost")``).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import ConfigError, ManifestError

__all__ = ["COLUMNS", "INDEX_NAME", "CostModel", "build_index", "decode_index", "encode_index", "index_entry",
           "member_offsets", "pack_row", "read_index"]

INDEX_NAME = "pack_index.npy"
COLUMNS = ("offset", "tokens", "attention", "samples", "images", "image_tokens", "targets")
_MAX_INDEX_BYTES = 1 << 31


def build_index(shard_plans: Sequence[Sequence[np.ndarray]], offsets: Sequence[Sequence[int]],
                table: dict[str, np.ndarray]) -> np.ndarray:
    """Rows of :data:`COLUMNS` for packs given as sample indices into ``table`` (one list per shard).

    ``table`` holds per-sample ``tokens``, ``media`` and ``media_tokens`` (every kind's items and their tokens,
    which the index's ``images`` and ``image_tokens`` columns count) and ``targets``;
    ``offsets[j][k]`` is where pack ``k`` of shard ``j`` starts in the shard's bytes.

    Example:
        >>> t = {"tokens": np.array([3, 2, 4]), "media": np.array([1, 0, 0]),
        ...      "media_tokens": np.array([2, 0, 0]), "targets": np.array([1, 1, 2])}
        >>> build_index([[np.array([0, 1]), np.array([2])]], [[0, 1024]], t).tolist()
        [[0, 5, 13, 2, 1, 2, 2], [1024, 4, 16, 1, 0, 0, 2]]
    """
    packs = [p for plan in shard_plans for p in plan]
    flat_offsets = [int(o) for shard in offsets for o in shard]
    if len(flat_offsets) != len(packs):
        raise ValueError(f"{len(flat_offsets)} pack offsets for {len(packs)} packs")
    out = np.zeros((len(packs), len(COLUMNS)), np.int64)
    if not packs:
        return out
    idx = np.concatenate([np.asarray(p, np.int64) for p in packs])
    starts = np.cumsum([0] + [len(p) for p in packs[:-1]])
    tok = table["tokens"][idx].astype(np.int64)

    def per_pack(values: np.ndarray) -> np.ndarray:
        return np.add.reduceat(values.astype(np.int64), starts)

    out[:, 0] = flat_offsets
    out[:, 1] = per_pack(tok)
    out[:, 2] = per_pack(tok * tok)
    out[:, 3] = [len(p) for p in packs]
    out[:, 4] = per_pack(table["media"][idx])
    out[:, 5] = per_pack(table["media_tokens"][idx])
    out[:, 6] = per_pack(table["targets"][idx])
    return out


def pack_row(offset: int, pack) -> list[int]:
    """The index row of a decoded :class:`~wdspack.format.pack.Pack` whose tar header starts at ``offset``."""
    lens = [int(n) for n in pack.seq_lens]
    starts = np.cumsum([0] + lens[:-1]).astype(np.int64)
    mask = np.asarray(pack.loss_mask)
    targets = int(mask.sum()) - (int(mask[starts].sum()) if lens else 0)
    return [int(offset), int(pack.num_tokens), sum(n * n for n in lens), int(pack.num_samples),
            sum(len(m) for m in pack.media.values()), sum(sum(m.tokens) for m in pack.media.values()), targets]


def encode_index(index: np.ndarray) -> bytes:
    """The ``.npy`` bytes of an index (little-endian int64, C order)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(index, dtype="<i8"), allow_pickle=False)
    return buf.getvalue()


def index_entry(data: bytes) -> dict:
    """The manifest's ``pack_index`` entry for the encoded index ``data``."""
    return {"file": INDEX_NAME, "columns": list(COLUMNS), "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}


def decode_index(data: bytes, entry: dict, *, packs: int, where: str) -> np.ndarray:
    """Check ``data`` against the manifest ``entry`` and return the ``[packs, columns]`` array."""
    if len(data) > _MAX_INDEX_BYTES or hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        raise ManifestError(f"{where} does not match the sha256 the manifest gives for it; the file was changed or "
                            "truncated: re-upload the dataset folder, or re-create it with `wdspack index DATASET`")
    try:
        index = np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as e:
        raise ManifestError(f"{where} is not a readable .npy array ({e})") from None
    columns = list(entry.get("columns", ()))
    if index.dtype != np.dtype("<i8") or index.ndim != 2 or index.shape != (packs, len(columns)):
        raise ManifestError(f"{where} holds a {index.dtype} array of shape {index.shape}; the manifest lists {packs} "
                            f"packs and columns {columns}")
    missing = [c for c in COLUMNS if c not in columns]
    if missing:
        raise ManifestError(f"{where} lacks the columns {missing}; re-create it with `wdspack index DATASET`")
    return index[:, [columns.index(c) for c in COLUMNS]]


def read_index(root: str, manifest) -> np.ndarray:
    """The checked ``[packs, columns]`` index of the dataset at ``root`` (a folder or an fsspec URL).

    Raises:
        FileNotFoundError: the manifest names a file that is not there.
        ManifestError: the manifest names none, or the file fails its checks.
    """
    import fsspec

    if not manifest.pack_index:
        raise ManifestError(f"{root} has no pack index; add one with `wdspack index DATASET`")
    name = manifest.pack_index["file"]
    with fsspec.open(f"{root}/{name}", "rb") as f:
        return decode_index(f.read(), manifest.pack_index, packs=manifest.num_packs, where=name)


@dataclass(frozen=True)
class CostModel:
    """What a pack costs a training step: a weighted sum of its index columns.

    The unit is one token through the language model's dense layers. The defaults are coarse: a
    sub-sample of ``l`` tokens adds ``l² / 4096`` for attention (at ``l = 4096`` as much as its
    dense layers), and every image adds a 1024-patch vision-encoder pass counted as 1024 tokens.
    Time a few steps of your own model and set the weights to fit; only their ratios matter.

    Costs are rounded to integers, so every rank computes the same plan bit for bit.

    Example:
        >>> CostModel().costs(np.array([[0, 4096, 4096 ** 2, 1, 0, 0, 4000]])).tolist()
        [8192]
    """

    tokens: float = 1.0
    attention: float = 1.0 / 4096
    images: float = 1024.0
    image_tokens: float = 0.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not (value >= 0 and np.isfinite(value)):
                raise ConfigError(f"CostModel.{name}={value!r} must be a finite weight >= 0")
        if not any(asdict(self).values()):
            raise ConfigError("CostModel has every weight at 0; give at least one a positive weight")

    def costs(self, index: np.ndarray) -> np.ndarray:
        """One ``int64`` cost per row of a pack index (columns :data:`COLUMNS`)."""
        col = {c: index[:, i].astype(np.float64) for i, c in enumerate(COLUMNS)}
        total = (self.tokens * col["tokens"] + self.attention * col["attention"] + self.images * col["images"]
                 + self.image_tokens * col["image_tokens"])
        return np.rint(total).astype(np.int64)

    @classmethod
    def coerce(cls, value: CostModel | dict | None) -> CostModel:
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(asdict(cls())))
            if unknown:
                raise ConfigError(f"cost weights {unknown} are unknown; use {sorted(asdict(cls()))}")
            return cls(**value)
        raise ConfigError(f"cost_model={value!r}: pass a wdspack.CostModel or a dict of its weights")


def member_offsets(f, *, where: str) -> list[int]:
    """Where each ``*.mp`` member's header starts in an open shard file (for shards already written)."""
    from ..storage.local import FileStream
    from .tar import tar_entries

    stream = FileStream(f)
    out = []
    for entry in tar_entries(stream, where=where):
        if entry.regular and entry.name.endswith(".mp"):
            out.append(entry.offset)
        stream.skip(entry.size)
    return out
