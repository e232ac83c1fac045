"""gelu: y = x Phi(x) (exact, erf) or its tanh approximation, elementwise, any shape and strides.

    exact:  y = 0.5 x (1 + erf(x / sqrt 2))        dy/dx = Phi(x) + x exp(-x^2/2) / sqrt(2 pi)
    tanh:   y = 0.5 x (1 + tanh u) = x sigmoid(2u),   u = sqrt(2/pi) (x + 0.044715 x^3)
            dy/dx = s + 2 x s (1 - s) u',   s = sigmoid(2u),  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2)

The tanh form is evaluated as ``x sigmoid(2u)`` (0.5 (1 + tanh u) = sigmoid(2u)): Triton 3.6 has
no ``tl.math.tanh``, and the sigmoid form is stable for large |u|.
FLOPs: ~10-20 per element. Bytes: 2 numel * itemsize forward (read x, write y), 3 numel * itemsize
backward (read dy and x, write dx): memory bound. Math in float32, one rounding per output.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._launch import block_indices
from ._pointwise import COEF, RSQRT_2, SQRT_2_OVER_PI, activate, launch, load, sigmoid, store

RSQRT_2PI = tl.constexpr(1 / math.sqrt(2 * math.pi))


@triton.jit
def gelu_kernel(x_ptr, out_ptr, numel, shape, x_strides, out_strides, TANH: tl.constexpr, BLOCK: tl.constexpr):
    i = block_indices(BLOCK)  # (BLOCK,) int64 flat indices
    mask = i < numel
    x = load(x_ptr, i, mask, shape, x_strides)
    if TANH:
        y = activate(x, "gelu_tanh")
    else:
        y = activate(x, "gelu")
    store(out_ptr, i, mask, shape, out_strides, y)


@triton.jit
def gelu_backward_kernel(dout_ptr, x_ptr, dx_ptr, numel, shape, dout_strides, x_strides, dx_strides,
                         TANH: tl.constexpr, BLOCK: tl.constexpr):
    i = block_indices(BLOCK)  # (BLOCK,) int64 flat indices
    mask = i < numel
    x = load(x_ptr, i, mask, shape, x_strides)
    if TANH:
        s = sigmoid(2.0 * (x + x * x * x * COEF) * SQRT_2_OVER_PI)  # sigmoid(2u)
        du = (1.0 + x * x * (3.0 * COEF)) * SQRT_2_OVER_PI  # du/dx
        slope = s + 2.0 * x * s * (1.0 - s) * du
    else:
        slope = 0.5 * (1.0 + tl.math.erf(x * RSQRT_2)) + x * tl.exp(-0.5 * x * x) * RSQRT_2PI
    store(dx_ptr, i, mask, shape, dx_strides, load(dout_ptr, i, mask, shape, dout_strides) * slope)


def gelu(x, approximate):
    out = torch.empty_like(x)
    launch("gelu", gelu_kernel, (x, out), approximate == "tanh")
    return out, (x,)


def gelu_backward(dout, cache, needs, approximate, out=None):
    (x,) = cache
    if not needs[0]:
        return (None,)
    dx = torch.empty_like(x) if out is None else out  # out may be x itself: each element read, then written
    launch("gelu", gelu_backward_kernel, (dout, x, dx), approximate == "tanh")
    return (dx,)
