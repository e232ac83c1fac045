"""gemv: out <- alpha * A x + beta * y for A (m, n), x (n,), y (m,), on the CuTe DSL; out may be y itself.

FLOPs: 2mn. Bytes: (mn + n + 2m) * itemsize: reading A dominates, so gemv is memory bound and the
kernels aim to stream A at full bandwidth with 128-bit loads.

Design: two kernels, one per orientation of A, picked on the host from A's strides.

rows (A.stride(1) == 1: row-major, or any layout without a unit stride down the columns)
    Each row is a dot product along contiguous memory. A CTA of 256 threads is a (ROWS, TPR) grid
    of threads: TPR = 32 threads (one warp) per row and 8 rows per CTA; fewer threads per row (and
    more rows) when rows are short, so that no lane idles; all 256 threads on one row when m < 8.
    The CTA walks its rows' columns STEP = TPR * VEC * UNROLL at a time: a TiledCopy gives each
    thread UNROLL vectors of VEC elements of its row, and a second TiledCopy with the same threads
    reads x through a (ROWS, n) view with row stride 0 (x broadcast to every row: an L1 hit for all
    but the first). Each thread adds its products to a float32 running sum; at the end a row's
    threads add their sums with warp shuffles (through shared memory when TPR = 256).

cols (A.stride(0) == 1: a transposed view A = B.mT of a row-major B)
    Coalescing runs along m, so a thread owns VEC consecutive rows i and sums over columns j:
    out[i:i+VEC] += A[i:i+VEC, j] * x[j]. A CTA is a (256 / LANES, LANES) grid of threads: LANES =
    32 neighbours (fewer when m is small) cover 32 * VEC consecutive rows, one 512-byte load of
    column j, and the other threads take other columns, UNROLL each per step. x[j] is one scalar
    per column, broadcast over the vector by a register tensor of stride 0. At the end the partial
    sums for the same rows are added across the warp by butterfly shuffles, then across the warps
    in shared memory, and one thread per row adds up the warps' sums.

Split-n: a gemv with few row blocks (a short or transposed A) would leave most SMs idle, so the
columns are split into S chunks and CTA (b, s) handles chunk s of row block b; each writes float32
partial sums to a (S, m) workspace and ``gemv_finish_kernel`` adds the S partials of each row in
a fixed order (deterministic, no atomics) and applies alpha and beta. With one chunk the main kernel
applies them itself. Either way the sum is rounded once, at the end.

Vector widths are checked on the host (16-byte aligned A, and n, the row stride a multiple of
VEC for rows; m and the column stride for cols); otherwise a kernel for 64- or 32-bit or scalar
accesses is compiled, and rows with a non-unit column stride go through a layout of dynamic
strides. Offsets are 64-bit (A may hold more than 2^31 elements); m and n must each be below
MAX_DIM. With beta == 0, y is None: the kernels are compiled without it and never read it.

Host time: the orientation, vector widths, split and key follow from (dtype, shape, strides,
addresses modulo 16, device) and are worked out once per combination (``_plan``); the split's
partial sums live in a workspace kept per stream (``_compile.workspace``).
"""
from __future__ import annotations

from typing import Optional

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from . import _compile, _reduce

NUM_THREADS = 256
UNROLL = 4  # vectors per thread per step: loads in flight per thread
CTAS_PER_SM = 4  # split n until the grid has about this many CTAs per SM
MIN_STEPS = 4  # ... but give every chunk at least this many steps of work
FINISH_UNROLL = 8  # the partial sums' reduction: loads in flight per thread
MAX_DIM = 2**31 - 2**24  # m and n stay int32 with room for a step past the end


def _epilogue(acc: Float32, row, split, alpha: Float32, beta: Float32, mY: Optional[cute.Tensor],
              mOut: cute.Tensor, mPartials: Optional[cute.Tensor]):
    """Row ``row``'s float32 sum ``acc``: its partial (split) or ``alpha * acc + beta * y``, rounded once."""
    if const_expr(mPartials is not None):
        mPartials[split, row] = acc
    else:
        result = alpha * acc
        if const_expr(mY is not None):
            result += beta * mY[row].to(Float32)
        mOut[row] = result.to(mOut.element_type)


@cute.kernel
def gemv_finish_kernel(mPartials: cute.Tensor, mY: Optional[cute.Tensor], mOut: cute.Tensor,
                       alpha: Float32, beta: Float32):
    # mPartials: (S, m) float32; mY, mOut: (m,). One thread per row, FINISH_UNROLL loads in flight
    # (a bias gradient's m = 768 rows are three CTAs, each thread summing S = 128 partials)
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    splits, m = mPartials.shape
    row = bidx * NUM_THREADS + tidx
    if row < m:
        acc = Float32(0.0)
        for s in cutlass.range(splits, unroll=FINISH_UNROLL):
            acc += mPartials[s, row]
        _epilogue(acc, row, 0, alpha, beta, mY, mOut, None)


def _launch_finish(mPartials, mY, mOut, alpha, beta, m, stream):
    """Launch ``gemv_finish_kernel`` over the m rows: one thread per row."""
    gemv_finish_kernel(mPartials, mY, mOut, alpha, beta).launch(
        grid=[cute.ceil_div(m, NUM_THREADS), 1, 1], block=[NUM_THREADS, 1, 1], stream=stream)


def _vectors(pY, pOut, pPartials, m: Int32, splits: Int32, y_stride: Int64, out_stride: Int64):
    """The (m,) tensors y (None when beta == 0) and out, and the (S, m) float32 workspace (None unsplit)."""
    mOut = cute.make_tensor(pOut, cute.make_layout((m,), stride=(out_stride,)))
    mY = mPartials = None
    if const_expr(pY is not None):
        mY = cute.make_tensor(pY, cute.make_layout((m,), stride=(y_stride,)))
    if const_expr(pPartials is not None):
        mPartials = cute.make_tensor(pPartials, cute.make_layout((splits, m), stride=(Int64(m), 1)))
    return mY, mOut, mPartials


# ----------------------------------------------------------------------------- rows: A.stride(1) == 1

def _rows_factory(dtype, vec: int, x_vec: int, threads_per_row: int, has_y: bool, split: bool):
    """A host function for A read ``vec`` elements at a time along its rows (``vec == 1``: any
    strides) and x ``x_vec`` at a time (0: x has a stride other than 1); ``threads_per_row``
    threads reduce each row. ``has_y`` and ``split`` (y given, n split) only key the cache: they
    show in which of the host function's pointers are None."""
    rows = NUM_THREADS // threads_per_row  # rows per CTA
    step = threads_per_row * vec * UNROLL  # columns per step

    @cute.kernel
    def gemv_rows_kernel(mA: cute.Tensor, mX: cute.Tensor, mY: Optional[cute.Tensor], mOut: cute.Tensor,
                         mPartials: Optional[cute.Tensor], alpha: Float32, beta: Float32, chunk: Int32,
                         copy_a: cute.TiledCopy, copy_x: cute.TiledCopy):
        # mA: (m, n); mX: (rows, n), x with row stride 0; mY, mOut: (m,); mPartials: (S, m) float32
        tidx, _, _ = cute.arch.thread_idx()
        block, split, _ = cute.arch.block_idx()  # rows [block * rows, ...), columns of chunk `split`
        buffer = _reduce.reduction_buffer(NUM_THREADS // _reduce.WARP)
        m, n = mA.shape
        begin = split * chunk
        end = cutlass.min(n, begin + chunk)
        thr_a, thr_x = copy_a.get_slice(tidx), copy_x.get_slice(tidx)
        cA = cute.make_identity_tensor((m, n))  # (row, column) of every element, for predicates
        total = Float32(0.0)  # this thread's products, summed over its steps
        for k in cutlass.range(begin // step, cute.ceil_div(end, step), unroll=1):
            tAgA = thr_a.partition_S(cute.local_tile(mA, (rows, step), (block, k)))  # ((VEC, 1), 1, UNROLL)
            tXgX = thr_x.partition_S(cute.local_tile(mX, (rows, step), (0, k)))
            tAcA = thr_a.partition_S(cute.local_tile(cA, (rows, step), (block, k)))
            tXcX = thr_x.partition_S(cute.local_tile(cA, (rows, step), (block, k)))
            rA = cute.make_rmem_tensor_like(tAgA)
            rX = cute.make_rmem_tensor_like(tXgX)
            rA.fill(0.0)  # out of bounds: zeros, which add nothing
            rX.fill(0.0)
            cute.copy(copy_a, tAgA, rA, pred=_reduce.predicate(tAcA, (m, end)))
            cute.copy(copy_x, tXgX, rX, pred=_reduce.predicate(tXcX, (m, end)))
            x = rX.load().to(Float32).reshape(rA.shape)  # same elements in the same order as rA's
            total += (rA.load().to(Float32) * x).reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)
        total = _reduce.group_sum(total, threads_per_row, buffer)
        row = block * rows + tidx // threads_per_row
        if tidx % threads_per_row == 0:
            if row < m:
                _epilogue(total, row, split, alpha, beta, mY, mOut, mPartials)

    @cute.jit
    def gemv_rows_host(pA: cute.Pointer, pX: cute.Pointer, pY: Optional[cute.Pointer], pOut: cute.Pointer,
                       pPartials: Optional[cute.Pointer], m: Int32, n: Int32, a_row_stride: Int64,
                       a_col_stride: Int64, x_stride: Int64, y_stride: Int64, out_stride: Int64,
                       alpha: Float32, beta: Float32, chunk: Int32, splits: Int32, stream: cuda.CUstream):
        if const_expr(vec > 1):  # rows start 16-byte aligned and n is a multiple of VEC
            mA = cute.make_tensor(pA, cute.make_layout((m, cute.assume(n, divby=vec)),
                                                       stride=(cute.assume(a_row_stride, divby=vec), 1)))
        else:
            mA = cute.make_tensor(pA, cute.make_layout((m, n), stride=(a_row_stride, a_col_stride)))
        if const_expr(x_vec > 0):
            mX = cute.make_tensor(pX, cute.make_layout((rows, cute.assume(n, divby=x_vec)), stride=(0, 1)))
        else:
            mX = cute.make_tensor(pX, cute.make_layout((rows, n), stride=(0, x_stride)))
        mY, mOut, mPartials = _vectors(pY, pOut, pPartials, m, splits, y_stride, out_stride)
        threads = cute.make_ordered_layout((rows, threads_per_row), order=(1, 0))  # thread t: row t // TPR
        values = cute.make_layout((1, vec))  # each access: VEC consecutive columns
        copy_a = cute.make_tiled_copy_tv(_reduce.copy_atom(dtype, vec), threads, values)
        copy_x = cute.make_tiled_copy_tv(_reduce.copy_atom(dtype, max(x_vec, 1)), threads, values)
        gemv_rows_kernel(mA, mX, mY, mOut, mPartials, alpha, beta, chunk, copy_a, copy_x).launch(
            grid=[cute.ceil_div(m, rows), splits, 1], block=[NUM_THREADS, 1, 1], stream=stream)
        if const_expr(split):
            _launch_finish(mPartials, mY, mOut, alpha, beta, m, stream)

    return gemv_rows_host


# ----------------------------------------------------------------------------- cols: A.stride(0) == 1

def _cols_factory(dtype, vec: int, lanes: int, has_y: bool, split: bool):
    """A host function for A = B.mT (B row-major) read ``vec`` rows at a time along its columns, by
    ``lanes`` threads side by side along m (a power of two up to a warp); ``has_y`` and ``split``
    as for ``_rows_factory``."""
    groups = NUM_THREADS // lanes  # groups of threads, each on its own columns
    block_m = lanes * vec  # rows per CTA
    step = groups * UNROLL  # columns per step
    warps = NUM_THREADS // _reduce.WARP

    @cute.kernel
    def gemv_cols_kernel(mB: cute.Tensor, mX: cute.Tensor, mY: Optional[cute.Tensor], mOut: cute.Tensor,
                         mPartials: Optional[cute.Tensor], alpha: Float32, beta: Float32, chunk: Int32,
                         copy_b: cute.TiledCopy):
        # mB: (n, m) = A^T, row-major; mX: (n,); mY, mOut: (m,); mPartials: (S, m) float32
        tidx, _, _ = cute.arch.thread_idx()
        block, split, _ = cute.arch.block_idx()  # rows [block * block_m, ...) of A, chunk `split` of columns
        n, m = mB.shape
        begin = split * chunk
        end = cutlass.min(n, begin + chunk)
        thr = copy_b.get_slice(tidx)
        cB = cute.make_identity_tensor((n, m))
        acc = cute.make_rmem_tensor(vec, Float32)  # this thread's sums for its VEC rows
        acc.fill(0.0)
        # x[j] for this thread's UNROLL columns, broadcast over the VEC rows by a stride-0 layout
        rX = cute.make_rmem_tensor(cute.make_layout(((vec, 1), UNROLL, 1), stride=((0, 0), 1, 0)), Float32)
        for k in cutlass.range(begin // step, cute.ceil_div(end, step), unroll=1):
            tBgB = thr.partition_S(cute.local_tile(mB, (step, block_m), (k, block)))  # ((VEC, 1), UNROLL, 1)
            tBcB = thr.partition_S(cute.local_tile(cB, (step, block_m), (k, block)))
            rB = cute.make_rmem_tensor_like(tBgB)
            rB.fill(0.0)
            cute.copy(copy_b, tBgB, rB, pred=_reduce.predicate(tBcB, (end, m)))
            for u in cutlass.range_constexpr(UNROLL):
                j = tBcB[(0, 0), u, 0][0]  # this thread's u-th column
                rX[0, u, 0] = Float32(0.0)
                if j < end:
                    rX[0, u, 0] = mX[j].to(Float32)
            products = rB.load().to(Float32) * rX.load()  # ((VEC, 1), UNROLL, 1)
            acc.store(acc.load() + products.reduce(cute.ReductionOp.ADD, init_val=0.0,
                                                   reduction_profile=(None, 1, 1)).reshape(acc.shape))
        # Threads lane, lane + lanes, lane + 2 lanes, ... of a warp hold sums for the same rows: add
        # them with butterfly shuffles over the lane bits above `lanes` ...
        for level in cutlass.range_constexpr((_reduce.WARP // lanes).bit_length() - 1):
            for v in cutlass.range_constexpr(vec):
                acc[v] = acc[v] + cute.arch.shuffle_sync_bfly(acc[v], offset=lanes << level)
        # ... then the warps meet in shared memory, (warps, block_m) floats, and one thread adds up each row.
        smem = cutlass.memory.SmemAllocator()
        sAcc = smem.allocate_tensor(Float32, cute.make_ordered_layout((warps, block_m), order=(1, 0)),
                                    byte_alignment=16)
        warp, lane = tidx // _reduce.WARP, tidx % _reduce.WARP
        if lane < lanes:
            for v in cutlass.range_constexpr(vec):
                sAcc[warp, lane * vec + v] = acc[v]
        cute.arch.barrier()
        if tidx < block_m:
            total = Float32(0.0)
            for w in cutlass.range_constexpr(warps):
                total += sAcc[w, tidx]
            row = block * block_m + tidx
            if row < m:
                _epilogue(total, row, split, alpha, beta, mY, mOut, mPartials)

    @cute.jit
    def gemv_cols_host(pA: cute.Pointer, pX: cute.Pointer, pY: Optional[cute.Pointer], pOut: cute.Pointer,
                       pPartials: Optional[cute.Pointer], m: Int32, n: Int32, a_col_stride: Int64,
                       x_stride: Int64, y_stride: Int64, out_stride: Int64, alpha: Float32, beta: Float32,
                       chunk: Int32, splits: Int32, stream: cuda.CUstream):
        # B = A^T: (n, m), row-major with row stride a_col_stride (A's stride between columns)
        if const_expr(vec > 1):
            mB = cute.make_tensor(pA, cute.make_layout((n, cute.assume(m, divby=vec)),
                                                       stride=(cute.assume(a_col_stride, divby=vec), 1)))
        else:
            mB = cute.make_tensor(pA, cute.make_layout((n, m), stride=(a_col_stride, 1)))
        mX = cute.make_tensor(pX, cute.make_layout((n,), stride=(x_stride,)))
        mY, mOut, mPartials = _vectors(pY, pOut, pPartials, m, splits, y_stride, out_stride)
        threads = cute.make_ordered_layout((groups, lanes), order=(1, 0))  # `lanes` neighbours along m
        copy_b = cute.make_tiled_copy_tv(_reduce.copy_atom(dtype, vec), threads, cute.make_layout((1, vec)))
        gemv_cols_kernel(mB, mX, mY, mOut, mPartials, alpha, beta, chunk, copy_b).launch(
            grid=[cute.ceil_div(m, block_m), splits, 1], block=[NUM_THREADS, 1, 1], stream=stream)
        if const_expr(split):
            _launch_finish(mPartials, mY, mOut, alpha, beta, m, stream)

    return gemv_cols_host


# ----------------------------------------------------------------------------- host

def _splits(blocks: int, n: int, step: int, device: torch.device) -> tuple[int, int]:
    """``(S, chunk)``: how many chunks of columns (each a multiple of ``step``) to give each of the
    ``blocks`` row blocks so that the grid fills the GPU."""
    want = CTAS_PER_SM * _reduce.sm_count(device)
    splits = 1 if blocks >= want else max(1, min(-(-want // blocks), -(-n // (MIN_STEPS * step))))
    per_split = -(-max(n, 1) // splits)
    chunk = -(-per_split // step) * step  # a whole number of steps
    return max(1, -(-n // chunk)), chunk


@_compile.plan_cache
def _plan(dtype: torch.dtype, shape: tuple, a_stride: tuple, a_misalignment: int, x_stride: tuple,
          x_misalignment: int, has_y: bool, device: torch.device):
    """``(factory, key, alignments of A and x, S, (m, n, A's strides, x's stride), (chunk, S))``: the
    launch for A of ``dtype`` and ``shape`` (m, n) at these strides and address modulo 16, x
    likewise, on ``device`` (None for m == 0: nothing to do); S is the number of column chunks (a
    partial-sum workspace (S, m) when S > 1)."""
    m, n = shape
    if m >= MAX_DIM or n >= MAX_DIM:
        raise ValueError(f"gemv: A is {tuple(shape)}; the cute kernel takes at most {MAX_DIM - 1} rows "
                         "and columns (its element offsets are 64-bit, its row and column indices 32-bit)")
    if m == 0:
        return None
    size, element = dtype.itemsize, _compile.DTYPES[dtype]
    s0 = a_stride[0] if m > 1 else 0  # a stride of a dim of size 1 is never used
    s1 = a_stride[1] if n > 1 else 0
    (xs,) = x_stride
    if s0 == 1 and s1 != 1:  # column-major: coalesce along m
        vec = _reduce.vector_width(size, (a_misalignment,), (m, s1))
        lanes = min(_reduce.WARP, _reduce.pow2_at_least(-(-m // vec)))  # enough to cover m, at most a warp
        step = NUM_THREADS // lanes * UNROLL
        splits, chunk = _splits(-(-m // (lanes * vec)), n, step, device)
        return (_cols_factory, (element, vec, lanes, has_y, splits > 1), (vec * size, size), splits,
                (m, n, s1, xs), (chunk, splits))
    vec = _reduce.vector_width(size, (a_misalignment,), (n, s0)) if s1 in (0, 1) else 1
    x_vec = _reduce.vector_width(size, (x_misalignment,), (vec,)) if xs == 1 or n == 1 else 0
    threads_per_row = min(_reduce.WARP, _reduce.pow2_at_least(-(-n // (vec * UNROLL))))  # a step covers a row
    if threads_per_row == _reduce.WARP and m < NUM_THREADS // _reduce.WARP:
        threads_per_row = NUM_THREADS  # a few long rows: the whole CTA on each
    step = threads_per_row * vec * UNROLL
    splits, chunk = _splits(-(-m // (NUM_THREADS // threads_per_row)), n, step, device)
    return (_rows_factory, (element, vec, x_vec, threads_per_row, has_y, splits > 1),
            (vec * size, max(x_vec, 1) * size), splits, (m, n, s0, s1, xs), (chunk, splits))


def gemv(A, x, y, alpha, beta, out):
    """``out <- alpha * A x + beta * y`` (``y`` is None when ``beta == 0``); returns ``out``."""
    a, xp = A.data_ptr(), x.data_ptr()
    plan = _plan(A.dtype, A.shape, A.stride(), a % 16, x.stride(), xp % 16, y is not None, A.device)
    if plan is None:
        return out
    factory, key, (align_a, align_x), splits, dims, tail = plan
    element, size = key[0], A.element_size()
    pointer = _compile.PointerArg
    pY, y_stride = (None, 0) if y is None else (pointer(y.data_ptr(), element, size), y.stride()[0])
    partials = pPartials = None
    if splits > 1:  # the (S, m) float32 partial sums (referenced until the launch is made)
        partials = _compile.workspace((factory, key), A, splits * dims[0])
        pPartials = pointer(partials.data_ptr(), cutlass.Float32, 4)
    _compile.launch(factory, key, pointer(a, element, align_a), pointer(xp, element, align_x), pY,
                    pointer(out.data_ptr(), element, size), pPartials, *dims, y_stride, out.stride()[0],
                    alpha, beta, *tail, _compile.stream_of(A))
    return out
