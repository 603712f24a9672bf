"""Vectorised NumPy preprocessing.

Bilinear resize is separable, so each image is resized with two whole-array passes (rows and
columns) into one batch buffer; normalise, channel order, NCHW layout and cast then run once
over the whole batch. Same arithmetic as the CuPy kernel up to float32 rounding order.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kernels.spec import BackendName, PreprocessSpec, axis_coords, validate_images


def _resize_into(im: np.ndarray, out: np.ndarray) -> None:
    """Half-pixel-centre bilinear resize of one HxWx3 uint8 image into out (oh, ow, 3) float32.

    Two separable passes; whichever axis shrinks the intermediate more goes first. Rows are
    kept flat (pixels x 3 contiguous) so every broadcast runs over a long inner loop.
    """
    oh, ow = out.shape[:2]
    h, w = im.shape[:2]
    y0, y1, wy = axis_coords(h, oh)
    x0, x1, wx = axis_coords(w, ow)
    fy = wy[:, None]
    fx = np.repeat(wx, 3)[None, :]
    flat_out = out.reshape(oh, ow * 3)
    if oh * w <= h * ow:
        top = np.take(im, y0, axis=0).reshape(oh, w * 3).astype(np.float32)
        bot = np.take(im, y1, axis=0).reshape(oh, w * 3).astype(np.float32)
        bot -= top
        bot *= fy
        top += bot  # rows done: (oh, w*3)
        rows = top.reshape(oh, w, 3)
        left = np.take(rows, x0, axis=1).reshape(oh, ow * 3)
        right = np.take(rows, x1, axis=1).reshape(oh, ow * 3)
        right -= left
        right *= fx
        np.add(left, right, out=flat_out)
    else:
        left = np.take(im, x0, axis=1).reshape(h, ow * 3).astype(np.float32)
        right = np.take(im, x1, axis=1).reshape(h, ow * 3).astype(np.float32)
        right -= left
        right *= fx
        left += right  # columns done: (h, ow*3)
        top = np.take(left, y0, axis=0)
        bot = np.take(left, y1, axis=0)
        bot -= top
        bot *= fy
        np.add(top, bot, out=flat_out)


class NumpyBackend:
    name: BackendName = "numpy"

    def preprocess(self, images: Sequence[np.ndarray], spec: PreprocessSpec) -> np.ndarray:
        validate_images(images, spec)
        n, oh, ow = len(images), spec.height, spec.width
        hwc = np.empty((n, oh, ow, 3), dtype=np.float32)
        for i, im in enumerate(images):
            _resize_into(im, hwc[i])
        a, b = spec.affine()
        out = np.empty((n, 3, oh, ow), dtype=spec.np_dtype)
        for k, src_c in enumerate(spec.perm):
            # One fused multiply-add per channel plane; the strided read does the HWC->CHW move.
            plane = hwc[:, :, :, src_c] * a[k]
            plane += b[k]
            out[:, k] = plane
        return out
