"""One preprocessing API over a batch of decoded images, with a NumPy and a CuPy backend.

Input: uint8 HWC RGB arrays of any (different) sizes. Output: one NCHW tensor (float32 or
float16) of the model's declared input size. Per output element the pipeline is

    v   = bilinear(image, y, x, c)            # half-pixel centres, float, no rounding
    out = (v * scale - mean[c]) / std[c]      # mean/std index the R, G, B channels
    out channel k = source channel perm[k]     # perm = (0,1,2) for RGB, (2,1,0) for BGR

Resize reference: half-pixel-centre bilinear, the same sampling as OpenCV INTER_LINEAR and
PyTorch `interpolate(mode="bilinear", align_corners=False, antialias=False)`:
`src = (dst + 0.5) * in/out - 0.5`, clamped below at 0, neighbours clamped at the edge.
It does NOT antialias when downscaling (Pillow's BILINEAR does, so it is not the reference).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

import numpy as np

from kernels import cupy_backend, numpy_backend
from kernels.spec import Backend, BackendName, PreprocessSpec

log = logging.getLogger(__name__)

_backends: dict[BackendName, Backend] = {}


BackendPreference = Literal["auto", "cpu", "gpu"]


def select_backend(preference: BackendPreference = "auto") -> Backend:
    """Pick the backend and log the choice; "gpu" without a device falls back to NumPy (logged)."""
    if preference not in ("auto", "cpu", "gpu"):
        raise ValueError(f"image backend preference {preference!r} is not auto|cpu|gpu")
    if preference != "cpu" and cupy_backend.available():
        if "cupy" not in _backends:
            _backends["cupy"] = cupy_backend.CupyBackend()
        log.info("image preprocessing backend: cupy (preference=%s)", preference)
        return _backends["cupy"]
    if preference == "gpu":
        log.warning("image preprocessing backend: gpu requested but no CuPy device; using numpy")
    else:
        log.info("image preprocessing backend: numpy (preference=%s)", preference)
    return _backends.setdefault("numpy", numpy_backend.NumpyBackend())


def preprocess(
    images: Sequence[np.ndarray], spec: PreprocessSpec, backend: Backend | None = None
) -> np.ndarray:
    """Resize, scale, normalise, reorder and cast a batch into one NCHW host array."""
    b = backend or _backends.get("numpy") or select_backend("cpu")
    return b.preprocess(images, spec)
