"""The image kind at pack time: the image processor's settings recorded, and a chat's images expanded by the
family's image side from their header sizes. Each image is checked from its header (``probe``: the same check
serves a tokenizer with a fixed count per image, where there is no family, and captions and documents).

``builder`` is the pack job's sample builder (``wdspack.packer.samples.SampleBuilder``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import ConfigError, SampleError
from ..kind import Prepared
from ..settings import read_settings
from . import IMAGE
from .check import check_image, downscale, error_text

__all__ = ["over_budget", "part", "policy", "probe", "setup"]


def setup(builder: Any) -> None:
    """What the manifest records of the image processor's settings: its size, and where they were read."""
    if builder.family is None or builder.family.image is None:
        return
    found = read_settings(builder.config.processor, IMAGE.settings_part, builder.processor)
    size = (found.values or {}).get("size")
    builder.settings_used["image"] = {**({"size": dict(size)} if isinstance(size, dict) else {}),
                                      "settings_from": found.source}


def policy(builder: Any) -> dict[str, Any] | None:
    """What the manifest's ``image_policy`` keeps of the images' settings (processor mode)."""
    return builder.settings_used.get("image")


def over_budget(builder: Any, sample: Any, *, seq_len: int) -> str | None:
    """None: a sample over ``seq_len`` for its images is dropped with the job's own message (``too_long``)."""
    return None


def probe(builder: Any, images: tuple[bytes, ...], sid: str,
          names: tuple[str, ...] = ()) -> tuple[tuple[bytes, ...], tuple[Any, ...]]:
    """The images checked from their headers (downscaled to ``max_image_side`` where over it), and per image
    its token count (a fixed count, no family) or ``(height, width)`` (for the family to expand)."""
    if images and builder.family is not None and builder.family.image is None:
        have = ", ".join(builder.families_taking(IMAGE.name))
        raise SampleError("unsupported_media", f"the record has {len(images)} image(s) but the {builder.family.name} "
                          f"family has no image path; families with one: {have}", sid)
    out, counts = [], []
    for k, data in enumerate(images):
        which = f"image {k} ({names[k]!r})" if k < len(names) and names[k] else f"image {k}"  # the file, to find it
        (w, h), fmt = check_image(data, which, sid=sid, max_pixels=builder.config.max_image_pixels)
        side = builder.config.max_image_side
        if side and max(w, h) > side:
            data, (w, h) = downscale(data, side, fmt)
        out.append(data)
        counts.append(builder.fixed_tokens(w, h, sid))
    return tuple(out), tuple(counts)


def part(builder: Any, sid: str, images: Sequence[bytes], sizes: Sequence[Any]) -> Prepared:
    """A chat's images as the family expands them: from their ``(height, width)`` (header sizes, no pixels)."""

    def texts() -> list[str]:
        try:
            return builder.family.image.replacements(builder.processor, list(sizes))
        except ConfigError:
            raise  # the processor's settings, not this sample: every sample would fail the same way
        except Exception as e:  # the processor's own code refusing a size
            raise SampleError("unreadable_image", f"the processor cannot lay out images of sizes {list(sizes)}: "
                              f"{error_text(e)}", sid) from None

    return Prepared("image", builder.image_token, builder.image_token_id, tuple(images), texts)
