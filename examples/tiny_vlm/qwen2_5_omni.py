"""Qwen2.5-Omni (thinker only): ``Qwen2_5OmniProcessor`` + ``Qwen2VLImageProcessor`` + ``WhisperFeatureExtractor``
(128 mel bins; its video processor, which needs torchvision, left out), tiny
``Qwen2_5OmniThinkerForConditionalGeneration`` (an audio encoder, a vision tower and a Qwen2 text model)."""

from __future__ import annotations

from typing import Any

from . import tokenizer

#: Qwen2.5-Omni-7B's published chat template (images, audio, videos and text; no tools): each image
#: ``<|vision_bos|><|IMAGE|><|vision_eos|>``, audio ``<|audio_bos|><|AUDIO|><|audio_eos|>``, video
#: ``<|vision_bos|><|VIDEO|><|vision_eos|>``.
TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% set image_count = namespace(value=0) %}"
    "{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "{% if add_audio_id %}Audio {{ audio_count.value }}: {% endif %}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_bos|><|VIDEO|><|vision_eos|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|vision_bos|>", "<|vision_eos|>", "<|audio_bos|>", "<|audio_eos|>",
           "<|IMAGE|>", "<|AUDIO|>", "<|VIDEO|>", "<|endoftext|>"]
NAMED = dict(image_token="<|IMAGE|>", audio_token="<|AUDIO|>", video_token="<|VIDEO|>",
             vision_bos_token="<|vision_bos|>", vision_eos_token="<|vision_eos|>", audio_bos_token="<|audio_bos|>",
             audio_eos_token="<|audio_eos|>")


def processor(folder: Any, *, chunk_length: int = 300, min_pixels: int = 4 * 28 * 28,
              max_pixels: int = 64 * 28 * 28) -> Any:
    """The real ``Qwen2_5OmniProcessor``: Whisper features of 128 mel bins over a ``chunk_length``-second window
    (the published 300; a test may shrink it), small images."""
    from transformers import Qwen2VLImageProcessor, WhisperFeatureExtractor

    from wdspack.models import assemble_processor

    tok = tokenizer(folder, SPECIAL)
    tok.pad_token = "<|endoftext|>"
    # named as Qwen2.5-Omni's tokenizer names them (``tokenizer.image_token_id``), and saved with it
    tok._set_model_specific_special_tokens(NAMED)
    images = Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels)
    features = WhisperFeatureExtractor(feature_size=128, chunk_length=chunk_length, return_attention_mask=True)
    return assemble_processor("Qwen2_5OmniProcessor", image_processor=images, tokenizer=tok, chat_template=TEMPLATE,
                              feature_extractor=features)


def model(processor: Any, *, seed: int = 0) -> Any:
    """A tiny random ``Qwen2_5OmniThinkerForConditionalGeneration``: a 2-layer audio encoder (windows of
    ``2·n_window`` frames), a 2-layer vision tower, a 2-layer Qwen2 text model, the processor's token ids."""
    import torch
    from transformers import Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration

    tok = processor.tokenizer
    ids = {name: tok.convert_tokens_to_ids(t) for name, t in (
        ("image_token_index", "<|IMAGE|>"), ("video_token_index", "<|VIDEO|>"), ("audio_token_index", "<|AUDIO|>"),
        ("vision_start_token_id", "<|vision_bos|>"), ("vision_end_token_id", "<|vision_eos|>"),
        ("audio_start_token_id", "<|audio_bos|>"), ("audio_end_token_id", "<|audio_eos|>"))}
    frames = int(processor.feature_extractor.nb_max_frames)
    audio = dict(num_mel_bins=int(processor.feature_extractor.feature_size), encoder_layers=2,
                 encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32, max_source_positions=max(frames // 2, 1500),
                 n_window=100, output_dim=32)
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=32, window_size=56, fullatt_block_indexes=[1])
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
                pad_token_id=tok.pad_token_id)
    config = Qwen2_5OmniThinkerConfig(audio_config=audio, vision_config=vision, text_config=text, **ids)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen2_5OmniThinkerForConditionalGeneration(config).eval()
