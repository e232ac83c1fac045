"""copy: out <- x, elementwise, for tensors of any shape and strides.

FLOPs: 0. Bytes: 2 * numel * itemsize (read x, write out).

Values are moved bit for bit, never converted, so no arithmetic happens on them. Strided views are
indexed through ``_launch.strided_offsets``; contiguous tensors take the flat, vectorized path.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._launch import block_indices, launch_elementwise, strided_offsets


@triton.jit
def copy_kernel(x_ptr, out_ptr, numel, shape, x_strides, out_strides, BLOCK: tl.constexpr):
    i = block_indices(BLOCK)  # (BLOCK,) int64 flat indices
    mask = i < numel
    x = tl.load(x_ptr + strided_offsets(i, shape, x_strides), mask=mask)
    tl.store(out_ptr + strided_offsets(i, shape, out_strides), x, mask=mask)


def copy(x, out):
    """``out <- x``; returns ``out``."""
    launch_elementwise("copy", copy_kernel, (x, out))
    return out
