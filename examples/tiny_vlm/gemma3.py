"""Gemma 3: ``Gemma3Processor`` + ``Gemma3ImageProcessor``, tiny ``Gemma3ForConditionalGeneration``.

The tiny model keeps what makes Gemma 3's attention its own: a SigLIP tower whose patches are
average-pooled to ``mm_tokens_per_image`` soft tokens, and a text stack that mixes sliding-window
and full-attention layers, with a window (8) shorter than one image's 16 soft tokens and than every
sub-sample, so the sliding layers see a different mask than the full ones.
"""

from __future__ import annotations

from typing import Any

from . import tokenizer

#: Gemma 3's published chat template (system prompt folded into the first user turn; images as
#: ``<start_of_image>``, which the processor expands).
TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}"
    "{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = \"\" -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}"
    "{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}"
    "{%- set role = \"model\" -%}"
    "{%- else -%}"
    "{%- set role = message['role'] -%}"
    "{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}"
    "{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}"
    "{{ item['text'] | trim }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- else -%}"
    "{{ raise_exception(\"Invalid content type\") }}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{'<start_of_turn>model\n'}}"
    "{%- endif -%}"
)
SPECIAL = ["<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
           "<image_soft_token>"]
#: The named multimodal tokens Gemma's tokenizer declares (its ``extra_special_tokens``); the
#: processor reads ``boi_token``/``eoi_token``/``image_token`` and their ids from the tokenizer.
NAMED = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
#: Soft tokens per image: the SigLIP tower's (32 / 4)² = 64 patches, average-pooled 2 × 2.
TOKENS_PER_IMAGE = 16
IMAGE_SIZE = 32


def processor(folder: Any, *, image_size: int = IMAGE_SIZE, tokens_per_image: int = TOKENS_PER_IMAGE) -> Any:
    from transformers import Gemma3ImageProcessor

    from wdspack.models import assemble_processor

    tok = tokenizer(folder, SPECIAL)
    # Named like Gemma's own tokenizer config does (saved and reloaded with the tokenizer).
    tok._set_model_specific_special_tokens(NAMED)
    tok.bos_token, tok.eos_token, tok.pad_token = "<bos>", "<eos>", "<pad>"
    images = Gemma3ImageProcessor(size={"height": image_size, "width": image_size})
    return assemble_processor("Gemma3Processor", image_processor=images, tokenizer=tok, chat_template=TEMPLATE,
                              image_seq_length=tokens_per_image)


def model(processor: Any, *, seed: int = 0, sliding_window: int = 8, head_dim: int = 8) -> Any:
    """Tiny Gemma 3; ``head_dim`` 16 or more for GPU attention kernels (FlexAttention needs ≥ 16)."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    tok = processor.tokenizer
    image_size = int(processor.image_processor.size["height"])
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, query_pre_attn_scalar=8,
                sliding_window=sliding_window, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                max_position_embeddings=4096, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                eos_token_id=tok.eos_token_id)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=image_size, patch_size=image_size // 8)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=int(processor.image_seq_length),
                          boi_token_index=tok.boi_token_id, eoi_token_index=tok.eoi_token_id,
                          image_token_index=tok.image_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        m = Gemma3ForConditionalGeneration(config)
        # Gemma initialises the vision → text projection to zeros (a trained checkpoint fills it);
        # random, so the images reach the text and their gradients the vision tower.
        torch.nn.init.normal_(m.model.multi_modal_projector.mm_input_projection_weight, std=0.5)
    return m.eval()
