"""kcourse.blas: the public functional API.

Every op validates its arguments (``_check``), picks a backend (``kcourse.backend.resolve``) and
calls that backend's kernel, which has one calling convention on every backend: inputs first,
then scalars, then ``out``, the tensor it writes. An out-of-place op passes a fresh ``out``; the
in-place variant ``op_`` passes its target (``out`` is then one of the inputs, element for
element, which every kernel supports). BLAS convention: with ``beta == 0`` the kernel receives
``None`` for ``y``/``C``, so NaN or Inf there never reaches the result.

Out-of-place ops are differentiable: they run through ``autograd.py``, whose backward composes
the pullback from these same ops on the backend that ran the forward. ``_run_<op>`` is the one
path to a kernel, shared by the out-of-place forward and the in-place variant.
"""
from __future__ import annotations

import torch

from ..backend import resolve
from . import _check, autograd

__all__ = ["copy", "copy_", "swap", "swap_", "scal", "scal_", "axpby", "axpby_", "dot",
           "gemv", "gemv_", "geru", "geru_", "gemm", "gemm_"]


def _backend(op: str, backend: str | None) -> str:
    """The backend name this call runs on (raises if it cannot run here or lacks the kernel)."""
    return resolve(op.rstrip("_"), backend)[0]


def _inplace(op: str, *tensors) -> None:
    # An in-place op overwrites its target: autograd could not differentiate through it.
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise RuntimeError(f"{op}: in-place ops are not differentiable; use the out-of-place form, "
                           "or call it under torch.no_grad()")


def _new(like: torch.Tensor, shape) -> torch.Tensor:
    return torch.empty(shape, dtype=like.dtype, device=like.device)


# ----------------------------------------------------------------------------- level 1

def copy(x, backend=None):
    """``y = x``: a new tensor with the values of ``x``."""
    name = _backend("copy", backend)
    _check.check_copy(name, x)
    return autograd.Copy.apply(x, name)


def copy_(x, y, backend=None):
    """``y <- x``; returns ``y``."""
    name = _backend("copy_", backend)
    _check.check_copy(name, x, y, inplace=True)
    _inplace("copy_", x, y)
    return _run_copy(x, name, out=y)


def _run_copy(x, backend, out=None):
    out = _new(x, x.shape) if out is None else out
    return resolve("copy", backend)[1](x, out) if x.numel() else out


def swap(x, y, backend=None):
    """``(x', y') = (y, x)``: new tensors holding the values of ``y`` and of ``x``."""
    name = _backend("swap", backend)
    _check.check_swap(name, x, y)
    return autograd.Swap.apply(x, y, name)


def swap_(x, y, backend=None):
    """``x <-> y`` in place; returns ``(x, y)``."""
    name = _backend("swap_", backend)
    _check.check_swap(name, x, y, inplace=True)
    _inplace("swap_", x, y)
    return _run_swap(x, y, name, out=(x, y))


def _run_swap(x, y, backend, out=None):
    out_x, out_y = (_new(x, x.shape), _new(y, y.shape)) if out is None else out
    return resolve("swap", backend)[1](x, y, out_x, out_y) if x.numel() else (out_x, out_y)


def scal(x, alpha, backend=None):
    """``alpha * x``."""
    name = _backend("scal", backend)
    _check.check_scal(name, x, alpha)
    return autograd.Scal.apply(x, float(alpha), name)


def scal_(x, alpha, backend=None):
    """``x <- alpha * x``; returns ``x``."""
    name = _backend("scal_", backend)
    _check.check_scal(name, x, alpha, inplace=True)
    _inplace("scal_", x)
    return _run_scal(x, float(alpha), name, out=x)


def _run_scal(x, alpha, backend, out=None):
    out = _new(x, x.shape) if out is None else out
    return resolve("scal", backend)[1](x, alpha, out) if x.numel() else out


def axpby(x, y, alpha=1.0, beta=1.0, backend=None):
    """``alpha * x + beta * y`` (``y`` is not read when ``beta == 0``)."""
    name = _backend("axpby", backend)
    _check.check_axpby(name, x, y, alpha, beta)
    return autograd.Axpby.apply(x, y, float(alpha), float(beta), name)


def axpby_(x, y, alpha=1.0, beta=1.0, backend=None):
    """``y <- alpha * x + beta * y``; returns ``y``."""
    name = _backend("axpby_", backend)
    _check.check_axpby(name, x, y, alpha, beta, inplace=True)
    _inplace("axpby_", x, y)
    return _run_axpby(x, y, float(alpha), float(beta), name, out=y)


def _run_axpby(x, y, alpha, beta, backend, out=None):
    out = _new(x, x.shape) if out is None else out
    kernel = resolve("axpby", backend)[1]
    return kernel(x, y if beta != 0 else None, alpha, beta, out) if x.numel() else out


def dot(x, y, backend=None):
    """``x^T y`` as a 0-d tensor of the inputs' dtype, accumulated in float32 (float64 for float64)."""
    name = _backend("dot", backend)
    _check.check_dot(name, x, y)
    return autograd.Dot.apply(x, y, name)


def _run_dot(x, y, backend):
    if not x.numel():
        return torch.zeros((), dtype=x.dtype, device=x.device)
    return resolve("dot", backend)[1](x, y)


# ----------------------------------------------------------------------------- level 2

def gemv(A, x, y=None, alpha=1.0, beta=0.0, backend=None):
    """``alpha * A x + beta * y`` for ``A (m, n)``, ``x (n,)``, ``y (m,)`` (not read when ``beta == 0``)."""
    name = _backend("gemv", backend)
    _check.check_gemv(name, A, x, y, alpha, beta)
    return autograd.Gemv.apply(A, x, y, float(alpha), float(beta), name)


def gemv_(A, x, y, alpha=1.0, beta=0.0, backend=None):
    """``y <- alpha * A x + beta * y``; returns ``y``."""
    name = _backend("gemv_", backend)
    _check.check_gemv(name, A, x, y, alpha, beta, inplace=True)
    _inplace("gemv_", A, x, y)
    return _run_gemv(A, x, y, float(alpha), float(beta), name, out=y)


def _run_gemv(A, x, y, alpha, beta, backend, out=None):
    out = _new(A, A.shape[:1]) if out is None else out
    kernel = resolve("gemv", backend)[1]
    return kernel(A, x, y if beta != 0 else None, alpha, beta, out) if out.numel() else out


def geru(A, x, y, alpha=1.0, backend=None):
    """``A + alpha * x y^T`` for ``A (m, n)``, ``x (m,)``, ``y (n,)``."""
    name = _backend("geru", backend)
    _check.check_geru(name, A, x, y, alpha)
    return autograd.Geru.apply(A, x, y, float(alpha), name)


def geru_(A, x, y, alpha=1.0, backend=None):
    """``A <- A + alpha * x y^T``; returns ``A``."""
    name = _backend("geru_", backend)
    _check.check_geru(name, A, x, y, alpha, inplace=True)
    _inplace("geru_", A, x, y)
    return _run_geru(A, x, y, float(alpha), name, out=A)


def _run_geru(A, x, y, alpha, backend, out=None):
    out = _new(A, A.shape) if out is None else out
    return resolve("geru", backend)[1](A, x, y, alpha, out) if A.numel() else out


# ----------------------------------------------------------------------------- level 3

def gemm(A, B, C=None, alpha=1.0, beta=0.0, backend=None):
    """``alpha * A B + beta * C`` for ``A (m, k)`` or ``(b, m, k)`` and ``B (k, n)`` or ``(b, k, n)``.

    The batch dims broadcast (a 2-D operand is shared by the batch). ``C`` broadcasts to the
    output ``(m, n)`` or ``(b, m, n)`` (a bias row ``(n,)`` works) and is not read when
    ``beta == 0``. Accumulates in float32; float32 operands use IEEE float32 products unless
    ``torch.backends.cuda.matmul.allow_tf32`` is on.
    """
    name = _backend("gemm", backend)
    _check.check_gemm(name, A, B, C, alpha, beta)
    return autograd.Gemm.apply(A, B, C, float(alpha), float(beta), name)


def gemm_(A, B, C, alpha=1.0, beta=0.0, backend=None):
    """``C <- alpha * A B + beta * C``; returns ``C``."""
    name = _backend("gemm_", backend)
    _check.check_gemm(name, A, B, C, alpha, beta, inplace=True)
    _inplace("gemm_", A, B, C)
    return _run_gemm(A, B, C, float(alpha), float(beta), name, out=C)


def _run_gemm(A, B, C, alpha, beta, backend, out=None):
    """Expand the operands to the output's rank (stride-0 views, no copies) and run the kernel."""
    batch = tuple(torch.broadcast_shapes(A.shape[:-2], B.shape[:-2]))
    out_shape = (*batch, A.shape[-2], B.shape[-1])
    if batch:
        A, B = A.expand(*batch, *A.shape[-2:]), B.expand(*batch, *B.shape[-2:])
    C = C.expand(out_shape) if C is not None and beta != 0 else None
    out = _new(A, out_shape) if out is None else out
    return resolve("gemm", backend)[1](A, B, C, alpha, beta, out) if out.numel() else out
