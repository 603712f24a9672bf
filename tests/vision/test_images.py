from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from adapters.images import ImageError, ImageUpload, decode_image, decode_images, probe_image
from tests.vision.imagegen import encode, png_bomb


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_allowed_formats_decode_to_rgb(fmt):
    arr = decode_image(encode((255, 0, 0), (20, 10), fmt))
    assert arr.shape == (10, 20, 3) and arr.dtype == np.uint8
    assert arr[..., 0].min() > 240 and arr[..., 1:].max() < 16


@pytest.mark.parametrize("mode,colour", [("RGBA", (0, 255, 0, 128)), ("L", 200), ("P", 3), ("LA", (10, 20))], ids=[
    "RGBA", "L", "P", "LA"
])
def test_other_modes_become_rgb(mode, colour):
    arr = decode_image(encode(colour, (5, 6), "PNG", mode))
    assert arr.shape == (6, 5, 3)


def test_16bit_png_scaled_not_clipped():
    buf = io.BytesIO()
    Image.new("I;16", (4, 4), 65535).save(buf, "PNG")
    arr = decode_image(buf.getvalue())
    assert arr.shape == (4, 4, 3) and int(arr.min()) == 255


def test_truncated_png_is_400():
    data = encode((1, 2, 3), (64, 64), "PNG")
    with pytest.raises(ImageError) as e:
        decode_image(data[: len(data) // 2])
    assert e.value.status == 400


def test_truncated_jpeg_is_400():
    data = encode((1, 2, 3), (64, 64), "JPEG")
    with pytest.raises(ImageError) as e:
        decode_image(data[:300])
    assert e.value.status == 400


@pytest.mark.parametrize("data", [b"", b"hello, world", b"%PDF-1.4\n...", b"\x89PNG\r\n\x1a\n"], ids=[
    "empty", "text", "pdf", "png-signature-only"
])
def test_non_image_is_400(data):
    with pytest.raises(ImageError) as e:
        decode_image(data)
    assert e.value.status == 400


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "TIFF"])
def test_unsupported_format_is_400(fmt):
    with pytest.raises(ImageError) as e:
        decode_image(encode((0, 0, 255), (8, 8), fmt))
    assert e.value.status == 400 and "unsupported image format" in e.value.message


def test_bomb_rejected_from_header_413():
    bomb = png_bomb(100_000, 100_000)
    assert len(bomb) < 200
    with pytest.raises(ImageError) as e:
        probe_image(bomb, max_pixels=40_000_000)
    assert e.value.status == 413
    with pytest.raises(ImageError) as e:
        decode_image(bomb, max_pixels=40_000_000)
    assert e.value.status == 413


def test_pixel_limit_is_configurable():
    data = encode(size=(100, 100))
    assert probe_image(data, max_pixels=10_000)[1:] == (100, 100)
    with pytest.raises(ImageError) as e:
        decode_image(data, max_pixels=9_999)
    assert e.value.status == 413


def test_decode_images_counts_and_order():
    ups = [ImageUpload(i, encode(c, (4, 4))) for i, c in enumerate([(255, 0, 0), (0, 255, 0), (0, 0, 255)])]
    arrs = decode_images(ups, max_images=3)
    assert [int(a[0, 0].argmax()) for a in arrs] == [0, 1, 2]
    with pytest.raises(ImageError) as e:
        decode_images(ups, max_images=2)
    assert e.value.status == 413
    with pytest.raises(ImageError) as e:
        decode_images([], max_images=2)
    assert e.value.status == 400


def test_decode_images_bomb_anywhere_fails_before_decoding():
    ups = [ImageUpload(0, encode()), ImageUpload(1, png_bomb(50_000, 50_000), "bomb.png")]
    with pytest.raises(ImageError) as e:
        decode_images(ups, max_images=4)
    assert e.value.status == 413 and "bomb.png" in e.value.message


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=512))
def test_fuzz_random_bytes_only_image_errors(data):
    try:
        decode_image(data, max_pixels=1_000_000)
    except ImageError as e:
        assert e.status in (400, 413)


_SEEDS = [encode(fmt=f, size=(16, 16)) for f in ("PNG", "JPEG", "WEBP")]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(_SEEDS), st.integers(0, 400), st.binary(min_size=1, max_size=8))
def test_fuzz_mutated_images_only_image_errors(seed, at, patch):
    at = min(at, len(seed) - 1)
    data = seed[:at] + patch + seed[at + len(patch):]
    try:
        arr = decode_image(data, max_pixels=1_000_000)
        assert arr.ndim == 3 and arr.shape[2] == 3
    except ImageError as e:
        assert e.status in (400, 413)
