"""The CuPy kernel's CUDA source, checked without a GPU.

1. nvcc (when installed) compiles it to PTX: syntax and types are right for the device.
2. g++ compiles the very same source for the CPU with a tiny shim (one loop plays the grid),
   and its output is compared with the NumPy backend and with numpy's float16 rounding.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kernels import PreprocessSpec
from kernels.cupy_backend import _NAMES, _SOURCE
from kernels.numpy_backend import NumpyBackend

_SHIM = r"""
#include <cstring>
#include <cmath>
#include <algorithm>
#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__
using std::min;
struct _dim { unsigned long long x; };
static _dim blockIdx, threadIdx, blockDim;
static inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
"""

_DRIVER = r"""
template <typename T>
static void run(const unsigned char* src, const long long* off, const int* h, const int* w, const int* perm,
                const float* a, const float* b, T* out, int n, int oh, int ow) {
    long long total = (long long)n * 3 * oh * ow;
    blockDim.x = 1; threadIdx.x = 0;
    for (long long i = 0; i < total; i++) { blockIdx.x = (unsigned long long)i; preprocess_nchw<T>(src, off, h, w, perm, a, b, out, n, oh, ow); }
}
extern "C" void run_f32(const unsigned char* s, const long long* o, const int* h, const int* w, const int* p,
                        const float* a, const float* b, float* out, int n, int oh, int ow) { run<float>(s, o, h, w, p, a, b, out, n, oh, ow); }
extern "C" void run_f16(const unsigned char* s, const long long* o, const int* h, const int* w, const int* p,
                        const float* a, const float* b, unsigned short* out, int n, int oh, int ow) { run<unsigned short>(s, o, h, w, p, a, b, out, n, oh, ow); }
extern "C" unsigned short f2h(float f) { return f2h_bits(f); }
"""


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_nvcc_compiles_kernel_source(tmp_path: Path):
    inst = "".join(
        f"template __global__ void preprocess_nchw<{t}>(const unsigned char*, const long long*, const int*, const int*,"
        f" const int*, const float*, const float*, {t}*, int, int, int);\n"
        for t in ("float", "unsigned short"))
    cu = tmp_path / "k.cu"
    cu.write_text(_SOURCE + inst)
    r = subprocess.run(["nvcc", "-ptx", str(cu), "-o", str(tmp_path / "k.ptx")],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    ptx = (tmp_path / "k.ptx").read_text()
    assert ptx.count(".entry") == len(_NAMES)


@pytest.fixture(scope="module")
def cpu_kernel(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("no g++")
    d = tmp_path_factory.mktemp("kernel")
    src = d / "k.cpp"
    src.write_text(_SHIM + _SOURCE + _DRIVER)
    so = d / "k.so"
    r = subprocess.run(["g++", "-O1", "-std=c++14", "-shared", "-fPIC", str(src), "-o", str(so)],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    lib = ctypes.CDLL(str(so))
    lib.f2h.restype = ctypes.c_ushort
    lib.f2h.argtypes = [ctypes.c_float]
    return lib


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def _run(lib, images, spec: PreprocessSpec) -> np.ndarray:
    n = len(images)
    host = np.concatenate([im.reshape(-1) for im in images])
    off = np.zeros(n, np.int64)
    off[1:] = np.cumsum([im.size for im in images])[:-1]
    h = np.array([im.shape[0] for im in images], np.int32)
    w = np.array([im.shape[1] for im in images], np.int32)
    perm = np.array(spec.perm, np.int32)
    a, b = spec.affine()
    out = np.empty((n, 3, spec.height, spec.width), spec.np_dtype)
    fn = lib.run_f16 if spec.datatype == "FP16" else lib.run_f32
    fn(_ptr(host), _ptr(off), _ptr(h), _ptr(w), _ptr(perm), _ptr(a), _ptr(b), _ptr(out),
       ctypes.c_int(n), ctypes.c_int(spec.height), ctypes.c_int(spec.width))
    return out


@pytest.mark.parametrize("datatype", ["FP32", "FP16"])
@pytest.mark.parametrize("order", ["RGB", "BGR"])
def test_kernel_source_matches_numpy(cpu_kernel, datatype, order):
    rng = np.random.default_rng(9)
    images = [rng.integers(0, 256, s, dtype=np.uint8) for s in [(37, 53, 3), (5, 9, 3), (1, 1, 3), (64, 20, 3)]]
    spec = PreprocessSpec(height=24, width=17, datatype=datatype, channel_order=order)
    got = _run(cpu_kernel, images, spec)
    want = NumpyBackend().preprocess(images, spec)
    tol = dict(rtol=1e-3, atol=2e-3) if datatype == "FP16" else dict(rtol=0, atol=1e-4)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **tol)


def test_f2h_matches_numpy_rounding(cpu_kernel):
    rng = np.random.default_rng(10)
    special = np.array([0.0, -0.0, 1.0, 65504.0, 65519.0, 65520.0, 1e9, -1e9, np.inf, -np.inf,
                        2.0**-24, 2.0**-25, 2.0**-25 * 1.0001, 2.0**-14, 2.0**-14 * 0.999, 1e-8, 3.0e-5], np.float32)
    rand = np.concatenate([rng.uniform(-3, 3, 3000), rng.uniform(-7e4, 7e4, 1000),
                           np.exp2(rng.uniform(-26, -13, 2000)) * rng.choice([-1, 1], 2000)]).astype(np.float32)
    with np.errstate(over="ignore"):  # numpy warns when it rounds to inf, which is what we check
        for v in np.concatenate([special, rand]):
            assert cpu_kernel.f2h(float(v)) == int(np.float16(v).view(np.uint16)), v
    assert cpu_kernel.f2h(float("nan")) & 0x7C00 == 0x7C00
