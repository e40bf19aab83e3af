"""The contract between the produce and the consume wings: what a packed dataset is on disk.

* :mod:`.pack` — pack format v1: one msgpack map per pack; :func:`~.pack.encode_pack` and
  :func:`~.pack.decode_pack` are mirrors, pinned by the golden shard in ``tests/``
* :mod:`.tar` — tar shards: the writer (deterministic headers, temp name then rename) and the
  reader side by side
* :mod:`.manifest` — ``manifest.json``, written last
* :mod:`.pack_index` — ``pack_index.npy``: each pack's offset and costs, and the cost model
* :mod:`.dataset` — open a packed dataset: a source resolved to shard URLs and pack counts, once

No torch and no tokenizer here: the pack job writes through it, the loader and the operations
(inspect, verify, upload, index) read through it.
"""
