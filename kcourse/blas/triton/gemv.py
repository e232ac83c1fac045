"""gemv: out <- alpha * A x + beta * y for A (m, n), x (n,), y (m,); out may be y itself.

FLOPs: 2mn. Bytes: (mn + n + 2m) * itemsize: reading A dominates, so gemv is memory bound.

Each program owns BLOCK_M rows. It sweeps the columns BLOCK_N at a time, multiplying a
(BLOCK_M, BLOCK_N) tile of A by the matching slice of x into a 2-D float32 accumulator, and sums
the accumulator's rows once at the end. A's strides are arguments, so the same kernel reads a
row-major A, a transposed view A.mT or a slice of either; Triton lays each tile out so that its
loads are coalesced along whichever stride is 1. With beta == 0, y is None and is never read.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._launch import INTERPRET, block_indices, cdiv, launch_tuned

if INTERPRET:  # one small config: the interpreter would take minutes to autotune
    CONFIGS = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=4)]
else:
    CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w)
               for bm, bn, w in [(8, 512, 4), (16, 256, 4), (32, 256, 8), (64, 128, 8), (128, 64, 4)]]


@triton.autotune(configs=CONFIGS, key=["M", "N", "stride_am", "stride_an"], restore_value=["out_ptr"])
@triton.jit
def gemv_kernel(A_ptr, x_ptr, y_ptr, out_ptr, M, N, stride_am, stride_an, stride_x, stride_y, stride_out,
                alpha, beta, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # A: (M, N); x: (N,); y, out: (M,)
    rows = block_indices(BLOCK_M)  # (BLOCK_M,) int64
    row_mask = rows < M
    a_rows = A_ptr + rows[:, None] * stride_am  # (BLOCK_M, 1) pointers to each row's start
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N).to(tl.int64)  # (BLOCK_N,)
        col_mask = cols < N
        a = tl.load(a_rows + cols[None, :] * stride_an, mask=row_mask[:, None] & col_mask[None, :], other=0.0)
        x = tl.load(x_ptr + cols * stride_x, mask=col_mask, other=0.0)
        acc += a.to(tl.float32) * x.to(tl.float32)[None, :]
    out = alpha * tl.sum(acc, axis=1)  # (BLOCK_M,)
    if y_ptr is not None:  # a compile-time test: y is None when beta == 0
        out += beta * tl.load(y_ptr + rows * stride_y, mask=row_mask).to(tl.float32)
    tl.store(out_ptr + rows * stride_out, out.to(out_ptr.dtype.element_ty), mask=row_mask)


def gemv(A, x, y, alpha, beta, out):
    """``out <- alpha * A x + beta * y`` (``y`` is None when ``beta == 0``); returns ``out``."""
    M, N = A.shape
    grid = lambda meta: (cdiv(M, meta["BLOCK_M"]),)
    # what the autotuner's pick depends on: its key arguments and the tensors' dtypes
    key = (M, N, A.stride(0), A.stride(1), A.dtype, x.dtype, out.dtype, None if y is None else y.dtype)
    launch_tuned(gemv_kernel, grid, key, A, x, y, out, M, N, A.stride(0), A.stride(1), x.stride(0),
                 y.stride(0) if y is not None else 0, out.stride(0), alpha, beta)
    return out
