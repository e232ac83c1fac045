"""geru: out <- A + alpha * x y^T for A (m, n), x (m,), y (n,), on the CuTe DSL; out may be A itself.

FLOPs: 2mn. Bytes: (2mn + m + n) * itemsize (read A, write out): memory bound, so the kernel aims to
stream A in and out at full bandwidth with 128-bit loads and stores.

Design: an elementwise kernel over (m, n) with x and y broadcast. The host first turns the problem
so that out's contiguous dim is the second one (a column-major out is handled as out^T = A^T +
alpha y x^T), so every thread writes whole vectors along a row of out. Each CTA of 256 threads owns
a tile of out; it reads A's tile with one TiledCopy, writes out's with another, and predicates each
vector access at the tile's edges. The thread's alpha * x[i] (one per row) and y[j] (one per column)
sit in float32 register tensors whose layouts broadcast them over the thread's values (stride 0
along the other mode), so the update is one expression, a + (alpha x) y, rounded once. Three
layouts, picked on the host:

rows (A and out both have unit column stride)
    An (8, 32) grid of threads over a (32, 32 * VEC) tile: each thread owns one vector of VEC
    columns in UNROLL = 4 rows, 8 apart, so a warp reads and writes 512 contiguous bytes of a row.
    (With short rows, fewer threads per row and more rows per tile, so no lane idles.)
transposed (A column-major, out row-major: e.g. a geru on a transposed view into a fresh output)
    Each thread owns a VEC x VEC block. It reads it as VEC vectors down A's columns and writes it as
    VEC vectors along out's rows: the two TiledCopies take the same block with their values in
    opposite orders, and the transpose in between is only a register layout of strides (VEC, 1)
    over the loaded fragment. A warp is 4 threads along m by 8 along n: its loads are 64-byte runs
    of 8 columns, its stores 128-byte runs of 4 rows, both whole 32-byte sectors.
strided (anything else)
    The rows kernel with scalar accesses through layouts of dynamic strides.

The vector width is the widest that the addresses, the extents and the strides allow (128, 64 or 32
bits, checked on the host). Tiles are numbered along one grid axis (a second one would cap the count
at 65535); offsets are 64-bit, so A may hold more than 2^31 elements, while m and n must each be
below MAX_DIM.

Host time: the layout, the vector width and the transposition follow from (dtype, shape, A's and
out's strides and addresses modulo 16) and are worked out once per combination (``_plan``); the
transposition swaps x and y and reverses shapes and strides: it makes no views.
"""
from __future__ import annotations

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from . import _compile, _reduce

NUM_THREADS = 256
UNROLL = 4  # rows: rows per thread, so loads in flight per thread
MAX_DIM = 2**31 - 2**24  # m and n stay int32 with room for a tile past the end


def _geru_factory(dtype, layout: str, vec: int, threads_per_row: int):
    """The host function for ``layout`` ("rows", "transposed" or "strided", see the module doc) with
    accesses of ``vec`` elements; in rows, ``threads_per_row`` threads side by side along a row."""
    if layout == "transposed":
        tile = (8 * vec, 32 * vec)  # (m, n) of a CTA
        # values of the out fragment ((VEC, VEC), 1, 1): mode (p, q) is (column p, row q) of the block
        rows = [((0, q), 0, 0) for q in range(vec)]
        cols = [((p, 0), 0, 0) for p in range(vec)]
        row_stride, col_stride = ((0, 1), 0, 0), ((1, 0), 0, 0)
    else:
        thread_rows = NUM_THREADS // threads_per_row
        tile = (thread_rows * UNROLL, threads_per_row * vec)
        # values of the fragment ((VEC, 1), UNROLL, 1): VEC columns, UNROLL rows
        rows = [((0, 0), u, 0) for u in range(UNROLL)]
        cols = [((v, 0), 0, 0) for v in range(vec)]
        row_stride, col_stride = ((0, 0), 1, 0), ((1, 0), 0, 0)

    @cute.kernel
    def geru_kernel(mA: cute.Tensor, mX: cute.Tensor, mY: cute.Tensor, mOut: cute.Tensor, alpha: Float32,
                    copy_a: cute.TiledCopy, copy_out: cute.TiledCopy):
        # mA, mOut: (m, n); mX: (m,); mY: (n,)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        m, n = mA.shape
        tiles_n = cute.ceil_div(n, tile[1])
        coord = (bidx // tiles_n, bidx % tiles_n)  # this CTA's tile, numbered along rows of tiles
        cTile = cute.local_tile(cute.make_identity_tensor((m, n)), tile, coord)  # (row, column) coordinates
        thr_a, thr_out = copy_a.get_slice(tidx), copy_out.get_slice(tidx)
        tAgA = thr_a.partition_S(cute.local_tile(mA, tile, coord))
        tOgO = thr_out.partition_D(cute.local_tile(mOut, tile, coord))
        tOcO = thr_out.partition_D(cTile)
        rA = cute.make_rmem_tensor(tAgA.shape, mA.element_type)  # compact; values out of bounds are never stored
        cute.copy(copy_a, tAgA, rA, pred=_reduce.predicate(thr_a.partition_S(cTile), (m, n)))
        rOut = cute.make_rmem_tensor_like(tOgO)
        if const_expr(layout == "transposed"):  # rA's block as out's fragment sees it: a layout, no moves
            rA = cute.make_tensor(rA.iterator, cute.make_layout(rOut.shape, stride=((vec, 1), 0, 0)))
        # alpha * x[i] for each of the thread's rows, y[j] for each of its columns, broadcast by stride 0
        rX = cute.make_rmem_tensor(cute.make_layout(rOut.shape, stride=row_stride), Float32)
        rY = cute.make_rmem_tensor(cute.make_layout(rOut.shape, stride=col_stride), Float32)
        for r in cutlass.range_constexpr(len(rows)):
            i = tOcO[rows[r]][0]
            rX[rows[r]] = Float32(0.0)
            if i < m:
                rX[rows[r]] = alpha * mX[i].to(Float32)
        for c in cutlass.range_constexpr(len(cols)):
            j = tOcO[cols[c]][1]
            rY[cols[c]] = Float32(0.0)
            if j < n:
                rY[cols[c]] = mY[j].to(Float32)
        rOut.store((rA.load().to(Float32) + rX.load() * rY.load()).to(mOut.element_type))
        cute.copy(copy_out, rOut, tOgO, pred=_reduce.predicate(tOcO, (m, n)))

    @cute.jit
    def geru_host(pA: cute.Pointer, pX: cute.Pointer, pY: cute.Pointer, pOut: cute.Pointer, m: Int32, n: Int32,
                  a_row_stride: Int64, a_col_stride: Int64, x_stride: Int64, y_stride: Int64,
                  out_row_stride: Int64, out_col_stride: Int64, alpha: Float32, stream: cuda.CUstream):
        atom = _reduce.copy_atom(dtype, vec)
        if const_expr(layout == "transposed"):  # m, n, A's column and out's row strides multiples of VEC
            shape = (cute.assume(m, divby=vec), cute.assume(n, divby=vec))
            mA = cute.make_tensor(pA, cute.make_layout(shape, stride=(1, cute.assume(a_col_stride, divby=vec))))
            mOut = cute.make_tensor(pOut, cute.make_layout(shape, stride=(cute.assume(out_row_stride, divby=vec), 1)))
            # thread t: m-block t % 4 + 4 (t // 32 % 2), n-block t // 4 % 8 + 8 (t // 64): a warp is 4 x 8 blocks
            threads = cute.make_layout(((4, 2), (8, 4)), stride=((1, 32), (4, 64)))
            copy_a = cute.make_tiled_copy_tv(atom, threads, cute.make_layout((vec, vec)))  # vectors down columns
            copy_out = cute.make_tiled_copy_tv(atom, threads, cute.make_ordered_layout((vec, vec), order=(1, 0)))
        else:
            if const_expr(layout == "rows"):  # unit column strides, row strides and n multiples of VEC
                shape = (m, cute.assume(n, divby=vec))
                mA = cute.make_tensor(pA, cute.make_layout(shape, stride=(cute.assume(a_row_stride, divby=vec), 1)))
                out_stride = (cute.assume(out_row_stride, divby=vec), 1)
                mOut = cute.make_tensor(pOut, cute.make_layout(shape, stride=out_stride))
            else:
                mA = cute.make_tensor(pA, cute.make_layout((m, n), stride=(a_row_stride, a_col_stride)))
                mOut = cute.make_tensor(pOut, cute.make_layout((m, n), stride=(out_row_stride, out_col_stride)))
            threads = cute.make_ordered_layout((thread_rows, threads_per_row), order=(1, 0))  # neighbours along a row
            copy_a = copy_out = cute.make_tiled_copy_tv(atom, threads, cute.make_layout((1, vec)))
        mX = cute.make_tensor(pX, cute.make_layout((m,), stride=(x_stride,)))
        mY = cute.make_tensor(pY, cute.make_layout((n,), stride=(y_stride,)))
        tiles = cute.ceil_div(m, tile[0]) * cute.ceil_div(n, tile[1])
        geru_kernel(mA, mX, mY, mOut, alpha, copy_a, copy_out).launch(
            grid=[tiles, 1, 1], block=[NUM_THREADS, 1, 1], stream=stream)

    return geru_host


def _strides(shape: tuple, stride: tuple) -> tuple[int, int]:
    """The strides of a 2-D tensor, 0 for a dim of size 1 (its stride is never used)."""
    return tuple(s if d > 1 else 0 for s, d in zip(stride, shape))


def _layout(size: int, shape: tuple, a: tuple, o: tuple, addresses: tuple) -> tuple[str, int, int]:
    """``(layout, vec, threads_per_row)`` for A and out of this (m, n) ``shape``, ``size``-byte
    elements, strides ``a`` and ``o`` (0 for a dim of size 1) and addresses modulo 16, out's second
    dim being its contiguous one."""
    m, n = shape
    (a0, a1), (o0, o1) = a, o
    if o1 in (0, 1) and a1 in (0, 1):
        vec = _reduce.vector_width(size, addresses, (n, a0, o0))
        return "rows", vec, min(_reduce.WARP, _reduce.pow2_at_least(-(-n // vec)))  # enough to cover n
    if o1 in (0, 1) and a0 == 1:
        vec = _reduce.vector_width(size, addresses, (m, n, a1, o0))
        if vec > 1:
            return "transposed", vec, 0
    return "strided", 1, _reduce.WARP


@_compile.plan_cache
def _plan(dtype: torch.dtype, shape: tuple, a_stride: tuple, a_misalignment: int, out_stride: tuple,
          out_misalignment: int):
    """``(key, alignment of A and out, whether x and y swap, (m, n, A's strides), out's strides)``:
    the launch for A and out of ``dtype`` and ``shape`` at these strides and addresses modulo 16,
    as the kernel sees them (transposed for a column-major out); None for an empty A."""
    m, n = shape
    if m >= MAX_DIM or n >= MAX_DIM:
        raise ValueError(f"geru: A is {tuple(shape)}; the cute kernel takes at most {MAX_DIM - 1} rows "
                         "and columns (its element offsets are 64-bit, its row and column indices 32-bit)")
    if m == 0 or n == 0:
        return None
    a, o = _strides(shape, a_stride), _strides(shape, out_stride)
    swap = o[1] not in (0, 1) and o[0] == 1
    if swap:  # column-major out: out^T = A^T + alpha y x^T
        shape, a, o = (n, m), a[::-1], o[::-1]
    size = dtype.itemsize
    layout, vec, threads_per_row = _layout(size, shape, a, o, (a_misalignment, out_misalignment))
    return (_compile.DTYPES[dtype], layout, vec, threads_per_row), vec * size, swap, (*shape, *a), o


def geru(A, x, y, alpha, out):
    """``out <- A + alpha * x y^T``; returns ``out``."""
    a, o = A.data_ptr(), out.data_ptr()
    plan = _plan(A.dtype, A.shape, A.stride(), a % 16, out.stride(), o % 16)
    if plan is None:
        return out
    key, align, swap, dims, out_strides = plan
    if swap:
        x, y = y, x
    element, size = key[0], A.element_size()
    pointer = _compile.PointerArg
    _compile.launch(_geru_factory, key, pointer(a, element, align), pointer(x.data_ptr(), element, size),
                    pointer(y.data_ptr(), element, size), pointer(o, element, align), *dims,
                    x.stride()[0], y.stride()[0], *out_strides, alpha, _compile.stream_of(A))
    return out
