"""Image preprocessing kernels: one API (`preprocess`), NumPy and CuPy backends."""

from kernels.preprocess import preprocess, select_backend
from kernels.spec import Backend, PreprocessError, PreprocessSpec

__all__ = ["Backend", "PreprocessError", "PreprocessSpec", "preprocess", "select_backend"]
