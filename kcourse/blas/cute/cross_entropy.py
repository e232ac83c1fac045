"""cross_entropy of logits (N, V) and class indices target (N,), on the CuTe DSL:

    lse_i  = log sum_j exp(x_ij)                  (float32, with the row max subtracted first)
    loss_i = lse_i - x_i,target_i                  0 where target_i == ignore_index
    out    = sum_i loss_i / n_valid  (mean)  |  sum_i loss_i  (sum)  |  loss  (none)

n_valid counts the rows whose target is not ignore_index (a mean over none of them is 0/0 = NaN,
as in torch). A target outside [0, V) that is not ignore_index is an error: on the host for CPU
tensors (``_check.index_range``, an IndexError naming it), on the GPU inside the forward kernel
(``_compile.index_error``: the row's writer prints the row and the target and stops the grid; no
host synchronization). Such a target is never read.

Non-finite logits (the python reference's rule): exponentials are taken relative to the row max
where it is finite, else relative to 0 (``_shift``; ``_rows.shift_of`` shifts by a +inf max too),
so a +inf logit makes s and lse +inf and the loss +inf against a finite target logit (NaN for a
+inf target logit, a row of -inf, or a NaN logit).

Backward, with g_i = dout / n_valid (mean), dout (sum), dout_i (none), and 0 on ignored rows:

    dx_ij = (exp(x_ij - lse_i) - [j == target_i]) * g_i       (softmax minus one-hot)

FLOPs ~4NV forward, ~4NV backward. Bytes: forward reads the logits once (NV * itemsize, ignored
rows too) and writes 2N float32; backward reads them again and writes dlogits (2NV * itemsize);
there ignored rows read nothing. Memory bound.

Design (the triton backend's, on the row machinery of ``_rows.py``):

- ``cross_entropy_kernel``: rows of logits as ``_rows.plan`` lays threads over them (many short rows
  per CTA; 256 threads on a row past V = 4096), swept in chunks of up to 64 elements per thread
  (128-bit loads where the layout allows) with an online logsumexp: a running (max, sum) per thread,
  combined over the row's threads at the end (shuffles, then shared memory). No second (N, V) tensor
  is made, whatever V (131072, 256000: a loop over chunks). The logits loads do not wait for the
  target: every row in range is read, an ignored or out-of-range one too (its values go unused), so
  they issue right behind the target's load instead of a DRAM latency later. Lane 0 of the row reads
  the one target logit (only for a target in [0, V)) before the row reduction, which hides that
  load, and writes lse (float32, the cache) and loss = (m - x_t) + log s, formed without rounding
  lse first (at |x| ~ 1e4 its float32 ulp is 1e-3). Too few rows to give every SM a CTA, each
  longer than 16384: a cluster of up to 8 CTAs per row (``_rows.split_rows``), each sweeping its
  share of the chunks; their (max, sum) pairs meet in distributed shared memory
  (``_rows.cluster_allreduce``) and the row's first CTA writes lse and loss.
- ``valid_partials_kernel``, ``valid_sum_kernel``: the mean or sum in two stages, each in a fixed
  order (deterministic, no atomics, no host sync): CTA p of the first adds the losses (float32) of
  ``PART_ROWS`` rows and counts the valid ones (all its loads in flight at once), one CTA of the
  second adds those partials (the count in int32, exact) and writes the mean or the sum; the
  backward of a mean uses them to count n_valid alone. (One CTA over all N rows took ~17 us at
  N = 32768 on an H100, ~8% of the forward.)
- ``cross_entropy_backward_kernel``: the same rows and chunks, elementwise given the cached lse:
  every element gets exp(x - lse) g, then the thread that stored the target column's vector stores
  (exp(x_t - lse) - 1) g over it (one thread's stores to one address land in program order), so no
  element is compared with the target (x_t is read before the sweep, so dx may be x itself: each
  element is read, then written, by one thread). One read and one write per element; ignored rows
  write zeros without reading. A row longer than 16384 is shared by up to 8 CTAs whatever N, each taking at
  most ``BACKWARD_SHARE`` elements (``_rows.split_rows``; nothing to combine: no cluster), so that
  more loads are in flight than one 256-thread CTA per row keeps.

Keys: the logits' dtype, the target's (int32/int64), the plan (vector width, threads per row, vectors
per thread, unit column strides) and, where it changes the code, the reduction; N, V, ignore_index
and every stride are runtime arguments.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from .. import _host, tuning
from . import _compile, _reduce
from ._rows import (LOG2E, NEG_INF, check_sizes, chunk_predicate, chunk_range,
                    cluster_buffer, cluster_rank, cluster_started, combine_max, combine_sum, exp2f,
                    load_chunk, plan, reduction_buffer, row_allreduce, row_arguments, row_launch,
                    row_copy, row_grid, row_thread, row_vector_width, row_views, rows_allreduce,
                    split_rows, store_chunk)

POS_INF = float("inf")
BACKWARD_SHARE = 8192  # the most elements of a long row one CTA of the backward takes (split_rows)
SUM_THREADS = 256  # threads of each CTA of the mean / sum / count kernels
PART_ROWS = 1024  # rows per CTA of their first stage: 4 a thread, all loads in flight


@dataclass(frozen=True)
class Launch:
    """cross_entropy's launch choices: the op's table (``kcourse.blas.tuning``). ``cluster``: CTAs
    per row, forward and backward; None (the default): ``split_rows``'s rule; an int: that many
    wherever a row has as many vectors (1: a CTA per row)."""

    cluster: int | None = None


LAUNCH = Launch()


@cute.jit
def _is_class(t: Int64, ignore_index: Int64, V: Int32) -> Int32:
    """1 for a target that is a class in [0, V), else 0 (ignored or out of range)."""
    ok = Int32(0)
    if t != ignore_index:
        if t >= 0:
            if t < V:
                ok = Int32(1)
    return ok


@cute.jit
def _shift(m: Float32) -> Float32:
    """The shift for exponentials relative to a max ``m``: m where finite, else 0 (no inf - inf: a row
    of -inf sums to 0, a row with a +inf to +inf)."""
    shift = m
    if m == Float32(NEG_INF):
        shift = Float32(0.0)
    if m == Float32(POS_INF):
        shift = Float32(0.0)
    return shift


@cute.jit
def _rescale(m_old: Float32, m: Float32, shift: Float32) -> Float32:
    """The factor of a sum taken relative to ``_shift(m_old)`` now that the max is ``m``: exp(m_old -
    shift); once the max is +inf, 1 for a sum already relative to 0 (m_old = +inf), else 0 (its
    finite terms drop out of an infinite sum; a NaN stays NaN)."""
    f = exp2f((m_old - shift) * LOG2E)
    if m == Float32(POS_INF):
        f = Float32(0.0)
        if m_old == Float32(POS_INF):
            f = Float32(1.0)
    return f


@cute.jit
def _combine_lse(a: tuple, b: tuple) -> tuple:
    """Two (max, sum of exp(x - _shift(max))) pairs as one (``_rows.combine_lse`` with ``_shift``)."""
    m = cute.arch.fmax(a[0], b[0])
    shift = _shift(m)
    return m, a[1] * _rescale(a[0], m, shift) + b[1] * _rescale(b[0], m, shift)


@cute.jit
def _online_lse(state: tuple, x) -> tuple:
    """The running (m, s) after one more chunk ``x`` (``_rows.online_lse`` with ``_shift``)."""
    m_new = cute.arch.fmax(state[0], x.reduce(cute.ReductionOp.MAX, init_val=NEG_INF, reduction_profile=0))
    shift = _shift(m_new)
    s = state[1] * _rescale(state[0], m_new, shift) \
        + exp2f((x - shift) * LOG2E).reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)
    return m_new, s


def _cross_entropy_factory(dtype, target_dtype, loss_dtype, plan_):
    """The forward host function for logits of ``dtype``, targets of ``target_dtype`` and losses of
    ``loss_dtype`` (float32 for a mean or sum, the logits' dtype for reduction "none"): the losses'
    pointer type is compiled in, so it is part of the key."""
    chunk, vpt = plan_.chunk, plan_.vpt

    @cute.kernel
    def cross_entropy_kernel(mX: cute.Tensor, mT: cute.Tensor, mLse: cute.Tensor, mLoss: cute.Tensor,
                             rows: Int64, V: Int32, ignore_index: Int64, tiled_copy: cute.TiledCopy):
        # mX: (V, (N,)) logits, a row per coordinate of mode 1; mT: (N,) targets; mLse: (N,) float32;
        # mLoss: (N,) float32 or the logits' dtype
        buffer, peers = reduction_buffer(plan_, 2, 2), cluster_buffer(plan_, 2)
        cluster_started(plan_, peers)
        row, lane, thr, tXcX = row_thread(tiled_copy, plan_)
        x_row = mX[None, (row,)]
        writer = Int32(0)  # lane 0 of the row's (first) CTA writes the results
        if lane == 0:
            if cluster_rank(plan_) == 0:
                writer = Int32(1)
        # The logits do not wait for the target: every row in range is read (an ignored or out-of-range
        # row's values go unused), so its loads issue right behind the target's.
        t, n = Int64(ignore_index), Int32(0)
        if row < rows:
            t, n = Int64(mT[row]), V
        valid = _is_class(t, ignore_index, V)
        x_t = Float32(0.0)
        m, s = Float32(NEG_INF), Float32(0.0)
        if const_expr(plan_.one_pass and plan_.cluster == 1 and not plan_.across):
            # The row in registers: its max over the row's threads first, then the sum of exp(x - max),
            # two plain reductions. (A joint (max, sum) reduction rescales a sum with two exponentials
            # at each of its 8 levels: ~15% more instructions, and this kernel is nearly issue-bound.)
            x = load_chunk(tiled_copy, thr, x_row, 0, chunk, chunk_predicate(tXcX, n, vpt), NEG_INF).load().to(Float32)
            if writer != 0:  # read while the row reduces (a line the CTA has likely just read)
                if valid != 0:
                    x_t = x_row[t].to(Float32)
            (m,) = rows_allreduce((x.reduce(cute.ReductionOp.MAX, init_val=NEG_INF, reduction_profile=0),),
                                  combine_max, plan_, buffer, 0)
            e = exp2f((x - _shift(m)) * LOG2E)
            (s,) = rows_allreduce((e.reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0),),
                                  combine_sum, plan_, buffer, 1)
        else:
            state = (Float32(NEG_INF), Float32(0.0))
            first, count = chunk_range(V, plan_)  # the whole row, or this CTA's share of it
            for c in cutlass.range(first, first + count, unroll=1):
                pred = chunk_predicate(tXcX, n - c * chunk, vpt)
                x = load_chunk(tiled_copy, thr, x_row, c, chunk, pred, NEG_INF).load().to(Float32)
                state = _online_lse(state, x)
            # the writer reads the target logit (a line the CTA has likely just read) before the row
            # reduction, which hides its latency
            if writer != 0:
                if valid != 0:
                    x_t = x_row[t].to(Float32)
            m, s = rows_allreduce(state, _combine_lse, plan_, buffer, peers=peers)
        if writer != 0:
            if row < rows:
                lse, loss = Float32(0.0), Float32(0.0)  # an ignored row
                if t != ignore_index:
                    if valid == 0:
                        _compile.index_error("cross_entropy", "target", row, t, V)
                if valid != 0:
                    log_s = cute.math.log(s)
                    lse = m + log_s
                    loss = (m - x_t) + log_s  # lse - x_t without rounding lse first
                mLse[row] = lse
                mLoss[row] = loss.to(mLoss.element_type)

    @cute.jit
    def cross_entropy_host(stream: cuda.CUstream, pX: cute.Pointer, pT: cute.Pointer, pLse: cute.Pointer,
                           pLoss: cute.Pointer, rows: Int64, V: Int32, ignore_index: Int64, t_stride: Int64, *args):
        (mX,), _ = row_views((pX,), V, 1, plan_, args)
        mT = cute.make_tensor(pT, cute.make_layout((rows,), stride=(t_stride,)))
        mLse = cute.make_tensor(pLse, cute.make_layout((rows,)))
        mLoss = cute.make_tensor(pLoss, cute.make_layout((rows,)))
        cross_entropy_kernel(mX, mT, mLse, mLoss, rows, V, ignore_index, row_copy(dtype, plan_)).launch(
            **row_launch(rows, plan_, stream))

    return cross_entropy_host


def _valid_sum_factory(target_dtype, out_dtype, mode: str):
    """``mode`` "mean" (sum of losses / n_valid), "sum", or "count" (n_valid, no losses), in two stages,
    each in a fixed order (deterministic, no atomics): CTA p adds the losses of rows [p PART_ROWS,
    (p + 1) PART_ROWS) and counts their valid rows into partials (2, P); one CTA adds the P partials."""

    @cute.jit
    def cta_sums(total: Float32, count: Int32, reduce_total: cutlass.Constexpr):
        """(total, count) summed over the CTA's SUM_THREADS threads (row_allreduce: shuffles, then smem)."""
        smem = cutlass.memory.SmemAllocator()
        warps = cute.make_ordered_layout((1, SUM_THREADS // _reduce.WARP, 1), order=(2, 1, 0))  # (1, warps, 1)
        count_buffer = smem.allocate_tensor(Int32, warps, byte_alignment=16)
        (count,) = row_allreduce((count,), combine_sum, SUM_THREADS, count_buffer)
        if const_expr(reduce_total):
            sum_buffer = smem.allocate_tensor(Float32, warps, byte_alignment=16)
            (total,) = row_allreduce((total,), combine_sum, SUM_THREADS, sum_buffer)
        return total, count

    @cute.kernel
    def valid_partials_kernel(mLoss: Optional[cute.Tensor], mT: cute.Tensor, mPart: cute.Tensor, rows: Int64,
                              ignore_index: Int64):
        # mLoss: (N,) float32 (None for "count"); mT: (N,); mPart: (2, P) float32
        tidx, _, _ = cute.arch.thread_idx()
        p, _, _ = cute.arch.block_idx()
        total, count = Float32(0.0), Int32(0)
        for k in cutlass.range_constexpr(PART_ROWS // SUM_THREADS):  # independent loads, all in flight
            i = Int64(p) * PART_ROWS + k * SUM_THREADS + tidx
            if i < rows:
                if Int64(mT[i]) != ignore_index:
                    count += 1
                if const_expr(mode != "count"):
                    total += mLoss[i]  # ignored rows hold 0
        total, count = cta_sums(total, count, mode != "count")
        if tidx == 0:
            mPart[0, p] = total
            mPart[1, p] = Float32(count)  # exact: at most PART_ROWS

    @cute.kernel
    def valid_sum_kernel(mPart: cute.Tensor, mOut: cute.Tensor, parts: Int32):
        # mPart: (2, P) float32; mOut: (1,)
        tidx, _, _ = cute.arch.thread_idx()
        total, count = Float32(0.0), Int32(0)  # the count is exact, an int32 as in triton
        for j in cutlass.range(tidx, parts, SUM_THREADS, unroll=4):
            total += mPart[0, j]
            count += Int32(mPart[1, j])
        total, count = cta_sums(total, count, mode != "count")
        if tidx == 0:
            n_valid = Float32(count)
            out = n_valid
            if const_expr(mode == "mean"):
                out = total / n_valid  # 0 / 0 = NaN when every row is ignored, as in torch
            elif const_expr(mode == "sum"):
                out = total
            mOut[0] = out.to(mOut.element_type)

    @cute.jit
    def valid_sum_host(stream: cuda.CUstream, pLoss: Optional[cute.Pointer], pT: cute.Pointer, pPart: cute.Pointer,
                       pOut: cute.Pointer, rows: Int64, t_stride: Int64, ignore_index: Int64, parts: Int32):
        mLoss = None
        if const_expr(pLoss is not None):
            mLoss = cute.make_tensor(pLoss, cute.make_layout((rows,)))
        mT = cute.make_tensor(pT, cute.make_layout((rows,), stride=(t_stride,)))
        mPart = cute.make_tensor(pPart, cute.make_layout((2, parts), stride=(parts, 1)))
        mOut = cute.make_tensor(pOut, cute.make_layout((1,)))
        valid_partials_kernel(mLoss, mT, mPart, rows, ignore_index).launch(
            grid=[parts, 1, 1], block=[SUM_THREADS, 1, 1], stream=stream)
        valid_sum_kernel(mPart, mOut, parts).launch(grid=[1, 1, 1], block=[SUM_THREADS, 1, 1], stream=stream)

    return valid_sum_host


def _cross_entropy_backward_factory(dtype, target_dtype, plan_, mean: bool):
    """The backward host function; ``mean``: g is divided by n_valid (a 0-d float32 tensor)."""
    chunk, vpt = plan_.chunk, plan_.vpt

    @cute.kernel
    def cross_entropy_backward_kernel(mX: cute.Tensor, mT: cute.Tensor, mLse: cute.Tensor, mdOut: cute.Tensor,
                                      mNValid: Optional[cute.Tensor], mdX: cute.Tensor, rows: Int64, V: Int32,
                                      ignore_index: Int64, tiled_copy: cute.TiledCopy):
        # mX, mdX: (V, (N,)); mT, mLse: (N,); mdOut: (N,), stride 0 for a mean or sum; mNValid: (1,) or None
        row, lane, thr, tXcX = row_thread(tiled_copy, plan_)
        x_row, dx_row = mX[None, (row,)], mdX[None, (row,)]
        t = Int64(ignore_index)
        n_write = Int32(0)  # columns to write: V, none for a row past the end
        if row < rows:
            t = Int64(mT[row])
            n_write = V
        g, lse, x_t = Float32(0.0), Float32(0.0), Float32(0.0)  # an ignored row: exp(0 - 0) * 0 = 0, unread
        n_read = Int32(0)
        if t != ignore_index:  # a valid row (an out-of-range target has lse NaN: dx NaN)
            n_read = V
            lse = mLse[row]
            g = mdOut[row].to(Float32)
            if const_expr(mean):
                g = g / mNValid[0]
            if t >= 0:
                if t < V:  # the target logit, read before the sweep: dx may be x itself (written in place)
                    x_t = x_row[t].to(Float32)
        first, count = chunk_range(V, plan_)  # the whole row, or this CTA's share (no reduction: no cluster)
        for c in cutlass.range(first, first + count, unroll=1):
            x = load_chunk(tiled_copy, thr, x_row, c, chunk, chunk_predicate(tXcX, n_read - c * chunk, vpt), 0.0)
            p = exp2f((x.load().to(Float32) - lse) * LOG2E)
            store_chunk(tiled_copy, thr, p * g, dx_row, c, chunk, chunk_predicate(tXcX, n_write - c * chunk, vpt))
        # The target column: (p - 1) g, stored over p g by the thread that stored p g there (the same
        # thread's stores to one address land in program order), in the CTA whose share holds it.
        if n_read > 0:
            if t >= 0:
                if t < V:
                    mine = Int32(1)
                    if const_expr(plan_.cluster > 1):
                        mine = Int32(0)
                        if t // chunk >= first:
                            if t // chunk < first + count:
                                mine = Int32(1)
                    if lane == Int32((t % chunk) // plan_.vec) % plan_.tpr and mine != 0:
                        p_t = exp2f((x_t - lse) * LOG2E)
                        dx_row[t] = ((p_t - 1.0) * g).to(dx_row.element_type)

    @cute.jit
    def cross_entropy_backward_host(stream: cuda.CUstream, pX: cute.Pointer, pT: cute.Pointer, pLse: cute.Pointer,
                                    pdOut: cute.Pointer, pNValid: Optional[cute.Pointer], pdX: cute.Pointer,
                                    rows: Int64, V: Int32, ignore_index: Int64, t_stride: Int64, dout_stride: Int64,
                                    *args):
        (mX, mdX), _ = row_views((pX, pdX), V, 1, plan_, args)
        mT = cute.make_tensor(pT, cute.make_layout((rows,), stride=(t_stride,)))
        mLse = cute.make_tensor(pLse, cute.make_layout((rows,)))
        mdOut = cute.make_tensor(pdOut, cute.make_layout((rows,), stride=(dout_stride,)))
        mNValid = None
        if const_expr(mean):
            mNValid = cute.make_tensor(pNValid, cute.make_layout((1,)))
        cross_entropy_backward_kernel(mX, mT, mLse, mdOut, mNValid, mdX, rows, V, ignore_index,
                                      row_copy(dtype, plan_)).launch(
            grid=row_grid(rows, plan_), block=[plan_.threads, 1, 1], stream=stream)

    return cross_entropy_backward_host


# ----------------------------------------------------------------------------- host

def _rows_of(op, tensors, share=0):
    """``(vec, plan, args)`` for the (N, V) tensors ``tensors`` (logits first), read row by row;
    ``share``: the most elements of a long row one CTA takes (``split_rows``; 0: fill the SMs only)."""
    N, V = tensors[0].shape
    check_sizes(op, "logits", tensors[0], V, N)
    row_strides = [(t.stride(0) if N > 1 else 0,) for t in tensors]
    col_strides = [t.stride(1) if V > 1 else 1 for t in tensors]
    vec = row_vector_width(tensors, V, row_strides, col_strides)
    # one chunk up to V = 16384, else chunks of 64 elements per thread; threads across rows for a
    # transposed logits (rows adjacent in memory); a few long rows: several CTAs per row (split_rows)
    across = N > 1 and all(c != 1 for c in col_strides) and all(s == 1 for (s,) in row_strides)
    plan_ = split_rows(plan(V, vec, col_strides, across=across), N, V, _reduce.sm_count(tensors[0].device), share,
                       tuning.launch("cross_entropy").cluster)
    return vec, plan_, row_arguments((N,), row_strides, col_strides)


def _valid_sum(loss, target, ignore_index, reduction, out):
    """``out`` (0-d) <- the mean or sum (``reduction``) of ``loss`` over the valid rows, or
    (reduction "count", loss None) n_valid."""
    pointer = _compile.pointer
    key = (_compile.DTYPES[target.dtype], _compile.DTYPES[out.dtype], reduction)
    parts = max(1, -(-target.shape[0] // PART_ROWS))  # no rows: one CTA, a mean of 0 / 0 = NaN
    partials = _compile.workspace((_valid_sum_factory, key), target, 2 * parts)  # (2, P) float32
    _compile.launch(_valid_sum_factory, key, _compile.stream(target.device),
                    None if loss is None else pointer(loss, 4), pointer(target, target.element_size()),
                    pointer(partials, 4), pointer(out, out.element_size()), target.shape[0], target.stride(0),
                    ignore_index, parts)
    return out


def _forward(logits, target, lse, loss, ignore_index):
    N, V = logits.shape
    vec, plan_, args = _rows_of("cross_entropy", (logits,))
    pointer = _compile.pointer
    _compile.launch(_cross_entropy_factory, (_compile.DTYPES[logits.dtype], _compile.DTYPES[target.dtype],
                                             _compile.DTYPES[loss.dtype], plan_),
                    _compile.stream(logits.device), pointer(logits, vec * logits.element_size()),
                    pointer(target, target.element_size()), pointer(lse, 4),
                    pointer(loss, loss.element_size()), N, V, ignore_index, target.stride(0), *args)


def _backward(logits, target, lse, dout, n_valid, dlogits, ignore_index, dout_stride):
    N, V = logits.shape
    # long rows over up to 8 CTAs each, whatever N: the backward combines nothing across a row, and
    # the extra CTAs keep more loads in flight (H100, 128-8192 rows of 32768-262144: 1-12% faster)
    vec, plan_, args = _rows_of("cross_entropy", (logits, dlogits), share=BACKWARD_SHARE)
    pointer, size = _compile.pointer, logits.element_size()
    _compile.launch(_cross_entropy_backward_factory,
                    (_compile.DTYPES[logits.dtype], _compile.DTYPES[target.dtype], plan_, n_valid is not None),
                    _compile.stream(logits.device), pointer(logits, vec * size), pointer(target, target.element_size()),
                    pointer(lse, 4), pointer(dout, size), None if n_valid is None else pointer(n_valid, 4),
                    pointer(dlogits, vec * size), N, V, ignore_index, target.stride(0), dout_stride, *args)


cross_entropy, cross_entropy_backward = _host.cross_entropy_ops(forward=_forward, backward=_backward,
                                                                  valid_sum=_valid_sum)
