"""axpby: out <- alpha * x + beta * y, elementwise, for same-shape tensors of any strides.

FLOPs: 3 * numel. Bytes: 3 * numel * itemsize (read x and y, write out; out may be y itself),
2 * numel * itemsize when beta == 0.

With beta == 0 the launcher receives y = None and the kernel never reads y, so NaN or Inf in y
cannot reach the result (the BLAS convention). The sum is formed in float32, rounded once.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._launch import block_indices, launch_elementwise, strided_offsets


@triton.jit
def axpby_kernel(x_ptr, y_ptr, out_ptr, numel, shape, x_strides, y_strides, out_strides,
                 alpha, beta, BLOCK: tl.constexpr):
    i = block_indices(BLOCK)  # (BLOCK,) int64 flat indices
    mask = i < numel
    x = tl.load(x_ptr + strided_offsets(i, shape, x_strides), mask=mask).to(tl.float32)
    out = alpha * x
    if y_ptr is not None:  # a compile-time test: y is None when beta == 0
        y = tl.load(y_ptr + strided_offsets(i, shape, y_strides), mask=mask).to(tl.float32)
        out += beta * y
    tl.store(out_ptr + strided_offsets(i, shape, out_strides), out.to(out_ptr.dtype.element_ty), mask=mask)


def axpby(x, y, alpha, beta, out):
    """``out <- alpha * x + beta * y`` (``y`` is None when ``beta == 0``); returns ``out``."""
    launch_elementwise("axpby", axpby_kernel, (x, y, out), alpha, beta)
    return out
