"""embedding: out[n] = weight[indices[n]] for weight (V, D), out (*indices.shape, D), on the CuTe DSL.

Forward: a gather. Bytes: N * D * itemsize read and written, plus the N indices. No FLOPs.
An index outside [0, V) is an error: on the host for CPU tensors (``_check.index_range``, an
IndexError naming it), on the GPU inside the gather (``_compile.index_error``: the thread that
loads it prints the position and value and stops the grid; no host synchronization). Such an index
is never dereferenced.

Backward: dweight[v] = sum of dout[n] over the n with indices[n] == v. Each thread adds its tokens'
rows of dout, converted to float32, into a zeroed float32 (V, D) accumulator with ``red.global.add``
(fire-and-forget atomics in L2), which is then rounded once to weight's dtype: triton's choice.
Repeated indices meet in the same accumulator row in whatever order the CTAs run, so the last bits
of the result can differ between runs: not bitwise deterministic. Tokens with an out-of-range index
add nothing. Bytes: N * D * itemsize read, plus V * D * 4 zeroed, accumulated and rounded.

Layouts. Both kernels view the tables as CuTe tensors with the column first, split into vectors:

    weight (D, V) : (wd, wv)  ->  ((VEC), (D / VEC, V))      column vector c of row v: [None, (c, v)]
    out    (D, N) : (1, D)    ->  ((VEC), (D / VEC, N))      (contiguous, fresh)

so one ``CopyUniversalOp`` atom of ``VEC * bits`` bits moves 16 bytes (``ld/st.global.v4``) when
weight has unit column stride, a row stride and D that are multiples of VEC and 16-byte aligned
bases (checked on the host; 8, 4 bytes or single elements otherwise, through dynamic strides).
The float32 accumulator (D, V) : (1, D) is split into vectors of RED = min(VEC, 4) elements (single
ones below sm_90, where the vector atomics do not exist): one ``red.global.add.v4.f32`` per 16 bytes
of accumulator, two per 16-byte bfloat16 vector of dout.

Tiling. A CTA of 256 threads is a (SLOTS, LANES) grid: LANES threads side by side walk one token's
row, LANES = the vectors of a row rounded up to a power of two, at most 32 (a warp reads 512
contiguous bytes of a row at 16-byte vectors; short rows put several tokens in a warp instead of
idle lanes). Each slot owns ROWS = 4 tokens, ``SLOTS`` apart (consecutive slots hold consecutive
tokens, so consecutive output rows), loads their 4 indices once, then steps over the row LANES
vectors at a time; at each step it issues the 4 tokens' loads before any store (or atomic): 4
independent 16-byte loads in flight per thread. A CTA covers ``SLOTS * ROWS`` tokens; the grid is
``ceil(N / (SLOTS * ROWS))`` CTAs. Token numbers and row offsets are 64-bit (Int64), so outputs past
2^31 elements are addressed correctly.
"""
from __future__ import annotations

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from .. import _host
from . import _compile, _reduce

THREADS = 256
ROWS = 4  # tokens per thread: its loads in flight per step


def _lanes(width: int) -> int:
    """Threads per token for rows of ``width`` vectors: a power of two covering the row, at most a warp."""
    return min(_reduce.WARP, _reduce.pow2_at_least(width))


def _grid(tokens: int, lanes: int) -> int:
    return -(-tokens // ((THREADS // lanes) * ROWS))


def _rows(d, rows, vec: int) -> cute.Layout:
    """A row-major (rows, d) table as the layout ``(d, rows) : (1, d)``, column first (Int64 row
    offsets; d a multiple of ``vec``, which the host checked)."""
    return cute.make_layout((d, rows), stride=(1, cute.assume(Int64(d), divby=vec)))


@cute.jit
def _row(mIdx: cute.Tensor, n: Int64, n_tokens: Int64) -> Int64:
    """Token ``n``'s row of the table (its index, widened to 64 bits); -1 past the last token."""
    row = Int64(-1)
    if n < n_tokens:
        row = Int64(mIdx[n])
    return row


def _slot_tokens(mIdx: cute.Tensor, slots: int, lanes: int, n_tokens: Int64):
    """This thread's lane (its first column vector), its slot's ROWS token numbers (``slots`` apart)
    and their rows of the table (-1 past the last token)."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    lane, slot = tidx % lanes, tidx // lanes
    first = Int64(bidx) * (slots * ROWS) + slot
    tokens = [first + k * slots for k in range(ROWS)]
    return lane, tokens, [_row(mIdx, n, n_tokens) for n in tokens]


# ----------------------------------------------------------------------------- forward: the gather

def gather_kernel(dtype: torch.dtype, index_dtype: torch.dtype, vec: int, lanes: int):
    """The host function gathering rows of a ``dtype`` table by ``index_dtype`` indices, ``vec``
    elements per access (vec == 1: any weight strides), ``lanes`` threads per token."""
    element = _compile.DTYPES[dtype]
    slots = THREADS // lanes

    @cute.kernel
    def kernel(mIdx: cute.Tensor, mW: cute.Tensor, mOut: cute.Tensor, n_tokens: Int64, n_rows: Int64,
               width: Int32):
        # mIdx: (N,); mW: ((VEC), (W, V)); mOut: ((VEC), (W, N)); W = D / VEC = width
        lane, tokens, rows = _slot_tokens(mIdx, slots, lanes, n_tokens)
        atom = _reduce.copy_atom(element, vec)
        frag = cute.make_rmem_tensor(cute.make_layout((vec, ROWS)), element)  # (VEC, ROWS)
        for c in cutlass.range(lane, width, lanes, unroll=1):
            for k in cutlass.range_constexpr(ROWS):  # every load of the step first ...
                if (rows[k] >= 0) & (rows[k] < n_rows):
                    cute.copy(atom, mW[None, (c, rows[k])], frag[None, k])
                else:  # past the last token, or an index out of range: a device assert, never a read
                    if tokens[k] < n_tokens:
                        _compile.index_error("embedding", "indices", tokens[k], rows[k], n_rows)
            for k in cutlass.range_constexpr(ROWS):  # ... then the stores
                if tokens[k] < n_tokens:
                    cute.copy(atom, frag[None, k], mOut[None, (c, tokens[k])])

    @cute.jit
    def host(pIdx: cute.Pointer, pW: cute.Pointer, pOut: cute.Pointer, n_tokens: Int64, n_rows: Int32,
             d: Int32, idx_stride: Int64, w_row_stride: Int64, w_col_stride: Int64, grid: Int32,
             stream: cuda.CUstream):
        mIdx = cute.make_tensor(pIdx, cute.make_layout((n_tokens,), stride=(idx_stride,)))
        if const_expr(vec > 1):  # unit column stride; D and the row stride multiples of VEC (host-checked)
            d = cute.assume(d, divby=vec)
            w_layout = cute.make_layout((d, n_rows), stride=(1, cute.assume(w_row_stride, divby=vec)))
        else:
            w_layout = cute.make_layout((d, n_rows), stride=(w_col_stride, w_row_stride))
        mW = cute.zipped_divide(cute.make_tensor(pW, w_layout), (vec,))  # ((VEC), (W, V))
        mOut = cute.zipped_divide(cute.make_tensor(pOut, _rows(d, n_tokens, vec)), (vec,))  # ((VEC), (W, N))
        kernel(mIdx, mW, mOut, n_tokens, Int64(n_rows), d // vec).launch(
            grid=[grid, 1, 1], block=[THREADS, 1, 1], stream=stream)

    return host


def _gather(idx, weight, out):
    V, D = weight.shape
    N = idx.numel()
    vec = 1
    if weight.stride(1) == 1:
        vec = _reduce.vector_width(weight.element_size(), addresses=(weight.data_ptr(), out.data_ptr()),
                                   counts=(D, weight.stride(0)))
    lanes = _lanes(D // vec)
    _compile.launch(gather_kernel, (weight.dtype, idx.dtype, vec, lanes),
                    _compile.pointer(idx, idx.element_size()),
                    _compile.pointer(weight, vec * weight.element_size()),
                    _compile.pointer(out, vec * out.element_size()), N, V, D, idx.stride(0), weight.stride(0),
                    weight.stride(1), _grid(N, lanes), _compile.stream(weight.device))


# ----------------------------------------------------------------------------- backward: the scatter-add

def _red_width(vec: int, acc: torch.Tensor, D: int) -> int:
    """Float32 elements per atomic: up to 4 (``red.global.add.v4.f32``, ``.v2``) on sm_90+, at most
    ``vec`` (an atomic covers part of one loaded vector); single ones before sm_90."""
    if int("".join(ch for ch in _compile.target()[3:] if ch.isdigit())) < 90:
        return 1
    return min(vec, _reduce.vector_width(4, addresses=(acc.data_ptr(),), counts=(D,)))


def scatter_add_kernel(dtype: torch.dtype, index_dtype: torch.dtype, vec: int, red: int, lanes: int):
    """The host function adding rows of a ``dtype`` dout into a float32 accumulator at ``index_dtype``
    indices: ``vec`` elements per load, ``red`` float32 per atomic, ``lanes`` threads per token."""
    element = _compile.DTYPES[dtype]
    slots = THREADS // lanes
    chunks = vec // red  # atomics per vector

    @cute.kernel
    def kernel(mIdx: cute.Tensor, mDout: cute.Tensor, mAcc: cute.Tensor, n_tokens: Int64, n_rows: Int64,
               width: Int32):
        # mIdx: (N,); mDout: ((VEC), (W, N)); mAcc: ((RED), (D / RED, V)) float32; W = D / VEC = width
        lane, tokens, rows = _slot_tokens(mIdx, slots, lanes, n_tokens)
        atom = _reduce.copy_atom(element, vec)
        frag = cute.make_rmem_tensor(cute.make_layout((vec, ROWS)), element)  # (VEC, ROWS)
        for c in cutlass.range(lane, width, lanes, unroll=1):
            for k in cutlass.range_constexpr(ROWS):  # every load of the step first ...
                if (rows[k] >= 0) & (rows[k] < n_rows):  # false past the last token too
                    cute.copy(atom, mDout[None, (c, tokens[k])], frag[None, k])
            for k in cutlass.range_constexpr(ROWS):  # ... then the atomics
                if (rows[k] >= 0) & (rows[k] < n_rows):
                    acc = cute.make_rmem_tensor(cute.make_layout((red, chunks)), Float32)  # (RED, VEC / RED)
                    acc.store(frag[None, k].load().to(Float32).reshape((red, chunks)))
                    for j in cutlass.range_constexpr(chunks):
                        target = mAcc[None, (c * chunks + j, rows[k])]
                        if const_expr(red > 1):
                            cute.arch.red(target.iterator, acc[None, j].load().ir_value(), op="add", dtype="f32",
                                          sem="relaxed", scope="gpu")
                        else:
                            cute.arch.red(target.iterator, acc[0, j], op="add", dtype="f32", sem="relaxed",
                                          scope="gpu")

    @cute.jit
    def host(pIdx: cute.Pointer, pDout: cute.Pointer, pAcc: cute.Pointer, n_tokens: Int64, n_rows: Int32,
             d: Int32, idx_stride: Int64, grid: Int32, stream: cuda.CUstream):
        mIdx = cute.make_tensor(pIdx, cute.make_layout((n_tokens,), stride=(idx_stride,)))
        d = cute.assume(d, divby=vec)
        mDout = cute.zipped_divide(cute.make_tensor(pDout, _rows(d, n_tokens, vec)), (vec,))  # ((VEC), (W, N))
        mAcc = cute.zipped_divide(cute.make_tensor(pAcc, _rows(d, n_rows, vec)), (red,))  # ((RED), (D / RED, V))
        kernel(mIdx, mDout, mAcc, n_tokens, Int64(n_rows), d // vec).launch(
            grid=[grid, 1, 1], block=[THREADS, 1, 1], stream=stream)

    return host


def _scatter_add(idx, dout, acc):
    V, D = acc.shape
    N = idx.numel()
    # dout: (N, D) contiguous (autograd.Primitive passes dout.contiguous())
    vec = _reduce.vector_width(dout.element_size(), addresses=(dout.data_ptr(),), counts=(D,))
    red = _red_width(vec, acc, D)
    lanes = _lanes(D // vec)
    _compile.launch(scatter_add_kernel, (dout.dtype, idx.dtype, vec, red, lanes),
                    _compile.pointer(idx, idx.element_size()),
                    _compile.pointer(dout, vec * dout.element_size()),
                    _compile.pointer(acc, red * 4), N, V, D, idx.stride(0), _grid(N, lanes),
                    _compile.stream(acc.device))


embedding, embedding_backward = _host.embedding_ops(gather=_gather, scatter_add=_scatter_add)
