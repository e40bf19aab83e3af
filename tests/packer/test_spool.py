"""The spool and the shard writer carry media by kind: the rows, the packs they assemble and the counts a
shard's manifest entry takes, whichever spelling (by kind, or the v1 image_*/video_* one) the caller used."""

from __future__ import annotations

import msgpack
import numpy as np

from wdspack.format.pack import Media, Pack
from wdspack.format.tar import ShardWriter
from wdspack.media.video.record import VideoPlanRecord
from wdspack.packer.spool import SpoolReader, SpoolWriter, assemble_pack, pack_counts, read_meta
from wdspack.storage.location import Location

PLAN = VideoPlanRecord((0, 2, 4, 6), (28, 28), (2, 2, 2), 0.5)
IDS, MASK = np.array([1, 9, 9, 2, 3], np.uint32), np.array([0, 0, 0, 1, 1], np.uint8)


def _spool(tmp_path, *adds) -> list[bytes]:
    """Spool each ``(args, kwargs)`` as one sample; the rows' bytes as written."""
    (tmp_path / "spool").mkdir(exist_ok=True)
    with SpoolWriter(str(tmp_path), 0) as w:
        for args, kwargs in adds:
            w.add(*args, **kwargs)
        w.finish({})
    meta = read_meta(Location(str(tmp_path)), 0)
    data = (tmp_path / "spool" / "000000.bin").read_bytes()
    offsets, lengths = (np.frombuffer(meta[c], np.int64) for c in ("offsets", "lengths"))
    return [data[o:o + n] for o, n in zip(offsets, lengths)]


def test_a_row_without_video_keeps_its_v1_layout(tmp_path):
    media = {"image": Media((b"png",), (), (2,)), "video": Media()}
    rows = _spool(tmp_path, (("a", IDS, MASK, media), {}), (("a", IDS, MASK, [b"png"], [2]), {}),
                  (("a", IDS, MASK), {"images": [b"png"], "image_tokens": [2]}))
    assert rows[0] == rows[1] == rows[2]
    assert msgpack.unpackb(rows[0]) == ["a", IDS.astype("<u4").tobytes(), MASK.tobytes(), [b"png"], [2]]


def test_media_by_kind_round_trip_through_the_spool(tmp_path):
    media = {"image": Media((b"png",), (), (2,)), "video": Media((b"mp4",), (), (3,), (PLAN,))}
    v1 = {"images": [b"png"], "image_tokens": [2], "videos": [b"mp4"], "video_tokens": [3], "video_plans": [PLAN]}
    rows = _spool(tmp_path, (("a", IDS, MASK, media), {}), (("b", IDS, MASK), v1), (("c", IDS[:2], MASK[:2]), {}))
    assert rows[0][3:] == rows[1][3:]  # the same but for the id
    meta = read_meta(Location(str(tmp_path)), 0)
    assert np.frombuffer(meta["media"], np.int64).tolist() == [2, 2, 0]  # images and videos: what max_images counts
    assert np.frombuffer(meta["media_tokens"], np.int64).tolist() == [5, 5, 0]
    assert np.frombuffer(meta["media_bytes"], np.int64).tolist() == [6, 6, 0]
    with SpoolReader(str(tmp_path)) as reader:
        refs = [(0, int(o), int(n)) for o, n in zip(np.frombuffer(meta["offsets"], np.int64),
                                                     np.frombuffer(meta["lengths"], np.int64))]
        pack = assemble_pack(reader.read(refs))
    assert pack.media["image"] == Media((b"png", b"png"), (0, 1), (2, 2))
    assert pack.media["video"] == Media((b"mp4", b"mp4"), (0, 1), (3, 3), (PLAN, PLAN))
    assert pack.seq_lens == (5, 5, 2) and pack.sample_ids == ("a", "b", "c")
    assert pack_counts(pack) == {"media": {"image": 2, "video": 2, "audio": 0},
                                 "media_tokens": {"image": 4, "video": 6, "audio": 0}}


def test_the_shard_writer_counts_each_kind(tmp_path):
    pack = Pack(np.array([1, 2]), np.array([0, 1]), (2,), ("a",), videos=(b"mp4",), video_sample=(0,),
                video_tokens=(7,), video_plans=(PLAN,))
    recorded = []
    with ShardWriter(tmp_path / "train-000000.tar") as w:
        w.add("k0", b"abc", samples=1, tokens=2, **pack_counts(pack))
        w.add("k1", b"abc", samples=1, tokens=2, media={"image": 3, "video": 1}, media_tokens={"video": 4})
        w.add("k2", b"abc", samples=1, tokens=2, images=2)  # the v1 spelling still counts
        info = w.close(record=recorded.append)
    assert (info.images, info.videos, info.max_video_tokens, info.packs) == (5, 2, 7, 3)
    assert recorded == [info]
