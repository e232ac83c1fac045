"""rope: rotary position embedding of x (..., T, D), rotate-half convention.

With x1, x2 the two halves of the last dim and theta[t, i] = p_t * base^(-2i/D) (p = positions,
default 0..T-1):

    y  = [x1 cos(theta) - x2 sin(theta),  x2 cos(theta) + x1 sin(theta)]
    dx = [dy1 cos(theta) + dy2 sin(theta), dy2 cos(theta) - dy1 sin(theta)]   (rotation by -theta)

The backward is the forward kernel with ``sign = -1`` (sin negated).

One program per (block of BLOCK_N rows, position t): the leading dims of x flatten to N rows
(read through their strides with ``strided_offsets``, no copy), and the program computes the D/2
cos/sin values of its position once, on the fly, and applies them to its BLOCK_N rows. No
(T, D) table is stored. Angles: a float32 theta at position p is off by up to p * 2^-24 radians
(6e-5 at p = 1000), so the launcher passes the D/2 frequencies in full turns,
base^(-2i/D) / (2 pi), as float64; the kernel multiplies by p in float64, drops the whole turns
(exact), and takes float32 cos/sin of the remaining angle in [-pi, pi).
Bytes: 2 * numel * itemsize (read x, write y) plus T positions. FLOPs: 6 per pair. Memory bound.
"""
from __future__ import annotations

import math

import triton
import triton.language as tl

from .. import _host
from ._launch import cdiv, launch, next_power_of_2, strided_layout, strided_offsets

TWO_PI = tl.constexpr(2 * math.pi)
NUM_WARPS = 2  # with 1024-pair tiles: 133 us against 145-151 for 4 warps (H200, bf16, 2^27 elements, either layout)


@triton.jit
def rope_kernel(x_ptr, out_ptr, pos_ptr, turns_ptr, N, T, HALF, lead_shape, x_lead_strides, out_lead_strides,
                stride_xt, stride_xd, stride_ot, stride_od, stride_pos, sign,
                BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr):
    # x, out: (N, T, 2 * HALF) with the N leading rows at lead strides; pos: (T,); turns: (HALF,) float64
    pid = tl.program_id(0)
    t = (pid % T).to(tl.int64)
    rows = (pid // T).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) int64
    row_mask = rows < N
    p = t if pos_ptr is None else tl.load(pos_ptr + t * stride_pos)  # compile-time test: default 0..T-1
    x_rows = x_ptr + strided_offsets(rows, lead_shape, x_lead_strides)[:, None] + t * stride_xt  # (BLOCK_N, 1)
    out_rows = out_ptr + strided_offsets(rows, lead_shape, out_lead_strides)[:, None] + t * stride_ot
    for start in range(0, HALF, BLOCK_H):
        i = start + tl.arange(0, BLOCK_H)  # (BLOCK_H,) pair numbers
        turns = p.to(tl.float64) * tl.load(turns_ptr + i, mask=i < HALF, other=0.0)  # theta / (2 pi)
        turns = turns - tl.floor(turns + 0.5)  # in [-1/2, 1/2): exact in float64
        theta = turns.to(tl.float32) * TWO_PI
        cos, sin = tl.cos(theta)[None, :], sign * tl.sin(theta)[None, :]  # (1, BLOCK_H)
        mask = row_mask[:, None] & (i < HALF)[None, :]  # (BLOCK_N, BLOCK_H)
        x1 = tl.load(x_rows + i[None, :] * stride_xd, mask=mask).to(tl.float32)
        x2 = tl.load(x_rows + (i + HALF)[None, :] * stride_xd, mask=mask).to(tl.float32)
        y1, y2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        tl.store(out_rows + i[None, :] * stride_od, y1.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(out_rows + (i + HALF)[None, :] * stride_od, y2.to(out_ptr.dtype.element_ty), mask=mask)


def _rotate(x, out, positions, table, sign):
    """``out`` <- ``x`` (not empty) rotated by ``sign * theta``; ``table``: ``_rope.turns``."""
    T, D = x.shape[-2:]
    half = D // 2
    N = x.numel() // (T * D)  # rows: the leading dims, addressed through their strides
    lead_shape, (x_lead, out_lead) = strided_layout("rope", x[..., 0, 0], out[..., 0, 0])
    block_h = min(next_power_of_2(half), 128)
    block_n = min(next_power_of_2(N), max(1, 1024 // block_h))  # tiles of 1024 pairs (2 x 1024 elements)
    grid = (T * cdiv(N, block_n),)
    launch(rope_kernel, grid, x, out, positions, table, N, T, half, lead_shape, x_lead, out_lead,
           x.stride(-2), x.stride(-1), out.stride(-2), out.stride(-1),
           positions.stride(0) if positions is not None else 0, sign,
           BLOCK_N=block_n, BLOCK_H=block_h, num_warps=NUM_WARPS)


rope, rope_backward = _host.rope_ops(rotate=_rotate)
