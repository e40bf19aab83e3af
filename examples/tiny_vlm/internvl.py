"""InternVL (InternVL3 / 3.5, ``-hf``): ``InternVLProcessor`` + ``GotOcr2ImageProcessor``, tiny
``InternVLForConditionalGeneration``.

The tiny model keeps what makes InternVL's layout its own: each image is cut into square tiles by the
closest aspect ratio within ``min_patches`` to ``max_patches`` (here 1 to 4 tiles of 16 px, the published
ones 1 to 12 of 448 px), plus a thumbnail where there is more than one; every tile becomes
``image_seq_length`` ``<IMG_CONTEXT>`` features (a ViT of 4 px patches, 4 × 4 features pixel-shuffled by
0.5 to 2 × 2: 4 per tile, the published 256), between ``<img>`` and ``</img>``. A video's frames are tiles
of their own, each with its prompt text ``FrameN: <img>…</img>``. Without torchvision transformers builds
the image processor's PIL backend (``GotOcr2ImageProcessorPil``); it is the same processor.
"""

from __future__ import annotations

from typing import Any

from . import tokenizer

#: OpenGVLab/InternVL3-*-hf's published chat template (an image renders ``<IMG_CONTEXT>\n``, a video ``<video>\n``).
TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}"
    "{% elif content['type'] == 'video' %}{{ '<video>\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{'<|im_end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL = ["<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>", "<|endoftext|>"]
#: The named tokens InternVL's tokenizer declares (its ``extra_special_tokens``), which the processor reads.
NAMED = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
         "video_token": "<video>"}
TILE = 16
PATCH = 4
#: features per tile: (TILE / PATCH)² patches pixel-shuffled by 0.5 (the model's downsample_ratio)
TOKENS_PER_TILE = (TILE // PATCH) ** 2 // 4


def processor(folder: Any, *, max_patches: int = 4, min_patches: int = 1, tile: int = TILE) -> Any:
    """The real processor, ``tile``-px tiles, ``min_patches`` to ``max_patches`` tiles an image (the
    image processor's settings, as its ``preprocessor_config.json`` holds them)."""
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    from wdspack.models import assemble_processor

    tok = tokenizer(folder, SPECIAL)
    tok._set_model_specific_special_tokens(NAMED)  # saved and reloaded with the tokenizer, as InternVL's are
    tok.pad_token = "<|endoftext|>"
    images = GotOcr2ImageProcessorPil(size={"height": tile, "width": tile}, max_patches=max_patches,
                                      min_patches=min_patches, crop_to_patches=False)  # the processor passes True
    return assemble_processor("InternVLProcessor", image_processor=images, tokenizer=tok, chat_template=TEMPLATE,
                              image_seq_length=(tile // PATCH) ** 2 // 4)


def model(processor: Any, *, seed: int = 0, head_dim: int | None = None) -> Any:
    """A tiny random-init ``InternVLForConditionalGeneration`` for ``processor`` (text ``head_dim`` 8 unless given:
    16 or more for GPU attention kernels)."""
    import torch
    from transformers import InternVLConfig, InternVLForConditionalGeneration

    tok = processor.tokenizer
    side = int(processor.image_processor.size["height"])
    text = dict(model_type="qwen2", vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                pad_token_id=tok.pad_token_id, bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
                eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                **({} if head_dim is None else {"head_dim": head_dim}))
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=[side, side], patch_size=[PATCH, PATCH])
    config = InternVLConfig(vision_config=vision, text_config=text, image_token_id=processor.image_token_id,
                            image_seq_length=int(processor.image_seq_length), downsample_ratio=0.5,
                            vision_feature_layer=-1, vision_feature_select_strategy="default",
                            tie_word_embeddings=False)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return InternVLForConditionalGeneration(config).eval()
