"""Mistral 3 (Mistral Small 3.1 / 3.2): ``PixtralProcessor`` + ``PixtralImageProcessor``, tiny
``Mistral3ForConditionalGeneration``.

The tekken tokenizer is the Pixtral tokenizer: ``[IMG]``, ``[IMG_BREAK]`` and ``[IMG_END]`` are
already its special tokens (ids 10, 12, 13), so nothing is added. The chat template is
``examples/chat_templates/pixtral.jinja`` (Mistral's ``[INST] … [/INST]`` turns, one ``[IMG]`` per
typed image part). The image processor's own ``patch_size`` is the vision tower's (8 here) on
purpose: the processor lays images out on ``patch_size · spatial_merge_size`` (16-pixel) cells and
passes that cell to the image processor itself, so a family that called the image processor with
its own settings would get other sizes (the tests would see it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import tokenizer

TEMPLATE = Path(__file__).resolve().parents[1] / "chat_templates" / "pixtral.jinja"


def processor(folder: Any, *, longest_edge: int = 64, patch_size: int = 8, spatial_merge_size: int = 2) -> Any:
    """The real processor; the defaults are tiny (Mistral Small 3.1: ``longest_edge=1540, patch_size=14``)."""
    from transformers import PixtralImageProcessor

    from wdspack.models import assemble_processor

    tok = tokenizer(folder, [], bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    images = PixtralImageProcessor(size={"longest_edge": longest_edge}, patch_size=patch_size)
    return assemble_processor("PixtralProcessor", image_processor=images, tokenizer=tok,
                              chat_template=TEMPLATE.read_text(encoding="utf-8"), patch_size=patch_size,
                              spatial_merge_size=spatial_merge_size)


def model(processor: Any, *, seed: int = 0, head_dim: int = 8, sliding_window: int | None = None) -> Any:
    """Tiny Mistral 3; ``head_dim`` 16 or more for GPU attention kernels (FlexAttention needs ≥ 16),
    ``sliding_window`` for a text stack with windowed attention."""
    import torch
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    tok = processor.tokenizer
    longest = int(processor.image_processor.size.longest_edge)
    text = dict(model_type="mistral", vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=4096,
                sliding_window=sliding_window, rope_theta=10000.0, pad_token_id=tok.pad_token_id)
    vision = dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, head_dim=16, patch_size=int(processor.patch_size), image_size=longest)
    config = Mistral3Config(text_config=text, vision_config=vision, image_token_index=processor.image_token_id,
                            spatial_merge_size=int(processor.spatial_merge_size))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Mistral3ForConditionalGeneration(config).eval()
