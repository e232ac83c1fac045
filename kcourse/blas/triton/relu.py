"""relu: y = max(x, 0), elementwise, any shape and strides (NaN stays NaN, as torch.relu).

    dx = dy where x > 0, else 0   (subgradient 0 at 0; written ``x <= 0 ? 0 : dy`` as PyTorch's
                                   threshold_backward, so a NaN input passes dy through)

Exact: no rounding. Bytes: 2 numel * itemsize forward, 3 numel * itemsize backward.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import block_indices
from ._pointwise import activate, launch, load, store


@triton.jit
def relu_kernel(x_ptr, out_ptr, numel, shape, x_strides, out_strides, BLOCK: tl.constexpr):
    i = block_indices(BLOCK)  # (BLOCK,) int64 flat indices
    mask = i < numel
    x = load(x_ptr, i, mask, shape, x_strides)
    store(out_ptr, i, mask, shape, out_strides, activate(x, "relu"))


@triton.jit
def relu_backward_kernel(dout_ptr, x_ptr, dx_ptr, numel, shape, dout_strides, x_strides, dx_strides,
                         BLOCK: tl.constexpr):
    i = block_indices(BLOCK)  # (BLOCK,) int64 flat indices
    mask = i < numel
    x = load(x_ptr, i, mask, shape, x_strides)
    dx = tl.where(x <= 0, 0.0, load(dout_ptr, i, mask, shape, dout_strides))
    store(dx_ptr, i, mask, shape, dx_strides, dx)


def relu(x):
    out = torch.empty_like(x)
    launch("relu", relu_kernel, (x, out))
    return out, (x,)


def relu_backward(dout, cache, needs, out=None):
    (x,) = cache
    if not needs[0]:
        return (None,)
    dx = torch.empty_like(x) if out is None else out  # out may be x itself: each element read, then written
    launch("relu", relu_backward_kernel, (dout, x, dx))
    return (dx,)
