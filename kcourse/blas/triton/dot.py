"""dot: z = x^T y = sum_i x_i * y_i for 1-D x, y of length n (any strides).

FLOPs: 2n. Bytes: 2n * itemsize read, plus one float32 per program.

A deterministic two-stage reduction, with no atomics, so every run gives the same bits:
  1. P programs; program p visits blocks p, p + P, p + 2P, ... (a grid-stride loop), keeps a
     float32 running sum per lane, and writes the sum of its lanes to partials[p];
  2. one program adds the P partials and rounds the total once to x's dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import BLOCK, NUM_WARPS, block_indices, cdiv, launch, next_power_of_2, sm_count

PROGRAMS_PER_SM = 4  # stage 1 launches this many programs per streaming multiprocessor


@triton.jit
def dot_partials_kernel(x_ptr, y_ptr, partials_ptr, n, x_stride, y_stride, step, BLOCK: tl.constexpr):
    # x, y: (n,); partials: (P,) float32; step = P * BLOCK, the stride of the grid-stride loop
    i = block_indices(BLOCK)  # (BLOCK,) int64: this program's first block
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, step):
        idx = start + i
        mask = idx < n
        x = tl.load(x_ptr + idx * x_stride, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + idx * y_stride, mask=mask, other=0.0).to(tl.float32)
        acc += x * y
    tl.store(partials_ptr + tl.program_id(0), tl.sum(acc, axis=0))


@triton.jit
def dot_finish_kernel(partials_ptr, out_ptr, num_partials, BLOCK: tl.constexpr):
    # partials: (num_partials,) float32, num_partials <= BLOCK; out: a 0-d tensor
    i = tl.arange(0, BLOCK)
    partials = tl.load(partials_ptr + i, mask=i < num_partials, other=0.0)
    tl.store(out_ptr, tl.sum(partials, axis=0).to(out_ptr.dtype.element_ty))


def dot(x, y):
    """``x^T y`` as a 0-d tensor of ``x.dtype``, accumulated in float32."""
    n = x.numel()
    programs = min(cdiv(n, BLOCK), PROGRAMS_PER_SM * sm_count(x.device))
    partials = torch.empty(programs, dtype=torch.float32, device=x.device)
    out = torch.empty((), dtype=x.dtype, device=x.device)
    launch(dot_partials_kernel, (programs,), x, y, partials, n, x.stride(0), y.stride(0), programs * BLOCK,
           BLOCK=BLOCK, num_warps=NUM_WARPS)
    launch(dot_finish_kernel, (1,), partials, out, programs, BLOCK=next_power_of_2(programs))
    return out
