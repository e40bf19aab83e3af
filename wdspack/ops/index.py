"""Add the pack index to a dataset packed without one (``wdspack index``).

Reads every shard once (tar headers and packs) and writes ``pack_index.npy`` beside the manifest
(:mod:`wdspack.format.pack_index`), then names it in the manifest; nothing else is rewritten.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from ..errors import ManifestError
from ..format.manifest import MANIFEST_NAME, read_manifest, write_json_atomic
from ..format.pack import decode_pack
from ..format.pack_index import COLUMNS, INDEX_NAME, encode_index, index_entry, pack_row
from ..format.tar import tar_entries
from ..storage.local import FileStream

__all__ = ["index_dataset"]


def index_dataset(root: str | os.PathLike[str]) -> dict:
    """Write ``pack_index.npy`` for a local dataset packed without one and name it in its manifest.

    Reads every shard once (headers and packs, nothing is rewritten but the manifest, atomically);
    returns the manifest's new ``pack_index`` entry.

    Example:
        >>> index_dataset("old-packed/")["columns"][:2]  # doctest: +SKIP
        ['offset', 'tokens']
    """
    manifest = read_manifest(root)  # a local folder (a URL is refused by name, before a Path mangles it)
    folder = Path(root)
    rows = []
    for shard in manifest.shards:
        with open(folder / shard.name, "rb") as f:
            stream = FileStream(f)
            packs = 0
            for entry in tar_entries(stream, where=str(folder / shard.name)):
                if not (entry.regular and entry.name.endswith(".mp")):
                    stream.skip(entry.size)
                    continue
                rows.append(pack_row(entry.offset, decode_pack(stream.read(entry.size))))
                packs += 1
        if packs != shard.packs:
            raise ManifestError(f"{folder / shard.name} holds {packs} packs, the manifest says {shard.packs}; "
                                "run `wdspack verify` and repair the dataset first")
    data = encode_index(np.asarray(rows, np.int64).reshape(-1, len(COLUMNS)))
    tmp = folder / f".{INDEX_NAME}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, folder / INDEX_NAME)
    index = index_entry(data)
    write_json_atomic(folder / MANIFEST_NAME, dataclasses.replace(manifest, pack_index=index).to_json())
    return index
