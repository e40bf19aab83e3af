"""Pre-training records: interleaved documents, plain text, and image-caption pairs.

These are not chats. A :class:`TextRecord` is a run of segments, each a text or an image, in
the order the document gives them; :mod:`wdspack.packer.text` tokenizes it (no chat template, loss
on text). Two row layouts are documents, whatever file they come from (JSON, JSONL, Parquet,
``save_to_disk``):

=============================  ===============================================================
``texts`` + ``images``         OBELICS-style: two lists of the same length; at each position
                               one is set and the other is null. ``texts`` entries are strings
                               (or null), which is what tells it from the_cauldron's
                               ``texts: [{user, assistant}]`` chats.
``text``                       a plain string, text-only pre-training data (FineWeb, C4 ...);
                               only when the row has no ``messages``/``conversations``/``texts``.
=============================  ===============================================================

Example::

    {"texts": ["A cat.", null, "It sleeps."], "images": [null, {"bytes": ...}, null]}
      → segments ("A cat.", IMAGE, "It sleeps."), one image

Captions (image + caption pairs from WebDataset shards, :mod:`.webdataset`) are TextRecords of
kind ``"caption"``: segments ``(IMAGE, caption)``, ``(VIDEO, caption)`` for a video sample, or
``(VIDEO, IMAGE, caption)`` for one with both. Each media kind has its segment (:data:`SEGMENT_OF`),
which takes the record's next item of that kind (a video: the file's bytes, undecoded).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ...errors import SampleError
from ...media import IMAGE as IMAGE_KIND
from ...media import KINDS, by_name

__all__ = ["DOCUMENT_COLUMNS", "IMAGE", "SEGMENT_OF", "VIDEO", "MediaSlot", "Segment", "TextRecord", "build_document",
           "is_document", "is_media"]

#: Columns read for documents besides the chat ones (``texts``, ``images``, ``id``).
DOCUMENT_COLUMNS = ("text",)
#: The segment that stands for the record's next image (format v1's: None).
IMAGE = None


class MediaSlot:
    """The segment that stands for the next item of a kind other than images: one instance per kind, which
    stays itself through pickling (``is SEGMENT_OF["video"]`` holds in a worker process too), and is no text."""

    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __repr__(self) -> str:
        return self.kind.upper()

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _slot_of, (self.kind,)  # pickled by kind: the module's own instance


def _slot_of(kind: str) -> MediaSlot:
    slot = SEGMENT_OF[kind]
    assert isinstance(slot, MediaSlot)
    return slot


#: A segment: a text, :data:`IMAGE` or a kind's :class:`MediaSlot`.
Segment = str | None | MediaSlot
#: The segment that stands for the record's next item of each kind, by kind.
SEGMENT_OF: dict[str, Segment] = {kind.name: IMAGE if kind is IMAGE_KIND else MediaSlot(kind.name) for kind in KINDS}
#: The segment that stands for the record's next video.
VIDEO: Final = SEGMENT_OF["video"]


def is_media(segment: Segment) -> bool:
    """Whether a segment stands for a media item (not text).

    Example:
        >>> is_media(IMAGE), is_media(VIDEO), is_media("A cat.")
        (True, True, False)
    """
    return not isinstance(segment, str)


#: A kind's items of a text record by their v1 spelling (``images``, ``videos``), in the v1 positional order.
_FIELD_OF = {kind.plural: kind.name for kind in KINDS}
_CHAT_FIELDS = ("messages", "conversations", "instruction")  # a chat, or Alpaca (whose rows may carry a `text` too)


@dataclass(frozen=True, slots=True, init=False)
class TextRecord:
    """A pre-training record: text segments and media in document order, its ``media`` by kind (every kind
    of :data:`~wdspack.media.KINDS`, empty where it has none; a video file's bytes undecoded, as stored).

    ``kind`` is ``"document"`` (loss on every text token) or ``"caption"`` (segments
    ``(IMAGE, caption)``: the caption layout decides the prompt, loss on the caption only).
    Each kind's segment (:data:`SEGMENT_OF`: :data:`IMAGE`, :data:`VIDEO`) takes the record's next item of
    that kind. A kind's items also read, and construct, by their v1 spelling: ``r.images``,
    ``TextRecord(sid, kind, segments, images=..., videos=...)`` (or by position in that order).

    Example:
        >>> r = TextRecord("doc.jsonl:0", "document", ("A cat.", IMAGE, "It sleeps."), (b"...",))
        >>> r.segments.count(IMAGE) == len(r.images)
        True
        >>> TextRecord("s.tar:0", "caption", (VIDEO, "A dog runs."), videos=(b"...",)).segments
        (VIDEO, 'A dog runs.')
    """

    sample_id: str
    kind: str
    segments: tuple[Segment, ...]
    media: Mapping[str, tuple[bytes, ...]]

    def __init__(self, sample_id: str, kind: str, segments: tuple[Segment, ...], *by_position: Any,
                 media: Mapping[str, tuple[bytes, ...]] | None = None, **by_key: Any) -> None:
        by_key = by_name("TextRecord", list(_FIELD_OF), by_position, by_key, fixed=3)
        unknown = sorted(set(by_key) - set(_FIELD_OF))
        if unknown:
            raise TypeError(f"TextRecord() got unexpected keyword arguments {unknown}; a kind's items are "
                            f"{sorted(_FIELD_OF)}")
        have = {**(media or {}), **{_FIELD_OF[key]: value for key, value in by_key.items()}}
        for name, value in (("sample_id", sample_id), ("kind", kind), ("segments", segments),
                            ("media", {k.name: tuple(have.get(k.name, ())) for k in KINDS})):
            object.__setattr__(self, name, value)

    def __getattr__(self, key: str) -> Any:  # a kind's items by their v1 spelling (record.images)
        if key in _FIELD_OF:
            return self.media[_FIELD_OF[key]]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {key!r}")


def is_document(row: Any) -> bool:
    """Whether a raw row is a document (see the module's table) rather than a chat.

    Example:
        >>> is_document({"texts": ["a", None], "images": [None, "x.png"]}), is_document({"text": "a"})
        (True, True)
        >>> is_document({"texts": [{"user": "q", "assistant": "a"}]})
        False
    """
    if not isinstance(row, Mapping) or any(row.get(k) is not None for k in _CHAT_FIELDS):
        return False
    texts = row.get("texts")
    if isinstance(texts, (list, tuple)):
        return len(texts) > 0 and all(t is None or isinstance(t, str) for t in texts)
    return texts is None and isinstance(row.get("text"), str)


def build_document(row: Mapping[str, Any], *, sample_id: str, image_root: str) -> TextRecord:
    """The :class:`TextRecord` of a document row; its images are read (bytes, or paths inside
    ``image_root``).

    Raises:
        SampleError: ``malformed_record`` (lists of different lengths, a position with both or
            neither set), ``empty_conversation`` (no text at all), or an image's
            ``missing_image`` / ``image_path_escape``.

    Example:
        >>> build_document({"text": "Hello."}, sample_id="web.jsonl:0", image_root="/data").segments
        ('Hello.',)
    """
    try:
        segments: list[str | None]
        refs: list[Any]
        if row.get("texts") is None:
            segments, refs = [row["text"]], []
        else:
            segments, refs = _interleaved(row)
        if not any(s and s.strip() for s in segments if s is not IMAGE):
            raise SampleError("empty_conversation", f"the document has no text ({len(refs)} image(s) and "
                              "empty or missing texts); there is nothing to train on, remove the record")
        # the interleaved layout is OBELICS': images are its only media
        images = tuple(IMAGE_KIND.load(ref, image_root) for ref in refs)
        return TextRecord(sample_id, "document", tuple(segments), media={IMAGE_KIND.name: images})
    except SampleError as e:
        raise SampleError(e.reason, e.detail, sample_id=sample_id) from None


def _interleaved(row: Mapping[str, Any]) -> tuple[list[str | None], list[Any]]:
    texts = list(row["texts"])
    images = row.get("images")
    if images is None:
        images = [None] * len(texts)
    if not isinstance(images, (list, tuple)) or len(images) != len(texts):
        shown = len(images) if isinstance(images, (list, tuple)) else type(images).__name__
        raise SampleError("malformed_record", f"'texts' has {len(texts)} entries but 'images' has {shown}; an "
                          "interleaved document needs both lists of the same length, one set per position")
    segments: list[str | None] = []
    refs: list[Any] = []
    for k, (text, image) in enumerate(zip(texts, images)):
        if (text is None) == (image is None):
            what = "both" if text is not None else "neither"
            raise SampleError("malformed_record", f"position {k} has {what} of texts[{k}] and images[{k}] set; "
                              "at each position exactly one of them must be non-null")
        if text is None:
            segments.append(IMAGE)
            refs.append(image)
        elif text:
            segments.append(text)
    return segments, refs
