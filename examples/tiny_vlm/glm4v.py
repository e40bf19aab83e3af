"""GLM-4.1V, GLM-4.5V and GLM-4.6V: ``Glm4vProcessor`` / ``Glm46VProcessor`` + their Pillow image processors
(patch 14, merge 2, temporal patch 2, as published), tiny ``Glm4vForConditionalGeneration``,
``Glm4vMoeForConditionalGeneration`` (GLM-4.5V) / ``Glm46VForConditionalGeneration``.

GLM-4.1V and GLM-4.6V differ in the processor's frame text (GLM-4.1V writes ``3``, GLM-4.6V ``3.0 seconds`` after
each frame), its video processor's sampling and the model's config class; the tokens, image processor and towers are
the same. GLM-4.5V is GLM-4.1V's processor in front of a mixture-of-experts text model.
"""

from __future__ import annotations

from typing import Any

from . import tokenizer

#: GLM-4.1V's published chat template without its thinking parts (GLM-4.6V's renders these turns the same):
#: ``[gMASK]<sop>``, then ``<|user|>``/``<|assistant|>`` turns; an image is
#: ``<|begin_of_image|><|image|><|end_of_image|>``, a video ``<|begin_of_video|><|video|><|end_of_video|>``.
TEMPLATE = (
    "[gMASK]<sop>"
    "{%- for msg in messages %}"
    "{%- if msg.role == 'system' %}<|system|>{{ '\\n' }}"
    "{%- if msg.content is string %}{{ msg.content }}{%- else %}{%- for item in msg.content %}"
    "{%- if item.type == 'text' %}{{ item.text }}{%- endif %}{%- endfor %}{%- endif %}"
    "{%- elif msg.role == 'user' %}<|user|>{{ '\\n' }}"
    "{%- if msg.content is string %}{{ msg.content }}"
    "{%- else %}{%- for item in msg.content %}"
    "{%- if item.type == 'video' or 'video' in item %}<|begin_of_video|><|video|><|end_of_video|>"
    "{%- elif item.type == 'image' or 'image' in item %}<|begin_of_image|><|image|><|end_of_image|>"
    "{%- elif item.type == 'text' %}{{ item.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{%- elif msg.role == 'assistant' %}<|assistant|>{{ '\\n' }}"
    "{%- if msg.content is string %}{{ msg.content }}{%- else %}{%- for item in msg.content %}"
    "{%- if item.type == 'text' %}{{ item.text }}{%- endif %}{%- endfor %}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|begin_of_image|>", "<|end_of_image|>",
           "<|image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|video|>", "<|endoftext|>"]
#: processor class -> (image processor class, model class)
CLASSES = {"Glm4vProcessor": ("Glm4vImageProcessorPil", "Glm4vForConditionalGeneration"),
           "Glm46VProcessor": ("Glm46VImageProcessorPil", "Glm46VForConditionalGeneration")}
#: GLM-4.5V's: GLM-4.1V's processor, a mixture-of-experts text model
MOE = "Glm4vMoeForConditionalGeneration"
#: the tiny MoE text model: layer 0 dense, layer 1 four routed experts (two a token, by the sigmoid router as
#: published) beside one shared expert
MOE_TEXT = dict(moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=1,
                topk_group=1, first_k_dense_replace=1, norm_topk_prob=True, attention_bias=True)


def processor(folder: Any, *, min_pixels: int = 4 * 28 * 28, max_pixels: int = 2 * 64 * 28 * 28,
              cls: str = "Glm4vProcessor") -> Any:
    """The real ``cls`` (``Glm4vProcessor`` or ``Glm46VProcessor``); images of ``min_pixels``..``max_pixels``
    (GLM's bounds count the image twice, as two frames of a temporal patch: a handful of tokens each)."""
    import transformers

    from wdspack.models import assemble_processor

    tok = tokenizer(folder, SPECIAL)
    tok.pad_token = "<|endoftext|>"
    images = getattr(transformers, CLASSES[cls][0])(size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
                                                     image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return assemble_processor(cls, image_processor=images, tokenizer=tok, chat_template=TEMPLATE)


def model(processor: Any, *, seed: int = 0, cls: str | None = None) -> Any:
    """A tiny random GLM-4.1V, GLM-4.5V (``cls`` :data:`MOE`) or GLM-4.6V (``cls``; default: the one ``processor``
    belongs to): 2 vision blocks, 2 text layers (GLM-4.5V's second a mixture of experts, :data:`MOE_TEXT`), head_dim
    16 with half of it rotated (as published) over a ``[2, 1, 1]`` T/H/W section."""
    import torch
    import transformers

    cls = cls or CLASSES[type(processor).__name__][1]
    tok = processor.tokenizer
    ids = {name: tok.convert_tokens_to_ids(t) for name, t in (
        ("image_token_id", "<|image|>"), ("video_token_id", "<|video|>"),
        ("image_start_token_id", "<|begin_of_image|>"), ("image_end_token_id", "<|end_of_image|>"),
        ("video_start_token_id", "<|begin_of_video|>"), ("video_end_token_id", "<|end_of_video|>"))}
    kind = "glm4v_moe" if cls == MOE else "glm4v"
    text = dict(model_type=f"{kind}_text", vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                 "mrope_section": [2, 1, 1]},
                pad_token_id=tok.pad_token_id, **(MOE_TEXT if cls == MOE else {}))
    ip = processor.image_processor
    vision = dict(model_type=f"{kind}_vision", depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                  image_size=56, patch_size=int(ip.patch_size), spatial_merge_size=int(ip.merge_size),
                  temporal_patch_size=int(ip.temporal_patch_size), out_hidden_size=32)
    config = getattr(transformers, cls.replace("ForConditionalGeneration", "Config"))(
        text_config=text, vision_config=vision, **ids)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return getattr(transformers, cls)(config).eval()
