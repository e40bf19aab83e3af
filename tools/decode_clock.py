"""Where a loader worker's CPU goes, measured in the workers themselves: decoding against the rest.

``bench_loader``'s side-by-side pass compares N loader workers with N raw decoders. When the loader falls
short, the gap is one of four things, and this clock tells them apart without a profiler's overhead:

- decoding itself costs more CPU per image in a worker than in a raw decoder (caches and memory shared
  with the main process and the other workers);
- the worker's own work besides decoding (reading and unpacking packs, collating, placing the pixels);
- the main process's work (receiving the batches);
- waiting (a worker's CPU over its wall time).

:class:`DecodeClock` wraps ``ImageTransform.decode_resized`` (the one call that decodes and resizes, in a
worker and in a raw decoder alike) with a thread-CPU and a wall clock per call, summed per process slot in
a small shared-memory array that forked workers inherit: two clock reads per pack, nothing per image. A raw
decoder times its own loop, which is all decoding.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from wdspack.media.image.pixels import ImageTransform

#: Per slot: CPU seconds in ``decode_resized``, wall seconds in it, images it returned.
_FIELDS = 3


class DecodeClock:
    """Sums ``decode_resized``'s CPU and wall time and images per process slot while :meth:`installed`.

    A process's slot is its DataLoader worker id (slot 0 in the main process). Create it, and install it,
    before the workers it should see are forked.
    """

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._sums = mp.get_context("fork").Array("d", _FIELDS * slots, lock=False)

    @contextmanager
    def installed(self) -> Iterator[DecodeClock]:
        original: Callable[..., list[Any]] = ImageTransform.decode_resized
        clock = self

        def timed(transform: ImageTransform, images: Sequence[bytes]) -> list[Any]:
            c0, w0 = time.thread_time(), time.perf_counter()
            out = original(transform, images)
            clock._add(time.thread_time() - c0, time.perf_counter() - w0, len(out))
            return out

        ImageTransform.decode_resized = timed  # type: ignore[method-assign]
        try:
            yield self
        finally:
            ImageTransform.decode_resized = original  # type: ignore[method-assign]

    def _add(self, cpu: float, wall: float, images: int) -> None:
        info = torch.utils.data.get_worker_info()
        slot = info.id if info is not None else 0
        base = _FIELDS * (slot % self.slots)
        self._sums[base] += cpu
        self._sums[base + 1] += wall
        self._sums[base + 2] += images

    def totals(self) -> tuple[float, float, int]:
        """``(cpu_s, wall_s, images)`` summed over every slot so far."""
        cpu = sum(self._sums[i] for i in range(0, len(self._sums), _FIELDS))
        wall = sum(self._sums[i + 1] for i in range(0, len(self._sums), _FIELDS))
        return cpu, wall, int(sum(self._sums[i + 2] for i in range(0, len(self._sums), _FIELDS)))


def since(clock: DecodeClock, before: tuple[float, float, int]) -> dict[str, float]:
    """What ``clock`` summed since ``before`` (a :meth:`DecodeClock.totals`): decoding's CPU per image (ms),
    its wall over its CPU (above 1: the decoding process waited for a core), and the images."""
    cpu, wall, images = (a - b for a, b in zip(clock.totals(), before, strict=True))
    return {**per_image(cpu, wall, int(images)), "decoded_images": images}


def per_image(cpu: float, wall: float, images: int) -> dict[str, float]:
    """Decoding's CPU per image (ms) and its wall over its CPU, from totals (a loader's or raw decoders')."""
    return {"decode_cpu_ms": 1e3 * cpu / max(images, 1), "decode_wall_over_cpu": wall / cpu if cpu else 0.0}


def split_line(dtype: str, workers: int, r: dict[str, float], raw: dict[str, float]) -> str:
    """One summary line: a loader pass's CPU per image, split, against the raw decoders' of its round."""
    return (f"{dtype}, {workers} workers, CPU per image: decoding {r['decode_cpu_ms']:.2f} ms (raw decoders "
            f"{raw['decode_cpu_ms']:.2f} ms, x{r['decode_cpu_ms'] / raw['decode_cpu_ms']:.2f}), the workers' own "
            f"{r['own_cpu_ms']:.2f} ms, the main process {r['main_cpu_ms']:.2f} ms; workers busy "
            f"{r['workers_busy']:.0%}; decoding's wall/CPU {r['decode_wall_over_cpu']:.2f} "
            f"(raw {raw['decode_wall_over_cpu']:.2f})")
