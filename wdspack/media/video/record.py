"""What a pack stores of one video beyond its bytes: the plan (frames, size, grid, time), and its bounds.

The plan is made at pack time from the container's header (:mod:`.plan`) and checked on every untrusted pack
(:func:`check_videos`) before the loader decodes a frame, so a pack cannot make it allocate without bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import FormatError
from ..kind import Media

__all__ = ["MAX_VIDEO_FRAMES", "VideoPlanRecord", "check_videos"]

#: The most frames one video's plan may name: what the loader will decode for it (a guard on untrusted packs).
MAX_VIDEO_FRAMES = 4096
_MAX_SIDE = 1 << 15
#: The most pixels one video's planned frames hold once resized (frames × height × width): a guard on untrusted packs.
_MAX_VIDEO_PIXELS = 1 << 31


@dataclass(frozen=True, slots=True)
class VideoPlanRecord:
    """What a pack stores of one video's plan: the ``frames`` to decode (indices in decoding order),
    the ``size`` ``(height, width)`` they are resized to, the vision ``grid`` ``(t, h, w)`` in patches,
    and the seconds one temporal patch spans (``second_per_grid_t``, Qwen2.5-VL's positions).

    Example:
        >>> VideoPlanRecord((0, 15, 30, 45), (56, 84), (2, 4, 6), 1.0).grid
        (2, 4, 6)
    """

    frames: tuple[int, ...]
    size: tuple[int, int]
    grid: tuple[int, int, int]
    second_per_grid_t: float

    @staticmethod
    def pack_totals(plans: tuple[VideoPlanRecord, ...]) -> dict[str, float]:
        """What ``wdspack inspect --deep`` counts of a pack's videos beyond their tokens: the frames decoded."""
        return {"frames": sum(len(plan.frames) for plan in plans)}

    def to_msgpack(self) -> dict:
        return {"frames": [int(i) for i in self.frames], "size": [int(v) for v in self.size],
                "grid": [int(v) for v in self.grid], "second_per_grid_t": float(self.second_per_grid_t)}

    @classmethod
    def from_msgpack(cls, d: object) -> VideoPlanRecord:
        if not isinstance(d, dict) or set(d) != {"frames", "size", "grid", "second_per_grid_t"}:
            raise TypeError(f"a video plan must be a map of frames, size, grid, second_per_grid_t, got {d!r:.80}")
        frames, size, grid, spg = d["frames"], d["size"], d["grid"], d["second_per_grid_t"]
        if not (isinstance(frames, list) and isinstance(size, list) and isinstance(grid, list)):
            raise TypeError("a video plan's frames, size and grid must be lists")
        if not isinstance(spg, float):
            raise TypeError(f"a video plan's second_per_grid_t must be a float, got {type(spg).__name__}")
        if len(size) != 2 or len(grid) != 3:
            raise TypeError(f"a video plan's size {size!r:.40} needs 2 values and its grid {grid!r:.40} 3")
        return cls(tuple(_as_int(i) for i in frames), (_as_int(size[0]), _as_int(size[1])),
                   (_as_int(grid[0]), _as_int(grid[1]), _as_int(grid[2])), spg)


def check_videos(media: Media, num_tokens: int) -> None:
    """The bounds on a pack's video plans (:class:`~wdspack.errors.FormatError` if one is out of them)."""
    for k, (plan, tokens) in enumerate(zip(media.plans, media.tokens)):
        frames = plan.frames
        if not frames or len(frames) > MAX_VIDEO_FRAMES or min(frames) < 0 or list(frames) != sorted(frames):
            raise FormatError(f"video {k}'s plan names {len(frames)} frames {list(frames)[:8]}...; a plan names "
                              f"1 to {MAX_VIDEO_FRAMES} frames in order")
        if not all(0 < v <= _MAX_SIDE for v in plan.size) or not all(0 < v <= _MAX_SIDE for v in plan.grid):
            raise FormatError(f"video {k}'s plan has size {plan.size} and grid {plan.grid}; both must be positive")
        if len(frames) * plan.size[0] * plan.size[1] > _MAX_VIDEO_PIXELS:  # what the loader resizes them to
            raise FormatError(f"video {k}'s plan resizes {len(frames)} frames to {plan.size[1]}x{plan.size[0]}: over "
                              f"{_MAX_VIDEO_PIXELS} pixels a video")
        if tokens < 0 or not 0 <= plan.second_per_grid_t < math.inf:  # 0: a family without time (LLaVA-OneVision)
            raise FormatError(f"video {k} has {tokens} tokens and {plan.second_per_grid_t} seconds per temporal patch")
    if sum(media.tokens) > num_tokens:
        raise FormatError(f"the videos take {sum(media.tokens)} tokens of a pack of {num_tokens}")


def _as_int(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected int, got {type(v).__name__}")
    return v
