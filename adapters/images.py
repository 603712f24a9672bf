"""Decode uploaded image bytes into uint8 HWC RGB arrays, safely.

Only JPEG, PNG and WebP are accepted, identified from the file's own header (never from the
filename or the part's content type). The pixel count is read from the header and checked
BEFORE any pixel is decoded, so a small file declaring a huge canvas (a decompression bomb)
costs nothing. Every failure is an `ImageError` carrying 400 or 413.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from PIL import Image, UnidentifiedImageError

from modelyard.errors import ClientError

ALLOWED_FORMATS = frozenset({"JPEG", "PNG", "WEBP"})
DEFAULT_MAX_PIXELS = 40_000_000
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


def _label(index: int, filename: str | None) -> str:
    return f"image {index}" + (f" ({filename!r})" if filename else "")


def probe_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, *, label: str = "image") -> tuple[str, int, int]:
    """Read only the header: (format, width, height); raises ImageError for anything unusable."""
    if not data:
        raise ImageError(f"{label}: empty file")
    try:
        with Image.open(io.BytesIO(data), formats=_FORMATS) as im:
            fmt, (w, h) = im.format or "", im.size
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
    return fmt, w, h


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


def decode_images(
    uploads: Sequence[ImageUpload], max_images: int, max_pixels: int = DEFAULT_MAX_PIXELS
) -> list[np.ndarray]:
    """Count checks first (0 -> 400, over max -> 413), then all headers, then pixels, in order."""
    if not uploads:
        raise ImageError("no images in the request (send one or more `image` files)")
    if len(uploads) > max_images:
        raise ImageError(f"{len(uploads)} images exceed the maximum of {max_images} per request", status=413)
    # Headers first so one bomb in the batch fails the request before any pixels are decoded.
    for u in uploads:
        probe_image(u.data, max_pixels, label=_label(u.index, u.filename))
    return [decode_image(u.data, max_pixels, label=_label(u.index, u.filename)) for u in uploads]
