"""A mixture: packed datasets with weights in one unit, read as one stream.

    sources:
      - {path: packed/llava/, weight: 0.7}
      - {path: hf://datasets/org/captions@main, weight: 0.3, name: captions, max_passes: 2}
    unit: tokens            # or targets (supervised tokens), packs, images, samples

    one mixture epoch:  T = min(Σ_i U_i, min_i max_passes_i · U_i / w_i)   (U_i: units of source i)
                        passes_i = w_i · T / U_i,   per_slot = floor(Σ_i passes_i · packs_i / slots / batch) · batch

Holds: weights normalised to sum 1 (:attr:`Mixture.shares`); no source makes more passes than its
``max_passes``; every source of a mixture can share a batch (:func:`check_compatible`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import numbers
import os
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import ConfigError
from ...format.dataset import ResolvedSource, ShardRef
from ...format.manifest import MANIFEST_NAME, Manifest, image_token_budget
from ...format.pack_index import COLUMNS
from ...media import KINDS
from ...storage.urls import dirname_url, is_url, join_url

__all__ = ["UNITS", "Mixture", "MixtureEpoch", "MixtureSource", "check_compatible", "combined_source",
           "is_mixture_spec", "mixture_epoch", "unit_values"]

logger = logging.getLogger(__name__)

#: The units a weight can be given in, each a column of the pack index (``packs``: 1 per pack).
UNITS = ("tokens", "targets", "packs", "images", "samples")
_ALIASES = {"supervised_tokens": "targets"}
_SOURCE_KEYS = ("path", "weight", "name", "max_passes")
_MIXTURE_KEYS = ("sources", "unit")
_SCHEDULE_KEYS = ("schedule", "every")  # weights over steps (optional)
_MIXTURE_SUFFIXES = (".yaml", ".yml")
_EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # no chat template


@dataclass(frozen=True, slots=True)
class MixtureSource:
    """One packed dataset of a mixture.

    Args:
        path: anything a single dataset is given as: a folder, ``manifest.json``, ``https://``,
            ``hf://datasets/ORG/NAME@REV``, ``s3://``...
        weight: its weight in the mixture's unit (> 0; the weights are normalised to sum 1).
        name: what logs and ``source_names`` call it; the path's last folder by default.
        max_passes: the most passes over it one mixture epoch may make (None: no cap).

    Example:
        >>> MixtureSource("hf://datasets/org/captions@main", 0.3).name
        'captions'
    """

    path: str
    weight: float
    name: str | None = None
    max_passes: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path.strip():
            raise ConfigError(f"mixture source path {self.path!r} must be a non-empty string (a dataset folder or URL)")
        if not _is_number(self.weight) or not (math.isfinite(self.weight) and self.weight > 0):
            raise ConfigError(f"mixture source {self.path!r} has weight {self.weight!r}; give a finite number > 0 "
                              "(drop the source to leave it out)")
        if self.max_passes is not None and not (_is_number(self.max_passes) and self.max_passes > 0):
            raise ConfigError(f"mixture source {self.path!r} has max_passes {self.max_passes!r}; give a number > 0 "
                              "(1: at most one pass per epoch) or leave it out for no cap")
        if self.name is None:
            object.__setattr__(self, "name", default_name(self.path))
        elif not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"mixture source {self.path!r} has name {self.name!r}; give a non-empty string")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def default_name(path: str) -> str:
    """The last folder of a dataset path, without ``@revision``, ``manifest.json`` or a shard pattern.

    Example:
        >>> default_name("hf://datasets/org/llava@main"), default_name("data/packed/manifest.json")
        ('llava', 'packed')
    """
    text = path.rstrip("/")
    if text.endswith(("/" + MANIFEST_NAME, ".tar")):
        text = posixpath.dirname(text.replace(os.sep, "/"))
    last = posixpath.basename(text.replace(os.sep, "/")) or text
    return re.sub(r"@[^/]*$", "", last) or last


@dataclass(frozen=True, slots=True)
class Mixture:
    """Packed datasets with weights, in one unit (see the module docstring).

    Example:
        >>> m = Mixture.of([("a/", 3), ("b/", 1)])
        >>> m.names, m.shares, m.unit
        (('a', 'b'), (0.75, 0.25), 'tokens')
    """

    sources: tuple[MixtureSource, ...]
    unit: str = "tokens"
    #: weights over steps, piecewise linear: ``((step, {name: weight, ...}), ...)`` (every source named,
    #: steps increasing); before the first step its weights, after the last the last's. Empty: the
    #: sources' weights throughout (they also set the epoch's length either way).
    schedule: tuple[tuple[int, Mapping[str, float]], ...] = ()
    #: a weight schedule takes effect in segments of this many global steps, each with the weights
    #: at its middle step
    every: int = 100

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", tuple(self.sources))
        object.__setattr__(self, "schedule", tuple((p[0], dict(p[1])) for p in self.schedule))
        if not self.sources:
            raise ConfigError("a mixture needs at least one source; give sources: [{path: ..., weight: ...}]")
        for s in self.sources:
            if not isinstance(s, MixtureSource):
                raise ConfigError(f"mixture sources must be MixtureSource records, got {s!r}; use Mixture.of(...)")
        unit = _ALIASES.get(self.unit, self.unit)
        if unit not in UNITS:
            raise ConfigError(f"mixture unit {self.unit!r} is not one of {UNITS} (or 'supervised_tokens')")
        object.__setattr__(self, "unit", unit)
        seen: dict[str, str] = {}
        for s in self.sources:
            assert s.name is not None  # set by MixtureSource
            if s.name in seen:
                raise ConfigError(f"mixture sources {seen[s.name]!r} and {s.path!r} are both named {s.name!r}; "
                                  "give one of them a name")
            seen[s.name] = s.path
        if not (isinstance(self.every, int) and not isinstance(self.every, bool) and self.every >= 1):
            raise ConfigError(f"mixture every={self.every!r}: give the steps per weight segment, an int >= 1")
        last = -1
        for step, weights in self.schedule:
            if not isinstance(step, int) or isinstance(step, bool) or step <= last:
                raise ConfigError(f"mixture schedule step {step!r}: give ints >= 0, increasing")
            last = step
            if sorted(weights) != sorted(seen) or not all(
                    _is_number(v) and math.isfinite(v) and v > 0 for v in weights.values()):
                raise ConfigError(f"mixture schedule at step {step} gives {dict(weights)}; give every source "
                                  f"({sorted(seen)}) a finite weight > 0")

    def shares_at(self, step: float) -> tuple[float, ...]:
        """The weights (normalised) at global ``step``: the schedule's, linearly interpolated, else :attr:`shares`.

        Example:
            >>> m = Mixture.of({"sources": [{"path": "a/", "weight": 1}, {"path": "b/", "weight": 1}],
            ...                 "schedule": [{"step": 0, "weights": {"a": 1, "b": 3}},
            ...                              {"step": 100, "weights": {"a": 3, "b": 1}}]})
            >>> m.shares_at(50), m.shares_at(500)
            ((0.5, 0.5), (0.75, 0.25))
        """
        if not self.schedule:
            return self.shares
        steps = [p[0] for p in self.schedule]
        rows = np.array([[p[1][n] for n in self.names] for p in self.schedule], np.float64)
        rows = rows / rows.sum(axis=1, keepdims=True)
        w = [float(np.interp(step, steps, rows[:, i])) for i in range(len(self.names))]
        total = math.fsum(w)
        return tuple(v / total for v in w)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(str(s.name) for s in self.sources)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(s.path for s in self.sources)

    @property
    def shares(self) -> tuple[float, ...]:
        """The weights normalised to sum 1."""
        total = math.fsum(s.weight for s in self.sources)
        return tuple(s.weight / total for s in self.sources)

    @classmethod
    def of(cls, value: Any, *, unit: str | None = None) -> Mixture:
        """A mixture from any of its forms: a Mixture; a ``.yaml``/``.yml``/``.json`` file's path or
        URL; a mapping like the file; a sequence of :class:`MixtureSource`, ``(path, weight)``,
        ``(path, weight, name)`` or dicts. ``unit`` overrides the value's.

        Example:
            >>> Mixture.of({"sources": [{"path": "a/", "weight": 1}], "unit": "packs"}).unit
            'packs'
        """
        if isinstance(value, Mixture):
            mixture = value
        elif isinstance(value, (str, os.PathLike)):
            text = os.fspath(value)
            if not _is_mixture_file(text):
                raise ConfigError(f"{text!r} is not a mixture file (.yaml, .yml, or .json holding 'sources'); for one "
                                  "dataset pass its folder as the source, for a mixture a file or a list of "
                                  "(path, weight)")
            mixture = cls.load(text)
        elif isinstance(value, Mapping):
            mixture = _from_mapping(value, base=None, where="the mixture")
        elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
            mixture = cls(tuple(_source(item, base=None, where=f"mixture source {k}") for k, item in enumerate(value)))
        else:
            raise ConfigError(f"cannot read a mixture from {type(value).__name__} {value!r}; pass a Mixture, a "
                              "mixture file, a dict like one, or a list of (path, weight)")
        if unit is not None and unit != mixture.unit:
            mixture = cls(mixture.sources, unit, mixture.schedule, mixture.every)
        return mixture

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Mixture:
        """Read a mixture file (YAML or JSON, local or a URL); relative local paths in it are taken
        from the file's folder.

        Example:
            >>> Mixture.load("mixtures/stage1.yaml")  # doctest: +SKIP
        """
        text = os.fspath(path)
        data = _read_text(text)
        if text.endswith(".json"):
            try:
                value = json.loads(data)
            except ValueError as e:
                raise ConfigError(f"{text} is not valid JSON: {e}") from None
        else:
            import yaml

            try:
                value = yaml.safe_load(data)
            except yaml.YAMLError as e:
                raise ConfigError(f"{text} is not valid YAML: {e}") from None
        if not isinstance(value, Mapping):
            raise ConfigError(f"{text} holds a {type(value).__name__}; a mixture file holds a mapping with "
                              "'sources' (a list of {path, weight, name, max_passes}) and 'unit'")
        base = text if is_url(text) else os.path.abspath(text[len("file://"):] if text.startswith("file://") else text)
        return _from_mapping(value, base=dirname_url(base), where=text)


def _from_mapping(value: Mapping, *, base: str | None, where: str) -> Mixture:
    unknown = sorted(str(k) for k in value if k not in _MIXTURE_KEYS + _SCHEDULE_KEYS)
    if unknown:
        raise ConfigError(f"{where} has unknown keys {unknown}; a mixture has {list(_MIXTURE_KEYS)} and, for "
                          f"weights over steps, {list(_SCHEDULE_KEYS)}")
    sources = value.get("sources")
    if not isinstance(sources, Sequence) or isinstance(sources, (str, bytes)):
        raise ConfigError(f"{where} has sources={sources!r}; give a list of {{path, weight}} entries")
    schedule = value.get("schedule") or ()
    if not isinstance(schedule, Sequence) or not all(
            isinstance(p, Mapping) and sorted(p) == ["step", "weights"] and isinstance(p["weights"], Mapping)
            for p in schedule):
        raise ConfigError(f"{where} has schedule={schedule!r}; give a list of {{step: N, weights: {{name: w}}}}")
    return Mixture(tuple(_source(item, base=base, where=f"{where}, source {k}") for k, item in enumerate(sources)),
                   unit=str(value.get("unit", "tokens")),
                   schedule=tuple((p["step"], p["weights"]) for p in schedule), every=value.get("every", 100))


def _source(item: Any, *, base: str | None, where: str) -> MixtureSource:
    if isinstance(item, MixtureSource):
        return item
    if isinstance(item, Mapping):
        unknown = sorted(str(k) for k in item if k not in _SOURCE_KEYS)
        if unknown:
            raise ConfigError(f"{where} has unknown keys {unknown}; a source has {list(_SOURCE_KEYS)}")
        for key in ("path", "weight"):
            if key not in item:
                raise ConfigError(f"{where} has no {key!r}; a source needs path and weight, e.g. "
                                  "{path: packed/, weight: 0.5}")
        path = item["path"]
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        return MixtureSource(_resolve(path, base), item["weight"], item.get("name"), item.get("max_passes"))
    if isinstance(item, tuple | list) and len(item) in (2, 3):
        path = os.fspath(item[0]) if isinstance(item[0], os.PathLike) else item[0]
        return MixtureSource(_resolve(path, base), item[1], *(item[2:] or (None,)))
    raise ConfigError(f"{where} is {item!r}; give a MixtureSource, (path, weight), (path, weight, name) or "
                      "{path, weight, name, max_passes}")


def _resolve(path: Any, base: str | None) -> Any:
    """A relative local path from a mixture file, taken from the file's folder."""
    if base is None or not isinstance(path, str) or is_url(path) or os.path.isabs(path) or path.startswith("~"):
        return path
    if path.startswith("file://"):
        return path
    return join_url(base, path) if is_url(base) else os.path.normpath(os.path.join(base, path))


def _read_text(url: str) -> str:
    try:
        if is_url(url):
            import fsspec

            with fsspec.open(url, "rt", encoding="utf-8") as f:
                return f.read()
        local = os.path.expanduser(url[len("file://"):] if url.startswith("file://") else url)
        with open(local, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise ConfigError(f"mixture file {url} does not exist") from None


def _is_mixture_file(text: str) -> bool:
    lower = text.lower()
    if lower.endswith(_MIXTURE_SUFFIXES):
        return True
    if not lower.endswith(".json") or posixpath.basename(lower.replace(os.sep, "/")) == MANIFEST_NAME:
        return False
    try:
        value = json.loads(_read_text(text))
    except (ConfigError, ValueError, OSError):
        return False
    return isinstance(value, Mapping) and "sources" in value


def is_mixture_spec(value: Any) -> bool:
    """True when ``value`` names a mixture rather than one dataset: a :class:`Mixture`; a path
    ending ``.yaml``/``.yml``; a ``.json`` other than ``manifest.json`` holding ``sources``; a
    mapping with ``sources``; a sequence of sources (not of shard paths).

    Example:
        >>> is_mixture_spec("mix.yaml"), is_mixture_spec("packed/"), is_mixture_spec([("a/", 1), ("b/", 1)])
        (True, False, True)
    """
    if isinstance(value, Mixture):
        return True
    if isinstance(value, (str, os.PathLike)):
        return _is_mixture_file(os.fspath(value))
    if isinstance(value, Mapping):
        return "sources" in value
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)) and value:
        return all(isinstance(v, MixtureSource | Mapping) or (isinstance(v, tuple | list) and len(v) in (2, 3)
                                                              and _is_number(v[1])) for v in value)
    return False


# ---------------------------------------------------------------------------------------------
# Compatibility


def check_compatible(names: Sequence[str], manifests: Sequence[Manifest | None]) -> None:
    """Refuse sources whose packs cannot share a batch, naming the source, the field and the fix.

    Compared with the first source: ``seq_len``; the tokenizer (vocabulary size, pad token id,
    token dtype); among the sources that hold images, the image token and the image policy (its
    kind, the processor family, the fixed tokens per image); the chat template, where both
    recorded one. ``max_images`` may differ (the loader sizes image slots for the largest). A
    different tokenizer *name* with everything else equal is logged, not refused (the same
    tokenizer is often named by a hub id in one place and a local path in another).

    Example:
        >>> try:
        ...     check_compatible(["a"], [None])
        ... except ConfigError as e:
        ...     print(str(e).split(";")[0])
        mixture source 'a' has no manifest.json (a list of shards without one?)
    """
    for name, m in zip(names, manifests):
        if m is None:
            raise ConfigError(f"mixture source {name!r} has no manifest.json (a list of shards without one?); a "
                              "mixture reads each source's manifest and pack index: pass the dataset folder")
    if len(names) < 2:
        return
    ref_name, ref = names[0], manifests[0]
    assert ref is not None
    template_ref = next(((n, m) for n, m in zip(names, manifests) if m is not None and _template(m)), None)
    image_ref = next(((n, m) for n, m in zip(names, manifests) if m is not None and _holds_images(m)), None)
    for name, m in zip(names[1:], manifests[1:]):
        assert m is not None

        def refuse(field: str, mine: Any, theirs: Any, fix: str, other: str = ref_name, name: str = name) -> None:
            raise ConfigError(f"mixture source {name!r} has {field} {mine!r} but {other!r} has {theirs!r}; every "
                              f"source of a mixture must share it: {fix}")

        if m.seq_len != ref.seq_len:
            refuse("seq_len", m.seq_len, ref.seq_len, f"reshard {name!r} to seq_len {ref.seq_len} with `wdspack "
                   f"reshard SOURCE OUTPUT --seq-len {ref.seq_len}` (or reshard {ref_name!r} to {m.seq_len})")
        tok, ref_tok = m.tokenizer, ref.tokenizer
        repack = f"re-pack {name!r} with the tokenizer of {ref_name!r} (--tokenizer {ref_tok.get('name')!r})"
        for key in ("vocab_size", "pad_token_id", "token_dtype"):
            if key in tok and key in ref_tok and tok[key] != ref_tok[key]:
                refuse(f"tokenizer {key}", tok[key], ref_tok[key], repack)
        if template_ref is not None and name != template_ref[0] and _template(m) \
                and _template(m) != _template(template_ref[1]):
            refuse("chat template sha256", _template(m)[:12], _template(template_ref[1])[:12],
                   f"re-pack {name!r} with the chat template of {template_ref[0]!r} (--chat-template FILE)",
                   other=template_ref[0])
        if image_ref is not None and name != image_ref[0] and _holds_images(m):
            other, theirs = image_ref[0], image_ref[1].tokenizer
            for key in ("image_token", "image_token_id"):
                if key in tok and key in theirs and tok[key] != theirs[key]:
                    refuse(f"tokenizer {key}", tok[key], theirs[key],
                           f"re-pack {name!r} with --image-token {theirs.get('image_token')!r}", other=other)
            _check_policy(name, m.image_policy, image_ref[1].image_policy, functools.partial(refuse, other=other))
        if tok.get("name") != ref_tok.get("name"):
            logger.warning("mixture sources %r and %r name their tokenizers differently (%r, %r); their vocabulary, "
                           "pad token and template agree, so they are read as one", name, ref_name, tok.get("name"),
                           ref_tok.get("name"))


def _template(m: Manifest) -> str:
    """The chat template's digest, '' when none was recorded (or an empty one: text data)."""
    digest = str(m.tokenizer.get("chat_template_sha256") or "")
    return "" if digest == _EMPTY_SHA256 else digest


def _check_policy(name: str, policy: Mapping[str, Any], ref: Mapping[str, Any], refuse) -> None:
    kind, ref_kind = policy.get("kind"), ref.get("kind")
    if kind != ref_kind:
        refuse("image policy", kind, ref_kind, f"re-pack {name!r} the way its images were packed in the other "
               f"source ({_policy_flag(ref)})")
    if policy.get("family") != ref.get("family"):
        refuse("processor family", policy.get("family"), ref.get("family"),
               f"re-pack {name!r} with the processor of the other source ({_policy_flag(ref)})")
    if kind == "fixed" and policy.get("tokens_per_image") != ref.get("tokens_per_image"):
        refuse("tokens per image", policy.get("tokens_per_image"), ref.get("tokens_per_image"),
               f"re-pack {name!r} with --tokens-per-image {ref.get('tokens_per_image')}")


def _policy_flag(policy: Mapping[str, Any]) -> str:
    if policy.get("kind") == "fixed":
        return f"--tokens-per-image {policy.get('tokens_per_image')}"
    return f"--processor {policy.get('name')!r}"


def _holds_images(m: Manifest) -> bool:
    return any(s.images for s in m.shards) or bool(m.totals.get("images"))


# ---------------------------------------------------------------------------------------------
# Units and the mixture epoch


def unit_values(index: np.ndarray, unit: str) -> np.ndarray:
    """Each pack's value in ``unit``, from its pack index rows (:data:`~wdspack.format.pack_index.COLUMNS`).

    Example:
        >>> rows = np.array([[0, 2000, 0, 3, 1, 64, 900]])
        >>> [unit_values(rows, unit).tolist() for unit in ("tokens", "targets", "packs")]
        [[2000], [900], [1]]
    """
    unit = _ALIASES.get(unit, unit)
    if unit not in UNITS:
        raise ConfigError(f"unit {unit!r} is not one of {UNITS}")
    index = np.asarray(index)
    if unit == "packs":
        return np.ones(len(index), np.int64)
    return index[:, COLUMNS.index(unit)].astype(np.int64)


@dataclass(frozen=True, slots=True)
class MixtureEpoch:
    """One mixture epoch: what each source gives (see the module docstring)."""

    names: tuple[str, ...]
    shares: tuple[float, ...]
    unit: str
    #: per source: its units (U_i, the sum over its packs) and its packs
    units: tuple[int, ...]
    packs: tuple[int, ...]
    #: the epoch's units (T), and the passes each source makes in it (w_i · T / U_i)
    total: float
    passes: tuple[float, ...]
    #: the source whose max_passes shortened the epoch, if one did
    capped_by: str | None = None

    @property
    def source_units(self) -> tuple[float, ...]:
        """Units each source gives in an epoch (``w_i · T``)."""
        return tuple(w * self.total for w in self.shares)

    @property
    def source_packs(self) -> tuple[float, ...]:
        """Packs each source gives in an epoch, on average (``passes_i · packs_i``)."""
        return tuple(p * n for p, n in zip(self.passes, self.packs))

    @property
    def epoch_packs(self) -> float:
        return math.fsum(self.source_packs)

    def per_slot(self, slots: int, batch_size: int = 1) -> int:
        """Packs every slot yields in the epoch, a multiple of ``batch_size``.

        Example:
            >>> e = mixture_epoch(Mixture.of([("a/", 1), ("b/", 1)]), units=[100, 300], packs=[10, 30])
            >>> e.passes, e.epoch_packs, e.per_slot(4, 2)
            ((2.0, 0.6666666666666666), 40.0, 10)
        """
        if slots < 1 or batch_size < 1:
            raise ConfigError(f"slots ({slots}) and batch_size ({batch_size}) must be >= 1")
        per_slot = int(self.epoch_packs + 1e-9) // slots // batch_size * batch_size
        if per_slot == 0:
            raise ConfigError(f"a mixture epoch has {self.epoch_packs:.0f} packs, too few for {slots} rank×worker "
                              f"slots with batch_size {batch_size}; use fewer workers or a smaller batch")
        return per_slot


def mixture_epoch(mixture: Mixture, units: Sequence[int], packs: Sequence[int]) -> MixtureEpoch:
    """The mixture epoch of ``mixture`` whose sources hold ``units`` (in ``mixture.unit``) and ``packs``.

    Raises:
        ConfigError: a source with a weight holds none of the unit (text-only data weighed in images).

    Example:
        >>> m = Mixture.of([MixtureSource("a/", 1, max_passes=1), MixtureSource("b/", 1)])
        >>> e = mixture_epoch(m, units=[100, 300], packs=[10, 30])
        >>> e.total, e.passes, e.capped_by
        (200.0, (1.0, 0.3333333333333333), 'a')
    """
    if len(units) != len(mixture.sources) or len(packs) != len(mixture.sources):
        raise ConfigError(f"{len(units)} unit totals and {len(packs)} pack counts for {len(mixture.sources)} sources")
    shares = mixture.shares
    for s, u, n in zip(mixture.sources, units, packs):
        if n <= 0:
            raise ConfigError(f"mixture source {s.name!r} ({s.path}) holds no packs; drop it from the mixture")
        if u <= 0:
            raise ConfigError(f"mixture source {s.name!r} holds no {mixture.unit} but has weight {s.weight}: its share "
                              f"cannot be met in {mixture.unit}; weigh the mixture in tokens (unit: tokens) or drop "
                              "the source")
    total = float(sum(int(u) for u in units))
    capped_by = None
    for s, w, u in zip(mixture.sources, shares, units):
        if s.max_passes is not None and s.max_passes * u / w < total:
            total, capped_by = s.max_passes * u / w, s.name
    passes = tuple(w * total / u for w, u in zip(shares, units))
    return MixtureEpoch(names=mixture.names, shares=shares, unit=mixture.unit, units=tuple(int(u) for u in units),
                        packs=tuple(int(n) for n in packs), total=total, passes=passes, capped_by=capped_by)


def combined_source(mixture: Mixture, sources: Sequence[ResolvedSource], max_images: int) -> ResolvedSource:
    """One :class:`ResolvedSource` that stands for the mixture where the dataset asks about "its" data:
    every source's shards, and a manifest whose totals are the sources' (sums, and maxima for what sizes
    the batch's static shapes); the image policy of the first source that holds images."""
    manifests = [s.manifest for s in sources]
    assert all(m is not None for m in manifests)
    ms = [m for m in manifests if m is not None]
    holding = next((m for m in ms if any(s.images for s in m.shards)), ms[0])
    totals: dict[str, Any] = {}
    for key in ("packs", "tokens", "images", "samples_packed"):
        totals[key] = sum(int(m.totals.get(key) or 0) for m in ms)
    for key in ("max_samples_per_pack", "max_images_per_pack", "max_image_tokens_per_pack"):
        known = [image_token_budget(m.totals) if key == "max_image_tokens_per_pack" else m.totals.get(key) for m in ms]
        if all(v is not None for v in known):
            totals[key] = max(int(v or 0) for v in known)
    for kind in KINDS:  # a kind some sources hold (videos): the batch's keys of the kind, sized for the largest
        if not kind.always_stored and any(m.totals.get(kind.plural) for m in ms):
            totals[kind.plural] = sum(int(m.totals.get(kind.plural) or 0) for m in ms)
            totals[kind.budget] = max(int(m.totals.get(kind.budget) or 0) for m in ms)
    cp = ms[0].cp if all(m.cp == ms[0].cp for m in ms) else None  # sources planned for one CP degree: its padding
    if cp:
        totals["cp_padding"] = sum(int(m.totals.get("cp_padding") or 0) for m in ms)
    manifest = dataclasses.replace(holding, max_images=max_images, totals=totals, pack_index={}, cp=cp,
                                   shards=tuple(s for m in ms for s in m.shards), sources=tuple(mixture.names))
    shards = tuple(ShardRef(f"{name}/{s.name}", s.url, s.packs) for name, src in zip(mixture.names, sources)
                   for s in src.shards)
    display = "mixture of " + ", ".join(f"{n} ({s.display})" for n, s in zip(mixture.names, sources))
    return ResolvedSource(display, shards, manifest)
