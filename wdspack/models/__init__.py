"""Model families: real transformers VLM classes fed exactly, from their own processors.

Each family is one small module in :mod:`wdspack.models.families` declaring a
:class:`~wdspack.models.family.Family` (see there for what a family states). This package finds
the family of a processor or a model and turns a batch into the model's keyword arguments;
nothing else in wdspack names a family.

====================  ===========================  ===========================================
family                processor class              model class
====================  ===========================  ===========================================
``qwen2_vl``          ``Qwen2VLProcessor``         ``Qwen2VLForConditionalGeneration``
``qwen2_5_vl``        ``Qwen2_5_VLProcessor``      ``Qwen2_5_VLForConditionalGeneration``
``qwen3_vl``          ``Qwen3VLProcessor``         ``Qwen3VLForConditionalGeneration`` (+ MoE)
``smolvlm``           ``SmolVLMProcessor``         ``SmolVLMForConditionalGeneration``
``idefics3``          ``Idefics3Processor``        ``Idefics3ForConditionalGeneration``
``gemma3``            ``Gemma3Processor``          ``Gemma3ForConditionalGeneration``
``llava``             ``LlavaProcessor``           ``LlavaForConditionalGeneration``
``llava_onevision``   ``LlavaOnevisionProcessor``  ``LlavaOnevisionForConditionalGeneration``
``mistral3``          ``PixtralProcessor``         ``Mistral3ForConditionalGeneration``
``internvl``          ``InternVLProcessor``        ``InternVLForConditionalGeneration``
====================  ===========================  ===========================================

(the Families table of docs/guides/models.md lists every family with its flags and keys).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import torch

from ..errors import ConfigError
from .family import Budgets, Family
from .processors import assemble_processor, load_processor, save_processor
from .target_logits import LOGITS, target_logits_kwargs
from .varlen import is_varlen, varlen_kwargs

__all__ = ["IMAGE_TOKEN_GUESSES", "Budgets", "Family", "assemble_processor", "family_for",
           "image_processor_for", "known_families", "load_processor", "model_inputs", "save_processor"]

@lru_cache(maxsize=1)
def known_families() -> tuple[Family, ...]:
    """Every known family: the ``FAMILIES`` of each module in ``families/`` (adding a family is adding a module)."""
    from . import families as folder

    names = sorted(m.name for m in pkgutil.iter_modules(folder.__path__))
    return tuple(f for name in names for f in importlib.import_module(f".{name}", folder.__name__).FAMILIES)


def family_for(obj: Any) -> Family:
    """The family of a processor, a model (by ``config.model_type``), or a family name.

    Raises:
        ConfigError: nothing matches; the message lists what is supported.
    """
    if isinstance(obj, Family):
        return obj
    if isinstance(obj, str):
        for f in known_families():
            if obj == f.name:
                return f
        what = f"family {obj!r}"
    elif hasattr(obj, "config") and hasattr(obj.config, "model_type"):
        for f in known_families():
            if obj.config.model_type in f.model_types:
                return f
        what = f"model type {obj.config.model_type!r} ({type(obj).__name__})"
    else:
        name = type(obj).__name__
        for f in known_families():
            if name in f.processors:
                return f
        what = f"processor class {name!r}"
    known = ", ".join(f"{f.name} ({'/'.join(f.processors)})" for f in known_families())
    raise ConfigError(f"wdspack has no model family for {what}; supported: {known}. For other models pack with "
                      "--tokens-per-image and feed the batch contract's keys yourself")


#: Image tokens of the families here (and Llama 3.2's ``<|image|>``), in the order fixed mode
#: (``--tokens-per-image N`` without ``--image-token``) looks for them in a tokenizer's vocabulary.
IMAGE_TOKEN_GUESSES = ("<image>", "[IMG]", "<|image_pad|>", "<|image|>", "<image_soft_token>",
                       "<fake_token_around_image>")


def image_processor_for(name: str) -> Any:
    """Fixed mode's ``--tokens-per-image processor:NAME``: a family alias (``qwen2vl``) builds that
    family's image processor from code; anything else loads with ``AutoImageProcessor``.

    Raises:
        ConfigError: ``name`` is neither an alias nor a loadable image processor.
    """
    for f in known_families():
        if f.image_processor is not None and name.lower() in f.aliases:
            return f.image_processor()
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(name)
    except Exception as e:
        raise ConfigError(f"cannot load image processor {name!r}: {e}") from None


def model_inputs(batch: Mapping[str, Any], model: Any, *, logits: str = "all") -> dict[str, Any]:
    """The keyword arguments for ``model(**kwargs)`` from a loader batch (labels included).

    The batch must come from ``make_loader(..., processor=...)`` for the model's family. Tensors
    are moved to the model's device. Under :func:`wdspack.use_varlen_attention` the batch's
    ``cu_seqlens``/``max_seqlen`` go along (and no mask). A Qwen-VL vision tower gets its grid bookkeeping
    worked out here, from the batch's CPU ``image_grid_thw`` (:mod:`wdspack.models.vision_meta`), instead of
    reading it back from the GPU image by image. ``use_cache`` is off: with a cache the models do not look
    for the packed sub-samples in the positions.

    ``logits="targets"`` has the model compute its LM head and loss only at the positions whose next
    token is trained (:mod:`wdspack.models.target_logits`; one-row batches: ``padding_free=True`` or
    ``batch_size=1``): the same loss and gradients, and ``outputs.logits`` holds those positions only.

    Example:
        >>> loader = wdspack.make_loader("packed/", batch_size=4, processor="./qwen2.5-vl")  # doctest: +SKIP
        >>> for batch in loader:  # doctest: +SKIP
        ...     loss = model(**wdspack.model_inputs(batch, model)).loss
    """
    pixels = batch.get("pixel_values")
    if isinstance(pixels, torch.Tensor) and pixels.dtype == torch.uint8:
        raise ConfigError("the batch's pixel_values are uint8 (make_loader(..., pixel_dtype='uint8')), not yet "
                          "normalised; first: batch = wdspack.normalize_pixels(batch, loader, device=...)")
    if logits not in LOGITS:
        raise ConfigError(f"logits={logits!r}: use one of {', '.join(map(repr, LOGITS))}")
    family = family_for(model)
    kwargs = family.model_kwargs(batch, model)
    kwargs["labels"] = batch["labels"]
    if logits == "targets":
        kwargs.update(target_logits_kwargs(batch, model))
    if is_varlen(model):  # segments from cu_seqlens, no mask (wdspack.use_varlen_attention)
        kwargs.pop("attention_mask", None)
        kwargs.update(varlen_kwargs(batch))
    elif "attention_mask" in batch and "attention_mask" not in kwargs:
        kwargs["attention_mask"] = batch["attention_mask"]
    kwargs["use_cache"] = False
    device = _device(model)
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def _device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        return torch.device("cpu")
