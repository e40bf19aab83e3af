"""The video kind at pack time: the processor's video settings read once, each video planned from its
container's header (no frame decoded), and the planned videos expanded by the family's video side.

``builder`` is the pack job's sample builder (``wdspack.packer.samples.SampleBuilder``): these functions read its
processor, family and config, and keep the kind's state on it (``video_side``, ``video_token``,
``video_token_id``, ``video_sampling``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ...errors import ConfigError, SampleError
from ..kind import Prepared
from ..settings import read_settings
from . import VIDEO
from .header import read_header
from .plan import VideoPlan, VideoSettings, check_decode_size
from .record import VideoPlanRecord

__all__ = ["over_budget", "part", "plan_record", "policy", "probe", "settings_text", "setup"]


def setup(builder: Any) -> None:
    """The family's video side, with the processor's video settings (read where transformers reads them: a file
    that does not parse, or settings it cannot use, stop the job here, before anything packs) and the user's over
    them; what the manifest records of them and where they were read."""
    side = builder.family.video if builder.family is not None else None
    builder.video_side, builder.video_token, builder.video_sampling, builder.video_token_id = side, None, None, None
    if side is None:
        return
    spec = builder.config.processor
    builder.video_token = builder.holders["video"] = side.placeholder(builder.processor)
    found = read_settings(spec, VIDEO.settings_part, builder.processor)
    try:
        base = side.sampling(builder.processor, found.values)
    except ConfigError as e:
        raise (ConfigError(f"{found.where}: {e}") if found.values is not None else e) from None
    user = builder.config.video or VideoSettings()
    builder.video_sampling = user.apply(base)
    source = found.source
    if found.values is None and isinstance(spec, (str, os.PathLike)):  # said in the summary, never silently
        source += (f" ({os.fspath(spec)} has no video_processor in processor_config.json, no "
                   "video_preprocessor_config.json, no preprocessor_config.json)")
    overrides = {k: v for k, v in dataclasses.asdict(user).items() if v is not None}
    builder.settings_used["video"] = {"settings_from": source, **({"overrides": overrides} if overrides else {})}
    builder.video_token_id = builder._token_id(side.feature_token(builder.processor))


def policy(builder: Any) -> dict[str, Any] | None:
    """What the manifest's ``image_policy`` keeps of the videos' settings (where the family has a video side)."""
    if builder.video_sampling is None:
        return None
    return {"token": builder.video_token, "token_id": builder.video_token_id,
            **dataclasses.asdict(builder.video_sampling), **builder.settings_used["video"]}


def probe(builder: Any, videos: tuple[bytes, ...], sid: str,
          names: tuple[str, ...] = ()) -> tuple[tuple[bytes, ...], tuple[VideoPlan, ...]]:
    """The videos, and each one's plan from its container's header alone (:mod:`.plan`)."""
    if builder.video_side is None or builder.video_sampling is None:
        have = ", ".join(builder.families_taking("video"))
        why = (f"the {builder.family.name} family has no video path" if builder.family is not None
               else "videos need --processor (the model's own processor; with --tokenizer there is no video "
                    "layout)")
        raise SampleError("unsupported_media", f"the record has {len(videos)} video(s) but {why}; families with "
                          f"one: {have}", sid)
    if builder.typed_parts and not builder.typed["video"]:
        raise ConfigError(f"the chat template of {builder.name!r} renders images but no video part "
                          "({'type': 'video'}); pass --chat-template with the model's own template, which renders "
                          f"{builder.video_token!r} for each video")
    plans = []
    for k, data in enumerate(videos):
        which = f"video {k} ({names[k]!r})" if k < len(names) and names[k] else f"video {k}"
        try:
            header = read_header(data, sample_id=sid, max_pixels=builder.config.max_image_pixels)
            plans.append(check_decode_size(header, builder.video_side.plan(header, builder.video_sampling)))
        except SampleError as e:
            raise SampleError(e.reason, f"{which}: {e.detail}", sid) from None
    return videos, tuple(plans)


def part(builder: Any, sid: str, videos: tuple[bytes, ...], plans: tuple[VideoPlan, ...]) -> Prepared:
    """A chat's videos as the family expands them: from each one's plan (made from its header)."""
    assert builder.video_side is not None and builder.video_token is not None  # probe checked
    return Prepared("video", builder.video_token, builder.video_token_id, tuple(videos),
                    lambda: builder.video_side.replacements(builder.processor, plans),
                    tuple((plan.tokens, str(plan.grid)) for plan in plans), tuple(plan_record(plan) for plan in plans))


def plan_record(plan: VideoPlan) -> VideoPlanRecord:
    """What a pack stores of a video's plan (:class:`~.record.VideoPlanRecord`)."""
    return VideoPlanRecord(frames=plan.indices, size=(plan.height, plan.width), grid=plan.grid,
                           second_per_grid_t=plan.second_per_grid_t)


def over_budget(builder: Any, sample: Any, *, seq_len: int) -> str | None:
    """Why a sample whose videos take it over ``seq_len`` is dropped (None: it is not), said here because its fix
    is also the video sampling: the message names the levers and the video settings it was planned with."""
    videos = sample.media["video"]
    if not videos or sample.token_count <= seq_len:
        return None
    policy = builder.describe()["image_policy"]
    levers = "--video-num-frames" if (policy.get("video") or {}).get("num_frames") and \
        "max_frames" not in (policy.get("video") or {}) else "--video-fps, --video-max-frames, --video-max-pixels"
    count = len(videos)
    return (f"{sample.token_count} tokens > seq_len {seq_len}, {sum(videos.tokens)} of them for its {count} "
            f"video{'s' if count > 1 else ''}; raise --seq-len, or sample fewer or smaller frames ({levers}); "
            f"planned with {settings_text(policy)}")


def settings_text(policy: dict[str, Any]) -> str:
    """``frames at 2 fps (4 to 16 a video), 6272 to 50176 pixels each, tokens from each video's header; settings
    from processor_config.json``, and the user's settings over them where given."""
    v = policy.get("video") or {}
    if v.get("do_sample_frames"):
        rate = f"{v['num_frames']} frames a video" if v.get("num_frames") else \
            f"frames at {v.get('fps'):g} fps" if v.get("fps") else "frames at the rate the processor picks per video"
        if not v.get("num_frames") and v.get("max_frames") is not None:
            rate += f" ({v.get('min_frames')} to {v.get('max_frames')} a video)"
    else:
        rate = "every frame"
    if v.get("height") and v.get("width"):  # one size for every frame (LLaVA-OneVision)
        pixels = f"each resized to {v['height']}x{v['width']}"
    elif v.get("scale_resolution"):  # each frame sliced as an image (MiniCPM-V)
        pixels = (f"each sliced as an image (slices of about {v['scale_resolution']}x{v['scale_resolution']}, at "
                  f"most {v.get('max_slice_nums')})")
    elif v.get("max_soft_tokens"):  # a size per aspect ratio within a budget of soft tokens (Gemma 4)
        pixels = f"each resized to at most {v['max_soft_tokens']} soft tokens"
    elif v.get("min_pixels"):
        pixels = f"{v['min_pixels']} to {v.get('max_pixels')} pixels each"
    else:
        pixels = f"at most {v.get('max_pixels')} pixels each"
    text = f"{rate}, {pixels}, tokens from each video's header"
    if v.get("settings_from"):  # absent from datasets packed before wdspack recorded it
        text += f"; settings from {v['settings_from']}"
        over = [f"{_FLAGS.get(k, k)} {w:g}" for k, w in (v.get("overrides") or {}).items()]
        if over:
            text += ", " + (" and ".join(over) if len(over) < 3 else ", ".join(over[:-1]) + " and " + over[-1]) \
                + " over them"
    return text


#: The pack flag of each of VideoSettings' fields (the summary names what the user set by the flag they know).
_FLAGS = {"fps": "--video-fps", "max_frames": "--video-max-frames", "max_pixels": "--video-max-pixels",
          "num_frames": "--video-num-frames"}
