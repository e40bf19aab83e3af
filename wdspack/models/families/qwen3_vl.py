"""Qwen3-VL (dense and MoE): Qwen2.5-VL's inputs, read differently inside the model.

The processor side is Qwen2.5-VL's with 16-pixel patches: ``Qwen3VLProcessor`` turns each
``<|vision_start|><|image_pad|><|vision_end|>`` into ``t·h·w / merge²`` pads, from the image size
alone (``smart_resize`` to multiples of ``patch · merge`` = 32 pixels). The model's
``get_rope_index`` gives images the same 3-D positions as Qwen2.5-VL's (text counts on, an image
sits on its ``t × h/merge × w/merge`` grid, text after it continues at ``start + max(h, w)/merge``),
so :func:`wdspack.models.families.qwen_vl.mrope_positions` is reused as it is. What is new lives in the model
and reads the same inputs:

* interleaved mRoPE: the rotary embedding spreads the T/H/W rows over alternating frequencies
  (``mrope_section``); the position rows themselves are unchanged.
* DeepStack: features of early vision blocks are added to the image tokens' hidden states in the
  first text layers, at ``input_ids == <|image_pad|>`` in row-major order, which is the order of the
  batch's images (pack-major, then sub-sample order), as for the main image features.

Per sub-sample of a pack (one 64 × 64 image: 4 × 4 patches of 16, merge 2 → 2 × 2 pads)::

    tokens       <|im_start|> user \\n <vs> [P] [P] [P] [P] <ve> hi     (no default system turn)
    row 0 (text)      0        1   2   3   4   5   6   7   8   9     restarts at 0 per sub-sample
    temporal          0        1   2   3   4   4   4   4   6   7
    height            0        1   2   3   4   4   5   5   6   7
    width             0        1   2   3   4   5   4   5   6   7

The loader's ``position_ids`` is ``[4, B, L]``: ``Qwen3VLTextModel`` takes row 0 as the text
positions and builds the block-causal mask from its restarts (``create_causal_mask`` with
``attention_mask=None``), rows 1-3 go to the rotary embedding. ``mm_token_type_ids`` is 1 on image
tokens. Qwen3.5 and others that share ``Qwen3VLProcessor`` are not fed here: their linear-attention
layers need more than restarting positions to keep packed sub-samples apart.
"""

from __future__ import annotations

from dataclasses import replace

from ..family import Family
from .qwen_vl import QWEN2_5_VL, QWEN3_VIDEO, qwen3_token_rows

__all__ = ["QWEN3_VL"]

#: Same replacements, pixel padding, token rows, batch finish and model kwargs as Qwen2.5-VL (see the
#: module docstring for why); only the classes it serves differ.
QWEN3_VL: Family = replace(
    QWEN2_5_VL, name="qwen3_vl", processors=("Qwen3VLProcessor",), model_types=("qwen3_vl", "qwen3_vl_moe"),
    video=QWEN3_VIDEO, token_rows=qwen3_token_rows,
    notes="as qwen2_5_vl (16-px patches): flattened patches + image_grid_thw; position_ids [4, B, L] (text row + "
          "3-D mRoPE rows, interleaved in the model); mm_token_type_ids; DeepStack fed from the same image tokens",
)

FAMILIES = (QWEN3_VL,)
