"""Vectorised NumPy preprocessing.

Bilinear resize is separable, so each image is resized with two whole-array passes (rows and
columns). The column gather runs once per output channel, so it also does the channel reorder
and leaves planar (3, rows, cols) float32 data: every later pass is one contiguous array op, and
the last one writes each normalised plane straight into the image's NCHW slot (no HWC batch
buffer, no strided transpose). Tap indices and weights are cached per size; work buffers are
reused per thread.

Per element the float32 operations are the plain separable ones (lerp rows or columns first,
then v * a + b). Which pass goes first is a cost choice (`_rows_first`); the two orders differ
only in float32 rounding (~1e-6 after normalising), as does the CuPy kernel, which always does
columns first.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from kernels.spec import BackendName, PreprocessSpec, axis_coords, validate_images

_TAP_CACHE = 512  # distinct (in, out) sizes kept; each entry is a few KiB


def _frozen(*arrays: np.ndarray) -> None:
    for arr in arrays:
        arr.setflags(write=False)  # shared through the cache: nobody may write into them


@lru_cache(maxsize=_TAP_CACHE)
def _row_taps(h: int, oh: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source rows (y0, y1) and the (oh, 1) weight column for an h -> oh resize."""
    y0, y1, wy = axis_coords(h, oh)
    fy = wy[:, None].copy()
    _frozen(y0, y1, fy)
    return y0, y1, fy


@lru_cache(maxsize=_TAP_CACHE)
def _col_taps(w: int, ow: int, perm: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per out channel k, offsets into a flat (pixels x 3) row of both column taps: (3, ow) each,
    row k reading source channel perm[k]; and the (ow,) weights."""
    x0, x1, wx = axis_coords(w, ow)
    ch = np.array(perm, dtype=np.intp)[:, None]
    c0 = x0[None, :] * 3 + ch
    c1 = x1[None, :] * 3 + ch
    _frozen(c0, c1, wx)
    return c0, c1, wx


_KEEP_BYTES = 32 << 20  # a scratch buffer above this (a huge image) is not kept per thread


class _Workspace(threading.local):
    """Per-thread scratch reused across images and calls: fresh multi-MiB temporaries per image
    cost page faults that rival the arithmetic."""

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, int], np.ndarray] = {}

    def get(self, dtype: str, slot: int, shape: tuple[int, ...]) -> np.ndarray:
        size = int(np.prod(shape))
        buf = self._bufs.get((dtype, slot))
        if buf is None or buf.size < size:
            buf = np.empty(size, dtype=dtype)
            if buf.nbytes <= _KEEP_BYTES:
                self._bufs[(dtype, slot)] = buf
        return buf[:size].reshape(shape)


_ws = _Workspace()


def _take(src: np.ndarray, idx: np.ndarray, axis: int, out: np.ndarray) -> np.ndarray:
    # mode="clip" (indices are in range anyway): with the default "raise", take buffers `out`.
    return np.take(src, idx, axis=axis, out=out, mode="clip")


def _gather_cols(rows: np.ndarray, cols: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out[k] = rows[:, cols[k]]: (n, W*3) pixel rows -> planar (3, n, ow), one gather a plane."""
    for k in range(3):
        if rows.dtype == out.dtype:
            _take(rows, cols[k], 1, out[k])
        else:
            out[k] = rows[:, cols[k]]  # uint8 -> float32: a fancy gather then one cast
    return out


# Cost of one element of the row-lerp pass relative to one gathered element (numpy's fancy
# gathers cost ~1 ns each, the contiguous lerp ops a fraction of that); fitted on a 2-core
# x86-64 box over 256..640 px images to 224x224 (the two orders are within ~10% near the tie).
_LERP_PER_GATHER = 0.3


def _rows_first(h: int, w: int, oh: int, ow: int) -> bool:
    """Which pass goes first: the cheaper one, counting column-tap gathers (2 per output column,
    over oh rows if rows go first, over all h source rows otherwise) plus the first lerp."""
    rows = oh * (2 * ow + _LERP_PER_GATHER * w)
    cols = h * (2 * ow + _LERP_PER_GATHER * ow)
    return rows <= cols


def _resize_planar(im: np.ndarray, spec: PreprocessSpec) -> tuple[np.ndarray, np.ndarray]:
    """Half-pixel-centre bilinear resize of one HxWx3 uint8 image, as two planar (3, oh, ow)
    float32 terms (v, d) whose sum is the resized image; the caller fuses that add."""
    oh, ow = spec.height, spec.width
    h, w = im.shape[:2]
    y0, y1, fy = _row_taps(h, oh)
    c0, c1, fx = _col_taps(w, ow, spec.perm)
    flat = im.reshape(h, w * 3)
    v = _ws.get("float32", 2, (3, oh, ow))
    d = _ws.get("float32", 3, (3, oh, ow))
    if _rows_first(h, w, oh, ow):
        rows8 = _ws.get("uint8", 0, (oh, w * 3))
        top = _ws.get("float32", 0, (oh, w * 3))
        bot = _ws.get("float32", 1, (oh, w * 3))
        np.copyto(top, _take(flat, y0, 0, rows8))  # whole-row gathers are memcpys
        np.copyto(bot, _take(flat, y1, 0, rows8))
        bot -= top
        bot *= fy
        top += bot  # rows done: (oh, w*3)
        _gather_cols(top, c0, v)
        _gather_cols(top, c1, d)
        d -= v
        d *= fx
    else:
        left = _gather_cols(flat, c0, _ws.get("float32", 0, (3, h, ow)))
        right = _gather_cols(flat, c1, _ws.get("float32", 1, (3, h, ow)))
        right -= left
        right *= fx
        left += right  # columns done: (3, h, ow)
        _take(left, y0, 1, v)
        _take(left, y1, 1, d)
        d -= v
        d *= fy
    return v, d


def _normalise_into(v: np.ndarray, d: np.ndarray, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out[k] = (v + d)[k] * a[k] + b[k]; planes are contiguous so each op is one scalar loop."""
    v += d
    for k in range(3):
        if out.dtype == np.float32:
            np.multiply(v[k], a[k], out=out[k])
            out[k] += b[k]
        else:
            v[k] *= a[k]
            v[k] += b[k]
            out[k] = v[k]  # FP16: rounded once, from the float32 result


class NumpyBackend:
    name: BackendName = "numpy"

    def preprocess(self, images: Sequence[np.ndarray], spec: PreprocessSpec) -> np.ndarray:
        validate_images(images, spec)
        a, b = spec.affine()
        out = np.empty((len(images), 3, spec.height, spec.width), dtype=spec.np_dtype)
        for i, im in enumerate(images):
            v, d = _resize_planar(im, spec)
            _normalise_into(v, d, a, b, out[i])
        return out
