"""Qwen2.5-Omni's thinker: Qwen2.5-VL's images and videos, Whisper-featured audio, 3-D positions over all three.

The chat template writes ``<|audio_bos|><|AUDIO|><|audio_eos|>`` per audio, ``<|vision_bos|><|IMAGE|><|vision_eos|>``
per image and ``<|vision_bos|><|VIDEO|><|vision_eos|>`` per video; the processor repeats each feature token
(audio: ``T = ((L-1)//2 + 1 - 2)//2 + 1`` for ``L = min(ceil(n/160), window)`` feature frames, 25 a second).
Positions, per sub-sample (the thinker's own ``get_rope_index`` of that sub-sample alone)::

    tokens     <s> hi <ab> [A] [A] [A] <ae> <vb> [I] [I] [I] [I] <ve> ok    (image grid 1×4×4, merge 2)
    row 0       0   1   2   3   4   5   6    7   8   9  10  11  12  13     restarts per sub-sample
    temporal    0   1   2   3   4   5   6    7   8   8   8   8  10  11     audio counts on like text
    height      0   1   2   3   4   5   6    7   8   8   9   9  10  11
    width       0   1   2   3   4   5   6    7   8   9   8   9  10  11

An audio's feature frames travel as rows (``input_features`` ``[B·R, 128]``, ``R`` = the frames the pack's audio
tokens can need, ``audio_frame_mask``), ``audio_feature_lengths`` and ``audio_mask`` in ``max_images`` slots (the
budget counts every media item); ``model_kwargs`` lays them out as the thinker's ``[k, 128, F]`` with its
``feature_attention_mask`` (the encoder reads the masked frames only, so the padding is never seen).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from ...errors import FormatError
from ...media.audio.tokens import AudioRule, qwen2_5_omni_frames, qwen2_5_omni_tokens
from ...media.video.plan import plan_qwen2_vl
from ..family import AudioSide, Budgets, Family, ImageSide, Rows, VideoSide, take_rows
from .qwen2_audio import whisper_rule
from .qwen_vl import QWEN2_VIDEO, _pad_pixels, _pixels, _replacements, _video_token

__all__ = ["FAMILIES", "QWEN2_5_OMNI", "omni_positions", "pad_frame_rows", "with_audio"]

_HOP = 160


def _audio_token(processor: Any) -> str:
    return str(processor.audio_token)


def _image_token(processor: Any) -> str:
    return str(processor.image_token)


def _rule(processor: Any, settings: Mapping[str, Any] | None) -> AudioRule:
    """Qwen2.5-Omni's arithmetic under the feature extractor's settings: its window (``n_samples``, or
    ``chunk_length`` seconds; the published 300 s) is where ``_process_audio`` pads and cuts."""
    return whisper_rule("qwen2_5_omni", settings, frames=qwen2_5_omni_frames, tokens=qwen2_5_omni_tokens,
                        min_samples=321, default_samples=4_800_000)


def _features(processor: Any, waves: Sequence[Any]) -> dict[str, Any]:
    """``Qwen2_5OmniProcessor._process_audio``'s own call (padded to the window, cut there, with the frame mask),
    each audio's real frames kept as a ``[L, bins]`` block of rows."""
    fe = processor.feature_extractor
    out = fe(list(waves), sampling_rate=fe.sampling_rate, return_attention_mask=True, padding="max_length",
             return_tensors="pt")
    lengths = out["attention_mask"].sum(-1).to(torch.int64)
    blocks = tuple(f[:, :n].T.contiguous() for f, n in zip(out["input_features"], lengths.tolist()))
    return {"input_features": blocks, "audio_feature_lengths": lengths}


def _audio_tokens(frames: int) -> int:
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def audio_rows(processor: Any, budgets: Budgets) -> int:
    """Feature-frame rows per pack: ``T`` tokens come from at most ``4T + 2`` frames, so the pack's audio tokens
    bound its frames (and each audio the window)."""
    most = int(budgets.max_audio_tokens or 0)
    return min(4 * most + 2 * budgets.max_images, budgets.max_images * int(processor.feature_extractor.nb_max_frames))


def _pad_audio(out: Mapping[str, Any], processor: Any, budgets: Budgets, audio_tokens: Sequence[int]
               ) -> dict[str, torch.Tensor | Rows]:
    return pad_frame_rows(out, processor, budgets, audio_tokens, rows=audio_rows(processor, budgets),
                          count=_audio_tokens)


def pad_frame_rows(out: Mapping[str, Any], processor: Any, budgets: Budgets, audio_tokens: Sequence[int], *,
                   rows: int, count: Any) -> dict[str, torch.Tensor | Rows]:
    """The Omni thinkers' audio at static shapes: each audio's real feature frames as :class:`Rows` (``rows`` per
    pack), ``audio_frame_mask``, and ``audio_feature_lengths`` / ``audio_mask`` in ``max_images`` slots; the
    frames' tokens (``count(frames)``) checked against what the pack reserved."""
    M, R = budgets.max_images, rows
    bins = int(processor.feature_extractor.feature_size)
    k = len(audio_tokens)
    lengths = torch.zeros(M, dtype=torch.int64)
    blocks: tuple[torch.Tensor, ...] = (torch.zeros(0, bins),)
    n = 0
    if k:
        got = out["audio_feature_lengths"]
        tokens = [count(int(f)) for f in got.tolist()]
        if tokens != list(audio_tokens):
            raise FormatError(f"the audio features give {tokens} tokens but the pack reserved {list(audio_tokens)}; "
                              "load with the processor (and settings) the dataset was packed with")
        n = int(got.sum())
        if k > M or n > R:
            raise FormatError(f"{k} audios of {n} feature frames do not fit the {M} slots and {R} frame rows the "
                              "dataset's manifest gives a pack")
        lengths[:k], blocks = got, tuple(out["input_features"])
    return {"input_features": Rows(blocks, R), "audio_frame_mask": torch.arange(R) < n,
            "audio_feature_lengths": lengths, "audio_mask": torch.arange(M) < k}


@functools.cache
def _rope_index() -> Any:
    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as m

    return m.Qwen2_5OmniPreTrainedModelForConditionalGeneration


def _stand_in(processor: Any) -> Any:
    """What ``get_rope_index`` reads of its model, from the processor (its token ids, its time settings)."""
    tok, cls = processor.tokenizer, _rope_index()
    ids = {name: int(tok.convert_tokens_to_ids(str(getattr(processor, attr)))) for name, attr in (
        ("image_token_id", "image_token"), ("video_token_id", "video_token"), ("audio_token_id", "audio_token"),
        ("vision_start_token_id", "vision_bos_token"), ("audio_start_token_id", "audio_bos_token"))}
    config = types.SimpleNamespace(**ids, position_id_per_seconds=processor.position_id_per_seconds,
                                   seconds_per_chunk=processor.seconds_per_chunk)
    model = types.SimpleNamespace(config=config, spatial_merge_size=int(processor.image_processor.merge_size))
    model.get_llm_pos_ids_for_vision = functools.partial(cls.get_llm_pos_ids_for_vision, model)
    model.get_chunked_index = functools.partial(cls.get_chunked_index, model)
    return model


def omni_positions(input_ids: torch.Tensor, seq_lens: Sequence[int], outputs: Mapping[str, Any],
                   processor: Any) -> torch.Tensor:
    """``[3, L]`` positions of one pack: each sub-sample's from the thinker's own ``get_rope_index`` on it alone,
    with its images' and videos' grids and its audio's feature lengths; padding counts ``0, 1, 2, …``."""
    model = _stand_in(processor)
    cfg = model.config
    merge = model.spatial_merge_size
    media = {
        "image": (cfg.image_token_id, outputs.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.int64))),
        "video": (cfg.video_token_id, outputs.get("video_grid_thw", torch.zeros(0, 3, dtype=torch.int64))),
    }
    seconds = outputs.get("second_per_grid_ts", torch.zeros(0))
    lengths = outputs.get("audio_feature_lengths", torch.zeros(0, dtype=torch.int64))
    taken = {"image": 0, "video": 0, "audio": 0}
    L = input_ids.shape[0]
    out = torch.empty(3, L, dtype=torch.int64)
    start = 0
    for n in seq_lens:
        ids = input_ids[start:start + n]
        grids: dict[str, torch.Tensor | None] = {}
        for kind, (token, all_grids) in media.items():
            want, k = int((ids == token).sum()), taken[kind]
            first = k
            while want > 0:
                if k >= len(all_grids):
                    raise FormatError(f"a sub-sample has more {kind} tokens than the pack's {kind} grids give")
                want -= int(all_grids[k].prod()) // (merge * merge)
                k += 1
            grids[kind] = all_grids[first:k] if k > first else None
            taken[kind] = k
        audios = int((ids == cfg.audio_start_token_id).sum())
        seqlens = lengths[taken["audio"]:taken["audio"] + audios]
        per_grid = seconds[taken["video"] - (len(grids["video"]) if grids["video"] is not None else 0):taken["video"]]
        taken["audio"] += audios
        if grids["image"] is None and grids["video"] is None:
            out[:, start:start + n] = torch.arange(n)
        else:  # a video with its own sound opens <|vision_bos|><|audio_bos|>: the thinker's use_audio_in_video
            starts = (ids[:-1] == cfg.vision_start_token_id) & (ids[1:] == cfg.audio_start_token_id)
            rope, _ = _rope_index().get_rope_index(model, ids[None], grids["image"], grids["video"], None,
                                                   bool(starts.any()), seqlens, per_grid)
            out[:, start:start + n] = rope[:, 0]
        start += n
    out[:, start:] = torch.arange(L - start)
    return out


def _token_rows(input_ids: torch.Tensor, seq_lens: Sequence[int], outputs: Mapping[str, Any],
                processor: Any) -> dict[str, torch.Tensor]:
    return {"mrope_position_ids": omni_positions(input_ids, seq_lens, outputs, processor)}


def _finish(batch: dict[str, Any]) -> dict[str, Any]:
    rope = batch.pop("mrope_position_ids")
    batch["position_ids"] = torch.cat([batch["position_ids"][None], rope])
    return batch


def _audio_kwargs(batch: Mapping[str, Any], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The pack's frame rows as the thinker takes them: ``input_features`` ``[k, bins, F]`` and its
    ``feature_attention_mask`` (the inverse of the encoder's own selection of the masked frames)."""
    rows = take_rows(batch["input_features"], batch["audio_frame_mask"])
    lengths = take_rows(batch["audio_feature_lengths"], batch["audio_mask"])
    longest = int(lengths.max())
    mask = torch.arange(longest, device=lengths.device) < lengths[:, None]
    features = rows.new_zeros(len(lengths), longest, rows.shape[1])
    features[mask] = rows
    return {"input_features": features.transpose(1, 2).to(dtype), "feature_attention_mask": mask.to(torch.int64)}


def _model_kwargs(batch: Mapping[str, Any], model: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
    if "image_mask" in batch and bool(batch["image_mask"].any()):
        kwargs["pixel_values"] = take_rows(batch["pixel_values"], batch["patch_mask"])
        kwargs["image_grid_thw"] = take_rows(batch["image_grid_thw"], batch["image_mask"])
    if "video_mask" in batch and bool(batch["video_mask"].any()):
        kwargs["pixel_values_videos"] = take_rows(batch["pixel_values_videos"], batch["video_patch_mask"])
        kwargs["video_grid_thw"] = take_rows(batch["video_grid_thw"], batch["video_mask"])
        kwargs["video_second_per_grid"] = take_rows(batch["second_per_grid_ts"], batch["video_mask"])
    if "audio_mask" in batch and bool(batch["audio_mask"].any()):
        kwargs.update(_audio_kwargs(batch, next(model.parameters()).dtype))
    return kwargs


def _sampling(processor: Any, config: Mapping[str, Any] | None) -> Any:
    """The video processor's settings with the processor class's own ``videos_kwargs`` over them
    (``Qwen2_5OmniProcessor.videos_kwargs``: frames of 128·28² to 768·28² pixels), as its call merges them: they win
    over the video processor's saved ``size`` unless the call passes one (the user's ``--video-*`` settings)."""
    base = QWEN2_VIDEO.sampling(processor, config)
    size = dict(getattr(type(processor), "videos_kwargs", {}) or {}).get("size") or {}
    if "shortest_edge" in size and "longest_edge" in size:
        base = replace(base, min_pixels=int(size["shortest_edge"]), max_pixels=int(size["longest_edge"]))
    return base


def with_audio(processor: Any, plan: Any, audio_tokens: int) -> str:
    """``Qwen2_5OmniProcessor.replace_video_with_audio_token``'s text for a video with its own sound: between
    ``<|audio_bos|>`` and ``<|audio_eos|>`` (the template's ``<|vision_bos|>``/``<|vision_eos|>`` around it), per
    ``seconds_per_chunk`` of time the video tokens whose time id (``t · second_per_grid · position_id_per_seconds``)
    falls in it, then that chunk's audio tokens (25 a second), chunked by the processor's own ``get_chunked_index``.

    Example:
        >>> with_audio(processor, plan_of_grid_2x4x4_at_1s, 60)  # doctest: +SKIP
        '<|audio_bos|>' + '<|VIDEO|>' * 4 + '<|AUDIO|>' * 50 + '<|VIDEO|>' * 4 + '<|AUDIO|>' * 10 + '<|audio_eos|>'
    """
    import numpy as np

    t, h, w = (int(v) for v in plan.grid)
    merge = int(processor.image_processor.merge_size)
    per_second = processor.position_id_per_seconds
    times = np.broadcast_to(np.arange(t).reshape(-1, 1, 1), (t, h // merge, w // merge)).reshape(-1)
    times = times * plan.second_per_grid_t * per_second
    per_chunk = int(per_second * processor.seconds_per_chunk)
    video = processor.get_chunked_index(times, per_chunk)
    audio = processor.get_chunked_index(np.arange(audio_tokens), per_chunk)
    text = [str(processor.audio_bos_token)]
    for j in range(max(len(video), len(audio))):
        if j < len(video):
            text.append(_video_token(processor) * int(video[j][1] - video[j][0]))
        if j < len(audio):
            text.append(_audio_token(processor) * int(audio[j][1] - audio[j][0]))
    return "".join(text) + str(processor.audio_eos_token)


def _video_plan(header: Any, settings: Any) -> Any:
    """Qwen2.5-VL's plan, with the seconds per temporal patch as ``Qwen2_5OmniProcessor._process_videos`` gives
    them: ``temporal_patch_size / fps`` (the sampling fps, 2.0 where none is given), not the frames' own times."""
    plan = plan_qwen2_vl(header, settings)
    return replace(plan, second_per_grid_t=settings.temporal_patch_size / (settings.fps or 2.0))


#: Qwen2.5-Omni's videos: Qwen2.5-VL's frames and pixels, its ``<|VIDEO|>`` token and its seconds per patch.
#: A video with its own sound interleaves with it (``with_audio``; :mod:`wdspack.media.audio.link`).
OMNI_VIDEO = VideoSide(placeholder=_video_token, feature_token=_video_token, sampling=_sampling,
                       plan=_video_plan, replacement=QWEN2_VIDEO.replacement, pixels=QWEN2_VIDEO.pixels,
                       pad=QWEN2_VIDEO.pad, with_audio=with_audio)

QWEN2_5_OMNI = Family(
    name="qwen2_5_omni", processors=("Qwen2_5OmniProcessor",), model_types=("qwen2_5_omni_thinker",),
    image=ImageSide(replacements=_replacements, pixels=_pixels, pad=_pad_pixels, uint8_pixels=True,
                    feature_token=_image_token, placeholder=_image_token),
    token_rows=_token_rows, token_keys=("mrope_position_ids",), finish_batch=_finish, model_kwargs=_model_kwargs,
    video=OMNI_VIDEO,
    audio=AudioSide(placeholder=_audio_token, feature_token=_audio_token, rule=_rule,
                    replacement=lambda processor, tokens: _audio_token(processor) * tokens, features=_features,
                    pad=_pad_audio),
    notes="thinker: Qwen2.5-VL's images and videos, Whisper audio (25 <|AUDIO|> a second, cut at the 300 s "
          "window); position_ids [4, B, L] (text row + the thinker's 3-D rows); input_features as frame rows "
          "[B·R, 128] with audio_frame_mask, audio_feature_lengths and audio_mask [B·M]",
)

FAMILIES = (QWEN2_5_OMNI,)
