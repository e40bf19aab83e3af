"""What a pack job loads to build samples, and the one-line answers when it cannot.

    --tokenizer ─► load_tokenizer (located first: a folder, the cache, or one line at once)
    --tokens-per-image processor:NAME ─► load_count_processor ─► processor_tokens (per image size)
    the image token: --image-token, else default_image_token (declared, else a known guess)

Holds: every refusal is one ConfigError line naming the value and the fix; :mod:`.precheck` reads
the same facts from the files before anything loads and answers with the same messages.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import ConfigError

__all__ = ["NO_IMAGE_TOKEN", "check_template_syntax", "default_image_token", "images_need_tokens_per_image",
           "load_count_processor", "load_tokenizer", "not_one_token", "processor_tokens"]

#: The answer when neither --image-token nor the tokenizer names the image token.
NO_IMAGE_TOKEN = ("the tokenizer declares no image token; pass the model's image token with --image-token "
                  "(e.g. '<image>', '[IMG]', '<|image_pad|>')")


def not_one_token(token: str, name: str) -> ConfigError:
    """The answer for an image token that is not one token of ``name``'s vocabulary."""
    return ConfigError(f"image token {token!r} is not a single token in the vocabulary of {name!r}; pass the "
                       "model's image token with --image-token")


def images_need_tokens_per_image(sid: str) -> ConfigError:
    """The error for an image in a job given ``--tokenizer`` without ``--tokens-per-image`` (a silent
    default would train the model on the wrong number of image tokens)."""
    return ConfigError(f"sample {sid!r} has an image, but --tokens-per-image was not given (text-only data needs "
                       "none): pass --tokens-per-image N, the tokens one image takes in your model (64 for nanoVLM, "
                       "576 for LLaVA-1.5), or processor:NAME_OR_PATH for a dynamic-resolution count, or use "
                       "--processor NAME_OR_PATH for the model's own layout")


def check_template_syntax(template: str, where: str) -> None:
    """Refuse a chat template with a Jinja syntax error now, naming ``where`` and the line: at pack time
    every record would be dropped with it, after tokenizing the whole input."""
    import jinja2
    import jinja2.ext

    try:  # the extensions transformers renders with; its own {% generation %} tag is not Jinja's
        jinja2.Environment(extensions=[jinja2.ext.loopcontrols]).parse(template)
    except jinja2.TemplateSyntaxError as e:
        if "generation" not in (e.message or ""):
            raise ConfigError(f"{where}, line {e.lineno}: {e.message}; fix the template's Jinja syntax") from None


def load_tokenizer(name: str | os.PathLike[str] | Any | None):
    from transformers import AutoTokenizer

    if name is not None and not isinstance(name, (str, os.PathLike)):
        return name  # a tokenizer object
    if not name:
        raise ConfigError("give a tokenizer (--tokenizer) or a processor (--processor)")
    from ..models.locate import locate_model

    locate_model(name, flag="--tokenizer")  # a folder, the cache or a reachable Hub; else one line, at once
    try:
        return AutoTokenizer.from_pretrained(name)
    except Exception as e:  # transformers raises OSError/ValueError/... for a bad name
        raise ConfigError(f"cannot load tokenizer {name!r}: {e}. Give a local folder or a model "
                          "name that is in the Hugging Face cache (runs are offline)") from None


def load_count_processor(tokens_per_image: int | str | Any):
    """The image processor that counts image tokens (None for a fixed count); checked by SampleConfig."""
    if tokens_per_image is None or isinstance(tokens_per_image, int):
        return None
    if not isinstance(tokens_per_image, str):
        return tokens_per_image  # a processor object
    from ..models import image_processor_for

    return image_processor_for(tokens_per_image.split(":", 1)[1])


def processor_tokens(processor, height: int, width: int) -> int:
    merge = getattr(processor, "merge_size", 1) or 1
    patches = processor.get_number_of_image_patches(height, width, {})
    return int(patches) // (merge * merge)


def default_image_token(tokenizer, processor, *, required: bool = True) -> str | None:
    for owner in (processor, tokenizer):
        tok = getattr(owner, "image_token", None)
        if isinstance(tok, str):
            return tok
    from ..models import IMAGE_TOKEN_GUESSES

    vocab = tokenizer.get_vocab()
    for guess in IMAGE_TOKEN_GUESSES:
        if guess in vocab:
            return guess
    if not required:
        return None
    raise ConfigError(NO_IMAGE_TOKEN)
