"""What softmax and log_softmax share: the rows of an n-D tensor, the online logsumexp, and their
row kernels (a ``LOG`` flag picks the formula). cross_entropy takes only ``CHUNK`` from here; its
forward has its own chunked logsumexp (per-lane sums, the next chunk prefetched).

Rows. A softmax along ``dim`` normalizes every 1-D fibre ``x[i, ..., :, ..., k]`` in which ``dim``
varies. ``launch_rows`` indexes those fibres without copying: the other dims, merged as
``_launch.strided_layout`` merges them (at most ``MAX_DIMS``), number the rows, the kernel finds
row r at ``strided_offsets(r, row_shape, row_strides)`` and steps along it by ``stride(dim)``.
Every tensor of up to 5 dims and every contiguous one fits (its dims before and after ``dim``
merge into two); only a view with more than 4 unmergeable row dims is copied (``.contiguous()``).

Tiles. A program owns BLOCK_M rows of a (BLOCK_M, BLOCK_N) tile. A row of at most
``MAX_ONE_PASS`` elements is read once and kept in registers (several short rows per program,
``TILE`` elements in all); a longer row is swept twice, ``CHUNK`` elements at a time: first for its
max and sum (``online_logsumexp``), then to write the output.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import block_indices, cdiv, launch, next_power_of_2, strided_layout, strided_offsets

TILE = 4096  # elements per program when rows are short: 32 per thread with 4 warps
THREAD_ELEMENTS = 32  # elements of a one-pass tile per thread (num_warps = tile / (32 * this), 1 to 16)
CHUNK_THREAD_ELEMENTS = 16  # ... and of a longer row's chunk: 8 warps (4 ran 3-10% slower at 262144 columns)
MAX_ONE_PASS = 16384  # the longest row kept in registers: 32 per thread with 16 warps
CHUNK = 4096  # columns per step of the two-pass sweep over a longer row


@triton.jit
def online_logsumexp(rows_ptr, col_stride, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``(m, s)`` of the BLOCK_M rows starting at ``rows_ptr`` (BLOCK_M, 1): the row max
    ``m = max_j x_j`` and ``s = sum_j exp(x_j - m)``, both (BLOCK_M,) float32, read BLOCK_N columns
    at a time. When a chunk raises the running max, the running sum is rescaled by
    ``exp(old max - new max)``: one exp per element. ``logsumexp = m + log(s)``; a row of -inf
    gives ``m = -inf, s = 0`` (its softmax is NaN, as in torch)."""
    m = tl.full([BLOCK_M], -float("inf"), tl.float32)
    s = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N).to(tl.int64)[None, :]  # (1, BLOCK_N)
        x = tl.load(rows_ptr + cols * col_stride, mask=cols < N, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=1))  # (BLOCK_M,)
        ref = tl.where(m_new == -float("inf"), 0.0, m_new)  # only -inf so far: no -inf - -inf
        s = s * tl.exp(m - ref) + tl.sum(tl.exp(x - ref[:, None]), axis=1)
        m = m_new
    return m, s


@triton.jit
def normalize(x, m, s, LOG: tl.constexpr):
    """softmax ``exp(x - m) / s`` or log_softmax ``x - m - log(s)`` of a float32 tile."""
    if LOG:
        return x - m - tl.log(s)
    return tl.exp(x - m) / s


@triton.jit
def softmax_kernel(x_ptr, y_ptr, M, N, row_shape, x_rows, y_rows, x_col, y_col,
                   LOG: tl.constexpr, ONE_PASS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # x, y: M rows of N elements; row r starts at strided_offsets(r, row_shape, *_rows), element j
    # is *_col further on. y = softmax(x) (LOG: log_softmax) along each row.
    rows = block_indices(BLOCK_M)  # (BLOCK_M,) int64
    row_mask = (rows < M)[:, None]  # (BLOCK_M, 1)
    # rows past M read row M - 1 (no -inf - -inf in a masked row) and write nothing
    x_row = x_ptr + strided_offsets(tl.minimum(rows, M - 1), row_shape, x_rows)[:, None]  # (BLOCK_M, 1)
    y_row = y_ptr + strided_offsets(rows, row_shape, y_rows)[:, None]
    cols = tl.arange(0, BLOCK_N).to(tl.int64)[None, :]  # (1, BLOCK_N)
    if ONE_PASS:  # N <= BLOCK_N: one read, the tile stays in registers
        x = tl.load(x_row + cols * x_col, mask=cols < N, other=-float("inf")).to(tl.float32)  # (BLOCK_M, BLOCK_N)
        m = tl.max(x, axis=1)[:, None]
        s = tl.sum(tl.exp(x - m), axis=1)[:, None]
        tl.store(y_row + cols * y_col, normalize(x, m, s, LOG).to(y_ptr.dtype.element_ty), mask=row_mask & (cols < N))
    else:  # pass 1: max and sum; pass 2: normalize, chunk by chunk
        m, s = online_logsumexp(x_row, x_col, N, BLOCK_M, BLOCK_N)
        for start in range(0, N, BLOCK_N):
            mask = row_mask & (start + cols < N)
            x = tl.load(x_row + (start + cols) * x_col, mask=mask, other=0.0).to(tl.float32)
            y = normalize(x, m[:, None], s[:, None], LOG)
            tl.store(y_row + (start + cols) * y_col, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_grad(y, dy, total, LOG: tl.constexpr):
    """softmax ``y * (dy - total)`` (total = sum dy y) or log_softmax ``dy - exp(y) * total`` (total = sum dy)."""
    if LOG:
        return dy - tl.exp(y) * total
    return y * (dy - total)


@triton.jit
def softmax_backward_kernel(y_ptr, dy_ptr, dx_ptr, M, N, row_shape, y_rows, dy_rows, dx_rows, y_col, dy_col, dx_col,
                            LOG: tl.constexpr, ONE_PASS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # y (the forward's output), dy, dx: M rows of N elements, laid out as in softmax_kernel.
    # softmax: dx = y * (dy - sum_j dy_j y_j);  log_softmax: dx = dy - exp(y) * sum_j dy_j
    rows = block_indices(BLOCK_M)
    row_mask = (rows < M)[:, None]
    y_row = y_ptr + strided_offsets(rows, row_shape, y_rows)[:, None]
    dy_row = dy_ptr + strided_offsets(rows, row_shape, dy_rows)[:, None]
    dx_row = dx_ptr + strided_offsets(rows, row_shape, dx_rows)[:, None]
    cols = tl.arange(0, BLOCK_N).to(tl.int64)[None, :]
    if ONE_PASS:  # N <= BLOCK_N: y and dy are read once and stay in registers
        mask = row_mask & (cols < N)
        y = tl.load(y_row + cols * y_col, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + cols * dy_col, mask=mask, other=0.0).to(tl.float32)
        total = tl.sum(dy if LOG else dy * y, axis=1)[:, None]  # (BLOCK_M, 1)
        tl.store(dx_row + cols * dx_col, softmax_grad(y, dy, total, LOG).to(dx_ptr.dtype.element_ty), mask=mask)
    else:  # pass 1: the row sums (a float32 sum per lane); pass 2: dx, chunk by chunk
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            mask = row_mask & (start + cols < N)
            dy = tl.load(dy_row + (start + cols) * dy_col, mask=mask, other=0.0).to(tl.float32)
            if LOG:
                acc += dy
            else:
                acc += dy * tl.load(y_row + (start + cols) * y_col, mask=mask, other=0.0).to(tl.float32)
        total = tl.sum(acc, axis=1)[:, None]
        for start in range(0, N, BLOCK_N):
            mask = row_mask & (start + cols < N)
            y = tl.load(y_row + (start + cols) * y_col, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + (start + cols) * dy_col, mask=mask, other=0.0).to(tl.float32)
            dx = softmax_grad(y, dy, total, LOG)
            tl.store(dx_row + (start + cols) * dx_col, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def launch_rows(op: str, kernel, inputs: list[torch.Tensor], dim: int, LOG: bool) -> torch.Tensor:
    """Run ``kernel`` (softmax_kernel or softmax_backward_kernel) over the rows along ``dim`` of
    the same-shape ``inputs``; returns the output, a new tensor laid out like ``inputs[0]``."""
    out = torch.empty_like(inputs[0])
    if out.numel() == 0:
        return out
    try:
        row_shape, row_strides = strided_layout(op, *(t.select(dim, 0) for t in (*inputs, out)))
    except ValueError:  # more than MAX_DIMS row dims that do not merge (a permuted view of 6+ dims): copy
        inputs = [t.contiguous() for t in inputs]
        out = torch.empty_like(inputs[0])
        row_shape, row_strides = strided_layout(op, *(t.select(dim, 0) for t in (*inputs, out)))
    M, N = out.numel() // out.shape[dim], out.shape[dim]
    if N <= MAX_ONE_PASS:
        BLOCK_N = next_power_of_2(N)
        BLOCK_M = min(max(TILE // BLOCK_N, 1), next_power_of_2(M))
        per_thread = THREAD_ELEMENTS
    else:
        BLOCK_N, BLOCK_M, per_thread = CHUNK, 1, CHUNK_THREAD_ELEMENTS
    num_warps = min(16, max(1, BLOCK_M * BLOCK_N // (32 * per_thread)))
    tensors = (*inputs, out)
    launch(kernel, (cdiv(M, BLOCK_M),), *tensors, M, N, row_shape, *row_strides,
           *(t.stride(dim) for t in tensors), LOG=LOG, ONE_PASS=N <= BLOCK_N, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
           num_warps=num_warps)
    return out


def softmax_rows(op: str, x: torch.Tensor, dim: int, LOG: bool):
    """The triton ``softmax``/``log_softmax`` forward: ``(y, (y,))``."""
    y = launch_rows(op, softmax_kernel, [x], dim, LOG)
    return y, (y,)


def softmax_rows_backward(op: str, dy: torch.Tensor, cache, needs, dim: int, LOG: bool):
    """The triton ``softmax_backward``/``log_softmax_backward``: ``(dx,)`` (None if not needed)."""
    (y,) = cache
    return (launch_rows(op, softmax_backward_kernel, [y, dy], dim, LOG) if needs[0] else None,)
