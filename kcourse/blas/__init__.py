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

from ..backend import backward_kernel, resolve
from . import _check, autograd

__all__ = ["copy", "copy_", "swap", "swap_", "scal", "scal_", "axpby", "axpby_", "dot",
           "gemv", "gemv_", "geru", "geru_", "gemm", "gemm_",
           "softmax", "log_softmax", "cross_entropy", "layer_norm", "rms_norm", "gelu", "silu", "relu",
           "swiglu", "embedding", "rope", "attention"]


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
    batch = () if A.dim() == B.dim() == 2 else (max(A.shape[0] if A.dim() == 3 else 1,
                                                    B.shape[0] if B.dim() == 3 else 1),)
    out_shape = (*batch, A.shape[-2], B.shape[-1])
    if batch:
        A, B = A.expand(*batch, *A.shape[-2:]), B.expand(*batch, *B.shape[-2:])
    C = C.expand(out_shape) if C is not None and beta != 0 else None
    out = _new(A, out_shape) if out is None else out
    return resolve("gemm", backend)[1](A, B, C, alpha, beta, out) if out.numel() else out


# ----------------------------------------------------------------------------- transformer primitives
# Each backend module exports `<op>(*inputs, **params) -> (out, cache)` and
# `<op>_backward(dout, cache, needs, **params) -> grads` (autograd.Primitive). A module without
# `<op>_backward` is a composite of differentiable kcourse ops (the python attention).

def _primitive(op: str, backend: str, params: dict, *inputs):
    if backward_kernel(backend, op) is None or not _wants_grad(inputs):  # a composite, or no graph to record
        return resolve(op, backend)[1](*inputs, **params)[0]
    return autograd.Primitive.apply(op, backend, params, *inputs)


def _wants_grad(inputs) -> bool:
    """Would autograd record a node for these inputs (grad mode on, an input that requires grad)?
    Without one the kernel runs bare: no autograd.Function call (tens of microseconds of host time),
    and its cache is dropped at once."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)


def softmax(x, dim=-1, backend=None):
    """``y_i = exp(x_i - max x) / sum_j exp(x_j - max x)`` along ``dim``."""
    name = _backend("softmax", backend)
    return _primitive("softmax", name, _check.check_softmax(name, x, dim), x)


def log_softmax(x, dim=-1, backend=None):
    """``y_i = x_i - max x - log sum_j exp(x_j - max x)`` along ``dim``."""
    name = _backend("log_softmax", backend)
    return _primitive("log_softmax", name, _check.check_softmax(name, x, dim, op="log_softmax"), x)


def cross_entropy(logits, target, ignore_index=-100, reduction="mean", backend=None):
    """``loss_i = logsumexp(logits_i) - logits_i[target_i]`` for logits ``(N, V)``, target ``(N,)``.

    Rows whose target is ``ignore_index`` contribute nothing; ``"mean"`` averages over the other
    rows, ``"sum"`` adds them, ``"none"`` returns the ``(N,)`` losses (0 for ignored rows).
    """
    name = _backend("cross_entropy", backend)
    params = _check.check_cross_entropy(name, logits, target, ignore_index, reduction)
    return _primitive("cross_entropy", name, params, logits, target)


def layer_norm(x, weight=None, bias=None, eps=1e-5, backend=None):
    """``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last dimension (biased variance)."""
    name = _backend("layer_norm", backend)
    return _primitive("layer_norm", name, _check.check_layer_norm(name, x, weight, bias, eps), x, weight, bias)


def rms_norm(x, weight=None, eps=1e-6, backend=None):
    """``y = x / sqrt(mean(x^2) + eps) * weight`` over the last dimension."""
    name = _backend("rms_norm", backend)
    return _primitive("rms_norm", name, _check.check_rms_norm(name, x, weight, eps), x, weight)


def gelu(x, approximate="none", backend=None):
    """``x * Phi(x)`` (``approximate="tanh"``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``)."""
    name = _backend("gelu", backend)
    return _primitive("gelu", name, _check.check_activation(name, "gelu", x, approximate=approximate), x)


def silu(x, backend=None):
    """``x * sigmoid(x)``."""
    name = _backend("silu", backend)
    return _primitive("silu", name, _check.check_activation(name, "silu", x), x)


def relu(x, backend=None):
    """``max(x, 0)``."""
    name = _backend("relu", backend)
    return _primitive("relu", name, _check.check_activation(name, "relu", x), x)


def swiglu(gate, up, backend=None):
    """``silu(gate) * up``."""
    name = _backend("swiglu", backend)
    return _primitive("swiglu", name, _check.check_swiglu(name, gate, up), gate, up)


def embedding(indices, weight, backend=None):
    """``weight[indices]``: rows of ``weight (V, D)``, shape ``(*indices.shape, D)``; the backward
    adds the gradients of repeated indices."""
    name = _backend("embedding", backend)
    return _primitive("embedding", name, _check.check_embedding(name, indices, weight), indices, weight)


def rope(x, base=10000.0, positions=None, backend=None):
    """Rotary embedding of ``x (..., T, D)``, rotate-half convention: with ``x1, x2`` the two halves
    of the last dim and angle ``p * base^(-2i/D)`` at position ``p`` (default ``0..T-1``),
    ``y = [x1 cos - x2 sin, x2 cos + x1 sin]``."""
    name = _backend("rope", backend)
    return _primitive("rope", name, _check.check_rope(name, x, base, positions), x, positions)


def attention(q, k, v, causal=False, scale=None, backend=None):
    """``softmax(q k^T * scale [+ causal mask]) v`` for q ``(B, H, Tq, D)``, k and v ``(B, Hkv, Tk, D)``.

    Grouped-query when ``H`` is a multiple of ``Hkv`` (query head ``h`` reads kv head
    ``h // (H / Hkv)``); ``scale`` defaults to ``D^-1/2``; ``causal`` lets query ``i`` see keys
    ``j <= i`` (top-left aligned, as ``scaled_dot_product_attention(is_causal=True)``).
    """
    name = _backend("attention", backend)
    return _primitive("attention", name, _check.check_attention(name, q, k, v, causal, scale), q, k, v)
