"""embedding: out[n] = weight[indices[n]] for weight (V, D), out (*indices.shape, D).

Forward: a gather. One program per BLOCK_N tokens copies their rows of weight (any strides) into
the contiguous output, BLOCK_D columns at a time. An index outside [0, V) is an error: on the host
for CPU tensors (``_check.index_range``, an IndexError naming it), on a GPU a ``tl.device_assert`` in
the forward kernel, compiled in by launching it with ``debug=True`` (``sanitize_overflow=False``:
debug mode adds no other checks), one compare per token. Such an index is never dereferenced: were
the assert off, its output row would be NaN.
Bytes: N * D * itemsize read and written, plus the N indices. No FLOPs.

Backward: dweight[v] = sum of dout[n] over the n with indices[n] == v. Each program adds its
tokens' rows of dout into a float32 (V, D) accumulator with ``tl.atomic_add``, which is then
rounded once to weight's dtype. Repeated indices meet in the same accumulator row, so the order
of their float32 additions (and the last bits of the result) can differ between runs: the
backward is not bitwise deterministic. Tokens with an out-of-range index add nothing.
Bytes: N * D * itemsize read, plus V * D * 4 zeroed, accumulated, and rounded (the float32
accumulator is the weight's size in float32: the memory cost of this choice).

The indices are flattened with ``reshape(-1)`` and read through their stride: a copy only when an
index tensor of several dims cannot be viewed as 1-D (N integers, small next to the rows).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .. import _host
from ._launch import CHECKED, block_indices, cdiv, launch, next_power_of_2

NUM_WARPS = 4


@triton.jit
def embedding_kernel(idx_ptr, w_ptr, out_ptr, N, V, D, stride_idx, stride_wv, stride_wd,
                     BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    # idx: (N,) int32/int64, any stride; w: (V, D) any strides; out: (N, D) contiguous
    rows = block_indices(BLOCK_N)  # (BLOCK_N,) int64 token numbers
    row_mask = rows < N
    idx = tl.load(idx_ptr + rows * stride_idx, mask=row_mask, other=0).to(tl.int64)  # (BLOCK_N,)
    valid = (idx >= 0) & (idx < V)
    tl.device_assert(valid | ~row_mask, "embedding: an index is outside [0, V)")
    src = w_ptr + idx[:, None] * stride_wv  # (BLOCK_N, 1)
    dst = out_ptr + rows[:, None] * D
    for start in range(0, D, BLOCK_D):
        cols = start + tl.arange(0, BLOCK_D).to(tl.int64)  # (BLOCK_D,)
        mask = row_mask[:, None] & (cols < D)[None, :]  # (BLOCK_N, BLOCK_D)
        w = tl.load(src + cols[None, :] * stride_wd, mask=mask & valid[:, None], other=0.0).to(tl.float32)
        w = tl.where(valid[:, None], w, float("nan"))  # float32 holds every half value exactly
        tl.store(dst + cols[None, :], w.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def embedding_backward_kernel(idx_ptr, dout_ptr, acc_ptr, N, V, D, stride_idx,
                              BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    # idx: (N,), any stride; dout: (N, D) contiguous; acc: (V, D) float32, contiguous, zeroed
    rows = block_indices(BLOCK_N)  # (BLOCK_N,) int64
    idx = tl.load(idx_ptr + rows * stride_idx, mask=rows < N, other=-1).to(tl.int64)
    valid = (idx >= 0) & (idx < V)  # false for the rows past N too
    for start in range(0, D, BLOCK_D):
        cols = start + tl.arange(0, BLOCK_D).to(tl.int64)
        mask = valid[:, None] & (cols < D)[None, :]  # (BLOCK_N, BLOCK_D)
        dy = tl.load(dout_ptr + rows[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.atomic_add(acc_ptr + idx[:, None] * D + cols[None, :], dy, mask=mask, sem="relaxed")


def _tiling(N: int, D: int):
    """The grid and launch options: tiles of ~4096 elements, up to 1024 columns a step, the rest tokens."""
    block_d = min(next_power_of_2(D), 1024)
    block_n = max(1, 4096 // block_d)
    return (cdiv(N, block_n),), {"BLOCK_N": block_n, "BLOCK_D": block_d, "num_warps": NUM_WARPS}


def _gather(idx, weight, out):
    V, D = weight.shape
    grid, meta = _tiling(idx.numel(), D)
    launch(embedding_kernel, grid, idx, weight, out, idx.numel(), V, D, idx.stride(0), *weight.stride(), **meta,
           **CHECKED)


def _scatter_add(idx, dout, acc):
    V, D = acc.shape
    grid, meta = _tiling(idx.numel(), D)
    launch(embedding_backward_kernel, grid, idx, dout, acc, idx.numel(), V, D, idx.stride(0), **meta)


embedding, embedding_backward = _host.embedding_ops(gather=_gather, scatter_add=_scatter_add)
