"""Media as kinds: one room per kind (``image/``, ``video/``), each declaring itself as a
:class:`~.kind.MediaKind`; the packer, the loader, the pack format and the tools loop over :data:`KINDS`.

Shared by every kind: reading a reference under its root (:mod:`.source`) and reading a processor part's
settings wherever transformers writes them (:mod:`.settings`). ``docs/development.md`` ("Adding a media
kind") walks through what a new kind supplies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from .audio import AUDIO
from .image import IMAGE
from .kind import Media, MediaKind, Prepared
from .video import VIDEO

__all__ = ["AUDIO", "IMAGE", "KINDS", "VIDEO", "Media", "MediaKind", "Prepared", "by_kind", "by_name", "kind_named",
           "read_spelled", "spelled"]

#: Every kind, in the order a pack stores them (format v1: images, then videos, then audio: a kind after the
#: first two is written only in packs that hold one, so packs without it keep their bytes).
KINDS: tuple[MediaKind, ...] = (IMAGE, VIDEO, AUDIO)


def kind_named(name: str) -> MediaKind:
    """The kind called ``name`` (singular or plural).

    Example:
        >>> kind_named("videos").name
        'video'
    """
    for kind in KINDS:
        if name in (kind.name, kind.plural):
            return kind
    raise KeyError(f"no media kind {name!r}; the kinds are {', '.join(k.name for k in KINDS)}")


#: Each part of :class:`Media` by the suffix its v1 key spells it with (``images``, ``image_sample``, ...).
_PARTS = {"data": "", "sample": "_sample", "tokens": "_tokens", "plans": "_plans"}


def spelled(*parts: str) -> dict[str, tuple[str, str]]:
    """The v1 spelling of the given :class:`Media` parts of every kind, in the keys' order: ``{"images":
    ("image", "data"), "image_tokens": ("image", "tokens"), ...}`` (plans only for a kind that has them).

    Example:
        >>> list(spelled("data", "tokens"))[:3]
        ['images', 'image_tokens', 'videos']
    """
    out = {}
    for kind in KINDS:
        for part in parts:
            if part == "plans" and kind.plan_record is None:
                continue
            out[kind.plural if part == "data" else kind.name + _PARTS[part]] = (kind.name, part)
    return out


def by_kind(media: Mapping[str, Media] | None, spelling: Mapping[str, tuple[str, str]], given: Mapping[str, Any],
            *, owner: str) -> dict[str, Media]:
    """Every kind's :class:`Media`: ``media`` where given, with the parts ``given`` in their v1 spelling
    (``images=``, ``video_tokens=``) over it; ``owner`` names the record in the error for an unknown one."""
    unknown = sorted(set(given) - set(spelling))
    if unknown:
        raise TypeError(f"{owner}() got unexpected keyword arguments {unknown}; a kind's fields are {sorted(spelling)}")
    parts: dict[str, dict[str, Any]] = {}
    for key, value in given.items():
        name, part = spelling[key]
        parts.setdefault(name, {})[part] = tuple(value)
    have = dict(media or {})
    return {kind.name: replace(have.get(kind.name, Media()), **parts.get(kind.name, {})) for kind in KINDS}


def by_name(owner: str, order: Sequence[str], by_position: Sequence[Any], by_key: dict[str, Any],
            *, fixed: int) -> dict[str, Any]:
    """``by_key`` with ``by_position`` named in the v1 ``order`` (a record's arguments after its ``fixed`` ones).

    Example:
        >>> by_name("Pack", ["images", "image_sample"], [(b"png",)], {"image_sample": (0,)}, fixed=4)
        {'image_sample': (0,), 'images': (b'png',)}
    """
    if len(by_position) > len(order):
        raise TypeError(f"{owner}() takes at most {fixed + len(order)} positional arguments")
    for key, value in zip(order, by_position):
        if key in by_key:
            raise TypeError(f"{owner}() got multiple values for argument {key!r}")
        by_key[key] = value
    return by_key


def read_spelled(obj: Any, key: str, spelling: Mapping[str, tuple[str, str]]) -> Any:
    """A kind's part read by its v1 spelling (``pack.images``, ``sample.video_tokens``, ``pack.num_videos``);
    AttributeError for any other name (for a record's ``__getattr__``)."""
    if key in spelling:
        name, part = spelling[key]
        return getattr(obj.media[name], part)
    if key.startswith("num_") and spelling.get(key[4:], ("", ""))[1] == "data":
        return len(obj.media[spelling[key[4:]][0]])
    raise AttributeError(f"{type(obj).__name__!r} object has no attribute {key!r}")
