"""Turn an audio reference from a record into the audio file's bytes, undecoded.

An audio is referred to as an image or a video is (:mod:`wdspack.media.source`): bytes, a path relative to
the image root (which serves audio too), an absolute path only when no root was given, ``file://``, a
``{"bytes", "path"}`` struct, an ``audio_url`` dict or a ``data:audio/...;base64,`` URL; also OpenAI's
``input_audio`` (``{"data": base64, "format": "wav"}``). Remote URLs are refused. What holds:

- a file that does not exist is ``missing_audio``, a path out of its root ``audio_path_escape``;
- an empty file is ``unreadable_audio``, one over :data:`~.header.MAX_AUDIO_BYTES` (not read) ``audio_too_large``;
- a decoded array (a Hugging Face ``Audio`` column's ``{"array", "sampling_rate"}``) is ``malformed_record``;
- nothing is decoded or probed here: the sample builder probes the bytes (:func:`~.header.probe_audio`).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from ...errors import SampleError
from ..source import image_name, load_media
from .header import MAX_AUDIO_BYTES

__all__ = ["load_audio", "audio_name"]


def load_audio(ref: Any, image_root: str, *, absolute_ok: bool = False) -> bytes:
    """The bytes of the audio file ``ref`` stands for, as stored.

    Raises:
        SampleError: ``missing_audio``, ``audio_path_escape``, ``unreadable_audio`` (empty),
            ``audio_too_large`` (over :data:`~.header.MAX_AUDIO_BYTES`) or ``malformed_record``.

    Example:
        >>> load_audio({"data": "UklGRg==", "format": "wav"}, "/data")
        b'RIFF'
    """
    if isinstance(ref, dict) and "array" in ref:
        raise SampleError("malformed_record", "an audio is given as decoded samples ('array'); give the encoded "
                          "file (a path or its bytes: a Hugging Face Audio column cast with decode=False)")
    if isinstance(ref, (list, tuple)):
        raise SampleError("malformed_record", f"an audio is given as a list of {len(ref)} values; give the audio "
                          "file (a path or its bytes)")
    if isinstance(ref, dict) and isinstance(ref.get("input_audio"), dict):
        ref = ref["input_audio"]
    if isinstance(ref, dict) and isinstance(ref.get("data"), str):  # OpenAI's input_audio: base64, no data: prefix
        try:
            data = base64.b64decode(ref["data"], validate=True)
        except (binascii.Error, ValueError):
            raise SampleError("malformed_record", "an input_audio's data is not valid base64") from None
    else:
        try:
            data = load_media(ref, image_root, what="audio", absolute_ok=absolute_ok, max_bytes=MAX_AUDIO_BYTES)
        except SampleError as e:
            if e.reason != "unreadable_audio":  # load_media's only unreadable_* is the size limit
                raise
            raise SampleError("audio_too_large", e.detail, e.sample_id) from None
    if len(data) > MAX_AUDIO_BYTES:
        raise SampleError("audio_too_large", f"an inline audio is {len(data):,} bytes, over the "
                          f"{MAX_AUDIO_BYTES:,}-byte limit; cut it into shorter clips")
    if not data:
        shown = audio_name(ref)
        raise SampleError("unreadable_audio", f"audio {shown!r} is empty (0 bytes); re-export the file or leave "
                          "the record out" if shown else "an audio given as inline bytes is empty (0 bytes); give "
                          "the file's bytes or leave the record out")
    return data


def audio_name(ref: Any) -> str:
    """How a drop detail names an audio: its path, or ``""`` for inline bytes.

    Example:
        >>> audio_name("clips/a.wav"), audio_name({"audio_url": {"url": "b.mp3"}}), audio_name(b"...")
        ('clips/a.wav', 'b.mp3', '')
    """
    if isinstance(ref, dict):
        for key in ("path", "url", "audio_url", "audio", "input_audio"):
            if ref.get(key) is not None:
                return audio_name(ref[key])
        return ""
    return image_name(ref)
