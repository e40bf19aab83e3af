"""The media-kind protocol: what one kind of media (images, videos, ...) declares, and a pack's items of a kind.

Each kind lives in its own room (``wdspack/media/<kind>/``) and declares itself once as a :class:`MediaKind`;
the packer, the loader, the pack format and the tools loop over :data:`wdspack.media.KINDS` and ask::

    record  --fields, part_types, load-->  bytes  --probe/plan (family side)-->  tokens  --stored-->  pack
    pack    --Media(data, sample, tokens, plans)-->  loader  --decode (family side)-->  batch keys

What a family does with a kind (placeholder, replacement text, pixels, padding) is the family's side for it
(:class:`wdspack.models.family.Family`); what a kind is, is here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..errors import FormatError, register_drop_reasons

__all__ = ["DecodeError", "Media", "MediaKind", "Prepared", "calling", "imported"]


def imported(module: str, name: str = "") -> Callable[[], Any]:
    """``() -> module`` (or its attribute ``name``), imported on the first call: a kind's declaration names its
    parts without importing them (``import wdspack`` stays light; a kind's decoder pulls in torch or PyAV).

    Example:
        >>> imported("wdspack.media.kind", "Media")().__name__
        'Media'
    """
    def get() -> Any:
        found = importlib.import_module(module)
        return getattr(found, name) if name else found

    return get


def calling(module: str, name: str) -> Callable[..., Any]:
    """The function ``module.name``, imported on the first call (as :func:`imported`)."""
    get = imported(module, name)
    return lambda *args, **kwargs: get()(*args, **kwargs)


class DecodeError(FormatError):
    """An item's bytes in a pack that cannot (or must not) be decoded, of any kind (each kind's own error
    subclasses it: ``ImageDecodeError``, ``VideoDecodeError``): the message says why, in one line; ``index`` is
    the item's place in its list, where the caller gave it.

    Example:
        >>> DecodeError("truncated", index=2).index
        2
    """

    def __init__(self, message: str, *, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index

    def __reduce__(self) -> tuple[Any, tuple[str]]:  # one positional argument, as DataLoader's re-raise expects
        return (type(self), (str(self),))


@dataclass(frozen=True, slots=True)
class Media:
    """One kind's items in a pack, in token order: each item's bytes as stored in the source (``data``), the
    sub-sample that owns it (``sample``), the feature tokens it fills (``tokens``) and, for a kind planned at
    pack time, its plan record (``plans``; empty for a kind without plans).

    Example:
        >>> m = Media((b"png",), (0,), (4,))
        >>> len(m), m.tokens
        (1, (4,))
    """

    data: tuple[bytes, ...] = ()
    sample: tuple[int, ...] = ()
    tokens: tuple[int, ...] = ()
    plans: tuple[Any, ...] = ()

    def __len__(self) -> int:
        return len(self.data)

    def keep(self, kept: list[int], *, dropped: int | None = None) -> Media:
        """The items at ``kept``; with ``dropped``, owners after that sub-sample are named one lower."""
        sample = tuple(self.sample[k] - int(dropped is not None and self.sample[k] > dropped) for k in kept)
        return Media(tuple(self.data[k] for k in kept), sample, tuple(self.tokens[k] for k in kept),
                     tuple(self.plans[k] for k in kept) if self.plans else ())


class Prepared(NamedTuple):
    """One kind's items of a chat, probed from their headers, as the family's side for the kind expands them
    (what a kind's ``prepare().part`` returns; ``wdspack.packer.expand.build_expanded`` expands every kind alike)."""

    kind: str  #: the kind's name (``"video"``), for messages
    holder: str  #: the placeholder the chat template renders per item
    token_id: int | None  #: the feature token each item's replacement fills
    data: tuple[bytes, ...]  #: each item's bytes, as the pack stores them
    texts: Callable[[], list[str]]  #: each item's replacement text (the processor's own)
    planned: tuple[tuple[int, str], ...] = ()  #: per item, the tokens its plan gives and the plan shown; () unplanned
    plans: tuple[Any, ...] = ()  #: what the pack stores of each item's plan
    #: per item, ``(kind, k)`` where it has no placeholder of its own and its tokens lie in the text of that kind's
    #: item ``k`` (a video's own sound, interleaved with it); None or () where it has its own placeholder
    inside: tuple[tuple[str, int] | None, ...] = ()


@dataclass(frozen=True, slots=True)
class MediaKind:
    """One kind of media, as the package's shared code sees it (a declaration, as a family is).

    Attributes:
        name: the singular (``"video"``): the pack's ``{name}_sample``/``{name}_tokens`` keys, the chat
            part type, the drop reasons' suffix (``missing_{name}``).
        plural: the pack's bytes key and the record's list (``"videos"``).
        record_fields: the keys a record lists the kind under, in the order they are tried.
        part_types: the chat content part types that carry one item (``{"type": "video_url", ...}``).
        ref_keys: where such a part holds its reference, in the order they are tried.
        placeholder: the text that stands for one item in a record's text (``<video>``).
        written_as_image: the project whose records write the kind's placeholder as ``<image>`` where a record
            holds no images (``"LLaVA-Video"`` for videos), named in a mismatch's message; ``""``: none does.
        extensions: the WebDataset member extensions of the kind (``clip.mp4``).
        settings_part: the processor part whose settings plan it (``read_settings(spec, part)``).
        load: ``(ref, root, *, absolute_ok) -> bytes``: the item a reference stands for, read under the root.
        describe: ``ref -> str``: how a drop detail names an item (its path, ``""`` for inline bytes).
        max_bytes: ``() -> int``: an item's file size over which (or at 0 bytes) it is ``unreadable_{name}``
            without being read (a WebDataset member's size from its tar header); 0: no such bound before reading.
        always_stored: the kind's keys are in every v1 pack (images); otherwise only in packs that hold one,
            so packs without the kind keep their bytes.
        plan_record: the record type of one item's stored plan (``to_msgpack``/``from_msgpack``); None: the
            kind stores no plan (the ``{name}_plans`` key is not written).
        check: ``(media, num_tokens) -> None``: the kind's own invariants on an untrusted pack's items,
            raising :class:`~wdspack.errors.FormatError` (bounds on what the loader will allocate).
        budget: the manifest key whose value bounds the kind per pack (``max_images``), or ``""``.
        drop_reasons: the drop reasons of the kind at pack time, each with its meaning (registered in
            :data:`~wdspack.errors.DROP_REASONS` by the declaration).
        load_drop_reasons: those a sample can also be dropped for at load time, when an item does not decode.
        decode_errors: ``() -> tuple of exception types``: what decoding an item in the loader raises for a
            bad item (the loader then drops its sample, not the pack).
        prepare: ``() -> module``: the kind's pack-time side (its room's ``prepare`` module), imported on first
            use, with ``setup(builder)`` (the processor's settings for the kind, read once), ``probe(builder,
            items, sid, names) -> (data, probes)`` (each item checked or planned from its header),
            ``part(builder, sid, data, probes) -> Prepared`` and ``policy(builder) -> dict or None`` (what the
            manifest's ``image_policy`` records of the kind), ``over_budget(builder, sample, *, seq_len)``
            (why a sample over ``seq_len`` for the kind is dropped, where its fix is the kind's own settings).
        check_item: ``(data, plan, *, sample_id)``: ``wdspack verify``'s check that a stored item's file holds
            what its plan names (a video's frames: a demux pass, nothing decoded), raising
            :class:`~wdspack.errors.SampleError`; None: nothing to check beyond the pack's bounds.
        batch: ``() -> module``: the kind's side in the loader with a processor (its room's ``batch`` module):
            ``ROWS_KEY`` and ``MASK_KEY`` (its pixel rows and their mask in the batch), ``active(batcher)``,
            ``outputs(batcher, items, raw)`` (decoded, through the family's side), ``pad(batcher, outputs,
            tokens)`` (the budgets' static shapes) and ``normalize(batcher, uint8_rows)``.
    """

    name: str
    plural: str
    record_fields: tuple[str, ...]
    part_types: tuple[str, ...]
    ref_keys: tuple[str, ...]
    extensions: tuple[str, ...]
    settings_part: str
    load: Callable[..., bytes]
    describe: Callable[[Any], str]
    max_bytes: Callable[[], int] = int
    always_stored: bool = False
    plan_record: Any = None
    check: Callable[[Media, int], None] | None = None
    budget: str = ""
    drop_reasons: Mapping[str, str] = field(default_factory=dict)
    load_drop_reasons: tuple[str, ...] = ()
    decode_errors: Callable[[], tuple[type[BaseException], ...]] = tuple
    prepare: Callable[[], Any] | None = None
    batch: Callable[[], Any] | None = None
    check_item: Callable[..., object] | None = None
    placeholder: str = ""
    written_as_image: str = ""

    def __post_init__(self) -> None:
        register_drop_reasons(dict(self.drop_reasons))

    @property
    def keys(self) -> tuple[str, ...]:
        """The pack keys of the kind, in the order they are written."""
        plans = (f"{self.name}_plans",) if self.plan_record is not None else ()
        return (self.plural, f"{self.name}_sample", f"{self.name}_tokens", *plans)
