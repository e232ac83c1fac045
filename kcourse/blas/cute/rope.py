"""rope: rotary position embedding of x (..., T, D), rotate-half convention, on the CuTe DSL.

With x1, x2 the two halves of the last dim and theta[t, i] = p_t * base^(-2i/D) (p = positions,
default 0..T-1):

    y  = [x1 cos(theta) - x2 sin(theta),  x2 cos(theta) + x1 sin(theta)]
    dx = [dy1 cos(theta) + dy2 sin(theta), dy2 cos(theta) - dy1 sin(theta)]   (rotation by -theta)

The backward is the forward kernel with ``sign = -1`` (sin negated), a runtime argument.
Bytes: 2 * numel * itemsize (read x, write y) plus T positions. FLOPs: 6 per pair. Memory bound.

Layout. The leading dims flatten to N rows, merged by ``strided_layout`` (at most 4 dims that cannot
merge, read through their strides, no copy); T and D keep their own strides, so the transposed
(..., T, H, D) q/k of attention is read in place. x and out are CuTe tensors over

    (D, T, s_{r-1}, ..., s_0) : (d_D, d_T, d_{r-1}, ..., d_0)     innermost first
    -> zipped_divide by (VEC,):  ((VEC), (D / VEC, T, s_{r-1}, ..., s_0))

so column vector ``c < W = D / (2 VEC)`` of the first half and ``c + W`` of the second half are the
two operands of one rotation, moved by ``CopyUniversalOp`` atoms of ``VEC * bits`` bits: 16 bytes
when D has unit stride, D / 2, the other strides are multiples of VEC and the bases are 16-byte
aligned (checked on the host; 8, 4 bytes or single elements through dynamic strides otherwise).

Tiling. A CTA of 128 threads is a (SLOTS, LANES) grid: LANES threads side by side cover a row's W
vectors of each half (a power of two >= W, at most 32; more vectors are a loop). Each slot takes a
task (position t, row block b) and rotates ROWS rows b, b + B, ... at that position (ROWS = 1 here)
(B = ceil(N / ROWS) blocks per position; consecutive slots hold consecutive blocks, so at each step
they touch consecutive rows: contiguous memory for the (..., T, H, D) layout). A thread computes
the cos/sin of its VEC pairs once per task and column step and applies them to its ROWS rows; it
issues all 2 ROWS vector loads before any math, then rotates, rounds and stores row by row. The
loads are not predicated: a row past the last one is clamped to the last row (read again, not
stored); predicated loads cost ptxas ~50 more registers. On an H200 (2^27 elements, bfloat16, q's
layout or contiguous) 128 threads and ROWS = 1 take 146 us, 256 threads and ROWS = 2 160 us, 512
threads 158-211 us (float32: 270-281 us for 128 or 256 threads, any ROWS); triton's kernel takes
133 us and quack's 133-135 us there. Not the angles: over two runs (H200, 2026-11-29,
``benchmarks/experiments/cute_rope_angles.py``) this kernel took 144-149 us, with no angles computed
(cos = 1, sin = 0) 140-144, with them in float32 alone 145-148; triton's programs move twice the
bytes a thread (16 pairs against 8), but ROWS = 2 and 4 here took 142-155 and 146-156 us, 8 164-165. The grid
is ``ceil(T * B / SLOTS)`` CTAs (no limit on T); offsets are 64-bit.

Angles: a float32 theta at position p is off by up to p * 2^-24 radians (6e-5 at p = 1000), so the
launcher passes the D/2 frequencies in full turns, base^(-2i/D) / (2 pi), as float64 (as triton
does); the kernel multiplies by p in float64, drops the whole turns (exact), and takes cos and sin
of the remaining angle theta in [-pi, pi] with ``cos.approx.f32`` / ``sin.approx.f32`` (one MUFU op
each; absolute error ~2^-21 on that range; with the float32 rounding of theta, |y - y_exact| <~
1e-6 (|x1| + |x2|), well inside float32's tolerance of 1e-5 + 1e-5 |y| for unit-scale inputs).
libdevice's accurate ``sinf``/``cosf`` carry a Payne-Hanek slow path for huge arguments that,
though never taken here, took the kernel to 212-234 registers. The float64 work is 4 operations per
pair and task (~5% of the H100's FP64 rate at full bandwidth).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float64, Int32, Int64, const_expr

from .._layout import strided_layout
from .. import _host
from . import _compile, _reduce
from ._elementwise import coordinate

THREADS = 128
ROWS = 1  # rows per task: each cos/sin serves this many rows (more measured slower, see the doc)
TWO_PI = 2 * math.pi


def _view(pointer, d: Int32, t: Int32, lead: list, strides: list, vec: int) -> cute.Tensor:
    """x or out as ``((VEC), (D / VEC, T, s_{r-1}, ..., s_0))``; ``lead`` row-major (outermost first),
    ``strides`` = (d_D, d_T, *lead strides); d_D is the constant 1 when VEC > 1."""
    d_stride, t_stride, *lead_strides = strides
    if const_expr(vec > 1):  # multiples of VEC (host-checked): every vector is aligned
        d = cute.assume(d, divby=vec)
        t_stride = cute.assume(t_stride, divby=vec)
        lead_strides = [cute.assume(s, divby=vec) for s in lead_strides]
    layout = cute.make_layout((d, t, *reversed(lead)), stride=(d_stride, t_stride, *reversed(lead_strides)))
    return cute.zipped_divide(cute.make_tensor(pointer, layout), (vec,))


def rope_kernel(dtype: torch.dtype, pos_dtype: torch.dtype | None, rank: int, vec: int, lanes: int, rows: int):
    """The host function rotating a ``dtype`` x with ``rank`` merged leading dims, ``vec`` elements per
    access, ``lanes`` threads per row, ``rows`` rows per task; positions of ``pos_dtype`` (None: 0..T-1)."""
    element = _compile.DTYPES[dtype]
    slots = THREADS // lanes
    passed = 2 + rank if vec == 1 else 1 + rank  # strides per tensor (d_D is 1 when VEC > 1)

    @cute.kernel
    def kernel(mX: cute.Tensor, mOut: cute.Tensor, mPos: Optional[cute.Tensor], mTurns: cute.Tensor, sizes: list,
               n_rows: Int64, n_pos: Int64, width: Int32, sign: Float32):
        # mX, mOut: ((VEC), (2W, T, s_{r-1}, ..., s_0)); mPos: (T,) or None; mTurns: (D/2,) float64;
        # sizes: the leading extents but the outermost, innermost first (Int64); W = width
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane, slot = tidx % lanes, tidx // lanes
        atom = _reduce.copy_atom(element, vec)
        blocks = (n_rows + rows - 1) // rows  # row blocks per position
        task = Int64(bidx) * slots + slot
        if task < n_pos * blocks:
            t = task // blocks
            first = task - t * blocks
            p = Float64(t)
            if const_expr(mPos is not None):
                p = Float64(Int64(mPos[t]))
            # rows first, first + B, ...: each row's coordinate, clamped to the last row, so that every
            # load reads inside x (a row past the end is read again and not stored)
            lead = [coordinate(cutlass.min(first + k * blocks, n_rows - 1), sizes) for k in range(rows)]
            for c in cutlass.range(lane, width, lanes, unroll=1):
                cos, sin = _angles(mTurns, p, c, sign, vec)
                x1 = cute.make_rmem_tensor(cute.make_layout((vec, rows)), element)  # (VEC, ROWS)
                x2 = cute.make_rmem_tensor(cute.make_layout((vec, rows)), element)
                for k in cutlass.range_constexpr(rows):  # every load first (unpredicated) ...
                    cute.copy(atom, mX[None, (c, t, *lead[k])], x1[None, k])
                    cute.copy(atom, mX[None, (c + width, t, *lead[k])], x2[None, k])
                y1 = cute.make_rmem_tensor(cute.make_layout((vec,)), element)
                y2 = cute.make_rmem_tensor(cute.make_layout((vec,)), element)
                for k in cutlass.range_constexpr(rows):  # ... then row by row: rotate, round, store
                    if first + k * blocks < n_rows:
                        a, b = x1[None, k].load().to(Float32), x2[None, k].load().to(Float32)
                        y1.store((a * cos - b * sin).to(element))
                        y2.store((b * cos + a * sin).to(element))
                        cute.copy(atom, y1, mOut[None, (c, t, *lead[k])])
                        cute.copy(atom, y2, mOut[None, (c + width, t, *lead[k])])

    @cute.jit
    def host(stream: cuda.CUstream, pX: cute.Pointer, pOut: cute.Pointer, pPos, pTurns: cute.Pointer,
             d: Int32, n_pos: Int32, pos_stride: Int64, sign: Float32, grid: Int32, *args):
        # args: the leading extents (rank, outermost first, Int64), then x's and out's strides
        lead, args = args[:rank], args[rank:]
        x_strides, out_strides = args[:passed], args[passed:]
        if const_expr(vec > 1):
            x_strides, out_strides = (1, *x_strides), (1, *out_strides)
        mX = _view(pX, d, n_pos, lead, x_strides, vec)
        mOut = _view(pOut, d, n_pos, lead, out_strides, vec)
        mPos = None
        if const_expr(pPos is not None):
            mPos = cute.make_tensor(pPos, cute.make_layout((n_pos,), stride=(pos_stride,)))
        mTurns = cute.make_tensor(pTurns, cute.make_layout((d // 2,)))
        n_rows = lead[0]
        for size in lead[1:]:
            n_rows *= size
        sizes = list(reversed(lead[1:]))
        kernel(mX, mOut, mPos, mTurns, sizes, n_rows, Int64(n_pos), d // (2 * vec), sign).launch(
            grid=[grid, 1, 1], block=[THREADS, 1, 1], stream=stream)

    return host


def _angles(mTurns: cute.Tensor, p: Float64, c, sign: Float32, vec: int):
    """cos and ``sign * sin`` of the angles of pairs ``c VEC .. c VEC + VEC - 1`` at position ``p``, as
    (VEC,) float32 fragments."""
    cos = cute.make_rmem_tensor(cute.make_layout((vec,)), Float32)
    sin = cute.make_rmem_tensor(cute.make_layout((vec,)), Float32)
    for j in range(vec):  # a plain helper (not preprocessed by the DSL): a Python loop, unrolled
        turns = p * mTurns[c * vec + j]  # theta / (2 pi), float64
        turns = turns - cute.math.floor(turns + 0.5)  # in [-1/2, 1/2): exact
        theta = Float32(turns) * TWO_PI  # in [-pi, pi]
        cos[j] = cute.math.cos(theta, approx=True)
        sin[j] = sign * cute.math.sin(theta, approx=True)
    return cos.load(), sin.load()


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _rotate(x, out, positions, table, sign):
    """``out`` <- ``x`` (not empty) rotated by ``sign * theta``; ``table``: ``_rope.turns``."""
    T, D = x.shape[-2:]
    half = D // 2
    N = x.numel() // (T * D)  # rows: the leading dims, addressed through their strides
    lead, (x_lead, out_lead) = strided_layout("rope", x[..., 0, 0], out[..., 0, 0])
    if N == 1:  # no leading dims: their strides are never used
        x_lead = out_lead = (0,)
    x_t, out_t = (x.stride(-2), out.stride(-2)) if T > 1 else (0, 0)
    vec = 1
    if x.stride(-1) == 1 and out.stride(-1) == 1:
        vec = _reduce.vector_width(x.element_size(), addresses=(x.data_ptr(), out.data_ptr()),
                                   counts=(half, x_t, out_t, *x_lead, *out_lead))
    width = half // vec
    lanes = min(_reduce.WARP, _reduce.pow2_at_least(width))
    rows = min(ROWS, N)
    grid = _ceil(T * _ceil(N, rows), THREADS // lanes)  # tasks (position, row block) / slots per CTA
    x_strides = (x_t, *x_lead) if vec > 1 else (x.stride(-1), x_t, *x_lead)
    out_strides = (out_t, *out_lead) if vec > 1 else (out.stride(-1), out_t, *out_lead)
    pos = None if positions is None else _compile.pointer(positions, positions.element_size())
    key = (x.dtype, None if positions is None else positions.dtype, len(lead), vec, lanes, rows)
    _compile.launch(rope_kernel, key, _compile.stream(x.device), _compile.pointer(x, vec * x.element_size()),
                    _compile.pointer(out, vec * out.element_size()), pos,
                    _compile.PointerArg(table.data_ptr(), Float64, 8), D, T,
                    0 if positions is None else positions.stride(0), sign, grid, *lead, *x_strides, *out_strides)


rope, rope_backward = _host.rope_ops(rotate=_rotate)
