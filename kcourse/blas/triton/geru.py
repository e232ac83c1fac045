"""geru: out <- A + alpha * x y^T for A (m, n), x (m,), y (n,); out may be A itself.

FLOPs: 2mn. Bytes: (2mn + m + n) * itemsize (read A, write out): memory bound.

Programs tile out into (BLOCK_M, BLOCK_N) blocks numbered along one grid axis (a second grid axis
would cap the block count at 65535). Every operand is addressed through its own strides, so A and
out may each be row-major, transposed or sliced. The update is formed in float32, rounded once.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._launch import cdiv, launch

BLOCK_M, BLOCK_N, NUM_WARPS = 64, 64, 8


@triton.jit
def geru_kernel(A_ptr, x_ptr, y_ptr, out_ptr, M, N, stride_am, stride_an, stride_x, stride_y,
                stride_om, stride_on, alpha, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # A, out: (M, N); x: (M,); y: (N,)
    pid = tl.program_id(0).to(tl.int64)
    col_blocks = tl.cdiv(N, BLOCK_N)
    rows = (pid // col_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) int64
    cols = (pid % col_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) int64
    row_mask, col_mask = rows < M, cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    a = tl.load(A_ptr + rows[:, None] * stride_am + cols[None, :] * stride_an, mask=mask).to(tl.float32)
    x = tl.load(x_ptr + rows * stride_x, mask=row_mask).to(tl.float32)
    y = tl.load(y_ptr + cols * stride_y, mask=col_mask).to(tl.float32)
    out = a + (alpha * x)[:, None] * y[None, :]
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on,
             out.to(out_ptr.dtype.element_ty), mask=mask)


def geru(A, x, y, alpha, out):
    """``out <- A + alpha * x y^T``; returns ``out``."""
    M, N = A.shape
    grid = (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),)
    launch(geru_kernel, grid, A, x, y, out, M, N, A.stride(0), A.stride(1), x.stride(0), y.stride(0),
           out.stride(0), out.stride(1), alpha, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
           num_warps=NUM_WARPS)
    return out
