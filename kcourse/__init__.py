"""kcourse: every BLAS and transformer primitive in four backends, proven equal to a Python reference.

    import kcourse
    kcourse.backends()                  # which of python, pytorch, triton, cute run here, and why not
    with kcourse.use_backend("triton"):
        C = kcourse.blas.gemm(A, B)     # or kcourse.blas.gemm(A, B, backend="triton")
"""
from . import blas, modules
from .backend import BackendInfo, backends, get_backend, use_backend

__all__ = ["blas", "modules", "use_backend", "get_backend", "backends", "BackendInfo"]
__version__ = "0.1.0"
