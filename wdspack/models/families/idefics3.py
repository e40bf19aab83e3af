"""Idefics3 and SmolVLM: images split into square tiles, ``image_seq_len`` ``<image>`` tokens per tile.

The image processor resizes an image's longest edge to ``size["longest_edge"]``, rounds both
sides up to multiples of the tile side ``max_image_size["longest_edge"]`` and cuts
``rows × cols`` tiles, plus one global tile (the whole image shrunk to one tile). An image that
fits one tile is the global tile alone (``rows = cols = 0``). The processor writes, per image::

    rows 2, cols 2, image_seq_len 2 (F <fake_token_around_image>, I <image>, G <global-img>)

    F <row_1_col_1> I I F <row_1_col_2> I I \\n
    F <row_2_col_1> I I F <row_2_col_2> I I \\n
    \\n F G I I F                                 5 tiles → 10 <image> tokens

    rows 0, cols 0:  F G I I F                   1 tile  →  2 <image> tokens

The count comes from the image size alone. The loader feeds the processor's tiles
(``pixel_values`` ``[T, 3, S, S]`` and ``pixel_attention_mask`` ``[T, S, S]`` per pack, ``T``
from the budgets (:func:`tile_slots`), zero tiles after the real ones, ``tile_mask`` ``[T]`` marks
the real ones); ``model_kwargs`` hands the model only the real tiles, in order, as one
``[1, tiles, 3, S, S]`` row, and the text model (Llama) builds the block-causal mask from the
batch's restarting ``position_ids``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ...errors import ConfigError
from ..family import Budgets, Family, ImageSide, Rows

__all__ = ["IDEFICS3", "SMOLVLM", "tile_grid", "tile_slots"]


def tile_grid(image_processor: Any, height: int, width: int) -> tuple[int, int]:
    """``(rows, cols)`` the image processor splits an image of ``height × width`` into (``(0, 0)``: one tile).

    Follows the image processor's ``_preprocess`` step by step: its module's own longest-edge resize
    arithmetic, then ``resize_for_vision_encoder``'s rounding. Not ``get_number_of_image_patches``:
    that one rounds the short side before ``resize_for_vision_encoder`` recomputes it, and is off by
    a row or column when ``size["longest_edge"]`` is not a multiple of the tile side.
    """
    ip = image_processor
    if ip.do_resize:
        size = ip.size
        if size.get("longest_edge"):
            helpers = _resize_module(ip)
            height, width = helpers._resize_output_size_rescale_to_max_len(height, width,
                                                                           max_len=size["longest_edge"])
            height, width = helpers._resize_output_size_scale_below_upper_bound(height, width,
                                                                                max_len=helpers.MAX_IMAGE_SIZE)
        else:
            height, width = size["height"], size["width"]
    if not ip.do_image_splitting:
        return 0, 0
    tile = _tile(ip)
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    if height > tile or width > tile:
        return height // tile, width // tile
    return 0, 0


def _resize_module(image_processor: Any) -> Any:
    """The module of the image processor's class (or of the transformers class it derives from) that
    holds its longest-edge resize arithmetic."""
    for klass in type(image_processor).__mro__:
        module = sys.modules.get(klass.__module__)
        if hasattr(module, "_resize_output_size_rescale_to_max_len") and hasattr(module, "MAX_IMAGE_SIZE"):
            return module
    raise ConfigError(f"{type(image_processor).__name__} is not an Idefics3/SmolVLM image processor of this "
                      "transformers version (no longest-edge resize helpers in its module); use the model's own "
                      "image processor class")


def _tile(image_processor: Any) -> int:
    return int(image_processor.max_image_size["longest_edge"])


def _tiles(rows: int, cols: int) -> int:
    return rows * cols + 1 if rows or cols else 1


def _replacements(processor: Any, sizes: Sequence[tuple[int, int]]) -> list[str]:
    grids = [tile_grid(processor.image_processor, h, w) for h, w in sizes]
    layout = {"rows": [[r for r, _ in grids]], "cols": [[c for _, c in grids]]}
    return [processor.replace_image_token(layout, image_idx=i) for i in range(len(sizes))]


def _pixels(processor: Any, images: Sequence[Any]) -> dict[str, torch.Tensor]:
    # One nested list, as the processor groups one text's images: [1, tiles, 3, S, S].
    out = processor.image_processor([list(images)], return_tensors="pt", return_row_col_info=True)
    tiles = [_tiles(r, c) for r, c in zip(out["rows"][0], out["cols"][0])]
    pv = out["pixel_values"][0]
    mask = out["pixel_attention_mask"][0] if "pixel_attention_mask" in out else torch.ones(pv.shape[0], *pv.shape[2:],
                                                                                             dtype=torch.int64)
    return {"pixel_values": pv, "pixel_attention_mask": mask, "image_tiles": torch.tensor(tiles, dtype=torch.int64)}


def tile_slots(processor: Any, budgets: Budgets) -> int:
    """Tile slots per pack: what the pack's tokens can hold (a tile is ``image_seq_len`` image tokens
    plus a fake token and a row/col or global token; the manifest's largest pack of image tokens
    when known), capped by ``max_images`` of the largest image the processor makes."""
    ip = processor.image_processor
    seq = int(processor.image_seq_len)
    by_tokens = min(budgets.seq_len // (seq + 2), budgets.image_tokens // seq)
    if not budgets.max_images:
        return 0
    longest = ip.size.get("longest_edge") if ip.do_resize else None
    if longest is None:
        return by_tokens  # no longest-edge resize: only the tokens bound an image's tiles
    side = math.ceil(min(longest, _resize_module(ip).MAX_IMAGE_SIZE) / _tile(ip)) if ip.do_image_splitting else 0
    per_image = _tiles(side, side) if side > 1 else 1
    return min(by_tokens, budgets.max_images * per_image)


def _pad_pixels(out: Mapping[str, torch.Tensor], processor: Any, budgets: Budgets,
                image_tokens: Sequence[int]) -> dict[str, Any]:
    slots, tile = tile_slots(processor, budgets), _tile(processor.image_processor)
    k = len(image_tokens)
    pixels = torch.zeros(0, 3, tile, tile)
    mask = torch.zeros(0, tile, tile, dtype=torch.int64)
    if k:
        tokens = (out["image_tiles"] * int(processor.image_seq_len)).tolist()
        if tokens != list(image_tokens):
            raise ConfigError(f"the image processor gives {tokens} image tokens for these images but the pack "
                              f"reserved {list(image_tokens)}; load with the processor (and settings) the dataset "
                              "was packed with")
        pixels, mask = out["pixel_values"].to(torch.float32), out["pixel_attention_mask"]
        if pixels.shape[0] > slots:
            raise ConfigError(f"{pixels.shape[0]} image tiles > the {slots} tile slots a pack has room for; the "
                              "dataset's manifest and the processor disagree: load with the processor it was packed "
                              "with")
        if tuple(pixels.shape[1:]) != (3, tile, tile):
            raise ConfigError(f"image tiles of shape {tuple(pixels.shape[1:])}, expected (3, {tile}, {tile}) from "
                              "max_image_size; use the processor's own image settings")
    # Rows: the loader writes the real tiles into its batch tensor and zero-fills the slots after them.
    return {"pixel_values": Rows(pixels, slots), "pixel_attention_mask": Rows(mask, slots),
            "tile_mask": torch.arange(slots) < pixels.shape[0]}


def _model_kwargs(batch: Mapping[str, Any], model: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
    if bool(batch["image_mask"].any()):
        # The real tiles in order, as one processor row [1, tiles, ...]: the model scatters their
        # features into the <image> tokens of the flattened input_ids in order.
        real = batch["tile_mask"]
        kwargs["pixel_values"] = batch["pixel_values"][real][None]
        kwargs["pixel_attention_mask"] = batch["pixel_attention_mask"][real][None]
    return kwargs


def _family(name: str, processor: str, model_type: str) -> Family:
    return Family(
        name=name, processors=(processor,), model_types=(model_type,),
        image=ImageSide(replacements=_replacements, pixels=_pixels, pad=_pad_pixels), model_kwargs=_model_kwargs,
        notes="image tiles + pixel_attention_mask [B·T, ...] with tile_mask; <row_i_col_j>/<global-img> layout "
              "from the image size; 2-D position_ids",
    )


IDEFICS3 = _family("idefics3", "Idefics3Processor", "idefics3")
SMOLVLM = _family("smolvlm", "SmolVLMProcessor", "smolvlm")

FAMILIES = (IDEFICS3, SMOLVLM)
