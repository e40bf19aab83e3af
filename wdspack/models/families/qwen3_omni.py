"""Qwen3-Omni's thinker: Qwen2.5-VL's image and video inputs (16-pixel patches, DeepStack inside the model),
Whisper-featured audio padded to the longest of a sample and never cut, 3-D positions in float over all three.

The chat template writes ``<|audio_start|><|audio_pad|><|audio_end|>`` per audio,
``<|vision_start|><|image_pad|><|vision_end|>`` per image and ``<|vision_start|><|video_pad|><|vision_end|>`` per
video; the processor repeats each feature token (a video: ``t·h·w / merge²``, planned from its header as
``Qwen2VLVideoProcessor`` samples and resizes it, under the processor's own default pixel bounds). Its audio
call pads a chat's audios to the longest, ``N`` samples, so an audio of ``n`` samples gets
``L = min(ceil(n/160), N//160)`` feature frames (``n//160`` alone) and ``13·(L//100) + g(L%100)`` tokens: a
sample's audios are counted together (``sample_tokens``) and featured together in the loader
(``features_per_sample``). Positions, per sub-sample (the thinker's own ``get_rope_index`` of that sub-sample alone)::

    tokens     <s> hi <as> [A] [A] [A] <ae> <vs> [I] [I] [I] [I] <ve> ok    (image grid 1×4×4, merge 2)
    row 0       0   1   2   3   4   5   6    7   8   9  10  11  12  13     restarts per sub-sample
    temporal    0   1   2   3   4   5   6    7   8   8   8   8  10  11     float32; a video's rows at 13 a second
    height      0   1   2   3   4   5   6    7   8   8   9   9  10  11
    width       0   1   2   3   4   5   6    7   8   9   8   9  10  11

Audio frames travel as Qwen2.5-Omni's do (frame rows ``[B·R, 128]`` with ``audio_frame_mask``,
``audio_feature_lengths`` and ``audio_mask`` in ``max_images`` slots; ``R = 8 ×`` the pack's audio tokens).
Exact where every sub-sample with audio has one of at least 100 frames (1 s): the encoder pads all chunks of a call
to its longest chunk and its convolutions' biases reach past a chunk's end, so a sub-sample whose audios are all
shorter gets slightly other audio features in a pack than alone. A video's time axis steps ``13 · s`` a temporal
patch, ``s = temporal_patch_size / fps`` (``video_second_per_grid``).

A video with its own sound (``use_audio_in_video``; :mod:`wdspack.media.audio.link` decides which audio is one) is
merged with it token by token by time (``with_audio``): temporal patch ``k`` at ``13·k·s``, audio token ``j`` at
``j``, a patch's tokens before the audio tokens of its time. The track is one of the chat's audios for counting
(padded beside the others, as the processor's one audio call pads it) and for features::

    tokens     <vs> <as> [V]×4 [A]×7 [V]×4 [A]×6 [V]×4 ... [A]×19 <ae> <ve>     (s = 0.5: patches at 0, 6.5, 13, …)
    temporal   <vs> <as> at st, st + 1; patch k at st + 2 + 13·k·s, audio token j at st + 2 + j; <ae> <ve> after
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ...errors import ConfigError, FormatError
from ...media.audio.tokens import AUDIO_RULES, AudioRule
from ...media.video.plan import QwenVideoSampling, plan_qwen2_vl
from ..family import AudioSide, Budgets, Family, ImageSide, Rows, VideoSide
from .qwen_omni import _model_kwargs, pad_frame_rows
from .qwen_vl import QWEN2_VIDEO, _pad_pixels, _pixels, _replacements, _video_token

__all__ = ["FAMILIES", "QWEN3_OMNI", "QWEN3_OMNI_VIDEO", "qwen3_omni_positions", "qwen3_omni_sample_frames",
           "qwen3_omni_with_audio"]

_HOP, _RATE, _CHUNK = 160, 16_000, 100


def _audio_token(processor: Any) -> str:
    return str(processor.audio_token)


def _image_token(processor: Any) -> str:
    return str(processor.image_token)


def _rule(processor: Any, settings: Mapping[str, Any] | None) -> AudioRule:
    """``AUDIO_RULES["qwen3_omni_moe"]``, where the feature extractor takes 16 kHz with a 160-sample hop and the
    processor's encoder window is the published ``n_window`` 50 (1 s chunks of 100 frames)."""
    s = dict(settings or {})
    rate, hop = int(s.get("sampling_rate") or _RATE), int(s.get("hop_length") or _HOP)
    window = int(getattr(processor, "n_window", 50))
    if (rate, hop, window) != (_RATE, _HOP, _CHUNK // 2):
        raise ConfigError(f"the feature extractor takes {rate} Hz with a hop of {hop} and the processor's n_window is "
                          f"{window}; wdspack plans qwen3_omni_moe audio at {_RATE} Hz, hop {_HOP}, n_window "
                          f"{_CHUNK // 2} (the published settings): pack with the model's own processor folder")
    return AUDIO_RULES["qwen3_omni_moe"]


def qwen3_omni_sample_frames(samples: Sequence[int]) -> list[int]:
    """Each audio's feature frames when one processor call takes all of ``samples`` (one chat's audios): the
    feature extractor pads them to the longest, ``N``, and its frame mask keeps ``ceil(n/160)`` frames of an
    audio, at most the ``N//160`` frames the STFT gives.

    Example:
        >>> qwen3_omni_sample_frames([16001]), qwen3_omni_sample_frames([16001, 32000])
        ([100], [101, 200])
    """
    most = max(samples, default=0) // _HOP
    return [min(-(-n // _HOP), most) for n in samples]


def _tokens(frames: int) -> int:
    """``_get_feat_extract_output_lengths``: 13 tokens per 100-frame chunk, the rest through three halvings."""
    rest = (frames % _CHUNK - 1) // 2 + 1
    return ((rest - 1) // 2 + 1 - 1) // 2 + 1 + (frames // _CHUNK) * 13


def _sample_tokens(rule: AudioRule, samples: Sequence[int]) -> list[int]:
    return [_tokens(f) for f in qwen3_omni_sample_frames(samples)]


def _features(processor: Any, waves: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """``Qwen3OmniMoeProcessor._process_audio``'s own call, once per sub-sample (padded to its longest audio, never
    cut), each audio's real frames kept as a ``[L, bins]`` block of rows."""
    fe = processor.feature_extractor
    blocks: list[torch.Tensor] = []
    lengths: list[int] = []
    for group in waves:
        out = fe(list(group), sampling_rate=fe.sampling_rate, padding=True, truncation=False,
                 return_attention_mask=True, return_tensors="pt")
        counts = out["attention_mask"].sum(-1).tolist()
        blocks += [f[:, :n].T.contiguous() for f, n in zip(out["input_features"], counts)]
        lengths += counts
    return {"input_features": tuple(blocks), "audio_feature_lengths": torch.tensor(lengths, dtype=torch.int64)}


def audio_rows(budgets: Budgets) -> int:
    """Feature-frame rows per pack: an audio of ``T`` tokens has at most ``8T`` frames (13 tokens per 100 frames,
    then one per 8 or fewer), so the pack's audio tokens bound its frames."""
    return 8 * int(budgets.max_audio_tokens or 0)


def _pad_audio(out: Mapping[str, Any], processor: Any, budgets: Budgets, audio_tokens: Sequence[int]
               ) -> dict[str, torch.Tensor | Rows]:
    return pad_frame_rows(out, processor, budgets, audio_tokens, rows=audio_rows(budgets), count=_tokens)


@functools.cache
def _rope_index() -> Any:
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as m

    return m.Qwen3OmniMoePreTrainedModelForConditionalGeneration


def _stand_in(processor: Any) -> Any:
    """What the thinker's ``get_rope_index`` reads of its model, from the processor (token ids, time settings)."""
    tok, cls = processor.tokenizer, _rope_index()
    ids = {name: int(tok.convert_tokens_to_ids(str(getattr(processor, attr)))) for name, attr in (
        ("image_token_id", "image_token"), ("video_token_id", "video_token"), ("audio_token_id", "audio_token"),
        ("vision_start_token_id", "vision_bos_token"), ("audio_start_token_id", "audio_bos_token"))}
    config = types.SimpleNamespace(**ids, position_id_per_seconds=processor.position_id_per_seconds,
                                   audio_config=types.SimpleNamespace(n_window=int(processor.n_window)))
    model = types.SimpleNamespace(config=config, spatial_merge_size=int(processor.image_processor.merge_size))
    model.get_llm_pos_ids_for_vision = functools.partial(cls.get_llm_pos_ids_for_vision, model)
    return model


def _grids(ids: torch.Tensor, token: int, grids: torch.Tensor, first: int, merge: int) -> int:
    """The index past the grids whose tokens the sub-sample ``ids`` holds, from ``first``."""
    want, k = int((ids == token).sum()), first
    while want > 0:
        if k >= len(grids):
            raise FormatError("a sub-sample has more media tokens than the pack's grids give")
        want -= int(grids[k].prod()) // (merge * merge)
        k += 1
    return k


def qwen3_omni_positions(input_ids: torch.Tensor, seq_lens: Sequence[int], outputs: Mapping[str, Any],
                         processor: Any) -> torch.Tensor:
    """``[3, L]`` float32 positions of one pack: each sub-sample's from the thinker's own ``get_rope_index`` on it
    alone, with its images' and videos' grids and its audios' feature lengths; padding counts ``0, 1, 2, …``."""
    model = _stand_in(processor)
    cfg, merge = model.config, model.spatial_merge_size
    empty = torch.zeros(0, 3, dtype=torch.int64)
    images, videos = outputs.get("image_grid_thw", empty), outputs.get("video_grid_thw", empty)
    seconds = outputs.get("second_per_grid_ts", torch.zeros(0))
    lengths = outputs.get("audio_feature_lengths", torch.zeros(0, dtype=torch.int64))
    L = input_ids.shape[0]
    out = torch.empty(3, L, dtype=torch.float32)
    start = image = video = audio = 0
    for n in seq_lens:
        ids = input_ids[start:start + n]
        image_end = _grids(ids, cfg.image_token_id, images, image, merge)
        video_end = _grids(ids, cfg.video_token_id, videos, video, merge)
        audio_end = audio + int((ids == cfg.audio_start_token_id).sum())
        if image_end == image and video_end == video:
            out[:, start:start + n] = torch.arange(n)
        else:  # a video with its own sound opens <|vision_start|><|audio_start|>: the thinker's use_audio_in_video
            linked = bool(((ids[:-1] == cfg.vision_start_token_id) & (ids[1:] == cfg.audio_start_token_id)).any())
            rope, _ = _rope_index().get_rope_index(
                model, ids[None], images[image:image_end] if image_end > image else None,
                videos[video:video_end] if video_end > video else None, torch.ones(1, n, dtype=torch.int64), linked,
                lengths[audio:audio_end], seconds[video:video_end])
            out[:, start:start + n] = rope[:, 0]
        start, image, video, audio = start + n, image_end, video_end, audio_end
    out[:, start:] = torch.arange(L - start)
    return out


def _token_rows(input_ids: torch.Tensor, seq_lens: Sequence[int], outputs: Mapping[str, Any],
                processor: Any) -> dict[str, torch.Tensor]:
    return {"mrope_position_ids": qwen3_omni_positions(input_ids, seq_lens, outputs, processor)}


def _finish(batch: dict[str, Any]) -> dict[str, Any]:
    rope = batch.pop("mrope_position_ids")
    batch["position_ids"] = torch.cat([batch["position_ids"][None].to(rope.dtype), rope])
    return batch


def _video_sampling(processor: Any, config: Mapping[str, Any] | None) -> QwenVideoSampling:
    """What ``Qwen3OmniMoeProcessor``'s call gives its ``Qwen2VLVideoProcessor``: the video processor's settings
    (None: the image processor's, which transformers builds it from where a folder has no video settings), with the
    processor class's own ``videos_kwargs`` over them (its ``size``, 128·32² to 768·32² pixels, whatever the video
    processor's); a saved ``fps`` without ``do_sample_frames`` is dropped (it samples nothing, and the call's
    seconds per patch never read it)."""
    found = dict(config) if config is not None else dict(processor.image_processor.to_dict())
    if not found.get("do_sample_frames"):
        found.pop("fps", None)
    base = QwenVideoSampling.from_config(found)
    call = dict(getattr(processor, "videos_kwargs", None) or {})
    return QwenVideoSampling.from_config(call, base=base) if call else base


def _video_plan(header: Any, settings: QwenVideoSampling) -> Any:
    """Qwen2.5-VL's plan, with the seconds per temporal patch as ``Qwen3OmniMoeProcessor._process_videos`` writes
    them: ``temporal_patch_size / fps``, the fps the call samples at (``--video-fps``), 1.0 where none is given.
    A video processor saved sampling at an fps of its own is planned at that fps too (the frames' real spacing),
    where the processor's call without ``fps`` writes 1.0: pass ``--video-fps`` to have both agree."""
    plan = plan_qwen2_vl(header, settings)
    return dataclasses.replace(plan, second_per_grid_t=settings.temporal_patch_size / (settings.fps or 1.0))


def qwen3_omni_with_audio(processor: Any, plan: Any, audio_tokens: int) -> str:
    """``Qwen3OmniMoeProcessor.replace_video_with_audio_token``'s text for a video (its stored plan) with its own
    sound of ``audio_tokens`` tokens: between ``<|audio_start|>`` and ``<|audio_end|>`` (the template's
    ``<|vision_start|>``/``<|vision_end|>`` around it) the video's tokens and the audio's merged one by one by time,
    temporal patch ``k`` at ``k · second_per_grid · position_id_per_seconds`` (float64, as the processor's numpy
    computes it), audio token ``j`` at ``j``, a video token first where they tie: before patch ``k`` come the
    audio tokens ``j < ⌈time⌉`` not yet written, after the last patch the rest.

    Example:
        >>> qwen3_omni_with_audio(processor, plan_of_grid_3x4x4_at_half_a_second, 20)  # doctest: +SKIP
        '<|audio_start|>' + V * 4 + A * 7 + V * 4 + A * 6 + V * 4 + A * 7 + '<|audio_end|>'   # patches at 0, 6.5, 13
    """
    t, h, w = (int(v) for v in plan.grid)
    merge = int(getattr(getattr(processor, "video_processor", None), "merge_size", None)
                or processor.image_processor.merge_size)  # in memory without torchvision: the image processor's
    per_patch = (h // merge) * (w // merge)
    step, per_second = float(plan.second_per_grid_t), float(processor.position_id_per_seconds)
    video, audio = _video_token(processor), _audio_token(processor)
    text, written = [str(processor.audio_bos_token)], 0
    for k in range(t):
        before = min(audio_tokens, math.ceil(k * step * per_second))
        text += [audio * (before - written), video * per_patch]
        written = max(written, before)
    text.append(audio * (audio_tokens - written))
    return "".join(text) + str(processor.audio_eos_token)


#: Qwen3-Omni's videos: ``<|video_pad|>`` repeated ``t·h·w / merge²`` times, Qwen2.5-VL's frames and pixels (16-px
#: patches), the processor's own pixel bounds and seconds per patch. A video with its own sound merges with it
#: (``qwen3_omni_with_audio``; :mod:`wdspack.media.audio.link`).
QWEN3_OMNI_VIDEO = VideoSide(placeholder=_video_token, feature_token=_video_token, sampling=_video_sampling,
                             plan=_video_plan, replacement=QWEN2_VIDEO.replacement, pixels=QWEN2_VIDEO.pixels,
                             pad=QWEN2_VIDEO.pad, with_audio=qwen3_omni_with_audio)

QWEN3_OMNI = Family(
    name="qwen3_omni_moe", processors=("Qwen3OmniMoeProcessor",), model_types=("qwen3_omni_moe_thinker",),
    image=ImageSide(replacements=_replacements, pixels=_pixels, pad=_pad_pixels, uint8_pixels=True,
                    feature_token=_image_token, placeholder=_image_token),
    token_rows=_token_rows, token_keys=("mrope_position_ids",), finish_batch=_finish, model_kwargs=_model_kwargs,
    video=QWEN3_OMNI_VIDEO,
    audio=AudioSide(placeholder=_audio_token, feature_token=_audio_token, rule=_rule,
                    replacement=lambda processor, tokens: _audio_token(processor) * tokens, features=_features,
                    pad=_pad_audio, sample_tokens=_sample_tokens, features_per_sample=True),
    notes="thinker: Qwen2.5-VL's images and videos (16-px patches, DeepStack), Whisper audio padded to each "
          "sample's longest, never cut (13 <|audio_pad|> a second); position_ids [4, B, L] float32 (text row + the "
          "thinker's 3-D rows; a video's time at 13 × temporal_patch_size / fps a patch; a video's own sound merged "
          "with it by time); video_second_per_grid; "
          "input_features as frame rows [B·R, 128] with audio_frame_mask, audio_feature_lengths and audio_mask "
          "[B·M]",
)

FAMILIES = (QWEN3_OMNI,)
