"""The softmax and log_softmax kernels on the CuTe DSL, forward and backward (a ``log`` flag picks
the formula), over the rows of ``_rows`` (how rows are numbered, threads laid over a row, a long
row spread over a cluster of CTAs, the online logsumexp and the reductions: its module doc).

Math (one row x of N elements, m = max_j x_j, s = sum_j exp(x_j - m), all in float32):

    softmax      y = exp(x - m) / s                 dx = y (dy - sum_j dy_j y_j)
    log_softmax  y = (x - m) - log s                dx = dy - exp(y) sum_j dy_j

FLOPs ~5 per element forward, 3-4 backward. Bytes, itemsize b: forward 2Nb per row (read x, write
y), backward 3Nb (read y and dy, write dx) for rows kept on chip; a longer row is read twice
(3Nb forward, 5Nb backward). Memory bound: the kernels aim at copy bandwidth.

In the one-pass forward the exponentials stay in registers: y = exp(x - m_t) * (exp(m_t - m) / s)
with m_t the thread's own max: one exp per element (plus one per thread). A row kept in registers
by one CTA takes its max, then the sum of exp(x - max) (two reductions); a row over a cluster, or
rows across a CTA's threads, one reduction of (max, sum) pairs. A staged share (16-bit rows past
131072 columns, ``_rows.Plan.staged``) is read into registers once (softmax) or a vector at a time,
twice (log_softmax). Rows longer than the cluster keeps are swept twice: an online logsumexp, then y.

Launch choices: ``LAUNCH`` (``kcourse.blas.tuning``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from .. import tuning
from .._layout import strided_layout
from . import _compile, _reduce
from ._elementwise import coordinate
from ._rows import (CLUSTER_MAX, CLUSTER_MAX_SM90, FORWARD_ROW_THREADS, LOG2E, MAX_ONE_PASS, NEG_INF, THREADS, VALUES,
                    Plan, check_sizes, chunk_lse, chunk_predicate, chunk_range, cluster_buffer, cluster_started,
                    combine_lse, combine_max, combine_sum, exp2f, load_chunk, online_lse, plan, reduce_staged,
                    reduction_buffer, row_arguments, row_copy, row_launch, row_thread, row_vector_width, row_views,
                    rows_allreduce, shift_of, split_rows, spread_row, stage_chunk, staging_buffer, store_chunk,
                    store_staged, to_registers)

BACKWARD_THREADS = 512  # the backward's CTAs over rows kept in registers, at most VALUES elements a thread


@dataclass(frozen=True)
class Launch:
    """The launch choices of the softmax and log_softmax kernels: each op's table
    (``kcourse.blas.tuning``: ``launch("softmax")``, ``override("log_softmax", ...)``). Every field
    reaches the compile key through the ``Plan``.

    - ``cluster``: CTAs per row (a thread block cluster, sm_90+), forward and backward. None (the
      default): ``split_rows``'s rule (rows longer than one CTA keeps in registers, where that pays);
      an int: that many wherever a row has as many vectors, short rows included (1: a CTA per row).
    - ``row_threads``: the forward's CTA for a row kept in registers that exactly fills 256 threads
      (``spread_row``); default ``FORWARD_ROW_THREADS`` (512), 256: not spread.
    - ``backward_threads``: the backward's CTA over rows kept in registers, at most ``VALUES``
      elements a thread; default ``BACKWARD_THREADS`` (512: twice the rows of 256, the same work a
      thread); 256: as the forward.
    - ``staged``: the forward's rows longer than ``MAX_ONE_PASS`` (vector accesses, sm_90) over a
      cluster of up to 16 CTAs, each copying its share of up to ``MAX_ONE_PASS`` into shared memory
      (cp.async) and reading it from there twice (``split_rows``'s ``stage``). None (the default): the
      rule in ``softmax_rows`` (16-bit rows that 8 CTAs cannot keep in registers); a bool: always or never.
    """

    cluster: int | None = None
    row_threads: int = FORWARD_ROW_THREADS
    backward_threads: int = BACKWARD_THREADS
    staged: bool | None = None


LAUNCH = Launch()


@cute.jit
def _max_of(a: tuple, x) -> tuple:
    """(the max of a[0] and the elements of x,)"""
    return (cute.arch.fmax(a[0], x.reduce(cute.ReductionOp.MAX, init_val=NEG_INF, reduction_profile=0)),)


@cute.jit
def _exp_sum(x, shift):
    """sum exp(x - shift) over the elements of x."""
    return exp2f((x - shift) * LOG2E).reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)


@cute.jit
def _normalized(x, m, log_s, inv_s, log: cutlass.Constexpr):
    """softmax's y = exp(x - m) / s, or (``log``) log_softmax's (x - m) - log s, from the row's (m, s)."""
    return (x - m) - log_s if const_expr(log) else exp2f((x - m) * LOG2E) * inv_s


def _softmax_factory(log: bool, dtype, rank: int, plan_: Plan):
    """The forward host function: y = softmax(x) (``log``: log_softmax) along rows of ``rank``
    merged row dims, as ``plan_`` covers them."""
    chunk, vpt = plan_.chunk, plan_.vpt
    # a row in one CTA, kept in registers: its max, then the sum of exp(x - max), two plain reductions
    # (the (max, sum) pairs of one reduction wait for two exp2 at each of its levels: 0.4-1.2% slower at
    # 1024 and 16384 columns, level at 4096 and 8192; benchmarks/experiments/softmax_reductions.py)
    two = plan_.one_pass and plan_.cluster == 1 and not plan_.across

    @cute.kernel
    def softmax_kernel(mX: cute.Tensor, mY: cute.Tensor, sizes: list, M: Int64, N: Int32,
                       tiled_copy: cute.TiledCopy):
        # mX, mY: (N, (row dims)); sizes: the row dims but the outermost, innermost first
        buffer, peers = reduction_buffer(plan_, 2, 2 if two else 1), cluster_buffer(plan_, 2)
        sX = staging_buffer(plan_, mX.element_type)
        cluster_started(plan_, peers)
        row, lane, thr, tXcX = row_thread(tiled_copy, plan_)
        crd = coordinate(row, sizes)
        x_row, y_row = mX[None, crd], mY[None, crd]
        n = Int32(0)  # columns to read: none for a row past the end
        if row < M:
            n = N
        first, count = chunk_range(N, plan_)  # one pass: (the cluster rank, 1)
        if const_expr(plan_.one_pass and not (plan_.staged and log)):
            pred = chunk_predicate(tXcX, n - first * chunk, vpt)
            if const_expr(plan_.staged):  # softmax: the share through shared memory, its exponentials kept
                x = to_registers(tiled_copy, stage_chunk(mX.element_type, plan_, lane, x_row, first, pred, sX), pred,
                                 NEG_INF).load().to(Float32)
            else:
                x = load_chunk(tiled_copy, thr, x_row, first, chunk, pred, NEG_INF).load().to(Float32)
            if const_expr(two):  # (rows past M: m = -inf, e = 0; never stored)
                (m,) = rows_allreduce((x.reduce(cute.ReductionOp.MAX, init_val=NEG_INF, reduction_profile=0),),
                                      combine_max, plan_, buffer, 0)
                e = exp2f((x - shift_of(m)) * LOG2E)
                (s,) = rows_allreduce((e.reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0),),
                                      combine_sum, plan_, buffer, 1)
                if const_expr(log):
                    y = (x - m) - cute.math.log(s)
                else:
                    y = e * (1.0 / s)
            else:  # a row over a cluster, or rows across a CTA's threads: one reduction of (max, sum) pairs
                m_t, s_t, e = chunk_lse(x)
                m, s = rows_allreduce((m_t, s_t), combine_lse, plan_, buffer, peers=peers)
                if const_expr(log):
                    y = (x - m) - cute.math.log(s)
                else:
                    scale = Float32(0.0)  # a thread of -inf only holds e = 0
                    if m_t != Float32(NEG_INF):
                        scale = exp2f((m_t - m) * LOG2E)
                    y = e * (scale / s)
            store_chunk(tiled_copy, thr, y, y_row, first, chunk, pred)
        else:  # swept in chunks; or (staged log_softmax) this CTA's one chunk in shared memory, read from there
            tXsX = None  # (this thread's slice of it: its max, then its sum of exponentials, then y)
            state = (Float32(NEG_INF), Float32(0.0))
            if const_expr(plan_.staged):
                on = chunk_predicate(tXcX, n - first * chunk, vpt)
                tXsX = stage_chunk(mX.element_type, plan_, lane, x_row, first, on, sX)
                (m_t,) = reduce_staged(tXsX, on, vpt, _max_of, (Float32(NEG_INF),))
                shift = shift_of(m_t)
                state = (m_t, reduce_staged(tXsX, on, vpt, lambda a, x: (a[0] + _exp_sum(x, shift),), (Float32(0.0),))[0])
            else:
                for c in cutlass.range(first, first + count, unroll=1):
                    pred = chunk_predicate(tXcX, n - c * chunk, vpt)
                    x = load_chunk(tiled_copy, thr, x_row, c, chunk, pred, NEG_INF).load().to(Float32)
                    state = online_lse(state, x)
            m, s = rows_allreduce(state, combine_lse, plan_, buffer, peers=peers)
            log_s = cute.math.log(s)
            inv_s = 1.0 / s

            if const_expr(plan_.staged):
                store_staged(tiled_copy, thr, tXsX, y_row, first, chunk, on, vpt,
                             lambda x: _normalized(x, m, log_s, inv_s, log))
            else:
                for c in cutlass.range(first, first + count, unroll=1):
                    pred = chunk_predicate(tXcX, n - c * chunk, vpt)
                    x = load_chunk(tiled_copy, thr, x_row, c, chunk, pred, 0.0).load().to(Float32)
                    store_chunk(tiled_copy, thr, _normalized(x, m, log_s, inv_s, log), y_row, c, chunk, pred)

    @cute.jit
    def softmax_host(stream: cuda.CUstream, pX: cute.Pointer, pY: cute.Pointer, M: Int64, N: Int32, *args):
        (mX, mY), sizes = row_views((pX, pY), N, rank, plan_, args)
        softmax_kernel(mX, mY, sizes, M, N, row_copy(dtype, plan_)).launch(
            **row_launch(M, plan_, stream))

    return softmax_host


def _softmax_backward_factory(log: bool, dtype, rank: int, plan_: Plan):
    """The backward host function: dx from (y, dy) for softmax (``log``: log_softmax)."""
    chunk, vpt = plan_.chunk, plan_.vpt

    @cute.jit
    def row_term(y, dy):
        # what the row sum adds up: dy y (softmax) or dy (log_softmax)
        return dy if const_expr(log) else dy * y

    @cute.jit
    def grad(y, dy, total):
        return dy - exp2f(y * LOG2E) * total if const_expr(log) else y * (dy - total)

    @cute.kernel
    def softmax_backward_kernel(mY: cute.Tensor, mdY: cute.Tensor, mdX: cute.Tensor, sizes: list, M: Int64,
                                N: Int32, tiled_copy: cute.TiledCopy):
        # mY, mdY, mdX: (N, (row dims)); sizes as in softmax_kernel
        buffer, peers = reduction_buffer(plan_, 1), cluster_buffer(plan_, 1)
        cluster_started(plan_, peers)
        row, lane, thr, tXcX = row_thread(tiled_copy, plan_)
        crd = coordinate(row, sizes)
        y_row, dy_row, dx_row = mY[None, crd], mdY[None, crd], mdX[None, crd]
        n = Int32(0)
        if row < M:
            n = N
        first, count = chunk_range(N, plan_)
        if const_expr(plan_.one_pass):
            pred = chunk_predicate(tXcX, n - first * chunk, vpt)
            y = load_chunk(tiled_copy, thr, y_row, first, chunk, pred, 0.0).load().to(Float32)
            dy = load_chunk(tiled_copy, thr, dy_row, first, chunk, pred, 0.0).load().to(Float32)
            part = row_term(y, dy).reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)
            (total,) = rows_allreduce((part,), combine_sum, plan_, buffer, peers=peers)
            store_chunk(tiled_copy, thr, grad(y, dy, total), dx_row, first, chunk, pred)
        else:
            part = Float32(0.0)
            for c in cutlass.range(first, first + count, unroll=1):
                pred = chunk_predicate(tXcX, n - c * chunk, vpt)
                dy = load_chunk(tiled_copy, thr, dy_row, c, chunk, pred, 0.0).load().to(Float32)
                y = dy
                if const_expr(not log):
                    y = load_chunk(tiled_copy, thr, y_row, c, chunk, pred, 0.0).load().to(Float32)
                part += row_term(y, dy).reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)
            (total,) = rows_allreduce((part,), combine_sum, plan_, buffer, peers=peers)
            for c in cutlass.range(first, first + count, unroll=1):
                pred = chunk_predicate(tXcX, n - c * chunk, vpt)
                y = load_chunk(tiled_copy, thr, y_row, c, chunk, pred, 0.0).load().to(Float32)
                dy = load_chunk(tiled_copy, thr, dy_row, c, chunk, pred, 0.0).load().to(Float32)
                store_chunk(tiled_copy, thr, grad(y, dy, total), dx_row, c, chunk, pred)

    @cute.jit
    def softmax_backward_host(stream: cuda.CUstream, pY: cute.Pointer, pdY: cute.Pointer, pdX: cute.Pointer,
                              M: Int64, N: Int32, *args):
        (mY, mdY, mdX), sizes = row_views((pY, pdY, pdX), N, rank, plan_, args)
        softmax_backward_kernel(mY, mdY, mdX, sizes, M, N, row_copy(dtype, plan_)).launch(
            **row_launch(M, plan_, stream))

    return softmax_backward_host


def launch_rows(op: str, factory, inputs: list[torch.Tensor], dim: int, log: bool, share: int,
                threads: int = THREADS, spread: int = THREADS, cluster: int | None = None,
                most: int = CLUSTER_MAX, stage: bool = False) -> torch.Tensor:
    """Run ``factory``'s kernel (forward or backward) over the rows along ``dim`` of the same-shape
    ``inputs``; returns the output, a new tensor laid out like ``inputs[0]`` (triton's launch_rows).
    ``share``: the most elements of a long row a CTA should keep in registers (``split_rows``);
    ``threads``: a CTA's threads where rows are kept in registers, at most ``VALUES`` a thread;
    ``spread``: the threads a row kept in registers that fills a CTA is spread over (``spread_row``);
    ``cluster``: CTAs per row instead of ``split_rows``'s rule (``Launch.cluster``); ``most``: that rule's
    largest cluster for a row's shares to fit; ``stage``: its shares staged in shared memory."""
    out = torch.empty_like(inputs[0])
    if out.numel() == 0:
        return out
    tensors = (*inputs, out)
    planned = rows_plan(op, factory, tuple(_compile.Operand.of(t) for t in tensors), dim, log, share, threads,
                        spread, _reduce.sm_count_of(out.get_device()), _compile.target(), cluster, most, stage)
    if planned is None:  # more than 4 row dims that do not merge (a permuted view of 6+ dims): copy
        return launch_rows(op, factory, [t.contiguous() for t in inputs], dim, log, share, threads, spread, cluster,
                           most, stage)
    key, align, numbers = planned
    _compile.launch(factory, key, _compile.stream_of(out), *(_compile.pointer(t, align) for t in tensors), *numbers)
    return out


@_compile.plan_cache
def rows_plan(op: str, factory, tensors: tuple, dim: int, log: bool, share: int, threads: int, spread: int, sms: int,
              arch: str, cluster: int | None, most: int = CLUSTER_MAX, stage: bool = False) -> tuple | None:
    """``(key, align, numbers)`` of ``launch_rows``'s launch for ``tensors`` (the inputs and the
    output, as ``_compile.Operand``s): the compile key, the bytes each pointer promises, the numbers
    after the pointers; None where the row dims do not merge into 4 (the caller copies). ``arch``:
    the target, which the planning reads (so that a plan made for another is not reused)."""
    dim %= len(tensors[0].shape)
    rows_of = [_compile.Operand(t.shape[:dim] + t.shape[dim + 1:], t.strides[:dim] + t.strides[dim + 1:], t.dtype,
                                t.misalignment) for t in tensors]  # the operands' first rows (select(dim, 0))
    try:
        row_shape, row_strides = strided_layout(op, *rows_of)
    except ValueError:
        return None
    out = tensors[-1]
    M, N = out.numel() // out.shape[dim], out.shape[dim]
    check_sizes(op, "x", tensors[0], N, M)
    if M == 1:  # a single row: its row stride is never used (strided_layout reports 1), so no constraint
        row_strides = [(0,)] * len(tensors)
    col_strides = [t.stride(dim) if N > 1 else 1 for t in tensors]  # the stride of a dim of size 1 is never used
    vec = row_vector_width(tensors, N, row_strides, col_strides)
    # rows adjacent in memory and strided columns (a softmax along dim 0, say): threads across rows
    across = M > 1 and all(c != 1 for c in col_strides) and all(s[-1] == 1 for s in row_strides)
    plan_ = split_rows(plan(N, vec, col_strides, across=across), M, N, sms, share, cluster, most=most, stage=stage)
    if threads != THREADS and plan_.one_pass and plan_.cluster == 1 and not plan_.across \
            and plan_.vpt * plan_.vec <= VALUES:
        plan_ = plan_._replace(threads=threads)  # more rows a CTA, the same work a thread: see the module doc
    plan_ = spread_row(plan_, N, spread)
    key = (log, _compile.DTYPES[out.dtype], len(row_shape), plan_)
    return key, vec * out.element_size(), (M, N, *row_arguments(row_shape, row_strides, col_strides))


def softmax_rows(op: str, x: torch.Tensor, dim: int, log: bool):
    """The cute ``softmax``/``log_softmax`` forward: ``(y, (y,))``."""
    launch = tuning.launch(op)
    # clusters of 16 for float32 rows past 8 shares (read once: 0.79 -> 0.95 of quack's time at 512 x
    # 262144); 16-bit ones gained nothing forward (docs/softmax.md)
    # 16-bit rows past 8 shares kept in registers (over 131072): staged, over up to 16 CTAs (docs/softmax.md)
    long = x.dim() > 0 and x.shape[dim] > CLUSTER_MAX * MAX_ONE_PASS
    stage = x.element_size() == 2 and long if launch.staged is None else launch.staged
    y = launch_rows(op, _softmax_factory, [x], dim, log, share=MAX_ONE_PASS, spread=launch.row_threads,
                    cluster=launch.cluster, most=CLUSTER_MAX_SM90 if x.element_size() == 4 else CLUSTER_MAX,
                    stage=stage)
    return y, (y,)


def softmax_rows_backward(op: str, dy: torch.Tensor, cache, needs, dim: int, log: bool):
    """The cute ``softmax_backward``/``log_softmax_backward``: ``(dx,)`` (None if not needed)."""
    (y,) = cache
    launch = tuning.launch(op)
    # the backward holds y and dy: half the forward's share of a long row per CTA
    return (launch_rows(op, _softmax_backward_factory, [y, dy], dim, log, share=MAX_ONE_PASS // 2,
                        threads=launch.backward_threads, cluster=launch.cluster, most=CLUSTER_MAX_SM90)
            if needs[0] else None,)
