"""dot: z = x^T y = sum_i x_i * y_i for 1-D x, y of length n (any strides), on the CuTe DSL.

FLOPs: 2n. Bytes: 2n * itemsize read, plus 4 bytes per CTA of float32 partial sums.

Design: a deterministic two-stage reduction (no atomics: the same bits on every run of a GPU).

1. ``dot_partials_kernel``: P = min(tiles, 4 * SMs) CTAs of 256 threads. CTA b visits the tiles
   b, b + P, b + 2P, ... (a grid-stride loop) of TILE = 256 * VEC * UNROLL elements. A 1-D TiledCopy
   hands thread t the UNROLL vectors of VEC elements at t * VEC + j * 256 * VEC, j < UNROLL: at VEC =
   16 bytes / itemsize each is one 128-bit load, and a warp's loads cover 512 contiguous bytes. All
   of a tile's loads are issued before any product is formed, so they are in flight together. Each
   thread adds its tile's products to a float32 running sum; at the end the CTA sums its threads
   (``_reduce.group_sum``: shuffles, then shared memory) and writes partials[b].
2. ``dot_finish_kernel``: one CTA adds the P partials, always in the same order, plus the few
   elements the vector body left out, and rounds the total once to x's dtype.

Vectorizing needs x and y of stride 1 whose addresses agree modulo the vector's size in bytes. The
host takes the widest such vector and splits x and y into a head of fewer than VEC elements (so that
the body starts on a vector boundary), a body of a multiple of VEC elements (so that no vector
straddles the end), and a tail of fewer than VEC; stage 2 adds the head and the tail. Any other
layout (a stride, or x and y misaligned differently) runs the same kernels with scalar loads through
a layout of dynamic strides. n and every offset are 64-bit, so x may hold more than 2^31 elements.

Host time: the split, the grid and the key follow from (dtype, n, strides, addresses modulo 16,
device) and are worked out once per combination (``_plan``); the partial sums live in a workspace
kept per stream (``_compile.workspace``), so a call allocates only its 0-d result.
"""
from __future__ import annotations

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from . import _compile, _reduce

NUM_THREADS = 256
UNROLL = 4  # vectors per thread per tile: loads in flight per thread
CTAS_PER_SM = 4  # stage 1 grid: this many CTAs per streaming multiprocessor


def _dot_factory(dtype, vec: int):
    """The host function for x, y of ``dtype`` read ``vec`` elements at a time (``vec == 1``: any strides)."""
    tile = NUM_THREADS * vec * UNROLL

    @cute.kernel
    def dot_partials_kernel(mX: cute.Tensor, mY: cute.Tensor, mPartials: cute.Tensor, n: Int64,
                            tiled_copy: cute.TiledCopy):
        # mX, mY: (n,), the vector body (n a multiple of VEC); mPartials: (P,) float32, one per CTA
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        num_ctas, _, _ = cute.arch.grid_dim()
        buffer = _reduce.reduction_buffer(NUM_THREADS // _reduce.WARP)
        thr = tiled_copy.get_slice(tidx)
        tXcX = thr.partition_S(cute.make_identity_tensor((tile,)))  # ((VEC, 1), UNROLL): tile-local indices
        total = Float32(0.0)  # this thread's products, summed over its tiles
        for t in cutlass.range(bidx, Int32((n + tile - 1) // tile), num_ctas, unroll=1):
            start = Int64(t) * tile  # 64-bit: the coordinate below keeps local_tile's offset 64-bit too
            tXgX = thr.partition_S(cute.local_tile(mX, (tile,), (Int64(t),)))  # ((VEC, 1), UNROLL)
            tXgY = thr.partition_S(cute.local_tile(mY, (tile,), (Int64(t),)))
            # One predicate per vector: n is a multiple of VEC, so a vector is wholly in or out.
            tXpX = cute.make_rmem_tensor((1, UNROLL), cutlass.Boolean)
            for j in cutlass.range_constexpr(UNROLL):
                tXpX[0, j] = tXcX[(0, 0), j][0] < n - start
            rX = cute.make_rmem_tensor_like(tXgX)
            rY = cute.make_rmem_tensor_like(tXgY)
            rX.fill(0.0)  # vectors past the end stay 0 and add nothing
            rY.fill(0.0)
            cute.copy(tiled_copy, tXgX, rX, pred=tXpX)
            cute.copy(tiled_copy, tXgY, rY, pred=tXpX)
            products = rX.load().to(Float32) * rY.load().to(Float32)
            total += products.reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)
        total = _reduce.group_sum(total, NUM_THREADS, buffer)
        if tidx == 0:
            mPartials[bidx] = total

    @cute.kernel
    def dot_finish_kernel(mPartials: cute.Tensor, num_partials: Int32, mX: cute.Tensor, mY: cute.Tensor,
                          head: Int32, body: Int64, num_extra: Int32, mOut: cute.Tensor):
        # mPartials: (P,) float32; mX, mY: (n,), all of x and y; mOut: (1,)
        # The extra elements are the head [0, head) and the tail [head + body, n): num_extra in all.
        tidx, _, _ = cute.arch.thread_idx()
        buffer = _reduce.reduction_buffer(NUM_THREADS // _reduce.WARP)
        total = Float32(0.0)
        for i in cutlass.range(tidx, num_partials, NUM_THREADS, unroll=1):
            total += mPartials[i]
        if const_expr(vec > 1):  # with vec == 1 the body is all of x: there are no extras
            if tidx < num_extra:
                i = Int64(tidx)
                if tidx >= head:
                    i = i + body  # a tail element
                total += mX[i].to(Float32) * mY[i].to(Float32)
        total = _reduce.group_sum(total, NUM_THREADS, buffer)
        if tidx == 0:
            mOut[0] = total.to(mOut.element_type)

    @cute.jit
    def dot_host(pXb: cute.Pointer, pYb: cute.Pointer, pX: cute.Pointer, pY: cute.Pointer,
                 pPartials: cute.Pointer, pOut: cute.Pointer, n: Int64, head: Int32, body: Int64,
                 x_stride: Int64, y_stride: Int64, num_ctas: Int32, stream: cuda.CUstream):
        # pXb, pYb: x and y from their body's first element (aligned to a whole vector when vec > 1)
        if const_expr(vec > 1):
            body_layout = cute.make_layout((cute.assume(body, divby=vec),), stride=(1,))
            mXb = cute.make_tensor(pXb, body_layout)
            mYb = cute.make_tensor(pYb, body_layout)
            mX = cute.make_tensor(pX, cute.make_layout((n,), stride=(1,)))
            mY = cute.make_tensor(pY, cute.make_layout((n,), stride=(1,)))
        else:  # the body is all of x, at any strides
            mXb = mX = cute.make_tensor(pX, cute.make_layout((n,), stride=(x_stride,)))
            mYb = mY = cute.make_tensor(pY, cute.make_layout((n,), stride=(y_stride,)))
        mPartials = cute.make_tensor(pPartials, cute.make_layout((num_ctas,)))
        mOut = cute.make_tensor(pOut, cute.make_layout((1,)))
        tiled_copy = cute.make_tiled_copy_tv(_reduce.copy_atom(dtype, vec), cute.make_layout(NUM_THREADS),
                                             cute.make_layout(vec))
        dot_partials_kernel(mXb, mYb, mPartials, body, tiled_copy).launch(
            grid=[num_ctas, 1, 1], block=[NUM_THREADS, 1, 1], stream=stream)
        dot_finish_kernel(mPartials, num_ctas, mX, mY, head, body, Int32(n - body), mOut).launch(
            grid=[1, 1, 1], block=[NUM_THREADS, 1, 1], stream=stream)

    return dot_host


def _split(size: int, n: int, x_stride: int, y_stride: int, x_misalignment: int,
           y_misalignment: int) -> tuple[int, int]:
    """``(vec, head)`` for x, y of ``n`` elements of ``size`` bytes at these strides and addresses
    modulo 16: the vector width of the body and the elements before it (see the module doc)."""
    if x_stride != 1 or y_stride != 1:
        return 1, 0
    vec = _reduce.VECTOR_BYTES // size
    while vec > 1:
        span = vec * size  # bytes per vector (a divisor of 16): x and y must sit at the same offset modulo it
        if x_misalignment % span == y_misalignment % span:
            head = (-x_misalignment % span) // size
            if n - head >= vec:  # at least one whole vector
                return vec, head
        vec //= 2
    return 1, 0


@_compile.plan_cache
def _plan(dtype: torch.dtype, shape: tuple, x_stride: tuple, y_stride: tuple, x_misalignment: int,
          y_misalignment: int, device: torch.device):
    """``(key, body alignment, head in bytes, P, numbers)``: the launch for x and y of ``dtype`` and
    ``shape`` (1-D) at these strides and addresses modulo 16 on ``device``; P is the stage-1 grid,
    ``numbers`` the arguments after the pointers."""
    (n,), (xs,), (ys,) = shape, x_stride, y_stride
    size = dtype.itemsize
    vec, head = _split(size, n, xs, ys, x_misalignment, y_misalignment)
    body = (n - head) // vec * vec  # elements the vector kernel reads
    tiles = -(-body // (NUM_THREADS * vec * UNROLL))
    num_ctas = max(1, min(tiles, CTAS_PER_SM * _reduce.sm_count(device)))
    return (_compile.DTYPES[dtype], vec), vec * size, head * size, num_ctas, (n, head, body, xs, ys, num_ctas)


def dot(x, y):
    """``x^T y`` as a 0-d tensor of ``x.dtype``, accumulated in float32."""
    xp, yp = x.data_ptr(), y.data_ptr()
    key, align, head, num_ctas, numbers = _plan(x.dtype, x.shape, x.stride(), y.stride(), xp % 16, yp % 16,
                                                x.device)
    partials = _compile.workspace((_dot_factory, key), x, num_ctas)  # stage 1's sums: float32 (P,)
    out = x.new_empty(())
    element, size = key[0], x.element_size()
    pointer = _compile.PointerArg
    _compile.launch(_dot_factory, key,
                    pointer(xp + head, element, align), pointer(yp + head, element, align),  # the bodies
                    pointer(xp, element, size), pointer(yp, element, size),
                    pointer(partials.data_ptr(), cutlass.Float32, 4), pointer(out.data_ptr(), element, size),
                    *numbers, _compile.stream_of(x))
    return out
