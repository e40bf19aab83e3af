"""WebDataset shards of image + caption pairs (img2dataset output: LAION, COYO, CC3M, DataComp).

A shard is a tar whose members are grouped by key, as webdataset groups them: a member
``dir/000123.jpg`` has key ``dir/000123`` and extension ``jpg`` (everything after the first dot
of the file name), and consecutive members with the same key are one sample::

    000123.jpg   000123.txt   000123.json   000124.jpg   000124.txt ...
    └──────────── sample 000123 ─────────┘  └──── sample 000124 ───

The rule for each sample's members:

============================  ==================================================================
``jpg jpeg png webp``         the image: at most one (two or more: ``malformed_record``); its
                              bytes are kept as they are
``mp4 webm mkv mov avi``      the video: at most one, bytes as stored (empty or over
                              :data:`~wdspack.media.video.source.MAX_VIDEO_BYTES`: ``unreadable_video``, not read);
                              a sample needs an image or a video (neither: ``missing_image``)
``txt``                       the caption, UTF-8 text (stripped of surrounding whitespace)
``json``                      the caption when there is no ``txt``: its ``caption`` field, else
                              ``text`` (neither: ``malformed_record``)
anything else                 ignored, never read: metadata (``json`` when a ``txt`` exists,
                              ``parquet``, ``npy``, ``cls`` ...) and, in particular, pickles
                              (``pyd``, ``pickle``, ``pkl``), which are never decoded
============================  ==================================================================

A sample's id is ``{shard name}:{key}``. A tar that ends early (an interrupted download) or
holds a garbled header drops the sample being read with ``malformed_record`` (it may be missing
members), and a header that cannot be read drops the rest of the shard as one entry
``{shard name}:@{byte offset}``: the loss is listed, never silent. Only tar headers and the
members used are read; images and videos are not decoded here (the sample builder checks them,
as for every source). A video sample's segments are ``(VIDEO, caption)``; with an image too,
``(VIDEO, IMAGE, caption)``.
"""

from __future__ import annotations

import json
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field

from ...errors import Dropped, SampleError, SourceError
from ...format.tar import ShardError, tar_entries
from ...media import KINDS, MediaKind
from ...storage.local import FileStream
from ...storage.location import open_input
from .documents import SEGMENT_OF, Segment, TextRecord

__all__ = ["CAPTION_EXTENSIONS", "read_captions", "scan_groups", "split_member_name"]

CAPTION_EXTENSIONS = ("txt", "json")
_CAPTION_FIELDS = ("caption", "text")
_KEY_RE = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # webdataset's base_plus_ext


def split_member_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a tar member, as webdataset splits it; None for a name without one.

    Example:
        >>> split_member_name("part-0/000123.seg.png"), split_member_name("README")
        (('part-0/000123', 'seg.png'), None)
    """
    m = _KEY_RE.match(name)
    return (m.group(1), m.group(2)) if m else None


def scan_groups(path: str, *, every: int) -> tuple[list[tuple[int, int]], int]:
    """Byte offsets and indices of every ``every``-th sample of a local shard, from tar headers only.

    Returns ``([(offset of the sample's first member header, sample index), ...], samples)``;
    a shard that stops being readable ends the scan there (the reader reports it).

    Example:
        >>> scan_groups("shard-000000.tar", every=1000)  # doctest: +SKIP
        ([(0, 0), (3072512, 1000), ...], 10000)
    """
    out: list[tuple[int, int]] = []
    count = 0
    last_key: str | None = None
    with open(path, "rb") as f:
        try:
            for m in _members(f, 0):
                parts = split_member_name(m.name) if m.regular else None
                if parts is None or parts[0] == last_key:
                    continue
                if count % every == 0:
                    out.append((m.offset, count))
                last_key = parts[0]
                count += 1
        except tarfile.ReadError as e:
            if count == 0:
                raise SourceError(f"source {path!r} is not a tar file ({e}); WebDataset sources are .tar "
                                  "shards (uncompressed)") from None
    return out, count


@dataclass(frozen=True, slots=True)
class _Member:
    name: str
    offset: int  # of its (first) header
    offset_data: int
    size: int
    regular: bool


def _members(f, start: int) -> Iterator[_Member]:
    """The members of a tar from byte ``start``, from their headers alone (wdspack's own tar reader,
    :func:`wdspack.format.tar.tar_entries`: ustar, GNU long names, pax ``path``/``size``; several
    times faster than tarfile); ends at the end-of-archive block. The consumer may seek ``f``.

    Raises:
        _HeaderDamage: a header that is cut short, fails its checksum or claims an impossible size.
    """
    stream = FileStream(f, offset=start)
    try:
        for entry in tar_entries(stream, where=str(getattr(f, "name", "shard"))):
            data = stream.offset
            yield _Member(entry.name, entry.offset, data, entry.size, entry.regular)
            stream.offset = data  # the consumer may have read the member: skip from its start
            stream.skip(entry.size)
    except ShardError as e:
        raise _HeaderDamage(e.offset if e.offset is not None else stream.offset, str(e)) from None


class _HeaderDamage(tarfile.ReadError):
    """A header that is cut or garbled: the members after it are out of reach."""

    def __init__(self, offset: int, detail: str) -> None:
        super().__init__(detail)
        self.offset = offset


@dataclass(slots=True)
class _Group:
    key: str
    #: each kind's members, ``(extension, bytes)``
    media: dict[str, list[tuple[str, bytes]]] = field(default_factory=lambda: {kind.name: [] for kind in KINDS})
    problem: SampleError | None = None  # a video member found unreadable from its header alone
    captions: dict[str, bytes] = field(default_factory=dict)
    others: list[str] = field(default_factory=list)


def read_captions(path: str, *, start: int, stop: int, first_row: int,
                  name: str) -> Iterator[tuple[int, TextRecord | Dropped]]:
    """The samples of a shard whose first member lies in ``[start, stop)``, as caption records.

    ``path`` is local or a URL; only headers and the members used are read (seeks over the rest;
    a remote file's read-ahead makes that one sequential stream).

    Raises:
        SourceError: the bytes at ``start`` are not a tar.
    """
    with open_input(path) as f:
        row = first_row
        group: _Group | None = None
        at = start
        try:
            for m in _members(f, start):
                at = m.offset
                parts = split_member_name(m.name) if m.regular else None
                if parts is None:
                    continue
                key, ext = parts
                if group is None or key != group.key:
                    if group is not None:
                        yield row, _to_record(group, name)
                        row += 1
                        group = None
                    if m.offset >= stop:
                        return
                    group = _Group(key)
                _add_member(group, ext.lower(), f, m)
        except (tarfile.ReadError, EOFError) as e:
            at = e.offset if isinstance(e, _HeaderDamage) else at
            if group is None and row == first_row and at == start:
                raise SourceError(f"source {path!r} is not a readable tar at byte {start} ({e}); WebDataset "
                                  "sources are uncompressed .tar shards") from None
            fix = "re-download or re-write the shard"
            if group is not None:  # it may be missing members: never packed half
                yield row, Dropped(f"{name}:{group.key}", "malformed_record", f"the shard is truncated or "
                                   f"corrupt in sample {group.key!r} ({e}); {fix}")
                row += 1
            if isinstance(e, _HeaderDamage):  # what follows cannot be named: one entry stands for it
                yield row, Dropped(f"{name}:@{at}", "malformed_record", f"the members from byte {at} on cannot "
                                   f"be read ({e}); {fix}")
            return
        if group is not None:
            yield row, _to_record(group, name)


def _add_member(group: _Group, ext: str, f, m: _Member) -> None:
    """Read a member only when it is a kind's item (the image, the video) or a caption; every other member
    stays unread, and so does a kind's item of a size its kind refuses (``max_bytes``, from the tar header)."""
    kind: MediaKind | None = next((k for k in KINDS if ext in k.extensions), None)
    limit = kind.max_bytes() if kind is not None else 0
    if kind is not None and limit and (m.size == 0 or m.size > limit):
        what = "empty (0 bytes)" if m.size == 0 else f"{m.size:,} bytes, over the {limit:,}-byte limit"
        group.problem = group.problem or SampleError(
            f"unreadable_{kind.name}", f"{kind.name} member {group.key}.{ext} is {what}; re-encode it or drop the "
            "sample")
        group.media[kind.name].append((ext, b""))  # counted, never read
    elif kind is not None:
        group.media[kind.name].append((ext, _read(f, m)))
    elif ext in CAPTION_EXTENSIONS and ext not in group.captions:
        group.captions[ext] = _read(f, m)
    else:
        group.others.append(ext)


def _read(f, m: _Member) -> bytes:
    f.seek(m.offset_data)
    data = f.read(m.size)
    if len(data) != m.size:
        raise tarfile.ReadError(f"member {m.name!r} has {len(data)} of its {m.size} bytes")
    return data


def _to_record(group: _Group, name: str) -> TextRecord | Dropped:
    sid = f"{name}:{group.key}"
    try:
        if not any(group.media.values()):
            members = sorted(group.captions) + group.others
            names = [kind.name for kind in KINDS]
            kinds = ", ".join(names[:-1]) + " or " + names[-1]
            extensions = ", ".join("/".join(f".{e}" for e in kind.extensions) for kind in KINDS)
            raise SampleError("missing_image", f"sample {group.key!r} has no {kinds} member ({extensions}; its "
                              f"members: {members}); drop it from the shard or add the image")
        for what, found in group.media.items():
            if len(found) > 1:
                raise SampleError("malformed_record", f"sample {group.key!r} has {len(found)} {what} members "
                                  f"({[e for e, _ in found]}); a caption sample has at most one {what}")
        if group.problem is not None:
            raise group.problem
        caption = _caption(group)
        if not caption:
            raise SampleError("empty_conversation", f"sample {group.key!r} has an empty caption; there is "
                              "nothing to train on, remove it")
        # each kind's segment, the later kinds first (v1: a video before the image)
        segments: tuple[Segment, ...] = tuple(SEGMENT_OF[kind.name] for kind in reversed(KINDS)
                                              if group.media[kind.name])
        return TextRecord(sid, "caption", (*segments, caption),
                          media={kind: tuple(data for _, data in found) for kind, found in group.media.items()})
    except SampleError as e:
        return Dropped(sid, e.reason, e.detail)


def _caption(group: _Group) -> str:
    if "txt" in group.captions:
        return _utf8(group.captions["txt"], f"{group.key}.txt").strip()
    if "json" not in group.captions:
        raise SampleError("malformed_record", f"sample {group.key!r} has no caption: no .txt member and no "
                          ".json member with a 'caption' field")
    text = _utf8(group.captions["json"], f"{group.key}.json")
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise SampleError("malformed_record", f"member {group.key}.json is not valid JSON ({e}); fix the "
                          "member or add a .txt caption") from None
    value = next((meta[k] for k in _CAPTION_FIELDS if isinstance(meta, dict) and meta.get(k) is not None), None)
    if not isinstance(value, str):
        raise SampleError("malformed_record", f"member {group.key}.json has no string 'caption' or 'text' "
                          f"field (got {type(value).__name__}); add the caption there or as a .txt member")
    return value.strip()


def _utf8(data: bytes, member: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SampleError("malformed_record", f"member {member} is not valid UTF-8 (byte {data[e.start]:#04x} at "
                          f"position {e.start}); re-encode the caption as UTF-8") from None
