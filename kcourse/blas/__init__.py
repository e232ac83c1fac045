"""kcourse.blas: the public functional API.

Every op validates its arguments (``_check``), picks a backend (``kcourse.backend.resolve``) and
calls that backend's kernel, which has one calling convention on every backend: inputs first,
then scalars, then ``out``, the tensor it writes. An out-of-place op passes a fresh ``out``; the
in-place variant ``op_`` passes its target (``out`` is then one of the inputs, element for
element, which every kernel supports). BLAS convention: with ``beta == 0`` the kernel receives
``None`` for ``y``/``C``, so NaN or Inf there never reaches the result.
"""
from __future__ import annotations

import torch

from ..backend import resolve
from . import _check

__all__ = ["copy", "copy_", "swap", "swap_", "scal", "scal_", "axpby", "axpby_", "dot",
           "gemv", "gemv_", "geru", "geru_", "gemm", "gemm_"]


def _no_grad(op: str, *tensors) -> None:
    # Pullbacks arrive with the autograd layer; until then, refuse rather than drop gradients.
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise NotImplementedError(f"{op}: kcourse.blas ops are not differentiable yet; "
                                  "call it under torch.no_grad() or on tensors that do not require grad")


def _new(like: torch.Tensor, shape) -> torch.Tensor:
    return torch.empty(shape, dtype=like.dtype, device=like.device)


# ----------------------------------------------------------------------------- level 1

def copy(x, backend=None):
    """``y = x``: a new tensor with the values of ``x``."""
    name, kernel = resolve("copy", backend)
    _check.check_copy(name, x)
    _no_grad("copy", x)
    out = _new(x, x.shape)
    return kernel(x, out) if x.numel() else out


def copy_(x, y, backend=None):
    """``y <- x``; returns ``y``."""
    name, kernel = resolve("copy", backend)
    _check.check_copy(name, x, y, inplace=True)
    _no_grad("copy_", x, y)
    return kernel(x, y) if x.numel() else y


def swap(x, y, backend=None):
    """``(x', y') = (y, x)``: new tensors holding the values of ``y`` and of ``x``."""
    name, kernel = resolve("swap", backend)
    _check.check_swap(name, x, y)
    _no_grad("swap", x, y)
    out_x, out_y = _new(x, x.shape), _new(y, y.shape)
    return kernel(x, y, out_x, out_y) if x.numel() else (out_x, out_y)


def swap_(x, y, backend=None):
    """``x <-> y`` in place; returns ``(x, y)``."""
    name, kernel = resolve("swap", backend)
    _check.check_swap(name, x, y, inplace=True)
    _no_grad("swap_", x, y)
    return kernel(x, y, x, y) if x.numel() else (x, y)


def scal(x, alpha, backend=None):
    """``alpha * x``."""
    name, kernel = resolve("scal", backend)
    _check.check_scal(name, x, alpha)
    _no_grad("scal", x)
    out = _new(x, x.shape)
    return kernel(x, float(alpha), out) if x.numel() else out


def scal_(x, alpha, backend=None):
    """``x <- alpha * x``; returns ``x``."""
    name, kernel = resolve("scal", backend)
    _check.check_scal(name, x, alpha, inplace=True)
    _no_grad("scal_", x)
    return kernel(x, float(alpha), x) if x.numel() else x


def axpby(x, y, alpha=1.0, beta=1.0, backend=None):
    """``alpha * x + beta * y`` (``y`` is not read when ``beta == 0``)."""
    name, kernel = resolve("axpby", backend)
    _check.check_axpby(name, x, y, alpha, beta)
    _no_grad("axpby", x, y)
    out = _new(x, x.shape)
    alpha, beta = float(alpha), float(beta)
    return kernel(x, y if beta != 0 else None, alpha, beta, out) if x.numel() else out


def axpby_(x, y, alpha=1.0, beta=1.0, backend=None):
    """``y <- alpha * x + beta * y``; returns ``y``."""
    name, kernel = resolve("axpby", backend)
    _check.check_axpby(name, x, y, alpha, beta, inplace=True)
    _no_grad("axpby_", x, y)
    alpha, beta = float(alpha), float(beta)
    return kernel(x, y if beta != 0 else None, alpha, beta, y) if x.numel() else y


def dot(x, y, backend=None):
    """``x^T y`` as a 0-d tensor of the inputs' dtype, accumulated in float32 (float64 for float64)."""
    name, kernel = resolve("dot", backend)
    _check.check_dot(name, x, y)
    _no_grad("dot", x, y)
    return kernel(x, y) if x.numel() else torch.zeros((), dtype=x.dtype, device=x.device)


# ----------------------------------------------------------------------------- level 2

def gemv(A, x, y=None, alpha=1.0, beta=0.0, backend=None):
    """``alpha * A x + beta * y`` for ``A (m, n)``, ``x (n,)``, ``y (m,)`` (not read when ``beta == 0``)."""
    name, kernel = resolve("gemv", backend)
    m = _check.check_gemv(name, A, x, y, alpha, beta)[0]
    _no_grad("gemv", A, x, y)
    out = _new(A, (m,))
    alpha, beta = float(alpha), float(beta)
    return kernel(A, x, y if beta != 0 else None, alpha, beta, out) if m else out


def gemv_(A, x, y, alpha=1.0, beta=0.0, backend=None):
    """``y <- alpha * A x + beta * y``; returns ``y``."""
    name, kernel = resolve("gemv", backend)
    m = _check.check_gemv(name, A, x, y, alpha, beta, inplace=True)[0]
    _no_grad("gemv_", A, x, y)
    alpha, beta = float(alpha), float(beta)
    return kernel(A, x, y if beta != 0 else None, alpha, beta, y) if m else y


def geru(A, x, y, alpha=1.0, backend=None):
    """``A + alpha * x y^T`` for ``A (m, n)``, ``x (m,)``, ``y (n,)``."""
    name, kernel = resolve("geru", backend)
    _check.check_geru(name, A, x, y, alpha)
    _no_grad("geru", A, x, y)
    out = _new(A, A.shape)
    return kernel(A, x, y, float(alpha), out) if A.numel() else out


def geru_(A, x, y, alpha=1.0, backend=None):
    """``A <- A + alpha * x y^T``; returns ``A``."""
    name, kernel = resolve("geru", backend)
    _check.check_geru(name, A, x, y, alpha, inplace=True)
    _no_grad("geru_", A, x, y)
    return kernel(A, x, y, float(alpha), A) if A.numel() else A


# ----------------------------------------------------------------------------- level 3

def _batched(A, B, C, out_shape):
    """Expand 2-D/3-D operands to the output's rank (stride-0 views, no copies)."""
    if len(out_shape) == 3:
        b = out_shape[0]
        A = (A if A.dim() == 3 else A.unsqueeze(0)).expand(b, *A.shape[-2:])
        B = (B if B.dim() == 3 else B.unsqueeze(0)).expand(b, *B.shape[-2:])
    if C is not None:
        C = C.expand(out_shape)
    return A, B, C


def gemm(A, B, C=None, alpha=1.0, beta=0.0, backend=None):
    """``alpha * A B + beta * C`` for ``A (m, k)`` or ``(b, m, k)`` and ``B (k, n)`` or ``(b, k, n)``.

    ``C`` broadcasts to the output ``(m, n)`` or ``(b, m, n)`` (a bias row ``(n,)`` works) and is
    not read when ``beta == 0``. Accumulates in float32; float32 operands use IEEE float32 products
    unless ``torch.backends.cuda.matmul.allow_tf32`` is on.
    """
    name, kernel = resolve("gemm", backend)
    out_shape = _check.check_gemm(name, A, B, C, alpha, beta)
    _no_grad("gemm", A, B, C)
    beta = float(beta)
    A, B, C = _batched(A, B, C if beta != 0 else None, out_shape)
    out = _new(A, out_shape)
    return kernel(A, B, C, float(alpha), beta, out) if out.numel() else out


def gemm_(A, B, C, alpha=1.0, beta=0.0, backend=None):
    """``C <- alpha * A B + beta * C``; returns ``C``."""
    name, kernel = resolve("gemm", backend)
    out_shape = _check.check_gemm(name, A, B, C, alpha, beta, inplace=True)
    _no_grad("gemm_", A, B, C)
    beta = float(beta)
    A, B, read_C = _batched(A, B, C if beta != 0 else None, out_shape)
    return kernel(A, B, read_C, float(alpha), beta, C) if C.numel() else C
