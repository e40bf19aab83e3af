"""The real transformers video processors as the tests' reference, in a process of their own.

They need torchvision, whose PyPI build does not import with the CPU torch: ``make env`` installs it
into ``.venv/video-reference`` (``requirements/video-reference.lock``), a folder only the child
process puts on its ``PYTHONPATH``, after declaring torchvision's compiled operators (their schemas) so
that its pure-Python transforms import. In ``.venv`` itself it must never be importable: transformers
would then pick torchvision backends for every image processor. Images here keep the Pillow backend,
as in the package's environment.

    jobs ─► run_jobs ─► one child process (PyAV decodes each clip; the processor samples it itself,
                        given VideoMetadata(total_num_frames, fps, width, height)) ─► numpy arrays

:func:`video_processor_outputs` and :func:`processor_outputs` run one job each; a test module with
several references builds them with :func:`video_processor_job` / :func:`processor_job` and runs
them all in one :func:`run_jobs` (importing transformers and torchvision takes seconds).
:func:`save_job` writes a processor folder with the real processor's own ``save_pretrained`` (as
transformers 5 does, or its parts' files side by side as 4.x did) and :func:`folder_job` calls
``AutoProcessor.from_pretrained`` of a folder, so one child can write folders and then run them;
:func:`example_job` builds an ``examples/tiny_vlm`` processor there (with its video processor), saves and runs it.

Inside :func:`shared_child` (``tests/conftest.py``'s session fixture ``video_reference``), :func:`run_jobs` hands
its jobs to one child kept for the whole session instead of starting one per call: the imports and the tokenizers
it loaded serve every test module of the process (the same code on the same jobs: the same arrays).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import select
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: The checkout's root (the child runs this module from there).
ROOT = Path(__file__).resolve().parents[2]
#: Where ``make env`` puts torchvision for this reference only.
FOLDER = Path(sys.prefix) / "video-reference"

#: The video processor of each kind.
KINDS = {"qwen2_vl": "Qwen2VLVideoProcessor", "qwen3_vl": "Qwen3VLVideoProcessor",
         "llava_onevision": "LlavaOnevisionVideoProcessor", "minicpmv4_6": "MiniCPMV4_6VideoProcessor"}

#: The video processor each processor class takes.
VIDEO_PROCESSORS = {"Qwen2VLProcessor": "Qwen2VLVideoProcessor", "Qwen2_5_VLProcessor": "Qwen2VLVideoProcessor",
                    "Qwen3VLProcessor": "Qwen3VLVideoProcessor",
                    "LlavaOnevisionProcessor": "LlavaOnevisionVideoProcessor",
                    "Qwen2_5OmniProcessor": "Qwen2VLVideoProcessor", "Qwen3OmniMoeProcessor": "Qwen2VLVideoProcessor",
                    "Glm4vProcessor": "Glm4vVideoProcessor", "Glm46VProcessor": "Glm46VVideoProcessor",
                    "InternVLProcessor": "InternVLVideoProcessor",
                    "MiniCPMV4_6Processor": "MiniCPMV4_6VideoProcessor"}

#: torchvision 0.28's compiled operators: declared (never implemented) so its Python modules import.
SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "SymInt batch_size, SymInt channels, SymInt height, SymInt width, int sampling_ratio, bool aligned) -> Tensor",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio) -> (Tensor, Tensor)",
    "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, int sampling_ratio, SymInt batch_size, SymInt channels, "
    "SymInt height, SymInt width) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, "
    "SymInt width) -> Tensor",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, "
    "SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, "
    "SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
    "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, "
    "SymInt groups, SymInt offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
)


def video_processor_job(kind: str, clips: Sequence[str | os.PathLike[str]], settings: Mapping[str, Any]) -> dict:
    """A job for :func:`run_jobs`: the video processor of ``kind`` (a key of :data:`KINDS`), built with
    ``settings`` (its constructor's keywords), on each clip alone."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: one of {sorted(KINDS)}")
    return {"what": "video_processor", "cls": KINDS[kind], "clips": [os.fspath(c) for c in clips],
            "settings": dict(settings)}


def processor_job(processor_dir: str | os.PathLike[str], processor_cls: str, video_settings: Mapping[str, Any],
                  calls: Sequence[Mapping[str, Any]], *, features: Mapping[str, Any] | None = None) -> dict:
    """A job for :func:`run_jobs`: the processor class ``processor_cls`` with the tokenizer and (Pillow)
    image processor saved in ``processor_dir`` and its real video processor built with ``video_settings``,
    called once per call ``{"text": str, "videos": [path, ...], "images": [path, ...] or None,
    "audio": [path of a float32 .npy waveform, ...] or None, "kwargs": {...}}``; ``features``: a
    ``WhisperFeatureExtractor``'s keywords, for a processor that takes one (Qwen2.5-Omni)."""
    if processor_cls not in VIDEO_PROCESSORS:
        raise ValueError(f"processor class {processor_cls!r}: one of {sorted(VIDEO_PROCESSORS)}")
    return {"what": "processor", "cls": processor_cls, "video_cls": VIDEO_PROCESSORS[processor_cls],
            "dir": os.fspath(processor_dir), "settings": dict(video_settings), "calls": _calls(calls),
            **({"features": dict(features)} if features is not None else {})}


#: How :func:`save_job` lays a folder out: ``"5.x"`` the processor's own ``save_pretrained`` (one
#: ``processor_config.json``, each part's settings nested under its name); ``"4.x"`` each part's own file
#: (``preprocessor_config.json``, ``video_preprocessor_config.json``), as transformers 4 and Hub checkpoints have them.
LAYOUTS = ("5.x", "4.x")


def save_job(source_dir: str | os.PathLike[str], processor_cls: str, video_settings: Mapping[str, Any],
             folder: str | os.PathLike[str], *, layout: str = "5.x", features: Mapping[str, Any] | None = None) -> dict:
    """A job for :func:`run_jobs`: the processor class ``processor_cls`` with the tokenizer, image processor (its
    default backend, as a user with torchvision has it), chat template and options saved in ``source_dir`` and its
    real video processor built with ``video_settings``, written to ``folder`` in ``layout`` (:data:`LAYOUTS`);
    ``features``: a ``WhisperFeatureExtractor``'s keywords, as for :func:`processor_job`."""
    if processor_cls not in VIDEO_PROCESSORS:
        raise ValueError(f"processor class {processor_cls!r}: one of {sorted(VIDEO_PROCESSORS)}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: one of {LAYOUTS}")
    return {"what": "save", "cls": processor_cls, "video_cls": VIDEO_PROCESSORS[processor_cls],
            "dir": os.fspath(source_dir), "settings": dict(video_settings), "out": os.fspath(folder),
            "layout": layout, "calls": [], **({"features": dict(features)} if features is not None else {})}


def folder_job(folder: str | os.PathLike[str], calls: Sequence[Mapping[str, Any]]) -> dict:
    """A job for :func:`run_jobs`: ``AutoProcessor.from_pretrained(folder)`` (transformers reading the folder its own
    way, video processor included), called once per call as in :func:`processor_job`. Each call's outputs also hold
    ``video_processor``: the loaded video processor's ``to_dict()`` as JSON text."""
    return {"what": "folder", "dir": os.fspath(folder), "calls": _calls(calls)}


def example_job(module: str, tokenizer_dir: str | os.PathLike[str], folder: str | os.PathLike[str],
                calls: Sequence[Mapping[str, Any]]) -> dict:
    """A job for :func:`run_jobs`: ``examples/tiny_vlm/{module}.py``'s ``processor(tokenizer_dir)`` built in the child,
    where torchvision gives it its real video processor, written to ``folder`` by its own ``save_pretrained``, then
    called once per call as in :func:`processor_job` (images with the Pillow backend the example names)."""
    return {"what": "example", "module": module, "tokenizer_dir": os.fspath(tokenizer_dir), "out": os.fspath(folder),
            "calls": _calls(calls)}


def _calls(calls: Sequence[Mapping[str, Any]]) -> list[dict]:
    return [{"text": c["text"], "videos": [os.fspath(v) for v in c.get("videos") or []],
             "images": None if c.get("images") is None else [os.fspath(i) for i in c["images"]],
             "audio": None if c.get("audio") is None else [os.fspath(a) for a in c["audio"]],
             "kwargs": dict(c.get("kwargs") or {})} for c in calls]


def video_processor_outputs(kind: str, clips: Sequence[str | os.PathLike[str]],
                            settings: Mapping[str, Any]) -> list[dict[str, np.ndarray]]:
    """Per clip: every tensor the video processor returns (``pixel_values_videos``, ``video_grid_thw``, ...), the
    ``frames_indices`` the processor sampled and the metadata it was given (``total_num_frames``, ``fps``,
    ``width``, ``height``).

    Example:
        >>> out = video_processor_outputs("qwen2_vl", ["a.mp4"], {"do_sample_frames": True, "fps": 2.0})
        >>> out[0]["video_grid_thw"], out[0]["frames_indices"]  # doctest: +SKIP
    """
    return run_jobs([video_processor_job(kind, clips, settings)])[0]


def processor_outputs(processor_dir: str | os.PathLike[str], processor_cls: str, video_settings: Mapping[str, Any],
                      calls: Sequence[Mapping[str, Any]]) -> list[dict[str, np.ndarray]]:
    """Per call, every tensor the whole processor returns (``input_ids``, ``pixel_values_videos``,
    ``video_grid_thw``, ``second_per_grid_ts``, ``pixel_values``, ...) as numpy."""
    return run_jobs([processor_job(processor_dir, processor_cls, video_settings, calls)])[0]


def run_jobs(jobs: Sequence[Mapping[str, Any]], *, timeout_s: float = 600) -> list[list[dict[str, np.ndarray]]]:
    """Every job's outputs, computed in one child process (the session's, inside :func:`shared_child`); skips the
    test when torchvision's folder is missing."""
    import pytest

    if not (FOLDER / "torchvision").is_dir():
        pytest.skip(f"the video reference needs torchvision in {FOLDER}: run `make env`")
    with tempfile.TemporaryDirectory(prefix="video-reference-") as out:
        request = {"out": out, "jobs": list(jobs)}
        if _SHARED is not None:
            _SHARED.run(request, timeout_s=timeout_s)
        else:
            done = subprocess.run([sys.executable, "-m", "tests.support.video_reference"], input=json.dumps(request),
                                  capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, env=_child_env())
            assert done.returncode == 0, f"the video reference failed:\n{done.stderr[-3000:]}"
        results = []
        for j, job in enumerate(jobs):
            count = len(job["clips"] if job["what"] == "video_processor" else job["calls"])
            results.append([_load(Path(out) / f"{j}-{k}.npz") for k in range(count)])
        return results


def _child_env() -> dict[str, str]:
    # the child finds torchvision's folder and this package through PYTHONPATH, run as a module from the root
    # (as a script, this folder would come first on its path and shadow what transformers imports)
    path = os.pathsep.join([os.fspath(FOLDER), os.fspath(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}


class _Child:
    """One child kept for many requests (``--serve``): a request is a line of JSON on its stdin, the answer a line
    on its stdout (``{"ok": true}`` once the arrays are written, or the error); its stderr goes to a file, read
    back when a request fails. Started at the first request; a failed or timed-out one ends it (the next starts
    a fresh child)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._log: Any = None

    def run(self, request: Mapping[str, Any], *, timeout_s: float) -> None:
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died: told below with its stderr
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        if not ready:
            self.close()
            raise subprocess.TimeoutExpired("the video reference", timeout_s)
        line = proc.stdout.readline()
        answer = json.loads(line) if line.strip() else {"ok": False, "error": f"it exited ({proc.poll()})"}
        if not answer["ok"]:
            stderr = self._stderr()
            self.close()
            raise AssertionError(f"the video reference failed:\n{answer['error']}\n{stderr[-3000:]}")

    def _start(self) -> None:
        self.close()
        self._log = tempfile.TemporaryFile(prefix="video-reference-", suffix=".log")  # noqa: SIM115 (closed in close())
        self._proc = subprocess.Popen([sys.executable, "-m", "tests.support.video_reference", "--serve"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                      cwd=ROOT, env=_child_env())

    def _stderr(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()  # end of requests: it exits
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None


#: The child :func:`run_jobs` uses inside :func:`shared_child`.
_SHARED: _Child | None = None


@contextlib.contextmanager
def shared_child() -> Iterator[None]:
    """Within it, :func:`run_jobs` sends every call's jobs to one child (started at the first call, ended here)
    instead of a child per call. ``tests/conftest.py``'s session fixture ``video_reference`` holds it open."""
    global _SHARED
    if _SHARED is not None:  # already open (nested): the outer one ends it
        yield
        return
    _SHARED = _Child()
    try:
        yield
    finally:
        child, _SHARED = _SHARED, None
        child.close()


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as arrays:
        return {k: arrays[k] for k in arrays.files}


# ---- the child process ------------------------------------------------------------------------------------------


def _child() -> None:
    """One request read from stdin to its end (:func:`run_jobs` without a shared child)."""
    request = json.loads(sys.stdin.read())
    transformers = _setup()
    _serve(transformers, request)


def _serve_forever() -> None:
    """``--serve``: a request per line of stdin until it closes, each answered on a line of stdout. Anything else
    that writes to stdout (a library's print) is sent to stderr, so the answers stay whole."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    transformers = _setup()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            _serve(transformers, json.loads(line))
            answer: dict[str, Any] = {"ok": True}
        except Exception:  # told to the parent, which fails the test with it
            answer = {"ok": False, "error": traceback.format_exc()}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
    sys.stderr.flush()
    os._exit(0)  # every answer given: no interpreter teardown to wait for (seconds, with torch and transformers)


def _setup() -> Any:
    """torchvision made importable, transformers imported, its tokenizers loaded once: the module ``transformers``."""
    import torch

    library = torch.library.Library("torchvision", "DEF")
    _LIBRARIES.append(library)  # kept alive for the process's life
    for schema in SCHEMAS:
        library.define(schema)
    import torchvision  # noqa: F401  (now importable: its transforms are Python)
    import transformers
    from transformers.utils import is_torchvision_available

    assert is_torchvision_available(), "torchvision did not import in the video reference's process"
    _load_tokenizers_once()
    return transformers


#: torchvision's operator declarations, kept for the process's life.
_LIBRARIES: list[Any] = []


def _serve(transformers: Any, request: Mapping[str, Any]) -> None:
    """Every job of ``request``: its arrays written as ``{out}/{job}-{k}.npz``."""
    out = Path(request["out"])
    for j, job in enumerate(request["jobs"]):
        if job["what"] == "example":
            import importlib

            processor = importlib.import_module(f"examples.tiny_vlm.{job['module']}").processor(job["tokenizer_dir"])
            processor.save_pretrained(job["out"])
            _run_calls(processor, job, out / str(j))
            continue
        if job["what"] == "folder":
            processor = transformers.AutoProcessor.from_pretrained(job["dir"])
            _run_calls(processor, job, out / str(j), video_processor=json.dumps(processor.video_processor.to_dict()))
            continue
        video_cls = getattr(transformers, job["cls"] if job["what"] == "video_processor" else job["video_cls"])
        settings = dict(job["settings"])
        if "cap_pixels_per_frame" in getattr(video_cls, "valid_kwargs", object).__annotations__:
            settings.setdefault("cap_pixels_per_frame", False)  # explicit: its default warns it will change
        video_processor = video_cls(**settings)
        if job["what"] == "video_processor":
            for k, clip in enumerate(job["clips"]):
                frames, meta = _decode(clip)
                got = video_processor(videos=[frames], video_metadata=[meta], return_metadata=True,
                                      return_tensors="pt")
                used = got["video_metadata"][0]
                indices = used.frames_indices if used.frames_indices is not None else range(len(frames))
                tensors = {key: value.numpy() for key, value in got.items() if hasattr(value, "numpy")}
                np.savez(out / f"{j}-{k}.npz", **tensors, frames_indices=np.asarray(indices, np.int64),
                         total_num_frames=np.int64(meta.total_num_frames), fps=np.float64(meta.fps),
                         width=np.int64(meta.width), height=np.int64(meta.height))
        elif job["what"] == "save":
            _save(_processor(transformers, job, video_processor, backend=None), Path(job["out"]), job["layout"])
        else:
            _run_calls(_processor(transformers, job, video_processor), job, out / str(j))


def _run_calls(processor: Any, job: Mapping[str, Any], prefix: Path, **extra: str) -> None:
    """Each call of ``job`` through ``processor``: every tensor it returns (and ``extra``) in ``{prefix}-{k}.npz``."""
    import torch

    for k, call in enumerate(job["calls"]):
        decoded = [_decode(v) for v in call["videos"]]
        kwargs: dict[str, Any] = dict(call["kwargs"])
        if decoded:
            kwargs.update(videos=[f for f, _ in decoded], video_metadata=[m for _, m in decoded])
        images = None if call["images"] is None else [_image(p) for p in call["images"]]
        if call.get("audio") is not None:
            kwargs["audio"] = [np.load(a) for a in call["audio"]]
        got = processor(text=[call["text"]], images=images, return_tensors="pt", **kwargs)
        arrays = {key: value.numpy() for key, value in got.items() if isinstance(value, torch.Tensor)}
        np.savez(f"{prefix}-{k}.npz", **arrays, **{key: np.asarray(value) for key, value in extra.items()})


def _save(processor: Any, folder: Path, layout: str) -> None:
    """``processor`` in ``folder``: its own ``save_pretrained`` (5.x), or as transformers 4 wrote it (4.x): the
    tokenizer's files, ``preprocessor_config.json`` and ``video_preprocessor_config.json`` (each naming the
    processor class), ``processor_config.json`` only where the processor has options of its own, the template."""
    if layout == "5.x":
        processor.save_pretrained(folder)
        return
    cls = type(processor).__name__
    folder.mkdir(parents=True, exist_ok=True)
    processor.tokenizer._set_processor_class(cls)
    processor.tokenizer.save_pretrained(folder)
    for part, name in (("image_processor", "preprocessor_config.json"),
                       ("video_processor", "video_preprocessor_config.json")):
        settings = getattr(processor, part).to_dict()
        settings["processor_class"] = cls
        (folder / name).write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
    options = {k: v for k, v in processor.to_dict().items()
               if k not in ("image_processor", "video_processor", "tokenizer", "chat_template", "processor_class")}
    if options:
        (folder / "processor_config.json").write_text(json.dumps({**options, "processor_class": cls}, indent=2))
    (folder / "chat_template.jinja").write_text(processor.chat_template)


def _decode(path: str) -> tuple[np.ndarray, Any]:
    """Every frame (PyAV, RGB) and the metadata the processor samples from: the frames the decoder gives
    (a WebM header has no count), the stream's average rate, the size."""
    import av
    from transformers.video_utils import VideoMetadata

    with av.open(path) as container:
        stream = container.streams.video[0]
        rate = float(stream.average_rate or stream.guessed_rate)
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)])
    meta = VideoMetadata(total_num_frames=len(frames), fps=rate, width=frames.shape[2], height=frames.shape[1],
                         duration=len(frames) / rate, video_backend="pyav")
    return frames, meta


def _image(path: str) -> Any:
    from PIL import Image

    with Image.open(path) as image:
        image.load()
        return image.copy()


#: Tokenizers loaded in the child, by their files (a 131k vocabulary takes seconds to load, or to copy).
_TOKENIZERS: dict[tuple[str, str], Any] = {}


def _tokenizer(folder: str | os.PathLike[str]) -> Any:
    """``AutoTokenizer.from_pretrained(folder)``, loaded once per distinct ``tokenizer.json`` and
    ``tokenizer_config.json`` (but its ``processor_class``, which ``save_pretrained`` writes) and shared by the
    processors built on the same files (they read it; a save sets its processor class first)."""
    import hashlib

    from transformers import AutoTokenizer

    files = Path(folder, "tokenizer.json"), Path(folder, "tokenizer_config.json")
    if not all(f.is_file() for f in files):
        return AutoTokenizer.from_pretrained(folder)
    config = {k: v for k, v in json.loads(files[1].read_text()).items() if k != "processor_class"}
    key = hashlib.sha256(files[0].read_bytes()).hexdigest(), json.dumps(config, sort_keys=True)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = AutoTokenizer.from_pretrained(folder)
    return _TOKENIZERS[key]


def _load_tokenizers_once() -> None:
    """``AutoProcessor.from_pretrained`` takes its tokenizer from :func:`_tokenizer`; the rest it reads as it does."""
    from transformers.processing_utils import ProcessorMixin

    own = ProcessorMixin._load_tokenizer_from_pretrained.__func__  # type: ignore[attr-defined]

    def load(cls: Any, sub_processor_type: str, name: Any, subfolder: str = "", **kwargs: Any) -> Any:
        if sub_processor_type == "tokenizer" and not subfolder and Path(name).is_dir():
            return _tokenizer(name)
        return own(cls, sub_processor_type, name, subfolder=subfolder, **kwargs)

    ProcessorMixin._load_tokenizer_from_pretrained = classmethod(load)  # type: ignore[method-assign,assignment]


def _processor(transformers: Any, job: Mapping[str, Any], video_processor: Any, *, backend: str | None = "pil") -> Any:
    """The processor class of ``job`` from the tokenizer, image processor, template and options in its folder, with
    ``video_processor``; images with the Pillow backend as in the package's environment (None: transformers' default
    backend, as a user with torchvision has it)."""
    from transformers import AutoImageProcessor

    tokenizer = _tokenizer(job["dir"])
    images = AutoImageProcessor.from_pretrained(job["dir"], **({"backend": backend} if backend else {}))
    template = Path(job["dir"], "chat_template.jinja")
    cls = getattr(transformers, job["cls"])
    # the processor's own settings (LLaVA-OneVision's num_image_tokens, ...): those its constructor names
    saved = Path(job["dir"], "processor_config.json")
    named = inspect.signature(cls.__init__).parameters
    settings = {k: v for k, v in (json.loads(saved.read_text()) if saved.is_file() else {}).items()
                if k in named and k not in ("image_processor", "tokenizer", "video_processor", "chat_template")}
    if "features" in job:
        settings["feature_extractor"] = transformers.WhisperFeatureExtractor(**job["features"])
    return cls(image_processor=images, tokenizer=tokenizer, video_processor=video_processor,
               chat_template=template.read_text() if template.is_file() else None, **settings)


if __name__ == "__main__":
    _serve_forever() if sys.argv[1:] == ["--serve"] else _child()
