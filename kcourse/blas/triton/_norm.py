"""The kernels of layer_norm and rms_norm (``CENTER`` false: the mean is 0 and not stored).

Rows are the last dimension of x (..., D), flattened to (N, D). Per row, in float32:

    mean = sum_j x_j / D,  rstd = 1 / sqrt(sum_j (x_j - mean)^2 / D + eps),  xhat = (x - mean) * rstd
    y = xhat * weight + bias
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat))  with g = dy * weight  (rms_norm: no mean(g))
    dweight = sum_rows dy * xhat,   dbias = sum_rows dy

Forward: one program per row. A row of up to ``ON_CHIP_FORWARD`` columns is loaded once and kept in
registers (exact two-pass statistics on chip), ``FORWARD_THREAD_ELEMENTS`` = 16 a thread (two
16-byte loads in 16 bits: 1.1-1.2x eight a thread at D = 1024-4096 on an H200, docs/layer_norm.md).
A longer row is swept in chunks of ``CHUNK_D``, once for the statistics and once for y. The
statistics sweep sums s = x - K and s^2 per lane, with K the first chunk's mean: var = mean(s^2) -
mean(s)^2. Shifting by K keeps that difference stable for large offsets (plain mean(x^2) - mean^2
loses every digit when mean^2 >> var), since (mean - K)^2 <= var * D / CHUNK_D: at most
log2(D / CHUNK_D) bits of the variance are lost.

Backward: ``P`` programs (``WARPS_PER_SM // num_warps`` per SM: 16 warps resident), each owning a block of consecutive
rows. It writes dx and sums its rows' dy * xhat and dy per column into float32 partials (S, P, D),
one set per parameter gradient wanted; ``column_sum_kernel`` then adds the P partials of each
column of every set in one launch: a deterministic two-stage reduction, no atomics.

A row of up to ``ON_CHIP_BACKWARD`` columns stays in registers, with the column sums beside it.
Rows go ``BLOCK_M`` at a time as a (BLOCK_M, BLOCK_D) tile of about ``BACKWARD_TILE`` elements, so
that every step of a program moves enough bytes to keep the memory busy (D = 512 in bf16: 8 rows,
8 KB of x and 8 KB of dy per step, not 1 KB each); the column sums are a tile of the same shape,
summed over its rows once, at the end. With ``PREFETCH`` (2-byte dtypes unless
``PREFETCH_ITEMSIZE`` says otherwise) the next tile's x and dy are loaded before the current one is
reduced: at D = 8192 an SM holds one program (16 warps, ~100 registers a thread), and without the
prefetch its loads stop during every row's reductions and stores. layer_norm's two row sums are
one two-operand reduction: one round of shared memory and barriers, not two.

Rows of ``ON_CHIP_BACKWARD`` < D <= ``_split.LONGEST`` columns are split over programs that
meet once a row (``norm_split_backward_kernel``, ``_split``): x and dy are read once, as on chip.
A longer row is swept in ``CHUNK_D`` blocks, twice: row by row for its row sums (kept in a (N, 2)
float32 scratch when a column sum is wanted too), then block of columns by block over the program's
rows, adding the column sums and writing that block of dx beside them: x and dy are read twice
(5NDs bytes, not three times as two sweeps for dx and then the column sums would). With
dx alone the two sweeps are per row; with the column sums alone, only the column sweep. Both loops
are pipelined (``LONG_ROW_STAGES``), so that the next chunk's or row's loads are in flight.

Column sums: program (j, s) adds the P partials of the ``BLOCK_D`` columns j of set s, in tiles of
``SUM_TILE`` elements with ``BLOCK_P = min(next_power_of_2(P), SUM_MAX_BLOCK_P)`` rows: narrow
column blocks make many programs, each with one or two loads (D = 512, P = 256: 32 programs a set,
each one 256 x 16 load, where 32 x 128 tiles gave 4 programs, each 16 dependent loads of P = 512).

The fused add + norms (add_layer_norm, add_rms_norm) run these kernels with a residual: the forward
normalizes h = x + residual, rounded once to x's dtype and stored beside y as it is loaded (a long
row's second sweep reads h back); the backward reads h as its input and adds h's own gradient dh to
dx before the store (``_store_dx``).

FLOPs ~ 7ND forward, 13ND backward (rms_norm: 4ND, 9ND). Bytes (itemsize s): forward 2NDs (+ 8N
for mean, rstd), backward 3NDs + 2 * 4PD per parameter gradient (the partials): memory-bound.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _host
from .._layout import rows_of
from ._launch import block_indices, cdiv, launch, next_power_of_2, sm_count, sum_pair
from ._split import exchange, rows_per_program, scratch, split, take_ticket

ON_CHIP_FORWARD = 16384  # the longest row the forward holds in registers (32 per thread at 16 warps)
FORWARD_THREAD_ELEMENTS = 16  # forward: elements of a row per thread (num_warps = BLOCK_D / (32 * this), 1 to 16)
ON_CHIP_BACKWARD = 8192  # the backward holds x, dy, g and two column sums: 16 per thread at 16 warps
CHUNK_D = 4096  # the block of columns of a longer row, swept in a loop
CHUNK_THREAD_ELEMENTS = 8  # elements of such a block per thread (16 warps)
BACKWARD_TILE = 4096  # backward: rows of up to this many columns go several at a time, in tiles of this size
BACKWARD_THREAD_ELEMENTS = 16  # backward: elements of a tile per thread (num_warps = tile / (32 * this), 1 to 16)
SHORT_ROW, SHORT_ROW_THREAD_ELEMENTS = 1024, 32  # ... but rows of at most SHORT_ROW columns: this many,
SHORT_ROW_ITEMSIZE = 2  # in dtypes of at most this many bytes
PREFETCH_ITEMSIZE = 2  # backward: load the next tile ahead for dtypes of at most this many bytes (0: never)
BACKWARD_STAGES = None  # backward: num_stages of the row loop (None: the compiler's default)
LONG_ROW_STAGES = 3  # backward, rows longer than ON_CHIP_BACKWARD: num_stages of the sweeps' loops (loads in flight)
WARPS_PER_SM = 16  # backward: programs per SM = this // num_warps (two 8-warp programs at D <= 4096: 1.2-1.4x one)
CENTER_PREFETCH_TILE = 8192  # backward, layer_norm with the prefetch, D <= 1024: its tile (two programs do not fit)
SUM_TILE, SUM_MAX_BLOCK_P, SUM_WARPS = 4096, 256, 4  # the partial-sum reduction: tile elements, rows, warps
# backward, rows split over programs (``_split``): (columns a program, num_warps) by (itemsize, layer_norm),
# measured on an H200 (experiments/split_rows.py: 16 warps spill a float32 layer_norm's 32 columns a thread)
SPLIT_LAUNCH = {(2, False): (8192, 16), (2, True): (8192, 8), (4, False): (8192, 8), (4, True): (4096, 8)}
SPLIT_PROGRAMS_PER_SM = 2  # ... and the groups' count, as programs an SM (each group, a row of partials)


def _block(d: int, on_chip: int, per_thread: int = CHUNK_THREAD_ELEMENTS) -> dict:
    """Launch options for rows of ``d`` columns: the whole row as one block when it fits ``on_chip``,
    about ``per_thread`` elements per thread, else ``CHUNK_D`` columns at a time,
    ``CHUNK_THREAD_ELEMENTS`` per thread (1 to 16 warps)."""
    block = next_power_of_2(max(d, 16))
    one_block = block <= on_chip
    block, per_thread = (block, per_thread) if one_block else (CHUNK_D, CHUNK_THREAD_ELEMENTS)
    return {"BLOCK_D": block, "ONE_BLOCK": one_block, "num_warps": min(max(block // (32 * per_thread), 1), 16)}


@triton.jit
def _affine_store(xhat, cols, mask, w_ptr, b_ptr, y_ptr):
    # xhat: (BLOCK_D,) float32 columns `cols` of one row; y = xhat * w + b, rounded once
    y = xhat
    if w_ptr is not None:
        y = y * tl.load(w_ptr + cols, mask=mask).to(tl.float32)
    if b_ptr is not None:
        y = y + tl.load(b_ptr + cols, mask=mask).to(tl.float32)
    tl.store(y_ptr + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_input(x_row, r_row, h_row, cols, mask, stride_col, stride_rcol):
    # columns `cols` of one row of the norm's input, float32, 0 where masked: x, or with a residual row
    # h = x + r, rounded once to h's dtype, stored in h_row (the fused add + norms) and returned as rounded
    x = tl.load(x_row + cols * stride_col, mask=mask, other=0.0).to(tl.float32)
    if r_row is not None:
        h = x + tl.load(r_row + cols * stride_rcol, mask=mask, other=0.0).to(tl.float32)
        h = h.to(h_row.dtype.element_ty)
        tl.store(h_row + cols, h, mask=mask)
        x = h.to(tl.float32)
    return x


@triton.jit
def norm_forward_kernel(x_ptr, r_ptr, h_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, D, stride_row, stride_col,
                        stride_rrow, stride_rcol, eps,
                        CENTER: tl.constexpr, BLOCK_D: tl.constexpr, ONE_BLOCK: tl.constexpr):
    # x: (N, D) with strides (stride_row, stride_col); w, b: (D,) contiguous or None;
    # y: (N, D) contiguous; mean (CENTER only), rstd: (N,) float32. One program per row.
    # The fused add + norms: r (N, D) with strides (stride_rrow, stride_rcol), h (N, D) contiguous, where
    # h = x + r is written and normalized; both None for the norms alone.
    row = tl.program_id(0).to(tl.int64)
    x_row, y_row = x_ptr + row * stride_row, y_ptr + row * D
    r_row, h_row = r_ptr, h_ptr
    if r_ptr is not None:
        r_row, h_row = r_ptr + row * stride_rrow, h_ptr + row * D
    cols = tl.arange(0, BLOCK_D).to(tl.int64)  # (BLOCK_D,)
    mean = 0.0
    if ONE_BLOCK:  # the whole row in registers: read once, write once
        mask = cols < D
        x = _load_input(x_row, r_row, h_row, cols, mask, stride_col, stride_rcol)
        if CENTER:
            mean = tl.sum(x, axis=0) / D
        xc = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / D + eps)
        _affine_store(xc * rstd, cols, mask, w_ptr, b_ptr, y_row)
    else:  # sweep 1: shifted sums of x - shift and its square (shift: the first block's mean); sweep 2: y
        shift = 0.0
        if CENTER:  # D > BLOCK_D here: the first block is full
            first = tl.load(x_row + cols * stride_col).to(tl.float32)
            if r_row is not None:  # any shift will do: h unrounded
                first += tl.load(r_row + cols * stride_rcol).to(tl.float32)
            shift = tl.sum(first, axis=0) / BLOCK_D
        sum1 = tl.zeros([BLOCK_D], dtype=tl.float32)
        sum2 = tl.zeros([BLOCK_D], dtype=tl.float32)
        for start in range(0, D, BLOCK_D):  # with a residual, h written here
            mask = start + cols < D
            x = _load_input(x_row, r_row, h_row, start + cols, mask, stride_col, stride_rcol)
            xs = tl.where(mask, x - shift, 0.0)
            sum1 += xs
            sum2 += xs * xs
        var = tl.sum(sum2, axis=0) / D  # rms_norm: mean(x^2)
        if CENTER:
            delta = tl.sum(sum1, axis=0) / D  # mean - shift
            mean = shift + delta
            var = tl.maximum(var - delta * delta, 0.0)
        rstd = 1.0 / tl.sqrt(var + eps)
        if r_row is not None:  # sweep 2 reads h back, one load for two (and the stores above are seen)
            tl.debug_barrier()
            x_row, stride_col = h_row, 1
        for start in range(0, D, BLOCK_D):
            mask = start + cols < D
            x = tl.load(x_row + (start + cols) * stride_col, mask=mask, other=0.0).to(tl.float32)
            _affine_store((x - mean) * rstd, start + cols, mask, w_ptr, b_ptr, y_row)
    if CENTER:
        tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _load_grad_terms(x_row, dy_row, w_ptr, cols, mask, stride_col, mean, rstd):
    # one block of a row -> (xhat, dy, g = dy * w), float32 (BLOCK_D,); dy = g = 0 where masked
    x = tl.load(x_row + cols * stride_col, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_row + cols, mask=mask, other=0.0).to(tl.float32)
    g = dy
    if w_ptr is not None:
        g = dy * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return (x - mean) * rstd, dy, g


@triton.jit
def _load_tile(x_ptr, dy_ptr, rows, last, cols, D, stride_row, stride_col):
    # x and dy of rows (BLOCK_M,) below `last`, columns (BLOCK_D,) below D, in their own dtypes; 0 where masked
    mask = (rows < last)[:, None] & (cols < D)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_row + cols[None, :] * stride_col, mask=mask, other=0.0)
    dy = tl.load(dy_ptr + rows[:, None] * D + cols[None, :], mask=mask, other=0.0)
    return x, dy


@triton.jit
def _store_dx(dx_ptr, dh_ptr, offsets, dx, mask):
    # dx (float32) + dh (the fused add + norms' gradient of h; None: 0) at `offsets`, rounded once
    if dh_ptr is not None:
        dx += tl.load(dh_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tile_backward(x, dy, rows, last, cols, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dh_ptr, D, CENTER: tl.constexpr):
    # one (BLOCK_M, BLOCK_D) tile of whole rows: stores dx (unless dx_ptr is None) and returns the
    # tile's terms of the column sums (dy * xhat, dy), float32; masked rows and columns give 0
    row_ok = rows < last
    col_ok = cols < D
    rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)[:, None]  # (BLOCK_M, 1); 0 on masked rows
    mean = 0.0
    if CENTER:
        mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)[:, None]
    xhat = (x.to(tl.float32) - mean) * rstd
    dy = dy.to(tl.float32)
    if dx_ptr is not None:
        g = dy
        if w_ptr is not None:
            g = dy * tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if CENTER:  # both row sums in one reduction
            sum_gx, sum_g = sum_pair(g * xhat, g, 1)
            dxhat = g - xhat * (sum_gx / D)[:, None] - (sum_g / D)[:, None]
        else:
            dxhat = g - xhat * (tl.sum(g * xhat, axis=1) / D)[:, None]
        _store_dx(dx_ptr, dh_ptr, rows[:, None] * D + cols[None, :], rstd * dxhat, row_ok[:, None] & col_ok[None, :])
    return dy * xhat, dy


@triton.jit
def norm_backward_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dh_ptr, dw_ptr, db_ptr, totals_ptr,
                         N, D, stride_row, stride_col, rows_per_program,
                         CENTER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                         ONE_BLOCK: tl.constexpr, PREFETCH: tl.constexpr, STAGES: tl.constexpr,
                         LONG_STAGES: tl.constexpr):
    # dy, dx: (N, D) contiguous, dx None when not needed; dh: (N, D) contiguous or None, added to dx (the
    # fused add + norms); x: (N, D) strided; w: (D,) or None;
    # mean (CENTER only), rstd: (N,) float32; dw, db: (P, D) float32 partial sums or None; totals:
    # (N, 2) float32 or None, a long row's sums between its two sweeps (dx beside a column sum).
    pid = tl.program_id(0).to(tl.int64)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, N)
    cols = tl.arange(0, BLOCK_D).to(tl.int64)  # (BLOCK_D,)
    mean = 0.0
    if ONE_BLOCK:  # BLOCK_M whole rows per step; the partial sums in registers, stored once at the end
        block = tl.arange(0, BLOCK_M).to(tl.int64)  # (BLOCK_M,)
        acc_w = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        acc_b = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        if PREFETCH:
            x_next, dy_next = _load_tile(x_ptr, dy_ptr, first + block, last, cols, D, stride_row, stride_col)
        for start in tl.range(first, last, BLOCK_M, num_stages=STAGES):
            rows = start + block
            if PREFETCH:  # this tile was loaded during the previous step; start loading the next one
                x, dy = x_next, dy_next
                x_next, dy_next = _load_tile(x_ptr, dy_ptr, rows + BLOCK_M, last, cols, D, stride_row, stride_col)
            else:
                x, dy = _load_tile(x_ptr, dy_ptr, rows, last, cols, D, stride_row, stride_col)
            dw_terms, db_terms = _tile_backward(x, dy, rows, last, cols, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dh_ptr,
                                                D, CENTER)
            acc_w += dw_terms
            acc_b += db_terms
        if dw_ptr is not None:
            tl.store(dw_ptr + pid * D + cols, tl.sum(acc_w, axis=0), mask=cols < D)
        if db_ptr is not None:
            tl.store(db_ptr + pid * D + cols, tl.sum(acc_b, axis=0), mask=cols < D)
    else:  # rows longer than a block, one at a time: the row sums row by row, then block of columns by block
        if dx_ptr is not None:
            for row in range(first, last):
                if CENTER:
                    mean = tl.load(mean_ptr + row)
                rstd = tl.load(rstd_ptr + row)
                x_row, dy_row = x_ptr + row * stride_row, dy_ptr + row * D
                sum_gx, sum_g = 0.0, 0.0  # sweep 1: the row sums dx needs
                for start in tl.range(0, D, BLOCK_D, num_stages=LONG_STAGES):
                    mask = start + cols < D
                    xhat, dy, g = _load_grad_terms(x_row, dy_row, w_ptr, start + cols, mask, stride_col, mean, rstd)
                    sum_gx += tl.sum(g * xhat, axis=0)
                    sum_g += tl.sum(g, axis=0)
                if totals_ptr is not None:  # kept for the column sweep, which writes dx
                    tl.store(totals_ptr + 2 * row, sum_gx)
                    tl.store(totals_ptr + 2 * row + 1, sum_g)
                else:
                    for start in range(0, D, BLOCK_D):  # sweep 2: dx
                        mask = start + cols < D
                        xhat, dy, g = _load_grad_terms(x_row, dy_row, w_ptr, start + cols, mask, stride_col, mean,
                                                       rstd)
                        dxhat = g - xhat * (sum_gx / D)
                        if CENTER:
                            dxhat -= sum_g / D
                        _store_dx(dx_ptr, dh_ptr, row * D + start + cols, rstd * dxhat, mask)
        if totals_ptr is not None:
            tl.debug_barrier()  # the row sums stored above, seen by every thread of the program
        if (dw_ptr is not None) or (db_ptr is not None):
            for start in range(0, D, BLOCK_D):  # the column sums (and with totals dx), over the program's rows
                mask = start + cols < D
                acc_w = tl.zeros([BLOCK_D], dtype=tl.float32)
                acc_b = tl.zeros([BLOCK_D], dtype=tl.float32)
                w = 1.0
                if totals_ptr is not None:
                    if w_ptr is not None:
                        w = tl.load(w_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
                for row in tl.range(first, last, num_stages=LONG_STAGES):
                    if CENTER:
                        mean = tl.load(mean_ptr + row)
                    rstd = tl.load(rstd_ptr + row)
                    xhat, dy, g = _load_grad_terms(x_ptr + row * stride_row, dy_ptr + row * D, None, start + cols,
                                                   mask, stride_col, mean, rstd)
                    acc_w += dy * xhat
                    acc_b += dy
                    if totals_ptr is not None:
                        g = dy * w
                        dxhat = g - xhat * (tl.load(totals_ptr + 2 * row) / D)
                        if CENTER:
                            dxhat -= tl.load(totals_ptr + 2 * row + 1) / D
                        _store_dx(dx_ptr, dh_ptr, row * D + start + cols, rstd * dxhat, mask)
                if dw_ptr is not None:
                    tl.store(dw_ptr + pid * D + start + cols, acc_w, mask=mask)
                if db_ptr is not None:
                    tl.store(db_ptr + pid * D + start + cols, acc_b, mask=mask)


@triton.jit
def _load_block(x_ptr, dy_ptr, row, cols, mask, D, stride_row, stride_col):
    # a row's block of x and dy in their own dtypes, 0 where masked
    x = tl.load(x_ptr + row * stride_row + cols * stride_col, mask=mask, other=0.0)
    dy = tl.load(dy_ptr + row * D + cols, mask=mask, other=0.0)
    return x, dy


@triton.jit
def norm_split_backward_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dh_ptr, dw_ptr, db_ptr, sync_ptr,
                               N, D, stride_row, stride_col, PARTS, ROWS,
                               CENTER: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr):
    # norm_backward_kernel's operands, rows split over PARTS programs of BLOCK_D columns, ROWS rows a
    # group (``_split``): group k's programs meet once a row (when dx is wanted) to add up the row
    # sums of g * xhat and g, and each keeps its columns' sums of dy * xhat and dy, stored as row k of
    # the (P = groups, D) partials. x and dy are read once, the next row's blocks loading meanwhile.
    ticket = take_ticket(sync_ptr)
    group, part = ticket // PARTS, ticket % PARTS
    first = group * ROWS
    last = tl.minimum(first + ROWS, N)
    cols = part * BLOCK_D + tl.arange(0, BLOCK_D).to(tl.int64)  # (BLOCK_D,)
    mask = cols < D
    w = 1.0
    if w_ptr is not None:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    acc_w = tl.zeros([BLOCK_D], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_D], dtype=tl.float32)
    mean = 0.0
    x_next, dy_next = _load_block(x_ptr, dy_ptr, first, cols, mask, D, stride_row, stride_col)
    for row in range(first, last):
        x, dy = x_next, dy_next
        x_next, dy_next = _load_block(x_ptr, dy_ptr, row + 1, cols, mask & (row + 1 < last), D, stride_row,
                                      stride_col)
        if CENTER:
            mean = tl.load(mean_ptr + row)
        rstd = tl.load(rstd_ptr + row)
        xhat = tl.where(mask, (x.to(tl.float32) - mean) * rstd, 0.0)
        dy = dy.to(tl.float32)
        if dx_ptr is not None:
            g = dy * w
            sum_gx, sum_g = sum_pair(g * xhat, g, 0)
            gx_all, g_all = exchange(sync_ptr, row, part, sum_gx, sum_g, PARTS, BLOCK_P)
            dxhat = g - xhat * (tl.sum(gx_all, axis=0) / D)
            if CENTER:
                dxhat -= tl.sum(g_all, axis=0) / D
            _store_dx(dx_ptr, dh_ptr, row * D + cols, rstd * dxhat, mask)
        acc_w += dy * xhat
        acc_b += dy
    if dw_ptr is not None:
        tl.store(dw_ptr + group * D + cols, acc_w, mask=mask)
    if db_ptr is not None:
        tl.store(db_ptr + group * D + cols, acc_b, mask=mask)


@triton.jit
def column_sum_kernel(partials_ptr, out_ptr, out2_ptr, P, D, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr):
    # partials: (S, P, D) float32, S = 1 (out2 None) or 2; out, out2: (D,) in the parameters' dtype.
    # Program (j, s) sums columns j * BLOCK_D ... of set s over its P rows into out (s = 0) or out2 (s = 1).
    cols = block_indices(BLOCK_D)  # (BLOCK_D,) int64
    s = tl.program_id(1).to(tl.int64)
    acc = tl.zeros([BLOCK_P, BLOCK_D], dtype=tl.float32)
    for start in range(0, P, BLOCK_P):
        rows = s * P + start + tl.arange(0, BLOCK_P).to(tl.int64)  # (BLOCK_P,) rows of the (S * P, D) partials
        mask = (start + tl.arange(0, BLOCK_P) < P)[:, None] & (cols < D)[None, :]
        acc += tl.load(partials_ptr + rows[:, None] * D + cols[None, :], mask=mask, other=0.0)
    out = out_ptr
    if out2_ptr is not None:
        if s == 1:
            out = out2_ptr
    tl.store(out + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=cols < D)


def norm_forward(x, weight, bias, eps, center, residual=None):
    """``(y, x2, mean, rstd)``: y like x; x2 = ``rows_of(x)``; mean (None unless ``center``) and
    rstd (N,) float32. weight and bias are (D,) or None (a strided one is copied, D elements).
    With a ``residual`` (x's shape, any strides) the norm is of h = x + residual, written (N, D)
    contiguous in the same pass and returned in x2's place."""
    x2 = rows_of(x)
    n, d = x2.shape
    r2 = None if residual is None else rows_of(residual)
    h = None if residual is None else torch.empty(n, d, dtype=x.dtype, device=x.device)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    mean = torch.empty(n, dtype=torch.float32, device=x.device) if center else None
    rstd = torch.empty(n, dtype=torch.float32, device=x.device)
    if n:
        r_strides = (0, 0) if r2 is None else r2.stride()
        launch(norm_forward_kernel, (n,), x2, r2, h, _dense(weight), _dense(bias), y, mean, rstd, d, x2.stride(0),
               x2.stride(1), *r_strides, eps, CENTER=center,
               **_block(d, ON_CHIP_FORWARD, FORWARD_THREAD_ELEMENTS))
    return y, (x2 if h is None else h), mean, rstd


def _backward_options(n: int, d: int, itemsize: int, center: bool) -> dict:
    """The backward's launch options: rows that fit ``ON_CHIP_BACKWARD`` in tiles of about
    ``BACKWARD_TILE`` elements (BLOCK_M rows, at most the next power of two of n), longer ones
    chunked, one row at a time. layer_norm with the prefetch at D <= 1024 takes tiles of
    ``CENTER_PREFETCH_TILE``: its 8-warp programs (next tile, two column sums) do not fit two to an SM.
    16-bit rows of at most ``SHORT_ROW`` columns take ``SHORT_ROW_THREAD_ELEMENTS`` a thread, half the
    warps (H200, bf16 131072 x 1024, graphed: rms_norm 1.05x, layer_norm 1.20x 16 a thread)."""
    options = _block(d, ON_CHIP_BACKWARD)
    if not options["ONE_BLOCK"]:
        return {**options, "BLOCK_M": 1, "PREFETCH": False}
    prefetch = itemsize <= PREFETCH_ITEMSIZE
    tile = CENTER_PREFETCH_TILE if center and prefetch and options["BLOCK_D"] <= 1024 else BACKWARD_TILE
    block_m = min(max(tile // options["BLOCK_D"], 1), next_power_of_2(max(n, 1)))
    per_thread = SHORT_ROW_THREAD_ELEMENTS if itemsize <= SHORT_ROW_ITEMSIZE and options["BLOCK_D"] <= SHORT_ROW else \
        BACKWARD_THREAD_ELEMENTS
    warps = min(max(block_m * options["BLOCK_D"] // (32 * per_thread), 1), 16)
    return {**options, "BLOCK_M": block_m, "PREFETCH": prefetch, "num_warps": warps}


def norm_backward(dout, x2, weight, mean, rstd, needs, dresidual=None):
    """``(dx, dweight, dbias)`` (None where ``needs`` says no); dout is contiguous, shaped like x;
    x2 (N, D) and mean (None for rms_norm), rstd come from ``norm_forward``. ``dresidual`` (contiguous,
    dout's shape, or None), h's own gradient in the fused add + norms, is added to dx before it is rounded."""
    n, d = x2.shape
    device = x2.device
    block, warps = SPLIT_LAUNCH[x2.element_size(), mean is not None]
    parts = split(d, ON_CHIP_BACKWARD, block, device)
    if parts is not None and n:
        return _split_backward(dout, x2, weight, mean, rstd, needs, dresidual, parts, block, warps)
    options = _backward_options(n, d, x2.element_size(), mean is not None)
    sms = sm_count(device)  # 4 in the interpreter: several programs, the CPU tests cover the column sums
    tiles = cdiv(n, options["BLOCK_M"])
    per_sm = max(1, WARPS_PER_SM // options["num_warps"])
    rows_per_program = options["BLOCK_M"] * max(1, cdiv(tiles, per_sm * sms))
    programs = max(1, cdiv(n, rows_per_program))  # one (with no rows) when n == 0: zero sums
    dx = torch.empty(dout.shape, dtype=x2.dtype, device=device) if needs[0] else None
    partials, dw, db = _host.weight_partials(needs, programs, d, device)  # one buffer, one column-sum launch
    totals = None  # long rows with dx and a column sum: dx is written in the column sweep, from these row sums
    if not options["ONE_BLOCK"] and needs[0] and partials is not None:
        totals = torch.empty(n, 2, dtype=torch.float32, device=device)
    launch(norm_backward_kernel, (programs,), dout, x2, _dense(weight), mean, rstd, dx, dresidual, dw, db, totals, n, d,
           x2.stride(0), x2.stride(1), rows_per_program,
           CENTER=mean is not None, STAGES=BACKWARD_STAGES, LONG_STAGES=LONG_ROW_STAGES,
           **options)
    return _host.norm_gradients(dx, partials, needs, x2.dtype, launch=_column_sum_launch)


def _split_backward(dout, x2, weight, mean, rstd, needs, dresidual, parts: int, block: int, warps: int):
    """``norm_backward`` for rows split over ``parts`` programs of ``block`` columns (``_split``):
    about ``SPLIT_PROGRAMS_PER_SM`` programs an SM, each group's column sums a row of the partials."""
    n, d = x2.shape
    device = x2.device
    rows = rows_per_program(n, parts, device, SPLIT_PROGRAMS_PER_SM)
    groups = cdiv(n, rows)
    dx = torch.empty(dout.shape, dtype=x2.dtype, device=device) if needs[0] else None
    partials, dw, db = _host.weight_partials(needs, groups, d, device)
    launch(norm_split_backward_kernel, (groups * parts,), dout, x2, _dense(weight), mean, rstd, dx, dresidual, dw, db,
           scratch(n, parts, device), n, d, x2.stride(0), x2.stride(1), parts, rows, CENTER=mean is not None,
           BLOCK_D=block, BLOCK_P=next_power_of_2(parts), num_warps=warps)
    return _host.norm_gradients(dx, partials, needs, x2.dtype, launch=_column_sum_launch)


def _column_sum_launch(partials, out0, out1):
    """out0 (and out1 when not None) (D,) <- the column sums of the (S, P, D) float32 ``partials``."""
    s, p, d = partials.shape
    block_p = min(next_power_of_2(p), SUM_MAX_BLOCK_P)
    block_d = max(SUM_TILE // block_p, 1)
    launch(column_sum_kernel, (cdiv(d, block_d), s), partials, out0, out1, p, d,
           BLOCK_P=block_p, BLOCK_D=block_d, num_warps=SUM_WARPS)


def _dense(t):
    return None if t is None else t.contiguous()
