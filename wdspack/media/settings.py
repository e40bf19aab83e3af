"""A processor part's settings (image, video, audio), read wherever transformers writes them.

    transformers 5      processor_config.json   {"image_processor": {...}, "video_processor": {...}, ...}
    transformers 4,     preprocessor_config.json         the image processor's (or the feature extractor's)
    Hub checkpoints     video_preprocessor_config.json   the video processor's

Holds: the order is transformers 5.24's own (``get_image_processor_dict``, ``get_video_processor_dict``,
``get_feature_extractor_dict``): the part nested in ``processor_config.json``, then its own file, then, for a
video processor, the image processor's file, which transformers builds the video processor from when a folder
has no video settings. A folder, or a model name in the local Hugging Face cache; a loaded processor's part, where
it has one, gives the values (its ``to_dict()``). A file that does not parse, or settings that are not a mapping,
is a one-line :class:`~wdspack.errors.ConfigError`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["PARTS", "PROCESSOR_CONFIG", "PartSettings", "read_settings"]

#: The processor's own file, where transformers 5 nests every part's settings under the part's name.
PROCESSOR_CONFIG = "processor_config.json"
#: Each part's files in the order transformers reads them after :data:`PROCESSOR_CONFIG`.
PARTS = {"image_processor": ("preprocessor_config.json",),
         "video_processor": ("video_preprocessor_config.json", "preprocessor_config.json"),
         "feature_extractor": ("preprocessor_config.json",)}


@dataclass(frozen=True, slots=True)
class PartSettings:
    """One part's settings and where they were read.

    Attributes:
        part: ``"image_processor"``, ``"video_processor"`` or ``"feature_extractor"``.
        values: the settings (None: none found; the part's class defaults apply).
        file: the file they were read from (``processor_config.json`` where nested), None where none was.
        path: that file's full path.
        loaded: the values are the loaded processor's part (its ``to_dict()``), which transformers built from
            ``file`` where there is one.
    """

    part: str
    values: dict[str, Any] | None
    file: str | None = None
    path: str | None = None
    loaded: bool = False

    @property
    def source(self) -> str:
        """Where the values came from, in words (the summary's and the manifest's).

        Example:
            >>> PartSettings("video_processor", {"fps": 2.0}, "processor_config.json", "p/processor_config.json").source
            'processor_config.json'
        """
        if self.file is None:
            return f"the processor's {_noun(self.part)}" if self.loaded else "the class's defaults"
        if self.part == "video_processor" and self.file == "preprocessor_config.json":
            return "preprocessor_config.json (the image processor's: no video settings, as transformers reads it)"
        return self.file

    @property
    def where(self) -> str:
        """The file's path, to name in an error (the source where there is no file)."""
        return self.path or self.source


def read_settings(spec: Any, part: str, processor: Any = None) -> PartSettings:
    """``part``'s settings for ``spec`` (a processor folder or a model name in the Hugging Face cache; anything
    else has no files), as transformers finds them; ``processor``'s own ``part`` where it loaded one.

    Raises:
        ConfigError: the file transformers would read does not parse, or is not a mapping (or its ``part`` is not).

    Example:
        >>> s = read_settings("Qwen/Qwen2.5-VL-7B-Instruct", "video_processor")  # doctest: +SKIP
        >>> s.values["max_pixels"], s.source  # doctest: +SKIP
        (12845056, "preprocessor_config.json (the image processor's: no video settings, as transformers reads it)")
    """
    if part not in PARTS:
        raise ValueError(f"part {part!r}: one of {sorted(PARTS)}")
    found = _from_files(os.fspath(spec), part) if isinstance(spec, (str, os.PathLike)) else None
    own = getattr(processor, part, None)
    if own is not None and hasattr(own, "to_dict"):
        where = found or PartSettings(part, None)
        return PartSettings(part, dict(own.to_dict()), where.file, where.path, loaded=True)
    return found or PartSettings(part, None)


def _from_files(name: str, part: str) -> PartSettings | None:
    nested = _read(name, PROCESSOR_CONFIG)
    if nested is not None:
        values, path = nested
        if values.get(part) is not None:
            if not isinstance(values[part], dict):
                raise ConfigError(f"{path}: {part!r} is {type(values[part]).__name__} {values[part]!r}, not the "
                                  f"{_noun(part)}'s settings (a JSON object); save the processor again with its "
                                  "save_pretrained")
            return PartSettings(part, dict(values[part]), PROCESSOR_CONFIG, path)
    for filename in PARTS[part]:
        found = _read(name, filename)
        if found is not None:
            return PartSettings(part, found[0], filename, found[1])
    return None


def _read(name: str, filename: str) -> tuple[dict[str, Any], str] | None:
    """``filename``'s JSON object in the folder ``name``, or in the cache for the model ``name``; None: no such file."""
    path = Path(name) / filename
    if not path.is_file():
        cached = _cached(name, filename)
        if cached is None:
            return None
        path = Path(cached)
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"cannot read {path}: {' '.join(str(e).split())}; fix the file or save the processor again "
                          "with its save_pretrained") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path} holds a JSON {type(values).__name__}, not an object of settings; fix the file or "
                          "save the processor again with its save_pretrained")
    return values, str(path)


def _cached(name: str, filename: str) -> str | None:
    if Path(name).is_dir():  # a folder: its own files only, never a cached model of the same name
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, filename)
    except Exception:  # not a repo id, or no cache
        return None
    return found if isinstance(found, str) else None


def _noun(part: str) -> str:
    return part.replace("_", " ")
