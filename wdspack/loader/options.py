"""Groups of loader options as small frozen records: how shards are read, how steps are balanced.

Each record checks itself when it is built, so a library caller gets the same error as the CLI,
and each also takes the simple form where one exists::

    PackedDataset(src, read={"timeout": 5})                  ==  read=ReadOptions(timeout=5)
    PackedDataset(src, balance="cost")                       ==  balance=Balance()
    PackedDataset(src, balance={"run": 1, "heaviest_first": True})
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import ConfigError
from ..format.pack_index import CostModel

__all__ = ["BALANCE_KINDS", "Balance", "ReadOptions"]

#: The simple forms of ``balance=``: None (read in the shuffle buffer's order) or ``"cost"``.
BALANCE_KINDS = (None, "cost")


def _from_mapping(cls: type, value: Mapping[str, Any], what: str) -> Any:
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise ConfigError(f"{what} keys {unknown} are unknown; use {names}")
    return cls(**value)


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """How shards, manifests and pack indexes are read (local files, ``https://``, ``hf://``, fsspec).

    Attributes:
        block_size: bytes per read from a shard (>= 512).
        retries: a transient network error is retried this many times (>= 0), waiting
            ``backoff * 2**i`` seconds (or the server's ``Retry-After``).
        backoff: seconds before the first retry (>= 0).
        timeout: seconds an HTTP(S) connect or read may wait for the server before it counts as a
            transient error (and is retried); > 0.
        storage_options: ``hf://``: HfFileSystem options (``token``, ``endpoint``); ``https://``:
            ``{"headers": {...}}``; fsspec URLs: the filesystem's options. Never printed (not in the repr).

    Example:
        >>> ReadOptions.of({"timeout": 5}).timeout
        5.0
    """

    block_size: int = 1 << 20
    retries: int = 5
    backoff: float = 0.5
    timeout: float = 60.0
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if int(self.block_size) < 512 or int(self.retries) < 0:
            raise ConfigError(f"ReadOptions: block_size ({self.block_size}) must be >= 512 bytes and retries "
                              f"({self.retries}) >= 0")
        if not (float(self.backoff) >= 0 and math.isfinite(float(self.backoff))):
            raise ConfigError(f"ReadOptions: backoff={self.backoff!r} must be a finite number of seconds >= 0")
        if not (float(self.timeout) > 0):
            raise ConfigError(f"ReadOptions: timeout={self.timeout!r} must be > 0 seconds (how long a network "
                              "read may wait)")
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise ConfigError(f"ReadOptions: storage_options must be a mapping, got {type(self.storage_options)}")
        for name, kind in (("block_size", int), ("retries", int), ("backoff", float), ("timeout", float)):
            object.__setattr__(self, name, kind(getattr(self, name)))

    @classmethod
    def of(cls, value: ReadOptions | Mapping[str, Any] | None) -> ReadOptions:
        """``value`` as a record: None gives the defaults, a mapping names some fields."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            return _from_mapping(cls, value, "read=")
        raise ConfigError(f"read={value!r}: pass a wdspack.ReadOptions or a dict of its fields")

    def stream_kwargs(self) -> dict[str, Any]:
        """What every byte read takes (``open_stream``, ``read_all``): all but the storage options."""
        return {"block_size": self.block_size, "retries": self.retries, "backoff": self.backoff,
                "timeout": self.timeout}


@dataclass(frozen=True, slots=True)
class Balance:
    """Deal each step's packs so every rank's share costs about the same (``balance="cost"``).

    See :func:`~wdspack.loader.balance.plan_epoch_balanced`. It reads the dataset's pack index (one
    request) and replaces the shuffle buffer's order (the window and run order are still seeded).

    Attributes:
        cost_model: a :class:`~wdspack.CostModel` or a dict of its weights (tokens, attention,
            images, image_tokens).
        heaviest_first: every epoch starts with its costliest step, so a configuration that runs out
            of memory fails in its first step.
        window: packs a slot balances at a time (and holds at most); None: the dataset's
            ``shuffle_buffer``. At least the batch size.
        run: packs read per request (>= 1). None (the default) chooses it from the storage and the
            data (:func:`~wdspack.loader.balance.choose_run`): one pack per run where requests are
            free (local files), else the longest run that keeps the slowest rank within 5 % of the
            mean; a state saved with a run length resumes with it.

    Example:
        >>> Balance.of("cost") == Balance()
        True
    """

    cost_model: CostModel = field(default_factory=CostModel)
    heaviest_first: bool = False
    window: int | None = None
    run: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "cost_model", CostModel.coerce(self.cost_model))
        if self.window is not None and int(self.window) < 1:
            raise ConfigError(f"Balance: window={self.window} must be >= 1 pack (None: the shuffle buffer's size)")
        if self.run is not None:
            if int(self.run) < 1:
                raise ConfigError(f"Balance: run={self.run} must be >= 1 pack per request (None: chosen)")
            object.__setattr__(self, "run", int(self.run))
        object.__setattr__(self, "heaviest_first", bool(self.heaviest_first))

    @classmethod
    def of(cls, value: str | Balance | Mapping[str, Any] | None) -> Balance | None:
        """``value`` as a record: None for no balance, ``"cost"`` for the defaults, a mapping for some fields."""
        if value is None:
            return None
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            if value not in BALANCE_KINDS:
                raise ConfigError(f"balance={value!r} is not one of {BALANCE_KINDS} (or a wdspack.Balance)")
            return cls()
        if isinstance(value, Mapping):
            return _from_mapping(cls, value, "balance=")
        raise ConfigError(f"balance={value!r}: pass 'cost', a wdspack.Balance or a dict of its fields")
