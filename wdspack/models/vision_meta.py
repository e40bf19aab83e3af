"""A Qwen-VL vision tower's bookkeeping, computed on the host from the batch's ``image_grid_thw``.

Before it runs a single layer, a Qwen-VL vision tower derives from ``image_grid_thw`` where each
image's patches sit (rotary position ids), where each image or window starts and ends
(``cu_seqlens``, ``cu_window_seqlens``), the longest of them (``max_seqlen``), the order of the
windows (Qwen2.5-VL's ``window_index``) and how to resample its position table (Qwen3-VL's
``interp_indices``/``interp_weights``). A tracer over one packed Qwen2.5-VL forward of 6 images (on
the CPU) counted 21 reads of tensor values by transformers, 19 of them in this bookkeeping. With the grid
on the GPU, about a dozen of those wait for the GPU (``.tolist()``, ``.item()``, a data-dependent
shape, an index made on the CPU and copied over), each until everything queued before it has run; in
between, a Python loop over the images works out the window order (19 ms for a bench step's 50 images
here) while the GPU has nothing queued.

transformers lets a caller hand these in ready-made, as ``image_*`` keyword arguments of the model's
forward (its ``accepts_precomputed_kwargs``): ``image_cu_seqlens``, ``image_position_ids``, ... .
:func:`precomputed_vision_kwargs` computes them here, on the CPU copy of the grid that the loader's
batch holds, with transformers' own functions (``transformers.vision_utils``) and the tower's own
settings, so the values are the ones the tower would compute; :func:`wdspack.model_inputs` adds them
and moves them with the batch (``non_blocking``). The tower then reads them instead of the grid.

It is used only where it is known to be exact: for towers whose ``forward`` calls no helper but the
ones below (read from its code), and with a transformers release in the tested range
(:data:`wdspack.models.compat.TESTED_TRANSFORMERS`); otherwise the tower computes them itself, as
before (slower on a GPU, the same numbers).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from typing import Any

import torch

from ..errors import ConfigError
from .compat import in_tested_range, private

__all__ = ["precomputed_vision_kwargs", "vision_helpers"]

_UTILS = "transformers.vision_utils"
#: What a tower's forward may call, each a helper that takes the precomputed values from its kwargs.
_KNOWN = frozenset({"get_vision_position_ids", "get_vision_attention_seqlens", "get_vision_window_index",
                    "get_max_seqlen", "get_vision_interpolation_indices_and_weights"})
_HELPERS: dict[type, frozenset[str] | None] = {}


def vision_helpers(tower: Any) -> frozenset[str] | None:
    """The grid helpers ``tower``'s forward calls (read once per class), or ``None`` if it calls one that
    :func:`precomputed_vision_kwargs` does not fill in, or none at all.

    Example:
        >>> class Tower:
        ...     def forward(self, x, grid_thw, **kwargs):
        ...         return get_vision_position_ids(grid_thw, 2, kwargs=kwargs)
        >>> sorted(vision_helpers(Tower()))
        ['get_vision_position_ids']
    """
    cls = type(tower)
    if cls not in _HELPERS:
        forward = inspect.unwrap(getattr(cls, "forward", None) or (lambda: None))
        names = set(getattr(getattr(forward, "__code__", None), "co_names", ()))
        called = frozenset(n for n in names if n.startswith("get_vision_") or n == "get_max_seqlen")
        _HELPERS[cls] = called if called and called <= _KNOWN and "get_vision_position_ids" in called else None
    return _HELPERS[cls]


def _tower(model: Any) -> Any:
    for owner in (model, getattr(model, "model", None)):
        tower = getattr(owner, "visual", None)
        if isinstance(tower, torch.nn.Module):
            return tower
    return None


def _longest(cu: torch.Tensor) -> int:
    return int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0


@dataclass(frozen=True, slots=True)
class _Settings:
    """What a tower's helpers are called with besides the grid (hashable: the per-image cache's key)."""

    merge: int
    window: tuple[int, int] | None  # Qwen2.5-VL: (window_size, patch_size)
    interpolation: tuple[int, str, bool, int] | None  # Qwen3-VL: (grid per side, mode, align_corners, merge)

    @classmethod
    def of(cls, tower: Any, helpers: frozenset[str]) -> _Settings:
        window = ((int(tower.window_size), int(tower.patch_size))
                  if "get_vision_window_index" in helpers else None)
        interpolation = ((int(tower.num_grid_per_side), str(tower.interpolation_mode),
                          bool(tower.interpolation_align_corners), int(tower.config.spatial_merge_size))
                         if "get_vision_interpolation_indices_and_weights" in helpers else None)
        return cls(int(tower.spatial_merge_size), window, interpolation)


@lru_cache(maxsize=4096)
def _one_image(settings: _Settings, thw: tuple[int, int, int]) -> dict[str, torch.Tensor]:
    """transformers' helpers on a one-image grid ``thw`` (images of a size recur: computed once each)."""
    grid = torch.tensor([thw], dtype=torch.int64)
    out = {"position_ids": private(_UTILS, "get_vision_position_ids")(grid, settings.merge)}
    if settings.window is not None:
        window_size, patch_size = settings.window
        out["window_index"], out["cu_window_seqlens"] = private(_UTILS, "get_vision_window_index")(
            grid, spatial_merge_size=settings.merge, window_size=window_size, patch_size=patch_size)
    if settings.interpolation is not None:
        side, mode, align, merge = settings.interpolation
        out["interp_indices"], out["interp_weights"] = private(
            _UTILS, "get_vision_interpolation_indices_and_weights")(
            grid, num_grid_per_side=side, mode=mode, align_corners=align, spatial_merge_size=merge)
    return out


def precomputed_vision_kwargs(model: Any, image_grid_thw: torch.Tensor) -> dict[str, Any]:
    """``image_*`` forward kwargs with which ``model``'s Qwen-VL vision tower skips its own grid bookkeeping.

    ``image_grid_thw`` must be on the CPU (the loader's batch is); what comes back is on the CPU too,
    for :func:`wdspack.model_inputs` to move. Empty (the tower computes them itself) for a model
    without such a tower, a tower that calls a helper not filled in here, or a transformers release
    outside the tested range.

    Each image's part is transformers' helper on that image alone, kept per image size; the images'
    parts are joined as the helper joins them over a whole grid (window order and window offsets
    shifted by the patches before), which the tests check equals one call over the whole grid.

    Raises:
        ConfigError: ``image_grid_thw`` is not a CPU tensor.
    """
    tower = _tower(model)
    helpers = vision_helpers(tower) if tower is not None else None
    if helpers is None or not in_tested_range() or image_grid_thw.numel() == 0:
        return {}
    if image_grid_thw.device.type != "cpu":
        raise ConfigError(f"image_grid_thw is on {image_grid_thw.device}; pass the loader's (CPU) copy, which "
                         "is what saves the GPU reads")
    grid = image_grid_thw.to(torch.int64)
    settings = _Settings.of(tower, helpers)
    rows = [(int(t), int(h), int(w)) for t, h, w in grid.tolist()]
    parts = [_one_image(settings, thw) for thw in rows]
    cu_seqlens = private(_UTILS, "get_vision_cu_seqlens")(grid)
    out: dict[str, Any] = {"image_position_ids": torch.cat([p["position_ids"] for p in parts]),
                           "image_cu_seqlens": cu_seqlens, "image_max_seqlen": _longest(cu_seqlens)}
    if settings.window is not None:  # Qwen2.5-VL: each image's windows after the patches and tokens before it
        patches = [t * h * w for t, h, w in rows]
        before = list(accumulate(patches, initial=0))  # patches of the images before each one
        index = torch.cat([p["window_index"] + b // settings.merge ** 2 for p, b in zip(parts, before)])
        cu_windows = torch.unique_consecutive(torch.cat(
            [torch.zeros(1, dtype=torch.int32)] + [p["cu_window_seqlens"][1:] + b for p, b in zip(parts, before)]))
        out.update(image_window_index=index, image_cu_window_seqlens=cu_windows,
                   image_max_window_seqlen=_longest(cu_windows))
    if settings.interpolation is not None:  # Qwen3-VL: per patch, from its own image's size alone
        out.update(image_interp_indices=torch.cat([p["interp_indices"] for p in parts]),
                   image_interp_weights=torch.cat([p["interp_weights"] for p in parts]))
    return out
