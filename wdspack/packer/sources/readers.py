"""Read the records of one partition: every input record becomes a Record or a Dropped.

Each format has a small reader that yields ``(row, raw)`` pairs — ``raw`` the parsed record,
or the :class:`SampleError` that stopped it from being parsed — and :func:`iter_records`
turns each pair into a :class:`Record` or a :class:`Dropped`. A bad record never stops the
partition; a file that cannot be read at all raises :class:`SourceError`.

Pre-training rows (interleaved ``texts`` + ``images`` documents, plain ``text``; see
:mod:`.documents`) become :class:`~.documents.TextRecord` instead of chats; WebDataset shards
(:mod:`.webdataset`) yield caption TextRecords, or Dropped, directly.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import Dropped, SampleError, SourceError
from ...storage.location import open_input, read_range
from ...storage.urls import is_url
from .documents import DOCUMENT_COLUMNS, TextRecord, build_document, is_document
from .partitions import Partition, arrow_batches
from .records import COLUMNS, Record, build_record, sample_id_of
from .scan import split_array_chunk
from .webdataset import read_captions

__all__ = ["iter_records"]

_BOM = b"\xef\xbb\xbf"
_WHITESPACE = b" \t\r\n"
_PARQUET_BATCH = 256  # rows decoded at a time: image columns make rows large
_READ_COLUMNS = (*COLUMNS, *DOCUMENT_COLUMNS)  # Parquet/Arrow columns read; the others are ignored

Raw = Any  # a parsed record, or the SampleError that stopped it


def iter_records(partition: Partition) -> Iterator[Record | TextRecord | Dropped]:
    """One :class:`Record` or :class:`Dropped` per input record of the partition, in file order.

    Records without an ``id`` field get ``{name}:{row}``, ``row`` counted from 0 at the start
    of the file, so ids are the same however the file is partitioned.

    Raises:
        SourceError: the file cannot be read at all (never for one bad record).

    Example:
        >>> from wdspack.packer.sources import list_partitions
        >>> [r.sample_id for p in list_partitions(["chat.jsonl"]) for r in iter_records(p)]  # doctest: +SKIP
        ['chat.jsonl:0', 'chat.jsonl:1', 'q-17']
    """
    read = _READERS.get(partition.kind)
    if read is None:
        raise SourceError(f"partition of {partition.path!r} has kind {partition.kind!r}; known kinds: "
                          f"{sorted(_READERS)}")
    name = partition.name or os.path.basename(partition.path)
    rename = partition.row_map.apply if partition.row_map is not None else None  # a meta file's columns
    try:
        for row, raw in read(partition):
            raw = rename(raw) if rename is not None and not isinstance(raw, SampleError) else raw
            yield _to_record(raw, f"{name}:{row}", partition.image_root, partition.absolute_images)
    except OSError as e:
        raise SourceError(f"source {partition.path!r} cannot be read: {e.strerror or e}") from None


def _to_record(raw: Raw, fallback_id: str, image_root: str,
               absolute_images: bool = False) -> Record | TextRecord | Dropped:
    if isinstance(raw, SampleError):
        return raw.to_dropped(fallback_id)
    if isinstance(raw, (TextRecord, Dropped)):  # WebDataset captions: built by their reader, with their ids
        return raw
    sample_id = fallback_id
    try:
        if isinstance(raw, Mapping):
            sample_id = sample_id_of(raw, fallback_id)
        if is_document(raw):
            return build_document(raw, sample_id=sample_id, image_root=image_root)
        return build_record(raw, sample_id=sample_id, image_root=image_root, absolute_images=absolute_images)
    except SampleError as e:
        return e.to_dropped(sample_id)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError) as e:
        # A shape no check above foresaw: still one bad record, not a failed job.
        return Dropped(sample_id, "malformed_record", f"unexpected record layout ({type(e).__name__}: {e})")


def _read_jsonl(p: Partition) -> Iterator[tuple[int, Raw]]:
    row = p.first_row
    with _open_at_start(p) as f:
        pos = p.start
        for line in f:
            if pos >= p.stop:
                break
            at, pos = pos, pos + len(line)
            if at == 0 and line.startswith(_BOM):
                line = line[len(_BOM):]
            if not line.strip(_WHITESPACE):
                continue  # a blank line is not a record (the partitioner does not count it either)
            yield row, _parse(line, f"line at byte {at}")
            row += 1


def _read_json(p: Partition) -> Iterator[tuple[int, Raw]]:
    with _open_at_start(p) as f:
        chunk = f.read(p.stop - p.start)
    for k, element in enumerate(split_array_chunk(chunk)):
        row = p.first_row + k
        if not element.strip(_WHITESPACE):
            yield row, SampleError("malformed_record", f"element {row} of the array is empty "
                                   "(a stray comma?); remove it")
        else:
            yield row, _parse(element, f"element {row} of the array")


def _open_at_start(p: Partition) -> IO[bytes]:
    """The partition's bytes from ``p.start``: a local file, seeked; a remote one, fetched with
    one ranged read (a partition is about ``records_per_partition`` records)."""
    if is_url(p.path):
        return io.BytesIO(read_range(p.path, p.start, p.stop))
    f = open_input(p.path)
    f.seek(p.start)
    return f


def _parse(data: bytes, where: str) -> Raw:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return SampleError("malformed_record", f"{where} is not valid UTF-8 (byte {data[e.start]:#04x} at "
                           f"position {e.start}); re-encode the file as UTF-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        return SampleError("malformed_record", f"{where} is not valid JSON ({e.msg} at column {e.colno}); "
                           "fix or remove it")
    except RecursionError:
        return SampleError("malformed_record", f"{where} is nested too deeply to parse")


def _read_parquet(p: Partition) -> Iterator[tuple[int, Raw]]:
    try:
        with open_input(p.path) if is_url(p.path) else contextlib.nullcontext(p.path) as where:
            pf = pq.ParquetFile(where)
            columns = [c for c in pf.schema_arrow.names if c in _READ_COLUMNS]
            batches = pf.iter_batches(batch_size=_PARQUET_BATCH, row_groups=list(range(p.start, p.stop)),
                                      columns=columns)
            row = p.first_row
            for batch in batches:
                for raw in batch.to_pylist():
                    yield row, raw
                    row += 1
    except pa.ArrowException as e:
        raise SourceError(f"source {p.path!r} is not a readable Parquet file ({e})") from None


def _read_arrow(p: Partition) -> Iterator[tuple[int, Raw]]:
    row = 0
    for batch in arrow_batches(p.path):
        n = batch.num_rows
        if row >= p.stop:
            break
        if row + n > p.start:
            lo, hi = max(p.start - row, 0), min(p.stop - row, n)
            sub = batch.slice(lo, hi - lo).select([c for c in batch.schema.names if c in _READ_COLUMNS])
            for k, raw in enumerate(sub.to_pylist()):
                yield row + lo + k, raw
        row += n


def _read_wds(p: Partition) -> Iterator[tuple[int, Raw]]:
    return read_captions(p.path, start=p.start, stop=p.stop, first_row=p.first_row,
                         name=p.name or os.path.basename(p.path))


_READERS: dict[str, Callable[[Partition], Iterator[tuple[int, Raw]]]] = {
    "jsonl": _read_jsonl, "json": _read_json, "parquet": _read_parquet, "arrow": _read_arrow,
    "wds": _read_wds,
}
