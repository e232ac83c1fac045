"""gemm on Hopper (sm_90a): out <- alpha * A B + beta * C with TMA, WGMMA and warp specialization.

The fast path of the cute gemm for float16 / bfloat16 (gemm.py dispatches here when ``supports``
says yes and falls back to its general kernel otherwise). Operands are always 3-D:

    A (batch, m, k)   B (batch, k, n)   C None or (batch, m, n)   out (batch, m, n)
    out[b] = alpha * A[b] @ B[b] + beta * C[b]      float32 accumulation, one rounding at the end

FLOPs: 2 m n k per matrix. Bytes, at least: (m k + k n + m n) * 2 per matrix, plus m n * 2 to read
C. At 4096^3 that is 137 GFLOP against 100 MB: ~1400 FLOP/byte, far above the H100's ~300, so the
kernel is compute-bound and everything below serves one goal: keep the tensor cores busy.

The design (the CUTLASS "warp-specialized persistent cooperative" kernel, written in the CuTe DSL)
-----------------------------------------------------------------------------------------------
Tiles. Each CTA computes (tile_m, tile_n) = (128, 256) tiles of out, or (128, 128) when the
output has fewer 128 x 256 tiles than the GPU has SMs (more, smaller tiles keep every SM busy),
walking k 64 at a time: 64 16-bit values are 128 bytes, one row of a 128-byte swizzle atom.

Warp roles (384 threads = 3 warpgroups of 128):
  - warpgroups 0 and 1, the *consumers*, each own 64 rows of the tile and issue WGMMA
    (``wgmma.mma_async``: one warpgroup multiplies a 64 x tile_n x 16 block straight out of shared
    memory into float32 registers). Each consumer thread holds 64 * 256 / 128 = 128 accumulators.
  - warpgroup 2, the *producer*: one warp issues TMA loads (``cp.async.bulk.tensor``: one thread
    asks the copy engine for a whole (128 x 64) box of A or (256 x 64) box of B; out-of-bounds
    elements of the box arrive as zeros, which is how the M, N and K tails are handled: no masks.
    See "TMA's 16-byte granularity" below for the one exception).
    It needs few registers: ``setmaxnreg`` moves registers from it (40) to the consumers (232).

Pipeline. Shared memory holds ``stages`` (A, B) buffers (4 of 48 KiB for 128 x 256, 6 of 32 KiB
for 128 x 128: what is left of the 227 KiB after the epilogue's 32 KiB). Each stage
has two mbarriers (``PipelineTmaAsync``): "full" (the producer arms it with the number of bytes
to expect; the TMA unit counts the bytes in; consumers wait on it) and "empty" (every consumer warp
arrives when its WGMMAs have finished reading the stage; the producer waits on it before reusing
the buffer). The producer therefore runs up to ``stages`` k-steps ahead of the tensor cores, across
tile boundaries too: it loads the next tile while the consumers run this tile's epilogue.
The consumers keep one batch of WGMMAs in flight (``wait_group(1)``) and release a stage only once
the WGMMAs that read it have retired.

Shared-memory layouts and swizzles. WGMMA reads operands from shared memory through a descriptor
that understands a few canonical layouts: "K-major" (k contiguous) or "MN-major" (m or n
contiguous), each in 128-byte rows XOR-swizzled (``Swizzle<3,4,3>``: the 16-byte chunk index
within a 128-byte row is XORed with the row index mod 8), so that the 8 rows a warp touches at
once hit 8 different bank groups. TMA writes exactly that swizzle as it lands the box, so neither
side has bank conflicts and no thread ever shuffles data. Both orientations are native for 16-bit
types, so ``A.mT`` or ``B.mT`` is read in place: the key records which dim of A and of B has stride 1.

Cluster and multicast. CTAs run in clusters of 2 along M (cluster (2, 1)): the two CTAs need the
same B tile, so each loads half of it and multicasts it into both CTAs' shared memory, halving B's
L2 traffic. A consumer then releases a stage to both producers (its own and its peer's).

Persistent scheduling. The grid is one cluster per SM pair (as many as fit at once); each cluster
loops over output tiles (``StaticPersistentTileScheduler``), visiting them in groups of ``swizzle``
tile-columns so that neighbours share A and B tiles in L2, and the batch is one more tile mode.
A stride-0 batch (one matrix shared by the batch) is given to TMA as a batch of 1 and read at
batch index 0.

Epilogue, per (128 x 32) subtile of the tile: registers hold float32 accumulators; the consumers
form alpha * acc + beta * C in float32 (C read straight from global memory with each thread's own
accumulator coordinates, masked at the M/N edges, so any C strides work, including the stride-0
bias broadcast; the next subtile's C is loaded while this one is stored), round once to the output
dtype, write it to a swizzled shared buffer with ``stmatrix``, and one thread issues a TMA store
(out-of-bounds rows and columns of the box are clipped by the hardware, but see below). Four
subtile buffers let stores overlap the next subtile's math. ``out`` may be ``C`` (in-place): each
element of C is read into registers before the TMA store that overwrites it is issued, and tiles
(and subtiles) are disjoint, so nothing else writes it in between. C costs one 2-byte load per
element (TMA cannot read a stride-0 broadcast); the beta == 0 variant, compiled separately, has no
C code at all.

TMA's 16-byte granularity. TMA bounds-checks a box along the tensor's contiguous dim in 16-byte
chunks of the global address, not element by element: an H100 TMA store whose box crosses an
extent that is not a multiple of 8 16-bit elements also writes the elements after it, up to the
next 16-byte boundary. That is not out's memory when out is a column slice of a wider buffer (its
stride is a multiple of 8, its extent need not be), so it would overwrite another tensor's data.
Hence:
  - out "ragged" (its contiguous extent, N if n-contiguous else M, not a multiple of 8) is a
    separate compiled variant: a subtile whose box would cross that edge (at most one per row of
    subtiles, in the last tile column) skips smem and TMA, and the consumer threads store it
    straight from registers, each element masked on (M, N), exactly as C is loaded. Every other
    subtile, and every subtile of a non-ragged out, is stored by TMA (the non-ragged variant has
    no trace of this path: it compiles to the same instructions as before the path existed).
  - loads: we assume the same granularity, i.e. a box may bring in the elements up to the next
    16-byte boundary instead of zeros (not measured). Past M or N they only reach accumulator rows
    and columns that are never stored; past K they would be multiplied into every result. So a
    k-contiguous A or B must have K a multiple of 8 (``supports``).

What it takes (``supports``), everything else goes to gemm.py's general kernel:
  - dtype float16 or bfloat16 (all operands the same), compiled for sm_90a;
  - A and B: one of the two matrix dims has stride 1; the other stride, the batch stride (unless the
    batch stride is 0 or the batch is 1) and the base address are multiples of 16 bytes (TMA rules);
    if the unit-stride dim is K, K is a multiple of 8 (see above);
  - out: the same rules (n- or m-contiguous, any extents), and a nonzero batch stride when batch > 1;
  - C: the shape of out, any strides (read element by element); out may be C;
  - 1 <= m, n, k, batch < 2^31.

Compile key: (dtype, A k-contiguous, B k-contiguous, out n-contiguous, out ragged, has C, tile_m,
tile_n, cluster_m, cluster_n, swizzle, max active clusters). Sizes and strides are runtime
arguments: the TMA descriptors are built on the host from them at each call (inside the compiled
host function, in C). ``plan`` derives the key and those numbers from the operands' layouts, so
gemm.py computes them once per layout (``_compile.plan_cache``).
"""
from __future__ import annotations

import functools

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync, warp, warpgroup
from cutlass.tensor_utils import LayoutEnum

from .. import _host
from . import _compile

TILES = ((128, 256), (128, 128))  # (tile_m, tile_n) the kernel is built for; tile_k is 64
CLUSTER = (2, 1)  # CTAs per cluster along (m, n): B tiles are multicast to the 2 CTAs
VEC = 8  # 16 bytes of a 16-bit type: the unit of every TMA stride
_INT32_MAX = 2**31 - 1
_TMA_MAX_STRIDE = 2**39  # elements: TMA strides must stay below 2^40 bytes


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------------------------------------
# Host side: which operands the kernel takes, and how they are described to it
# ------------------------------------------------------------------------------------------------
def _tma_matrix(t: _compile.View, k_dim: int | None = None) -> tuple[int, int, int, int] | None:
    """How TMA can read the 3-D ``t`` (batch, rows, cols), or None if it cannot.

    Returns (unit, ld, batch_extent, batch_stride) in elements: ``unit`` is the matrix dim with
    stride 1 (2: cols, 1: rows), ``ld`` the stride of the other dim, ``batch_extent`` 1 when the
    batch is 1 or has stride 0 (one matrix for the whole batch), else the batch. A dim of extent 1
    is never stepped over, so its stride may be anything: it is replaced by a legal one.

    ``k_dim``: the operand's K dim. TMA bounds-checks the contiguous dim in 16-byte chunks, not
    elements (an H100 TMA *store* writes up to the next 16-byte boundary past the extent; we
    assume a load may likewise bring in the elements there instead of zeros). Past M or N that
    only touches rows and columns of the product that are never stored, but past K those
    elements would be multiplied into every result, so K may be the unit dim only when its
    extent is a multiple of 8.
    """
    batch, rows, cols = t.shape
    sb, sr, sc = t.stride
    if t.misalignment:
        return None
    for unit, (n_unit, s_unit), (n_other, s_other) in ((2, (cols, sc), (rows, sr)),
                                                       (1, (rows, sr), (cols, sc))):
        if s_unit != 1 and n_unit != 1:
            continue
        if unit == k_dim and n_unit % VEC:
            continue
        ld = s_other if n_other > 1 else _cdiv(n_unit, VEC) * VEC
        if ld % VEC or not 0 < ld < _TMA_MAX_STRIDE:
            continue
        if batch == 1 or sb == 0:
            return unit, ld, 1, _cdiv(ld * n_other, VEC) * VEC
        if sb % VEC == 0 and sb < _TMA_MAX_STRIDE:
            return unit, ld, batch, sb
    return None


def _describe(a: _compile.View, b: _compile.View, c: _compile.View | None, o: _compile.View):
    """The ``_tma_matrix`` descriptions of A, B and out when the kernel takes these 3-D operands of
    one 16-bit dtype (the layout rules of ``supports``), else None."""
    if c is not None and c.shape != o.shape:
        return None
    batch, m, n = o.shape
    k = a.shape[2]
    if a.shape[1] != m or b.shape[1:] != (k, n) or a.shape[0] not in (1, batch) or b.shape[0] not in (1, batch):
        return None  # a batch of 1 in A or B is shared by the whole batch
    if not all(1 <= d <= _INT32_MAX for d in (batch, m, n, k)):
        return None
    out = _tma_matrix(o)
    if out is None or (batch > 1 and out[2] == 1):  # out must not write two batches to one place
        return None
    a_tma, b_tma = _tma_matrix(a, k_dim=2), _tma_matrix(b, k_dim=1)
    if a_tma is None or b_tma is None:
        return None
    return a_tma, b_tma, out


def supports(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor | None, out: torch.Tensor) -> bool:
    """True when ``gemm_sm90`` computes this product exactly: float16/bfloat16 on sm_90a; A, B and
    out each with one unit-stride matrix dim and 16-byte-aligned base, other stride and batch stride
    (a batch stride of 0 is fine for A and B, not for out); a k-contiguous A or B with K a multiple
    of 8; C (out's shape) with any strides."""
    if _compile.target() != "sm_90a" or A.dtype not in (torch.float16, torch.bfloat16):
        return False
    if any(t.dtype != A.dtype for t in (B, out) + (() if C is None else (C,))):
        return False
    if A.dim() != 3 or B.dim() != 3 or out.dim() != 3 or (C is not None and C.dim() != 3):
        return False
    view = _compile.View.of
    return _describe(view(A), view(B), None if C is None else view(C), view(out)) is not None


@functools.cache
def _max_active_clusters(device_index: int | None, cluster_size: int) -> int:
    """How many clusters of ``cluster_size`` CTAs (one per SM) fit on the GPU at once: the
    persistent grid. More would run in a second wave and double the time; fewer leave SMs idle."""
    if device_index is None:  # compiling without a GPU: an H100 SXM has 132 SMs
        return 132 // cluster_size
    try:
        return utils.HardwareInfo(device_index).get_max_active_clusters(cluster_size)
    except Exception:  # the occupancy query failed: assume every SM pair fits
        return _host.device_sm_count(device_index) // cluster_size


def _pick_tile(m: int, n: int, batch: int, sms: int) -> tuple[int, int]:
    """128 x 256 when there are enough such tiles to give every SM one, else 128 x 128."""
    tiles = _cdiv(m, 128) * _cdiv(n, 256) * batch
    return (128, 256) if n > 128 and tiles >= sms else (128, 128)


def plan(dtype: torch.dtype, a: _compile.View, b: _compile.View, c: _compile.View | None, o: _compile.View,
         device_index: int | None, tile: tuple[int, int] | None = None):
    """``(key, numbers)`` of the launch for 3-D operands of ``dtype`` (A (batch, m, k), B (batch, k,
    n), C None or (batch, m, n), out (batch, m, n)) on the GPU ``device_index`` (None: compiling
    without one): the compile key and the 15 numbers between the pointers and alpha; None where the
    layout rules of ``supports`` say no. ``tile`` as for ``gemm_sm90``."""
    described = _describe(a, b, c, o)
    if described is None:
        return None
    (a_unit, lda, batch_a, sa), (b_unit, ldb, batch_b, sb), (o_unit, ldo, _, so) = described
    batch, m, n = o.shape
    k = a.shape[2]
    # out's contiguous extent is "ragged" when it does not end on a 16-byte boundary: the TMA store
    # would then write past it (see the epilogue), so edge subtiles are stored without TMA
    out_ragged = (n if o_unit == 2 else m) % VEC != 0
    max_clusters = _max_active_clusters(device_index, CLUSTER[0] * CLUSTER[1])
    tile_m, tile_n = tile or _pick_tile(m, n, batch, max_clusters * CLUSTER[0] * CLUSTER[1])
    if (tile_m, tile_n) not in TILES:
        raise ValueError(f"gemm: tile {tile} is not one of the sm90 kernel's tiles {TILES}")
    # Group `swizzle` cluster-columns of tiles (for L2 reuse); it must divide their count, or the
    # scheduler would pad the grid with tiles that lie wholly outside the output.
    clusters_n = _cdiv(_cdiv(n, tile_n), CLUSTER[1])
    swizzle = next(s for s in (8, 4, 2, 1) if clusters_n % s == 0)
    key = (dtype, a_unit == 2, b_unit == 1, o_unit == 2, out_ragged, c is not None, tile_m, tile_n, *CLUSTER,
           swizzle, max_clusters)
    c_sl, c_sm, c_sn = c.stride if c is not None else (0, 0, 0)
    # the host function's annotations give these their C types
    return key, (m, n, k, batch, batch_a, batch_b, lda, sa, ldb, sb, ldo, so, c_sm, c_sn, c_sl)


# The pointers' alignments in bytes (A, B, C, out); C is read element by element, and without C
# the kernel still takes a pointer there (out's: it is never read).
ALIGN = (16, 16, 2, 16)


def gemm_sm90(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor | None, alpha: float, beta: float,
              out: torch.Tensor, *, tile: tuple[int, int] | None = None) -> torch.Tensor:
    """``out <- alpha * A B + beta * C`` for 3-D operands that ``supports`` accepts; ``C`` is None
    when ``beta == 0`` (and is then never read). ``tile`` = (tile_m, tile_n) from ``TILES``
    overrides the choice. Returns ``out``. (gemm.py's ``gemm`` launches the same plan from its own
    cache.)"""
    view = _compile.View.of
    key, numbers = plan(A.dtype, view(A), view(B), None if C is None else view(C), view(out),
                        out.get_device() if out.is_cuda else None, tile)
    pointer = _compile.pointer
    _compile.launch(_GemmSm90, key, pointer(A, ALIGN[0]), pointer(B, ALIGN[1]),
                    pointer(C if C is not None else out, ALIGN[2]), pointer(out, ALIGN[3]),
                    *numbers, alpha, beta, _compile.stream_of(out))
    return out


# ------------------------------------------------------------------------------------------------
# The kernel
# ------------------------------------------------------------------------------------------------
class _GemmSm90:
    """The compiled kernel for one key; ``__call__`` is the ``@cute.jit`` host function."""

    threads_per_wg = 128
    consumer_wgs = 2  # each owns 64 rows of the 128-row tile
    producer_warp = consumer_wgs * 4  # the first warp of the last warpgroup issues the TMA loads
    store_warp = 0  # the consumer warp that issues the epilogue's TMA stores
    epi_stages = 4  # (128 x 32) output subtile buffers in shared memory
    epi_barrier_id = 1  # named barrier of the 256 consumer threads (0 is __syncthreads)

    def __init__(self, dtype: torch.dtype, a_k_major: bool, b_k_major: bool, out_n_major: bool,
                 out_ragged: bool, has_c: bool, tile_m: int, tile_n: int, cluster_m: int, cluster_n: int,
                 swizzle: int, max_clusters: int):
        self.dtype = _compile.DTYPES[dtype]
        self.a_k_major, self.b_k_major, self.out_n_major = a_k_major, b_k_major, out_n_major
        self.out_ragged = out_ragged  # out's contiguous extent is not a multiple of 8 elements
        self.has_c = has_c
        self.tile_mnk = (tile_m, tile_n, 64)  # tile_k = 4 WGMMA k-steps of 16
        self.cluster_mn = (cluster_m, cluster_n)
        self.swizzle, self.max_clusters = swizzle, max_clusters
        self.threads = (self.consumer_wgs + 1) * self.threads_per_wg
        self.consumer_threads = self.consumer_wgs * self.threads_per_wg
        self.epi_tile = (tile_m, 32)  # both consumer warpgroups store one (128 x 32) subtile at a time
        # stages: whatever shared memory is left once the epilogue buffers and barriers are placed
        ab_bytes = (tile_m + tile_n) * 64 * 2
        epi_bytes = tile_m * 32 * 2 * self.epi_stages
        capacity = cutlass.memory.SmemAllocator.capacity_in_bytes("sm_90")
        self.stages = (capacity - 1024 - epi_bytes) // ab_bytes  # 1 KiB for mbarriers and alignment
        # registers per thread: 128 * 40 (producer) + 256 * 232 (consumers) = 64512 of the SM's 65536
        self.producer_regs, self.consumer_regs = 40, 232

    @staticmethod
    def load_op(multicast: int):
        """The TMA load: plain, or multicast into the ``multicast`` CTAs of the cluster that share the tile."""
        if multicast > 1:
            return cpasync.CopyBulkTensorTileG2SMulticastOp()
        return cpasync.CopyBulkTensorTileG2SOp()

    @cute.jit
    def __call__(self, pA: cute.Pointer, pB: cute.Pointer, pC: cute.Pointer, pOut: cute.Pointer,
                 m: Int32, n: Int32, k: Int32, batch: Int32, batch_a: Int32, batch_b: Int32,
                 lda: Int64, sa: Int64, ldb: Int64, sb: Int64, ldo: Int64, so: Int64,
                 c_sm: Int64, c_sn: Int64, c_sl: Int64, alpha: Float32, beta: Float32,
                 stream: cuda.CUstream):
        # --- global tensors, in the (rows, cols, batch) order CuTe's GEMM convention uses:
        # A (M, K, La), B (N, K, Lb), out and C (M, N, L). The contiguous dim gets a *static*
        # stride 1 (TMA and WGMMA need to know it at compile time); the others are runtime values
        # we promise are multiples of 8 elements (16 bytes), which supports() has checked.
        lda, ldb, ldo = cute.assume(lda, divby=VEC), cute.assume(ldb, divby=VEC), cute.assume(ldo, divby=VEC)
        sa, sb, so = cute.assume(sa, divby=VEC), cute.assume(sb, divby=VEC), cute.assume(so, divby=VEC)
        a_stride = (lda, 1, sa)
        if cutlass.const_expr(not self.a_k_major):
            a_stride = (1, lda, sa)
        b_stride = (ldb, 1, sb)  # B (N, K): k-contiguous means unit stride along K
        if cutlass.const_expr(not self.b_k_major):
            b_stride = (1, ldb, sb)
        o_stride = (ldo, 1, so)
        if cutlass.const_expr(not self.out_n_major):
            o_stride = (1, ldo, so)
        mA = cute.make_tensor(pA, cute.make_layout((m, k, batch_a), stride=a_stride))  # (M, K, La)
        mB = cute.make_tensor(pB, cute.make_layout((n, k, batch_b), stride=b_stride))  # (N, K, Lb)
        mOut = cute.make_tensor(pOut, cute.make_layout((m, n, batch), stride=o_stride))  # (M, N, L)
        mC = cute.make_tensor(pC, cute.make_layout((m, n, batch), stride=(c_sm, c_sn, c_sl)))  # (M, N, L)

        a_layout = LayoutEnum.from_tensor(mA)  # ROW_MAJOR = k-contiguous A
        b_layout = LayoutEnum.from_tensor(mB)  # ROW_MAJOR = k-contiguous B
        out_layout = LayoutEnum.from_tensor(mOut)  # ROW_MAJOR = n-contiguous out
        self.out_layout = out_layout

        # --- the MMA: 2 warpgroups stacked along M, each a 64 x tile_n WGMMA atom, f32 accumulators
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, a_layout.sm90_mma_major_mode(), b_layout.sm90_mma_major_mode(),
            Float32, (self.consumer_wgs, 1, 1), tiler_mn=(64, self.tile_mnk[1]))

        # --- shared-memory layouts: a swizzled atom tiled over the (tile, stages) shape. For a
        # k-contiguous A the atom is 8 rows x 64 k-values (8 x 128 bytes) and the swizzle is
        # Swizzle<3,4,3> on byte addresses; an m-contiguous A gets the transposed atom (64 m-values
        # x 8 k). The outer layout is plain; the swizzle is the ComposedLayout's inner function,
        # applied to every smem address (by TMA when writing, by the WGMMA descriptor when reading).
        # (bM, bK, S), (bN, bK, S) and (eM, eN, E)
        a_smem = sm90_utils.make_smem_layout_a(a_layout, self.tile_mnk, self.dtype, self.stages)
        b_smem = sm90_utils.make_smem_layout_b(b_layout, self.tile_mnk, self.dtype, self.stages)
        epi_smem = sm90_utils.make_smem_layout_epi(self.dtype, out_layout, self.epi_tile, self.epi_stages)

        # --- TMA descriptors (encoded here, on the host, from the runtime shapes and strides).
        # A box is one stage's tile; A is multicast along the cluster's N extent, B along its M.
        cm, cn = self.cluster_mn
        tma_a, tma_mA = cpasync.make_tiled_tma_atom(self.load_op(cn), mA, cute.slice_(a_smem, (None, None, 0)),
                                                    (self.tile_mnk[0], self.tile_mnk[2]), num_multicast=cn)
        tma_b, tma_mB = cpasync.make_tiled_tma_atom(self.load_op(cm), mB, cute.slice_(b_smem, (None, None, 0)),
                                                    (self.tile_mnk[1], self.tile_mnk[2]), num_multicast=cm)
        tma_out, tma_mOut = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), mOut,
                                                        cute.slice_(epi_smem, (None, None, 0)), self.epi_tile)

        # --- persistent grid: (cluster_m, cluster_n, clusters), each cluster loops over tiles
        tiles_mnl = (cute.ceil_div(m, self.tile_mnk[0]), cute.ceil_div(n, self.tile_mnk[1]), batch)
        sched_params = utils.PersistentTileSchedulerParams(tiles_mnl, (cm, cn, 1), self.swizzle, True)
        grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched_params, self.max_clusters)

        @cute.struct
        class SharedStorage:
            ab_barriers: cute.struct.MemRange[cutlass.Int64, self.stages * 2]  # full[S], empty[S]
            sA: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(a_smem)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(b_smem)], 1024]
            sOut: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(epi_smem)], 1024]

        self.shared_storage = SharedStorage

        self.kernel(tma_a, tma_mA, tma_b, tma_mB, tma_out, tma_mOut, mOut, mC, alpha, beta, tiled_mma,
                    a_smem, b_smem, epi_smem, sched_params).launch(
            grid=grid, block=[self.threads, 1, 1], cluster=(cm, cn, 1), min_blocks_per_mp=1,
            stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               tma_out: cute.CopyAtom, mOut: cute.Tensor, mOutMem: cute.Tensor, mC: cute.Tensor,
               alpha: Float32, beta: Float32, tiled_mma: cute.TiledMma, a_smem: cute.ComposedLayout,
               b_smem: cute.ComposedLayout, epi_smem: cute.ComposedLayout,
               sched_params: utils.PersistentTileSchedulerParams):
        # mA (M, K, La), mB (N, K, Lb) and mOut (M, N, L) are TMA coordinate tensors; mOutMem
        # (M, N, L) is out itself (for the epilogue's direct stores) and mC (M, N, L) C itself
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // self.threads_per_wg)
        if warp_idx == self.producer_warp:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
        if warp_idx == self.store_warp:
            cpasync.prefetch_descriptor(tma_out)

        # --- where this CTA sits in its cluster, and whom its loads multicast to
        cm, cn = self.cluster_mn
        cta_layout = cute.make_layout((cm, cn, 1))
        cluster_coord = cta_layout.get_flat_coord(cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster()))
        a_mcast_mask = cute.make_layout_image_mask(cta_layout, cluster_coord, mode=1) if cn > 1 else 0
        b_mcast_mask = cute.make_layout_image_mask(cta_layout, cluster_coord, mode=0) if cm > 1 else 0

        # --- shared memory and the (A, B) pipeline
        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        sA = storage.sA.get_tensor(a_smem.outer, swizzle=a_smem.inner)  # (bM, bK, S)
        sB = storage.sB.get_tensor(b_smem.outer, swizzle=b_smem.inner)  # (bN, bK, S)
        sOut = storage.sOut.get_tensor(epi_smem.outer, swizzle=epi_smem.inner)  # (eM, eN, E)
        stage_bytes = (cute.size_in_bytes(self.dtype, cute.slice_(a_smem, (None, None, 0)))
                       + cute.size_in_bytes(self.dtype, cute.slice_(b_smem, (None, None, 0))))
        # "full" completes on 1 arrive (the producer's expect-tx) plus the stage's bytes landing;
        # "empty" on one arrive per consumer warp of every CTA that shares the stage's data
        consumer_arrivals = (cm + cn - 1) * self.consumer_wgs * 4
        ab_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.ab_barriers.data_ptr(), num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_arrivals),
            tx_count=stage_bytes, cta_layout_vmnk=cute.make_layout((1, cm, cn, 1)), defer_sync=True)
        # the peer CTA must see our barriers initialised before it multicasts into us
        pipeline.pipeline_init_arrive(cluster_shape_mn=self.cluster_mn, is_relaxed=True)

        # --- global tiles: every (tile, k-step) of each operand, indexed per work tile below
        bM, bN, bK = self.tile_mnk
        gA = cute.local_tile(mA, (bM, bK), (None, None, None))  # (bM, bK, RestM, RestK, La)
        gB = cute.local_tile(mB, (bN, bK), (None, None, None))  # (bN, bK, RestN, RestK, Lb)
        gOut = cute.local_tile(mOut, self.tile_mnk[:2], (None, None, None))  # (bM, bN, RestM, RestN, L)
        gOutMem = cute.local_tile(mOutMem, self.tile_mnk[:2], (None, None, None))  # (bM, bN, RestM, RestN, L)
        gC = cute.local_tile(mC, self.tile_mnk[:2], (None, None, None))  # (bM, bN, RestM, RestN, L)
        cC = cute.local_tile(cute.make_identity_tensor(mC.shape), self.tile_mnk[:2],
                             (None, None, None))  # (bM, bN, RestM, RestN, L) of (m, n, l) coordinates
        k_tiles = cute.size(gA, mode=[3])
        # TMA partitions: (TMA, RestM, RestK, La) views of gmem and (TMA, S) views of smem. With
        # multicast each CTA loads 1/cluster of the box (its slice along the cluster), into all peers.
        tAsA, tAgA = cpasync.tma_partition(tma_a, cluster_coord[1], cute.make_layout(cn),
                                           cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cpasync.tma_partition(tma_b, cluster_coord[0], cute.make_layout(cm),
                                           cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))

        pipeline.pipeline_init_wait(cluster_shape_mn=self.cluster_mn)

        if wg_idx == self.consumer_wgs:  # ---------------- producer warpgroup
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == self.producer_warp:
                sched = utils.StaticPersistentTileScheduler.create(sched_params, cute.arch.block_idx(),
                                                                   cute.arch.grid_dim())
                work = sched.initial_work_tile_info()
                state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                batch_a, batch_b = cute.size(mA, mode=[2]), cute.size(mB, mode=[2])
                while work.is_valid_tile:
                    tile_m, tile_n, l = work.tile_idx
                    # a batch of 1 (stride 0 on the host) serves every batch index
                    tAgA_k = tAgA[(None, tile_m, None, cutlass.min(l, batch_a - 1))]  # (TMA, RestK)
                    tBgB_k = tBgB[(None, tile_n, None, cutlass.min(l, batch_b - 1))]  # (TMA, RestK)
                    state.reset_count()
                    for _ in cutlass.range(k_tiles, unroll=1):
                        ab_pipe.producer_acquire(state)  # wait until the stage is empty, arm "full"
                        full = ab_pipe.producer_get_barrier(state)
                        cute.copy(tma_a, tAgA_k[(None, state.count)], tAsA[(None, state.index)],
                                  tma_bar_ptr=full, mcast_mask=a_mcast_mask)
                        cute.copy(tma_b, tBgB_k[(None, state.count)], tBsB[(None, state.index)],
                                  tma_bar_ptr=full, mcast_mask=b_mcast_mask)
                        ab_pipe.producer_commit(state)  # a no-op: the TMA unit completes "full"
                        state.advance()
                    sched.advance_to_next_work()
                    work = sched.get_current_work()
                ab_pipe.producer_tail(state)  # do not exit while a peer may still signal us

        if wg_idx < self.consumer_wgs:  # ------------------- consumer warpgroups
            cute.arch.setmaxregister_increase(self.consumer_regs)
            # this warpgroup's slice of the MMA: 64 rows of the tile
            thr_mma = tiled_mma.get_slice(wg_idx * self.threads_per_wg)
            # WGMMA operands are smem descriptors, not registers: (MMA, MMA_M, MMA_K, S), (MMA, MMA_N, MMA_K, S)
            tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
            tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
            acc = cute.make_rmem_tensor(thr_mma.partition_C(gOut).shape[:3], Float32)  # (MMA, MMA_M, MMA_N)
            k_blocks = cute.size(tCrA, mode=[2])  # 4 WGMMAs of k = 16 per stage
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)  # acc += A B (acc is zeroed per tile)

            epi = self.epilogue_setup(tiled_mma, tidx, acc, sOut)
            store_pipe = pipeline.PipelineTmaStore.create(
                num_stages=self.epi_stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.consumer_threads))

            sched = utils.StaticPersistentTileScheduler.create(sched_params, cute.arch.block_idx(),
                                                               cute.arch.grid_dim())
            work = sched.initial_work_tile_info()
            read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            while work.is_valid_tile:
                tile_m, tile_n, l = work.tile_idx
                # --- mainloop: acc = A_tile @ B_tile, 64 k at a time. WGMMAs are asynchronous:
                # each k-step's 4 are committed as one group, and one group stays in flight while
                # the next k-step's are issued.
                acc.fill(0.0)
                for kt in cutlass.range(k_tiles, unroll=1):
                    ab_pipe.consumer_wait(read)  # the stage's bytes have landed
                    warpgroup.fence()  # register writes to acc (the fill) come before the WGMMAs
                    for kb in cutlass.range_constexpr(k_blocks):
                        cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read.index)],
                                  tCrB[(None, None, kb, read.index)], acc)
                    warpgroup.commit_group()
                    read.advance()
                    if kt > 0:
                        # the previous k-step's WGMMAs have retired: hand its stage back to the producer
                        warpgroup.wait_group(1)
                        ab_pipe.consumer_release(release)
                        release.advance()
                warpgroup.wait_group(0)
                ab_pipe.consumer_release(release)
                release.advance()

                tile = (None, None, tile_m, tile_n, l)
                self.epilogue(epi, acc, tma_out, gOut[tile], gOutMem[tile], gC[tile], cC[tile], mC.shape,
                              alpha, beta, sOut, store_pipe, sched.num_tiles_executed, warp_idx)
                sched.advance_to_next_work()
                work = sched.get_current_work()
            store_pipe.producer_tail()  # every TMA store has completed before the CTA exits

    # --------------------------------------------------------------------------------------------
    # Epilogue: acc (registers) -> alpha acc + beta C -> smem (stmatrix) -> out (TMA store)
    # --------------------------------------------------------------------------------------------
    @cute.jit
    def epilogue_setup(self, tiled_mma: cute.TiledMma, tidx: Int32, acc: cute.Tensor, sOut: cute.Tensor):
        """The register -> smem copy and the fragments the epilogue reuses for every tile."""
        # stmatrix writes 8x8 blocks of 16-bit values from the accumulator's register layout
        # (transposed for an m-contiguous out); tiled over the MMA, it covers one epilogue subtile
        store_atom = cute.make_copy_atom(warp.StMatrix8x8x16bOp(self.out_layout.is_m_major_c(), 4), self.dtype)
        r2s = cute.make_tiled_copy_S(store_atom, cute.make_tiled_copy_C_atom(store_atom, tiled_mma))
        thr_r2s = r2s.get_slice(tidx)
        tRS_sOut = thr_r2s.partition_D(sOut)  # (R2S, R2S_M, R2S_N, E)
        tRS_acc = r2s.retile(acc)  # the accumulators, grouped by epilogue subtile
        frag_shape = cute.shape(thr_r2s.partition_S(sOut))[:3]  # (R2S, R2S_M, R2S_N): one subtile's values
        return r2s, thr_r2s, tRS_sOut, tRS_acc, frag_shape

    @cute.jit
    def load_c(self, thr_r2s: cute.TiledCopy, gC: cute.Tensor, cC: cute.Tensor, shape: cute.Shape,
               rC: cute.Tensor):
        """C of one subtile into ``rC`` in the accumulator's register order; zero outside (M, N)."""
        tRG_gC = thr_r2s.partition_S(gC)  # (R2S, R2S_M, R2S_N): the C element under each register
        tRG_cC = thr_r2s.partition_S(cC)  # its (m, n, l) coordinates
        for i in cutlass.range_constexpr(cute.size(rC)):
            rC[i] = rC.element_type(0)
            if cute.elem_less(tRG_cC[i], shape):
                rC[i] = tRG_gC[i]

    @cute.jit
    def store_direct(self, thr_r2s: cute.TiledCopy, gOut: cute.Tensor, cOut: cute.Tensor,
                     shape: cute.Shape, rOut: cute.Tensor):
        """One subtile from registers straight to out (no smem, no TMA), element by element,
        skipping the elements outside (M, N): the mirror image of ``load_c``."""
        tRG_gOut = thr_r2s.partition_S(gOut)  # (R2S, R2S_M, R2S_N): the out element under each register
        tRG_cOut = thr_r2s.partition_S(cOut)  # its (m, n, l) coordinates
        for i in cutlass.range_constexpr(cute.size(rOut)):
            if cute.elem_less(tRG_cOut[i], shape):
                tRG_gOut[i] = rOut[i]

    @cute.jit
    def ends_inside(self, cOut: cute.Tensor, shape: cute.Shape):
        """Whether the (eM, eN) subtile with coordinates ``cOut`` ends before out's contiguous dim
        does (N for an n-contiguous out, M for an m-contiguous one), so that TMA may store it."""
        unit = 1 if self.out_n_major else 0
        last = cOut[(self.epi_tile[0] - 1, self.epi_tile[1] - 1)]  # (m, n, l) of its last element
        return last[unit] < shape[unit]

    @cute.jit
    def epilogue(self, epi: tuple, acc: cute.Tensor, tma_out: cute.CopyAtom, gOut: cute.Tensor,
                 gOutMem: cute.Tensor, gC: cute.Tensor, cC: cute.Tensor, shape: cute.Shape,
                 alpha: Float32, beta: Float32, sOut: cute.Tensor, store_pipe: pipeline.PipelineTmaStore,
                 tiles_done: Int32, warp_idx: Int32):
        """Store one tile: gOut (bM, bN) TMA coordinates, gOutMem (bM, bN) out itself, gC (bM, bN)
        C itself, cC (bM, bN) the (m, n, l) coordinates of all three, ``shape`` (M, N, L) for the
        edge masks."""
        r2s, thr_r2s, tRS_sOut, tRS_acc, frag_shape = epi
        barrier = pipeline.NamedBarrier(barrier_id=self.epi_barrier_id, num_threads=self.consumer_threads)
        # the TMA store's view: (eM x eN) boxes of this tile, and the smem buffers they come from
        gOut_epi = cute.zipped_divide(gOut, self.epi_tile)  # ((eM, eN), (EPI_M, EPI_N))
        bSG_sOut, bSG_gOut = cpasync.tma_partition(tma_out, 0, cute.make_layout(1),
                                                   cute.group_modes(sOut, 0, 2), gOut_epi)
        epi_shape = gOut_epi.shape[1]
        epi_order = cute.make_layout(epi_shape, stride=(epi_shape[1], 1))  # subtile index -> (EPI_M, EPI_N)
        subtiles = cute.size(epi_order)
        rAcc = cute.make_rmem_tensor(frag_shape, Float32)
        rOut = cute.make_rmem_tensor(frag_shape, self.dtype)
        # C of this tile: two register buffers, so the next subtile's loads overlap this one's store
        gC_epi = cute.flat_divide(gC, self.epi_tile)  # (eM, eN, EPI_M, EPI_N)
        cC_epi = cute.flat_divide(cC, self.epi_tile)  # coordinates of C and out alike
        gOutMem_epi = cute.flat_divide(gOutMem, self.epi_tile)  # (eM, eN, EPI_M, EPI_N)
        rC = [cute.make_rmem_tensor(frag_shape, self.dtype), cute.make_rmem_tensor(frag_shape, self.dtype)]
        if cutlass.const_expr(self.has_c):
            self.load_c(thr_r2s, gC_epi[None, None, 0, 0], cC_epi[None, None, 0, 0], shape, rC[0])

        for i in cutlass.range_constexpr(subtiles):
            em, en = epi_order.get_hier_coord(i)
            if cutlass.const_expr(self.has_c and i + 1 < subtiles):
                em1, en1 = epi_order.get_hier_coord(i + 1)
                self.load_c(thr_r2s, gC_epi[None, None, em1, en1], cC_epi[None, None, em1, en1],
                            shape, rC[(i + 1) % 2])
            for v in cutlass.range_constexpr(cute.size(rAcc)):
                rAcc[v] = tRS_acc[i * cute.size(rAcc) + v]
            result = rAcc.load() * alpha  # float32 throughout, one rounding below
            if cutlass.const_expr(self.has_c):
                result = result + rC[i % 2].load().to(Float32) * beta
            rOut.store(result.to(self.dtype))

            # TMA clips a box at out's edges, but along the contiguous dim only in 16-byte chunks:
            # a box crossing an extent that is not a multiple of 8 elements would also write the
            # elements after it, up to the next 16-byte boundary (another tensor's, when out is a
            # slice). With such a "ragged" out, the subtiles that cross that edge (at most one per
            # row of subtiles) are stored by the threads themselves, predicated per element; the
            # others, and every subtile of a non-ragged out, take the TMA path.
            buf = (tiles_done * subtiles + i) % self.epi_stages
            if cutlass.const_expr(self.out_ragged):
                by_tma = self.ends_inside(cC_epi[None, None, em, en], shape)  # the same in every thread
                if by_tma:
                    cute.copy(r2s, rOut, tRS_sOut[(None, None, None, buf)])
                else:
                    self.store_direct(thr_r2s, gOutMem_epi[None, None, em, en], cC_epi[None, None, em, en],
                                      shape, rOut)
            else:
                cute.copy(r2s, rOut, tRS_sOut[(None, None, None, buf)])
            # make the generic-proxy smem writes visible to the TMA (async proxy), then let every
            # consumer thread finish writing before one thread ships the subtile
            cute.arch.fence_proxy("async.shared", space="cta")
            barrier.arrive_and_wait()
            if warp_idx == self.store_warp:
                if cutlass.const_expr(self.out_ragged):
                    if by_tma:
                        cute.copy(tma_out, bSG_sOut[(None, buf)], bSG_gOut[(None, (em, en))])
                else:
                    cute.copy(tma_out, bSG_sOut[(None, buf)], bSG_gOut[(None, (em, en))])
                # a subtile stored directly commits an empty group: the buffer accounting stays the same
                store_pipe.producer_commit()
                store_pipe.producer_acquire()  # at most epi_stages - 1 stores still reading smem
            barrier.arrive_and_wait()  # so buffer buf + 1 is free before anyone writes it
