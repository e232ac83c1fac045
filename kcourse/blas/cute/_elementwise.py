"""The CuTe kernel behind copy, swap, scal and axpby: one factory for every elementwise op.

An op is described by an ``Elementwise`` (how many tensors it reads and writes, how many scalars
it takes, as numbers or read from memory, and its math on register fragments); ``run`` launches it
over same-shape tensors of any shape and strides, moving data with 128-bit accesses wherever the
layouts allow it.

The index space
---------------
``kcourse.blas._layout.strided_layout`` merges the operands' common index space into ``rank <= 4``
row-major dims ``(s_0, ..., s_{r-1})`` with one stride tuple per operand (contiguous tensors become
one dim of stride 1). Each operand becomes a CuTe tensor over the layout

    (s_{r-1}, ..., s_1, s_0) : (d_{r-1}, ..., d_1, d_0)        innermost dim first

because CuTe orders coordinates colexicographically (the leftmost mode varies fastest): flat
index ``i`` of this layout is row-major index ``i`` of the torch tensors. A transposed, sliced or
expanded (stride 0) view is addressed through its own layout; nothing is copied first.

Vectors
-------
``cute.zipped_divide(tensor, (VEC,))`` splits the innermost mode into ``VEC``-element vectors:

    ((VEC), (s_{r-1}/VEC, s_{r-2}, ..., s_0)) : ((1), (VEC, d_{r-2}, ..., d_0))

Mode 0 is what one access moves: ``VEC`` contiguous elements, 16 bytes at the widest. Mode 1
numbers the vectors in row-major order; the kernel turns vector index ``v`` into a coordinate of
mode 1 (a div/mod per dim, none for rank 1) once, and every operand's layout turns that coordinate
into its own offset (a dot product with its strides). A copy atom of ``VEC * bits`` bits
(``CopyUniversalOp``) moves one vector: ``ld.global.v4`` / ``st.global.v4`` at 128 bits.

The host picks the widest ``VEC`` (128, 64, 32 bits, else single elements) for which every operand
has innermost stride 1, a base address aligned to ``VEC`` elements, outer strides that are
multiples of ``VEC`` and, for rank > 1, an innermost size that is a multiple of ``VEC``: then no
vector straddles two rows and every vector is aligned. The kernel learns the stride fact through
``cute.assume(stride, divby=VEC)``, which is what lets the compiler prove the alignment (without it
the 128-bit atom does not compile); the base alignment is the pointer's ``assumed_align``.

Tiling
------
CTA ``b`` owns vectors ``[b * TILE, (b + 1) * TILE)``, ``TILE = THREADS * VECTORS``; thread ``t``
takes vectors ``b * TILE + t + k * THREADS`` for ``k < VECTORS``, so at each step a warp moves 32
consecutive vectors (512 contiguous bytes for dense layouts: fully coalesced). Each thread first
loads all its vectors of every input (``VECTORS`` independent 128-bit loads in flight per operand:
memory-level parallelism), then applies the math, then stores. That order also makes the in-place
calls safe -- ``swap(x, y, out_x=x, out_y=y)``, ``scal(x, a, out=x)`` -- since one thread owns each
element and reads it before anything writes it. The CTA tile is a range of flat vector indices
rather than a ``local_tile`` because mode 1 is a nested shape of runtime extents: dividing it by a
static tile is exact only under divisibility conditions that are not known at compile time, while
a flat index is always right.

Bounds and sizes: a vector is moved whole when it lies inside the tensor (``v < numel // VEC``).
Only at rank 1 can the last vector be partial (``numel % VEC != 0``); its elements are then moved
one by one, each checked against ``numel``, so nothing outside the tensor is read or written.
Indices, sizes and strides are 64-bit (``Int64``), so tensors of more than 2^31 elements work; LLVM
adds a 32-bit fast path to each division for when the values fit. (The DSL hands back a layout's
runtime extents -- ``tensor.shape``, ``cute.idx2crd`` -- as 32-bit values, so the kernel is given
the extents it divides by as its own ``Int64`` arguments.)

Arithmetic: an op with ``float32=True`` has its inputs converted to float32, its math done there
and each result rounded once to the tensor dtype; ``copy`` and ``swap`` move bits unchanged.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64, const_expr

from .._layout import strided_layout
from . import _compile

THREADS = 256  # threads per CTA
VECTORS = 4  # vectors per thread: 4 x 16 B in flight per operand at the widest width
TILE = THREADS * VECTORS  # vectors per CTA


@dataclass(frozen=True, eq=False)  # equal only to itself: a cheap cache key
class Elementwise:
    """One elementwise op: what it reads and writes and the math between (the factory does the rest)."""

    name: str  # the op, for error messages
    inputs: int  # tensors read
    outputs: int  # tensors written
    # (*inputs, *scalars) -> tuple of outputs, on register fragments (cute TensorSSA)
    math: Callable = field(repr=False)
    float32: bool  # True: math on float32, each result rounded once; False: values move bit for bit
    scalars: int = 0  # Float32 scalars, passed after the tensors
    scalars_in_memory: bool = False  # True: each scalar a 0-d float32 tensor on the GPU, read by the kernel

    def __post_init__(self):
        # What names the op's compiled kernels on disk (``_disk.identity``; ``math`` is usually a
        # closure, which has no faithful name): for an op made by a module's top-level code, that module
        # and how many it had made before, fixed by its source. Made elsewhere: none, not kept.
        caller = sys._getframe(2)  # (the dataclass's __init__ is frame 1)
        if caller.f_code.co_name == "<module>":
            module = caller.f_globals.get("__name__", "?")
            made = _MADE[module] = _MADE.get(module, -1) + 1
            object.__setattr__(self, "disk_identity", f"{module}#{made}")


_MADE: dict[str, int] = {}  # module -> Elementwise ops it made so far


def vector_width(tensors: tuple[torch.Tensor, ...], shape: tuple[int, ...],
                 strides: list[tuple[int, ...]]) -> int:
    """The widest vector (in elements) that every operand can move with one aligned access.

    ``shape`` and ``strides`` are ``strided_layout``'s. A width ``vec > 1`` needs, for every
    operand: innermost stride 1, base address aligned to ``vec`` elements, outer strides multiples
    of ``vec``, and (rank > 1) an innermost size that is a multiple of ``vec``, so that each vector
    lies in one row and starts aligned. Widths tried: 128, 64, 32 bits, then single elements.
    """
    itemsize = tensors[0].element_size()
    dense = all(s[-1] == 1 for s in strides)
    for vec in (16 // itemsize, 8 // itemsize, 4 // itemsize):  # 128, 64, 32 bits
        if vec == 1 or not dense:
            break
        rows_aligned = all(d % vec == 0 for s in strides for d in s[:-1]) \
            and (len(shape) == 1 or shape[-1] % vec == 0)
        bases_aligned = all(t.data_ptr() % (vec * itemsize) == 0 for t in tensors)
        if rows_aligned and bases_aligned:
            return vec
    return 1


def run(op: Elementwise, tensors: tuple[torch.Tensor, ...], scalars: tuple[float, ...] = ()) -> None:
    """Launch ``op`` over the same-shape ``tensors`` (its inputs, then its outputs)."""
    assert len(tensors) == op.inputs + op.outputs and len(scalars) == op.scalars, op
    numel = tensors[0].numel()
    if numel == 0:  # a grid of 0 CTAs is a launch error
        return
    if all(t.is_contiguous() for t in tensors):  # the common case, what strided_layout would return
        shape, strides = (numel,), [(1,)] * len(tensors)
    else:
        shape, strides = strided_layout(op.name, *tensors)
    vec = vector_width(tensors, shape, strides)
    unit_inner = all(s[-1] == 1 for s in strides)  # then the innermost stride is a compile-time 1
    key = (op, tensors[0].dtype, len(shape), vec, unit_inner)
    # The host function takes its runtime arguments flat: the stream, one pointer per tensor
    # (promising vec-element alignment), the sizes, each tensor's strides (the innermost left out
    # when it is the constant 1), the scalars. Its *args are unannotated, so _compile passes the
    # ints as Int64 and the floats as Float32 (rounded once, as torch rounds a Python scalar).
    args = [_compile.pointer(t, vec * t.element_size()) for t in tensors]
    args += shape
    for s in strides:
        args += s[:-1] if unit_inner else s
    if op.scalars_in_memory:  # their addresses (4-byte aligned floats)
        args += [_compile.pointer(a, 4) for a in scalars]
    else:
        args += [float(a) for a in scalars]
    _compile.launch(elementwise_kernel, key, _compile.stream(tensors[0].device), *args)


def vector_view(pointer, shape, strides, vec: int) -> cute.Tensor:
    """One operand as a ``((vec), (vectors...))`` tensor: element ``j`` of vector ``v`` is ``[j, v]``.

    ``shape`` and ``strides`` are row-major (outermost dim first), as ``strided_layout`` gives them;
    an innermost stride of ``1`` (a Python int) makes the vectors' contiguity a compile-time fact.
    """
    # The outer strides are multiples of vec (checked on the host): tell the compiler, so that it
    # can prove every vector 16-byte aligned and use 128-bit accesses.
    outer = [cute.assume(d, divby=vec) if const_expr(vec > 1) else d for d in strides[:-1]]
    # innermost dim first, so that CuTe's flat index is the row-major one
    layout = cute.make_layout(tuple(reversed(shape)), stride=(strides[-1], *reversed(outer)))
    return cute.zipped_divide(cute.make_tensor(pointer, layout), (vec,))


def coordinate(index, sizes) -> tuple:
    """The coordinate of flat ``index`` in a space whose extents are ``(*sizes, any)``, innermost
    first: CuTe's colexicographic order, what ``cute.idx2crd`` computes, kept in 64 bits."""
    crd = []
    for size in sizes:
        crd.append(index % size)
        index = index // size
    return (*crd, index)


def elementwise_kernel(op: Elementwise, dtype: torch.dtype, rank: int, vec: int, unit_inner: bool):
    """The ``@cute.jit`` host function running ``op`` on ``rank``-dim operands with ``vec``-element vectors."""
    element = _compile.DTYPES[dtype]
    operands = op.inputs + op.outputs
    ragged = rank == 1 and vec > 1  # the last vector may be partial (rank > 1: vec divides every row)
    passed_strides = rank - 1 if unit_inner else rank  # per operand

    @cute.kernel
    def kernel(srcs: list, dsts: list, scalars: list, sizes: list, numel: Int64):
        # srcs, dsts: ((vec), (vectors...)) views of the inputs and outputs; sizes: the vector index
        # space's extents but the outermost, innermost first (Int64)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), element, num_bits_per_copy=vec * element.width)
        whole = numel // vec  # vectors that lie entirely inside the tensor
        first = Int64(bidx) * TILE + tidx  # this thread's first vector; its others follow THREADS apart
        # Each vector's coordinate in mode 1 (one div/mod per dim, none for rank 1), computed once
        # and applied to every operand's layout, where it costs a dot product with the strides.
        coords = [coordinate(first + k * THREADS, sizes) for k in range(VECTORS)]

        # 1. load every vector of every input into registers
        frags = [cute.make_rmem_tensor(cute.make_layout((vec, VECTORS)), element) for _ in srcs]  # (vec, VECTORS)
        for k in cutlass.range_constexpr(VECTORS):
            v = first + k * THREADS
            if v < whole:
                for src, frag in zip(srcs, frags):
                    cute.copy(atom, src[None, coords[k]], frag[None, k])
            if const_expr(ragged):
                if v == whole:  # the partial last vector, element by element
                    for j in cutlass.range_constexpr(vec):
                        if v * vec + j < numel:
                            for src, frag in zip(srcs, frags):
                                frag[j, k] = src[j, v]

        # 2. the math, on whole fragments (scalars in memory: each thread reads the same 4 bytes)
        if const_expr(op.scalars_in_memory):
            scalars = [Float32(a[0]) for a in scalars]
        values = [frag.load() for frag in frags]
        if const_expr(op.float32):
            values = [x.to(Float32) for x in values]
        results = op.math(*values, *scalars)
        outs = [cute.make_rmem_tensor(cute.make_layout((vec, VECTORS)), element) for _ in dsts]
        for out, result in zip(outs, results):
            out.store(result.to(element) if const_expr(op.float32) else result)

        # 3. store, with the same bounds as the loads
        for k in cutlass.range_constexpr(VECTORS):
            v = first + k * THREADS
            if v < whole:
                for dst, out in zip(dsts, outs):
                    cute.copy(atom, out[None, k], dst[None, coords[k]])
            if const_expr(ragged):
                if v == whole:
                    for j in cutlass.range_constexpr(vec):
                        if v * vec + j < numel:
                            for dst, out in zip(dsts, outs):
                                dst[j, v] = out[j, k]

    @cute.jit
    def host(stream: cuda.CUstream, *args):
        pointers, args = args[:operands], args[operands:]
        shape, args = args[:rank], args[rank:]  # row-major: outermost dim first
        views = []
        for pointer in pointers:
            strides, args = args[:passed_strides], args[passed_strides:]
            views.append(vector_view(pointer, shape, (*strides, 1) if const_expr(unit_inner) else strides, vec))
        scalars = list(args)
        if const_expr(op.scalars_in_memory):  # a pointer each: a one-element tensor
            scalars = [cute.make_tensor(a, cute.make_layout(1)) for a in scalars]
        numel = shape[0]
        for size in shape[1:]:
            numel *= size
        # the vector index space, innermost first: (s_{r-1} / vec, s_{r-2}, ..., s_1); s_0 is not needed
        sizes = [shape[-1] // vec, *reversed(shape[1:-1])] if const_expr(rank > 1) else []
        kernel(views[:op.inputs], views[op.inputs:], scalars, sizes, numel).launch(
            grid=[cute.ceil_div(numel, vec * TILE), 1, 1], block=[THREADS, 1, 1], stream=stream)

    return host
