"""Where a tokenizer or processor name points, answered before anything loads.

    name ──► a local folder? ──► yes: load it
               │ no
               ▼
             in the Hugging Face cache? ──► yes: load it (offline or not)
               │ no
               ▼
             HF_HUB_OFFLINE=1, or the Hub unreachable (one 3 s probe)? ──► one line, at once
               │ no
               ▼
             let transformers download it

A name that is neither a folder nor cached fails in seconds with one line naming all three (no such
folder; not in the cache; the Hub offline or unreachable) instead of transformers' retries.
"""

from __future__ import annotations

import functools
import os
import urllib.error
import urllib.request
from pathlib import Path

from ..errors import ConfigError

__all__ = ["locate_model"]

#: Seconds the probe of the Hub waits for an answer.
PROBE_TIMEOUT_S = 3.0


def locate_model(name: str | os.PathLike[str], *, flag: str) -> None:
    """Refuse ``name`` (what ``flag``, e.g. ``--tokenizer``, gave) in one line unless it can load.

    Example:
        >>> locate_model("/no/such/folder", flag="--tokenizer")
        Traceback (most recent call last):
        ...
        wdspack.errors.ConfigError: --tokenizer '/no/such/folder': no such folder. Give the folder that holds ...
    """
    text = os.fspath(name)
    path = Path(text).expanduser()
    if path.is_dir():
        return
    if path.exists():
        raise ConfigError(f"{flag} {text!r} is a file; give the folder that holds it (with its config files)")
    if not _is_repo_id(text):
        raise ConfigError(f"{flag} {text!r}: no such folder. Give the folder that holds the model's files "
                          "(or a Hugging Face model name, e.g. org/name)")
    if _cached(text):
        return
    import huggingface_hub.constants as hf

    where = f"no such folder; not in the Hugging Face cache ({hf.HF_HUB_CACHE})"
    fix = f"Give a local folder: `hf download {text} --local-dir DIR` where there is network, then {flag} DIR"
    if hf.HF_HUB_OFFLINE:
        raise ConfigError(f"{flag} {text!r}: {where}; the Hub is off (HF_HUB_OFFLINE=1). {fix}")
    reason = _unreachable(hf.ENDPOINT)
    if reason:
        raise ConfigError(f"{flag} {text!r}: {where}; the Hub ({hf.ENDPOINT}) is unreachable ({reason}). {fix}")


def _is_repo_id(text: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)  # refuses more than one "/", a leading "." or "~", ...
    except HFValidationError:
        return False
    return True


def _cached(repo_id: str) -> bool:
    """A snapshot of ``repo_id`` (a model) is in the local Hugging Face cache."""
    import huggingface_hub.constants as hf

    snapshots = Path(hf.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    return snapshots.is_dir() and any(snapshots.iterdir())


@functools.lru_cache(maxsize=8)
def _unreachable(endpoint: str) -> str | None:
    """Why the Hub at ``endpoint`` cannot be reached, or None when it answers (any HTTP status); probed once
    per process (``pack`` looks its names up before the job, and the job's loaders again)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=PROBE_TIMEOUT_S):
            return None
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return f"{type(reason).__name__}: {reason}" if not isinstance(reason, str) else reason
