"""The general cute gemm: out <- alpha * A B + beta * C for any dtype, shape, stride and alignment.

The fast path (``_gemm_sm90``, Hopper WGMMA + TMA) takes only aligned float16/bfloat16 operands
with a unit stride. This kernel takes everything else, exactly: float32 (IEEE products, or TF32
tensor cores when ``torch.backends.cuda.matmul.allow_tf32`` is on), float16/bfloat16 with odd
sizes, unaligned bases (``x[1:]``) and any strides (transposed, sliced, stride-0 batches, a
broadcast C). FLOPs 2mnk per matrix; bytes at least (mk + kn + 2mn) * itemsize.

One kernel, three ways to multiply
----------------------------------
Every variant runs the same CTA program; only the *TiledMMA* (who multiplies what) changes:

    math     operands        TiledMMA (atom x layout of atoms)              CTA tile (M, N, K)  threads
    "simt"   float32 (IEEE)  1x1x1 FFMA x (16, 16) threads, 8 x 8 each       128 x 128 x 8       256
    "tf32"   float32 (TF32)  mma.sync m16n8k8 tf32 x (4, 2) warps            128 x 128 x 16      256
    "mma16"  float16, bf16   mma.sync m16n8k16, fp32 accumulate x (4, 2)     128 x 128 x 32      256

The CTA program (one CTA per (batch, tile_m, tile_n); consecutive CTAs walk GROUP_M tile-rows of
one column band so the A and B tiles they share are still in L2, as in the triton kernel):

    registers <- gmem tile k = 0 (predicated, out-of-range elements are 0);  smem[0] <- registers
    for k_tile in 0 .. k_tiles-1:
        registers <- gmem tile k_tile + 1        (issued first: the loads fly during the MMAs)
        acc += smem[k_tile % 2] tile product      (smem -> register fragments -> TiledMMA)
        smem[(k_tile + 1) % 2] <- registers
        barrier
    out <- alpha * acc + beta * C                 (float32, one rounding, predicated on M and N)

Why stage through registers instead of ``cp.async`` (gmem -> smem directly)? ``cp.async`` moves 4,
8 or 16 bytes: it cannot copy one 2-byte element, which is exactly what an unaligned float16
view needs. A register stage takes any vector width, zero-fills the out-of-range elements (so the
M, N and K tails multiply zeros, never stale shared memory) and lets the shared-memory layout be
chosen for the MMA independently of the global layout.

Global -> register copies are as wide as the operand allows (``_access``): an operand with a unit
stride in K ("k-major") or in M/N ("mn-major") is read in vectors of up to 16 bytes when its base
address, its other strides and its contiguous extent are multiples of the vector; otherwise
(including fully strided views) element by element, with threads still laid along the contiguous
dimension for coalescing. Every vector is predicated on its (row, k) coordinate; the extent check
makes a vector either wholly inside or wholly outside the matrix.

Shared-memory layouts follow the operand's major-ness so the register -> smem stores are
contiguous, and are arranged for the smem -> register reads of each MMA:
  - mma16: 8x(32|64) swizzled atoms read by ``ldmatrix`` (``.trans`` for mn-major);
  - tf32: padded rows (K-major pitch bK + 4, MN-major pitch bM + 8 words) so the 32 lanes of an
    m16n8k8 fragment read hit 32 different banks; tiles are rounded to TF32 once, when staged;
  - simt: always M/N-major (each thread reads 4 consecutive M or N values), padded by 4 words
    when filled from a K-major operand.

Sizes: M, N, K and batch are Int32 (checked < 2^31 - 2^10 on the host); strides are Int64, so every
address (batch * stride + row * stride + k * stride) is computed in 64 bits: a matrix may hold more
than 2^31 elements.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from ._compile import DTYPES, View, launch, pointer, stream_of

GROUP_M = 8  # tile-rows per L2 group (see the triton kernel)
_MAX_DIM = 2**31 - 2**10  # sizes and tile counts are Int32, with headroom for "size + tile - 1"


# ----------------------------------------------------------------------------- configurations

class _Config:
    """Everything the kernel bakes in for one math mode (Python constants at trace time)."""

    def __init__(self, math_mode: str, dtype):
        self.math, self.dtype = math_mode, dtype
        self.threads = 256
        self.bM, self.bN = 128, 128
        self.bK = {"simt": 8, "tf32": 16, "mma16": 32}[math_mode]
        # the type tiles have in shared memory: the MMA's operand type
        self.smem_dtype = cutlass.TFloat32 if math_mode == "tf32" else dtype

    def tiled_mma(self):
        """Who multiplies what: an MMA atom tiled over the CTA's threads (the table above)."""
        if self.math == "simt":
            # 256 threads as 16 x 16, each computing an 8 x 8 block of the 128 x 128 tile. The
            # permutation makes each thread's 8 rows two runs of 4 consecutive rows (and the same for
            # columns), so its smem reads are 128-bit vectors: thread t owns rows 4*(t//16) + {0..3}
            # and 64 + 4*(t//16) + {0..3}.
            threads = cute.make_layout((16, 16, 1), stride=(16, 1, 0))
            perm = cute.make_layout((16, 4), stride=(4, 1))
            return cute.make_tiled_mma(cute.nvgpu.MmaUniversalOp(Float32), threads,
                                       permutation_mnk=(perm, perm, None))
        # tensor cores: 8 warps as 4 (M) x 2 (N), each computing a 32 x 64 piece of the 128 x 128 tile
        if self.math == "tf32":
            op = cute.nvgpu.warp.MmaTF32Op((16, 8, 8))
            return cute.make_tiled_mma(op, cute.make_layout((4, 2, 1)), permutation_mnk=(64, 16, 8))
        op = cute.nvgpu.warp.MmaF16BF16Op(self.dtype, Float32, (16, 8, 16))
        # N permutation 32 (not 16): a warp's B fragment for one k-block is then 16 columns, which
        # one ldmatrix.x4 loads
        return cute.make_tiled_mma(op, cute.make_layout((4, 2, 1)), permutation_mnk=(64, 32, 16))

    def smem_layout(self, major: str, rows: int, stages: int):
        """(rows, bK, stages) layout of one operand's tiles, plus the swizzle of its pointer (or None)."""
        bK = self.bK
        if self.math == "simt":  # always M/N-major; padded when the stores come from K-major vectors
            pitch = rows + (4 if major == "k" else 0)
            return cute.make_layout((rows, bK, stages), stride=(1, pitch, pitch * bK)), None
        if self.math == "tf32":
            if major == "k":
                pitch = bK + 4
                return cute.make_layout((rows, bK, stages), stride=(pitch, 1, pitch * rows)), None
            pitch = rows + 8
            return cute.make_layout((rows, bK, stages), stride=(1, pitch, pitch * bK)), None
        # mma16 (the layouts of CUTLASS's Ampere tensorop example): atoms of 8 rows of up to 64
        # contiguous elements, whose 16-byte chunks are XOR-swizzled (on byte addresses: bits
        # [7, 7 + bits) into [4, 4 + bits)) so that the 8 16-byte rows one ldmatrix reads fall in
        # 8 different bank groups.
        contiguous = min(bK if major == "k" else rows, 64)
        bits = min(int(math.log2(contiguous * self.dtype.width // 128)), 3)
        swizzle = cute.make_swizzle(bits, 4, 3)
        if major == "k":
            atom = cute.make_layout((8, contiguous), stride=(contiguous, 1))
        else:
            atom = cute.make_layout((contiguous, 8), stride=(1, contiguous))
        return cute.tile_to_shape(atom, (rows, bK, stages), (0, 1, 2)), swizzle

    def s2r_atom(self, major: str):
        """The copy atom reading MMA fragments from shared memory."""
        if self.math == "mma16":
            return cute.make_copy_atom(cute.nvgpu.warp.LdMatrix8x8x16bOp(major != "k", 4), self.dtype)
        return cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.smem_dtype)

    def gmem_copy(self, major: str, vec: int, rows: int):
        """Tiled copy of a (rows, bK) gmem tile to registers: threads along the contiguous dim."""
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype,
                                   num_bits_per_copy=self.dtype.width * vec)
        if major == "k":
            along_k = self.bK // vec
            threads = cute.make_layout((self.threads // along_k, along_k), stride=(along_k, 1))
            values = cute.make_layout((1, vec))
        else:
            along_rows = rows // vec
            threads = cute.make_layout((along_rows, self.threads // along_rows), stride=(1, along_rows))
            values = cute.make_layout((vec, 1))
        return cute.make_tiled_copy_tv(atom, threads, values)


# ----------------------------------------------------------------------------- the kernel

def _operand(ptr, rows, K, L, s_rows, s_k, s_l, major: str, vec: int):
    """An operand as a (rows, K, L) tensor. With vec > 1 its contiguous stride is a static 1 and
    the others are declared multiples of vec: what lets the copies be vec-wide vectors."""
    if vec == 1:
        stride = (s_rows, s_k, s_l)
    elif major == "k":
        stride = (cute.assume(s_rows, divby=vec), 1, cute.assume(s_l, divby=vec))
    else:
        stride = (1, cute.assume(s_k, divby=vec), cute.assume(s_l, divby=vec))
    return cute.make_tensor(ptr, cute.make_layout((rows, K, L), stride=stride))


def _load_tile(tiled_copy, tXgX, tXcX, tXrX, tXpX, k_tile, limits):
    """Registers <- one (rows, bK) gmem tile; vectors outside ``limits`` = (rows, K) read as 0."""
    for v in range(cute.size(tXpX, mode=[0])):  # plain Python loops: unrolled at trace time
        for i in range(cute.size(tXpX, mode=[1])):
            for j in range(cute.size(tXpX, mode=[2])):
                # the coordinate of the vector's first element decides for the whole vector
                tXpX[v, i, j] = cute.elem_less(tXcX[(0, v), i, j, k_tile], limits)
    tXrX.fill(0)
    cute.copy(tiled_copy, tXgX[None, None, None, k_tile], tXrX, pred=tXpX)


def _store_tile(tXrX, tXsX, stage, smem_dtype):
    """smem[stage] <- registers, rounded to TF32 on the way when the MMA multiplies TF32."""
    if cutlass.const_expr(smem_dtype is cutlass.TFloat32):
        # cvt.rna.tf32.f32 (round to nearest, ties away: what torch and triton's tf32 do); the DSL's
        # .to(TFloat32) would only relabel the bits, leaving the tensor core to truncate them
        bits = cute.make_rmem_tensor_like(tXrX, Int32)
        for i in range(cute.size(tXrX)):
            bits[i] = Int32(cute.arch.cvt_f32_tf32(tXrX[i]))
        tXrX = cute.make_tensor(cute.recast_ptr(bits.iterator, dtype=smem_dtype), bits.layout)
    cute.autovec_copy(tXrX, tXsX[None, None, None, stage])


def _factory(dtype_t: torch.dtype, math_mode: str, a_major: str, a_vec: int, b_major: str, b_vec: int,
             has_c: bool):
    """The @cute.jit host function for one variant. The key: dtype; math mode ("simt", "tf32",
    "mma16"); each operand's major ("k" or "mn") and vector width (elements); whether C is given.
    The last is not used here: a None C (beta == 0) is a compile-time fact of the argument itself,
    but it must be in the key so that the two signatures are cached apart."""
    cfg = _Config(math_mode, DTYPES[dtype_t])
    bM, bN, bK, stages = cfg.bM, cfg.bN, cfg.bK, 2
    tiler = (bM, bN, bK)

    @cute.kernel
    def kernel(mA: cute.Tensor, mB: cute.Tensor, mC: Optional[cute.Tensor], mO: cute.Tensor, alpha: Float32,
               beta: Float32):
        # mA (M, K, L), mB (N, K, L), mC (None when beta == 0) and mO (M, N, L)
        tidx, _, _ = cute.arch.thread_idx()
        pid, _, _ = cute.arch.block_idx()
        M, K, _ = mA.shape
        N = mB.shape[0]

        # ---- which tile: batch-major, then grouped ordering of the (tiles_m, tiles_n) grid
        tiles_m = (M + bM - 1) // bM
        tiles_n = (N + bN - 1) // bN
        batch = pid // (tiles_m * tiles_n)
        tile = pid % (tiles_m * tiles_n)
        group = tile // (GROUP_M * tiles_n)
        first_m = group * GROUP_M
        group_m = cutlass.min(tiles_m - first_m, GROUP_M)  # the last group may be shorter
        tile_m = first_m + (tile % (GROUP_M * tiles_n)) % group_m
        tile_n = (tile % (GROUP_M * tiles_n)) // group_m
        coord = (tile_m, tile_n, None)

        # ---- this CTA's tiles, and the same tiles of coordinates (for the predicates)
        gA = cute.local_tile(mA[None, None, batch], tiler, coord, proj=(1, None, 1))  # (bM, bK, k_tiles)
        gB = cute.local_tile(mB[None, None, batch], tiler, coord, proj=(None, 1, 1))  # (bN, bK, k_tiles)
        gO = cute.local_tile(mO[None, None, batch], tiler, coord, proj=(1, 1, None))  # (bM, bN)
        cA = cute.local_tile(cute.make_identity_tensor((M, K)), tiler, coord, proj=(1, None, 1))
        cB = cute.local_tile(cute.make_identity_tensor((N, K)), tiler, coord, proj=(None, 1, 1))
        cO = cute.local_tile(cute.make_identity_tensor((M, N)), tiler, coord, proj=(1, 1, None))
        k_tiles = (K + bK - 1) // bK

        # ---- shared memory: two stages of A and B tiles
        sA_layout, sA_swizzle = cfg.smem_layout(a_major, bM, stages)
        sB_layout, sB_swizzle = cfg.smem_layout(b_major, bN, stages)
        # 1024-byte aligned: a swizzle permutes addresses within aligned blocks of up to 1 KB
        smem = cutlass.memory.SmemAllocator()
        sA = smem.allocate_tensor(cfg.smem_dtype, sA_layout, 1024, swizzle=sA_swizzle)  # (bM, bK, 2)
        sB = smem.allocate_tensor(cfg.smem_dtype, sB_layout, 1024, swizzle=sB_swizzle)  # (bN, bK, 2)

        # ---- global -> register -> shared copies, partitioned per thread
        copy_a, copy_b = cfg.gmem_copy(a_major, a_vec, bM), cfg.gmem_copy(b_major, b_vec, bN)
        thr_a, thr_b = copy_a.get_slice(tidx), copy_b.get_slice(tidx)
        # gmem and coordinates (CPY, CPY_M, CPY_K, k_tiles); smem (CPY, CPY_M, CPY_K, 2)
        tAgA, tAcA, tAsA = thr_a.partition_S(gA), thr_a.partition_S(cA), thr_a.partition_D(sA)
        tBgB, tBcB, tBsB = thr_b.partition_S(gB), thr_b.partition_S(cB), thr_b.partition_D(sB)
        tArA = cute.make_rmem_tensor_like(tAgA[None, None, None, 0])  # (CPY, CPY_M, CPY_K)
        tBrB = cute.make_rmem_tensor_like(tBgB[None, None, None, 0])
        # one predicate per vector: (vectors per atom, CPY_M, CPY_K)
        tApA = cute.make_rmem_tensor((tAgA.shape[0][1], cute.size(tAgA, mode=[1]), cute.size(tAgA, mode=[2])),
                                     cutlass.Boolean)
        tBpB = cute.make_rmem_tensor((tBgB.shape[0][1], cute.size(tBgB, mode=[1]), cute.size(tBgB, mode=[2])),
                                     cutlass.Boolean)

        # ---- MMA partitions: smem -> register fragments, and the float32 accumulators
        tiled_mma = cfg.tiled_mma()
        thr_mma = tiled_mma.get_slice(tidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA)[None, None, None, 0])  # (MMA, MMA_M, MMA_K)
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB)[None, None, None, 0])  # (MMA, MMA_N, MMA_K)
        acc = tiled_mma.make_fragment_C(tiled_mma.partition_shape_C((bM, bN)))          # (MMA, MMA_M, MMA_N)
        acc.fill(0.0)
        s2r_a = cute.make_tiled_copy_A(cfg.s2r_atom(a_major), tiled_mma)
        s2r_b = cute.make_tiled_copy_B(cfg.s2r_atom(b_major), tiled_mma)
        thr_s2r_a, thr_s2r_b = s2r_a.get_slice(tidx), s2r_b.get_slice(tidx)
        # smem (CPY, CPY_M, CPY_K, 2) and the same fragments seen as that copy's destination
        tCsA, tCrA_view = thr_s2r_a.partition_S(sA), thr_s2r_a.retile(tCrA)
        tCsB, tCrB_view = thr_s2r_b.partition_S(sB), thr_s2r_b.retile(tCrB)

        # ---- prologue: k-tile 0 into stage 0
        if k_tiles > 0:
            _load_tile(copy_a, tAgA, tAcA, tArA, tApA, 0, (M, K))
            _load_tile(copy_b, tBgB, tBcB, tBrB, tBpB, 0, (N, K))
            _store_tile(tArA, tAsA, 0, cfg.smem_dtype)
            _store_tile(tBrB, tBsB, 0, cfg.smem_dtype)
        cute.arch.sync_threads()

        # ---- mainloop: one barrier per k-tile (stage s is read while stage 1 - s is written)
        for k_tile in cutlass.range(k_tiles, unroll=1):
            stage = k_tile % 2
            if k_tile + 1 < k_tiles:
                _load_tile(copy_a, tAgA, tAcA, tArA, tApA, k_tile + 1, (M, K))
                _load_tile(copy_b, tBgB, tBcB, tBrB, tBpB, k_tile + 1, (N, K))
            for k_block in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                cute.copy(s2r_a, tCsA[None, None, k_block, stage], tCrA_view[None, None, k_block])
                cute.copy(s2r_b, tCsB[None, None, k_block, stage], tCrB_view[None, None, k_block])
                cute.gemm(tiled_mma, acc, tCrA[None, None, k_block], tCrB[None, None, k_block], acc)
            if k_tile + 1 < k_tiles:
                _store_tile(tArA, tAsA, 1 - stage, cfg.smem_dtype)
                _store_tile(tBrB, tBsB, 1 - stage, cfg.smem_dtype)
            cute.arch.sync_threads()

        # ---- epilogue: out = alpha * acc + beta * C in float32, one rounding, M/N predicated.
        # Each element of C is read by the thread that then writes that element of out, so
        # out may be C itself (in-place gemm).
        tCgO, tCcO = thr_mma.partition_C(gO), thr_mma.partition_C(cO)  # (MMA, MMA_M, MMA_N)
        if cutlass.const_expr(mC is not None):
            tCgC = thr_mma.partition_C(cute.local_tile(mC[None, None, batch], tiler, coord, proj=(1, 1, None)))
        for i in cutlass.range_constexpr(cute.size(acc)):
            if cute.elem_less(tCcO[i], (M, N)):
                value = alpha * acc[i]
                if cutlass.const_expr(mC is not None):
                    value = value + beta * tCgC[i].to(Float32)
                tCgO[i] = value.to(mO.element_type)

    @cute.jit
    def host(pA: cute.Pointer, pB: cute.Pointer, pC: Optional[cute.Pointer], pO: cute.Pointer,
             M: Int32, N: Int32, K: Int32, L: Int32,
             sa_l: Int64, sa_m: Int64, sa_k: Int64, sb_l: Int64, sb_k: Int64, sb_n: Int64,
             sc_l: Int64, sc_m: Int64, sc_n: Int64, so_l: Int64, so_m: Int64, so_n: Int64,
             alpha: Float32, beta: Float32, stream_: cuda.CUstream):
        mA = _operand(pA, M, K, L, sa_m, sa_k, sa_l, a_major, a_vec)  # (M, K, L)
        mB = _operand(pB, N, K, L, sb_n, sb_k, sb_l, b_major, b_vec)  # (N, K, L): B^T, CuTe's convention
        mC = None if pC is None else cute.make_tensor(pC, cute.make_layout((M, N, L), stride=(sc_m, sc_n, sc_l)))
        mO = cute.make_tensor(pO, cute.make_layout((M, N, L), stride=(so_m, so_n, so_l)))
        tiles = L * ((M + bM - 1) // bM) * ((N + bN - 1) // bN)
        kernel(mA, mB, mC, mO, alpha, beta).launch(grid=[tiles, 1, 1], block=[cfg.threads, 1, 1], stream=stream_)

    return host


# ----------------------------------------------------------------------------- host side

def _access(itemsize: int, misalignment: int, rows: int, k: int, s_rows: int, s_k: int,
            s_l: int) -> tuple[str, int]:
    """(major, vector width) for one operand seen as (rows, k) matrices with these strides, of
    ``itemsize``-byte elements starting ``misalignment`` bytes past a 16-byte boundary.

    major is "k" when K has unit stride, "mn" when rows do, else "k" (element-wise, any strides).
    The vector width is the widest power of two, up to 16 bytes, dividing the base address (in
    elements), the other strides and the contiguous extent: then every vector of every tile is
    aligned and lies wholly inside or wholly outside the matrix.
    """
    if s_k == 1:
        major, extent, others = "k", k, (s_rows, s_l)
    elif s_rows == 1:
        major, extent, others = "mn", rows, (s_k, s_l)
    else:
        return "k", 1
    vec = 16 // itemsize
    while vec > 1 and (misalignment % (vec * itemsize) or extent % vec or any(s % vec for s in others)):
        vec //= 2
    return major, vec


def plan(dtype: torch.dtype, tf32: bool, a: View, b: View, c: View | None, o: View):
    """``(key, pointer alignments (A, B, C, out) in bytes, numbers)`` of the launch for 3-D operands
    of ``dtype`` (A (L, M, K), B (L, K, N), C None or (L, M, N), out (L, M, N)), ``tf32``: whether
    float32 may multiply in TF32. ``numbers`` are the 18 between the pointers and alpha."""
    L, M, K = a.shape
    N = b.shape[2]
    if max(L, M, N, K) > _MAX_DIM or L * -(-M // 128) * -(-N // 128) > _MAX_DIM:
        raise ValueError(f"gemm: A is {tuple(a.shape)} and B is {tuple(b.shape)}; the cute kernel takes "
                         f"dimensions and tile counts below {_MAX_DIM}")
    # A dimension of size 1 is only ever indexed at 0: its stride does not matter, and 0 makes it
    # divisible by every vector width.
    sa_l, sa_m, sa_k = (s if n > 1 else 0 for n, s in zip(a.shape, a.stride))
    sb_l, sb_k, sb_n = (s if n > 1 else 0 for n, s in zip(b.shape, b.stride))
    size = dtype.itemsize
    a_major, a_vec = _access(size, a.misalignment, M, K, sa_m, sa_k, sa_l)
    b_major, b_vec = _access(size, b.misalignment, N, K, sb_n, sb_k, sb_l)
    if dtype == torch.float32:
        math_mode = "tf32" if tf32 else "simt"
    else:
        math_mode = "mma16"
    key = (dtype, math_mode, a_major, a_vec, b_major, b_vec, c is not None)
    # plain Python numbers: the host function's annotations (Int32, Int64) type them
    numbers = (M, N, K, L, sa_l, sa_m, sa_k, sb_l, sb_k, sb_n, *((0, 0, 0) if c is None else c.stride), *o.stride)
    return key, (a_vec * size, b_vec * size, size, size), numbers


def gemm_general(A, B, C, alpha, beta, out):
    """``out <- alpha * A B + beta * C`` for 3-D A (L, M, K), B (L, K, N), C None or (L, M, N), out
    (L, M, N). (gemm.py's ``gemm`` launches the same plan from its own cache.)"""
    key, (align_a, align_b, align_c, align_o), numbers = plan(
        A.dtype, A.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32,
        View.of(A), View.of(B), None if C is None else View.of(C), View.of(out))
    launch(_factory, key, pointer(A, align_a), pointer(B, align_b), None if C is None else pointer(C, align_c),
           pointer(out, align_o), *numbers, float(alpha), float(beta), stream_of(out))
    return out
