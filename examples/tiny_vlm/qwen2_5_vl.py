"""Qwen2.5-VL (and Qwen2-VL): ``Qwen2_5_VLProcessor`` + ``Qwen2VLImageProcessor``, tiny
``Qwen2_5_VLForConditionalGeneration``."""

from __future__ import annotations

from typing import Any

from . import tokenizer

#: Qwen2-VL / Qwen2.5-VL's published chat template (images, videos and text; no tools).
TEMPLATE = (
    "{% set image_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
           "<|endoftext|>"]


def processor(folder: Any, *, min_pixels: int = 4 * 28 * 28, max_pixels: int = 64 * 28 * 28,
              cls: str = "Qwen2_5_VLProcessor") -> Any:
    from transformers import Qwen2VLImageProcessor

    from wdspack.models import assemble_processor

    tok = tokenizer(folder, SPECIAL)
    tok.pad_token = "<|endoftext|>"
    images = Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels)
    return assemble_processor(cls, image_processor=images, tokenizer=tok, chat_template=TEMPLATE)


def model(processor: Any, *, seed: int = 0, cls: str = "Qwen2_5_VLForConditionalGeneration") -> Any:
    import torch
    import transformers

    tok = processor.tokenizer
    ids = {name: tok.convert_tokens_to_ids(t) for name, t in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    config_cls = getattr(transformers, cls.replace("ForConditionalGeneration", "Config"))
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
                pad_token_id=tok.pad_token_id, bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
                eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))  # Qwen's own, in this vocabulary
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=32, window_size=56, fullatt_block_indexes=[1])
    if cls.startswith("Qwen2VL"):
        vision = dict(depth=2, embed_dim=32, hidden_size=32, mlp_ratio=2, num_heads=2, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2)
    config = config_cls(text_config=text, vision_config=vision, **ids)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return getattr(transformers, cls)(config).eval()
