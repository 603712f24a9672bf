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
from dataclasses import dataclass
from typing import Literal, Protocol, Sequence

import numpy as np

from modelyard.errors import ClientError

log = logging.getLogger(__name__)

BackendName = Literal["numpy", "cupy"]


class PreprocessError(ClientError):
    """Images or a spec the kernels cannot work on (400)."""


@dataclass(frozen=True)
class PreprocessSpec:
    """The model's declared input (mirrors `extproc.config.TensorInput`)."""

    width: int = 224
    height: int = 224
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    channel_order: Literal["RGB", "BGR"] = "RGB"
    datatype: Literal["FP32", "FP16"] = "FP32"
    scale: float = 1.0 / 255.0

    @classmethod
    def from_tensor_input(cls, ti: object) -> "PreprocessSpec":
        """Build from a `TensorInput` config section (duck-typed to keep kernels config-free)."""
        return cls(
            width=ti.width, height=ti.height, mean=tuple(ti.mean), std=tuple(ti.std),  # type: ignore[attr-defined]
            channel_order=ti.channel_order, datatype=ti.datatype, scale=ti.scale,  # type: ignore[attr-defined]
        )

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(np.float16 if self.datatype == "FP16" else np.float32)

    @property
    def perm(self) -> tuple[int, int, int]:
        return (2, 1, 0) if self.channel_order == "BGR" else (0, 1, 2)

    def affine(self) -> tuple[np.ndarray, np.ndarray]:
        """Per output channel (a, b) with out = v * a + b; folds scale, mean, std and order."""
        a = np.array([self.scale / self.std[p] for p in self.perm], dtype=np.float32)
        b = np.array([-self.mean[p] / self.std[p] for p in self.perm], dtype=np.float32)
        return a, b


class Backend(Protocol):
    name: BackendName

    def preprocess(self, images: Sequence[np.ndarray], spec: PreprocessSpec) -> np.ndarray: ...


def validate_images(images: Sequence[np.ndarray], spec: PreprocessSpec) -> None:
    """Shared input checks so both backends reject the same inputs the same way."""
    if len(images) == 0:
        raise PreprocessError("no images to preprocess")
    if spec.width < 1 or spec.height < 1:
        raise PreprocessError(f"bad output size {spec.width}x{spec.height}")
    if any(s == 0 for s in spec.std):
        raise PreprocessError("std must be non-zero")
    for i, img in enumerate(images):
        if not isinstance(img, np.ndarray) or img.dtype != np.uint8:
            raise PreprocessError(f"image {i}: expected a uint8 array")
        if img.ndim != 3 or img.shape[2] != 3 or img.shape[0] < 1 or img.shape[1] < 1:
            raise PreprocessError(f"image {i}: expected HxWx3, got {img.shape}")


def axis_coords(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Half-pixel-centre source taps for one axis: (i0, i1, w1) with v = (1-w1)*p[i0] + w1*p[i1]."""
    src = (np.arange(out_size, dtype=np.float64) + 0.5) * (in_size / out_size) - 0.5
    src = np.maximum(src, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    i1 = np.minimum(i0 + 1, in_size - 1)
    w1 = (src - i0).astype(np.float32)
    return i0, i1, w1


_backends: dict[str, Backend] = {}


def select_backend(preference: Literal["auto", "cpu", "gpu"] = "auto") -> Backend:
    """Pick the backend and log the choice; "gpu" without a device falls back to NumPy (logged)."""
    from kernels import cupy_backend, numpy_backend

    if preference not in ("auto", "cpu", "gpu"):
        raise ValueError(f"image backend preference {preference!r} is not auto|cpu|gpu")
    if preference != "cpu" and cupy_backend.available():
        key = "cupy"
        if key not in _backends:
            _backends[key] = cupy_backend.CupyBackend()
        log.info("image preprocessing backend: cupy (preference=%s)", preference)
        return _backends[key]
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
