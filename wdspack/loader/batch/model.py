"""A model processor's keys: per pack, its pixels and the family's token rows; per batch, their concatenation.

    pack.media, kind by kind ─► the kind's loader side (``wdspack.media.<kind>.batch``) ─► the family's side:
        images: decode_image (guarded) ─► family.image.pixels ─► family.image.pad (static shapes)
        videos: family.video.pixels (the planned frames) ─► family.video.pad
    input_ids [L] ─► family.token_rows: e.g. mm_token_type_ids [L], 3-D positions [3, L]
    batch: pixel keys concatenated pack-major, token rows stacked [..., B, L] ─► family.finish_batch

:class:`ModelBatcher` is built once by ``make_loader(..., processor=...)`` and travels to the workers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ...errors import ConfigError
from ...media import KINDS
from ...media.image.pixels import DEFAULT_MAX_PIXELS
from ...models.family import Budgets, Rows
from .buffers import fresh_pixels

#: ``(shape, key) -> (tensor, dirty)``: where the loader wants a batch's pixel rows under ``key`` written.
Take = Callable[[tuple[int, ...], str], tuple[torch.Tensor, "list[int] | None"]]

__all__ = ["ModelBatcher"]


class ModelBatcher:
    """Model-ready keys for packs of one dataset, from one processor.

    Args:
        processor: a processor object, folder or cached model name (:func:`~wdspack.models.load_processor`).
        seq_len, max_images: the dataset's budgets (the static shapes).
        max_pixels: the decompression-bomb limit for decoding (every kind's: images, and each video frame).
        media_tokens: per kind, the most of its tokens in one pack of the dataset
            (:func:`~.budgets.media_token_budgets` of its manifest's totals): each kind's pixel tensors are sized
            for it; the images' None: for ``seq_len``; another kind's None or 0 (a dataset without it): no keys
            of the kind.
        max_image_tokens, max_video_tokens: one kind's entry of ``media_tokens`` by itself
            (``max_{name}_tokens=``), over it.
    """

    def __init__(self, processor: Any, *, seq_len: int, max_images: int, max_pixels: int = DEFAULT_MAX_PIXELS,
                 media_tokens: Mapping[str, int | None] | None = None, **by_kind: int | None) -> None:
        from ...models import family_for, load_processor

        spelled = {f"max_{kind.name}_tokens": kind.name for kind in KINDS}
        unknown = sorted(set(by_kind) - set(spelled))
        if unknown:
            raise TypeError(f"ModelBatcher() got unexpected keyword arguments {unknown}; a kind's budget is one of "
                            f"{sorted(spelled)}")
        tokens = {**(media_tokens or {}), **{spelled[key]: value for key, value in by_kind.items()}}
        self.processor = load_processor(processor)
        self.family = family_for(self.processor)
        given = {name: int(value) for name, value in tokens.items() if value is not None}
        self.budgets = Budgets(int(seq_len), int(max_images), media_tokens=given)  # a kind not given: its default
        for kind in KINDS:  # a kind the dataset holds (its budget has tokens) that the family does not take
            if getattr(self.budgets, f"max_{kind.name}_tokens", None) and kind.name not in self.family.sides:
                raise ConfigError(f"the dataset holds {kind.plural}, but the {self.family.name} family has no "
                                  f"{kind.name} path ({type(self.processor).__name__}); load with the processor it "
                                  "was packed with")
        self.max_pixels = int(max_pixels)
        #: ``"uint8"``: pixels as the processor's resized bytes, un-normalised (``ImageSide.uint8_pixels``).
        self.pixel_dtype = "float32"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "family": self.family.name}  # a Family holds functions: ship its name

    def __setstate__(self, state: dict[str, Any]) -> None:
        from ...models import family_for

        self.__dict__.update(state)
        self.family = family_for(state["family"])

    def __repr__(self) -> str:
        return f"ModelBatcher({self.family.name}, {type(self.processor).__name__}, {self.budgets})"

    @property
    def token_keys(self) -> tuple[str, ...]:
        return self.family.token_keys

    def pack_parts(self, pack: Any, input_ids: torch.Tensor
                   ) -> tuple[Mapping[str, torch.Tensor | Rows], dict[str, torch.Tensor]]:
        """``(pixels, token_rows)`` of one pack: pixel tensors at their static shapes, rows ``[..., L]``.

        Raises:
            ImageDecodeError: an image cannot be decoded (``index`` says which).
            VideoDecodeError: a video cannot be decoded (``index`` says which; under the loader
                :func:`~.collate.naming_sample` names its sample).
        """
        raw = {"do_rescale": False, "do_normalize": False} if self.pixel_dtype == "uint8" else {}
        out: dict[str, Any] = {}
        pixels: dict[str, Any] = {}
        sides = _sides()
        for kind in KINDS:
            side, items = sides[kind.name], pack.media[kind.name]
            if not side.active(self):
                if items:
                    raise ConfigError(f"a pack holds {len(items)} {kind.plural} but the dataset's manifest lists none "
                                      f"(no max_{kind.name}_tokens_per_pack): it was not written by this wdspack's "
                                      "pack job")
                continue
            out.update(side.outputs(self, items, raw))
            pixels.update(side.pad(self, out, tuple(items.tokens)))
        if raw:  # each kind's pixel rows as bytes
            for side in sides.values():
                key = side.ROWS_KEY
                if key and key in pixels:
                    pixels[key] = self._as_bytes(pixels[key])
        rows = self.family.token_rows(input_ids, pack.seq_lens, out, self.processor) if self.family.token_rows else {}
        return pixels, rows

    def _as_bytes(self, rows: Any) -> Rows:
        """The un-normalised pixel rows as uint8: exact, since the processor gave whole numbers 0-255 (checked)."""
        if not isinstance(rows, Rows):
            raise ConfigError(f"the {self.family.name} family's pixel_values are not rows of flattened patches; "
                              "pass pixel_dtype='float32'")
        if all(t.dtype == torch.uint8 for t in rows.pieces):  # the bytes themselves (videos): nothing to check
            return Rows(rows.tensor, rows.rows)
        for t in rows.pieces:
            if t.numel() and (t.min() < 0 or t.max() > 255 or not torch.equal(t, t.round())):
                raise ConfigError(f"{type(self.processor).__name__} resizes in floating point (its pixels before "
                                  "rescaling are not whole numbers 0-255), so they cannot travel as uint8 exactly; "
                                  "pass pixel_dtype='float32'")
        return Rows(tuple(t.to(torch.uint8) for t in rows.pieces), rows.rows)

    @property
    def pixel_rows(self) -> tuple[tuple[str, str, Callable[[torch.Tensor], torch.Tensor]], ...]:
        """Per kind, its pixel rows' key, the key of the mask of its real rows, and how its uint8 rows become
        float32 (``normalize_pixels``): ``("pixel_values", "patch_mask", self.normalize)``, ...."""
        return tuple((side.ROWS_KEY, side.MASK_KEY, functools.partial(side.normalize, self))
                     for side in _sides().values() if side.ROWS_KEY)

    @staticmethod
    def padded(pixels: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """One pack's pixel parts as plain tensors (:class:`Rows` padded), for use without the loader."""
        return {k: _join_rows([v], None)[0] if isinstance(v, Rows) else v for k, v in pixels.items()}

    def collate(self, batch: dict[str, Any], parts: Sequence[tuple[Mapping[str, Any], Mapping[str, torch.Tensor]]],
                *, padding_free: bool = False, take: Take | None = None
                ) -> tuple[dict[str, Any], dict[str, list[int]]]:
        """Add the packs' ``parts`` to a collated ``batch`` and apply the family's last rewrite.

        Args:
            take: for each :class:`~wdspack.models.family.Rows` key (``pixel_values``,
                ``pixel_values_videos``): ``(shape, key) -> (tensor, dirty)``, a tensor of the loader's
                pixel dtype to write the batch into and, per pack, how many leading rows may be non-zero
                from earlier use (``None``: unknown, zero them all). Default: new zero memory.

        Returns:
            The batch, and per key written into ``take``'s tensor the real rows per pack.
        """
        written: dict[str, list[int]] = {}
        for key in parts[0][0]:
            values = [p[0][key] for p in parts]
            if isinstance(values[0], Rows):
                dtype = values[0].dtype or values[0].pieces[0].dtype
                if take is not None and dtype in (torch.float32, torch.uint8):
                    batch[key], written[key] = _join_rows(values, functools.partial(_take_key, take, key))
                else:  # new zero memory (shared in a worker, so the batch leaves without another copy)
                    batch[key], _ = _join_rows(values, _fresh(len(parts), dtype))
            else:
                batch[key] = torch.cat(values) if len(values) > 1 else values[0]
        for key in parts[0][1]:
            rows = torch.stack([p[1][key] for p in parts], dim=-2)  # [..., B, L]
            batch[key] = _flatten_rows(rows, batch) if padding_free else rows
        if self.family.finish_batch is not None:
            batch = self.family.finish_batch(batch)
        return batch, written


@functools.cache
def _sides() -> dict[str, Any]:
    """Each kind's side in the loader (its room's ``batch`` module), by the kind's name (found once a process:
    ``pack_parts`` asks for every pack)."""
    return {kind.name: kind.batch() for kind in KINDS if kind.batch is not None}


#: ``shape -> (tensor, dirty)``: the memory one key's rows are written into (:data:`Take` for that key).
_Alloc = Callable[[tuple[int, ...]], tuple[torch.Tensor, "list[int] | None"]]


def _take_key(take: Take, key: str, shape: tuple[int, ...]) -> tuple[torch.Tensor, list[int] | None]:
    return take(shape, key)


def _fresh(packs: int, dtype: torch.dtype) -> _Alloc:
    """New zero memory for a batch's rows (:func:`~.buffers.fresh_pixels`: shared in a worker)."""
    return lambda shape: fresh_pixels(shape, packs, dtype=dtype)


def _join_rows(values: Sequence[Rows], take: _Alloc | None) -> tuple[torch.Tensor, list[int]]:
    """Pack ``b``'s rows into ``out[b·rows : b·rows + n_b]``, zeros after them; every byte written once."""
    rows, first = values[0].rows, values[0].pieces[0]
    pieces = [v.pieces for v in values]
    counts = [sum(int(t.shape[0]) for t in ps) for ps in pieces]
    if any(n > rows for n in counts):
        raise ConfigError(f"a pack has {max(counts)} rows of pixels > the {rows} rows the budgets give it")
    shape = (len(values) * rows, *first.shape[1:])
    out, dirty = take(shape) if take is not None else (first.new_empty(shape, dtype=values[0].dtype), None)
    for b, (ps, n) in enumerate(zip(pieces, counts)):
        at = b * rows
        for t in ps:
            out[at: at + t.shape[0]] = t
            at += t.shape[0]
        finish = values[b].finish
        if finish is not None and n:
            finish(out[b * rows: at])
        stale = rows if dirty is None else dirty[b]
        if stale > n:
            out[b * rows + n: b * rows + stale] = 0
    return out, counts


def _flatten_rows(rows: torch.Tensor, batch: Mapping[str, Any]) -> torch.Tensor:
    """``[..., B, L]`` → ``[..., 1, N]``: each pack's real tokens back to back, then zeros up to the
    padding-free row's width ``N`` (as ``collate_packs`` lays out the text keys)."""
    B, L = rows.shape[-2:]
    keep = (torch.arange(L)[None, :] < batch["num_tokens"][:, None]).reshape(-1)
    flat = rows.reshape(*rows.shape[:-2], B * L)[..., keep]
    width = batch["input_ids"].shape[-1]
    tail = flat.new_zeros((*flat.shape[:-1], width - flat.shape[-1]))
    return torch.cat([flat, tail], dim=-1).unsqueeze(-2)
