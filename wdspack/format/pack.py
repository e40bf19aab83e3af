"""Pack format v1: one msgpack map per pack. This module owns the bytes.

A pack holds several sub-samples back to back, unpadded::

    input_ids   <s> [INST] [IMG] [IMG] hi [/INST] hello </s> | <s> [INST] 2+2 [/INST] 4 </s>
    loss_mask    0     0     0     0    0     0       1    1  |  0    0     0     0     1  1
    seq_lens    [8, 6]               sample_ids ["a", "b"]
    images      [<jpeg bytes>]       image_sample [0]        image_tokens [2]

Every media kind (:data:`wdspack.media.KINDS`) has the same keys: ``{plural}`` (each item's bytes as in the
source), ``{name}_sample`` and ``{name}_tokens``, and ``{name}_plans`` for a kind planned at pack time (a video's
frames, size and grid). The image keys are in every pack; another kind's only in packs that hold one (so image
and text packs keep their bytes; a v1 reader that does not know them ignores them).

:func:`encode_pack` and :func:`decode_pack` are mirrors; the golden shard in ``tests/``
pins the exact bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack
import numpy as np

from ..errors import FormatError, NewerFormatError
from ..media import KINDS, Media, MediaKind, by_kind, by_name, read_spelled, spelled

__all__ = ["FORMAT", "MAX_PACK_BYTES", "Media", "Pack", "decode_pack", "drop_sample", "encode_pack", "pad_samples",
           "token_dtype_for", "validate_pack"]

FORMAT = "wdspack/1"
_TOKEN_DTYPES = ("<u2", "<u4")
_KEYS = ("format", "token_dtype", "input_ids", "loss_mask", "seq_lens", "sample_ids",
         *(key for kind in KINDS if kind.always_stored for key in kind.keys))
# Bounds for untrusted bytes: a pack never needs more than this.
MAX_PACK_BYTES = 1 << 31
_MAX_ITEMS = 1 << 22
#: A kind's fields by their pack keys (``pack.images``, ``pack.video_plans``): the v1 spelling.
_FIELD_OF = spelled("data", "sample", "tokens", "plans")


@dataclass(frozen=True, slots=True, init=False)
class Pack:
    """One pack: sub-samples concatenated without padding (see the module docstring), and its ``media`` by
    kind (every kind of :data:`~wdspack.media.KINDS`, empty where the pack holds none).

    A kind's fields also read, and construct, by their pack keys: ``pack.images``, ``pack.video_tokens``,
    ``Pack(..., images=(png,), image_sample=(0,), image_tokens=(4,))`` (or, after ``sample_ids``, by position in
    the keys' order).

    Example:
        >>> p = Pack(np.array([1, 2]), np.array([0, 1]), (2,), ("a",), images=(b"png",), image_sample=(0,),
        ...          image_tokens=(1,))
        >>> p.media["image"].tokens, p.images, p.count("video")
        ((1,), (b'png',), 0)
    """

    input_ids: np.ndarray  # 1-D unsigned ints
    loss_mask: np.ndarray  # 1-D uint8, same length
    seq_lens: tuple[int, ...]
    sample_ids: tuple[str, ...]
    media: Mapping[str, Media] = field(default_factory=dict)

    def __init__(self, input_ids: np.ndarray, loss_mask: np.ndarray, seq_lens: tuple[int, ...],
                 sample_ids: tuple[str, ...], *by_position: Any, media: Mapping[str, Media] | None = None,
                 **by_key: Any) -> None:
        by_key = by_name("Pack", list(_FIELD_OF), by_position, by_key, fixed=4)  # the v1 keys' order
        media = by_kind(media, _FIELD_OF, by_key, owner="Pack")
        for name, value in (("input_ids", input_ids), ("loss_mask", loss_mask), ("seq_lens", seq_lens),
                            ("sample_ids", sample_ids), ("media", media)):
            object.__setattr__(self, name, value)

    def __getattr__(self, key: str) -> Any:  # a kind's field by its pack key (pack.images, pack.video_plans)
        return read_spelled(self, key, _FIELD_OF)

    def count(self, kind: str) -> int:
        """How many items of ``kind`` the pack holds."""
        return len(self.media[kind])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_samples(self) -> int:
        return len(self.seq_lens)


def drop_sample(pack: Pack, index: int) -> Pack:
    """``pack`` without its sub-sample ``index``: the pack the other sub-samples make on their own, in their order.

    Its tokens, loss mask, length and id go, and its media of every kind with their per-item fields; the
    media of later sub-samples name their owner one lower; every other field is kept. Dropping the last
    sub-sample leaves a pack of none (no tokens, no media), which is valid.

    Example:
        >>> p = Pack(np.array([1, 2, 3, 4, 5]), np.array([0, 1, 0, 1, 1]), (2, 3), ("a", "b"),
        ...          images=(b"png",), image_sample=(1,), image_tokens=(1,))
        >>> q = drop_sample(p, 0)
        >>> q.input_ids.tolist(), q.seq_lens, q.sample_ids, q.image_sample
        ([3, 4, 5], (3,), ('b',), (0,))
    """
    if not 0 <= index < pack.num_samples:
        raise IndexError(f"sub-sample {index} is not in the pack's 0..{pack.num_samples - 1}; pass one of those")
    start = sum(pack.seq_lens[:index])
    keep = np.ones(pack.num_tokens, bool)
    keep[start:start + pack.seq_lens[index]] = False
    media = {name: items.keep([k for k, owner in enumerate(items.sample) if owner != index], dropped=index)
             for name, items in pack.media.items()}
    return replace(
        pack, input_ids=pack.input_ids[keep], loss_mask=pack.loss_mask[keep],
        seq_lens=pack.seq_lens[:index] + pack.seq_lens[index + 1:],
        sample_ids=pack.sample_ids[:index] + pack.sample_ids[index + 1:], media=media)


def pad_samples(pack: Pack, *, multiple: int, pad_token_id: int) -> Pack:
    """``pack`` with every sub-sample padded at its end to a multiple of ``multiple`` tokens (``pad_token_id``,
    loss mask 0): the layout a pack planned for context parallelism is loaded in (``multiple = 2·cp``).

    The padding comes after the sub-sample's last token, so causally no real token sees it, and it has no
    target; media, ids and owners are kept. A pack whose lengths divide already is returned as it is.

    Example:
        >>> p = Pack(np.array([1, 2, 3, 4, 5]), np.array([0, 1, 0, 1, 1]), (2, 3), ("a", "b"))
        >>> q = pad_samples(p, multiple=4, pad_token_id=0)
        >>> q.input_ids.tolist(), q.loss_mask.tolist(), q.seq_lens
        ([1, 2, 0, 0, 3, 4, 5, 0], [0, 1, 0, 0, 0, 1, 1, 0], (4, 4))
    """
    lens = np.asarray(pack.seq_lens, np.int64)
    padded = -(-lens // multiple) * multiple
    if np.array_equal(lens, padded):
        return pack
    total = int(padded.sum())
    within = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)  # each token's offset in its sample
    at = np.repeat(np.cumsum(padded) - padded, lens) + within
    ids = np.full(total, pad_token_id, pack.input_ids.dtype)
    mask = np.zeros(total, pack.loss_mask.dtype)
    ids[at] = pack.input_ids
    mask[at] = pack.loss_mask
    return replace(pack, input_ids=ids, loss_mask=mask, seq_lens=tuple(int(n) for n in padded))


def token_dtype_for(vocab_size: int) -> str:
    """``"<u2"`` when every id fits in 16 bits, else ``"<u4"``.

    Example:
        >>> token_dtype_for(32_000), token_dtype_for(131_072)
        ('<u2', '<u4')
    """
    return "<u2" if vocab_size <= 1 << 16 else "<u4"


def encode_pack(pack: Pack, *, token_dtype: str) -> bytes:
    """Encode a pack as one msgpack map (keys in a fixed order, so bytes are deterministic).

    Example:
        >>> p = Pack(np.array([1, 2, 3]), np.array([0, 1, 1]), (3,), ("a",))
        >>> decode_pack(encode_pack(p, token_dtype="<u2")).seq_lens
        (3,)
    """
    if token_dtype not in _TOKEN_DTYPES:
        raise FormatError(f"token_dtype {token_dtype!r} is not one of {_TOKEN_DTYPES}")
    validate_pack(pack)
    ids = np.asarray(pack.input_ids)
    if ids.size and int(ids.max()) > np.iinfo(np.dtype(token_dtype)).max:
        raise FormatError(f"token id {int(ids.max())} does not fit token_dtype {token_dtype!r}; use '<u4'")
    record = {
        "format": FORMAT,
        "token_dtype": token_dtype,
        "input_ids": ids.astype(token_dtype, copy=False).tobytes(),
        "loss_mask": np.asarray(pack.loss_mask, dtype=np.uint8).tobytes(),
        "seq_lens": [int(n) for n in pack.seq_lens],
        "sample_ids": [str(s) for s in pack.sample_ids],
    }
    for kind in KINDS:  # a kind not always stored only when the pack holds one: other packs keep their bytes
        items = pack.media[kind.name]
        if kind.always_stored or items.data:
            record.update(_encode_media(kind, items))
    return msgpack.packb(record, use_bin_type=True)


def decode_pack(data: bytes, *, seq_len: int | None = None, max_images: int | None = None) -> Pack:
    """Decode and validate one pack (and, if given, its budgets). Raises :class:`FormatError` on anything malformed.

    Never executes code from the bytes: msgpack maps, lists, strings and bins only.

    Raises:
        NewerFormatError: the pack's ``format`` is ``wdspack/N`` with N above this reader's (the
            data is not corrupt: wdspack is too old for it).
        FormatError: anything else malformed, or over the budgets.
    """
    if len(data) > MAX_PACK_BYTES:
        raise FormatError(f"pack of {len(data)} bytes exceeds the {MAX_PACK_BYTES}-byte limit")
    try:
        record = msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=True,
            max_bin_len=MAX_PACK_BYTES, max_str_len=1 << 20,
            max_array_len=_MAX_ITEMS, max_map_len=1024, max_ext_len=0,
        )
    except Exception as e:  # msgpack raises several unrelated types on bad bytes
        raise FormatError(f"pack is not valid msgpack: {type(e).__name__}: {e}") from None
    if not isinstance(record, dict):
        raise FormatError(f"pack is a msgpack {type(record).__name__}, expected a map")
    fmt = record.get("format")
    if fmt != FORMAT:
        if isinstance(fmt, str) and _is_newer(fmt):
            raise NewerFormatError(f"pack format {fmt!r} is newer than this wdspack reads ({FORMAT!r}); upgrade "
                                   "wdspack (pip install -U wdspack)", found=fmt, supported=FORMAT)
        raise FormatError(f"pack format {fmt!r} is not {FORMAT!r}, the only one this reader reads")
    missing = [k for k in _KEYS if k not in record]
    if missing:
        raise FormatError(f"pack is missing keys {missing}")
    dtype = record["token_dtype"]
    if dtype not in _TOKEN_DTYPES:
        raise FormatError(f"token_dtype {dtype!r} is not one of {_TOKEN_DTYPES}")
    try:
        pack = Pack(
            input_ids=np.frombuffer(_as_bytes(record["input_ids"]), dtype=dtype),
            loss_mask=np.frombuffer(_as_bytes(record["loss_mask"]), dtype=np.uint8),
            seq_lens=tuple(_as_int(n) for n in record["seq_lens"]),
            sample_ids=tuple(_as_str(s) for s in record["sample_ids"]),
            media={kind.name: _decode_media(kind, record) for kind in KINDS},
        )
    except (TypeError, ValueError) as e:
        raise FormatError(f"pack has a field of the wrong type: {e}") from None
    validate_pack(pack, seq_len=seq_len, max_images=max_images)
    return pack


def validate_pack(pack: Pack, *, seq_len: int | None = None, max_images: int | None = None) -> None:
    """Check the invariants of format v1 (and, if given, the budgets). Raises :class:`FormatError`."""
    n = pack.input_ids.shape[0]
    if pack.input_ids.ndim != 1 or pack.loss_mask.shape != (n,):
        raise FormatError(f"input_ids ({n} tokens) and loss_mask ({pack.loss_mask.shape}) disagree")
    if len(pack.sample_ids) != len(pack.seq_lens):
        raise FormatError(f"{len(pack.sample_ids)} sample_ids for {len(pack.seq_lens)} seq_lens")
    if any(s <= 0 for s in pack.seq_lens) or sum(pack.seq_lens) != n:
        raise FormatError(f"seq_lens {list(pack.seq_lens)[:8]}... do not sum to the {n} tokens")
    for kind in KINDS:
        _validate_media(kind, pack.media[kind.name], len(pack.seq_lens), n)
    if pack.loss_mask.size and int(pack.loss_mask.max()) > 1:
        raise FormatError("loss_mask holds values other than 0 and 1")
    if seq_len is not None and n > seq_len:
        raise FormatError(f"pack has {n} tokens > seq_len {seq_len}")
    images = pack.count("image")
    if max_images is not None and images > max_images:
        raise FormatError(f"pack has {images} images > max_images {max_images}")


def _encode_media(kind: MediaKind, items: Media) -> dict[str, Any]:
    out: dict[str, Any] = {kind.plural: [bytes(b) for b in items.data],
                           f"{kind.name}_sample": [int(i) for i in items.sample],
                           f"{kind.name}_tokens": [int(n) for n in items.tokens]}
    if kind.plan_record is not None:
        out[f"{kind.name}_plans"] = [p.to_msgpack() for p in items.plans]
    return out


def _decode_media(kind: MediaKind, record: dict) -> Media:
    """A kind's items of a decoded pack: its keys all present, or (a kind not always stored) none."""
    present = [k for k in kind.keys if k in record]
    if not present:
        return Media()
    if len(present) != len(kind.keys):
        raise TypeError(f"a pack with {present} must have all of {list(kind.keys)}")
    plans = record.get(f"{kind.name}_plans", ())
    return Media(tuple(_as_bytes(b) for b in record[kind.plural]),
                 tuple(_as_int(i) for i in record[f"{kind.name}_sample"]),
                 tuple(_as_int(n) for n in record[f"{kind.name}_tokens"]),
                 tuple(kind.plan_record.from_msgpack(p) for p in plans))


def _validate_media(kind: MediaKind, items: Media, num_samples: int, num_tokens: int) -> None:
    lengths = [len(items.data), len(items.sample), len(items.tokens)]
    if kind.plan_record is not None:
        lengths.append(len(items.plans))
    elif items.plans:
        raise FormatError(f"{len(items.plans)} {kind.name}_plans for a kind without plans")
    if len(set(lengths)) > 1:
        named = ", ".join(f"{n} {key}" for n, key in zip(lengths, kind.keys))
        raise FormatError(f"{named}: the {('three', 'four')[len(lengths) - 3]} must agree")
    if any(not 0 <= i < num_samples for i in items.sample):
        raise FormatError(f"{kind.name}_sample {list(items.sample)} names a sub-sample outside 0..{num_samples - 1}")
    if list(items.sample) != sorted(items.sample):
        raise FormatError(f"{kind.name}_sample {list(items.sample)} is not in token order")
    if any(t < 0 for t in items.tokens):
        raise FormatError(f"negative {kind.name}_tokens {list(items.tokens)}")
    if items.data and kind.check is not None:
        kind.check(items, num_tokens)


def _is_newer(fmt: str) -> bool:
    """``fmt`` names a later version of this format: ``wdspack/N``, N above this reader's."""
    name, _, version = FORMAT.partition("/")
    found = fmt.removeprefix(name + "/")
    return found != fmt and found.isascii() and found.isdigit() and int(found) > int(version)


def _as_bytes(v: object) -> bytes:
    if not isinstance(v, (bytes, bytearray)):
        raise TypeError(f"expected bin, got {type(v).__name__}")
    return bytes(v)


def _as_int(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected int, got {type(v).__name__}")
    return v


def _as_str(v: object) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected str, got {type(v).__name__}")
    return v
