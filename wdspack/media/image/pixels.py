"""Image bytes → pixels in the loader's workers: guarded, fast, processor-agnostic.

    built-in (Pillow)   bytes ─► decode_resized: uint8 [3, S, S] ─► normalize_into: float32 slots
    processor           bytes ─► the processor's outputs, [N, ...] each (flattened patches: [P, D] + grid)

An :class:`ImageTransform` returns one entry per image, unpadded; :func:`~.collate.pack_to_example`
pads them to ``max_images`` slots. Every decode refuses more than ``max_pixels`` pixels before decoding
any; bad bytes raise :class:`ImageDecodeError`, which the loader counts and skips. EXIF orientation is
not applied (the packer counted tokens from the stored size).
"""

from __future__ import annotations

import functools
import io
import warnings
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch
from PIL import Image

from ...errors import ConfigError
from ..kind import DecodeError

__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "DEFAULT_FORMATS",
    "DEFAULT_MAX_PIXELS",
    "ImageDecodeError",
    "ImageTooLargeError",
    "ImageTransform",
    "PatchLayout",
    "SIGLIP_MEAN",
    "SIGLIP_STD",
    "decode_image",
    "make_image_transform",
    "open_image",
]

#: Refuse images with more pixels than this (about 8000 × 8000) unless told otherwise.
DEFAULT_MAX_PIXELS = 64_000_000
#: The Pillow formats opened by default: common raster formats, nothing that shells out.
DEFAULT_FORMATS: tuple[str, ...] = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF", "AVIF")
SIGLIP_MEAN = SIGLIP_STD = (0.5, 0.5, 0.5)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class PatchLayout(Protocol):
    """What :func:`~wdspack.loader.batch.collate.pack_to_example` reads from a transform that returns
    ``image_grid_thw`` (flattened patches): one image token = ``merge_size²`` patches, and the
    fixed number of patch rows per pack."""

    @property
    def merge_size(self) -> int: ...

    def patch_rows(self, seq_len: int, max_images: int) -> int | None: ...


#: The channels :meth:`ImageTransform.decode_resized` reads out of an RGB image, one plane each.
_BANDS = ("R", "G", "B")


class ImageDecodeError(DecodeError):
    """Image bytes that cannot (or must not) be decoded; ``index`` is the image's place in its list."""


class ImageTooLargeError(ImageDecodeError):
    """The header declares more pixels than the decompression-bomb limit; nothing was decoded."""


def open_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS,
               formats: Sequence[str] | None = DEFAULT_FORMATS) -> Image.Image:
    """Parse the header only, refusing bombs and unknown formats; pixels stay undecoded.

    Raises:
        ImageTooLargeError: width × height > ``max_pixels`` (or over Pillow's own hard limit).
        ImageDecodeError: not an image, or a format outside ``formats``.

    Example:
        >>> buf = io.BytesIO(); Image.new("RGB", (300, 200)).save(buf, format="PNG")
        >>> open_image(buf.getvalue(), max_pixels=10_000)
        Traceback (most recent call last):
        wdspack.media.image.pixels.ImageTooLargeError: image of 300x200 = 60000 pixels exceeds the limit of 10000 ...
    """
    allowed = None if formats is None else _available(formats)
    try:
        with warnings.catch_warnings():
            # Pillow warns above its own limit; ours (checked next) is the one that decides.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=allowed)
    except Image.DecompressionBombError as e:
        raise ImageTooLargeError(f"image refused before decoding: {e}") from None
    except Exception as e:  # Pillow raises many unrelated types on bad bytes
        raise ImageDecodeError(f"cannot read the image header ({_describe(e)}); the bytes are not "
                               f"an image in one of the formats {list(allowed or ())}") from None
    w, h = img.size
    if w * h > max_pixels:
        raise ImageTooLargeError(f"image of {w}x{h} = {w * h} pixels exceeds the limit of {max_pixels} "
                                 "(a decompression-bomb guard); raise max_pixels if the image is genuine")
    return img


def decode_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, draft: int | None = None,
                 formats: Sequence[str] | None = DEFAULT_FORMATS) -> Image.Image:
    """Decode encoded bytes to an RGB image (guarded by :func:`open_image`).

    Args:
        data: JPEG/PNG/WebP/... bytes.
        max_pixels: refuse larger images before decoding.
        draft: for JPEGs, let the decoder downscale while decoding to no less than
            ``draft × draft`` (the image stays at least that large on both sides).
        formats: Pillow format names to accept; ``None`` accepts every installed plugin.

    Images with transparency are composited over white (as transformers' ``convert_rgb`` does).

    Example:
        >>> buf = io.BytesIO(); Image.new("RGBA", (8, 4)).save(buf, format="PNG")
        >>> img = decode_image(buf.getvalue()); img.mode, img.size, img.getpixel((0, 0))
        ('RGB', (8, 4), (255, 255, 255))
    """
    img = open_image(data, max_pixels=max_pixels, formats=formats)
    try:
        if draft and img.format == "JPEG":
            img.draft("RGB", (draft, draft))
        img.load()
        return _to_rgb(img)
    except Exception as e:  # truncated or corrupt pixel data
        raise ImageDecodeError(f"cannot decode {img.format} image of {img.size[0]}x{img.size[1]} "
                               f"({_describe(e)}); the bytes are corrupt or truncated") from None


class ImageTransform:
    """Picklable ``images → tensors`` for :func:`wdspack.loader.batch.collate.pack_to_example` (state: its settings).

    Build it with :func:`make_image_transform`. Called on a pack's encoded images it returns one
    entry per image (see the module docstring for the layouts); errors name the image's index.
    """

    def __init__(self, *, size: int, mean: Sequence[float], std: Sequence[float], processor: Any,
                 max_pixels: int, max_patches: int | None, draft: bool, formats: Sequence[str] | None) -> None:
        self.size, self.processor, self.max_pixels, self.max_patches = size, processor, max_pixels, max_patches
        self.draft, self.formats = draft, None if formats is None else tuple(formats)
        # Folded into one multiply-add per pixel: (x / 255 - mean) / std.
        self._scale = (1.0 / (255.0 * np.asarray(std, np.float32))).astype(np.float32)
        self._shift = (-np.asarray(mean, np.float32) / np.asarray(std, np.float32)).astype(np.float32)
        self._slot_shape: tuple[int, ...] | None = None

    def __repr__(self) -> str:
        what = f"processor={type(self.processor).__name__}" if self.processor is not None else f"size={self.size}"
        return f"ImageTransform({what}, max_pixels={self.max_pixels})"

    @property
    def flattened(self) -> bool:
        """True when the processor emits flattened patches plus ``image_grid_thw`` (Qwen2-VL style)."""
        return "image_grid_thw" in getattr(self.processor, "model_input_names", ())

    @property
    def merge_size(self) -> int:
        """Patches per image token along each side (Qwen2-VL: 2, so one token = 4 patches); else 1."""
        return int(getattr(self.processor, "merge_size", 1) or 1) if self.flattened else 1

    def patch_rows(self, seq_len: int, max_images: int) -> int | None:
        """Fixed patch-row count of a pack's ``pixel_values`` (flattened layout), else ``None``.

        ``max_patches`` if given; otherwise what the budgets imply: ``seq_len × merge_size²``,
        capped by ``max_images ×`` the processor's largest image in patches.

        Example:
            >>> from transformers import Qwen2VLImageProcessor
            >>> make_image_transform(processor=Qwen2VLImageProcessor()).patch_rows(1024, 2)
            4096
        """
        if not self.flattened:
            return None
        if self.max_patches is not None:
            return int(self.max_patches)
        rows = seq_len * self.merge_size ** 2
        per_image = _max_patches_per_image(self.processor)
        return min(rows, max_images * per_image) if per_image else rows

    @property
    def writes_into(self) -> bool:
        """True for the built-in path, which can split into :meth:`decode_resized` and :meth:`normalize_into`."""
        return self.processor is None

    def __call__(self, images: Sequence[bytes]) -> dict[str, torch.Tensor]:
        if self.processor is None:
            pixels = self.decode_resized(images)
            out = torch.empty((len(pixels), 3, self.size, self.size))
            self.normalize_into(pixels, out)
            return {"pixel_values": out}
        pil = [self._decode(k, data) for k, data in enumerate(images)]
        if self.flattened:
            return self._flattened(pil)
        return self._fixed(pil)

    def decode_resized(self, images: Sequence[bytes]) -> list[np.ndarray]:
        """Built-in path, first half: encoded images → ``[3, S, S]`` uint8 RGB arrays (decoded, resized,
        channel-first, read-only).

        With :meth:`normalize_into` it gives exactly what ``__call__`` gives; split, the float
        pixels can be written once, straight into their slot of a batch tensor (the loader does).

        Raises:
            ImageDecodeError: naming the image's index (``index``).
            ConfigError: the transform wraps a processor (which has no such split).

        Example:
            >>> t = make_image_transform(size=4)
            >>> buf = io.BytesIO(); Image.new("RGB", (8, 6), (255, 0, 0)).save(buf, format="PNG")
            >>> px = t.decode_resized([buf.getvalue()]); px[0].shape, px[0].dtype, px[0][:, 0, 0].tolist()
            ((3, 4, 4), dtype('uint8'), [255, 0, 0])
        """
        if self.processor is not None:
            raise ConfigError(f"decode_resized is the built-in path's; this transform wraps "
                              f"{type(self.processor).__name__}: call the transform instead")
        s = self.size
        pixels = []
        for k, data in enumerate(images):
            img = self._decode(k, data)
            if img.size != (s, s):
                img = img.resize((s, s), Image.Resampling.BICUBIC)
            # one plane per channel, each read contiguously out of Pillow's RGBX rows (no HWC → CHW gather)
            planes = b"".join([img.tobytes("raw", band) for band in _BANDS])
            pixels.append(np.frombuffer(planes, np.uint8).reshape(3, s, s))
        return pixels

    def normalize_into(self, pixels: Sequence[np.ndarray], out: torch.Tensor) -> None:
        """Built-in path, second half: ``[3, S, S]`` uint8 arrays → ``out[:N]`` ``[N, 3, S, S]`` float32, normalised.

        Each pixel is scaled straight into its slot, then shifted there; ``out`` may
        be a view into a larger batch tensor (its slots of one pack) and must be float32, C-contiguous
        per image, on the CPU. Entries of ``out`` past ``N`` are left as they are.

        Example:
            >>> t = make_image_transform(size=2)
            >>> out = torch.zeros(2, 3, 2, 2)
            >>> t.normalize_into([np.full((3, 2, 2), 255, np.uint8)], out)
            >>> out[0, :, 0, 0].tolist(), out[1].abs().sum().item()
            ([1.0, 1.0, 1.0], 0.0)
        """
        dst = self._check_out(pixels, out, torch.float32, "normalize_into")
        scale, shift = self._scale[:, None, None], self._shift[:, None, None]
        for k, px in enumerate(pixels):
            # bytes → floats in one pass, then the shift in place: (x / 255 - mean) / std.
            np.multiply(self._checked(k, px), scale, out=dst[k], casting="unsafe")
            dst[k] += shift

    def copy_into(self, pixels: Sequence[np.ndarray], out: torch.Tensor) -> None:
        """Built-in path, second half for ``pixel_dtype="uint8"``: ``[3, S, S]`` uint8 arrays → ``out[:N]``
        ``[N, 3, S, S]`` uint8, un-normalised (a plain copy); :meth:`normalize` finishes them on the device.

        ``out`` may be a view into a larger batch tensor; entries past ``N`` are left as they are.

        Example:
            >>> t = make_image_transform(size=2)
            >>> out = torch.zeros(1, 3, 2, 2, dtype=torch.uint8)
            >>> t.copy_into([np.array([255, 0, 7], np.uint8).repeat(4).reshape(3, 2, 2)], out)
            >>> out[0, :, 0, 0].tolist()
            [255, 0, 7]
        """
        dst = self._check_out(pixels, out, torch.uint8, "copy_into")
        for k, px in enumerate(pixels):
            dst[k] = self._checked(k, px)

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[..., 3, S, S]`` uint8 pixels (:meth:`copy_into`) → float32, normalised, on their own device.

        The same float32 operations, in the same order, as :meth:`normalize_into` (one multiply by
        ``1 / (255·std)``, then ``+ (-mean / std)``), so the result equals the CPU path's to the bit on
        the CPU and to float rounding elsewhere.

        Example:
            >>> t = make_image_transform(size=1)
            >>> out = t.normalize(torch.tensor([[[[255]], [[0]], [[51]]]], dtype=torch.uint8))
            >>> [round(v, 6) for v in out.flatten().tolist()]
            [1.0, -1.0, -0.6]
        """
        if pixels.dtype != torch.uint8 or pixels.ndim < 3 or pixels.shape[-3] != 3:
            raise ConfigError(f"normalize takes [..., 3, S, S] uint8 pixels, got {pixels.dtype} "
                              f"{tuple(pixels.shape)}")
        scale = torch.from_numpy(self._scale).to(pixels.device)[:, None, None]
        shift = torch.from_numpy(self._shift).to(pixels.device)[:, None, None]
        return pixels.to(torch.float32).mul_(scale).add_(shift)

    def _check_out(self, pixels: Sequence[np.ndarray], out: torch.Tensor, dtype: torch.dtype, what: str) -> np.ndarray:
        s = self.size
        if out.dtype != dtype or out.device.type != "cpu" or out.ndim != 4 \
                or tuple(out.shape[1:]) != (3, s, s) or out.shape[0] < len(pixels):
            raise ConfigError(f"{what} needs a CPU {str(dtype).removeprefix('torch.')} [>= {len(pixels)}, 3, {s}, {s}] "
                              f"tensor, got {out.dtype} {tuple(out.shape)} on {out.device}")
        return out.numpy()  # shares memory: writes land in ``out``

    def _checked(self, k: int, px: np.ndarray) -> np.ndarray:
        s = self.size
        if px.shape != (3, s, s) or px.dtype != np.uint8:
            raise ConfigError(f"pixels[{k}] is {px.dtype} {px.shape}; expected uint8 (3, {s}, {s}) from decode_resized")
        return px

    def _decode(self, k: int, data: bytes) -> Image.Image:
        try:
            return decode_image(data, max_pixels=self.max_pixels, draft=self._draft_size(), formats=self.formats)
        except ImageDecodeError as e:
            raise type(e)(f"image {k}: {e}", index=k) from None

    def _draft_size(self) -> int | None:
        if not self.draft or self.flattened:  # a dynamic grid depends on the exact size
            return None
        if self.processor is None:
            return self.size
        size = getattr(self.processor, "size", None)
        sides = [_field(size, f) for f in ("height", "width", "shortest_edge")]
        return max((s for s in sides if s), default=None)

    def _fixed(self, pil: list[Image.Image]) -> dict[str, torch.Tensor]:
        if not pil:
            return {"pixel_values": torch.zeros((0, *self._fixed_slot_shape()))}
        got = self.processor(images=pil, return_tensors="pt")
        out = {k: v for k, v in got.items() if isinstance(v, torch.Tensor)}
        bad = {k: tuple(v.shape) for k, v in out.items() if v.ndim == 0 or v.shape[0] != len(pil)}
        if bad:
            raise ConfigError(f"{type(self.processor).__name__} returned {bad} for {len(pil)} images; only "
                              "one-entry-per-image (CLIP/SigLIP) and flattened-patch (Qwen2-VL) layouts have "
                              "fixed batch shapes")
        out["pixel_values"] = out["pixel_values"].float()
        self._slot_shape = tuple(out["pixel_values"].shape[1:])
        return out

    def _fixed_slot_shape(self) -> tuple[int, ...]:
        if self._slot_shape is None:  # learn the processor's per-image shape once
            self._fixed([Image.new("RGB", (self.size, self.size))])
        assert self._slot_shape is not None
        return self._slot_shape

    def _flattened(self, pil: list[Image.Image]) -> dict[str, torch.Tensor]:
        if not pil:
            p = self.processor
            dim = 3 * int(getattr(p, "temporal_patch_size", 1) or 1) * int(p.patch_size) ** 2
            return {"pixel_values": torch.zeros(0, dim), "image_grid_thw": torch.zeros(0, 3, dtype=torch.int64)}
        got = self.processor(images=pil, return_tensors="pt")
        return {"pixel_values": got["pixel_values"].float(), "image_grid_thw": got["image_grid_thw"].long()}


def make_image_transform(*, size: int = 224, mean: Sequence[float] = SIGLIP_MEAN, std: Sequence[float] = SIGLIP_STD,
                         processor: Any = None, max_pixels: int = DEFAULT_MAX_PIXELS, max_patches: int | None = None,
                         draft: bool = True, formats: Sequence[str] | None = DEFAULT_FORMATS) -> ImageTransform:
    """The image transform the loader ships to its workers.

    Args:
        size: built-in path: output side ``S`` of ``[N, 3, S, S]`` (bicubic resize, no crop).
        mean, std: built-in path: per-channel normalisation after scaling to [0, 1]. Default
            SigLIP's (0.5); pass :data:`CLIP_MEAN` / :data:`CLIP_STD` for CLIP-style encoders.
        processor: a ``transformers`` image processor (e.g. ``SiglipImageProcessor()``,
            ``Qwen2VLImageProcessor()``); replaces ``size``/``mean``/``std``. Must be the one
            (with the same settings) that counted the image tokens when packing.
        max_pixels: decompression-bomb guard, checked on the header before decoding.
        max_patches: flattened-patch processors: the fixed patch rows per pack (default: what
            ``seq_len`` implies; lower it to save memory when images use few of the tokens).
        draft: let JPEGs decode at a reduced scale when the target is smaller.
        formats: Pillow formats to open (``None``: every installed plugin).

    Example:
        >>> t = make_image_transform(size=32)
        >>> buf = io.BytesIO(); Image.new("RGB", (64, 48), (255, 0, 0)).save(buf, format="JPEG")
        >>> t([buf.getvalue()])["pixel_values"].shape
        torch.Size([1, 3, 32, 32])
    """
    if size <= 0 or max_pixels <= 0:
        raise ConfigError(f"size {size} and max_pixels {max_pixels} must be positive")
    if len(mean) != 3 or len(std) != 3 or any(s == 0 for s in std):
        raise ConfigError(f"mean {tuple(mean)} and std {tuple(std)} need 3 values each, std non-zero")
    return ImageTransform(size=size, mean=mean, std=std, processor=processor, max_pixels=max_pixels,
                          max_patches=max_patches, draft=draft, formats=formats)


def _to_rgb(img: Image.Image) -> Image.Image:
    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")


def _available(formats: Sequence[str]) -> list[str]:
    Image.init()  # registers every plugin once; a no-op afterwards
    return list(_available_once(tuple(formats), len(Image.OPEN)))


@functools.lru_cache(maxsize=64)
def _available_once(formats: tuple[str, ...], plugins: int) -> tuple[str, ...]:
    """The installed ones of ``formats``, upper-case: worked out once per image transform rather than
    per image (``plugins``, the count of registered openers, keys in a plugin registered later)."""
    return tuple(f.upper() for f in formats if f.upper() in Image.OPEN)


def _max_patches_per_image(processor: Any) -> int | None:
    """The processor's largest image in patches (Qwen2-VL: ``max_pixels / patch_size²``)."""
    patch = getattr(processor, "patch_size", None)
    most = getattr(processor, "max_pixels", None) or _field(getattr(processor, "size", None), "longest_edge")
    return int(most) // int(patch) ** 2 if patch and most else None


def _field(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _describe(e: BaseException) -> str:
    text = str(e).split(" <")[0]  # no object addresses
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
