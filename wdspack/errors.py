"""Exceptions raised by wdspack, and the record of a dropped sample.

The tree::

    WdspackError                 base of everything wdspack raises on purpose
    ├── ConfigError              bad arguments or options (the fix is on the command line)
    │   └── IncompatibleTransformersError   (models.compat) a transformers release a family cannot use
    ├── SourceError              a whole source cannot be read (missing file, unknown layout)
    │   └── NotFoundError        (storage.base) no file at that URL or path
    ├── Transient                (storage.base) a read worth retrying; never leaves the retry loop
    ├── SampleError              one record or sample is bad; carries a drop ``reason``
    ├── FormatError              bytes that do not follow pack format v1
    │   ├── NewerFormatError     a pack written by a newer wdspack: upgrade, it is not corrupt
    │   ├── ShardError           (format.tar) a tar member header that is cut or garbled
    │   └── DecodeError          (media.kind) a media item in a pack that does not decode, any kind's
    │       ├── ImageDecodeError (media.image.pixels) an image in a pack that does not decode
    │       │   └── ImageTooLargeError
    │       ├── VideoDecodeError (media.video.pixels) a video in a pack that does not decode, or not in bounds
    │       └── AudioDecodeError (media.audio.decode) an audio in a pack that does not decode as planned
    ├── ManifestError            a manifest that is missing, unreadable or inconsistent
    ├── OutputError              the output folder cannot be written, or a resume does not match
    └── TooManyDropsError        a pack job dropped more than its tolerance, or packed nothing

Each is importable from the module named beside it (the rest from here); ``tests/test_errors.py``
keeps every exception class of the package in this tree and in this drawing.

A :class:`SampleError` never stops a job under ``on_error="skip"``: it becomes a
:class:`Dropped` entry, counted by reason in the manifest and listed in ``dropped.jsonl``. The
job as a whole still fails (:class:`TooManyDropsError`, after ``dropped.jsonl`` is written) when
it packs nothing, or drops more than ``max_drop_fraction`` of what it read (5 % by default): a
wrong ``--image-root`` or a layout wdspack does not read shows at once, not as a tiny dataset.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = [
    "ConfigError",
    "DROP_REASONS",
    "Dropped",
    "FormatError",
    "ManifestError",
    "NewerFormatError",
    "OutputError",
    "SampleError",
    "SourceError",
    "TooManyDropsError",
    "WdspackError",
    "register_drop_reasons",
]

#: Every reason a sample can be dropped for, with what it means: the general ones here, each media kind's own
#: (``missing_image``, ``unreadable_video``, ...) added by its declaration (:func:`register_drop_reasons`).
DROP_REASONS: dict[str, str] = {
    "malformed_record": "the record could not be parsed (bad JSON, wrong field types)",
    "unknown_role": "a turn has a role that is not system/user/assistant (or a known alias)",
    "empty_conversation": "the record has no turns, or nothing left after templating",
    "no_assistant_turn": "nothing to train on: the conversation has no assistant turn",
    "placeholder_mismatch": "the number of a kind's placeholders (<image>, <video>) differs from the number of its "
                            "items",
    "too_long": "the sample has more tokens than seq_len",
    "duplicate_id": "another sample already has this id",
    "unsupported_media": "the record has grounding objects (not supported yet), or a kind of media the model's "
                         "family does not take (videos or audio for an image-only family, say)",
    "unmaskable_turn": "an assistant turn cannot be located in the chat template's rendering (naming the turn)",
}


def register_drop_reasons(reasons: dict[str, str]) -> None:
    """Add a media kind's drop reasons to :data:`DROP_REASONS` (its declaration calls this); a reason already
    known with another meaning is a programming error.

    Example:
        >>> register_drop_reasons({"too_long": DROP_REASONS["too_long"]})
    """
    for reason, meaning in reasons.items():
        if DROP_REASONS.setdefault(reason, meaning) != meaning:
            raise ValueError(f"drop reason {reason!r} is already registered with another meaning")


class WdspackError(Exception):
    """Base class of every error wdspack raises on purpose."""


class ConfigError(WdspackError, ValueError):
    """An argument or option is invalid; the message names the value and the fix."""


class SourceError(WdspackError):
    """A whole source cannot be read (missing path, unknown layout, unreadable file)."""


class SampleError(WdspackError):
    """One record or sample is bad.

    Args:
        reason: a key of :data:`DROP_REASONS`.
        detail: what exactly is wrong, naming the value and the fix.
        sample_id: the sample's id, when known.
    """

    def __init__(self, reason: str, detail: str, sample_id: str | None = None) -> None:
        if reason not in DROP_REASONS:
            raise ValueError(f"unknown drop reason {reason!r}; known: {sorted(DROP_REASONS)}")
        self.reason = reason
        self.detail = detail
        self.sample_id = sample_id
        prefix = f"sample {sample_id!r}: " if sample_id is not None else ""
        super().__init__(f"{prefix}{detail} [{reason}]")

    def __reduce__(self):  # survives a trip through a process pool
        return (type(self), (self.reason, self.detail, self.sample_id))

    def to_dropped(self, sample_id: str | None = None) -> Dropped:
        """The :class:`Dropped` entry for this error."""
        return Dropped(sample_id=sample_id or self.sample_id or "?", reason=self.reason, detail=self.detail)


class FormatError(WdspackError):
    """Bytes that do not follow pack format v1."""


class NewerFormatError(FormatError):
    """A pack of a newer format version than this wdspack reads: the data is fine, wdspack is old.

    Args:
        message: what was found, what this wdspack reads, and the fix (upgrade).
        found: the pack's ``format`` (``"wdspack/2"``).
        supported: the format this wdspack reads (``"wdspack/1"``).
    """

    def __init__(self, message: str, *, found: str | None = None, supported: str | None = None) -> None:
        super().__init__(message)
        self.found = found
        self.supported = supported

    def __reduce__(self):  # one positional argument, as DataLoader's re-raise expects; the rest as state
        return (type(self), (str(self),), {"found": self.found, "supported": self.supported})


class ManifestError(WdspackError):
    """A manifest that is missing, unreadable or inconsistent with its shards."""


class OutputError(WdspackError):
    """The output cannot be written, or a ``--resume`` does not match the earlier job."""


class TooManyDropsError(WdspackError):
    """A pack job packed nothing, or dropped more than its tolerance; ``dropped.jsonl`` is written.

    The message counts the drops by reason with one example each and names the fix.
    """


@dataclass(frozen=True, slots=True)
class Dropped:
    """A sample that is in no pack, and why.

    Example:
        >>> Dropped("llava:17", "missing_image", "images/17.jpg does not exist")
        Dropped(sample_id='llava:17', reason='missing_image', detail='images/17.jpg does not exist')
    """

    sample_id: str
    reason: str
    detail: str = ""

    def to_json(self) -> dict[str, str]:
        return {"id": self.sample_id, "reason": self.reason, "detail": self.detail}


_F = TypeVar("_F", bound=Callable[..., Any])


def suggest_keywords(fn: _F) -> _F:
    """``fn`` refuses a keyword it does not take with the name meant, not a bare ``TypeError``.

    Example:
        >>> @suggest_keywords
        ... def load(*, batch_size: int = 1): ...
        >>> load(batchsize=4)
        Traceback (most recent call last):
        ...
        TypeError: load() got an unexpected keyword argument 'batchsize': did you mean batch_size=?
    """
    import difflib

    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return fn
    names = [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for key in kwargs:
            if key not in names:
                close = difflib.get_close_matches(key.lower(), names, n=1, cutoff=0.7)
                if not close:  # batchsize -> batch_size: the words without their underscores
                    close = [n for n in names if n.replace("_", "") == key.replace("_", "").lower()][:1]
                hint = f": did you mean {close[0]}=?" if close else f"; it takes {', '.join(names)}"
                raise TypeError(f"{fn.__name__}() got an unexpected keyword argument {key!r}{hint}")
        return fn(*args, **kwargs)

    return checked  # type: ignore[return-value]
