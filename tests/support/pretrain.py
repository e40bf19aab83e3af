"""Pre-training sources in the layouts people publish: WebDataset caption shards and documents.

``caption_shard`` writes a tar of ``KEY.jpg`` / ``KEY.txt`` / ``KEY.json`` members (img2dataset's
layout); ``write_documents`` an OBELICS-style Parquet file of interleaved texts and images and a
plain-text JSONL (one long document among them, for splitting).
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

__all__ = ["caption_shard", "image", "write_documents", "write_tar"]


def image(color: str, fmt: str = "PNG", size=(24, 16)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, fmt)
    return buf.getvalue()


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return path


def caption_shard(path: Path, n: int, *, start: int = 0) -> Path:
    members = []
    for k in range(start, start + n):
        key = f"{k:06d}"
        members += [(f"{key}.jpg", image("blue", "JPEG")), (f"{key}.txt", f"caption number {k}".encode()),
                    (f"{key}.json", json.dumps({"key": key, "caption": "ignored when a txt exists"}).encode())]
    return write_tar(path, members)


def write_documents(tmp_path: Path) -> dict[str, Path]:
    red, green = image("red"), image("green")
    rows = [
        {"id": "doc-a", "texts": ["A red thing.", None, "Then green.", None],
         "images": [None, {"bytes": red, "path": None}, None, {"bytes": green, "path": None}]},
        {"id": "doc-b", "texts": ["Only text here.", None], "images": [None, None]},  # malformed: neither set
        {"id": "doc-c", "texts": [None, "Caption after the image."], "images": [{"bytes": green, "path": None}, None]},
    ]
    table = pa.table({"id": [r["id"] for r in rows], "texts": [r["texts"] for r in rows],
                      "images": [r["images"] for r in rows], "general_metadata": ["{}"] * 3})
    pq.write_table(table, tmp_path / "obelics.parquet")
    long_text = "\n\n".join(f"Paragraph {p}. " + " ".join(f"word{p}x{w}." for w in range(40)) for p in range(6))
    with open(tmp_path / "web.jsonl", "w") as f:
        for k, text in enumerate(["A short web page.", long_text, "x" * 3000]):
            f.write(json.dumps({"text": text, "url": f"http://example/{k}"}) + "\n")
    return {"parquet": tmp_path / "obelics.parquet", "jsonl": tmp_path / "web.jsonl"}
