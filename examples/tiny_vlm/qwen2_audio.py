"""Qwen2-Audio: ``Qwen2AudioProcessor`` + ``WhisperFeatureExtractor`` (128 mel bins, a 30 s window padded to
3,000 frames, as the published ``preprocessor_config.json``), tiny ``Qwen2AudioForConditionalGeneration``
(a 2-layer Whisper-style audio encoder over the whole window, a Qwen2 text model)."""

from __future__ import annotations

from typing import Any

from . import tokenizer

#: Qwen2-Audio-7B-Instruct's published chat template: a default system turn, each audio as
#: ``Audio N: <|audio_bos|><|AUDIO|><|audio_eos|>`` and a newline.
TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if 'audio' in content or 'audio_url' in content or content['type'] == 'audio' %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "Audio {{ audio_count.value }}: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>", "<|endoftext|>"]


def processor(folder: Any, *, chunk_length: int = 30) -> Any:
    """The real ``Qwen2AudioProcessor``: Whisper features of 128 mel bins over a ``chunk_length``-second window
    (the published 30; a test may shrink it, and the model's window with it)."""
    from transformers import Qwen2AudioProcessor, WhisperFeatureExtractor

    tok = tokenizer(folder, SPECIAL, audio_token="<|AUDIO|>", audio_bos_token="<|audio_bos|>",
                    audio_eos_token="<|audio_eos|>")
    tok.pad_token = "<|endoftext|>"
    features = WhisperFeatureExtractor(feature_size=128, chunk_length=chunk_length, return_attention_mask=True)
    return Qwen2AudioProcessor(feature_extractor=features, tokenizer=tok, chat_template=TEMPLATE)


def model(processor: Any, *, seed: int = 0) -> Any:
    """A tiny random ``Qwen2AudioForConditionalGeneration``: a 2-layer audio encoder whose window matches the
    feature extractor's (``max_source_positions`` = frames / 2), a 2-layer Qwen2 text model."""
    import torch
    from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration

    tok = processor.tokenizer
    frames = int(processor.feature_extractor.nb_max_frames)
    audio = dict(model_type="qwen2_audio_encoder", d_model=32, encoder_layers=2, encoder_attention_heads=2,
                 encoder_ffn_dim=64, num_mel_bins=int(processor.feature_extractor.feature_size),
                 max_source_positions=frames // 2)
    text = dict(model_type="qwen2", vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                pad_token_id=tok.pad_token_id)
    config = Qwen2AudioConfig(audio_config=audio, text_config=text,
                              audio_token_index=tok.convert_tokens_to_ids("<|AUDIO|>"))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen2AudioForConditionalGeneration(config).eval()
