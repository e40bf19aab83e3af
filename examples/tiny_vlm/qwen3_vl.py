"""Qwen3-VL: ``Qwen3VLProcessor`` + ``Qwen2VLImageProcessor`` (patch 16, merge 2, as the published
``preprocessor_config.json``), tiny ``Qwen3VLForConditionalGeneration`` (DeepStack vision, interleaved mRoPE)."""

from __future__ import annotations

from typing import Any

from . import tokenizer

#: Qwen3-VL-Instruct's published chat template, images, videos and text (no tools). Unlike
#: Qwen2.5-VL's it adds no default system turn; a system message is rendered only when it comes first.
TEMPLATE = (
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].content is string %}{{- messages[0].content }}"
    "{%- else %}{%- for content in messages[0].content %}{%- if 'text' in content %}{{- content.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- set image_count = namespace(value=0) %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}"
    "{%- else %}{%- for content in message.content %}"
    "{%- if content.type == 'image' or 'image' in content or 'image_url' in content %}"
    "{%- set image_count.value = image_count.value + 1 %}"
    "{%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif content.type == 'video' or 'video' in content %}<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif 'text' in content %}{{- content.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}"
    "{%- else %}{%- for content_item in message.content %}{%- if 'text' in content_item %}{{- content_item.text }}"
    "{%- endif %}{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
           "<|endoftext|>"]


def processor(folder: Any, *, min_pixels: int = 4 * 32 * 32, max_pixels: int = 64 * 32 * 32) -> Any:
    """The real ``Qwen3VLProcessor``; images of ``min_pixels``..``max_pixels`` (a handful of tokens each)."""
    from transformers import Qwen2VLImageProcessor

    from wdspack.models import assemble_processor

    tok = tokenizer(folder, SPECIAL)
    tok.pad_token = "<|endoftext|>"
    images = Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=16, merge_size=2,
                                   temporal_patch_size=2, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return assemble_processor("Qwen3VLProcessor", image_processor=images, tokenizer=tok, chat_template=TEMPLATE)


def model(processor: Any, *, seed: int = 0, cls: str = "Qwen3VLForConditionalGeneration") -> Any:
    """A tiny random ``cls`` (``Qwen3VLForConditionalGeneration`` or ``Qwen3VLMoeForConditionalGeneration``):
    2 vision blocks, both feeding DeepStack (added after text layers 0 and 1, so a third text layer lets the
    second one reach the loss); head_dim 16 so the interleaved mRoPE (section ``[4, 2, 2]``) mixes all three
    axes; the MoE variant routes each token to 2 of 4 experts."""
    import torch
    import transformers

    tok = processor.tokenizer
    ids = {name: tok.convert_tokens_to_ids(t) for name, t in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2],
                                 "mrope_interleaved": True},
                pad_token_id=tok.pad_token_id)
    if "Moe" in cls:
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1)
    ip = processor.image_processor
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=int(ip.patch_size),
                  spatial_merge_size=int(ip.merge_size), temporal_patch_size=int(ip.temporal_patch_size),
                  out_hidden_size=32, num_position_embeddings=64, deepstack_visual_indexes=[0, 1])
    config = getattr(transformers, cls.replace("ForConditionalGeneration", "Config"))(
        text_config=text, vision_config=vision, **ids)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return getattr(transformers, cls)(config).eval()
