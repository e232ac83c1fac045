"""One ``torch.autograd.Function`` per out-of-place BLAS op.

``forward`` runs the kernel of the backend the call resolved to and pins that backend in ``ctx``;
``backward`` composes the pullback from kcourse BLAS ops on the same backend (DESIGN.md):

    gemm  C = a A B + b C0   dA = a dC B^T (gemm)   dB = a A^T dC (gemm)   dC0 = b dC (scal)
    gemv  y = a A x + b y0   dA = a dy x^T (geru)   dx = a A^T dy (gemv)   dy0 = b dy (scal)
    geru  A = A0 + a x y^T   dA0 = dA               dx = a dA y (gemv)     dy = a dA^T x (gemv)
    dot   z = x^T y          dx = dz y (gemm)       dy = dz x (gemm)   (k = 1: dz stays a device tensor)
    axpby r = a x + b y      dx = a dr (scal)       dy = b dr (scal)

Where an input was broadcast (a bias row, a 2-D operand of a batched gemm), its gradient is summed
over the broadcast dimensions by ``_sum_to``, itself a gemv with a vector of ones. Only inputs
that need a gradient cost work (``ctx.needs_input_grad``), and a scale by exactly 1 (the residual
``x + f(x)``, a bias added with beta = 1) passes the gradient through instead of copying it (``_scaled``).

What a training step does not pay for:
  - validation twice: a pullback's operands are the forward's (validated then) and the gradient,
    whose shape, dtype and device autograd's engine has matched to the output. So the pullback
    calls the kernels directly (``api._run_<op>``: no ``_check``, no Function). Only when the
    backward is itself differentiated (``create_graph=True``, grad mode on inside ``backward``)
    does it go through the public, differentiable ops, so that double backward keeps working;
  - a copy of every weight gradient: a weight ``W (out, in)`` enters ``Linear`` as the view
    ``W.mT``. Its gradient ``A^T dC`` written row-major would reach ``W`` transposed, and autograd
    would copy it into ``W``'s layout before storing ``W.grad``. So a gradient whose operand is
    such a transposed view is computed transposed, ``(a dC^T A)^T``: the same products, one gemm,
    landing in ``W``'s own layout (``_product``);
  - a fill of ones per bias gradient: the ones of ``_sum_to`` are one cached element, broadcast;
  - host synchronizations: none anywhere, so a whole training step can be captured in a CUDA graph.
"""
from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from ..backend import backward_kernel, resolve
from .. import blas as api  # the public ops (this module is imported while kcourse.blas initializes)

_ONES: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}  # one element of 1 per dtype and device


def _gemm(A: torch.Tensor, B: torch.Tensor, a: float, backend: str) -> torch.Tensor:
    """``a A B`` on ``backend``: straight to the kernel, or the differentiable op under create_graph."""
    if torch.is_grad_enabled():
        return api.gemm(A, B, alpha=a, backend=backend)
    return api._run_gemm(A, B, None, a, 0.0, backend)


def _gemv(A: torch.Tensor, x: torch.Tensor, a: float, backend: str) -> torch.Tensor:
    """``a A x`` on ``backend``: straight to the kernel, or the differentiable op under create_graph."""
    if torch.is_grad_enabled():
        return api.gemv(A, x, alpha=a, backend=backend)
    return api._run_gemv(A, x, None, a, 0.0, backend)


def _geru(A: torch.Tensor, x: torch.Tensor, y: torch.Tensor, a: float, backend: str) -> torch.Tensor:
    """``A + a x y^T`` on ``backend``: straight to the kernel, or the differentiable op under create_graph."""
    if torch.is_grad_enabled():
        return api.geru(A, x, y, a, backend=backend)
    return api._run_geru(A, x, y, a, backend)


def _scaled(grad: torch.Tensor, a: float, backend: str) -> torch.Tensor:
    """``a * grad`` by ``scal``; for ``a == 1`` the gradient itself (the same bits, no kernel)."""
    if a == 1:
        return grad
    if torch.is_grad_enabled():
        return api.scal(grad, a, backend=backend)
    return api._run_scal(grad, a, backend)


def _column_major(t: torch.Tensor) -> bool:
    """Is ``t`` a transposed view of a row-major matrix (a weight ``W`` passed as ``W.mT``)?"""
    return t.dim() >= 2 and t.stride(-2) == 1 and t.stride(-1) != 1


def _product(X: torch.Tensor, Y: torch.Tensor, a: float, backend: str, like: torch.Tensor) -> torch.Tensor:
    """``a X Y`` (one gemm), laid out as ``like`` when that is a transposed view of the same shape:
    then computed as ``(a Y^T X^T)^T``, whose ``.mT`` is row-major, as the weight behind ``like``."""
    if _column_major(like) and X.shape[:-2] == Y.shape[:-2] == like.shape[:-2]:
        return _gemm(Y.mT, X.mT, a, backend).mT
    return _gemm(X, Y, a, backend)


def _ones(n: int, like: torch.Tensor) -> torch.Tensor:
    """``n`` ones of ``like``'s dtype and device: a stride-0 view of one cached element (no fill
    kernel per call). One made while a CUDA graph is being captured is not cached: its fill only
    runs when the graph replays, so eager code must not see it before."""
    key = (like.dtype, like.device)
    one = _ONES.get(key)
    if one is None:
        one = torch.ones(1, dtype=like.dtype, device=like.device)
        if not (one.is_cuda and torch.cuda.is_current_stream_capturing()):
            _ONES[key] = one
    return one.expand(n)


def _sum_to(grad: torch.Tensor, shape: torch.Size, backend: str) -> torch.Tensor:
    """Sum ``grad`` over the dimensions that broadcasting expanded from ``shape``: one gemv."""
    if grad.shape == shape:
        return grad
    lead = grad.dim() - len(shape)
    padded = (1,) * lead + tuple(shape)
    reduced = [d for d in range(grad.dim()) if padded[d] == 1 and grad.shape[d] != 1]
    kept = [d for d in range(grad.dim()) if d not in reduced]
    rows = grad.permute(*reduced, *kept).reshape(-1, math.prod(grad.shape[d] for d in kept))  # (R, K)
    return _gemv(rows.mT, _ones(rows.shape[0], grad), 1.0, backend).reshape(shape)  # (K, R) @ (R,) -> (K,)


class Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, backend):
        return api._run_copy(x, backend)

    @staticmethod
    def backward(ctx, dy):
        return dy, None


class Swap(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, backend):
        return api._run_swap(x, y, backend)

    @staticmethod
    def backward(ctx, dx_new, dy_new):  # x' = y, y' = x
        return dy_new, dx_new, None


class Scal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha, backend):
        ctx.alpha, ctx.backend = alpha, backend
        return api._run_scal(x, alpha, backend)

    @staticmethod
    def backward(ctx, dy):
        return _scaled(dy, ctx.alpha, ctx.backend), None, None


class Axpby(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, alpha, beta, backend):
        ctx.alpha, ctx.beta, ctx.backend = alpha, beta, backend
        return api._run_axpby(x, y, alpha, beta, backend)

    @staticmethod
    def backward(ctx, dr):
        dx = _scaled(dr, ctx.alpha, ctx.backend) if ctx.needs_input_grad[0] else None
        dy = _scaled(dr, ctx.beta, ctx.backend) if ctx.needs_input_grad[1] else None
        return dx, dy, None, None, None


class Dot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, backend):
        ctx.save_for_backward(x, y)
        ctx.backend = backend
        return api._run_dot(x, y, backend)

    @staticmethod
    def backward(ctx, dz):
        # dx = dz y as an (n, 1) x (1, 1) gemm: dz stays on the device (no sync) and in the graph
        x, y = ctx.saved_tensors
        dz = dz.reshape(1, 1)
        dx = _gemm(y[:, None], dz, 1.0, ctx.backend)[:, 0] if ctx.needs_input_grad[0] else None
        dy = _gemm(x[:, None], dz, 1.0, ctx.backend)[:, 0] if ctx.needs_input_grad[1] else None
        return dx, dy, None


class Gemv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, A, x, y, alpha, beta, backend):
        ctx.save_for_backward(A, x)
        ctx.alpha, ctx.beta, ctx.backend = alpha, beta, backend
        return api._run_gemv(A, x, y, alpha, beta, backend)

    @staticmethod
    def backward(ctx, dy):
        A, x = ctx.saved_tensors
        a, b, be = ctx.alpha, ctx.beta, ctx.backend
        dA = dx = dy0 = None
        if ctx.needs_input_grad[0]:
            dA = _geru(torch.zeros_like(A), dy, x, a, be)  # (m, n)
        if ctx.needs_input_grad[1]:
            dx = _gemv(A.mT, dy, a, be)  # (n, m) @ (m,) -> (n,)
        if ctx.needs_input_grad[2]:
            dy0 = _scaled(dy, b, be)
        return dA, dx, dy0, None, None, None


class Geru(torch.autograd.Function):
    @staticmethod
    def forward(ctx, A, x, y, alpha, backend):
        ctx.save_for_backward(x, y)
        ctx.alpha, ctx.backend = alpha, backend
        return api._run_geru(A, x, y, alpha, backend)

    @staticmethod
    def backward(ctx, dA):
        x, y = ctx.saved_tensors
        a, be = ctx.alpha, ctx.backend
        dx = _gemv(dA, y, a, be) if ctx.needs_input_grad[1] else None  # (m, n) @ (n,)
        dy = _gemv(dA.mT, x, a, be) if ctx.needs_input_grad[2] else None  # (n, m) @ (m,)
        return dA, dx, dy, None, None


class Gemm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, A, B, C, alpha, beta, backend):
        ctx.save_for_backward(A, B)
        ctx.alpha, ctx.beta, ctx.backend = alpha, beta, backend
        ctx.C_shape = None if C is None else C.shape
        return api._run_gemm(A, B, C, alpha, beta, backend)

    @staticmethod
    def backward(ctx, dC):
        A, B = ctx.saved_tensors
        a, b, be = ctx.alpha, ctx.beta, ctx.backend
        dA = dB = dC0 = None
        if ctx.needs_input_grad[0]:
            dA = _sum_to(_product(dC, B.mT, a, be, like=A), A.shape, be)  # (.., m, n)(.., n, k)
        if ctx.needs_input_grad[1]:
            if B.dim() == 2 and dC.dim() == 3:  # B shared by the batch: one (k, b*m) @ (b*m, n) gemm
                k, n = B.shape
                dB = _product(A.expand(dC.shape[0], -1, -1).reshape(-1, k).mT, dC.reshape(-1, n), a, be, like=B)
            else:
                dB = _sum_to(_product(A.mT, dC, a, be, like=B), B.shape, be)  # (.., k, m)(.., m, n)
        if ctx.needs_input_grad[2]:
            dC0 = _sum_to(_scaled(dC, b, be), ctx.C_shape, be)
        return dA, dB, dC0, None, None, None


# Primitives whose backends take dout with any strides (their kernels read it through its strides or a
# TMA descriptor, or copy it where they cannot): attention's dout is, in a model, the transposed view
# (B, T, H, D) -> (B, H, T, D) of the output projection's gradient, and copying it cost ~0.1 ms a
# backward at 16k tokens, 16 heads, D = 128 on an H100 (benchmarks/results/h100-2026-11-25-session12).
# Every other primitive's backward gets a contiguous dout.
STRIDED_DOUT = frozenset({"attention"})


class Primitive(torch.autograd.Function):
    """A transformer primitive (softmax, norms, activations, cross-entropy, embedding, rope,
    attention), llm.c style: the backend's ``<op>(*inputs, **params) -> (out, cache)`` runs the
    forward, and its ``<op>_backward(dout, cache, needs, **params) -> grads`` the backward, with
    ``needs`` the inputs that want a gradient. The backward kernels are not themselves
    differentiable: a double backward raises instead of returning a wrong answer."""

    @staticmethod
    def forward(ctx, op, backend, params, *inputs):
        out, cache = resolve_kernel(op, backend)(*inputs, **params)
        ctx.op, ctx.backend, ctx.params = op, backend, params
        ctx.save_for_backward(*cache)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        kernel = backward_kernel(ctx.backend, ctx.op)
        if ctx.op not in STRIDED_DOUT:
            dout = dout.contiguous()
        grads = kernel(dout, ctx.saved_tensors, ctx.needs_input_grad[3:], **ctx.params)
        return (None, None, None, *grads)


def resolve_kernel(op: str, backend: str):
    return resolve(op, backend)[1]
