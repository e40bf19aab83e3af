"""The image kind: found in a record's ``images`` list and image parts, read as bytes, checked from the
header at pack time (:mod:`.check`), decoded and resized in the loader (:mod:`.pixels`)."""

from __future__ import annotations

from ..kind import MediaKind, calling, imported

__all__ = ["IMAGE"]

#: Images: every v1 pack has their keys; ``max_images`` bounds them per pack.
IMAGE = MediaKind(
    name="image", plural="images", record_fields=("images", "image"),
    part_types=("image", "image_url", "input_image"), ref_keys=("image", "image_url", "path", "url", "value"),
    extensions=("jpg", "jpeg", "png", "webp"), settings_part="image_processor",
    load=calling("wdspack.media.source", "load_image"), describe=calling("wdspack.media.source", "image_name"),
    always_stored=True, budget="max_images",
    drop_reasons={
        "missing_image": "an image file named by the record does not exist",
        "image_path_escape": "an image path points outside the image root",
        "unreadable_image": "the image bytes are corrupt, truncated or not an image",
        "image_too_large": "the image has more pixels than the decompression-bomb limit",
        "too_many_images": "the sample has more images than max_images"},
    load_drop_reasons=("unreadable_image", "image_too_large"),
    decode_errors=lambda: (imported(f"{__name__}.pixels", "ImageDecodeError")(),), placeholder="<image>",
    prepare=imported(f"{__name__}.prepare"), batch=imported(f"{__name__}.batch"))
