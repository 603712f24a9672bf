"""CuPy preprocessing: one fused RawKernel, one thread per output element.

Each thread computes resize (half-pixel-centre bilinear) + scale/normalise + channel order +
NCHW layout + dtype cast for one (n, c, y, x) and writes it once. Device buffers are reused
across calls, keyed by shape. CuPy is imported lazily so the module loads without it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from kernels.spec import BackendName, PreprocessSpec, validate_images

log = logging.getLogger(__name__)

_SOURCE = r"""
// float -> IEEE half bits, round to nearest even; written out so no CUDA header is needed
// (NVRTC under CuPy wheels may lack cuda_fp16.h). Mirrored in Python by tests/vision.
__device__ __forceinline__ unsigned short f2h_bits(float f) {
    unsigned int x = __float_as_uint(f);
    unsigned int sign = (x >> 16) & 0x8000u;
    unsigned int mant = x & 0x007fffffu;
    int exp = (int)((x >> 23) & 0xffu);
    if (exp == 0xff) return (unsigned short)(sign | 0x7c00u | (mant ? 0x200u : 0u));
    int e = exp - 127 + 15;
    if (e >= 0x1f) return (unsigned short)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return (unsigned short)sign;
        mant |= 0x800000u;
        int shift = 14 - e;
        unsigned int hm = mant >> shift;
        unsigned int rem = mant & ((1u << shift) - 1u);
        unsigned int halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (hm & 1u))) hm++;
        return (unsigned short)(sign | hm);
    }
    unsigned int h = sign | ((unsigned int)e << 10) | (mant >> 13);
    unsigned int rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;  // a carry into the exponent is correct
    return (unsigned short)h;
}
template <typename T> __device__ __forceinline__ T _cast(float v);
template <> __device__ __forceinline__ float _cast<float>(float v) { return v; }
template <> __device__ __forceinline__ unsigned short _cast<unsigned short>(float v) { return f2h_bits(v); }

template <typename T>
__global__ void preprocess_nchw(
    const unsigned char* __restrict__ src, const long long* __restrict__ offsets,
    const int* __restrict__ heights, const int* __restrict__ widths,
    const int* __restrict__ perm, const float* __restrict__ a, const float* __restrict__ b,
    T* __restrict__ out, int n, int oh, int ow)
{
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)n * 3 * oh * ow;
    if (idx >= total) return;
    int x = (int)(idx % ow);
    int y = (int)((idx / ow) % oh);
    int c = (int)((idx / ((long long)ow * oh)) % 3);
    int i = (int)(idx / ((long long)ow * oh * 3));
    int h = heights[i], w = widths[i];
    // Same arithmetic as kernels.spec.axis_coords (half-pixel centres, clamped), in double as
    // NumPy does it: float32 source coordinates past a few hundred pixels are off by ~1e-4 of a
    // pixel, which moved outputs by up to 2.5e-4 on an H100 (tests/vision/test_kernels.py).
    double sy = fmax(((double)y + 0.5) * ((double)h / (double)oh) - 0.5, 0.0);
    double sx = fmax(((double)x + 0.5) * ((double)w / (double)ow) - 0.5, 0.0);
    int y0 = min((int)floor(sy), h - 1), x0 = min((int)floor(sx), w - 1);
    int y1 = min(y0 + 1, h - 1), x1 = min(x0 + 1, w - 1);
    float fy = (float)(sy - (double)y0), fx = (float)(sx - (double)x0);
    const unsigned char* img = src + offsets[i];
    int ch = perm[c];
    float p00 = img[((long long)y0 * w + x0) * 3 + ch];
    float p01 = img[((long long)y0 * w + x1) * 3 + ch];
    float p10 = img[((long long)y1 * w + x0) * 3 + ch];
    float p11 = img[((long long)y1 * w + x1) * 3 + ch];
    float top = p00 + (p01 - p00) * fx;
    float bot = p10 + (p11 - p10) * fx;
    float v = top + (bot - top) * fy;
    out[idx] = _cast<T>(v * a[c] + b[c]);
}
"""
_NAMES = ("preprocess_nchw<float>", "preprocess_nchw<unsigned short>")
_BLOCK = 256


def available() -> bool:
    """CuPy importable AND at least one CUDA device; any failure means not available."""
    try:
        import cupy  # noqa: PLC0415  (lazy: most hosts have no CuPy)

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # noqa: BLE001  (ImportError, CUDARuntimeError, driver errors...)
        return False


class CupyBackend:
    name: BackendName = "cupy"

    def __init__(self) -> None:
        import cupy  # noqa: PLC0415

        self._cp: Any = cupy
        self._module = cupy.RawModule(code=_SOURCE, name_expressions=_NAMES)
        self._kernels = {
            "FP32": self._module.get_function(_NAMES[0]),
            "FP16": self._module.get_function(_NAMES[1]),
        }
        self._in_buf: Any = None  # grows to the largest batch seen, reused after
        self._out_bufs: dict[tuple[int, int, int, str], Any] = {}
        self._consts: dict[PreprocessSpec, tuple[Any, Any, Any]] = {}
        self._lock = threading.Lock()  # the reused buffers are shared: one batch at a time

    def _input_buffer(self, nbytes: int) -> Any:
        if self._in_buf is None or self._in_buf.size < nbytes:
            self._in_buf = self._cp.empty(max(nbytes, 1), dtype=self._cp.uint8)
        return self._in_buf

    def _output_buffer(self, n: int, spec: PreprocessSpec) -> Any:
        key = (n, spec.height, spec.width, spec.datatype)
        buf = self._out_bufs.get(key)
        if buf is None:
            buf = self._cp.empty((n, 3, spec.height, spec.width), dtype=spec.np_dtype)
            self._out_bufs[key] = buf
        return buf

    def _spec_consts(self, spec: PreprocessSpec) -> tuple[Any, Any, Any]:
        c = self._consts.get(spec)
        if c is None:
            a, b = spec.affine()
            c = (self._cp.asarray(np.array(spec.perm, np.int32)), self._cp.asarray(a), self._cp.asarray(b))
            self._consts[spec] = c
        return c

    def preprocess_device(self, images: Sequence[np.ndarray], spec: PreprocessSpec) -> Any:
        """Run the fused kernel and return the (reused) device array; valid until the next call.

        Callers on several threads must use `preprocess` (locked) or hold their own lock.
        """
        validate_images(images, spec)
        cp = self._cp
        n = len(images)
        sizes = np.array([im.size for im in images], dtype=np.int64)
        offsets = np.zeros(n, dtype=np.int64)
        offsets[1:] = np.cumsum(sizes)[:-1]
        host = np.concatenate([np.ascontiguousarray(im).reshape(-1) for im in images])
        src = self._input_buffer(host.size)
        src[: host.size].set(host)
        meta = np.stack([
            np.array([im.shape[0] for im in images], np.int32),
            np.array([im.shape[1] for im in images], np.int32),
        ])
        d_off, d_h, d_w = cp.asarray(offsets), cp.asarray(meta[0]), cp.asarray(meta[1])
        perm, a, b = self._spec_consts(spec)
        out = self._output_buffer(n, spec)
        total = n * 3 * spec.height * spec.width
        grid = ((total + _BLOCK - 1) // _BLOCK,)
        self._kernels[spec.datatype](
            grid, (_BLOCK,),
            (src, d_off, d_h, d_w, perm, a, b, out, np.int32(n), np.int32(spec.height), np.int32(spec.width)),
        )
        return out

    def preprocess(self, images: Sequence[np.ndarray], spec: PreprocessSpec) -> np.ndarray:
        with self._lock:
            return self.preprocess_device(images, spec).get()
