"""A plain, per-image reference for the preprocessing kernels: explicit loops, float64."""

from __future__ import annotations

import math

import numpy as np


def _taps(out_i: int, in_size: int, out_size: int) -> tuple[int, int, float]:
    src = (out_i + 0.5) * in_size / out_size - 0.5
    if src < 0:
        src = 0.0
    i0 = min(int(math.floor(src)), in_size - 1)
    i1 = min(i0 + 1, in_size - 1)
    return i0, i1, src - i0


def reference_preprocess(image: np.ndarray, width: int, height: int, mean, std, scale: float,
                         channel_order: str = "RGB") -> np.ndarray:
    """One image -> CHW float64, written as loops so it is obviously right."""
    h, w, _ = image.shape
    order = [2, 1, 0] if channel_order == "BGR" else [0, 1, 2]
    out = np.zeros((3, height, width), dtype=np.float64)
    for k, c in enumerate(order):
        for y in range(height):
            y0, y1, fy = _taps(y, h, height)
            for x in range(width):
                x0, x1, fx = _taps(x, w, width)
                p00 = float(image[y0, x0, c]); p01 = float(image[y0, x1, c])
                p10 = float(image[y1, x0, c]); p11 = float(image[y1, x1, c])
                v = (p00 * (1 - fx) * (1 - fy) + p01 * fx * (1 - fy)
                     + p10 * (1 - fx) * fy + p11 * fx * fy)
                out[k, y, x] = (v * scale - mean[c]) / std[c]
    return out
