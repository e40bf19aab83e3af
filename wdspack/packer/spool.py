"""The spool: a pack job's private format for tokenized samples between measuring and writing.

Measuring appends each sample of unit of work ``i`` to ``spool/{i:06d}.bin`` as one msgpack list
``[id, ids (<u4 bytes), mask (uint8 bytes), [image bytes], [image tokens]]`` (then ``[video bytes],
[video tokens], [video plans]`` for a sample with videos); the integers the
driver plans with go to ``spool/{i:06d}.meta``, which appears only when the unit is complete
(:class:`SpoolWriter`). Writing reads samples back by ``(part, offset, length)``
(:class:`SpoolReader`) and concatenates them into packs (:func:`assemble_pack`). The spool lives in
the output's work folder and is removed when the manifest is written; nothing outside the pack job
reads it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from ..errors import Dropped
from ..format.pack import Pack
from ..media.video.record import VideoPlanRecord
from ..storage.location import Location

__all__ = ["SpoolReader", "SpoolWriter", "assemble_pack", "bin_name", "meta_name", "read_meta"]


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
        # tokens, images, image bytes, offset, length, image tokens, targets
        self._ints: list[tuple[int, ...]] = []
        self._dropped: list[Dropped] = []
        self.records = 0  # samples added or dropped (a document cut into pieces: each piece)
        #: the source records they came from, when the caller counts them (None: ``records``)
        self.source_records: int | None = None

    def add(self, sample_id: str, input_ids: np.ndarray, loss_mask: np.ndarray, images: Sequence[bytes],
            image_tokens: Sequence[int], videos: Sequence[bytes] = (), video_tokens: Sequence[int] = (),
            video_plans: Sequence[VideoPlanRecord] = ()) -> None:
        """One sample. The planner's integers count its videos with its images (``max_images`` bounds
        both) and their tokens with the image tokens (the vision tokens the loader's slots hold)."""
        self.records += 1
        fields = [sample_id, np.asarray(input_ids).astype("<u4").tobytes(),
                  np.asarray(loss_mask).astype(np.uint8).tobytes(), list(images), [int(t) for t in image_tokens]]
        if videos:
            fields += [list(videos), [int(t) for t in video_tokens], [p.to_msgpack() for p in video_plans]]
        blob = msgpack.packb(fields, use_bin_type=True)
        mask = np.asarray(loss_mask)
        targets = int(mask[1:].sum()) if mask.size else 0  # a sub-sample's first token is never a target
        self._ints.append((len(input_ids), len(images) + len(videos), sum(len(b) for b in (*images, *videos)),
                           self._pos, len(blob), sum(int(t) for t in (*image_tokens, *video_tokens)), targets))
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
        cols = np.asarray(self._ints, np.int64).reshape(-1, 7).T
        meta = {
            "ids": self._ids, "records": self.records, "describe": describe,
            "source_records": self.records if self.source_records is None else self.source_records,
            "tokens": cols[0].tobytes(), "images": cols[1].tobytes(), "image_bytes": cols[2].tobytes(),
            "offsets": cols[3].tobytes(), "lengths": cols[4].tobytes(), "image_tokens": cols[5].tobytes(),
            "targets": cols[6].tobytes(),
            "dropped": [[d.sample_id, d.reason, d.detail] for d in self._dropped],
        }
        self._work.write_atomic(f"spool/{meta_name(self._i)}", msgpack.packb(meta, use_bin_type=True))

    def __enter__(self) -> SpoolWriter:
        return self

    def __exit__(self, *exc) -> None:
        if not self._f.closed:
            self._f.close()


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
    """Concatenate spooled samples ``[id, ids, mask, images, image_tokens(, videos, video_tokens,
    video_plans)]`` into one pack."""
    ids = [np.frombuffer(s[1], "<u4") for s in samples]
    images, image_sample, image_tokens = [], [], []
    videos, video_sample, video_tokens = [], [], []
    plans: list[VideoPlanRecord] = []
    for k, s in enumerate(samples):
        images.extend(s[3])
        image_sample.extend([k] * len(s[3]))
        image_tokens.extend(s[4])
        if len(s) > 5:
            videos.extend(s[5])
            video_sample.extend([k] * len(s[5]))
            video_tokens.extend(s[6])
            plans.extend(VideoPlanRecord.from_msgpack(p) for p in s[7])
    return Pack(
        input_ids=np.concatenate(ids), loss_mask=np.concatenate([np.frombuffer(s[2], np.uint8) for s in samples]),
        seq_lens=tuple(len(x) for x in ids), sample_ids=tuple(s[0] for s in samples),
        images=tuple(images), image_sample=tuple(image_sample), image_tokens=tuple(image_tokens),
        videos=tuple(videos), video_sample=tuple(video_sample), video_tokens=tuple(video_tokens),
        video_plans=tuple(plans),
    )


def read_meta(work: Location, i: int) -> dict[str, Any]:
    """The ``.meta`` of unit ``i``: ids, counts and integer columns (as bytes), the drops and ``describe``."""
    return msgpack.unpackb(work.read_bytes("spool", meta_name(i)), raw=False)
