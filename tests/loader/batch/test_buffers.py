"""A recycled pixel buffer crosses to the main process once; later batches in it travel as a place in it.

The first shipment of a buffer passes its file descriptor (torch's shared-memory pickling); the main
process keeps that mapping while the loader lives, and every batch gets a view through a storage
object of its own, whose end releases the buffer to its worker.
"""

from __future__ import annotations

import gc
import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from wdspack.errors import ConfigError
from wdspack.loader.batch import buffers
from wdspack.loader.batch.buffers import PixelBuffers, Shipment, _Place

BIG = (16, 3, 128, 128)  # 3 MiB of float32: over the by-value limit, through shared memory


def _send(batch: dict, lease) -> dict:
    return pickle.loads(ForkingPickler.dumps(Shipment(batch, lease)))


def test_a_buffer_is_mapped_once_and_later_batches_are_places_in_it():
    pool = PixelBuffers(workers=1, size=1)
    first, _, lease = pool.take(BIG, worker=0, packs=4)
    first.fill_(1.0)
    lease = pool.ship(lease, [4, 4, 4, 4], first)
    got = _send({"input_ids": torch.arange(3), "pixel_values": first}, lease)
    assert lease.map and not lease.mapped and torch.equal(got["pixel_values"], first)
    mapped_at = got["pixel_values"].untyped_storage().data_ptr()
    assert not got["pixel_values"].is_shared(), "a view through a storage object of the main process's own"
    assert list(buffers._MAPPED[pool.table]) == [(0, 0)]
    del got
    gc.collect()
    assert int(pool.released[0, 0]) == lease.number, "released once the batch's last view is gone"

    again, dirty, lease2 = pool.take(BIG, worker=0, packs=4)
    assert again.data_ptr() == first.data_ptr() and lease2.mapped and dirty == [4, 4, 4, 4]
    again.fill_(2.0)
    again[5] = 3.0
    part = again[4:12]  # a view of the buffer, 1.5 MiB: through shared memory
    lease2 = pool.ship(lease2, [4, 4, 4, 4], part)
    assert lease2.mapped and not lease2.map
    sent = Shipment({"pixel_values": part, "n": 1}, lease2).__reduce__()[1][0]
    assert sent[0] == ("pixel_values", False, _Place((8, 3, 128, 128), part.stride(), 4 * 3 * 128 * 128,
                                                      torch.float32)), "where, not the buffer"
    got = _send({"pixel_values": part, "n": 1}, lease2)
    assert got["pixel_values"].untyped_storage().data_ptr() == mapped_at, "the same mapping, no new one"
    assert torch.equal(got["pixel_values"], part) and got["pixel_values"][1].eq(3.0).all()
    view = got["pixel_values"][2:]
    del got
    gc.collect()
    assert int(pool.released[0, 0]) == lease.number, "a view is still alive"
    del view
    gc.collect()
    assert int(pool.released[0, 0]) == lease2.number


def test_a_batch_with_image_and_video_rows_recycles_a_buffer_per_key():
    """``pixel_values`` and ``pixel_values_videos`` each in a leased buffer of their own: mapped once each,
    later batches as places in them, each released when its own last view is gone; the cap is per key."""
    pool = PixelBuffers(workers=1, size=1)
    video_rows = (1024, 1176)  # uint8 video rows over the by-value limit
    images, _, lease_i = pool.take(BIG, worker=0, packs=4)
    videos, _, lease_v = pool.take(video_rows, worker=0, packs=4, dtype=torch.uint8, key="pixel_values_videos")
    assert lease_i is not None and lease_v is not None and lease_v.key == "pixel_values_videos"
    assert pool.take(video_rows, worker=0, packs=4, dtype=torch.uint8, key="pixel_values_videos")[2] is None
    images.fill_(1.0)
    videos.fill_(7)
    leases = (pool.ship(lease_i, [4] * 4, images), pool.ship(lease_v, [256, 0, 0, 0], videos))
    got = _send({"pixel_values": images, "pixel_values_videos": videos}, leases)
    assert all(lease.map for lease in leases) and sorted(buffers._MAPPED[pool.table]) == [(0, 0), (0, 1)]
    assert torch.equal(got["pixel_values"], images) and torch.equal(got["pixel_values_videos"], videos)
    del got["pixel_values_videos"]
    gc.collect()
    assert int(pool.released[0, 1]) == lease_v.number and int(pool.released[0, 0]) != lease_i.number
    again, dirty, lease_v2 = pool.take(video_rows, worker=0, packs=4, dtype=torch.uint8, key="pixel_values_videos")
    assert again.data_ptr() == videos.data_ptr() and dirty == [256, 0, 0, 0] and lease_v2.mapped
    assert pool.take(BIG, worker=0, packs=4)[2] is None, "the image buffer is still out"
    again[:8] = 9
    lease_v2 = pool.ship(lease_v2, [8, 0, 0, 0], again)
    sent = Shipment({"pixel_values_videos": again}, lease_v2).__reduce__()[1][0]
    assert isinstance(sent[0][2], _Place), "where, not the buffer"
    got = _send({"pixel_values_videos": again}, lease_v2)
    assert torch.equal(got["pixel_values_videos"], again)


def test_a_place_in_a_buffer_this_process_never_mapped_is_refused_with_the_fix():
    pool = PixelBuffers(workers=1, size=1)
    pixels, _, lease = pool.take(BIG, worker=0, packs=4)
    lease = pool.ship(lease, [0] * 4, pixels)
    del _send({"pixel_values": pixels}, lease)["pixel_values"]
    gc.collect()
    _, _, mapped = pool.take(BIG, worker=0, packs=4)
    mapped = pool.ship(mapped, [0] * 4, pixels)
    assert mapped.mapped
    buffers._MAPPED[pool.table].clear()  # as in a process that did not receive the first shipment
    with pytest.raises(ConfigError, match="reuse_buffers=False"):
        _send({"pixel_values": pixels}, mapped)


def test_a_restarted_workers_buffers_replace_the_old_mappings():
    pool = PixelBuffers(workers=1, size=2)
    stale = buffers.Lease(pool.table, 0, 1, (1 << 31) + 5, map=True)  # worker 0 under another pid, buffer 1
    old = buffers.new_shared(BIG)
    del _send({"pixel_values": old}, stale)["pixel_values"]
    assert (0, 1) in buffers._MAPPED[pool.table]
    pixels, _, lease = pool.take(BIG, worker=0, packs=4)  # this pid's buffer 0
    _send({"pixel_values": pixels}, pool.ship(lease, [0] * 4, pixels))
    assert list(buffers._MAPPED[pool.table]) == [(0, 0)]


def test_pixels_by_value_or_outside_the_buffer_map_nothing():
    pool = PixelBuffers(workers=1, size=2)
    small, _, lease = pool.take((2, 3, 8, 8), worker=0, packs=2)
    lease = pool.ship(lease, [0, 0], small)
    got = _send({"pixel_values": small}, lease)
    assert not lease.map and torch.equal(got["pixel_values"], small) and buffers._MAPPED[pool.table] == {}
    _, _, lease_big = pool.take(BIG, worker=0, packs=4)
    elsewhere = buffers.new_shared(BIG)  # a batch whose pixels are not in its leased buffer
    lease_big = pool.ship(lease_big, [0] * 4, elsewhere)
    assert not lease_big.map and _send({"pixel_values": elsewhere}, lease_big)["pixel_values"].is_shared()
    assert buffers._MAPPED[pool.table] == {}
    del got
    gc.collect()
    _, _, again = pool.take((2, 3, 8, 8), worker=0, packs=2)
    assert not again.mapped, "never sent through shared memory: nothing mapped to name"


def test_a_loader_passes_each_buffers_descriptor_once_and_drops_its_mappings_with_it(tmp_path, monkeypatch):
    from multiprocessing import resource_sharer

    from tests.support.synthetic import write_dataset
    from wdspack.loader import make_loader
    from wdspack.media.image.pixels import make_image_transform

    write_dataset(tmp_path, shards=2, packs_per_shard=12, max_images=3, seed=2)
    passed, detach = [], resource_sharer.DupFd.detach  # what receiving a descriptor calls, in the main process

    def counted(self):
        passed.append(1)
        return detach(self)

    monkeypatch.setattr(resource_sharer.DupFd, "detach", counted)
    loader = make_loader(tmp_path, batch_size=2, num_workers=1, seed=1, pin_memory=False,
                         image_transform=make_image_transform(size=128))  # 1.2 MB of pixels a batch
    table = loader.dataloader.collate_fn.buffers.table
    pointers = {b["pixel_values"].untyped_storage().data_ptr() for _ in range(2) for b in loader}  # 2 epochs
    assert len(buffers._MAPPED[table]) == len(passed) == len(pointers) <= 2 + 3 < 24, "once per buffer"
    del loader
    gc.collect()
    assert table not in buffers._MAPPED
