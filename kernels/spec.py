"""What every preprocessing backend shares: the spec it is given, the Backend protocol it
implements, the input checks both apply and the resize taps both compute (so their outputs agree).

A leaf: the backends import it, and `kernels.preprocess` imports the backends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from contracts.errors import ClientError

BackendName = Literal["numpy", "cupy"]
ChannelOrder = Literal["RGB", "BGR"]
Datatype = Literal["FP32", "FP16"]


class PreprocessError(ClientError):
    """Images or a spec the kernels cannot work on (400)."""


class TensorInputLike(Protocol):
    """The fields of `contracts.config.TensorInput` a spec is built from."""

    @property
    def width(self) -> int: ...
    @property
    def height(self) -> int: ...
    @property
    def mean(self) -> Sequence[float]: ...
    @property
    def std(self) -> Sequence[float]: ...
    @property
    def channel_order(self) -> ChannelOrder: ...
    @property
    def datatype(self) -> Datatype: ...
    @property
    def scale(self) -> float: ...


def _triple(v: Sequence[float]) -> tuple[float, float, float]:
    a, b, c = v
    return a, b, c


@dataclass(frozen=True)
class PreprocessSpec:
    """The model's declared input (mirrors `contracts.config.TensorInput`)."""

    width: int = 224
    height: int = 224
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    channel_order: ChannelOrder = "RGB"
    datatype: Datatype = "FP32"
    scale: float = 1.0 / 255.0

    @classmethod
    def from_tensor_input(cls, ti: TensorInputLike) -> PreprocessSpec:
        """Build from a `TensorInput` config section (duck-typed to keep kernels config-free)."""
        # Copied into tuples: the spec is hashed (CuPy caches constants per spec).
        return cls(
            width=ti.width, height=ti.height, mean=_triple(ti.mean), std=_triple(ti.std),
            channel_order=ti.channel_order, datatype=ti.datatype, scale=ti.scale,
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


