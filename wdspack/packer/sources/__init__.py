"""Read multimodal chat records from the files people have, as units of work for a pool.

::

    sources (files, folders, globs; SOURCE::ROOT; meta files listing datasets: see .meta)
        │ list_partitions: find files, cut them into partitions (no record is parsed)
        ▼
    Partition(path, kind, start, stop, first_row, image_root, name)   picklable, cheap
        │ iter_records (in a worker)
        ▼
    Record(sample_id, messages, media)  or  Dropped(sample_id, reason, detail)

Formats: LLaVA/ShareGPT ``conversations`` and OpenAI/Hugging Face ``messages`` in JSON (a list
of records) or JSONL; Parquet files and ``datasets`` ``save_to_disk`` folders whose rows hold
image bytes and ``messages``, ``conversations`` or ``texts`` (the_cauldron / FineVision style).
Every record comes out in the Hugging Face typed chat format (see :mod:`.records`), with a
stable id: its own ``id`` field, else ``{file name}:{row}``.

Pre-training data is not chat: interleaved ``texts`` + ``images`` documents and plain ``text``
rows (:mod:`.documents`), and WebDataset ``.tar`` shards of image + caption pairs
(:mod:`.webdataset`, ids ``{shard name}:{key}``), come out as :class:`TextRecord`.

Example:
    >>> from wdspack.packer.sources import iter_records, list_partitions
    >>> for part in list_partitions(["data/llava.json"], image_root="data/images"):  # doctest: +SKIP
    ...     for rec in iter_records(part):
    ...         print(rec.sample_id, len(rec.images))
"""

from __future__ import annotations

from .documents import TextRecord
from .meta import Source
from .partitions import FORMATS, Partition, list_partitions
from .readers import iter_records
from .records import ROLE_ALIASES, Record, build_record

__all__ = ["FORMATS", "Partition", "ROLE_ALIASES", "Record", "Source", "TextRecord", "build_record",
           "iter_records", "list_partitions"]
