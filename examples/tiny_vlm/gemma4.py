"""Gemma 4: ``Gemma4Processor`` + ``Gemma4ImageProcessorPil`` + ``Gemma4AudioFeatureExtractor`` +
``Gemma4VideoProcessor`` (where torchvision imports: it needs it; left out elsewhere, and its settings then come from
the folder a processor with it saved), tiny ``Gemma4ForConditionalGeneration``.

The tiny model keeps what makes Gemma 4 its own: a vision tower over aspect-ratio-preserving patches (variable soft
tokens per image, 2 × 2 pooled), an audio conformer (two stride-2 convolutions, chunked local attention), per-layer
input embeddings, and a text stack mixing sliding (window 8) and full layers whose sliding layers let each image's
soft tokens see each other (``use_bidirectional_attention="vision"``).
"""

from __future__ import annotations

from typing import Any

from . import tokenizer

#: Gemma 4's turn format (the published template without its system, tool and thinking parts): ``<|turn>role``,
#: the assistant as ``model``, media as the processor's placeholders, ``<turn|>`` after each turn.
TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<|turn>' + role + '\n' }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] | trim }}"
    "{%- else -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<|image|>' }}"
    "{%- elif item['type'] == 'audio' -%}{{ '<|audio|>' }}"
    "{%- elif item['type'] == 'video' -%}{{ '<|video|>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<turn|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|turn>model\n' }}{%- endif -%}"
)
SPECIAL = ["<bos>", "<eos>", "<pad>", "<|turn>", "<turn|>", "<|image>", "<image|>", "<|image|>", "<|audio>",
           "<audio|>", "<|audio|>", "<|video|>"]
#: The named multimodal tokens Gemma 4's tokenizer declares (its ``model_specific_special_tokens``).
NAMED = {"boi_token": "<|image>", "eoi_token": "<image|>", "image_token": "<|image|>", "boa_token": "<|audio>",
         "eoa_token": "<audio|>", "audio_token": "<|audio|>"}
#: Patches of 4 pixels, pooled 2 × 2: at most 70 soft tokens an image (the smallest budget the class takes).
PATCH_SIZE, POOLING, MAX_SOFT_TOKENS = 4, 2, 70
#: The video processor: the tower's patches and pooling (it takes one of each), 70 soft tokens a frame, 2 frames a
#: video (the published 32 would need 32 frames of every clip and ~2,000 tokens a video).
VIDEO = {"patch_size": PATCH_SIZE, "pooling_kernel_size": POOLING, "max_soft_tokens": MAX_SOFT_TOKENS, "num_frames": 2}


def processor(folder: Any) -> Any:
    """The real ``Gemma4Processor``: images to at most 70 soft tokens, 128-bin audio features (published), video
    frames as :data:`VIDEO` says where torchvision imports (``save_pretrained`` then writes its settings)."""
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
    from transformers.utils import is_torchvision_available

    from wdspack.models import assemble_processor

    tok = tokenizer(folder, SPECIAL)
    tok._set_model_specific_special_tokens(NAMED)  # saved and reloaded with the tokenizer, as Gemma's own config
    tok.bos_token, tok.eos_token, tok.pad_token = "<bos>", "<eos>", "<pad>"
    images = Gemma4ImageProcessorPil(patch_size=PATCH_SIZE, pooling_kernel_size=POOLING,
                                     max_soft_tokens=MAX_SOFT_TOKENS)
    videos = None
    if is_torchvision_available():
        from transformers import Gemma4VideoProcessor

        videos = Gemma4VideoProcessor(**VIDEO)
    return assemble_processor("Gemma4Processor", image_processor=images, tokenizer=tok, chat_template=TEMPLATE,
                              feature_extractor=Gemma4AudioFeatureExtractor(), video_processor=videos,
                              image_seq_length=MAX_SOFT_TOKENS)


def model(processor: Any, *, seed: int = 0, sliding_window: int = 8, head_dim: int = 8) -> Any:
    """Tiny Gemma 4 (float32, random): 3 text layers (sliding, full, sliding → full: the last is always full),
    a 2-layer vision tower, a 2-layer audio conformer."""
    import torch
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    tok = processor.tokenizer
    ip = processor.image_processor
    ids = {name: tok.convert_tokens_to_ids(token) for name, token in NAMED.items()}
    text = dict(vocab_size=len(tok), vocab_size_per_layer_input=len(tok), hidden_size_per_layer_input=4,
                hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=head_dim, global_head_dim=head_dim, sliding_window=sliding_window,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                use_bidirectional_attention="vision", max_position_embeddings=4096,
                pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16, patch_size=int(ip.patch_size),
                  pooling_kernel_size=int(ip.pooling_kernel_size), position_embedding_size=256)
    bins = int(processor.feature_extractor.feature_size)
    audio = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, subsampling_conv_channels=[bins, 4],
                 output_proj_dims=32)
    config = Gemma4Config(text_config=text, vision_config=vision, audio_config=audio,
                          boi_token_id=ids["boi_token"], eoi_token_id=ids["eoi_token"],
                          image_token_id=ids["image_token"], video_token_id=tok.convert_tokens_to_ids("<|video|>"),
                          boa_token_id=ids["boa_token"], eoa_token_index=ids["eoa_token"],
                          audio_token_id=ids["audio_token"])
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Gemma4ForConditionalGeneration(config).eval()
