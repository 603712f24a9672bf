"""Image preprocessing kernels: one API (`preprocess`), NumPy and CuPy backends."""

from kernels.preprocess import Backend, PreprocessError, PreprocessSpec, preprocess, select_backend

__all__ = ["Backend", "PreprocessError", "PreprocessSpec", "preprocess", "select_backend"]
