"""The kernels of layer_norm and rms_norm (``CENTER`` false: the mean is 0 and not stored).

Rows are the last dimension of x (..., D), flattened to (N, D). Per row, in float32:

    mean = sum_j x_j / D,  rstd = 1 / sqrt(sum_j (x_j - mean)^2 / D + eps),  xhat = (x - mean) * rstd
    y = xhat * weight + bias
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat))  with g = dy * weight  (rms_norm: no mean(g))
    dweight = sum_rows dy * xhat,   dbias = sum_rows dy

Forward: one program per row. A row of up to ``ON_CHIP_FORWARD`` columns is loaded once and kept in
registers (exact two-pass statistics on chip). A longer row is swept in chunks of ``CHUNK_D``, once
for the statistics and once for y. The statistics sweep sums s = x - K and s^2 per lane, with K the
first chunk's mean: var = mean(s^2) - mean(s)^2. Shifting by K keeps that difference stable for
large offsets (plain mean(x^2) - mean^2 loses every digit when mean^2 >> var), since
(mean - K)^2 <= var * D / CHUNK_D: at most log2(D / CHUNK_D) bits of the variance are lost.

Backward: ``P`` programs, each owning a block of consecutive rows. It writes dx row by row and sums
its rows' dy * xhat and dy per column into float32 partials (P, D); a second kernel adds the P
partials of each column: a deterministic two-stage reduction, no atomics. A row of up to
``ON_CHIP_BACKWARD`` columns stays in registers, with the column sums beside it. A longer row is
swept twice per row for dx (row sums, then dx), and the column sums are taken chunk by chunk over
the program's rows: x and dy are then read three times instead of once.

FLOPs ~ 7ND forward, 13ND backward (rms_norm: 4ND, 9ND). Bytes (itemsize s): forward 2NDs (+ 8N
for mean, rstd), backward 3NDs + 2 * 4PD per parameter gradient (the partials): memory-bound.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import block_indices

ON_CHIP_FORWARD = 16384  # the longest row the forward holds in registers (32 per thread at 16 warps)
ON_CHIP_BACKWARD = 8192  # the backward holds x, dy, g and two column sums: 16 per thread at 16 warps
CHUNK_D = 4096  # the block of columns of a longer row, swept in a loop
PROGRAMS_PER_SM = 4  # backward: programs per streaming multiprocessor (1 SM under the interpreter)
SUM_BLOCK_P, SUM_BLOCK_D = 32, 128  # tile of the partial-sum reduction


def _block(d: int, on_chip: int) -> dict:
    """Launch options for rows of ``d`` columns: the whole row as one block when it fits ``on_chip``,
    else ``CHUNK_D`` columns at a time; about 8 elements per thread (1 to 16 warps)."""
    block = triton.next_power_of_2(max(d, 16))
    one_block = block <= on_chip
    block = block if one_block else CHUNK_D
    return {"BLOCK_D": block, "ONE_BLOCK": one_block, "num_warps": min(max(block // 256, 1), 16)}


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
def norm_forward_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, D, stride_row, stride_col, eps,
                        CENTER: tl.constexpr, BLOCK_D: tl.constexpr, ONE_BLOCK: tl.constexpr):
    # x: (N, D) with strides (stride_row, stride_col); w, b: (D,) contiguous or None;
    # y: (N, D) contiguous; mean (CENTER only), rstd: (N,) float32. One program per row.
    row = tl.program_id(0).to(tl.int64)
    x_row, y_row = x_ptr + row * stride_row, y_ptr + row * D
    cols = tl.arange(0, BLOCK_D).to(tl.int64)  # (BLOCK_D,)
    mean = 0.0
    if ONE_BLOCK:  # the whole row in registers: read once, write once
        mask = cols < D
        x = tl.load(x_row + cols * stride_col, mask=mask, other=0.0).to(tl.float32)
        if CENTER:
            mean = tl.sum(x, axis=0) / D
        xc = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / D + eps)
        _affine_store(xc * rstd, cols, mask, w_ptr, b_ptr, y_row)
    else:  # sweep 1: shifted sums of x - shift and its square (shift: the first block's mean); sweep 2: y
        shift = 0.0
        if CENTER:  # D > BLOCK_D here: the first block is full
            shift = tl.sum(tl.load(x_row + cols * stride_col).to(tl.float32), axis=0) / BLOCK_D
        sum1 = tl.zeros([BLOCK_D], dtype=tl.float32)
        sum2 = tl.zeros([BLOCK_D], dtype=tl.float32)
        for start in range(0, D, BLOCK_D):
            mask = start + cols < D
            x = tl.load(x_row + (start + cols) * stride_col, mask=mask, other=0.0).to(tl.float32)
            xs = tl.where(mask, x - shift, 0.0)
            sum1 += xs
            sum2 += xs * xs
        var = tl.sum(sum2, axis=0) / D  # rms_norm: mean(x^2)
        if CENTER:
            delta = tl.sum(sum1, axis=0) / D  # mean - shift
            mean = shift + delta
            var = tl.maximum(var - delta * delta, 0.0)
        rstd = 1.0 / tl.sqrt(var + eps)
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
def norm_backward_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr,
                         N, D, stride_row, stride_col, rows_per_program,
                         CENTER: tl.constexpr, BLOCK_D: tl.constexpr, ONE_BLOCK: tl.constexpr):
    # dy, dx: (N, D) contiguous, dx None when not needed; x: (N, D) strided; w: (D,) or None;
    # mean (CENTER only), rstd: (N,) float32; dw, db: (P, D) float32 partial sums or None.
    pid = tl.program_id(0).to(tl.int64)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, N)
    cols = tl.arange(0, BLOCK_D).to(tl.int64)  # (BLOCK_D,)
    mean = 0.0
    if ONE_BLOCK:  # rows in registers; the partial sums too, stored once at the end
        mask = cols < D
        acc_w = tl.zeros([BLOCK_D], dtype=tl.float32)
        acc_b = tl.zeros([BLOCK_D], dtype=tl.float32)
        for row in range(first, last):
            if CENTER:
                mean = tl.load(mean_ptr + row)
            rstd = tl.load(rstd_ptr + row)
            xhat, dy, g = _load_grad_terms(x_ptr + row * stride_row, dy_ptr + row * D, w_ptr, cols, mask,
                                           stride_col, mean, rstd)
            if dx_ptr is not None:
                dxhat = g - xhat * (tl.sum(g * xhat, axis=0) / D)
                if CENTER:
                    dxhat -= tl.sum(g, axis=0) / D
                tl.store(dx_ptr + row * D + cols, (rstd * dxhat).to(dx_ptr.dtype.element_ty), mask=mask)
            acc_w += dy * xhat
            acc_b += dy
        if dw_ptr is not None:
            tl.store(dw_ptr + pid * D + cols, acc_w, mask=mask)
        if db_ptr is not None:
            tl.store(db_ptr + pid * D + cols, acc_b, mask=mask)
    else:  # rows longer than a block: dx row by row, then the partial sums block of columns by block
        if dx_ptr is not None:
            for row in range(first, last):
                if CENTER:
                    mean = tl.load(mean_ptr + row)
                rstd = tl.load(rstd_ptr + row)
                x_row, dy_row = x_ptr + row * stride_row, dy_ptr + row * D
                sum_gx, sum_g = 0.0, 0.0  # sweep 1: the row sums dx needs
                for start in range(0, D, BLOCK_D):
                    mask = start + cols < D
                    xhat, dy, g = _load_grad_terms(x_row, dy_row, w_ptr, start + cols, mask, stride_col, mean, rstd)
                    sum_gx += tl.sum(g * xhat, axis=0)
                    sum_g += tl.sum(g, axis=0)
                for start in range(0, D, BLOCK_D):  # sweep 2: dx
                    mask = start + cols < D
                    xhat, dy, g = _load_grad_terms(x_row, dy_row, w_ptr, start + cols, mask, stride_col, mean, rstd)
                    dxhat = g - xhat * (sum_gx / D)
                    if CENTER:
                        dxhat -= sum_g / D
                    tl.store(dx_ptr + row * D + start + cols, (rstd * dxhat).to(dx_ptr.dtype.element_ty), mask=mask)
        if (dw_ptr is not None) or (db_ptr is not None):
            for start in range(0, D, BLOCK_D):
                mask = start + cols < D
                acc_w = tl.zeros([BLOCK_D], dtype=tl.float32)
                acc_b = tl.zeros([BLOCK_D], dtype=tl.float32)
                for row in range(first, last):
                    if CENTER:
                        mean = tl.load(mean_ptr + row)
                    rstd = tl.load(rstd_ptr + row)
                    xhat, dy, g = _load_grad_terms(x_ptr + row * stride_row, dy_ptr + row * D, None, start + cols,
                                                   mask, stride_col, mean, rstd)
                    acc_w += dy * xhat
                    acc_b += dy
                if dw_ptr is not None:
                    tl.store(dw_ptr + pid * D + start + cols, acc_w, mask=mask)
                if db_ptr is not None:
                    tl.store(db_ptr + pid * D + start + cols, acc_b, mask=mask)


@triton.jit
def column_sum_kernel(partials_ptr, out_ptr, P, D, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr):
    # partials: (P, D) float32; out: (D,) in the parameter's dtype. One program per BLOCK_D columns.
    cols = block_indices(BLOCK_D)  # (BLOCK_D,) int64
    acc = tl.zeros([BLOCK_P, BLOCK_D], dtype=tl.float32)
    for start in range(0, P, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P).to(tl.int64)  # (BLOCK_P,)
        mask = (rows < P)[:, None] & (cols < D)[None, :]
        acc += tl.load(partials_ptr + rows[:, None] * D + cols[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=cols < D)


def rows_of(x: torch.Tensor) -> torch.Tensor:
    """x (..., D) as (N, D): a view when the leading dims merge (any strides, e.g. a transposed
    x), else a copy (the one documented copy; the kernels take both strides)."""
    return x.reshape(-1, x.shape[-1])


def norm_forward(x, weight, bias, eps, center):
    """``(y, x2, mean, rstd)``: y like x; x2 = ``rows_of(x)``; mean (None unless ``center``) and
    rstd (N,) float32. weight and bias are (D,) or None (a strided one is copied, D elements)."""
    x2 = rows_of(x)
    n, d = x2.shape
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    mean = torch.empty(n, dtype=torch.float32, device=x.device) if center else None
    rstd = torch.empty(n, dtype=torch.float32, device=x.device)
    if n:
        norm_forward_kernel[(n,)](x2, _dense(weight), _dense(bias), y, mean, rstd, d, x2.stride(0), x2.stride(1),
                                  eps, CENTER=center, **_block(d, ON_CHIP_FORWARD))
    return y, x2, mean, rstd


def norm_backward(dout, x2, weight, mean, rstd, needs):
    """``(dx, dweight, dbias)`` (None where ``needs`` says no); dout is contiguous, shaped like x;
    x2 (N, D) and mean (None for rms_norm), rstd come from ``norm_forward``."""
    n, d = x2.shape
    device = x2.device
    sms = torch.cuda.get_device_properties(device).multi_processor_count if x2.is_cuda else 1
    rows_per_program = max(1, triton.cdiv(n, PROGRAMS_PER_SM * sms))
    programs = max(1, triton.cdiv(n, rows_per_program))  # one (with no rows) when n == 0: zero sums
    dx = torch.empty(dout.shape, dtype=x2.dtype, device=device) if needs[0] else None
    dw = torch.empty(programs, d, dtype=torch.float32, device=device) if needs[1] else None
    db = torch.empty(programs, d, dtype=torch.float32, device=device) if needs[2] else None
    norm_backward_kernel[(programs,)](dout, x2, _dense(weight), mean, rstd, dx, dw, db, n, d,
                                      x2.stride(0), x2.stride(1), rows_per_program,
                                      CENTER=mean is not None, **_block(d, ON_CHIP_BACKWARD))
    return dx, _column_sum(dw, x2.dtype), _column_sum(db, x2.dtype)


def _column_sum(partials, dtype):
    if partials is None:
        return None
    p, d = partials.shape
    out = torch.empty(d, dtype=dtype, device=partials.device)
    if d:
        column_sum_kernel[(triton.cdiv(d, SUM_BLOCK_D),)](partials, out, p, d, BLOCK_P=SUM_BLOCK_P, BLOCK_D=SUM_BLOCK_D)
    return out


def _dense(t):
    return None if t is None else t.contiguous()
