"""Media as kinds: one room per kind (``image/``, ``video/``), each declaring itself as a
:class:`~.kind.MediaKind`; the packer, the loader, the pack format and the tools loop over :data:`KINDS`.

Shared by every kind: reading a reference under its root (:mod:`.source`) and reading a processor part's
settings wherever transformers writes them (:mod:`.settings`). ``docs/development.md`` ("Adding a media
kind") walks through what a new kind supplies.
"""

from __future__ import annotations

from .image import IMAGE
from .kind import Media, MediaKind
from .video import VIDEO

__all__ = ["IMAGE", "KINDS", "VIDEO", "Media", "MediaKind", "kind_named"]

#: Every kind, in the order a pack stores them (format v1: images, then videos).
KINDS: tuple[MediaKind, ...] = (IMAGE, VIDEO)


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
