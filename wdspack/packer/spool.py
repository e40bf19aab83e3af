"""The spool: a pack job's private format for tokenized samples between measuring and writing.

Measuring appends each sample of unit of work ``i`` to ``spool/{i:06d}.bin`` as one msgpack list
``[id, ids (<u4 bytes), mask (uint8 bytes)]`` followed by its media kind by kind, in the order of
:data:`~wdspack.media.KINDS`: ``[bytes], [tokens]`` (and ``[plans]`` for a kind planned at pack time); a
kind that is not in every pack, with none of it nor of a later kind, is left off the end (a sample without
video keeps the row it always had). The integers the driver plans with go to ``spool/{i:06d}.meta``,
which appears only when the unit is complete (:class:`SpoolWriter`). Writing reads samples back by
``(part, offset, length)`` (:class:`SpoolReader`) and concatenates them into packs (:func:`assemble_pack`).
The spool lives in the output's work folder and is removed when the manifest is written; nothing outside
the pack job reads it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

from ..errors import Dropped
from ..format.pack import Pack
from ..media import KINDS, Media, by_kind, spelled
from ..storage.location import Location

__all__ = ["COLUMNS", "SpoolReader", "SpoolWriter", "assemble_pack", "bin_name", "meta_name", "pack_counts",
           "read_meta"]

#: The ``.meta`` integer columns, one value per sample: its tokens, its media items of every kind (what
#: ``max_images`` counts), their bytes, where its row is in the ``.bin``, its media tokens, its targets.
COLUMNS = ("tokens", "media", "media_bytes", "offsets", "lengths", "media_tokens", "targets")
#: The columns as a spool written before they were named by what they count names them.
_BEFORE = {"media": "images", "media_bytes": "image_bytes", "media_tokens": "image_tokens"}
#: A sample's media by their v1 spelling (images, image_tokens, videos, video_tokens, video_plans), in order.
_FIELD_OF = spelled("data", "tokens", "plans")


def meta_name(i: int) -> str:
    """``{i:06d}.meta``: unit ``i``'s integers, present once the unit is complete."""
    return f"{i:06d}.meta"


def bin_name(i: int) -> str:
    """``{i:06d}.bin``: unit ``i``'s samples."""
    return f"{i:06d}.bin"


class SpoolWriter:
    """Samples of one unit of work, appended to ``spool/{i}.bin``; ``spool/{i}.meta`` (the
    integers the driver plans with) appears only when :meth:`finish` completes.

    ``work`` is the job's work folder, a path or URL; a remote ``.bin`` is uploaded as it is
    written and appears when closed.
    """

    def __init__(self, work: str, i: int) -> None:
        self._work, self._i = Location(work), i
        self._f = self._work.open_write("spool", bin_name(i))
        self._pos = 0
        self._ids: list[str] = []
        self._ints: list[tuple[int, ...]] = []  # one row of COLUMNS per sample
        self._dropped: list[Dropped] = []
        self.records = 0  # samples added or dropped (a document cut into pieces: each piece)
        #: the source records they came from, when the caller counts them (None: ``records``)
        self.source_records: int | None = None

    def add(self, sample_id: str, input_ids: np.ndarray, loss_mask: np.ndarray, *by_position: Any,
            media: Mapping[str, Media] | None = None, **by_key: Any) -> None:
        """One sample and its media by kind: ``add(sid, ids, mask, sample.media)``. A kind's items also
        come in their v1 spelling, as :class:`~.tokenized.Sample` takes them (``images=``, or by position:
        images, image_tokens, videos, video_tokens, video_plans). The planner's integers count the media of
        every kind together (``max_images`` bounds them all) and their tokens together (the vision tokens
        the loader's slots hold)."""
        if by_position and isinstance(by_position[0], Mapping):  # add(sid, ids, mask, sample.media)
            media, by_position = by_position[0], by_position[1:]
        if len(by_position) > len(_FIELD_OF):
            raise TypeError(f"SpoolWriter.add() takes at most {4 + len(_FIELD_OF)} positional arguments")
        by_key.update(zip(_FIELD_OF, by_position))
        items = by_kind(media, _FIELD_OF, by_key, owner="SpoolWriter.add")
        self.records += 1
        fields = [sample_id, np.asarray(input_ids).astype("<u4").tobytes(),
                  np.asarray(loss_mask).astype(np.uint8).tobytes(), *_row_media(items)]
        blob = msgpack.packb(fields, use_bin_type=True)
        mask = np.asarray(loss_mask)
        targets = int(mask[1:].sum()) if mask.size else 0  # a sub-sample's first token is never a target
        every = list(items.values())
        self._ints.append((len(input_ids), sum(len(m) for m in every), sum(len(b) for m in every for b in m.data),
                           self._pos, len(blob), sum(int(t) for m in every for t in m.tokens), targets))
        self._f.write(blob)
        self._pos += len(blob)
        self._ids.append(sample_id)

    def drop(self, d: Dropped) -> None:
        self.records += 1
        self._dropped.append(d)

    def finish(self, describe: dict[str, Any]) -> None:
        if not self._work.remote:
            self._f.flush()
            os.fsync(self._f.fileno())
        self._f.close()
        cols = np.asarray(self._ints, np.int64).reshape(-1, len(COLUMNS)).T
        meta = {
            "ids": self._ids, "records": self.records, "describe": describe,
            "source_records": self.records if self.source_records is None else self.source_records,
            **{name: col.tobytes() for name, col in zip(COLUMNS, cols)},
            "dropped": [[d.sample_id, d.reason, d.detail] for d in self._dropped],
        }
        self._work.write_atomic(f"spool/{meta_name(self._i)}", msgpack.packb(meta, use_bin_type=True))

    def __enter__(self) -> SpoolWriter:
        return self

    def __exit__(self, *exc) -> None:
        if not self._f.closed:
            self._f.close()


def _row_media(media: Mapping[str, Media]) -> list[list[Any]]:
    """A sample's media as its spool row holds them: each kind's ``[bytes], [tokens](, [plans])`` in the
    kinds' order, the kinds not in every pack left off the end while they (and the kinds after) hold none."""
    row: list[list[Any]] = []
    for kind in KINDS:
        items = media[kind.name]
        part = [list(items.data), [int(t) for t in items.tokens]]
        if kind.plan_record is not None:
            part.append([p.to_msgpack() for p in items.plans])
        row.append(part)
    keep = len(KINDS)
    while keep and not KINDS[keep - 1].always_stored and not media[KINDS[keep - 1].name].data:
        keep -= 1
    return [field for part in row[:keep] for field in part]


class SpoolReader:
    """Spooled samples read back by ``(part, offset, length)``: local spool files stay open; the
    samples of one pack in a remote spool are fetched together (concurrent ranged reads)."""

    def __init__(self, work: str) -> None:
        self._work = Location(work)
        self._files: dict[int, Any] = {}

    def read(self, refs: Sequence[tuple[int, int, int]]) -> list[list[Any]]:
        if self._work.remote:
            blobs = self._work.read_ranges([f"spool/{bin_name(r[0])}" for r in refs],
                                           [r[1] for r in refs], [r[1] + r[2] for r in refs])
        else:
            blobs = []
            for part, offset, length, *_ in refs:
                f = self._files.get(part)
                if f is None:
                    # SIM115: the reader keeps one file per part open until its with-block exits
                    f = self._files[part] = open(self._work.join("spool", bin_name(part)), "rb")  # noqa: SIM115
                f.seek(offset)
                blobs.append(f.read(length))
        return [msgpack.unpackb(b, raw=False) for b in blobs]

    def __enter__(self) -> SpoolReader:
        return self

    def __exit__(self, *exc) -> None:
        for f in self._files.values():
            f.close()


def assemble_pack(samples: Sequence[list[Any]]) -> Pack:
    """Concatenate spooled samples ``[id, ids, mask, <each kind's bytes, tokens (, plans)>]`` into one pack."""
    ids = [np.frombuffer(s[1], "<u4") for s in samples]
    parts: dict[str, tuple[list[Any], ...]] = {kind.name: ([], [], [], []) for kind in KINDS}
    for k, s in enumerate(samples):
        at = 3
        for kind in KINDS:
            if at >= len(s):  # this kind and the later ones hold none
                break
            data, sample, tokens, plans = parts[kind.name]
            data.extend(s[at])
            sample.extend([k] * len(s[at]))
            tokens.extend(s[at + 1])
            at += 2
            if kind.plan_record is not None:
                plans.extend(kind.plan_record.from_msgpack(p) for p in s[at])
                at += 1
    return Pack(
        input_ids=np.concatenate(ids), loss_mask=np.concatenate([np.frombuffer(s[2], np.uint8) for s in samples]),
        seq_lens=tuple(len(x) for x in ids), sample_ids=tuple(s[0] for s in samples),
        media={name: Media(*(tuple(x) for x in p)) for name, p in parts.items()},
    )


def pack_counts(pack: Pack) -> dict[str, Any]:
    """What :meth:`~wdspack.format.tar.ShardWriter.add` counts of a pack: its items of each kind
    (``media``) and their tokens (``media_tokens``)."""
    return {"media": {name: len(items) for name, items in pack.media.items()},
            "media_tokens": {name: sum(items.tokens) for name, items in pack.media.items()}}


def read_meta(work: Location, i: int) -> dict[str, Any]:
    """The ``.meta`` of unit ``i``: ids, counts and the integer :data:`COLUMNS` (as bytes), the drops and
    ``describe``."""
    meta = msgpack.unpackb(work.read_bytes("spool", meta_name(i)), raw=False)
    for name, before in _BEFORE.items():  # a spool written before the columns were renamed
        if name not in meta and before in meta:
            meta[name] = meta.pop(before)
    return meta
