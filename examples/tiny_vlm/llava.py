"""LLaVA-1.5 and LLaVA-OneVision: the real processors and image processors, tiny random models.

* ``kind="llava"``: ``LlavaProcessor`` + ``CLIPImageProcessor`` (32 px crops), a tiny
  ``LlavaForConditionalGeneration`` (CLIP vision tower with CLS, patch 8, ``"default"`` feature
  strategy drops the CLS: 16 tokens per image; Llama text model).
* ``kind="llava_onevision"``: ``LlavaOnevisionProcessor`` + ``LlavaOnevisionImageProcessor``
  (16 px tiles, grid pinpoints up to 3×3 tiles), a tiny ``LlavaOnevisionForConditionalGeneration``
  (SigLIP vision tower, patch 8: 4 tokens per tile; Qwen2 text model). ``anyres_max_4`` keeps the
  feature interpolation of large grids in play at these small sizes (the published models use
  ``anyres_max_9`` with 384 px tiles).

Without torchvision transformers builds the images' PIL backends (``CLIPImageProcessorPil``,
``LlavaOnevisionImageProcessorPil``); they are the same processors.
"""

from __future__ import annotations

from typing import Any

from . import tokenizer

#: llava-hf/llava-1.5-*-hf's published chat template (a message's images first, then its text).
LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}"
    "{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

#: llava-hf/llava-onevision-qwen2-*-hf's published chat template: a message's images, then its videos
#: (``<video>`` for each ``{"type": "video"}`` part), then its text.
ONEVISION_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{# Render all video then #}{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>\n' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] }}{% endgeneration %}{% endfor %}{% endif %}"
    "{{'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

LLAVA_SPECIAL = ["<image>", "<pad>"]
ONEVISION_SPECIAL = ["<|im_start|>", "<|im_end|>", "<image>", "<video>", "<|endoftext|>"]

#: LLaVA-OneVision's tile side and pinpoints (every grid of 1-3 × 1-3 tiles, as the published
#: ones are every grid of 1-6 × 1-6 tiles of 384 px).
TILE = 16
PINPOINTS = [[TILE * i, TILE * j] for i in (1, 2, 3) for j in (1, 2, 3)]
PATCH = 8


def processor(folder: Any, *, kind: str = "llava", vision_aspect_ratio: str = "anyres_max_4",
              strategy: str = "default", tile: int = TILE) -> Any:
    """The real processor of ``kind`` (``"llava"`` or ``"llava_onevision"``), small image sizes.

    ``strategy`` is LLaVA-1.5's ``vision_feature_select_strategy`` (``"default"`` drops the CLS
    feature, ``"full"`` keeps it: one more token per image). ``tile``: LLaVA-OneVision's tile side (a
    multiple of the 8 px patch; 24 gives 3 × 3 features per tile, pooled to 2 × 2 per video frame).
    """
    from wdspack.models import assemble_processor

    if kind == "llava":
        from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

        tok = tokenizer(folder, LLAVA_SPECIAL)
        tok.pad_token = "<pad>"
        images = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        return assemble_processor("LlavaProcessor", image_processor=images, tokenizer=tok,
                                  chat_template=LLAVA_TEMPLATE, patch_size=PATCH,
                                  vision_feature_select_strategy=strategy, num_additional_image_tokens=1)
    if kind == "llava_onevision":
        from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
            LlavaOnevisionImageProcessorPil,
        )

        tok = tokenizer(folder, ONEVISION_SPECIAL)
        tok.pad_token = "<|endoftext|>"
        pinpoints = [[tile * i, tile * j] for i in (1, 2, 3) for j in (1, 2, 3)]
        images = LlavaOnevisionImageProcessorPil(size={"height": tile, "width": tile}, image_grid_pinpoints=pinpoints)
        return assemble_processor("LlavaOnevisionProcessor", image_processor=images, tokenizer=tok,
                                  chat_template=ONEVISION_TEMPLATE, num_image_tokens=(tile // PATCH) ** 2,
                                  vision_feature_select_strategy="full", vision_aspect_ratio=vision_aspect_ratio)
    raise ValueError(f"kind {kind!r}: give 'llava' or 'llava_onevision'")


def model(processor: Any, *, seed: int = 0, head_dim: int | None = None) -> Any:
    """A tiny random-init model of the real class that ``processor`` feeds, matching its settings (text
    ``head_dim`` 8 unless given: 16 or more for GPU attention kernels, FlexAttention needs ≥ 16)."""
    import torch
    import transformers

    tok = processor.tokenizer
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=4096, pad_token_id=tok.pad_token_id,
                **({} if head_dim is None else {"head_dim": head_dim}))
    if type(processor).__name__ == "LlavaProcessor":
        side = int(processor.image_processor.crop_size["height"])
        vision = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, image_size=side, patch_size=int(processor.patch_size), projection_dim=32)
        text["model_type"] = "llama"
        config = transformers.LlavaConfig(
            vision_config=vision, text_config=text, image_token_index=tok.convert_tokens_to_ids(processor.image_token),
            vision_feature_select_strategy=processor.vision_feature_select_strategy, vision_feature_layer=-2,
            image_seq_length=(side // int(processor.patch_size)) ** 2)
        cls = transformers.LlavaForConditionalGeneration
    else:
        ip = processor.image_processor
        vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, image_size=int(ip.size["height"]), patch_size=PATCH,
                      vision_use_head=False)
        text["model_type"] = "qwen2"
        config = transformers.LlavaOnevisionConfig(
            vision_config=vision, text_config=text, image_token_index=processor.image_token_id,
            video_token_index=processor.video_token_id, image_grid_pinpoints=ip.image_grid_pinpoints,
            vision_feature_select_strategy=processor.vision_feature_select_strategy, vision_feature_layer=-1,
            vision_aspect_ratio=processor.vision_aspect_ratio)
        cls = transformers.LlavaOnevisionForConditionalGeneration
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return cls(config).eval()
