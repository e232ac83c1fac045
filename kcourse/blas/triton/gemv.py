"""gemv: out <- alpha * A x + beta * y for A (m, n), x (n,), y (m,); out may be y itself.

FLOPs: 2mn. Bytes: (mn + n + 2m) * itemsize: reading A dominates, so gemv is memory bound.

Each program owns BLOCK_M rows. It sweeps the columns BLOCK_N at a time, multiplying a
(BLOCK_M, BLOCK_N) tile of A by the matching slice of x into a 2-D float32 accumulator, and sums
the accumulator's rows once at the end. A's strides are arguments, so the same kernel reads a
row-major A, a transposed view A.mT or a slice of either; Triton lays each tile out so that its
loads are coalesced along whichever stride is 1. With beta == 0, y is None and is never read.

Few rows and long ones (a bias gradient dY^T 1: m = 768 outputs, n = 16384 tokens) would give
m / BLOCK_M programs, a few dozen on 132 SMs. There the columns are split too (``splits``): the
grid's second axis takes slices of at least ``SPLIT_COLUMNS`` columns, each program writes its
rows' float32 partial sums to a (splits, m) buffer, and the same kernel adds them up with alpha and
beta (a second, tiny gemv of its transpose against a ones vector): one rounding, in a fixed order.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _cache
from ._launch import INTERPRET, block_indices, cdiv, launch_tuned, sm_count

if INTERPRET:  # one small config: the interpreter would take minutes to autotune
    CONFIGS = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=4)]
else:
    CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w)
               for bm, bn, w in [(8, 512, 4), (16, 256, 4), (32, 256, 8), (64, 128, 8), (128, 64, 4)]]


SPLIT_PROGRAMS = 4  # split the columns when there would be fewer than this many programs an SM ...
SPLIT_BLOCK_M = 64  # ... counting rows in blocks of this many (the autotuner picks 8 to 128)
SPLIT_COLUMNS = 1024  # and give each split at least this many columns


@triton.autotune(configs=CONFIGS, key=["M", "N", "stride_am", "stride_an", "COLUMNS"], restore_value=["out_ptr"])
@triton.jit
def gemv_kernel(A_ptr, x_ptr, y_ptr, out_ptr, M, N, stride_am, stride_an, stride_x, stride_y, stride_out,
                alpha, beta, COLUMNS, stride_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # A: (M, N); x: (N,); y: (M,); out: (M,), or (splits, M) partials at stride_split, a row per
    # COLUMNS-column slice of A (program_id(1))
    rows = block_indices(BLOCK_M)  # (BLOCK_M,) int64
    row_mask = rows < M
    a_rows = A_ptr + rows[:, None] * stride_am  # (BLOCK_M, 1) pointers to each row's start
    first = tl.program_id(1).to(tl.int64) * COLUMNS
    end = tl.minimum(first + COLUMNS, N)
    out_ptr += tl.program_id(1).to(tl.int64) * stride_split
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(first, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N).to(tl.int64)  # (BLOCK_N,)
        col_mask = cols < end
        a = tl.load(a_rows + cols[None, :] * stride_an, mask=row_mask[:, None] & col_mask[None, :], other=0.0)
        x = tl.load(x_ptr + cols * stride_x, mask=col_mask, other=0.0)
        acc += a.to(tl.float32) * x.to(tl.float32)[None, :]
    out = alpha * tl.sum(acc, axis=1)  # (BLOCK_M,)
    if y_ptr is not None:  # a compile-time test: y is None when beta == 0
        out += beta * tl.load(y_ptr + rows * stride_y, mask=row_mask).to(tl.float32)
    tl.store(out_ptr + rows * stride_out, out.to(out_ptr.dtype.element_ty), mask=row_mask)


def splits(M: int, N: int, sms: int) -> int:
    """Column slices of a gemv of A (M, N) on ``sms`` SMs: enough for about ``SPLIT_PROGRAMS``
    programs an SM (rows in blocks of ``SPLIT_BLOCK_M``), each slice ``SPLIT_COLUMNS`` or more wide."""
    if M == 0:
        return 1
    return max(1, min(cdiv(SPLIT_PROGRAMS * sms, cdiv(M, SPLIT_BLOCK_M)), N // SPLIT_COLUMNS))


def gemv(A, x, y, alpha, beta, out):
    """``out <- alpha * A x + beta * y`` (``y`` is None when ``beta == 0``); returns ``out``."""
    M, N = A.shape
    parts = splits(M, N, sm_count(A.device))
    if parts > 1:  # (splits, M) float32 partial sums, then their sum with alpha and beta
        columns = cdiv(N, parts)
        partials = torch.empty(parts, M, dtype=torch.float32, device=A.device)
        _run(A, x, None, partials[0], 1.0, 0.0, columns, partials.stride(0), parts)
        return _run(partials.mT, _cache.ones(parts, partials), y, out, alpha, beta, parts, 0, 1)
    return _run(A, x, y, out, alpha, beta, N, 0, 1)


def _run(A, x, y, out, alpha, beta, columns, stride_split, parts):
    """``gemv_kernel`` over A (M, N) in ``parts`` slices of ``columns`` columns, slice s writing
    ``out`` + s * ``stride_split`` (one slice: the whole product into out)."""
    M, N = A.shape
    grid = lambda meta: (cdiv(M, meta["BLOCK_M"]), parts)
    # what the autotuner's pick depends on: its key arguments and the tensors' dtypes
    key = (M, N, A.stride(0), A.stride(1), columns, A.dtype, x.dtype, out.dtype, None if y is None else y.dtype)
    launch_tuned(gemv_kernel, grid, key, A, x, y, out, M, N, A.stride(0), A.stride(1), x.stride(0),
                 y.stride(0) if y is not None else 0, out.stride(0), alpha, beta, columns, stride_split)
    return out
