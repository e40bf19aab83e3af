"""MiniCPM-V 4.6: ``MiniCPMV4_6Processor`` + its Pillow image processor (slices of a small
``scale_resolution``) and its video processor, tiny ``MiniCPMV4_6ForConditionalGeneration`` (a NaViT
SigLIP tower with its window-attention merger, a Qwen3.5 text model with linear- and full-attention layers)."""

from __future__ import annotations

from typing import Any

from . import tokenizer

#: A Qwen-style chat template as MiniCPM-V 4.6's: one image / video token per part, the processor expands it.
TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}"
    "{%- else %}{%- for content in message.content %}"
    "{%- if content.type == 'image' or 'image' in content %}<|image_pad|>"
    "{%- elif content.type == 'video' or 'video' in content %}<|video_pad|>"
    "{%- elif 'text' in content %}{{- content.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
#: The tokenizer attributes the processor reads, and their tokens.
NAMED = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "image_start_token": "<image>",
         "image_end_token": "</image>", "slice_start_token": "<slice>", "slice_end_token": "</slice>",
         "image_id_start_token": "<image_id>", "image_id_end_token": "</image_id>"}
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", *NAMED.values()]


def processor(folder: Any, *, scale_resolution: int = 56, max_slice_nums: int = 4, max_num_frames: int = 8) -> Any:
    """The real ``MiniCPMV4_6Processor``: slices of about ``scale_resolution``² pixels (14-pixel patches, 4 × 4
    patches a token), at most ``max_slice_nums`` of them; videos of at most ``max_num_frames`` frames."""
    from transformers import MiniCPMV4_6Processor
    from transformers.models.minicpmv4_6.image_processing_pil_minicpmv4_6 import MiniCPMV4_6ImageProcessorPil
    from transformers.models.minicpmv4_6.video_processing_minicpmv4_6 import MiniCPMV4_6VideoProcessor

    from wdspack.models import assemble_processor

    tok = tokenizer(folder, SPECIAL)
    tok.pad_token = "<|endoftext|>"
    # named tokens, as the published tokenizer_config.json declares them (saved with the tokenizer, read back)
    tok._set_model_specific_special_tokens(special_tokens=NAMED)
    settings = dict(scale_resolution=scale_resolution, max_slice_nums=max_slice_nums, patch_size=14,
                    image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return assemble_processor(MiniCPMV4_6Processor, image_processor=MiniCPMV4_6ImageProcessorPil(**settings),
                              video_processor=MiniCPMV4_6VideoProcessor(max_num_frames=max_num_frames, **settings),
                              tokenizer=tok, chat_template=TEMPLATE)


def model(processor: Any, *, seed: int = 0) -> Any:
    """A tiny random ``MiniCPMV4_6ForConditionalGeneration``: 2 vision layers (the window merger after the
    first), 2 text layers (Qwen3.5's pattern: a linear-attention layer, then a full-attention one)."""
    import torch
    from transformers import MiniCPMV4_6Config, MiniCPMV4_6ForConditionalGeneration

    tok = processor.tokenizer
    text = dict(model_type="qwen3_5_text", vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                max_position_embeddings=4096, pad_token_id=tok.pad_token_id,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1],
                                 "mrope_interleaved": True, "partial_rotary_factor": 0.5})
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  patch_size=14, image_size=56)
    config = MiniCPMV4_6Config(text_config=text, vision_config=vision, insert_layer_id=0,
                               image_token_id=tok.image_token_id, video_token_id=tok.video_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return MiniCPMV4_6ForConditionalGeneration(config).eval()
