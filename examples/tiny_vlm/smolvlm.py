"""SmolVLM (and Idefics3): ``SmolVLMProcessor`` + ``SmolVLMImageProcessor`` (or ``Idefics3Processor`` +
``Idefics3ImageProcessor``), tiny ``SmolVLMForConditionalGeneration`` (or ``Idefics3ForConditionalGeneration``).

Small sizes: images' longest edge resized to 96 and cut into 32-pixel tiles (up to 3×3 + 1 global);
the vision tower sees a 32-pixel tile as 4×4 patches of 8, pixel-shuffled by 2 into 4 tokens, so
the processor's ``image_seq_len`` is 4. Without torchvision transformers falls back to the PIL
image processors (the same classes' ``*Pil`` backends).
"""

from __future__ import annotations

import math
from typing import Any

from . import tokenizer

#: SmolVLM-Instruct's published chat template (images and text).
SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
#: Idefics3-8B-Llama3's published chat template.
IDEFICS3_TEMPLATE = (
    "<|begin_of_text|>{% for message in messages %}{{message['role'].capitalize()}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
SPECIAL = (["<|im_start|>", "<|begin_of_text|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>",
            "<global-img>", "<|im_end|>"]
           + [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)])


def processor(folder: Any, *, longest_edge: int = 96, tile: int = 32, image_seq_len: int = 4,
              cls: str = "SmolVLMProcessor") -> Any:
    """The real processor class ``cls`` (``"SmolVLMProcessor"`` or ``"Idefics3Processor"``), image splitting on."""
    import transformers

    from wdspack.models import assemble_processor

    tok = tokenizer(folder, SPECIAL, image_token="<image>", fake_image_token="<fake_token_around_image>",
                    global_image_token="<global-img>", end_of_utterance_token="<end_of_utterance>")
    tok.pad_token = "<|im_end|>"
    family = cls.removesuffix("Processor")
    images = getattr(transformers, f"{family}ImageProcessorPil")(
        size={"longest_edge": longest_edge}, max_image_size={"longest_edge": tile}, do_image_splitting=True)
    template = SMOLVLM_TEMPLATE if family == "SmolVLM" else IDEFICS3_TEMPLATE
    return assemble_processor(cls, image_processor=images, tokenizer=tok, chat_template=template,
                              image_seq_len=image_seq_len)


def model(processor: Any, *, seed: int = 0, cls: str = "SmolVLMForConditionalGeneration", head_dim: int = 8) -> Any:
    """A tiny random-init ``cls`` whose vision tower matches ``processor``'s tile size and ``image_seq_len``;
    ``head_dim`` of the text model 16 or more for GPU attention kernels (FlexAttention needs >= 16)."""
    import torch
    import transformers

    tok = processor.tokenizer
    tile = int(processor.image_processor.max_image_size["longest_edge"])
    scale = 2
    patch = tile // (scale * math.isqrt(int(processor.image_seq_len)))  # (tile / patch)² / scale² = image_seq_len
    config_cls = getattr(transformers, cls.replace("ForConditionalGeneration", "Config"))
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=tile,
                  patch_size=patch)
    text = dict(model_type="llama", vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=4096,
                pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    config = config_cls(vision_config=vision, text_config=text, scale_factor=scale,
                        image_token_id=tok.convert_tokens_to_ids(processor.image_token))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return getattr(transformers, cls)(config).eval()
