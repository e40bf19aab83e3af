"""Load a model's processor offline, with the parts that load where one of its media parts cannot.

A processor has a part per media kind it takes (``image_processor``, ``video_processor``,
``feature_extractor``: each kind's ``settings_part``) beside its tokenizer. transformers' video
processors need torchvision, which a CPU-only packing machine (or one whose torch build has no matching
torchvision wheel) may lack, so ``AutoProcessor.from_pretrained`` fails for a model whose images (and
audio) alone would work. :func:`load_processor` then builds the same processor class from its tokenizer,
chat template and every media part that loads, leaving out those that do not, and says so.
:func:`assemble_processor` does the same from parts in memory (how the tests and the demo build real
processors offline), and :func:`save_processor` writes a folder that both paths load.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .locate import locate_model

__all__ = ["assemble_processor", "load_processor", "save_processor"]

logger = logging.getLogger(__name__)

_PARTS = ("image_processor", "tokenizer", "video_processor", "feature_extractor", "chat_template")
#: The transformers class that loads each media part of a processor (the kinds' ``settings_part``).
_AUTO = {"image_processor": "AutoImageProcessor", "video_processor": "AutoVideoProcessor",
         "feature_extractor": "AutoFeatureExtractor"}


def assemble_processor(cls: type[Any] | str, *, image_processor: Any, tokenizer: Any, chat_template: str | None = None,
                       **kwargs: Any) -> Any:
    """An instance of the processor class ``cls`` from its parts; a media part it declares and is not given
    (its video processor, say) is left out. Other parts (``feature_extractor=``) are passed by name.

    The class's own ``__init__`` runs (it sets the image token, ids and family options), only its
    type check lets the missing parts pass. Every image, audio and text method works; calling it
    with ``videos=`` without a video processor does not.

    Example:
        >>> from transformers import Qwen2VLImageProcessor
        >>> proc = assemble_processor("Qwen2_5_VLProcessor", image_processor=Qwen2VLImageProcessor(),
        ...                           tokenizer=tok, chat_template=template)  # doctest: +SKIP
    """
    klass: Any = cls  # a ProcessorMixin subclass, built below by hand (a bare __new__, then its __init__)
    if isinstance(cls, str):
        import transformers

        klass = _processor_class(cls)
        if klass is None:
            raise ConfigError(f"transformers {transformers.__version__} has no processor class {cls!r}; "
                              "upgrade transformers")
    from transformers.processing_utils import ProcessorMixin

    attributes = klass.get_attributes()
    given = {"image_processor": image_processor, "tokenizer": tokenizer,
             **{k: kwargs.pop(k) for k in _AUTO if k in kwargs}}
    parts = {part: given.get(part) for part in attributes if part in _AUTO or part == "tokenizer"}
    proc = klass.__new__(klass)
    def check(name: str, arg: Any) -> Any:
        if arg is None and name in _AUTO:
            return None
        try:
            return ProcessorMixin.check_argument_for_proper_class(proc, name, arg)
        except AttributeError:  # a video processor given where its Auto mapping needs torchvision: none to check
            if name in _AUTO:
                return None
            raise

    proc.check_argument_for_proper_class = check  # instance attribute: shadows the class's check for this call only
    try:
        klass.__init__(proc, **{k: v for k, v in parts.items() if k in attributes}, chat_template=chat_template,
                       **kwargs)
    finally:
        del proc.check_argument_for_proper_class
    return proc


def load_processor(spec: str | os.PathLike[str] | Any) -> Any:
    """The processor for ``spec``: a loaded processor object (returned as it is), a local folder, or a
    model name in the Hugging Face cache (runs are offline).

    Tries ``AutoProcessor.from_pretrained`` first; when that fails (typically: its video processor
    needs torchvision), builds the processor class from the folder's tokenizer, chat template,
    processor options and every media part that loads, and logs which it left out. A media part
    that cannot load is found before ``AutoProcessor`` runs, so the tokenizer loads once.

    Raises:
        ConfigError: neither way loads; the message gives both reasons.
    """
    if not isinstance(spec, (str, os.PathLike)):
        if not hasattr(spec, "tokenizer") or not any(hasattr(spec, part) for part in _AUTO):
            raise ConfigError(f"{type(spec).__name__} is not a multimodal processor (it needs a tokenizer and an "
                              f"{', a '.join(_AUTO)}); pass a transformers processor or its folder")
        return spec
    from transformers import AutoProcessor

    name = os.fspath(spec)
    locate_model(name, flag="--processor")  # a folder, the cache or a reachable Hub; else one line, at once
    # AutoProcessor loads the tokenizer (seconds for a large vocabulary) before the video processor
    # that fails; asking the video processor first spares loading the tokenizer a second time.
    loaded, failed = _media_parts(name)
    first = "; ".join(f"its {part.replace('_', ' ')} cannot load: {why}" for part, why in failed.items())
    if not failed:
        try:
            return AutoProcessor.from_pretrained(name)
        except Exception as e:  # transformers raises ImportError/OSError/ValueError/AttributeError here
            first = f"AutoProcessor said {_reason(e)}"
    try:
        proc = _load_parts(name, loaded)
    except Exception as e:
        side = "its image side" + (f" with its {' and '.join(p.replace('_', ' ') for p in loaded)}" if loaded
                                   else " alone")
        raise ConfigError(f"cannot load processor {name!r}: {first}; loading {side} said "
                          f"{type(e).__name__}: {e}. Give a local processor folder (or a model name in "
                          "the Hugging Face cache; runs are offline)") from None
    left = [part for part in _AUTO if part in type(proc).get_attributes() and getattr(proc, part, None) is None]
    logger.info("loaded %s from %r without its %s (%s); the other parts work", type(proc).__name__, name,
                " and ".join(p.replace("_", " ") for p in left) or "declared parts", first)
    return proc


def save_processor(processor: Any, folder: str | os.PathLike[str]) -> Path:
    """Write ``processor`` to ``folder`` so :func:`load_processor` (and ``AutoProcessor`` where its
    parts load) reads it back; works for processors built without their video processor, which
    ``save_pretrained`` refuses. A processor with a feature extractor (audio) has its media parts nested in
    ``processor_config.json``, as transformers 5 writes them."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    processor.tokenizer.save_pretrained(out)
    parts = {part: getattr(processor, part, None) for part in _AUTO}
    nested = {}
    if parts["feature_extractor"] is None and parts["video_processor"] is None:  # an image processor alone: its
        # own file, as every version reads it
        processor.image_processor.save_pretrained(out)
    else:  # two or more parts (two of them write preprocessor_config.json): nested, as transformers 5 saves them
        nested = {part: value.to_dict() for part, value in parts.items() if value is not None}
    if processor.chat_template:
        (out / "chat_template.jinja").write_text(processor.chat_template, encoding="utf-8")
    options = {k: v for k, v in processor.to_dict().items() if k not in _PARTS and _jsonable(v)}
    options.update(nested)
    options["processor_class"] = type(processor).__name__
    (out / "processor_config.json").write_text(json.dumps(options, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out


def _reason(e: BaseException) -> str:
    """``Type: first line`` of an exception, for a one-line message."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _declared_class(name: str) -> str | None:
    """The processor class that ``name``'s processor, image processor or tokenizer config names."""
    return _read_json(name, "processor_config.json").get("processor_class") \
        or _read_json(name, "preprocessor_config.json").get("processor_class") \
        or _read_json(name, "tokenizer_config.json").get("processor_class")


def _media_parts(name: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The media parts other than the image processor that ``name``'s processor class declares, each loaded
    as ``AutoProcessor`` would meet it, and why each that cannot load does not (without torchvision, a video
    processor: ``ImportError``); nothing where no class is named (``AutoProcessor`` then finds it its own way)."""
    cls = _declared_class(name)
    klass = _processor_class(cls) if cls else None
    if klass is None or getattr(klass, "is_dummy", False):
        return {}, {}
    import transformers

    loaded, failed = {}, {}
    for part in klass.get_attributes():
        if part in _AUTO and part != "image_processor":
            try:
                loaded[part] = getattr(transformers, _AUTO[part]).from_pretrained(name)
            except Exception as e:
                own = _own_class(name, part)  # a class that builds without torchvision (MiniCPM-V 4.6's video)
                try:
                    loaded[part] = own.from_pretrained(name) if own is not None else None
                except Exception:
                    loaded[part] = None
                if loaded[part] is None:
                    del loaded[part]
                    failed[part] = _reason(e)
    return loaded, failed


def _own_class(name: str, part: str) -> Any:
    """The class that ``name``'s settings for ``part`` name (``video_processor_type``), imported from its own
    module where the Auto mapping cannot be used without torchvision; None where there is none."""
    import importlib

    import transformers

    try:  # a file that does not parse, or a class whose module needs torchvision to define it: none (the Auto
        # mapping's error is the one said)
        settings = _read_json(name, "processor_config.json").get(part) or _read_json(
            name, f"{part[:-10]}_preprocessor_config.json")
        cls = settings.get(f"{part}_type") if isinstance(settings, dict) else None
        klass = getattr(transformers, cls, None) if isinstance(cls, str) else None
        if klass is None or not getattr(klass, "is_dummy", False):
            return klass
        return getattr(importlib.import_module(klass.__module__), str(cls))
    except Exception:
        return None


def _load_parts(name: str, loaded: dict[str, Any]) -> Any:
    """The processor class of ``name`` from its tokenizer, image processor, chat template and options, with
    the other media parts ``loaded`` (those that could not load left out)."""
    from transformers import AutoImageProcessor, AutoTokenizer

    config = _read_json(name, "processor_config.json")
    cls = _declared_class(name)
    if not cls:
        raise ConfigError("no processor_class in processor_config.json, preprocessor_config.json or "
                          "tokenizer_config.json")
    image_processor = AutoImageProcessor.from_pretrained(name)
    tokenizer = AutoTokenizer.from_pretrained(name)
    template = _read_text(name, "chat_template.jinja") or _read_json(name, "chat_template.json").get("chat_template") \
        or getattr(tokenizer, "chat_template", None)
    import inspect

    klass = _processor_class(cls)
    if klass is None:
        raise ConfigError(f"transformers has no processor class {cls!r}")
    accepted = set(inspect.signature(klass.__init__).parameters)
    options = {k: v for k, v in config.items() if k in accepted and k not in _PARTS}
    return assemble_processor(klass, image_processor=image_processor, tokenizer=tokenizer, chat_template=template,
                              **loaded, **options)


def _processor_class(name: str) -> type[Any] | None:
    """The transformers processor class ``name`` (``None`` if transformers has none).

    Some processor modules import a helper from their torchvision image processor (transformers 5.23:
    ``processing_pixtral`` imports ``get_resize_output_image_size``), so without torchvision the class
    is only a placeholder, although the processor itself needs no torchvision. Such a module is
    imported with the package's PIL image processor modules (which define the same helpers) standing
    in for their torchvision twins during that one import.
    """
    import importlib
    import pkgutil
    import sys

    import transformers

    klass = getattr(transformers, name, None)
    if klass is None or not getattr(klass, "is_dummy", False):
        return klass
    try:
        return getattr(importlib.import_module(klass.__module__), name)
    except ModuleNotFoundError as e:
        if e.name != "torchvision":
            return klass
    package = importlib.import_module(klass.__module__.rpartition(".")[0])
    twins = {f"{package.__name__}.{m.name.replace('_pil_', '_', 1)}": f"{package.__name__}.{m.name}"
             for m in pkgutil.iter_modules(package.__path__) if m.name.startswith("image_processing_pil_")}
    stand_ins = [t for t in twins if t not in sys.modules]
    try:
        for twin in stand_ins:
            sys.modules[twin] = importlib.import_module(twins[twin])
        return getattr(importlib.import_module(klass.__module__), name)
    except ImportError:
        return klass
    finally:
        for twin in stand_ins:
            sys.modules.pop(twin, None)


def _read_text(name: str, filename: str) -> str | None:
    path = Path(name) / filename
    if path.is_file():
        return path.read_text(encoding="utf-8")
    try:
        from transformers.utils import cached_file

        found = cached_file(name, filename, _raise_exceptions_for_missing_entries=False)
    except Exception:
        return None
    return Path(found).read_text(encoding="utf-8") if found else None


def _read_json(name: str, filename: str) -> dict[str, Any]:
    text = _read_text(name, filename)
    return json.loads(text) if text else {}


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
