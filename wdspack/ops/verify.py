"""Prove a packed dataset is intact (``wdspack verify``).

Checks, each problem reported as one line:

- every shard the manifest lists exists, with the listed size and sha256;
- every member is a pack ``{key}.mp`` (the loader's rule too: anything else is damage, which it
  skips with a warning or raises on), with a key unique in the dataset, decodes, satisfies the
  format's invariants and both budgets, and the per-shard counts match the manifest;
- every video in a pack holds the data of the frames its plan names (a demux pass, nothing decoded:
  a clip cut short, packed before the pack job checked it or damaged since, is named with its sample);
- no sample id is in two packs or both packed and dropped; the totals add up;
- the pack index (``pack_index.npy``), when the manifest names one, matches its digest and every
  pack's offset and costs;
- with ``sources`` (the SOURCEs given to pack, ``PATH::ROOT`` and meta files included): every
  source record is in exactly one pack or in the dropped list, under the id the job gave it
  (``{source}/{id}`` where two sources share an id).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..errors import FormatError, SampleError, WdspackError
from ..format.dataset import open_dataset
from ..format.pack import Pack, decode_pack
from ..format.pack_index import COLUMNS, pack_row, read_index
from ..format.tar import FOREIGN_RULE
from ..media import KINDS

__all__ = ["verify_dataset"]


def verify_dataset(dataset: str, *, sources: Sequence[str] | None = None,
                   image_root: str | None = None) -> list[str]:
    """Return the problems found (an empty list means the dataset is intact).

    Example:
        >>> verify_dataset("build/demo/packed")  # doctest: +SKIP
        []
    """
    import fsspec

    try:
        manifest, root = open_dataset(dataset)
    except (OSError, WdspackError) as e:
        return [f"manifest: cannot read {dataset}: {e}"]
    problems: list[str] = []
    keys: set[str] = set()
    packed: Counter[str] = Counter()
    rows: list[list[int] | None] = []  # what the pack index must say, pack by pack in manifest order
    for shard in manifest.shards:
        url = f"{root}/{shard.name}"
        counts: Counter[str] = Counter()
        hasher = _Hashing()
        try:
            with fsspec.open(url, "rb") as raw:
                hasher.wrap(raw)
                with tarfile.open(fileobj=hasher, mode="r|") as tar:
                    for m in tar:
                        if not (m.isfile() and m.name.endswith(".mp")):
                            problems.append(f"{shard.name}: member {m.name!r} is not a pack; {FOREIGN_RULE}")
                            continue
                        key = m.name[:-3]
                        rows.append(None)
                        if key in keys:
                            problems.append(f"{shard.name}: pack key {key!r} appears twice in the dataset")
                        keys.add(key)
                        try:
                            member = tar.extractfile(m)
                            assert member is not None  # a regular file
                            pack = decode_pack(member.read())
                            if pack.num_tokens > manifest.seq_len:
                                raise FormatError(f"{pack.num_tokens} tokens > seq_len {manifest.seq_len}")
                            media = sum(pack.count(kind.name) for kind in KINDS)  # max_images counts every kind
                            if manifest.max_images is not None and media > manifest.max_images:
                                held = " and ".join(f"{pack.count(kind.name)} {kind.plural}" for kind in KINDS)
                                raise FormatError(f"{held} > max_images {manifest.max_images}")
                        except FormatError as e:
                            problems.append(f"{shard.name}: pack {key}: {e}")
                            continue
                        problems.extend(f"{shard.name}: pack {key}: {line}" for line in _check_plans(pack))
                        rows[-1] = pack_row(m.offset, pack)
                        packed.update(pack.sample_ids)
                        counts.update(packs=1, samples=pack.num_samples, tokens=pack.num_tokens,
                                      **{kind.plural: pack.count(kind.name) for kind in KINDS})
                hasher.drain()
        except FileNotFoundError:
            problems.append(f"{shard.name}: missing (listed in the manifest)")
            continue
        except (tarfile.TarError, OSError, EOFError) as e:
            problems.append(f"{shard.name}: truncated or corrupt tar: {e}")
            continue
        if hasher.size != shard.bytes:
            problems.append(f"{shard.name}: {hasher.size} bytes, manifest says {shard.bytes}")
        if hasher.hexdigest() != shard.sha256:
            problems.append(f"{shard.name}: sha256 {hasher.hexdigest()[:12]}… differs from the manifest's "
                            f"{shard.sha256[:12]}…")
        for field in ("packs", "samples", "tokens", *(kind.plural for kind in KINDS)):
            if counts[field] != getattr(shard, field):
                problems.append(f"{shard.name}: {counts[field]} {field}, manifest says {getattr(shard, field)}")
    if manifest.pack_index and not problems:  # rows line up with the index only when every shard read
        problems.extend(_check_index(root, manifest, rows))
    twice = [sid for sid, n in packed.items() if n > 1]
    if twice:
        problems.append(f"{len(twice)} sample ids are in more than one pack, e.g. {twice[:3]}")
    dropped = _read_dropped(root, manifest.dropped_file, problems)
    # a later copy of an id is dropped as a duplicate while the first copy is packed: not a conflict
    both = {sid for sid, reason in dropped if reason != "duplicate_id"} & set(packed)
    if both:
        problems.append(f"{len(both)} sample ids are both packed and dropped, e.g. {sorted(both)[:3]}")
    t = manifest.totals
    if t["samples_packed"] + t["samples_dropped"] != t["samples_read"]:
        problems.append(f"totals: packed {t['samples_packed']} + dropped {t['samples_dropped']} != "
                        f"read {t['samples_read']}")
    if len(dropped) != t["samples_dropped"]:
        problems.append(f"{manifest.dropped_file}: {len(dropped)} entries, manifest says {t['samples_dropped']}")
    if sources:
        problems.extend(_check_sources(sources, image_root, set(packed), {sid for sid, _ in dropped}))
    return problems


def _check_plans(pack: Pack) -> list[str]:
    """A line per planned item (a video) whose file does not hold the data its plan names."""
    lines = []
    for kind in KINDS:
        if kind.check_item is None:
            continue
        name, check, items, seen = kind.name, kind.check_item, pack.media[kind.name], Counter[int]()
        for data, owner, plan in zip(items.data, items.sample, items.plans):
            sid, k = pack.sample_ids[owner], seen[owner]  # item k of its sample, as the pack job names it
            seen[owner] += 1
            try:
                check(data, plan, sample_id=sid)
            except SampleError as e:
                lines.append(f"sample {sid!r}: {name} {k}: {e.detail} [{e.reason}]")
    return lines


def _check_sources(sources, image_root, packed: set[str], dropped: set[str]) -> list[str]:
    from ..packer.sources import iter_records, list_partitions

    read: list[tuple[str, str]] = []  # (source name, id) of every source record, in order
    for part in list_partitions(list(sources), image_root=image_root):
        source = getattr(part, "source", "")  # anything partition-like reads as one unnamed source
        read.extend((source, rec.sample_id) for rec in iter_records(part))
    seen = _expected_ids(read)
    problems = []
    pieces, broken = _document_pieces(seen, packed | dropped)
    lost = [sid for sid in seen if sid not in packed and sid not in dropped and sid not in pieces]
    if lost:
        problems.append(f"{len(lost)} source samples are in no pack and not dropped, e.g. {lost[:3]}")
    extra = [sid for sid in packed if sid not in seen and _piece_of(sid, seen) is None]
    if extra:
        problems.append(f"{len(extra)} packed samples are not in the sources, e.g. {extra[:3]}")
    if broken:
        problems.append(f"{len(broken)} split documents do not have all their pieces #0..#n-1 (or also appear "
                        f"whole), e.g. {broken[:3]}")
    return problems


def _expected_ids(read: list[tuple[str, str]]) -> Counter[str]:
    """The ids the pack job gives the source records: ``{source}/{id}`` where an id is in more than
    one source (the rule of :func:`wdspack.packer.selection._namespace`), else the record's own."""
    from ..packer.sources.meta import collision_key, namespaced

    owner: dict[str, str | None] = {}  # collision key -> its one source, or None once a second is seen
    for source, sid in read:
        key = collision_key(sid)
        if owner.setdefault(key, source) not in (source, None):
            owner[key] = None
    return Counter(namespaced(source, sid) if owner[collision_key(sid)] is None else sid for source, sid in read)


def _piece_of(sid: str, seen) -> str | None:
    """The source id a piece ``{id}#{k}`` of a split document belongs to (None: not a piece)."""
    base, sep, k = sid.rpartition("#")
    return base if sep and k.isdigit() and sid not in seen and base in seen else None


def _document_pieces(seen, present: set[str]) -> tuple[set[str], list[str]]:
    """Source ids present as pieces (wdspack.packer.text splits long documents), and those whose pieces
    are not exactly ``#0 .. #n-1`` or that are also present whole."""
    found: dict[str, set[int]] = {}
    for sid in present:
        base = _piece_of(sid, seen)
        if base is not None:
            found.setdefault(base, set()).add(int(sid.rpartition("#")[2]))
    broken = sorted(b for b, ks in found.items() if ks != set(range(len(ks))) or b in present)
    return set(found), broken


def _check_index(root: str, manifest, rows: list[list[int] | None]) -> list[str]:
    name = manifest.pack_index.get("file", "")
    try:
        index = read_index(root, manifest)
    except FileNotFoundError:
        return [f"{name}: missing (named by the manifest)"]
    except WdspackError as e:
        return [str(e)]
    if len(rows) != len(index):
        return [f"{name}: {len(index)} rows for {len(rows)} packs in the shards"]
    wrong = [(i, [c for c, a, b in zip(COLUMNS, index[i].tolist(), row) if a != b])
             for i, row in enumerate(rows) if row is not None and index[i].tolist() != row]
    if wrong:
        i, cols = wrong[0]
        return [f"{name}: {len(wrong)} rows disagree with their packs, e.g. row {i} ({', '.join(cols)}); "
                "re-create it with `wdspack index DATASET`"]
    return []


def _read_dropped(root: str, name: str, problems: list[str]) -> list[tuple[str, str | None]]:
    import fsspec

    try:
        with fsspec.open(f"{root}/{name}", "rt", encoding="utf-8") as f:
            return [(d["id"], d.get("reason")) for d in (json.loads(line) for line in f if line.strip())]
    except FileNotFoundError:
        problems.append(f"{name}: missing")
    except (ValueError, KeyError) as e:
        problems.append(f"{name}: unreadable: {e}")
    return []


class _Hashing(io.RawIOBase):
    """A read-only stream that hashes and counts what is read through it."""

    def __init__(self) -> None:
        self._f: Any = None  # the stream wrap() gives
        self._h = hashlib.sha256()
        self.size = 0

    def wrap(self, f) -> None:
        self._f = f

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self._f.read(len(b))
        n = len(data)
        b[:n] = data
        self._h.update(data)
        self.size += n
        return n

    def drain(self) -> None:
        """Read to the end (tar readers stop at the end-of-archive blocks)."""
        while self.read(1 << 20):
            pass

    def hexdigest(self) -> str:
        return self._h.hexdigest()
