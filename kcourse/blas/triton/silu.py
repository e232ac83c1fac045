"""silu: y = x sigmoid(x), elementwise, any shape and strides.

    dy/dx = s (1 + x (1 - s)),   s = sigmoid(x)

FLOPs: ~5 per element. Bytes: 2 numel * itemsize forward, 3 numel * itemsize backward: memory
bound. Math in float32, one rounding per output.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import block_indices
from ._pointwise import activate, launch, load, sigmoid, silu_slope, store


@triton.jit
def silu_kernel(x_ptr, out_ptr, numel, shape, x_strides, out_strides, BLOCK: tl.constexpr):
    i = block_indices(BLOCK)  # (BLOCK,) int64 flat indices
    mask = i < numel
    x = load(x_ptr, i, mask, shape, x_strides)
    store(out_ptr, i, mask, shape, out_strides, activate(x, "silu"))


@triton.jit
def silu_backward_kernel(dout_ptr, x_ptr, dx_ptr, numel, shape, dout_strides, x_strides, dx_strides,
                         BLOCK: tl.constexpr):
    i = block_indices(BLOCK)  # (BLOCK,) int64 flat indices
    mask = i < numel
    x = load(x_ptr, i, mask, shape, x_strides)
    dx = load(dout_ptr, i, mask, shape, dout_strides) * silu_slope(x, sigmoid(x))
    store(dx_ptr, i, mask, shape, dx_strides, dx)


def silu(x):
    out = torch.empty_like(x)
    launch("silu", silu_kernel, (x, out))
    return out, (x,)


def silu_backward(dout, cache, needs, out=None):
    (x,) = cache
    if not needs[0]:
        return (None,)
    dx = torch.empty_like(x) if out is None else out  # out may be x itself: each element read, then written
    launch("silu", silu_backward_kernel, (dout, x, dx))
    return (dx,)
