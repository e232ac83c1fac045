"""scal: out <- alpha * x, elementwise, for a tensor of any shape and strides.

FLOPs: numel. Bytes: 2 * numel * itemsize (read x, write out; out may be x itself).

The product is formed in float32 and rounded once to the tensor's dtype.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._launch import block_indices, launch_elementwise, strided_offsets


@triton.jit
def scal_kernel(x_ptr, out_ptr, numel, shape, x_strides, out_strides, alpha, BLOCK: tl.constexpr):
    i = block_indices(BLOCK)  # (BLOCK,) int64 flat indices
    mask = i < numel
    x = tl.load(x_ptr + strided_offsets(i, shape, x_strides), mask=mask).to(tl.float32)
    out = alpha * x
    tl.store(out_ptr + strided_offsets(i, shape, out_strides), out.to(out_ptr.dtype.element_ty), mask=mask)


def scal(x, alpha, out):
    """``out <- alpha * x``; returns ``out``."""
    launch_elementwise("scal", scal_kernel, (x, out), alpha)
    return out
