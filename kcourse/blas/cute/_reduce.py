"""What the reduction kernels (dot, gemv) and geru share: thread sums, vector widths, the SM count.

Summing a value over threads
----------------------------
A warp adds 32 registers with five butterfly shuffles (``shfl.sync.bfly``): after step ``k`` every
lane holds the sum of the ``2^k`` lanes that differ from it in the low ``k`` bits of the lane id, so
after five steps every lane holds the warp's sum, with no shared memory and no barrier. Threads in
different warps meet in shared memory: lane 0 of each warp writes its sum, one barrier, and each warp
re-reads and shuffles the few partial sums of its group. The order of the additions depends only on
the thread ids, never on timing, so the result is the same bits on every run.

Vector width
------------
A 128-bit load or store needs an address that is a multiple of 16 bytes, and a tensor whose sizes and
strides (in elements) are multiples of the vector's element count, so that each vector lies inside one
row and every row starts aligned. ``vector_width`` picks the widest access that these facts allow;
each op checks them on the host and compiles a kernel for that width (128, 64, 32 bits or scalar).
"""
from __future__ import annotations

import operator

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass.cute.nvgpu import cpasync

from .. import _host

WARP = 32
VECTOR_BYTES = 16  # a 128-bit access
DEFAULT_SMS = 132  # an H100 SXM: the count used to size grids where there is no GPU (compiling only)


def vector_width(itemsize: int, addresses=(), counts=()) -> int:
    """The most elements (a power of two, at most 16 bytes' worth) that one access may move when each
    of ``addresses`` (bytes) must be a multiple of the access size and each of ``counts`` (sizes and
    strides, in elements) a multiple of the element count."""
    vec = VECTOR_BYTES // itemsize
    while vec > 1 and (any(a % (vec * itemsize) for a in addresses) or any(c % vec for c in counts)):
        vec //= 2
    return vec


def pow2_at_least(k: int) -> int:
    """The smallest power of two >= k (1 for k <= 1): a thread count that covers k vectors."""
    return 1 << max(k - 1, 0).bit_length()


def sm_count(device: torch.device) -> int:
    """The number of streaming multiprocessors of ``device`` (``_host.sm_count``; ``DEFAULT_SMS`` off a GPU)."""
    return _host.sm_count(device, off_gpu=DEFAULT_SMS)


def sm_count_of(device_index: int) -> int:
    """``sm_count`` of CUDA device ``device_index`` as ``Tensor.get_device()`` gives it (-1: the CPU)."""
    return DEFAULT_SMS if device_index < 0 else _host.device_sm_count(device_index)


def copy_atom(dtype, vec: int):
    """A copy atom that moves ``vec`` elements of ``dtype`` in one access (``ld/st.global.v4`` at 16 bytes)."""
    return cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=dtype.width * vec)


def async_copy_atom(dtype, vec: int):
    """``copy_atom`` as a cp.async from global into shared memory (4, 8 or 16 bytes): 16-byte copies
    bypass L1 (.cg, the only size .cg takes), narrower ones go through it (.ca)."""
    bits = dtype.width * vec
    cache = cpasync.LoadCacheMode.GLOBAL if bits == 128 else cpasync.LoadCacheMode.ALWAYS
    return cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cache), dtype, num_bits_per_copy=bits)


def reduction_buffer(num_warps: int) -> cute.Tensor:
    """A float32 shared-memory slot per warp, for ``group_sum`` (call once per kernel, before any branch)."""
    smem = cutlass.memory.SmemAllocator()
    return smem.allocate_tensor(Float32, cute.make_layout((num_warps,)), byte_alignment=16)


@cute.jit
def group_sum(val: Float32, group: cutlass.Constexpr[int], buffer: cute.Tensor) -> Float32:
    """The sum of ``val`` over each ``group`` consecutive threads (a power of two, at most the CTA),
    returned to every thread of the group.

    With ``group > 32`` every thread of the CTA must call it (it holds a barrier), and a kernel calls
    it once: a second call could overwrite ``buffer`` before a slow warp has read the first sums.
    """
    val = cute.arch.warp_reduction(val, operator.add, threads_in_group=min(group, WARP))
    if cutlass.const_expr(group > WARP):
        warps = group // WARP  # warps per group
        lane, warp = cute.arch.lane_idx(), cute.arch.warp_idx()
        if lane == 0:
            buffer[warp] = val
        cute.arch.barrier()
        val = Float32(0.0)
        if lane < warps:
            val = buffer[warp - warp % warps + lane]  # the group's warps, in order
        val = cute.arch.warp_reduction(val, operator.add)  # lanes past `warps` add zeros
    return val


@cute.jit
def predicate(tXcX: cute.Tensor, limit: cute.Shape) -> cute.Tensor:
    """One flag per copy-atom access of a thread's partition of a 2-D tile: ``tXcX`` is the same
    partition of an identity tensor, ``((ATOM, ATOMS), REST_M, REST_N)`` of coordinates, and an access
    is in bounds when its first element's coordinate is below ``limit`` in both modes. (A vector is
    wholly in or wholly out because the host keeps every extent a multiple of the vector width.)"""
    tXpX = cute.make_rmem_tensor(
        (cute.size(tXcX, mode=[0, 1]), cute.size(tXcX, mode=[1]), cute.size(tXcX, mode=[2])), cutlass.Boolean)
    for a in cutlass.range_constexpr(cute.size(tXpX, mode=[0])):
        for i in cutlass.range_constexpr(cute.size(tXpX, mode=[1])):
            for j in cutlass.range_constexpr(cute.size(tXpX, mode=[2])):
                tXpX[a, i, j] = cute.elem_less(tXcX[(0, a), i, j], limit)
    return tXpX
