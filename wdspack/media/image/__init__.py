"""The image kind: found in a record's ``images`` list and image parts, read as bytes, checked from the
header at pack time (:mod:`.check`), decoded and resized in the loader (:mod:`.pixels`)."""

from __future__ import annotations

from typing import Any

from ..kind import MediaKind

__all__ = ["IMAGE"]


def _load(ref: Any, root: str, *, absolute_ok: bool = False) -> bytes:
    from ..source import load_image

    return load_image(ref, root, absolute_ok=absolute_ok)


def _describe(ref: Any) -> str:
    from ..source import image_name

    return image_name(ref)


def _decode_errors() -> tuple[type[BaseException], ...]:
    from .pixels import ImageDecodeError

    return (ImageDecodeError,)



def _prepare() -> Any:
    from . import prepare

    return prepare


def _batch() -> Any:
    from . import batch

    return batch

#: Images: every v1 pack has their keys; ``max_images`` bounds them per pack.
IMAGE = MediaKind(
    name="image", plural="images", record_fields=("images", "image"),
    part_types=("image", "image_url", "input_image"), ref_keys=("image", "image_url", "path", "url", "value"),
    extensions=("jpg", "jpeg", "png", "webp"), settings_part="image_processor", load=_load, describe=_describe,
    always_stored=True, budget="max_images",
    drop_reasons=("missing_image", "image_path_escape", "unreadable_image", "image_too_large", "too_many_images"),
    load_drop_reasons=("unreadable_image", "image_too_large"), decode_errors=_decode_errors, placeholder="<image>",
    prepare=_prepare, batch=_batch)
