"""NumPy kernels against the plain per-image reference; CuPy parity when a device exists.

Tolerance: FP32 output within 1e-4 absolute of the float64 reference (normalised values are at
most ~2.7, float32 keeps ~7 digits); FP16 within 1e-3 relative + 2e-3 absolute (one FP16 ulp).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from kernels import PreprocessError, PreprocessSpec, cupy_backend, preprocess, select_backend
from kernels.numpy_backend import NumpyBackend
from tests.vision.reference import reference_preprocess

FP32_ATOL = 1e-4
FP16_RTOL, FP16_ATOL = 1e-3, 2e-3


def _images(rng: np.random.Generator, sizes: list[tuple[int, int]]) -> list[np.ndarray]:
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]


def _ref(images, spec):
    return np.stack([reference_preprocess(im, spec.width, spec.height, spec.mean, spec.std, spec.scale,
                                          spec.channel_order) for im in images])


@pytest.mark.parametrize("out_hw", [(8, 8), (12, 20), (17, 5)], ids=["8x8", "12x20", "17x5"])
@pytest.mark.parametrize("order", ["RGB", "BGR"])
def test_numpy_matches_reference_mixed_sizes(out_hw, order):
    rng = np.random.default_rng(1)
    imgs = _images(rng, [(9, 31), (40, 23), (5, 5), (1, 1), (64, 3), (8, 8)])
    spec = PreprocessSpec(height=out_hw[0], width=out_hw[1], channel_order=order)
    got = NumpyBackend().preprocess(imgs, spec)
    assert got.shape == (6, 3, *out_hw) and got.dtype == np.float32
    np.testing.assert_allclose(got, _ref(imgs, spec), rtol=0, atol=FP32_ATOL)


def test_fp16_matches_reference():
    rng = np.random.default_rng(2)
    imgs = _images(rng, [(30, 41), (13, 7)])
    spec = PreprocessSpec(height=11, width=13, datatype="FP16", channel_order="BGR")
    got = preprocess(imgs, spec)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), _ref(imgs, spec), rtol=FP16_RTOL, atol=FP16_ATOL)


def test_custom_mean_std_scale():
    rng = np.random.default_rng(3)
    imgs = _images(rng, [(20, 20)])
    spec = PreprocessSpec(height=6, width=9, mean=(0.5, 0.25, 0.0), std=(0.5, 2.0, 1.0), scale=1.0)
    np.testing.assert_allclose(preprocess(imgs, spec), _ref(imgs, spec), rtol=1e-6, atol=1e-3)


def test_identity_size_is_exact_copy_before_normalise():
    rng = np.random.default_rng(4)
    im = _images(rng, [(16, 24)])[0]
    spec = PreprocessSpec(height=16, width=24, mean=(0, 0, 0), std=(1, 1, 1), scale=1.0)
    got = preprocess([im], spec)[0]
    np.testing.assert_array_equal(got, im.transpose(2, 0, 1).astype(np.float32))


def test_bgr_swaps_planes():
    rng = np.random.default_rng(5)
    im = _images(rng, [(10, 10)])
    rgb = preprocess(im, PreprocessSpec(height=7, width=7, mean=(0.1, 0.2, 0.3), std=(0.3, 0.2, 0.1)))
    bgr = preprocess(im, PreprocessSpec(height=7, width=7, mean=(0.1, 0.2, 0.3), std=(0.3, 0.2, 0.1), channel_order="BGR"))
    np.testing.assert_array_equal(rgb[:, ::-1], bgr)


def test_downscale_is_not_antialiased_pillow():
    """Half-pixel bilinear at 2x down samples between pixel pairs: the mean of 2x2 blocks."""
    im = np.zeros((4, 4, 3), np.uint8)
    im[::2, ::2] = 200
    spec = PreprocessSpec(height=2, width=2, mean=(0, 0, 0), std=(1, 1, 1), scale=1.0)
    got = preprocess([im], spec)
    np.testing.assert_allclose(got, 50.0, atol=1e-5)


def test_realistic_sizes_against_reference_subsample():
    rng = np.random.default_rng(6)
    imgs = _images(rng, [(300, 257), (640, 480)])
    spec = PreprocessSpec(height=32, width=32)
    np.testing.assert_allclose(preprocess(imgs, spec), _ref(imgs, spec), rtol=0, atol=FP32_ATOL)


@pytest.mark.parametrize("bad", [
    [], [np.zeros((4, 4), np.uint8)], [np.zeros((4, 4, 4), np.uint8)], [np.zeros((4, 4, 3), np.float32)],
    [np.zeros((0, 4, 3), np.uint8)],
], ids=["empty", "grey-2d", "four-channels", "float-pixels", "zero-height"])
def test_bad_batches_raise_400(bad):
    with pytest.raises(PreprocessError) as e:
        preprocess(bad, PreprocessSpec())
    assert e.value.status == 400


def test_select_backend_falls_back_and_logs(caplog):
    caplog.set_level(logging.INFO, logger="kernels.preprocess")
    b = select_backend("cpu")
    assert b.name == "numpy"
    expected = "cupy" if cupy_backend.available() else "numpy"
    assert select_backend("auto").name == expected
    assert select_backend("gpu").name == expected
    assert any("backend" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError):
        select_backend("tpu")  # type: ignore[arg-type]


def test_cupy_detection_never_raises():
    assert isinstance(cupy_backend.available(), bool)


needs_gpu = pytest.mark.skipif(not cupy_backend.available(), reason="no CuPy device")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("datatype", ["FP32", "FP16"])
@pytest.mark.parametrize("order", ["RGB", "BGR"])
def test_cupy_matches_numpy(datatype, order):
    rng = np.random.default_rng(7)
    imgs = _images(rng, [(300, 257), (640, 480), (5, 9), (224, 224)])
    spec = PreprocessSpec(height=224, width=224, datatype=datatype, channel_order=order)
    gpu = cupy_backend.CupyBackend()
    got = gpu.preprocess(imgs, spec)
    want = NumpyBackend().preprocess(imgs, spec)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = (FP16_RTOL, FP16_ATOL) if datatype == "FP16" else (0, FP32_ATOL)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol[0], atol=tol[1])
    # Buffers are reused keyed by shape: a second call of the same shape gives the same answer.
    np.testing.assert_array_equal(gpu.preprocess(imgs, spec), got)


@pytest.mark.gpu
@needs_gpu
def test_cupy_matches_reference_small():
    rng = np.random.default_rng(8)
    imgs = _images(rng, [(9, 31), (40, 23), (1, 1)])
    spec = PreprocessSpec(height=12, width=20, channel_order="BGR")
    got = cupy_backend.CupyBackend().preprocess(imgs, spec)
    np.testing.assert_allclose(got, _ref(imgs, spec), rtol=0, atol=FP32_ATOL)


@pytest.mark.parametrize("src_hw,out_hw", [((7, 9), (20, 25)), ((16, 16), (32, 48)), ((31, 17), (31, 40))], ids=[
    "7x9-to-20x25", "16x16-to-32x48", "31x17-to-31x40"
])
def test_upscale_matches_pillow_resize(src_hw, out_hw):
    """Pillow's BILINEAR is plain half-pixel bilinear when enlarging (it only antialiases when
    shrinking), so there the NumPy path must match Pillow resize + arithmetic, up to Pillow's
    rounding of its result to uint8 (half a level, plus its fixed-point interpolation)."""
    from PIL import Image

    rng = np.random.default_rng(7)
    im = _images(rng, [src_hw])[0]
    spec = PreprocessSpec(height=out_hw[0], width=out_hw[1])
    resized = np.asarray(Image.fromarray(im).resize((out_hw[1], out_hw[0]), Image.BILINEAR), np.float64)
    want = ((resized * spec.scale - np.array(spec.mean)) / np.array(spec.std)).transpose(2, 0, 1)
    got = preprocess([im], spec)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1.0 / 255 / min(spec.std))


@pytest.mark.parametrize("rows_first", [True, False], ids=["rows-first", "columns-first"])
@pytest.mark.parametrize("spec", [PreprocessSpec(height=12, width=20, channel_order="BGR"),
                                  PreprocessSpec(height=9, width=7, datatype="FP16")], ids=[
    "BGR-12x20", "FP16-9x7"
])
def test_numpy_both_pass_orders_match_reference(monkeypatch, rows_first, spec):
    """The NumPy backend picks rows- or columns-first by cost; either order must be right."""
    from kernels import numpy_backend

    monkeypatch.setattr(numpy_backend, "_rows_first", lambda *_: rows_first)
    rng = np.random.default_rng(11)
    imgs = _images(rng, [(9, 31), (40, 23), (1, 1), (64, 3), (12, 20)])
    got = NumpyBackend().preprocess(imgs, spec)
    tol = dict(rtol=FP16_RTOL, atol=FP16_ATOL) if spec.datatype == "FP16" else dict(rtol=0, atol=FP32_ATOL)
    np.testing.assert_allclose(got.astype(np.float64), _ref(imgs, spec), **tol)


def test_numpy_scratch_reuse_is_stateless_across_calls_and_threads():
    """Work buffers are reused per thread and taps cached per size: results never depend on
    what ran before, nor on which thread runs them."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(12)
    big, small = _images(rng, [(300, 257), (640, 480)]), _images(rng, [(5, 9), (40, 23)])
    spec = PreprocessSpec(height=32, width=32)
    first = NumpyBackend().preprocess(small, spec)
    NumpyBackend().preprocess(big, spec)  # grows the buffers
    np.testing.assert_array_equal(NumpyBackend().preprocess(small, spec), first)
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda ims: NumpyBackend().preprocess(ims, spec), [big, small] * 8))
    for got, ims in zip(outs, [big, small] * 8):
        np.testing.assert_allclose(got, _ref(ims, spec), rtol=0, atol=FP32_ATOL)
