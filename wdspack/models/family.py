"""What a model family declares, and the shared code that asks it.

A family is one small module that builds a :class:`Family`: plain data plus a few functions.
The packer and the loader never branch on a family's name; they call these.

Pack time (``wdspack pack --processor``), per sample::

    chat template ──► "...<|vision_start|><|image_pad|><|vision_end|>What is it?..."   one placeholder per image
    image headers ──► (height, width) per image, no pixels decoded
    replacements  ──► the text each placeholder becomes, from the sizes (the processor's own
                      ``replace_image_token`` where the family can feed it header-only inputs)
    tokenizer     ──► ids of the expanded text, exactly as ``processor(text=..., images=...)``

Load time (``make_loader(..., processor=...)``), per pack, in the worker::

    images    ──► the processor's own image processor ──► ``image.pad`` to fixed shapes
    input_ids ──► ``token_rows``: per-token rows the model takes (token types, 3-D positions)

and per batch ``finish_batch`` (e.g. ``position_ids`` ``[4, B, L]``); ``model_kwargs`` picks what
``model.forward`` takes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..media import IMAGE, KINDS

__all__ = ["AudioSide", "Budgets", "Family", "ImageSide", "Rows", "VideoSide", "default_pixels", "run_image_processor",
           "take_rows"]


@dataclass(frozen=True, slots=True, init=False)
class Budgets:
    """The static shapes a pack must fit: ``seq_len`` tokens, ``max_images`` media items (every kind's, as the
    pack job's budget counts them) and, per media kind, the most of its feature tokens in one pack (the
    manifest's ``max_{kind}_tokens_per_pack``): what each kind's pixel tensors are sized for.

    A kind's budget reads and constructs by its name, ``max_{kind}_tokens`` (``Budgets(4096, 8,
    max_image_tokens=512)``; the images' also third by position). Not given: the images' None (``seq_len`` bounds
    them), another kind's 0 (the batch has none of its keys).

    Example:
        >>> b = Budgets(4096, 8, 512, max_video_tokens=1024)
        >>> b.image_tokens, b.max_video_tokens, b.media_tokens["video"]
        (512, 1024, 1024)
    """

    seq_len: int
    max_images: int
    media_tokens: Mapping[str, int | None]

    def __init__(self, seq_len: int, max_images: int, max_image_tokens: int | None = None, *,
                 media_tokens: Mapping[str, int | None] | None = None, **by_kind: int | None) -> None:
        tokens: dict[str, int | None] = {kind.name: None if kind.always_stored else 0 for kind in KINDS}
        tokens.update(media_tokens or {})
        if max_image_tokens is not None:
            tokens[IMAGE.name] = max_image_tokens
        for key, value in by_kind.items():
            name = key.removeprefix("max_").removesuffix("_tokens")
            if key != f"max_{name}_tokens" or name not in tokens:
                raise TypeError(f"Budgets() got an unexpected keyword argument {key!r}; a kind's budget is one of "
                                f"{[f'max_{k}_tokens' for k in tokens]}")
            tokens[name] = value
        object.__setattr__(self, "seq_len", seq_len)
        object.__setattr__(self, "max_images", max_images)
        object.__setattr__(self, "media_tokens", tokens)

    def __getattr__(self, key: str) -> Any:  # a kind's budget by its name (budgets.max_video_tokens)
        name = key.removeprefix("max_").removesuffix("_tokens")
        if key == f"max_{name}_tokens" and name in self.media_tokens:
            return self.media_tokens[name]
        raise AttributeError(f"'Budgets' object has no attribute {key!r}")

    @property
    def image_tokens(self) -> int:
        """The most image feature tokens one pack can hold: what image pixel tensors are sized for."""
        most = self.media_tokens.get(IMAGE.name)
        return self.seq_len if most is None else min(self.seq_len, most)


@dataclass(frozen=True, slots=True)
class Rows:
    """A pixel output that the batch pads with zero rows to ``rows`` per pack (a side's ``pad`` may return
    it instead of a padded tensor): the loader then writes the real rows straight into the batch
    tensor, reusing its shared-memory buffers, and zeroes only rows that held data before."""

    tensor: torch.Tensor | tuple[torch.Tensor, ...]  #: the real rows, or pieces of them in order (written once each)
    rows: int
    #: the batch tensor's dtype, where it differs from the pieces' (uint8 pieces written into float32 rows)
    dtype: torch.dtype | None = None
    #: applied in place to each pack's real rows once written into the batch (e.g. normalising uint8 pixels
    #: where they land, rather than in a float copy per pack that is then copied again)
    finish: Callable[[torch.Tensor], Any] | None = None

    @property
    def pieces(self) -> tuple[torch.Tensor, ...]:
        return (self.tensor,) if isinstance(self.tensor, torch.Tensor) else self.tensor


def take_rows(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values[mask]`` (a boolean mask over the first dimension), without waiting for the GPU.

    A batch normalised on the GPU (``wdspack.normalize_pixels(batch, loader, device="cuda")``) has its
    ``pixel_values`` there and its masks on the CPU. Indexing by the mask would copy it over with a
    blocking copy, which waits until the GPU has run everything queued; here the rows' indices are found
    on the CPU and sent without blocking. Elsewhere (both on one device) it is ``values[mask]``.

    Example:
        >>> take_rows(torch.arange(8).reshape(4, 2), torch.tensor([True, False, False, True])).tolist()
        [[0, 1], [6, 7]]
    """
    if mask.device == values.device or mask.device.type != "cpu":
        return values[mask]
    index = mask.nonzero().squeeze(1)
    return values.index_select(0, index.to(values.device, non_blocking=True))


def run_image_processor(processor: Any, images: Sequence[Any], **kwargs: Any) -> dict[str, torch.Tensor]:
    """The processor's image processor on a pack's PIL images, as tensors (its own layout)."""
    out = processor.image_processor(list(images), return_tensors="pt", **kwargs)
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def default_pixels(processor: Any, images: Sequence[Any]) -> dict[str, torch.Tensor]:
    return run_image_processor(processor, images)


@dataclass(frozen=True, slots=True)
class ImageSide:
    """How a family's images become text at pack time and pixels in the loader.

    Attributes:
        replacements: ``(processor, sizes) -> [text]``: the text each image placeholder becomes,
            from ``(height, width)`` per image (header sizes, no pixels).
        pad: ``(outputs, processor, budgets, image_tokens) -> {key: tensor or Rows}``: the pixel outputs of a
            pack whose images hold ``image_tokens`` tokens each, padded to shapes that depend only on the budgets;
            every key is concatenated pack-major in the batch (dim 0).
        feature_token: ``processor -> str``: the token the vision features fill (``Pack.image_tokens`` counts it
            per image).
        placeholder: ``processor -> str``: the text the chat template renders per image.
        pixels: ``(processor, pil_images) -> {key: tensor}``: the processor's own pixel outputs for one pack's
            images (default: its image processor).
        pixels_per_sample: ``pixels`` gets the pack's images as one list per sub-sample that has images
            (``[[a], [b, c]]``, as ``apply_chat_template`` passes a batch of chats), for processors whose layout
            depends on how many images share a sample.
        uint8_pixels: ``pixels(processor, images, do_rescale=False, do_normalize=False)`` gives the resized pixels
            as whole numbers 0-255, in ``pixel_values`` rows whose values are channel-major (``3 × …`` per row, as
            flattened patches are), so the loader can ship them as bytes (``pixel_dtype="uint8"``) and normalise
            them on the device.
    """

    replacements: Callable[[Any, Sequence[tuple[int, int]]], list[str]]
    pad: Callable[[Mapping[str, torch.Tensor], Any, Budgets, Sequence[int]], Mapping[str, torch.Tensor | Rows]]
    feature_token: Callable[[Any], str] = lambda processor: processor.image_token
    placeholder: Callable[[Any], str] = lambda processor: processor.image_token
    pixels: Callable[..., dict[str, torch.Tensor]] = default_pixels
    pixels_per_sample: bool = False
    uint8_pixels: bool = False


@dataclass(frozen=True, slots=True)
class VideoSide:
    """How a family's videos become text at pack time (:mod:`wdspack.media.video.plan` plans them from the
    container's header; no frame is decoded).

    Attributes:
        placeholder: ``processor -> str``: the token the chat template renders per video and the
            processor replaces (``<|video_pad|>``).
        feature_token: ``processor -> str``: the token the video features fill (``Pack.video_tokens``
            counts it per video).
        sampling: ``(processor, config) -> settings``: the video processor's settings, from the dict
            :func:`~wdspack.media.settings.read_settings` found (wherever transformers writes them; None:
            the class's defaults).
        plan: ``(header, settings) -> VideoPlan``: the frames sampled, their size, grid and tokens.
        replacement: ``(processor, plan) -> str``: the text the placeholder becomes; ``numbered``:
            ``(processor, plan, index) -> str``, ``index`` the video's place among its sample's videos (MiniCPM-V's
            ``<image_id>index</image_id>``).
        pixels: ``(processor, videos, plans, *, max_pixels) -> {key: tensor}``: in the loader's workers, a
            pack's videos (bytes and stored plans) decoded at the planned frames only and laid out as the
            processor lays them out, as uint8 (resized, not normalised).
        pad: ``(outputs, processor, budgets, video_tokens) -> {key: tensor or Rows}``: ``pixels``' outputs
            padded to shapes that depend only on the budgets (as ``ImageSide.pad`` for images); the
            pixel rows as float32 :class:`Rows` normalised where they land (``finish``), which a
            ``pixel_dtype="uint8"`` loader ships as the bytes instead.
        with_audio: ``(processor, plan, audio_tokens) -> str``: the text the placeholder becomes for a video whose
            own sound track (an audio of ``audio_tokens``) the processor interleaves with it (its
            ``use_audio_in_video``; :mod:`wdspack.media.audio.link` decides which audio is a video's sound); None:
            the family reads such an audio as one more audio beside the video.
    """

    placeholder: Callable[[Any], str]
    feature_token: Callable[[Any], str]
    sampling: Callable[[Any, Mapping[str, Any] | None], Any]
    plan: Callable[[Any, Any], Any]
    replacement: Callable[..., str]
    pixels: Callable[..., dict[str, Any]]
    pad: Callable[[Mapping[str, Any], Any, Budgets, Sequence[int]], Mapping[str, torch.Tensor | Rows]]
    with_audio: Callable[[Any, Any, int], str] | None = None
    numbered: bool = False

    def replacements(self, processor: Any, plans: Sequence[Any]) -> list[str]:
        """The text each of one sample's videos becomes, in order."""
        if self.numbered:
            return [self.replacement(processor, plan, k) for k, plan in enumerate(plans)]
        return [self.replacement(processor, plan) for plan in plans]


@dataclass(frozen=True, slots=True)
class AudioSide:
    """How a family's audio becomes text at pack time (:mod:`wdspack.media.audio` counts each audio's samples at
    the family's rate from the file, the header where it is exact; nothing else is decoded) and features in the
    loader.

    Attributes:
        placeholder: ``processor -> str``: the token the chat template renders per audio (``<|AUDIO|>``).
        feature_token: ``processor -> str``: the token the audio features fill (``Pack.audio_tokens`` counts it
            per audio).
        rule: ``(processor, settings) -> AudioRule``: the family's arithmetic (:mod:`wdspack.media.audio.tokens`:
            feature frames, tokens, the samples its processor cuts at) with the feature extractor's settings, from
            the dict :func:`~wdspack.media.settings.read_settings` found (None: the class's defaults).
        replacement: ``(processor, tokens) -> str``: the text the placeholder becomes for an audio of ``tokens``.
        features: ``(processor, waveforms) -> {key: tensor}``: in the loader's workers, a pack's audio (float32
            mono at the rule's rate, as decoded and cut to the plan) through the processor's feature extractor as
            the processor calls it.
        pad: ``(outputs, processor, budgets, audio_tokens) -> {key: tensor or Rows}``: ``features``' outputs
            padded to shapes that depend only on the budgets.
        sample_tokens: ``(rule, kept_samples) -> [tokens]``: the tokens of one chat's audios counted together, for
            a processor whose count of an audio depends on the chat's others (one that pads them to the
            longest); None: each audio's ``rule.tokens`` alone.
        features_per_sample: ``features`` gets the pack's audio as one list per sub-sample that has audio
            (``[[a], [b, c]]``), as the processor takes one chat's audios in one call.
    """

    placeholder: Callable[[Any], str]
    feature_token: Callable[[Any], str]
    rule: Callable[[Any, Mapping[str, Any] | None], Any]
    replacement: Callable[[Any, int], str]
    features: Callable[[Any, Sequence[Any]], dict[str, Any]]
    pad: Callable[[Mapping[str, Any], Any, Budgets, Sequence[int]], Mapping[str, torch.Tensor | Rows]]
    sample_tokens: Callable[[Any, Sequence[int]], Sequence[int]] | None = None
    features_per_sample: bool = False


@dataclass(frozen=True, slots=True)
class Family:
    """One model family: a side per media kind it takes (how each kind becomes tokens and pixels), and how a
    batch becomes positions and the model's arguments.

    Attributes:
        name: short name (``"qwen2_5_vl"``), shown in manifests and errors.
        processors: processor class names it serves (``type(processor).__name__``).
        model_types: ``model.config.model_type`` values of the model classes it feeds.
        image: its images' side (:class:`ImageSide`); None for a family without an image path (an audio-only
            model: its image records are dropped as ``unsupported_media``).
        model_kwargs: ``(batch, model) -> kwargs`` for ``model(**kwargs)`` (without labels; added by
            :func:`wdspack.model_inputs`).
        token_rows: ``(input_ids [L], seq_lens, pixel_outputs, processor) -> {key: tensor [..., L]}``:
            per-token rows, stacked to ``[..., B, L]`` in the batch (``[..., 1, N]`` padding-free).
        token_keys: the keys ``token_rows`` returns.
        finish_batch: ``batch -> batch``: last per-batch rewrite (e.g. 4-row positions).
        notes: one line for the Families table (docs/guides/models.md#families).
        aliases: short names for ``--tokens-per-image processor:NAME`` (fixed mode) that build
            ``image_processor`` from code instead of loading one.
        image_processor: builds the family's image processor with its published defaults.
        no_varlen: why varlen attention (:func:`wdspack.use_varlen_attention`) cannot express the
            family's masks, and what to use instead; empty where it can.
        video: its videos' side (:class:`VideoSide`); None for a family without a video path (its video
            records are dropped as ``unsupported_media``).
        audio: its audio side (:class:`AudioSide`); None for a family without an audio path.
    """

    name: str
    processors: tuple[str, ...]
    model_types: tuple[str, ...]
    image: ImageSide | None
    model_kwargs: Callable[[Mapping[str, Any], Any], dict[str, Any]]
    token_rows: Callable[..., dict[str, torch.Tensor]] | None = None
    token_keys: tuple[str, ...] = ()
    finish_batch: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    notes: str = ""
    aliases: tuple[str, ...] = ()
    image_processor: Callable[[], Any] | None = None
    no_varlen: str = ""
    video: VideoSide | None = None
    audio: AudioSide | None = None

    @property
    def sides(self) -> dict[str, ImageSide | VideoSide | AudioSide]:
        """The family's side for each media kind it takes, by the kind's name."""
        return {kind.name: side for kind in KINDS if (side := getattr(self, kind.name)) is not None}
