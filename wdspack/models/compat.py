"""The private parts of transformers that wdspack uses, each reached through one checked door.

transformers renames private helpers between minor releases (5.24 renamed the ``past_key_values``
argument of Gemma 3's ``create_masks_for_vision_model`` to ``cache``). A private name reached
through :func:`private` that is gone, or called through :func:`call_private` with arguments its
signature no longer takes, raises :class:`IncompatibleTransformersError` naming the installed
version and the range wdspack is tested with, instead of an ``ImportError`` or ``TypeError`` deep
inside a training step.

Used here: ``transformers.masking_utils`` (mask functions and builders, Gemma 3's packed masks),
``transformers.models.gemma3.modeling_gemma3.get_block_sequence_ids_for_mask`` and the grid helpers of
``transformers.vision_utils`` (a Qwen-VL tower's bookkeeping, :mod:`wdspack.models.vision_meta`).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError

__all__ = ["TESTED_TRANSFORMERS", "IncompatibleTransformersError", "call_private", "in_tested_range", "private"]

#: The transformers releases the private names below are tested with: the lock file's version
#: (``requirements.lock``, what ``make test`` installs) is the upper end; ``make test-latest``
#: tries newer releases.
TESTED_TRANSFORMERS = ("5.17.0", "5.24.0")


class IncompatibleTransformersError(ConfigError):
    """A private transformers name wdspack uses is gone or has changed in the installed release."""


def _installed() -> str:
    import transformers

    return str(transformers.__version__)


def _error(what: str, why: str) -> IncompatibleTransformersError:
    lo, hi = TESTED_TRANSFORMERS
    return IncompatibleTransformersError(
        f"{what} {why} in the installed transformers {_installed()}; wdspack is tested with transformers "
        f"{lo} to {hi}: install one of those (pip install 'transformers>={lo},<={hi}') or a wdspack that "
        "supports your release")


def in_tested_range() -> bool:
    """Whether the installed transformers is within :data:`TESTED_TRANSFORMERS` (both ends included):
    for speed-ups that must give exactly what transformers would, and so are used only where tested.

    Example:
        >>> in_tested_range()
        True
    """
    from packaging.version import Version

    lo, hi = TESTED_TRANSFORMERS
    return Version(lo) <= Version(_installed()) <= Version(hi)


def private(module: str, *names: str) -> Any:
    """Import private ``names`` from ``module``; one name gives the object, several a tuple.

    Raises:
        IncompatibleTransformersError: the module or a name is missing in the installed release.

    Example:
        >>> private("transformers.masking_utils", "and_masks").__name__
        'and_masks'
    """
    try:
        mod = importlib.import_module(module)
    except ImportError:
        raise _error(f"module {module}", "does not exist") from None
    found = []
    for name in names:
        if not hasattr(mod, name):
            raise _error(f"{module}.{name}", "does not exist")
        found.append(getattr(mod, name))
    return found[0] if len(found) == 1 else tuple(found)


def call_private(fn: Callable[..., Any], /, **kwargs: Any) -> Any:
    """Call a private transformers function after checking its signature takes ``kwargs``.

    Raises:
        IncompatibleTransformersError: the signature no longer takes these arguments.

    Example:
        >>> call_private(private("transformers.masking_utils", "sliding_window_overlay"), sliding_window=4)(0, 0, 5, 2)
        True
    """
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError as e:
        raise _error(f"{fn.__module__}.{fn.__qualname__}({', '.join(kwargs)})", f"cannot be called ({e})") from None
    return fn(**kwargs)
