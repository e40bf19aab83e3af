"""Pack format v1: one msgpack map per pack. This module owns the bytes.

A pack holds several sub-samples back to back, unpadded::

    input_ids   <s> [INST] [IMG] [IMG] hi [/INST] hello </s> | <s> [INST] 2+2 [/INST] 4 </s>
    loss_mask    0     0     0     0    0     0       1    1  |  0    0     0     0     1  1
    seq_lens    [8, 6]               sample_ids ["a", "b"]
    images      [<jpeg bytes>]       image_sample [0]        image_tokens [2]

A pack with videos carries four more keys (written only then, so image and text packs keep their
bytes; a v1 reader that does not know them ignores them): ``videos`` (each video file's bytes as in
the source), ``video_sample``, ``video_tokens`` and ``video_plans``, the frames the model's video
processor samples and what they become (:class:`VideoPlanRecord`), planned at pack time from the
container's header.

:func:`encode_pack` and :func:`decode_pack` are mirrors; the golden shard in ``tests/``
pins the exact bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import msgpack
import numpy as np

from ..errors import FormatError, NewerFormatError

__all__ = ["FORMAT", "MAX_PACK_BYTES", "MAX_VIDEO_FRAMES", "Pack", "VideoPlanRecord", "decode_pack", "drop_sample",
           "encode_pack", "token_dtype_for", "validate_pack"]

FORMAT = "wdspack/1"
_TOKEN_DTYPES = ("<u2", "<u4")
_KEYS = ("format", "token_dtype", "input_ids", "loss_mask", "seq_lens", "sample_ids",
         "images", "image_sample", "image_tokens")
# Bounds for untrusted bytes: a pack never needs more than this.
MAX_PACK_BYTES = 1 << 31
_MAX_ITEMS = 1 << 22
_VIDEO_KEYS = ("videos", "video_sample", "video_tokens", "video_plans")
#: The most frames one video's plan may name: what the loader will decode for it (a guard on untrusted packs).
MAX_VIDEO_FRAMES = 4096
_MAX_SIDE = 1 << 15
#: The most pixels one video's planned frames hold once resized (frames × height × width): a guard on untrusted packs.
_MAX_VIDEO_PIXELS = 1 << 31


@dataclass(frozen=True, slots=True)
class VideoPlanRecord:
    """What a pack stores of one video's plan: the ``frames`` to decode (indices in decoding order),
    the ``size`` ``(height, width)`` they are resized to, the vision ``grid`` ``(t, h, w)`` in patches,
    and the seconds one temporal patch spans (``second_per_grid_t``, Qwen2.5-VL's positions).

    Example:
        >>> VideoPlanRecord((0, 15, 30, 45), (56, 84), (2, 4, 6), 1.0).grid
        (2, 4, 6)
    """

    frames: tuple[int, ...]
    size: tuple[int, int]
    grid: tuple[int, int, int]
    second_per_grid_t: float

    def to_msgpack(self) -> dict:
        return {"frames": [int(i) for i in self.frames], "size": [int(v) for v in self.size],
                "grid": [int(v) for v in self.grid], "second_per_grid_t": float(self.second_per_grid_t)}

    @classmethod
    def from_msgpack(cls, d: object) -> VideoPlanRecord:
        if not isinstance(d, dict) or set(d) != {"frames", "size", "grid", "second_per_grid_t"}:
            raise TypeError(f"a video plan must be a map of frames, size, grid, second_per_grid_t, got {d!r:.80}")
        frames, size, grid, spg = d["frames"], d["size"], d["grid"], d["second_per_grid_t"]
        if not (isinstance(frames, list) and isinstance(size, list) and isinstance(grid, list)):
            raise TypeError("a video plan's frames, size and grid must be lists")
        if not isinstance(spg, float):
            raise TypeError(f"a video plan's second_per_grid_t must be a float, got {type(spg).__name__}")
        if len(size) != 2 or len(grid) != 3:
            raise TypeError(f"a video plan's size {size!r:.40} needs 2 values and its grid {grid!r:.40} 3")
        return cls(tuple(_as_int(i) for i in frames), (_as_int(size[0]), _as_int(size[1])),
                   (_as_int(grid[0]), _as_int(grid[1]), _as_int(grid[2])), spg)


@dataclass(frozen=True, slots=True)
class Pack:
    """One pack: sub-samples concatenated without padding (see the module docstring)."""

    input_ids: np.ndarray  # 1-D unsigned ints
    loss_mask: np.ndarray  # 1-D uint8, same length
    seq_lens: tuple[int, ...]
    sample_ids: tuple[str, ...]
    images: tuple[bytes, ...] = ()
    image_sample: tuple[int, ...] = ()
    image_tokens: tuple[int, ...] = ()
    videos: tuple[bytes, ...] = ()
    video_sample: tuple[int, ...] = ()
    video_tokens: tuple[int, ...] = ()
    video_plans: tuple[VideoPlanRecord, ...] = ()

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_samples(self) -> int:
        return len(self.seq_lens)

    @property
    def num_images(self) -> int:
        return len(self.images)

    @property
    def num_videos(self) -> int:
        return len(self.videos)


def drop_sample(pack: Pack, index: int) -> Pack:
    """``pack`` without its sub-sample ``index``: the pack the other sub-samples make on their own, in their order.

    Its tokens, loss mask, length and id go, and its images and videos with their per-media fields; the
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
    images = [k for k, owner in enumerate(pack.image_sample) if owner != index]
    videos = [k for k, owner in enumerate(pack.video_sample) if owner != index]

    def owners(of: tuple[int, ...], kept: list[int]) -> tuple[int, ...]:
        return tuple(of[k] - int(of[k] > index) for k in kept)

    def pick(values: tuple, kept: list[int]) -> tuple:
        return tuple(values[k] for k in kept)

    return replace(
        pack, input_ids=pack.input_ids[keep], loss_mask=pack.loss_mask[keep],
        seq_lens=pack.seq_lens[:index] + pack.seq_lens[index + 1:],
        sample_ids=pack.sample_ids[:index] + pack.sample_ids[index + 1:],
        images=pick(pack.images, images), image_sample=owners(pack.image_sample, images),
        image_tokens=pick(pack.image_tokens, images), videos=pick(pack.videos, videos),
        video_sample=owners(pack.video_sample, videos), video_tokens=pick(pack.video_tokens, videos),
        video_plans=pick(pack.video_plans, videos))


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
        "images": [bytes(b) for b in pack.images],
        "image_sample": [int(i) for i in pack.image_sample],
        "image_tokens": [int(n) for n in pack.image_tokens],
    }
    if pack.videos:  # only then: packs without video keep the bytes they always had
        record.update({"videos": [bytes(b) for b in pack.videos], "video_sample": [int(i) for i in pack.video_sample],
                       "video_tokens": [int(n) for n in pack.video_tokens],
                       "video_plans": [p.to_msgpack() for p in pack.video_plans]})
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
            images=tuple(_as_bytes(b) for b in record["images"]),
            image_sample=tuple(_as_int(i) for i in record["image_sample"]),
            image_tokens=tuple(_as_int(n) for n in record["image_tokens"]),
            **_video_fields(record),
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
    if not (len(pack.images) == len(pack.image_sample) == len(pack.image_tokens)):
        raise FormatError(f"{len(pack.images)} images, {len(pack.image_sample)} image_sample, "
                          f"{len(pack.image_tokens)} image_tokens: the three must agree")
    if any(not 0 <= i < len(pack.seq_lens) for i in pack.image_sample):
        raise FormatError(f"image_sample {list(pack.image_sample)} names a sub-sample outside "
                          f"0..{len(pack.seq_lens) - 1}")
    if list(pack.image_sample) != sorted(pack.image_sample):
        raise FormatError(f"image_sample {list(pack.image_sample)} is not in token order")
    if any(t < 0 for t in pack.image_tokens):
        raise FormatError(f"negative image_tokens {list(pack.image_tokens)}")
    if pack.videos or pack.video_sample or pack.video_tokens or pack.video_plans:
        _validate_videos(pack)
    if pack.loss_mask.size and int(pack.loss_mask.max()) > 1:
        raise FormatError("loss_mask holds values other than 0 and 1")
    if seq_len is not None and n > seq_len:
        raise FormatError(f"pack has {n} tokens > seq_len {seq_len}")
    if max_images is not None and len(pack.images) > max_images:
        raise FormatError(f"pack has {len(pack.images)} images > max_images {max_images}")


def _video_fields(record: dict) -> dict:
    """The optional video keys of a decoded pack (all four, or none)."""
    present = [k for k in _VIDEO_KEYS if k in record]
    if not present:
        return {}
    if len(present) != len(_VIDEO_KEYS):
        raise TypeError(f"a pack with {present} must have all of {list(_VIDEO_KEYS)}")
    return {"videos": tuple(_as_bytes(b) for b in record["videos"]),
            "video_sample": tuple(_as_int(i) for i in record["video_sample"]),
            "video_tokens": tuple(_as_int(n) for n in record["video_tokens"]),
            "video_plans": tuple(VideoPlanRecord.from_msgpack(p) for p in record["video_plans"])}


def _validate_videos(pack: Pack) -> None:
    n = len(pack.videos)
    if not (n == len(pack.video_sample) == len(pack.video_tokens) == len(pack.video_plans)):
        raise FormatError(f"{n} videos, {len(pack.video_sample)} video_sample, {len(pack.video_tokens)} video_tokens, "
                          f"{len(pack.video_plans)} video_plans: the four must agree")
    if any(not 0 <= i < len(pack.seq_lens) for i in pack.video_sample) \
            or list(pack.video_sample) != sorted(pack.video_sample):
        raise FormatError(f"video_sample {list(pack.video_sample)} is not in token order within "
                          f"0..{len(pack.seq_lens) - 1}")
    for k, (plan, tokens) in enumerate(zip(pack.video_plans, pack.video_tokens)):
        frames = plan.frames
        if not frames or len(frames) > MAX_VIDEO_FRAMES or min(frames) < 0 or list(frames) != sorted(frames):
            raise FormatError(f"video {k}'s plan names {len(frames)} frames {list(frames)[:8]}...; a plan names "
                              f"1 to {MAX_VIDEO_FRAMES} frames in order")
        if not all(0 < v <= _MAX_SIDE for v in plan.size) or not all(0 < v <= _MAX_SIDE for v in plan.grid):
            raise FormatError(f"video {k}'s plan has size {plan.size} and grid {plan.grid}; both must be positive")
        if len(frames) * plan.size[0] * plan.size[1] > _MAX_VIDEO_PIXELS:  # what the loader resizes them to
            raise FormatError(f"video {k}'s plan resizes {len(frames)} frames to {plan.size[1]}x{plan.size[0]}: over "
                              f"{_MAX_VIDEO_PIXELS} pixels a video")
        if tokens < 0 or not 0 <= plan.second_per_grid_t < math.inf:  # 0: a family without time (LLaVA-OneVision)
            raise FormatError(f"video {k} has {tokens} tokens and {plan.second_per_grid_t} seconds per temporal patch")
    if sum(pack.video_tokens) > len(pack.input_ids):
        raise FormatError(f"the videos take {sum(pack.video_tokens)} tokens of a pack of {len(pack.input_ids)}")


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
