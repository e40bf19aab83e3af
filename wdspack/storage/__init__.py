"""Bytes in and out, local or remote, with retries; nothing here knows the pack format.

Reading, front to back and resumable at any byte (the loader's shards, the pack job's tar sources):

* :mod:`.streams` — :func:`~.streams.open_stream` picks the transport by the URL, :func:`~.streams.read_all`
* :mod:`.base` — what the network streams share: the block buffer, retries and back-off
* :mod:`.local`, :mod:`.http`, :mod:`.fsspec` — one transport each (local files; HTTP(S); any
  fsspec store, ``s3://`` and the like)
* :mod:`.hf` — ``hf://`` URLs: pinned to a commit and resolved to HTTP(S)

Writing, and the pack job's whole-file reads: :mod:`.location` (:class:`~.location.Location`, a
folder written through temp names and renames). Names of places: :mod:`.urls`.
"""
