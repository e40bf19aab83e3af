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
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: The checkout's root (the child runs this module from there).
ROOT = Path(__file__).resolve().parents[2]
#: Where ``make env`` puts torchvision for this reference only.
FOLDER = Path(sys.prefix) / "video-reference"

#: The video processor of each kind.
KINDS = {"qwen2_vl": "Qwen2VLVideoProcessor", "qwen3_vl": "Qwen3VLVideoProcessor",
         "llava_onevision": "LlavaOnevisionVideoProcessor"}

#: The video processor each processor class takes.
VIDEO_PROCESSORS = {"Qwen2VLProcessor": "Qwen2VLVideoProcessor", "Qwen2_5_VLProcessor": "Qwen2VLVideoProcessor",
                    "Qwen3VLProcessor": "Qwen3VLVideoProcessor",
                    "LlavaOnevisionProcessor": "LlavaOnevisionVideoProcessor"}

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
                  calls: Sequence[Mapping[str, Any]]) -> dict:
    """A job for :func:`run_jobs`: the processor class ``processor_cls`` with the tokenizer and (Pillow)
    image processor saved in ``processor_dir`` and its real video processor built with ``video_settings``,
    called once per call ``{"text": str, "videos": [path, ...], "images": [path, ...] or None,
    "kwargs": {...}}``."""
    if processor_cls not in VIDEO_PROCESSORS:
        raise ValueError(f"processor class {processor_cls!r}: one of {sorted(VIDEO_PROCESSORS)}")
    return {"what": "processor", "cls": processor_cls, "video_cls": VIDEO_PROCESSORS[processor_cls],
            "dir": os.fspath(processor_dir), "settings": dict(video_settings),
            "calls": [{"text": c["text"], "videos": [os.fspath(v) for v in c.get("videos") or []],
                       "images": None if c.get("images") is None else [os.fspath(i) for i in c["images"]],
                       "kwargs": dict(c.get("kwargs") or {})} for c in calls]}


def video_processor_outputs(kind: str, clips: Sequence[str | os.PathLike[str]],
                            settings: Mapping[str, Any]) -> list[dict[str, np.ndarray]]:
    """Per clip: ``pixel_values_videos``, ``video_grid_thw``, the ``frames_indices`` the processor sampled
    and the metadata it was given (``total_num_frames``, ``fps``, ``width``, ``height``).

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
    """Every job's outputs, computed in one child process; skips the test when torchvision's folder is missing."""
    import pytest

    if not (FOLDER / "torchvision").is_dir():
        pytest.skip(f"the video reference needs torchvision in {FOLDER}: run `make env`")
    with tempfile.TemporaryDirectory(prefix="video-reference-") as out:
        payload = json.dumps({"out": out, "jobs": list(jobs)})
        # the child finds torchvision's folder and this package through PYTHONPATH, run as a module from the root
        # (as a script, this folder would come first on its path and shadow what transformers imports)
        path = os.pathsep.join([os.fspath(FOLDER), os.fspath(ROOT), os.environ.get("PYTHONPATH", "")])
        done = subprocess.run([sys.executable, "-m", "tests.support.video_reference"], input=payload,
                              capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path})
        assert done.returncode == 0, f"the video reference failed:\n{done.stderr[-3000:]}"
        results = []
        for j, job in enumerate(jobs):
            count = len(job["clips"]) if job["what"] == "video_processor" else len(job["calls"])
            results.append([_load(Path(out) / f"{j}-{k}.npz") for k in range(count)])
        return results


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as arrays:
        return {k: arrays[k] for k in arrays.files}


# ---- the child process ------------------------------------------------------------------------------------------


def _child() -> None:
    request = json.loads(sys.stdin.read())
    import torch

    library = torch.library.Library("torchvision", "DEF")  # kept alive for the process's life
    for schema in SCHEMAS:
        library.define(schema)
    import torchvision  # noqa: F401  (now importable: its transforms are Python)
    import transformers
    from transformers.utils import is_torchvision_available

    assert is_torchvision_available(), "torchvision did not import in the video reference's process"
    out = Path(request["out"])
    for j, job in enumerate(request["jobs"]):
        video_cls = getattr(transformers, job["video_cls"] if job["what"] == "processor" else job["cls"])
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
                np.savez(out / f"{j}-{k}.npz", pixel_values_videos=got["pixel_values_videos"].numpy(),
                         video_grid_thw=got["video_grid_thw"].numpy(), frames_indices=np.asarray(indices, np.int64),
                         total_num_frames=np.int64(meta.total_num_frames), fps=np.float64(meta.fps),
                         width=np.int64(meta.width), height=np.int64(meta.height))
        else:
            processor = _processor(transformers, job, video_processor)
            for k, call in enumerate(job["calls"]):
                decoded = [_decode(v) for v in call["videos"]]
                kwargs: dict[str, Any] = dict(call["kwargs"])
                if decoded:
                    kwargs.update(videos=[f for f, _ in decoded], video_metadata=[m for _, m in decoded])
                images = None if call["images"] is None else [_image(p) for p in call["images"]]
                got = processor(text=[call["text"]], images=images, return_tensors="pt", **kwargs)
                arrays = {key: value.numpy() for key, value in got.items() if isinstance(value, torch.Tensor)}
                np.savez(out / f"{j}-{k}.npz", **arrays)


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


def _processor(transformers: Any, job: Mapping[str, Any], video_processor: Any) -> Any:
    from transformers import AutoImageProcessor, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(job["dir"])
    images = AutoImageProcessor.from_pretrained(job["dir"], backend="pil")  # as in the package's environment
    template = Path(job["dir"], "chat_template.jinja")
    cls = getattr(transformers, job["cls"])
    # the processor's own settings (LLaVA-OneVision's num_image_tokens, ...): those its constructor names
    saved = Path(job["dir"], "processor_config.json")
    named = inspect.signature(cls.__init__).parameters
    settings = {k: v for k, v in (json.loads(saved.read_text()) if saved.is_file() else {}).items()
                if k in named and k not in ("image_processor", "tokenizer", "video_processor", "chat_template")}
    return cls(image_processor=images, tokenizer=tokenizer, video_processor=video_processor,
               chat_template=template.read_text() if template.is_file() else None, **settings)


if __name__ == "__main__":
    _child()
