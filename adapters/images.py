"""Decode uploaded image bytes into uint8 HWC RGB arrays, safely.

Only JPEG, PNG and WebP are accepted, identified from the file's own header (never from the
filename or the part's content type). Every image's dimensions are read from its header (Pillow
opens lazily) and checked against the per-image and per-request budgets (`ImageBudget`) BEFORE
any pixel of any image is decoded, so a small file declaring a huge canvas (a decompression
bomb), or many mid-size ones adding up, cost microseconds. `check_images` does only that, so the
request path can route and admit between it and `decode_checked`. Every failure is an
`ImageError` carrying 400 or 413.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

from contracts.errors import ClientError

ALLOWED_FORMATS = frozenset({"JPEG", "PNG", "WEBP"})
DEFAULT_MAX_PIXELS = 40_000_000
DEFAULT_MAX_REQUEST_PIXELS = 50_000_000  # one large photo, or 16 of 3 MP
DEFAULT_MAX_DECODED_BYTES = 384 * 1024 * 1024  # the default pixel budget at 4 bytes + its RGB copy
_BAND_BYTES = {"I;16": 2, "I;16B": 2, "I;16L": 2, "I": 4, "F": 4}
_FORMATS = ["JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF"]  # open() identifies these, we then gate


class ImageError(ClientError):
    """An image the gateway will not decode; `status` is 400 (bad input) or 413 (too large)."""


@dataclass(frozen=True)
class ImageUpload:
    """One uploaded file as it came in; `index` keeps upload order."""

    index: int
    data: bytes
    filename: str | None = None
    content_type: str | None = None


@dataclass(frozen=True)
class ImageBudget:
    """What one request may make the gateway decode (the model's `vision` section sets it)."""

    max_images: int = 16
    max_image_pixels: int = DEFAULT_MAX_PIXELS
    max_request_pixels: int = DEFAULT_MAX_REQUEST_PIXELS
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES


@dataclass(frozen=True)
class ImageHeader:
    """What an image's header says, read without decoding a pixel."""

    format: str
    width: int
    height: int
    mode: str

    @property
    def pixels(self) -> int:
        return self.width * self.height

    @property
    def decoded_bytes(self) -> int:
        """The decoded frame in its own mode plus the RGB array made from it."""
        per_pixel = _BAND_BYTES.get(self.mode, 1) * max(1, Image.getmodebands(self.mode))
        return self.pixels * (per_pixel + 3)


def _label(index: int, filename: str | None) -> str:
    return f"image {index}" + (f" ({filename!r})" if filename else "")


def probe_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, *, label: str = "image") -> tuple[str, int, int]:
    """Read only the header: (format, width, height); raises ImageError for anything unusable."""
    h = read_header(data, max_pixels, label=label)
    return h.format, h.width, h.height


def read_header(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, *, label: str = "image") -> ImageHeader:
    """Format, size and mode from the header alone; raises ImageError for anything unusable."""
    if not data:
        raise ImageError(f"{label}: empty file")
    try:
        with Image.open(io.BytesIO(data), formats=_FORMATS) as im:
            fmt, (w, h), mode = im.format or "", im.size, im.mode
    except UnidentifiedImageError:
        raise ImageError(f"{label}: not a recognised image (JPEG, PNG or WebP expected)") from None
    except Image.DecompressionBombError:
        raise ImageError(f"{label}: image dimensions exceed the limit", status=413) from None
    except Exception as e:  # noqa: BLE001  (Pillow plugins raise assorted types on corrupt headers)
        raise ImageError(f"{label}: unreadable image header ({type(e).__name__})") from None
    if fmt not in ALLOWED_FORMATS:
        raise ImageError(f"{label}: unsupported image format {fmt or 'unknown'} (JPEG, PNG or WebP expected)")
    if w < 1 or h < 1:
        raise ImageError(f"{label}: image has no pixels ({w}x{h})")
    if w * h > max_pixels:
        raise ImageError(f"{label}: {w}x{h} = {w * h} pixels exceeds the limit of {max_pixels}", status=413)
    return ImageHeader(fmt, w, h, mode)


def decode_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, *, label: str = "image") -> np.ndarray:
    """Decode to a HxWx3 uint8 RGB array after the header checks; alpha is dropped, first frame only."""
    probe_image(data, max_pixels, label=label)
    try:
        with Image.open(io.BytesIO(data), formats=list(ALLOWED_FORMATS)) as im:
            im.load()
            if im.mode in ("I;16", "I;16B", "I;16L", "I"):
                # 16/32-bit grey: convert("RGB") would clip, so scale to 8 bits first.
                arr = np.clip(np.asarray(im).astype(np.int64), 0, None)
                peak = 65535 if im.mode.startswith("I;16") else max(int(arr.max()), 1)
                grey = (arr * 255 // peak).astype(np.uint8)
                return np.ascontiguousarray(np.repeat(grey[:, :, None], 3, axis=2))
            rgb = im if im.mode == "RGB" else im.convert("RGB")
            arr = np.asarray(rgb, dtype=np.uint8)
    except Image.DecompressionBombError:
        raise ImageError(f"{label}: image dimensions exceed the limit", status=413) from None
    except Exception as e:  # noqa: BLE001  (decoders raise assorted types on corrupt data)
        raise ImageError(f"{label}: corrupt or truncated image ({type(e).__name__}: {e})") from None
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ImageError(f"{label}: could not convert to RGB")
    return np.ascontiguousarray(arr)


def check_images(uploads: Sequence[ImageUpload], budget: ImageBudget) -> list[ImageHeader]:
    """Count, every header, then the request's pixel and decoded-byte sums; nothing is decoded."""
    if not uploads:
        raise ImageError("no images in the request (send one or more `image` files)")
    if len(uploads) > budget.max_images:
        raise ImageError(f"{len(uploads)} images exceed the maximum of {budget.max_images} per request", status=413)
    headers = [read_header(u.data, budget.max_image_pixels, label=_label(u.index, u.filename)) for u in uploads]
    pixels = sum(h.pixels for h in headers)
    if pixels > budget.max_request_pixels:
        raise ImageError(f"the images hold {pixels} pixels together, over the request budget of "
                         f"{budget.max_request_pixels}", status=413)
    decoded = sum(h.decoded_bytes for h in headers)
    if decoded > budget.max_decoded_bytes:
        raise ImageError(f"the images would decode to {decoded} bytes, over the request budget of "
                         f"{budget.max_decoded_bytes}", status=413)
    return headers


def decode_checked(uploads: Sequence[ImageUpload], budget: ImageBudget) -> list[np.ndarray]:
    """Decode images that `check_images` passed, in upload order."""
    return [decode_image(u.data, budget.max_image_pixels, label=_label(u.index, u.filename)) for u in uploads]


def decode_images(
    uploads: Sequence[ImageUpload], max_images: int, max_pixels: int = DEFAULT_MAX_PIXELS, *,
    max_request_pixels: int = DEFAULT_MAX_REQUEST_PIXELS, max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES,
) -> list[np.ndarray]:
    """Count checks first (0 -> 400, over max -> 413), then all headers and budgets, then pixels."""
    budget = ImageBudget(max_images, max_pixels, max_request_pixels, max_decoded_bytes)
    check_images(uploads, budget)
    return decode_checked(uploads, budget)
