"""swap: out_x <- y and out_y <- x, elementwise, for same-shape tensors of any strides.

FLOPs: 0. Bytes: 4 * numel * itemsize (read x and y, write both outputs).

The in-place call passes out_x is x and out_y is y. That is safe because each element is owned by
one program, which loads both values before it stores either.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._launch import block_indices, launch_elementwise, strided_offsets


@triton.jit
def swap_kernel(x_ptr, y_ptr, out_x_ptr, out_y_ptr, numel, shape,
                x_strides, y_strides, out_x_strides, out_y_strides, BLOCK: tl.constexpr):
    i = block_indices(BLOCK)  # (BLOCK,) int64 flat indices
    mask = i < numel
    x = tl.load(x_ptr + strided_offsets(i, shape, x_strides), mask=mask)
    y = tl.load(y_ptr + strided_offsets(i, shape, y_strides), mask=mask)
    tl.store(out_x_ptr + strided_offsets(i, shape, out_x_strides), y, mask=mask)
    tl.store(out_y_ptr + strided_offsets(i, shape, out_y_strides), x, mask=mask)


def swap(x, y, out_x, out_y):
    """``out_x <- y``, ``out_y <- x``; returns ``(out_x, out_y)``."""
    launch_elementwise("swap", swap_kernel, (x, y, out_x, out_y))
    return out_x, out_y
