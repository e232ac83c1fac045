"""cross_entropy of logits (N, V) and class indices target (N,):

    lse_i  = log sum_j exp(x_ij)                  (float32, with the row max subtracted first)
    loss_i = lse_i - x_i,target_i                  0 where target_i == ignore_index
    out    = sum_i loss_i / n_valid  (mean)  |  sum_i loss_i  (sum)  |  loss  (none)

n_valid counts the rows whose target is not ignore_index (mean over none of them is 0/0 = NaN,
as in torch). A target outside [0, V) that is not ignore_index is an error: on the host for CPU
tensors (``_check.index_range``, an IndexError naming it), on a GPU a ``tl.device_assert`` in the
forward kernel, compiled in by launching that one kernel with ``debug=True`` (and
``sanitize_overflow=False``, so debug mode adds no other checks): one compare per row. Such a
target is never read: were the assert off, its row's lse and loss would be NaN.

Non-finite logits (the python reference's rule): exponentials are taken relative to the row max
where it is finite, else relative to 0, so a +inf logit makes s and lse +inf and the loss +inf
against a finite target logit (NaN for a +inf target logit, a row of -inf, or a NaN).

Backward, with g_i = dout / n_valid (mean), dout (sum), dout_i (none), and 0 on ignored rows:

    dx_ij = (exp(x_ij - lse_i) - [j == target_i]) * g_i       (softmax minus one-hot)

FLOPs: ~4NV forward (max, exp, sum), ~4NV backward. Bytes: forward reads the logits once
(NV * itemsize) and writes 2N float32; backward reads them again and writes dlogits (2NV *
itemsize); ignored rows read nothing in the backward. Memory bound. No second (N, V) tensor is
ever made: the forward keeps only each row's lse (cached) and loss.

Forward (``cross_entropy_kernel``). A row of up to ``ONE_PASS_V`` logits is read once into
registers, ``BLOCK_M`` rows per program (about ``TILE`` elements, so that short rows still move
several KB per program): the row max, then sum_j exp(x_j - max). The target logit is one load from
the row just read (a cache hit), masked off for an ignored or out-of-range target: nothing outside
the row is read. With ``EARLY_LOAD`` the logits load is issued beside the target's instead of
after it: one memory latency less per program, at the price of reading the logits of ignored rows.
A longer row is swept ``CHUNK`` columns at a time with an online logsumexp: one block max per
chunk, the sum of exp(x - running max) kept per lane (rescaled by exp(old max - new max) when the
max grows) and reduced once at the end; with ``PREFETCH`` the next chunk is loaded before the
current one is reduced. That sweep reads nothing of an ignored or out-of-range row. The mean and
sum take two more launches, deterministic (no atomics) and on the device (no host sync): partial
sums and valid counts per ``SUM_BLOCK`` rows, then one program adds them in a fixed order (a
single program over all rows took ~10 us at N = 32768, 7% of the bfloat16 forward).

Per element the forward costs about 12 instructions for 16-bit logits (unpack, max, subtract,
scale, ex2, add; ptxas for sm_90): exponentials are tl.math.exp2 of (x - m) log2 e, the ex2
instruction alone, where tl.exp adds a range check and two multiplies; column indices are int32
(a row is < 2^31 long) and no element is compared with the target. Picking the target from the
registers (an int64 compare, a select and a second sum per element) with tl.exp costs ~27: at 2
bytes per element that, not the memory, sets the time (0.47 of copy bandwidth for bfloat16 at
32768 x 8192 on an H200, against 0.87 for this kernel).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import _host
from ._launch import CHECKED, block_indices, cdiv, launch, next_power_of_2
from ._softmax import CHUNK

LOG2E = tl.constexpr(math.log2(math.e))  # exp(x) = exp2(x log2 e)
ONE_PASS_V = 16384  # the longest row the forward reads once into registers (64 per thread at 8 warps)
TILE = 2048  # forward: logits per program when rows are short (several rows per program, as softmax)
THREAD_ELEMENTS = 64  # forward: logits per thread (num_warps = tile / (32 * this), 1 to 16)
EARLY_LOAD = True  # forward, one pass: load the logits without waiting for the target
PREFETCH = True  # forward, longer rows: load the next chunk before reducing the current one
SUM_BLOCK, SUM_WARPS = 2048, 4  # mean / sum: rows per program of the partial sums, and its warps
FINISH_BLOCK, FINISH_WARPS = 1024, 4  # ... partials per step of the one program that adds them


@triton.jit
def _chunked_logsumexp(x_rows, stride_xv, V, n_read, PREFETCH: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_V: tl.constexpr):
    """``(m, s)`` of the rows at ``x_rows`` (BLOCK_M, 1), each over its first ``n_read`` (BLOCK_M, 1)
    columns (0: read nothing), BLOCK_V columns at a time: the row max ``m = max_j x_j`` and
    ``s = sum_j exp(x_j - m)``, (BLOCK_M,) float32. A row of -inf gives ``m = -inf, s = 0``; a row
    with a +inf ``m = +inf, s = +inf`` (sums relative to 0 from that chunk on; NaN logits still NaN)."""
    cols = tl.arange(0, BLOCK_V).to(tl.int64)[None, :]  # (1, BLOCK_V)
    m = tl.full([BLOCK_M], -float("inf"), tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_V], dtype=tl.float32)  # per lane: sum of exp(x - m)
    if PREFETCH:
        x_next = tl.load(x_rows + cols * stride_xv, mask=cols < n_read, other=-float("inf"))
    for start in range(0, V, BLOCK_V):
        if PREFETCH:  # this chunk was loaded during the previous step; start loading the next one
            x = x_next.to(tl.float32)
            ahead = start + BLOCK_V + cols
            x_next = tl.load(x_rows + ahead * stride_xv, mask=ahead < n_read, other=-float("inf"))
        else:
            x = tl.load(x_rows + (start + cols) * stride_xv, mask=start + cols < n_read,
                        other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=1))  # (BLOCK_M,)
        pinf = m_new == float("inf")
        ref = tl.where((m_new == -float("inf")) | pinf, 0.0, m_new)  # only -inf so far, or a +inf: no inf - inf
        # the old sums' factor: exp(m - ref); once a +inf is met the sums are relative to 0 and the
        # finite ones before it drop out (x 0; a NaN stays NaN)
        scale = tl.where(pinf, tl.where(m == float("inf"), 1.0, 0.0), tl.math.exp2((m - ref) * LOG2E))
        acc = acc * scale[:, None] + tl.math.exp2((x - ref[:, None]) * LOG2E)
        m = m_new
    return m, tl.sum(acc, axis=1)


@triton.jit
def _tile_logsumexp(x):
    """``(m, s)`` of a (BLOCK_M, BLOCK_V) float32 tile of whole rows (-inf past the row's end): the
    row max m and ``s = sum_j exp(x_j - m)``, as exp2((x_j - m) log2 e): the ex2 instruction alone
    (tl.exp adds a range check and two multiplies per element). x_j - m is exact where it matters
    (x_j near m), so it is taken before scaling: folding the scale into one fused multiply-add,
    x_j log2 e - m log2 e, would round m log2 e, an error of ~5e-4 in lse at |x| ~ 1e4."""
    m = tl.max(x, axis=1)
    ref = tl.where((m == -float("inf")) | (m == float("inf")), 0.0, m)  # no inf - inf: -inf rows s = 0, +inf s = inf
    return m, tl.sum(tl.math.exp2((x - ref[:, None]) * LOG2E), axis=1)


@triton.jit
def _store_losses(m, s, x_t, read, valid, rows, row_ok, lse_ptr, loss_ptr):
    """lse = m + log s and loss = lse - x_t of the rows that have one (``read``); 0 for an ignored
    row and NaN for an out-of-range target."""
    log_s = tl.log(tl.where(read, s, 1.0))
    skipped = tl.where(valid, float("nan"), 0.0)
    tl.store(lse_ptr + rows, tl.where(read, m + log_s, skipped), mask=row_ok)
    # lse - x_t, without rounding lse first (at |x| ~ 1e4 its float32 ulp is 1e-3)
    loss = tl.where(read, (m - x_t) + log_s, skipped)
    tl.store(loss_ptr + rows, loss.to(loss_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def cross_entropy_kernel(x_ptr, target_ptr, lse_ptr, loss_ptr, N, V, stride_xn, stride_xv, stride_t, ignore_index,
                         ONE_PASS: tl.constexpr, EARLY_LOAD: tl.constexpr, PREFETCH: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr):
    # x: (N, V); target: (N,) int32/int64; lse: (N,) float32; loss: (N,), float32 or x's dtype.
    # One program per BLOCK_M rows (BLOCK_M = 1 for the chunked sweep).
    rows = block_indices(BLOCK_M)  # (BLOCK_M,) int64
    row_ok = rows < N
    t = tl.load(target_ptr + rows * stride_t, mask=row_ok, other=ignore_index).to(tl.int64)
    valid = t != ignore_index
    read = valid & (t >= 0) & (t < V)  # the rows with a loss: an ignored row gets 0, an out-of-range target NaN
    tl.device_assert(read | ~valid, "cross_entropy: a target is outside [0, V) and not ignore_index")
    x_rows = x_ptr + rows[:, None] * stride_xn  # (BLOCK_M, 1)
    x_t = tl.load(x_ptr + rows * stride_xn + t * stride_xv, mask=read, other=0.0).to(tl.float32)
    if ONE_PASS:  # V <= BLOCK_V: one read, the tile stays in registers
        cols = tl.arange(0, BLOCK_V)[None, :]  # (1, BLOCK_V), int32: V < 2^31
        mask = row_ok[:, None] & (cols < V)
        if not EARLY_LOAD:
            mask = mask & read[:, None]
        x = tl.load(x_rows + cols.to(tl.int64) * stride_xv, mask=mask, other=-float("inf"))  # (BLOCK_M, BLOCK_V)
        m, s = _tile_logsumexp(x.to(tl.float32))
    else:
        m, s = _chunked_logsumexp(x_rows, stride_xv, V, tl.where(read, V, 0)[:, None], PREFETCH, BLOCK_M, BLOCK_V)
    _store_losses(m, s, x_t, read, valid, rows, row_ok, lse_ptr, loss_ptr)


@triton.jit
def valid_partials_kernel(loss_ptr, target_ptr, partials_ptr, N, stride_t, ignore_index, BLOCK: tl.constexpr):
    # loss: (N,) float32 or None; target: (N,); partials: (2, P) float32, P programs.
    # Program p, rows [p BLOCK, (p + 1) BLOCK): partials[0, p] = their loss sum, partials[1, p] = how
    # many are valid (<= BLOCK: exact in float32).
    i = block_indices(BLOCK)
    valid = (i < N) & (tl.load(target_ptr + i * stride_t, mask=i < N, other=ignore_index) != ignore_index)
    P = tl.num_programs(0)
    tl.store(partials_ptr + P + tl.program_id(0), tl.sum(valid.to(tl.float32), axis=0))
    if loss_ptr is not None:
        tl.store(partials_ptr + tl.program_id(0), tl.sum(tl.load(loss_ptr + i, mask=i < N, other=0.0), axis=0))


@triton.jit
def valid_sum_kernel(partials_ptr, out_ptr, P, LOSSES: tl.constexpr, MEAN: tl.constexpr, BLOCK: tl.constexpr):
    # partials: (2, P) float32 from valid_partials_kernel; out: 0-d. One program adds them in a fixed
    # order: out = sum of the losses, divided by n_valid when MEAN; without LOSSES out = n_valid.
    total = tl.zeros([BLOCK], dtype=tl.float32)
    count = tl.zeros([BLOCK], dtype=tl.int32)  # int32: exact for any N
    for start in range(0, P, BLOCK):
        j = start + tl.arange(0, BLOCK)
        count += tl.load(partials_ptr + P + j, mask=j < P, other=0.0).to(tl.int32)
        if LOSSES:
            total += tl.load(partials_ptr + j, mask=j < P, other=0.0)
    n_valid = tl.sum(count, axis=0).to(tl.float32)
    if not LOSSES:
        out = n_valid
    elif MEAN:
        out = tl.sum(total, axis=0) / n_valid
    else:
        out = tl.sum(total, axis=0)
    tl.store(out_ptr, out.to(out_ptr.dtype.element_ty))


@triton.jit
def cross_entropy_backward_kernel(x_ptr, target_ptr, lse_ptr, dout_ptr, n_valid_ptr, dx_ptr, V,
                                  stride_xn, stride_xv, stride_t, stride_dout, stride_dxn, stride_dxv, ignore_index,
                                  BLOCK_V: tl.constexpr):
    # x, dx: (N, V); target: (N,); lse: (N,) float32; dout: 0-d (stride_dout 0) or (N,);
    # n_valid: 0-d float32 for the mean, else None. One program per row i.
    i = tl.program_id(0).to(tl.int64)
    t = tl.load(target_ptr + i * stride_t).to(tl.int64)
    valid = t != ignore_index
    g = tl.load(dout_ptr + i * stride_dout).to(tl.float32)
    if n_valid_ptr is not None:
        g = g / tl.load(n_valid_ptr)
    lse = tl.load(lse_ptr + i)
    n_read = tl.where(valid, V, 0)  # an ignored row writes zeros without reading its logits
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V).to(tl.int64)  # (BLOCK_V,)
        x = tl.load(x_ptr + i * stride_xn + cols * stride_xv, mask=cols < n_read, other=0.0).to(tl.float32)
        dx = tl.where(valid, (tl.math.exp2((x - lse) * LOG2E) - (cols == t).to(tl.float32)) * g, 0.0)
        tl.store(dx_ptr + i * stride_dxn + cols * stride_dxv, dx.to(dx_ptr.dtype.element_ty), mask=cols < V)


def _forward_options(N, V):
    """The forward's launch options: rows of up to ``ONE_PASS_V`` logits in one pass, ``TILE`` logits
    per program (BLOCK_M rows, at most the next power of two of N); longer rows in ``CHUNK``-column
    steps. Measured on an H200 (32768 rows): one pass ran 3%
    (float32) and 48% (bfloat16) faster than chunked at V = 8192, 5% (bfloat16) at V = 16384."""
    if V > ONE_PASS_V:
        block_v = _block_v(V)
        return {"ONE_PASS": False, "BLOCK_M": 1, "BLOCK_V": block_v, "num_warps": _warps(block_v)}
    block_v = next_power_of_2(V)
    block_m = min(max(TILE // block_v, 1), next_power_of_2(N))
    warps = min(max(block_m * block_v // (32 * THREAD_ELEMENTS), 1), 16)
    return {"ONE_PASS": True, "BLOCK_M": block_m, "BLOCK_V": block_v, "num_warps": warps}


def _block_v(V):
    return min(next_power_of_2(max(V, 1)), CHUNK)


def _warps(block):
    return min(8, max(1, block // 512))


def _valid_sum(loss, target, ignore_index, reduction, out):
    """``out`` (0-d) = the mean or sum (``reduction``) of ``loss`` over the rows whose target is not
    ignore_index, or (reduction "count", loss None) their count: per-block partials in one launch,
    then their fixed-order sum."""
    N = target.shape[0]
    programs = max(1, cdiv(N, SUM_BLOCK))
    partials = torch.empty(2, programs, dtype=torch.float32, device=target.device)
    launch(valid_partials_kernel, (programs,), loss, target, partials, N, target.stride(0), ignore_index,
           BLOCK=SUM_BLOCK, num_warps=SUM_WARPS)
    launch(valid_sum_kernel, (1,), partials, out, programs, LOSSES=loss is not None, MEAN=reduction == "mean",
           BLOCK=FINISH_BLOCK, num_warps=FINISH_WARPS)
    return out


def _forward(logits, target, lse, loss, ignore_index):
    N, V = logits.shape
    options = _forward_options(N, V)
    launch(cross_entropy_kernel, (cdiv(N, options["BLOCK_M"]),),
           logits, target, lse, loss, N, V, *logits.stride(), target.stride(0), ignore_index,
           EARLY_LOAD=EARLY_LOAD, PREFETCH=PREFETCH, **options, **CHECKED)


def _backward(logits, target, lse, dout, n_valid, dlogits, ignore_index, dout_stride):
    N, V = logits.shape
    BLOCK_V = _block_v(V)
    launch(cross_entropy_backward_kernel, (N,), logits, target, lse, dout, n_valid, dlogits, V, *logits.stride(),
           target.stride(0), dout_stride, *dlogits.stride(), ignore_index,
           BLOCK_V=BLOCK_V, num_warps=_warps(BLOCK_V))


cross_entropy, cross_entropy_backward = _host.cross_entropy_ops(forward=_forward, backward=_backward,
                                                                  valid_sum=_valid_sum)
