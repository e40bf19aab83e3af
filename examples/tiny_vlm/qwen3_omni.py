"""Qwen3-Omni (thinker only): ``Qwen3OmniMoeProcessor`` + ``Qwen2VLImageProcessor`` (patch 16, merge 2) +
``WhisperFeatureExtractor`` (128 mel bins) + ``Qwen2VLVideoProcessor(**VIDEO)`` (it needs torchvision, so
:func:`processor` leaves it out unless given one), tiny
``Qwen3OmniMoeThinkerForConditionalGeneration`` (a windowed audio encoder, a DeepStack vision tower, a MoE text
model)."""

from __future__ import annotations

from typing import Any

from . import tokenizer

#: Qwen3-Omni-Instruct's chat template for images, audio, videos and text (no tools, no default system turn):
#: each image ``<|vision_start|><|image_pad|><|vision_end|>``, audio ``<|audio_start|><|audio_pad|><|audio_end|>``,
#: video ``<|vision_start|><|video_pad|><|vision_end|>``.
TEMPLATE = (
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].content is string %}{{- messages[0].content }}"
    "{%- else %}{%- for content in messages[0].content %}{%- if 'text' in content %}{{- content.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}"
    "{%- else %}{%- for content in message.content %}"
    "{%- if content.type == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif content.type == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "<|audio_start|><|audio_pad|><|audio_end|>"
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
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|audio_start|>", "<|audio_end|>",
           "<|image_pad|>", "<|audio_pad|>", "<|video_pad|>", "<|endoftext|>"]
NAMED = dict(image_token="<|image_pad|>", audio_token="<|audio_pad|>", video_token="<|video_pad|>",
             vision_bos_token="<|vision_start|>", vision_eos_token="<|vision_end|>", audio_bos_token="<|audio_start|>",
             audio_eos_token="<|audio_end|>")


#: The ``WhisperFeatureExtractor``'s keywords: 128 mel bins, its frame mask returned.
FEATURES = {"feature_size": 128, "return_attention_mask": True}
#: The ``Qwen2VLVideoProcessor``'s keywords: the image processor's patches and normalisation, frames sampled at 2 a
#: second (6 to 8 a video), small frames (the processor's call puts its own 128·32² to 768·32² pixels over ``size``).
VIDEO = {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2, "image_mean": [0.5, 0.5, 0.5],
         "image_std": [0.5, 0.5, 0.5], "do_sample_frames": True, "fps": 2.0, "min_frames": 6, "max_frames": 8,
         "size": {"shortest_edge": 4 * 32 * 32, "longest_edge": 16 * 32 * 32}, "cap_pixels_per_frame": False}


def processor(folder: Any, *, min_pixels: int = 4 * 32 * 32, max_pixels: int = 64 * 32 * 32,
              video: Any = None) -> Any:
    """The real ``Qwen3OmniMoeProcessor``: Whisper features of 128 mel bins (padded to the longest of a call, never
    cut), small images; ``video``: its video processor (``Qwen2VLVideoProcessor(**VIDEO)``, where torchvision imports),
    which its ``save_pretrained`` then writes beside the other parts."""
    from transformers import Qwen2VLImageProcessor, WhisperFeatureExtractor

    from wdspack.models import assemble_processor

    tok = tokenizer(folder, SPECIAL)
    tok.pad_token = "<|endoftext|>"
    tok._set_model_specific_special_tokens(NAMED)
    images = Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=16, merge_size=2,
                                   temporal_patch_size=2, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    features = WhisperFeatureExtractor(**FEATURES)
    return assemble_processor("Qwen3OmniMoeProcessor", image_processor=images, tokenizer=tok,
                              chat_template=TEMPLATE, feature_extractor=features,
                              **({"video_processor": video} if video is not None else {}))


def model(processor: Any, *, seed: int = 0) -> Any:
    """A tiny random ``Qwen3OmniMoeThinkerForConditionalGeneration``: a 2-layer audio encoder (1 s chunks of
    ``2·n_window`` frames, attention windows of ``n_window_infer``), a 2-block vision tower feeding DeepStack, a
    3-layer MoE text model (2 of 4 experts a token), the processor's token ids and 13 position ids a second."""
    import torch
    from transformers import Qwen3OmniMoeThinkerConfig, Qwen3OmniMoeThinkerForConditionalGeneration

    tok = processor.tokenizer
    ids = {name: tok.convert_tokens_to_ids(t) for name, t in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"), ("audio_token_id", "<|audio_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"),
        ("audio_start_token_id", "<|audio_start|>"), ("audio_end_token_id", "<|audio_end|>"))}
    audio = dict(num_mel_bins=int(processor.feature_extractor.feature_size), encoder_layers=2,
                 encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32, output_dim=32, n_window=50,
                 n_window_infer=200, downsample_hidden_size=8, max_source_positions=1500)
    ip = processor.image_processor
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=int(ip.patch_size),
                  spatial_merge_size=int(ip.merge_size), temporal_patch_size=int(ip.temporal_patch_size),
                  out_hidden_size=32, num_position_embeddings=64, deepstack_visual_indexes=[0, 1])
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2],
                                 "mrope_interleaved": True},
                pad_token_id=tok.pad_token_id)
    config = Qwen3OmniMoeThinkerConfig(audio_config=audio, vision_config=vision, text_config=text,
                                       position_id_per_seconds=int(processor.position_id_per_seconds), **ids)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen3OmniMoeThinkerForConditionalGeneration(config).eval()
