"""scal: out <- alpha * x, elementwise, for a tensor of any shape and strides.

FLOPs: numel. Bytes: 2 * numel * itemsize (read x, write out; out may be x itself).

The product is formed in float32 and rounded once to the tensor's dtype. ``alpha`` is a number, or
a 0-d float32 tensor on the tensor's device, read by the kernel (a factor computed on the GPU, such as
linear_cross_entropy's dout / n_valid, without a sync).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import block_indices, launch_elementwise, strided_offsets


@triton.jit
def scal_kernel(x_ptr, out_ptr, numel, shape, x_strides, out_strides, alpha, BLOCK: tl.constexpr,
                ALPHA_IN_MEMORY: tl.constexpr):
    i = block_indices(BLOCK)  # (BLOCK,) int64 flat indices
    mask = i < numel
    if ALPHA_IN_MEMORY:  # alpha: the address of a 0-d float32 tensor
        alpha = tl.load(alpha)
    x = tl.load(x_ptr + strided_offsets(i, shape, x_strides), mask=mask).to(tl.float32)
    out = alpha * x
    tl.store(out_ptr + strided_offsets(i, shape, out_strides), out.to(out_ptr.dtype.element_ty), mask=mask)


def scal(x, alpha, out):
    """``out <- alpha * x``; returns ``out``."""
    launch_elementwise("scal", scal_kernel, (x, out), alpha, ALPHA_IN_MEMORY=isinstance(alpha, torch.Tensor))
    return out
