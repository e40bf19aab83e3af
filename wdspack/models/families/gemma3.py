"""Gemma 3: fixed-size images, soft tokens that attend to each other both ways, sliding-window layers.

The chat template writes ``<start_of_image>`` per image; the processor replaces it with the full
image sequence, ``mm_tokens_per_image`` soft tokens whatever the image's size (pan-and-scan off)::

    template   ...Compare<start_of_image>with...
    processor  ...Compare\\n\\n<start_of_image><image_soft_token> × 256<end_of_image>\\n\\nwith...

The vision features fill the soft tokens. Gemma 3 lets the soft tokens of one image see each other
in both directions; everything else is causal, and the sliding layers also drop keys more than
``sliding_window - 1`` tokens back. Per pack (``S`` = soft token, window 2, one sub-sample shown
whole and the first token of the next; ``■`` attends, ``·`` does not)::

                  full layers             sliding layers
                 <s> a  S  S  b | <s>    <s> a  S  S  b | <s>
      <s>         ■  ·  ·  ·  · |  ·      ■  ·  ·  ·  · |  ·
      a           ■  ■  ·  ·  · |  ·      ■  ■  ·  ·  · |  ·
      S           ■  ■  ■  ■  · |  ·      ·  ■  ■  ■  · |  ·      S sees the next S (same image)
      S           ■  ■  ■  ■  · |  ·      ·  ·  ■  ■  · |  ·
      b           ■  ■  ■  ■  ■ |  ·      ·  ·  ·  ■  ■ |  ·
      <s>         ·  ·  ·  ·  · |  ■      ·  ·  ·  ·  · |  ■      a new sub-sample sees only itself

The model builds this mask itself from ``token_type_ids`` only for one sequence per row: with packed
(restarting) ``position_ids`` its sliding-layer mask looks the image blocks up by position instead
of by index (``create_masks_for_vision_model`` puts the block overlay inside the packed-sequence
remapping), so an image in a pack's second sub-sample would attend wrongly. So this family hands
the model its masks: ``attention_mask`` is the dict ``{"full_attention": ..., "sliding_attention":
...}`` Gemma 3 accepts in place of building its own, made by transformers' own mask builder for the
model's attention implementation (bool for SDPA, additive float for eager, a ``BlockMask`` for flex)
from the pack's ``seq_idx`` and ``token_type_ids``. The dict costs ``2·B·L²`` mask elements.
FlashAttention cannot take such a mask and is refused. Under flex the packed loss equals the
one-by-one loss (forward on CPU; torch has no CPU FlexAttention backward, so its gradients are a
``gpu`` test).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ...errors import ConfigError
from ..compat import call_private, private
from ..family import Budgets, Family, ImageSide, take_rows

__all__ = ["GEMMA3", "packed_masks"]

#: Attention implementations whose mask transformers builds from a mask function (the others
#: cannot hold the bidirectional image spans).
_MASKED = ("sdpa", "eager", "flex_attention")


def _replacements(processor: Any, sizes: Sequence[tuple[int, int]]) -> list[str]:
    if getattr(processor.image_processor, "do_pan_and_scan", None):
        raise ConfigError("Gemma 3 pan-and-scan is on (image_processor.do_pan_and_scan); its crop count needs the "
                          "pixels, so pack with it off (the default)")
    crops = {"num_crops": [0] * len(sizes)}  # no pan-and-scan: every image is one full image sequence
    return [processor.replace_image_token(crops, image_idx=i) for i in range(len(sizes))]


def _soft_token(processor: Any) -> str:
    return processor.tokenizer.image_token


def _pad_pixels(out: Mapping[str, torch.Tensor], processor: Any, budgets: Budgets,
                image_tokens: Sequence[int]) -> dict[str, torch.Tensor]:
    size = processor.image_processor.size
    k, M = len(image_tokens), budgets.max_images
    want = int(processor.image_seq_length)
    if any(int(n) != want for n in image_tokens):
        raise ConfigError(f"the pack reserved {list(image_tokens)} soft tokens per image but this processor gives "
                          f"{want}; load with the processor the dataset was packed with")
    padded = torch.zeros(M, 3, int(size["height"]), int(size["width"]), dtype=torch.float32)
    if k:
        pv = out["pixel_values"]
        if pv.shape[0] != k:
            raise ConfigError(f"the image processor gave {pv.shape[0]} images for {k}; turn pan-and-scan off")
        padded[:k] = pv
    return {"pixel_values": padded}


def _token_rows(input_ids: torch.Tensor, seq_lens: Sequence[int], pixels: Mapping[str, torch.Tensor],
                processor: Any) -> dict[str, torch.Tensor]:
    soft = int(processor.tokenizer.image_token_id)
    return {"token_type_ids": (input_ids == soft).to(torch.int64)}  # the processor's own key and values


def packed_masks(token_type_ids: torch.Tensor, seq_idx: torch.Tensor, *, sliding_window: int, implementation: str,
                 dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """The per-layer-type masks of packed rows, as Gemma 3 takes them in ``attention_mask``.

    Each sub-sample (``seq_idx``) sees only itself, causally, and each image's soft tokens
    (``token_type_ids == 1``, one run per image) see each other; sliding layers keep keys less than
    ``sliding_window`` tokens back. That is, per sub-sample, the mask the model builds for that
    sub-sample alone.

    Args:
        token_type_ids: ``[B, L]``, 1 on soft (image) tokens.
        seq_idx: ``[B, L]``, the sub-sample of each token (padding is a sub-sample of its own).
        sliding_window: the text config's ``sliding_window``.
        implementation: the text model's attention implementation (``sdpa``, ``eager``, ``flex_attention``).
        dtype: the model's float dtype (the additive eager mask).

    Returns:
        ``{"full_attention": mask, "sliding_attention": mask}``, each ``[B, 1, L, L]`` (bool for SDPA,
        0 / dtype-min float for eager) or a flex ``BlockMask``.

    Raises:
        ConfigError: an attention implementation that takes no such mask (FlashAttention).
    """
    (build_functions, and_masks, blockwise_overlay, causal_mask_function, or_masks, packed_sequence_mask_function,
     sliding_window_overlay) = private("transformers.masking_utils", "ALL_MASK_ATTENTION_FUNCTIONS", "and_masks",
                                       "blockwise_overlay", "causal_mask_function", "or_masks",
                                       "packed_sequence_mask_function", "sliding_window_overlay")
    block_ids = private("transformers.models.gemma3.modeling_gemma3", "get_block_sequence_ids_for_mask")

    if implementation not in _MASKED:
        raise ConfigError(f"Gemma 3 packs need a 4-D attention mask (bidirectional image spans), which "
                          f"attn_implementation {implementation!r} does not take; use one of {', '.join(_MASKED)}")
    blocks = call_private(block_ids, token_type_ids=token_type_ids)  # the model's own image-run numbering
    full = and_masks(call_private(packed_sequence_mask_function, packed_sequence_mask=seq_idx),
                     or_masks(causal_mask_function, call_private(blockwise_overlay, block_sequence_ids=blocks)))
    sliding = and_masks(full, call_private(sliding_window_overlay, sliding_window=sliding_window))
    build = build_functions[implementation]
    B, L = token_type_ids.shape
    return {name: call_private(build, batch_size=B, q_length=L, kv_length=L, mask_function=fn,
                               allow_is_causal_skip=False, dtype=dtype, device=token_type_ids.device)
            for name, fn in (("full_attention", full), ("sliding_attention", sliding))}


def _model_kwargs(batch: Mapping[str, Any], model: Any) -> dict[str, Any]:
    text = model.config.get_text_config()
    param = next(model.parameters())
    masks = packed_masks(batch["token_type_ids"].to(param.device), batch["seq_idx"].to(param.device),
                         sliding_window=int(text.sliding_window), implementation=text._attn_implementation,
                         dtype=param.dtype if param.is_floating_point() else torch.float32)
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"],
                              "attention_mask": masks}
    if bool(batch["image_mask"].any()):
        kwargs["pixel_values"] = take_rows(batch["pixel_values"], batch["image_mask"])
    return kwargs


GEMMA3 = Family(
    name="gemma3", processors=("Gemma3Processor",), model_types=("gemma3",),
    image=ImageSide(replacements=_replacements, feature_token=_soft_token,
                    placeholder=lambda processor: processor.image_token, pad=_pad_pixels),
    token_rows=_token_rows, token_keys=("token_type_ids",), model_kwargs=_model_kwargs,
    notes="fixed-size pixel_values [B·M, 3, S, S]; token_type_ids; attention_mask = per-layer-type dict of "
          "packed masks (bidirectional image spans, sliding window); no pan-and-scan",
    no_varlen="its image soft tokens attend to each other both ways, which a causal varlen kernel cannot "
              "express; use attn_implementation 'sdpa' or 'flex_attention' (packed masks built by model_inputs)",
)

FAMILIES = (GEMMA3,)
