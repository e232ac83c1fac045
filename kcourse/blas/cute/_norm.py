"""The CuTe kernels of layer_norm and rms_norm (``center`` false: the mean is 0 and not stored).

Rows are the last dimension of x (..., D), flattened to (N, D). Per row, in float32:

    mean = sum_j x_j / D,  rstd = 1 / sqrt(sum_j (x_j - mean)^2 / D + eps),  xhat = (x - mean) * rstd
    y = xhat * weight + bias
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat))  with g = dy * weight  (rms_norm: no mean(g))
    dweight = sum_rows dy * xhat,   dbias = sum_rows dy

FLOPs ~ 7ND forward, 13ND backward (rms_norm: 4ND, 9ND). Bytes (itemsize s): forward 2NDs (+ 8N
for mean, rstd), backward 3NDs + 2 * 4PD per parameter gradient (the partials): memory bound.

Threads over rows are ``_rows.plan``'s (a CTA of 256 threads -- 512 for most backwards, and for a
forward row that exactly fills a CTA (``_rows.spread_row``) -- holds threads / TPR rows of TPR
threads; a row is read with 128-bit accesses where the layout allows, row sums by warp shuffles then
shared memory, ``_rows.row_allreduce``). x is addressed through its own row and column strides (a
transposed or strided x is read in place); y, dx, weight and bias are contiguous.

Forward (``norm_forward_kernel``, a CTA per threads / TPR rows)
    A row of up to ``MAX_ONE_PASS`` (16384) columns is loaded once and kept in registers: exact
    two-pass statistics on chip (the sum, then the sum of (x - mean)^2 over the same registers), then
    y. A longer row is spread over a cluster of CTAs (``_rows.split_rows``), each keeping its share:
    in 16 bits up to 16384 elements over up to 16 CTAs, staged in shared memory by cp.async and read
    a vector at a time (``_rows.Plan.staged``), the parameters' share loading into registers
    meanwhile; in float32 in registers, up to 16384 over up to 8 CTAs (32768 by CTAs of 512
    threads; layer_norm 8192 a CTA from 8192 to 131072 columns: ``F32_SHARE``). Each warp takes its
    exact two-pass statistics (count, mean, M2 = sum of squared deviations; rms_norm: the sum of squares
    alone), the cluster's warps combine them in a fixed order (Chan et al.'s pairwise formula,
    ``_combine_moments``, written symmetric; rms_norm a plain sum) through distributed shared memory
    (``_rows.cluster_allreduce``), and each CTA writes its share of y; the first writes mean and
    rstd. The row is read once.
    A row whose shares still exceed that (over 262144 columns) is swept
    in chunks by one CTA: the first chunk's mean K is computed first, then per thread
    the sums of s = x - K and s^2 (var = mean(s^2) - mean(s)^2, stable for large offsets since
    (mean - K)^2 <= var * D / CHUNK), then y in a second sweep.

Backward (``norm_backward_kernel``, P CTAs: one of 512 threads or two of 256 an SM, ``backward_launch``)
    CTA b takes the row blocks b, b + P, ... (a grid-stride loop). For rows of up to
    ``ON_CHIP_BACKWARD`` (8192) columns, each row's x and dy are loaded once: the row sums of
    g * xhat and g (one joint reduction) give dx, and each thread adds dy * xhat and dy for its
    columns into its own slice of two float32 accumulators in shared memory (no other thread touches
    it: no races, and the registers stay free for x and dy; a warp sync per row keeps the compiler
    from promoting them to registers). Weight is re-read per row (an L1 hit). The row reduction's
    shared-memory buffer alternates between two stages from row to row, so that a fast warp never
    overwrites values a slow one still reads. With ``prefetch`` each thread copies its slice of the
    next row's x and dy into shared memory (cp.async) as soon as this row's are in registers, and
    waits for that copy (its own: no barrier) at the top of the next row: the loads of one row fly
    while the CTA reduces and stores the one before. At the end the CTA adds its row slots'
    accumulators column by column, in order, and writes one row of float32 partials (P, D). A row of
    up to 16 x ``ON_CHIP_BACKWARD`` columns (vector accesses, sm_90, dx asked for) is spread over a
    cluster of CTAs, CTA ``rank`` taking chunk ``rank`` of the cluster's rows as above (one row a
    CTA, no prefetch); the row sums meet through ``_rows.cluster_allreduce``, row after row in two
    stages, and each cluster writes one row of partials (P = clusters). A longer
    row is swept in chunks, twice: first row by row for its row sums (kept in a (N, 2) float32 scratch,
    rms_norm (N, 1), one thread a row), then chunk by chunk over the CTA's rows, where each chunk of dx is written
    beside that chunk's column sums, which stay in registers (x and dy read twice and dx written once:
    5ND elements moved where the minimum is 3ND; triton's backward reads x and dy three times: a dx
    sweep row by row, then the column sums). Without a
    column sum to take, dx is swept row by row; without dx, the column sums alone.
    ``column_sum_kernel`` adds the P partials of each column in a fixed order and rounds once to the
    parameter's dtype: a deterministic two-stage reduction, no atomics.

Keys: dtype, ``plan`` (vector width, threads per row, vectors per thread, one pass or chunks, unit
column strides, threads per CTA), which of weight, bias, dx, dweight, dbias exist (a missing one is
compiled out) and, for the backward, the prefetch;
N, D, eps and the strides are runtime arguments. N must stay below 2^31 rows (the row blocks are
32-bit), D below ``_rows.MAX_N``: a ``ValueError`` otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from .. import _host, tuning
from .._layout import rows_of
from . import _compile, _reduce
from .axpby import axpby
from ._reduce import WARP
from ._rows import (CLUSTER_MAX, CLUSTER_MAX_SM90, FORWARD_ROW_THREADS, MAX_ONE_PASS, THREADS, butterfly, check_sizes,
                    chunk_predicate, cluster_allreduce, cluster_buffer, cluster_rank, cluster_started,
                    clusters_supported, combine_sum, load_chunk, masked, plan, reduce_staged, reduction_buffer,
                    row_allreduce, row_arguments, row_cluster, row_copy, row_launch, row_thread, row_views,
                    split_rows, spread_row, stage_chunk, staging_buffer, store_chunk, store_staged, to_registers)

ON_CHIP_BACKWARD = 8192  # the longest row the backward keeps on chip (x and dy: 32 elements each per thread)
STREAM_FORWARD = 32  # elements per thread per chunk of a longer row: forward (x; weight, bias)
STREAM_BACKWARD = 16  # ... backward (x, dy, weight, and two column sums)
CTAS_PER_SM = 2  # backward grid for rows longer than ON_CHIP_BACKWARD (rows kept on chip: backward_launch)
SUM_UNROLL = 4  # column_sum_kernel: steps of its loop unrolled (each thread has that many loads in flight)


@dataclass(frozen=True)
class Launch:
    """The launch choices of the layer_norm and rms_norm kernels: each op's table
    (``kcourse.blas.tuning``: ``launch("layer_norm")``, ``override("rms_norm", ...)``). Every field
    reaches the compile key (through the ``Plan``'s threads, or the key's prefetch flag).

    - ``row_threads``: the forward's CTA for a row kept in registers that exactly fills 256 threads
      (``_rows.spread_row``); default ``FORWARD_ROW_THREADS`` (512), 256: not spread.
    - ``backward_threads``, ``backward_ctas_per_sm``, ``backward_prefetch``: the backward's launch for
      rows kept on chip (D <= ``ON_CHIP_BACKWARD``): threads per CTA, CTAs per SM in its grid, and
      whether each thread stages the next row in shared memory (cp.async; 16-bit rows only: 32-bit
      ones beside the accumulators do not fit). None (the default): ``backward_launch``'s choice for
      the call; a value fixes that one field. Longer rows take ``CTAS_PER_SM`` CTAs of 256 an SM, fewer
      (down to one an SM) where few rows a CTA would make the partials rival the data (``_backward_plan``).
    - ``backward_cluster``: the backward (with dx) of a row of ``ON_CHIP_BACKWARD`` < D <= 16 x
      ``ON_CHIP_BACKWARD`` columns (vector accesses, sm_90) over a cluster of CTAs, each keeping its
      chunk of x and dy in registers, the row sums exchanged through distributed shared memory. None
      (the default) or True: so; False: swept in chunks by one CTA a row, x and dy read twice.
    - ``cluster``: the forward's CTAs a row (``_rows.split_rows``'s ``cluster``: that many for any row
      of at least as many vectors, short rows included, where the shares fit in registers). None
      (the default): the rule in ``_forward_plan``.
    - ``staged``: the forward's rows longer than ``MAX_ONE_PASS`` (vector accesses, sm_90) over a
      cluster of up to 16 CTAs, each copying its share of up to ``MAX_ONE_PASS`` into shared memory
      (cp.async) and reading it from there, for the statistics and again for y (``_rows.split_rows``'s
      ``stage``). None (the default): the rule in ``_forward_plan`` (16-bit rows); a bool: always or never.
    """

    row_threads: int = FORWARD_ROW_THREADS
    backward_threads: int | None = None
    backward_ctas_per_sm: int | None = None
    backward_prefetch: bool | None = None
    backward_cluster: bool | None = None
    cluster: int | None = None
    staged: bool | None = None


LAUNCH = Launch()


# ----------------------------------------------------------------------------- device helpers

def _vector(pointer, d, vec: int) -> Optional[cute.Tensor]:
    """A contiguous (D,) parameter (weight or bias) as a tensor, None for a missing one."""
    if const_expr(pointer is None):
        return None
    return cute.make_tensor(pointer, cute.make_layout((cute.assume(d, divby=vec) if const_expr(vec > 1) else d,)))


def _fragment(tiled_copy, thr, mP: Optional[cute.Tensor], index, chunk: int, pred):
    """Chunk ``index`` of the parameter ``mP`` in registers, in its dtype (None for a missing one)."""
    if const_expr(mP is None):
        return None
    return load_chunk(tiled_copy, thr, mP, index, chunk, pred, 0.0)


def _slice(thr, mP: Optional[cute.Tensor], index, chunk: int):
    """This thread's slice of chunk ``index`` of the parameter ``mP`` in global memory (None for a missing one)."""
    return None if const_expr(mP is None) else thr.partition_S(cute.local_tile(mP, (chunk,), (index,)))


def _floats(fragment):
    """A parameter's ``_fragment`` as a float32 TensorSSA (None for a missing one)."""
    return None if const_expr(fragment is None) else fragment.load().to(Float32)


def _param(tiled_copy, thr, mP: Optional[cute.Tensor], index, chunk: int, pred):
    """Chunk ``index`` of the parameter ``mP`` as a float32 TensorSSA (None for a missing one)."""
    return _floats(_fragment(tiled_copy, thr, mP, index, chunk, pred))


def _affine(xhat, w, b):
    """``xhat * w + b`` (float32 TensorSSA; a missing w is 1, a missing b 0)."""
    y = xhat
    if const_expr(w is not None):
        y = y * w
    if const_expr(b is not None):
        y = y + b
    return y


# ----------------------------------------------------------------------------- forward

@cute.jit
def _sum_of(a: tuple, x) -> tuple:
    """(a[0] plus the sum of the elements of x,)"""
    return (a[0] + x.reduce(cute.ReductionOp.ADD, 0.0, 0),)


@cute.jit
def _squares(a: tuple, x, mean, center: cutlass.Constexpr) -> tuple:
    """(a[0] plus the sum of (x - mean)^2 over the elements of x; without ``center``, of x^2,)"""
    if const_expr(center):
        x = x - mean
    return (a[0] + (x * x).reduce(cute.ReductionOp.ADD, 0.0, 0),)


@cute.jit
def _combine_moments(a: tuple, b: tuple) -> tuple:
    """Two parts' ``(count, mean, M2)`` (M2 the sum of squared deviations from the part's mean) as one
    (Chan et al.): n = n_a + n_b, mean = (n_a mean_a + n_b mean_b) / n and, with delta = mean_b -
    mean_a, M2 = M2_a + M2_b + delta^2 n_a n_b / n. Written symmetric in a and b, so that the
    swapped call gives the same bits (``_rows.butterfly``). A part of no columns (count, mean and M2
    all 0) leaves the other as it is."""
    n = a[0] + b[0]
    inv = 1.0 / cute.arch.fmax(n, Float32(1.0))
    delta = b[1] - a[1]
    return n, (a[0] * a[1] + b[0] * b[1]) * inv, a[2] + b[2] + delta * delta * (a[0] * b[0]) * inv


@cute.jit
def _valid(pred: cute.Tensor, vpt: cutlass.Constexpr[int], vec: cutlass.Constexpr[int]) -> Float32:
    """The number of this thread's elements inside the row (its vectors on ``pred``)."""
    count = Float32(0.0)
    for j in cutlass.range_constexpr(vpt):
        if pred[0, j]:
            count += Float32(vec)
    return count


def _cluster_moments(count, warp_mean, squares, plan_, peers, center: bool) -> tuple:
    """``(mean, M2)`` of the row from this warp's (count, mean, M2), combined over the warps of the
    row's cluster (``_rows.cluster_allreduce``): by Chan's formula, or for rms_norm (``center``
    false: mean 0, M2 the sum of squares) as a plain sum."""
    if const_expr(center):
        _, mean, squares = cluster_allreduce((count, warp_mean, squares), _combine_moments, plan_, peers)
        return mean, squares
    (squares,) = cluster_allreduce((squares,), combine_sum, plan_, peers)
    return Float32(0.0), squares


def _norm_forward_factory(center: bool, dtype, plan_, has_w: bool, has_b: bool):
    """The forward host function (``has_w``, ``has_b``: only key the cache; they show in which pointers are None)."""
    chunk, vpt, tpr = plan_.chunk, plan_.vpt, plan_.tpr

    @cute.kernel
    def norm_forward_kernel(mX: cute.Tensor, mW: Optional[cute.Tensor], mB: Optional[cute.Tensor], mY: cute.Tensor,
                            mMean: Optional[cute.Tensor], mRstd: cute.Tensor, rows: Int64, D: Int32, eps: Float32,
                            tiled_copy: cute.TiledCopy):
        # mX, mY: (D, (N,)); mW, mB: (D,); mMean, mRstd: (N,) float32
        buffer = reduction_buffer(plan_, 2, stages=2)
        peers = cluster_buffer(plan_, 3 if center else 1)
        sX = staging_buffer(plan_, mX.element_type)
        cluster_started(plan_, peers)
        row, lane, thr, tXcX = row_thread(tiled_copy, plan_)
        x_row, y_row = mX[None, (row,)], mY[None, (row,)]
        n = Int32(0)  # columns to read: none for a row past the end
        if row < rows:
            n = D
        d = Float32(D)
        mean = Float32(0.0)
        if const_expr(plan_.staged):  # this CTA's share in shared memory, read a vector at a time (see the doc)
            c = cluster_rank(plan_)
            pred = chunk_predicate(tXcX, n - c * chunk, vpt)
            if const_expr(mX.element_type.width == 16):  # the parameters' share loads while the statistics form
                rW, rB = _fragment(tiled_copy, thr, mW, c, chunk, pred), _fragment(tiled_copy, thr, mB, c, chunk, pred)
            else:  # float32: read a vector at a time with y (held, they would spill past 80 registers)
                rW, rB = _slice(thr, mW, c, chunk), _slice(thr, mB, c, chunk)
            tXsX = stage_chunk(mX.element_type, plan_, lane, x_row, c, pred, sX)
            count, warp_mean = Float32(0.0), Float32(0.0)  # this warp's exact statistics, then the row's
            if const_expr(center):
                total, count = butterfly((reduce_staged(tXsX, pred, vpt, _sum_of, (Float32(0.0),))[0],
                                          _valid(pred, vpt, plan_.vec)), combine_sum, WARP)
                warp_mean = total / cute.arch.fmax(count, Float32(1.0))
            (squares,) = butterfly(reduce_staged(tXsX, pred, vpt, lambda a, x: _squares(a, x, warp_mean, center),
                                                 (Float32(0.0),)), combine_sum, WARP)
            mean, squares = _cluster_moments(count, warp_mean, squares, plan_, peers, center)
            rstd = 1.0 / cute.math.sqrt(squares / d + eps)
            store_staged(tiled_copy, thr, tXsX, y_row, c, chunk, pred, vpt,
                         lambda x, w, b: _affine((x - mean) * rstd if const_expr(center) else x * rstd, w, b), (rW, rB))
        elif const_expr(plan_.one_pass):
            c = cluster_rank(plan_)  # the row's one chunk, or this CTA's (a cluster per row)
            pred = chunk_predicate(tXcX, n - c * chunk, vpt)
            x = load_chunk(tiled_copy, thr, x_row, c, chunk, pred, 0.0).load().to(Float32)
            if const_expr(plan_.cluster == 1):
                if const_expr(center):
                    (total,) = row_allreduce((x.reduce(cute.ReductionOp.ADD, 0.0, 0),), combine_sum, tpr, buffer, 0)
                    mean = total / d
                    x = masked(x - mean, pred, vpt)  # centred; 0 past the row's end
                (squares,) = row_allreduce(((x * x).reduce(cute.ReductionOp.ADD, 0.0, 0),), combine_sum, tpr,
                                           buffer, 1)
            else:  # each warp's exact statistics, then the row's over the cluster's warps (Chan's combination)
                count, warp_mean = Float32(0.0), Float32(0.0)
                if const_expr(center):
                    total, count = butterfly((x.reduce(cute.ReductionOp.ADD, 0.0, 0), _valid(pred, vpt, plan_.vec)),
                                             combine_sum, WARP)
                    warp_mean = total / cute.arch.fmax(count, Float32(1.0))
                    x = masked(x - warp_mean, pred, vpt)  # centred on the warp's mean
                (squares,) = butterfly(((x * x).reduce(cute.ReductionOp.ADD, 0.0, 0),), combine_sum, WARP)
                mean, squares = _cluster_moments(count, warp_mean, squares, plan_, peers, center)
                if const_expr(center):
                    x = masked(x - (mean - warp_mean), pred, vpt)  # centred on the row's mean
            rstd = 1.0 / cute.math.sqrt(squares / d + eps)
            y = _affine(x * rstd, _param(tiled_copy, thr, mW, c, chunk, pred),
                        _param(tiled_copy, thr, mB, c, chunk, pred))
            store_chunk(tiled_copy, thr, y, y_row, c, chunk, pred)
        else:
            shift = Float32(0.0)
            if const_expr(center):  # the first chunk's mean (D > CHUNK: the chunk is full)
                x0 = load_chunk(tiled_copy, thr, x_row, 0, chunk, chunk_predicate(tXcX, n, vpt), 0.0)
                (first,) = row_allreduce((x0.load().to(Float32).reduce(cute.ReductionOp.ADD, 0.0, 0),), combine_sum,
                                         tpr, buffer, 0)
                shift = first / chunk
            sum1, sum2 = Float32(0.0), Float32(0.0)  # of s = x - shift and s^2, this thread's columns
            for c in cutlass.range(cute.ceil_div(D, chunk), unroll=1):
                pred = chunk_predicate(tXcX, n - c * chunk, vpt)
                s = load_chunk(tiled_copy, thr, x_row, c, chunk, pred, 0.0).load().to(Float32)
                if const_expr(center):
                    s = masked(s - shift, pred, vpt)
                sum1 += s.reduce(cute.ReductionOp.ADD, 0.0, 0)
                sum2 += (s * s).reduce(cute.ReductionOp.ADD, 0.0, 0)
            sum1, sum2 = row_allreduce((sum1, sum2), combine_sum, tpr, buffer, 1)
            var = sum2 / d  # rms_norm: mean(x^2)
            if const_expr(center):
                delta = sum1 / d  # mean - shift
                mean = shift + delta
                var = cute.arch.fmax(var - delta * delta, Float32(0.0))
            rstd = 1.0 / cute.math.sqrt(var + eps)
            for c in cutlass.range(cute.ceil_div(D, chunk), unroll=1):
                pred = chunk_predicate(tXcX, n - c * chunk, vpt)
                x = load_chunk(tiled_copy, thr, x_row, c, chunk, pred, 0.0).load().to(Float32)
                y = _affine((x - mean) * rstd, _param(tiled_copy, thr, mW, c, chunk, pred),
                            _param(tiled_copy, thr, mB, c, chunk, pred))
                store_chunk(tiled_copy, thr, y, y_row, c, chunk, pred)
        if lane == 0:
            if row < rows:
                if cluster_rank(plan_) == 0:  # (a cluster's CTAs all hold the row's statistics)
                    if const_expr(center):
                        mMean[row] = mean
                    mRstd[row] = rstd

    @cute.jit
    def norm_forward_host(stream: cuda.CUstream, pX: cute.Pointer, pW: Optional[cute.Pointer],
                          pB: Optional[cute.Pointer], pY: cute.Pointer, pMean: Optional[cute.Pointer],
                          pRstd: cute.Pointer, rows: Int64, D: Int32, eps: Float32, *args):
        (mX, mY), _ = row_views((pX, pY), D, 1, plan_, args)
        mMean = None
        if const_expr(center):
            mMean = cute.make_tensor(pMean, cute.make_layout((rows,)))
        mRstd = cute.make_tensor(pRstd, cute.make_layout((rows,)))
        norm_forward_kernel(mX, _vector(pW, D, plan_.vec), _vector(pB, D, plan_.vec), mY, mMean, mRstd, rows, D, eps,
                            row_copy(dtype, plan_)).launch(
            **row_launch(rows, plan_, stream))

    return norm_forward_host


# ----------------------------------------------------------------------------- backward

def _norm_backward_factory(center: bool, dtype, plan_, has_w: bool, has_dx: bool, has_dw: bool, has_db: bool,
                           prefetch: bool):
    """The backward host function; the flags say which of weight, dx, dweight, dbias exist and whether
    (rows kept on chip) the next row's x and dy are copied into shared memory (cp.async) while this
    row is reduced."""
    chunk, vpt, tpr, slots = plan_.chunk, plan_.vpt, plan_.tpr, plan_.rows
    sums = 2 if center else 1  # row sums dx needs: g * xhat (and g)
    # a row swept in chunks, with dx and a column sum: dx chunk-major beside the column sums (x and dy
    # read twice, not three times), the row sums kept between the sweeps in a (N, sums) scratch
    chunk_major = not plan_.one_pass and has_dx and (has_dw or has_db)

    @cute.jit
    def row_stats(mMean: Optional[cute.Tensor], mRstd: cute.Tensor, row, rows):
        """``(mean, rstd)`` of ``row``; (0, 0) past the end, so that xhat is 0 there."""
        mean, rstd = Float32(0.0), Float32(0.0)
        if row < rows:
            rstd = mRstd[row]
            if const_expr(center):
                mean = mMean[row]
        return mean, rstd

    def grad_terms(dy, w):
        """g = dy * w of one chunk (float32 TensorSSA; a missing w is 1)."""
        return dy if const_expr(w is None) else dy * w

    def row_grad(xhat, g, totals, d):
        """dx / rstd = g - xhat mean(g xhat) - mean(g) from the row sums ``totals``."""
        dxhat = g - xhat * (totals[0] / d)
        if const_expr(center):
            dxhat = dxhat - totals[1] / d
        return dxhat

    def row_sums(xhat, g) -> tuple:
        part = ((g * xhat).reduce(cute.ReductionOp.ADD, 0.0, 0),)
        if const_expr(center):
            part = (*part, g.reduce(cute.ReductionOp.ADD, 0.0, 0))
        return part

    @cute.kernel
    def norm_backward_kernel(mdY: cute.Tensor, mX: cute.Tensor, mW: Optional[cute.Tensor], mMean: Optional[cute.Tensor],
                             mRstd: cute.Tensor, mdX: Optional[cute.Tensor], mdW: Optional[cute.Tensor],
                             mdB: Optional[cute.Tensor], mTotals: Optional[cute.Tensor], rows: Int64, D: Int32,
                             tiled_copy: cute.TiledCopy):
        # mdY, mX, mdX: (D, (N,)); mW: (D,); mMean, mRstd: (N,) float32; mdW, mdB: (P, D) float32 partials;
        # mTotals: (N, sums) float32, the row sums of a long row between its two sweeps (``chunk_major``)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        ctas, _, _ = cute.arch.grid_dim()
        buffer = reduction_buffer(plan_, sums, stages=2)
        peers = cluster_buffer(plan_, sums, stages=2)  # (a cluster per row: the row sums, row after row)
        smem = cutlass.memory.SmemAllocator()
        accumulators = (has_dw, has_db)
        sAcc = [None, None]  # (slots, CHUNK) float32 column sums of dy * xhat and dy, one slot per row of the CTA
        if const_expr(plan_.one_pass):
            for k in cutlass.range_constexpr(2):
                if const_expr(accumulators[k]):
                    sAcc[k] = smem.allocate_tensor(Float32, cute.make_ordered_layout((slots, chunk), order=(1, 0)),
                                                   byte_alignment=16)
        sX, sdY = None, None  # (slots, CHUNK) in the rows' dtype: the next rows' x and dy (prefetch)
        if const_expr(prefetch):
            staged = cute.make_ordered_layout((slots, chunk), order=(1, 0))
            sX = smem.allocate_tensor(mX.element_type, staged, byte_alignment=16)
            sdY = smem.allocate_tensor(mdY.element_type, staged, byte_alignment=16)
        cluster_started(plan_, peers)
        first_row, lane, thr, tXcX = row_thread(tiled_copy, plan_)
        slot = tidx // tpr
        blocks = Int32(cute.ceil_div(rows, slots))  # blocks of `slots` consecutive rows (< 2^31: checked on the host)
        d = Float32(D)
        # with a cluster per row (one row a CTA): CTA `rank` of cluster `group` takes chunk `rank` of the
        # rows group, group + groups, ...; its partials are row `group`'s columns of that chunk
        rank, group, groups = cluster_rank(plan_), bidx // plan_.cluster, ctas // plan_.cluster
        if const_expr(plan_.cluster > 1):
            cute.arch.cluster_wait()  # the peers run, their mbarriers set up: the exchanges below may start
        if const_expr(plan_.one_pass):
            tAcc = [None, None]  # this thread's slices of the accumulators, ((VEC, 1), VPT)
            for k in cutlass.range_constexpr(2):
                if const_expr(accumulators[k]):
                    tAcc[k] = thr.partition_D(sAcc[k][slot, None])
                    tAcc[k].fill(0.0)
            if const_expr(prefetch):  # this thread's slices of the staging buffers, and the first row's copy
                g2s = row_copy(dtype, plan_, to_shared=True).get_slice(lane)
                tXsX, tdYsdY = g2s.partition_D(sX[slot, None]), g2s.partition_D(sdY[slot, None])
                stage_rows(g2s, mX, mdY, tXsX, tdYsdY, first_row, rows, D, tXcX, chunk, vpt)
            for block in cutlass.range(group, blocks, groups, unroll=1):
                row = Int64(block) * slots + slot
                n = Int32(0)
                if row < rows:
                    n = D
                pred = chunk_predicate(tXcX, n - rank * chunk, vpt)
                mean, rstd = row_stats(mMean, mRstd, row, rows)
                if const_expr(prefetch):  # the row arrived in shared memory during the previous one
                    cute.arch.cp_async_wait_group(0)
                    x = to_registers(tiled_copy, tXsX, pred, 0.0).load().to(Float32)
                    dy = to_registers(tiled_copy, tdYsdY, pred, 0.0).load().to(Float32)
                else:
                    x = load_chunk(tiled_copy, thr, mX[None, (row,)], rank, chunk, pred, 0.0).load().to(Float32)
                    dy = load_chunk(tiled_copy, thr, mdY[None, (row,)], rank, chunk, pred, 0.0).load().to(Float32)
                xhat = (x - mean) * rstd
                # the column sums first: dy is dead before the row reduction. (The warp sync keeps the
                # compiler from promoting the accumulators to registers across rows: they stay in smem.)
                cute.arch.sync_warp()
                if const_expr(has_dw):
                    tAcc[0].store(tAcc[0].load() + dy * xhat)
                if const_expr(has_db):
                    tAcc[1].store(tAcc[1].load() + dy)
                if const_expr(prefetch):  # x and dy are in registers (and used): the next row's copy may start
                    stage_rows(g2s, mX, mdY, tXsX, tdYsdY, row + Int64(ctas) * slots, rows, D, tXcX, chunk,
                               vpt)
                if const_expr(has_dx):
                    # the weight is re-read for every row (an L1 hit) rather than held in registers
                    g = grad_terms(dy, _param(tiled_copy, thr, mW, rank, chunk, pred))
                    use = (block - group) // groups  # this CTA's row number: alternate buffers, see row_allreduce
                    if const_expr(plan_.cluster > 1):
                        totals = cluster_allreduce(butterfly(row_sums(xhat, g), combine_sum, WARP), combine_sum, plan_,
                                                   peers, use, waited=True)
                    else:
                        totals = row_allreduce(row_sums(xhat, g), combine_sum, tpr, buffer, use % 2)
                    store_chunk(tiled_copy, thr, rstd * row_grad(xhat, g, totals, d), mdX[None, (row,)], rank, chunk,
                                pred)
            # the CTA's row slots added column by column, in order: one row of partials (its chunk's columns)
            cute.arch.barrier()
            for k in cutlass.range_constexpr(2):
                if const_expr(accumulators[k]):
                    partials = (mdW, mdB)[k]
                    for col in cutlass.range(tidx, cutlass.min(chunk, D - rank * chunk), plan_.threads, unroll=1):
                        total = Float32(0.0)
                        for s in cutlass.range(slots, unroll=8):
                            total += sAcc[k][s, col]
                        partials[group, rank * chunk + col] = total
        else:  # rows of more than ON_CHIP_BACKWARD columns: one row at a time (slots == 1)
            chunks = cute.ceil_div(D, chunk)
            if const_expr(has_dx):  # sweep 1, row by row: the row sums (into mTotals when chunk-major)
                for block in cutlass.range(bidx, blocks, ctas, unroll=1):
                    row = Int64(block)
                    x_row, dy_row = mX[None, (row,)], mdY[None, (row,)]
                    mean, rstd = row_stats(mMean, mRstd, row, rows)
                    part = (Float32(0.0),) * sums
                    for c in cutlass.range(chunks, unroll=1):
                        pred = chunk_predicate(tXcX, D - c * chunk, vpt)
                        x = load_chunk(tiled_copy, thr, x_row, c, chunk, pred, 0.0).load().to(Float32)
                        dy = load_chunk(tiled_copy, thr, dy_row, c, chunk, pred, 0.0).load().to(Float32)
                        xhat, g = (x - mean) * rstd, grad_terms(dy, _param(tiled_copy, thr, mW, c, chunk, pred))
                        part = combine_sum(part, row_sums(xhat, g))
                    stage = ((block - bidx) // ctas) % 2
                    totals = row_allreduce(part, combine_sum, tpr, buffer, stage)
                    if const_expr(chunk_major):
                        if tidx == 0:
                            for k in cutlass.range_constexpr(sums):
                                mTotals[row, k] = totals[k]
                    else:  # sweep 2 of this row: dx
                        for c in cutlass.range(chunks, unroll=1):
                            pred = chunk_predicate(tXcX, D - c * chunk, vpt)
                            x = load_chunk(tiled_copy, thr, x_row, c, chunk, pred, 0.0).load().to(Float32)
                            dy = load_chunk(tiled_copy, thr, dy_row, c, chunk, pred, 0.0).load().to(Float32)
                            xhat, g = (x - mean) * rstd, grad_terms(dy, _param(tiled_copy, thr, mW, c, chunk, pred))
                            store_chunk(tiled_copy, thr, rstd * row_grad(xhat, g, totals, d), mdX[None, (row,)], c,
                                        chunk, pred)
            if const_expr(chunk_major):
                cute.arch.barrier()  # the CTA's row sums (its own rows: global writes, visible after the barrier)
            if const_expr(has_dw or has_db):  # chunk by chunk over the CTA's rows: the column sums, in registers
                for c in cutlass.range(chunks, unroll=1):  # (chunk-major: and dx, from the row sums)
                    pred = chunk_predicate(tXcX, D - c * chunk, vpt)
                    acc_w = cute.make_rmem_tensor(tXcX.shape, Float32)  # ((VEC, 1), VPT), like the fragments
                    acc_b = cute.make_rmem_tensor(tXcX.shape, Float32)
                    acc_w.fill(0.0)
                    acc_b.fill(0.0)
                    w = None
                    if const_expr(chunk_major):
                        w = _param(tiled_copy, thr, mW, c, chunk, pred)  # this chunk's weight, for all the rows
                    for block in cutlass.range(bidx, blocks, ctas, unroll=1):
                        row = Int64(block)
                        mean, rstd = row_stats(mMean, mRstd, row, rows)
                        x = load_chunk(tiled_copy, thr, mX[None, (row,)], c, chunk, pred, 0.0).load().to(Float32)
                        dy = load_chunk(tiled_copy, thr, mdY[None, (row,)], c, chunk, pred, 0.0).load().to(Float32)
                        xhat = (x - mean) * rstd
                        if const_expr(has_dw):
                            acc_w.store(acc_w.load() + dy * xhat)
                        if const_expr(has_db):
                            acc_b.store(acc_b.load() + dy)
                        if const_expr(chunk_major):
                            totals = tuple(mTotals[row, k] for k in range(sums))
                            store_chunk(tiled_copy, thr, rstd * row_grad(xhat, grad_terms(dy, w), totals, d),
                                        mdX[None, (row,)], c, chunk, pred)
                    for k in cutlass.range_constexpr(2):
                        if const_expr(accumulators[k]):
                            _store_partials((acc_w, acc_b)[k], (mdW, mdB)[k], bidx, c * chunk, D, tXcX)

    @cute.jit
    def norm_backward_host(stream: cuda.CUstream, pdY: cute.Pointer, pX: cute.Pointer, pW: Optional[cute.Pointer],
                           pMean: Optional[cute.Pointer], pRstd: cute.Pointer, pdX: Optional[cute.Pointer],
                           pdW: Optional[cute.Pointer], pdB: Optional[cute.Pointer], pTotals: Optional[cute.Pointer],
                           rows: Int64, D: Int32, ctas: Int32, *args):
        views, _ = row_views(tuple(p for p in (pdY, pX, pdX) if p is not None), D, 1, plan_, args)
        mdY, mX, mdX = views[0], views[1], views[2] if const_expr(has_dx) else None
        mMean = None
        if const_expr(center):
            mMean = cute.make_tensor(pMean, cute.make_layout((rows,)))
        mRstd = cute.make_tensor(pRstd, cute.make_layout((rows,)))
        partials = cute.make_layout((ctas // plan_.cluster, D), stride=(Int64(D), 1))
        mdW = cute.make_tensor(pdW, partials) if const_expr(has_dw) else None
        mdB = cute.make_tensor(pdB, partials) if const_expr(has_db) else None
        mTotals = None
        if const_expr(chunk_major):
            mTotals = cute.make_tensor(pTotals, cute.make_layout((rows, sums), stride=(sums, 1)))
        norm_backward_kernel(mdY, mX, _vector(pW, D, plan_.vec), mMean, mRstd, mdX, mdW, mdB, mTotals, rows, D,
                             row_copy(dtype, plan_)).launch(grid=[ctas, 1, 1], block=[plan_.threads, 1, 1],
                                                            cluster=row_cluster(plan_), stream=stream)

    return norm_backward_host


@cute.jit
def stage_rows(thr_g2s, mX: cute.Tensor, mdY: cute.Tensor, tXsX: cute.Tensor, tdYsdY: cute.Tensor, row, rows,
               D: Int32, tXcX: cute.Tensor, chunk: cutlass.Constexpr[int], vpt: cutlass.Constexpr[int]):
    """Start copying row ``row`` of x and dy (its first ``chunk`` columns) into this thread's slices of
    the staging buffers, nothing past the last row, as one cp.async group."""
    n = Int32(0)
    if row < rows:
        n = D
    pred = chunk_predicate(tXcX, n, vpt)
    cute.copy(thr_g2s, thr_g2s.partition_S(cute.local_tile(mX[None, (row,)], (chunk,), (0,))), tXsX, pred=pred)
    cute.copy(thr_g2s, thr_g2s.partition_S(cute.local_tile(mdY[None, (row,)], (chunk,), (0,))), tdYsdY, pred=pred)
    cute.arch.cp_async_commit_group()


@cute.jit
def _store_partials(acc: cute.Tensor, mPartials: cute.Tensor, cta, start, D: Int32, tXcX: cute.Tensor):
    """Write a thread's column sums ``acc`` (its values of the chunk that starts at column ``start``)
    into row ``cta`` of the partials, the columns below D only."""
    for i in cutlass.range_constexpr(cute.size(acc)):
        col = start + tXcX[i][0]
        if col < D:
            mPartials[cta, col] = acc[i]


def _column_sum_factory(dtype, vec: int, sets: int):
    """out_s[j] = sum_p partials[s, p, j] in a fixed order, rounded to ``dtype``, for each of the ``sets``
    (1 or 2) sets of partials (S, P, D); ``vec`` float32 columns per access.

    CTA (b, s) takes columns [32 b, 32 b + 32) of set s: a row of its tile is one 128-byte line
    (``lanes`` = 32 / vec threads), and its 256 threads read ``rows`` = 8 vec partial rows at once
    (32 at vec 4), ``SUM_UNROLL`` steps in flight. Each thread adds its rows p = r, r + rows, ...; the
    rows a warp holds meet by shuffles, the 8 warps in shared memory, added in order by the first 32
    threads (one column each). At D = 8192 that is 256 CTAs a set (a CTA a warp-row of 32 vec
    columns, as before, made 64 for 132 SMs)."""
    lanes = _reduce.WARP // vec  # threads across a tile row
    rows = THREADS // lanes  # partial rows a step reads
    warps = THREADS // _reduce.WARP
    tile = (rows, _reduce.WARP)
    offsets = tuple(lanes << i for i in range((_reduce.WARP // lanes).bit_length() - 1))  # a warp's rows, by xor

    @cute.kernel
    def column_sum_kernel(mP: cute.Tensor, mOut: cute.Tensor, mOut2: Optional[cute.Tensor], tiled_copy: cute.TiledCopy):
        # mP: (S, P, D) float32; mOut, mOut2: (D,) (mOut2 None for one set). CTA (b, s): set s, 32 columns.
        tidx, _, _ = cute.arch.thread_idx()
        bidx, sidx, _ = cute.arch.block_idx()
        _, P, D = mP.shape
        mSet = mP[sidx, None, None]  # (P, D)
        thr = tiled_copy.get_slice(tidx)
        cP = cute.make_identity_tensor((P, D))
        acc = cute.make_rmem_tensor(cute.make_layout(((vec, 1), 1, 1)), Float32)
        acc.fill(0.0)
        for k in cutlass.range(cute.ceil_div(P, rows), unroll=SUM_UNROLL):  # SUM_UNROLL steps' loads in flight
            tPgP = thr.partition_S(cute.local_tile(mSet, tile, (k, bidx)))  # ((VEC, 1), 1, 1)
            tPcP = thr.partition_S(cute.local_tile(cP, tile, (k, bidx)))
            rP = cute.make_rmem_tensor_like(tPgP)
            rP.fill(0.0)
            cute.copy(tiled_copy, tPgP, rP, pred=_reduce.predicate(tPcP, (P, D)))
            acc.store(acc.load() + rP.load())
        # the warp's rows (32 / lanes of them, lanes apart) by shuffles, then the warps in shared memory
        smem = cutlass.memory.SmemAllocator()
        sAcc = smem.allocate_tensor(Float32, cute.make_ordered_layout((warps, _reduce.WARP), order=(1, 0)),
                                    byte_alignment=16)
        warp, lane = tidx // _reduce.WARP, tidx % _reduce.WARP
        for v in cutlass.range_constexpr(vec):
            total = acc[v]
            for j in cutlass.range_constexpr(len(offsets)):
                total += cute.arch.shuffle_sync_bfly(total, offset=offsets[j])
            if lane < lanes:
                sAcc[warp, lane * vec + v] = total
        cute.arch.barrier()
        if tidx < _reduce.WARP:
            col = bidx * _reduce.WARP + tidx
            if col < D:
                total = Float32(0.0)
                for w in cutlass.range_constexpr(warps):
                    total += sAcc[w, tidx]
                if const_expr(sets == 1):
                    mOut[col] = total.to(mOut.element_type)
                else:
                    if sidx == 0:
                        mOut[col] = total.to(mOut.element_type)
                    else:
                        mOut2[col] = total.to(mOut2.element_type)

    @cute.jit
    def column_sum_host(stream: cuda.CUstream, pP: cute.Pointer, pOut: cute.Pointer, pOut2: Optional[cute.Pointer],
                        P: Int32, D: Int32):
        if const_expr(vec > 1):
            strides = (cute.assume(Int64(P) * D, divby=vec), cute.assume(Int64(D), divby=vec), 1)
            mP = cute.make_tensor(pP, cute.make_layout((sets, P, cute.assume(D, divby=vec)), stride=strides))
        else:
            mP = cute.make_tensor(pP, cute.make_layout((sets, P, D), stride=(Int64(P) * D, Int64(D), 1)))
        mOut = cute.make_tensor(pOut, cute.make_layout((D,)))
        mOut2 = cute.make_tensor(pOut2, cute.make_layout((D,))) if const_expr(sets == 2) else None
        threads = cute.make_ordered_layout((rows, lanes), order=(1, 0))  # lanes fastest: a tile row per `lanes` threads
        tiled_copy = cute.make_tiled_copy_tv(_reduce.copy_atom(Float32, vec), threads, cute.make_layout((1, vec)))
        column_sum_kernel(mP, mOut, mOut2, tiled_copy).launch(
            grid=[cute.ceil_div(D, _reduce.WARP), sets, 1], block=[THREADS, 1, 1], stream=stream)

    return column_sum_host


# ----------------------------------------------------------------------------- host

def _dense(t):
    return None if t is None else t.contiguous()


def _rows(op, row_tensors, params, max_one_pass, stream):
    """``(vec, plan, args)`` for (N, D) ``row_tensors`` (x first) and (D,) ``params`` (None allowed):
    tensors or their ``_compile.Operand`` stand-ins."""
    n, d = row_tensors[0].shape
    check_sizes(op, "x", row_tensors[0], d, n)
    row_strides = [(t.stride(0) if n > 1 else 0,) for t in row_tensors]
    col_strides = [t.stride(1) if d > 1 else 1 for t in row_tensors]
    present = [t for t in (*row_tensors, *params) if t is not None]
    vec = 1
    if all(c == 1 for c in col_strides):
        vec = _reduce.vector_width(row_tensors[0].element_size(), [t.data_ptr() for t in present],
                                   [d, *(s for (s,) in row_strides)])
    return vec, plan(d, vec, col_strides, max_one_pass, stream), row_arguments((n,), row_strides, col_strides)


def _operand(t):
    return None if t is None else _compile.Operand.of(t)


F32_SHARE = MAX_ONE_PASS // 2  # the float32 layer_norm forward's columns a CTA, on clusters (_forward_plan)


@_compile.plan_cache
def _forward_plan(x2, weight, bias, center: bool, launch: Launch, sms: int) -> tuple:
    """``(key, align, args)`` of the forward's launch for ``x2`` (N, D) and (D,) ``weight``, ``bias``
    (``_compile.Operand``s or None) writing a new contiguous (N, D) y; ``launch``: the op's table;
    ``sms``: the device's SM count. A row longer than one CTA keeps is spread over a cluster of CTAs
    that each keep their share (``_rows.split_rows``), where the shares fit; else swept in chunks."""
    op = "layer_norm" if center else "rms_norm"
    y2 = _compile.Operand.new(x2.shape, x2.dtype)
    vec, plan_, args = _rows(op, (x2, y2), (weight, bias), MAX_ONE_PASS, STREAM_FORWARD)
    plan_ = spread_row(plan_, x2.shape[1], launch.row_threads)  # a row that fills a CTA: over 512 threads
    # 16-bit rows past one CTA: shares of up to 16384 over up to 16 CTAs, staged in shared memory (1.1-1.3x
    # at 1024-4096 rows); float32 ones keep theirs in registers, over 8 CTAs of 512 threads at 262144
    # (staged, 64 KB a share, they ran 0.7-1.0x). Unstaged (Launch.staged=False) 16-bit rows take clusters of
    # 16 only when few (<= SMs), past 8 shares. docs/rms_norm.md
    # float32 layer_norm rows of 8192 < D <= 131072: a CTA of 256 threads per 8192 columns, up to Hopper's
    # 16 (its wider shares over 512 threads, beside the per-warp statistics, ran 1.1-1.2x slower: docs/layer_norm.md).
    few = x2.element_size() == 2 and x2.shape[0] <= sms
    stage = x2.element_size() == 2 if launch.staged is None else launch.staged
    d = x2.shape[1]
    f32_shares = center and x2.element_size() == 4 and vec > 1 and F32_SHARE < d <= CLUSTER_MAX_SM90 * F32_SHARE
    cluster = launch.cluster
    if cluster is None and f32_shares and d <= MAX_ONE_PASS:  # (split_rows leaves a row one CTA keeps alone)
        cluster = -(-d // F32_SHARE)
    split = split_rows(plan_, *x2.shape, sms, F32_SHARE if f32_shares else MAX_ONE_PASS, cluster=cluster,
                       wide=x2.element_size() == 4, most=CLUSTER_MAX_SM90 if few or f32_shares else CLUSTER_MAX,
                       stage=stage)
    plan_ = split if split.one_pass else plan_  # (the streaming sweep has no cluster exchange)
    key = (center, _compile.DTYPES[x2.dtype], plan_, weight is not None, bias is not None)
    return key, vec * x2.element_size(), args


def norm_forward(x, weight, bias, eps, center):
    """``(y, x2, mean, rstd)``: y like x (contiguous); x2 = ``rows_of(x)``; mean (None unless
    ``center``) and rstd (N,) float32. weight and bias are (D,) or None (a strided one is copied)."""
    x2 = rows_of(x)
    n, d = x2.shape
    y = x.new_empty(x.shape)
    mean = x.new_empty(n, dtype=torch.float32) if center else None
    rstd = x.new_empty(n, dtype=torch.float32)
    if n and d:
        weight, bias = _dense(weight), _dense(bias)
        key, align, args = _forward_plan(_compile.Operand.of(x2), _operand(weight), _operand(bias), center,
                                         tuning.launch("layer_norm" if center else "rms_norm"),
                                         _reduce.sm_count(x.device))
        pointer = _compile.pointer
        _compile.launch(_norm_forward_factory, key, _compile.stream_of(x), pointer(x2, align),
                        None if weight is None else pointer(weight, align),
                        None if bias is None else pointer(bias, align), pointer(y, align),
                        None if mean is None else pointer(mean, 4), pointer(rstd, 4), n, d, float(eps), *args)
    elif n:  # rows of no columns: the mean of nothing is NaN, as in torch
        rstd.fill_(float("nan"))
        if mean is not None:
            mean.fill_(float("nan"))
    return y, x2, mean, rstd


def backward_launch(center: bool, itemsize: int, vec: int, tpr: int) -> tuple:
    """``(threads, CTAs per SM, prefetch)`` of the backward for rows kept on chip (``itemsize``-byte
    elements, ``vec`` per access, ``tpr`` threads a row). One CTA of 512 threads an SM holds the
    rows two CTAs of 256 would and writes half as many partials (faster on an H100 at D = 1024-8192);
    except layer_norm in 16 bits with a row across 256 threads (D > 4096), where two CTAs of 256 that
    stage the next row in shared memory (cp.async, 4 bytes an access at least) are faster.
    Measurements: docs/layer_norm.md, "Why these defaults"."""
    if center and itemsize <= 2 and tpr == THREADS:
        return THREADS, 2, itemsize * vec >= 4
    return 2 * THREADS, 1, False


@_compile.plan_cache
def _backward_plan(dy2, x2, weight, needs: tuple, center: bool, sms: int, launch: Launch) -> tuple:
    """``(key, align, ctas, args)`` of the backward's launch for (N, D) ``dy2``, ``x2`` and (D,)
    ``weight`` (``_compile.Operand``s or None) writing a new contiguous dx where ``needs[0]``, on a
    device of ``sms`` SMs; ``launch``: the op's table."""
    n, d = x2.shape
    row_tensors = (dy2, x2) + ((_compile.Operand.new((n, d), x2.dtype),) if needs[0] else ())
    op = "layer_norm" if center else "rms_norm"
    vec, plan_, args = _rows(op, row_tensors, (weight,), ON_CHIP_BACKWARD, STREAM_BACKWARD)
    per_sm, prefetch = CTAS_PER_SM, False
    cluster = -(-d // ON_CHIP_BACKWARD)
    if (not plan_.one_pass and needs[0] and vec > 1 and cluster <= CLUSTER_MAX_SM90 and clusters_supported()
            and launch.backward_cluster is not False):
        # a row of up to 16 x 8192 columns over a cluster of CTAs, each keeping its chunk's x and dy in
        # registers: x and dy read once (3NDs), the row sums exchanged row after row (cluster_allreduce)
        plan_ = plan(ON_CHIP_BACKWARD, vec, [1] * len(plan_.units), ON_CHIP_BACKWARD, STREAM_BACKWARD)._replace(
            cluster=cluster)  # (vector accesses: every column stride is 1)
        ctas = cluster * max(1, min(n, CTAS_PER_SM * sms // cluster))
        key = (center, _compile.DTYPES[x2.dtype], plan_, weight is not None, needs[0], needs[1], needs[2], False)
        return key, vec * x2.element_size(), ctas, args
    if plan_.one_pass:
        threads, per_sm, prefetch = backward_launch(center, x2.element_size(), vec, plan_.tpr)
        threads = launch.backward_threads or threads
        per_sm = launch.backward_ctas_per_sm or per_sm
        prefetch = prefetch if launch.backward_prefetch is None else launch.backward_prefetch
        plan_ = plan_._replace(threads=threads)
    ctas = max(1, min(-(-n // plan_.rows), per_sm * sms))
    sets = int(needs[1]) + int(needs[2])
    if not plan_.one_pass and sets:
        # each CTA writes a (D,) float32 row of partials per parameter gradient, read back by the column
        # sums: 8 P D sets bytes beside ~5 N D s of x, dy (read twice) and dx. With few long rows a CTA
        # they rival the data (512 x 262144 bf16, 264 CTAs, two sets: 1.1 GB beside 1.3 GB): no more CTAs
        # than keep them under a quarter of it, and no fewer than the SMs
        ctas = min(ctas, max(sms, 5 * n * x2.element_size() // (32 * sets)))
    key = (center, _compile.DTYPES[x2.dtype], plan_, weight is not None, needs[0], needs[1], needs[2], prefetch)
    return key, vec * x2.element_size(), ctas, args


def norm_backward(dout, x2, weight, mean, rstd, needs):
    """``(dx, dweight, dbias)`` (None where ``needs`` says no); dout is shaped like x; x2 (N, D) and
    mean (None for rms_norm), rstd come from ``norm_forward``."""
    n, d = x2.shape
    dx = x2.new_empty(dout.shape) if needs[0] else None
    if n == 0 or d == 0:  # nothing to reduce: the parameter gradients are 0
        return dx, *(x2.new_zeros(d) if need else None for need in needs[1:])
    weight = _dense(weight)
    dy2 = rows_of(dout)
    needs = tuple(bool(need) for need in needs)
    key, align, ctas, args = _backward_plan(_compile.Operand.of(dy2), _compile.Operand.of(x2), _operand(weight), needs,
                                            mean is not None, _reduce.sm_count_of(x2.get_device()),
                                            tuning.launch("layer_norm" if mean is not None else "rms_norm"))
    # one buffer, one column-sum launch; a row of partials a CTA, or a cluster's CTAs sharing one
    partials, dw, db = _host.weight_partials(needs, ctas // key[2].cluster, d, x2.device)
    totals = None  # rows swept in chunks, with dx and a column sum: their row sums between the two sweeps
    if not key[2].one_pass and needs[0] and partials is not None:
        totals = _compile.workspace((_norm_backward_factory, key), x2, n * (2 if mean is not None else 1))
    pointer = _compile.pointer
    _compile.launch(_norm_backward_factory, key, _compile.stream_of(x2), pointer(dy2, align), pointer(x2, align),
                    None if weight is None else pointer(weight, align), None if mean is None else pointer(mean, 4),
                    pointer(rstd, 4), None if dx is None else pointer(dx, align),
                    None if dw is None else pointer(dw, 4), None if db is None else pointer(db, 4),
                    None if totals is None else pointer(totals, 4), n, d, ctas, *args)
    return _host.norm_gradients(dx, partials, needs, x2.dtype, launch=_column_sum_launch)


def _column_sum_launch(partials, out0, out1):
    """out0 (and out1 when not None) (D,) <- the column sums of the (S, P, D) float32 ``partials``."""
    s, p, d = partials.shape
    vec = _reduce.vector_width(4, (partials.data_ptr(),), (d,))
    _compile.launch(_column_sum_factory, (_compile.DTYPES[out0.dtype], vec, s), _compile.stream(partials.device),
                    _compile.pointer(partials, 4 * vec), _compile.pointer(out0, out0.element_size()),
                    None if out1 is None else _compile.pointer(out1, out1.element_size()), p, d)


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a + b`` into a new contiguous tensor (``axpby``: computed in float32, rounded once): the
    residual add of the composed add norms (``add_layer_norm.py``, ``add_rms_norm.py``)."""
    return axpby(a, b, 1.0, 1.0, a.new_empty(a.shape))
