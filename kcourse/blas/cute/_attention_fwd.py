"""The cute attention forward kernel, and the tile machinery that the backward kernels share with it.

Math (per batch b, query head h, its kv head g = h // (H / Hkv), c = scale; docs/attention.md):

    S = c q k^T (Tq, Tk)    P = softmax_rows(S) (causal: key j visible to query i iff j <= i)
    out = P v (Tq, D)       lse_i = log sum_j exp S_ij  (float32, saved for the backward)

With kv_len (an int32 (B,) tensor, a KV cache of Tk slots of which batch b fills the first
kv_len[b]), batch b sees only keys j < L_b = clamp(kv_len[b], 0, Tk), beside the causal mask (still
top-left aligned). L_b is read by the kernel, never by the host: one launch serves every length (a
CUDA graph replays it as the cache grows). A row that sees no key (L_b = 0) gets out = 0, lse = -inf.

FLOPs 4 B H Tq Tk D (about half of it with the causal mask); bytes, at least, (2 B H Tq D + 2 B Hkv
Tk D) * itemsize + 4 B H Tq for lse. S and P never reach device memory.

The kernel: FlashAttention-2 on mma.sync
----------------------------------------
One CTA of 4 warps per (tile of ROWS queries, query head, batch). The query tile sits in shared
memory for the whole kernel; the keys and values stream through a two-stage shared-memory ring,
COLS keys at a time, loaded with ``cp.async`` (16-byte vectors where the strides allow) while the
previous tile is being multiplied. Per key tile:

    S   = Q K^T * c log2(e)          (ROWS, COLS) float32 in registers (mma.sync, "ss": A and B from smem)
    mask: S = -inf where key >= L, or (causal) key > query   (only in the tiles that need it)
    m'  = max(m, rowmax S)           running row max, in log2 units
    P   = exp2(S - m')               alpha = exp2(m - m')
    l   = alpha l + rowsum P         O = alpha O + P V    ("rs": A = P straight from registers)

and at the end out = O / l, lse = (m + log2 l) ln 2. Each warp owns 16 (or 32) whole rows of S, so a
row max or row sum needs only the 4 lanes of a quad (two butterfly shuffles), never shared memory.
L is Tk, or with kv_len the CTA's L_b (loaded once, clamped): the key tiles run up to ceil(L / COLS)
(causal: ceil(min(row0 + ROWS, L) / COLS)), and key rows past L are never loaded. The keys are walked
from 0 upwards, so every row has seen key 0 (visible to every query where L >= 1) after the first
tile and its max is finite from then on; L = 0 runs no tile, and l = 0 gives out = 0 and (kv_len's
kernel says so explicitly) lse = -inf. Tiles every row sees in full run without the mask.
CTAs of the last query tiles start first (``block_idx.x`` reversed): under the causal mask they are
the longest.

The accumulator of S is reused as the A operand of P V without leaving registers (the register
layout of an m16n8 accumulator is that of the A operand, FlashAttention-2's trick): for 16-bit
inputs two n8 accumulator blocks are one k16 A block; for TF32 (m16n8k8) a thread's accumulator
holds keys (2t, 2t+1) where the A operand wants (t, t+4), so the keys of each 8-block are permuted:
the A operand's k-slot t + 4h is key 2t + h, and the V tile is read through the same permutation
(``Tiles.transposed``), which leaves the product unchanged. The TF32 A fragment is a compact copy of
the accumulator in that order (``Tiles.as_operand_a``: register renaming, no instruction), never a
strided view of it, which ``cute.gemm`` reads wrongly (tests/test_cute_compile_attention.py checks
the registers the MMAs get in the generated PTX).

Math modes (``Tiles.math``)
---------------------------
    "mma16"   float16/bfloat16: mma.sync m16n8k16, float32 accumulation; P is rounded to the input
              dtype before P V (as FlashAttention and the triton kernel).
    "3xtf32"  float32: mma.sync m16n8k8 TF32 with each operand split as x = big + small (both TF32,
              big = round(x), small = round(x - big)); a b = big_a big_b + big_a small_b + small_a
              big_b (small_a small_b, ~2^-22 relative, is dropped): float32-level accuracy on tensor
              cores, at three MMAs per product. The default for float32 (IEEE, like torch).
    "tf32"    float32 with ``torch.backends.cuda.matmul.allow_tf32``: one TF32 MMA (operands rounded
              to nearest), as torch and the triton kernel then do.

Shared-memory layouts: 16-bit tiles are rows of Dp elements in 8 x 64 (or 8 x 32) atoms whose
16-byte chunks are XOR-swizzled, so the 8 rows an ``ldmatrix`` reads (and the ``ldmatrix.trans``
reads of a transposed operand) fall in 8 different bank groups. Float32 tiles are rows padded to
Dp + 4 words: the 32 lanes of an m16n8k8 fragment read (row g, column t) hit bank 4 g + t, all
different, and the transposed (permuted) reads hit 8 t + g.

Head dim: the kernels are compiled for Dp = D rounded up to a multiple of 32 (32, 64, 96, 128);
columns D..Dp are never loaded (their shared memory is zeroed once), so they add zeros to every
product. Sequence tails: rows past T (the forward's keys: past L) are never loaded either; they hold
zeros or a previous tile's (finite) rows, which the masks (forward, dQ) or lse = +inf (dK, dV) turn
into exact zeros (a KV cache's unfilled slots are never read, whatever they hold).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import warp

from ._compile import DTYPES
from ._reduce import async_copy_atom, predicate

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
WARPS = 4
THREADS = 32 * WARPS
STAGES = 2  # the streamed tiles' shared-memory ring


# ----------------------------------------------------------------------------- tile sizes

def tile_shape(kernel: str, math_mode: str, Dp: int) -> tuple[int, int]:
    """(ROWS, COLS): the resident and the streamed tile of ``kernel`` ("fwd", "dq", "dkdv").

    ROWS is a multiple of 64 (4 warps x 16 rows), COLS of 16. Chosen so that no kernel spills
    registers (ptxas, sm_90a, at most 255 per thread; checked with ``cuobjdump -res-usage`` for every
    dtype x Dp x causal: 78 to 255 registers, at most 16 bytes of stack, touched once per tile):
      - 16-bit forward: 128 queries x 32 keys up to Dp = 64 (two m16 blocks per warp: each K, V
        fragment read from smem feeds two MMAs), 64 x 64 above (128 x 64 spills at Dp = 128);
      - 16-bit dQ 64 x 64; dK/dV 64 keys x 64 queries, 32 at Dp > 64 (two Dp-wide accumulators);
      - float32 (TF32 MMAs, padded float32 rows): 64 x 32, dK/dV 64 x 16 at Dp > 64.
    Shared memory at Dp = 128, 16-bit: 64 KB (forward), 96 KB (dQ), 64 KB (dK/dV); float32: 101 KB
    (forward), 135 KB (dQ), 101 KB (dK/dV): an A100 or H100 (sm_86/sm_89 allow 99 KB).
    """
    if math_mode != "mma16":
        return (64, 16) if kernel == "dkdv" and Dp > 64 else (64, 32)
    if kernel == "fwd":
        return (128, 32) if Dp <= 64 else (64, 64)
    if kernel == "dq":
        return 64, 64
    return 64, (64 if Dp <= 64 else 32)


# ----------------------------------------------------------------------------- the tile machinery

def _copy_width(Dp: int) -> int:
    """Elements of a row that one pass of a tiled copy covers: the 16-bit swizzle atom's width."""
    return 64 if Dp % 64 == 0 else 32


@dataclass(frozen=True)
class Tiles:
    """Everything a kernel bakes in, as trace-time constants: the element type, the math mode, the
    padded head dim Dp, the resident tile (ROWS, Dp), the streamed tile (COLS, Dp), the gmem vector
    width (elements) and the tiled MMA. Built inside a kernel by ``Tiles.make`` (CuTe objects need
    the trace context); frozen, so the DSL knows a dynamic loop does not modify it."""

    dtype: type
    math: str
    Dp: int
    rows: int
    cols: int
    vec: int
    tiled_mma: cute.TiledMma

    @staticmethod
    def make(dtype, math_mode: str, Dp: int, rows: int, cols: int, vec: int) -> "Tiles":
        # warps side by side along M (each owns whole rows: row reductions stay inside a quad); the
        # N permutation of 16 makes one ldmatrix.x4 load a 16 x 16 B block
        if math_mode == "mma16":
            op, k_atom = warp.MmaF16BF16Op(dtype, Float32, (16, 8, 16)), 16
        else:
            op, k_atom = warp.MmaTF32Op((16, 8, 8)), 8
        tiled_mma = cute.make_tiled_mma(op, (WARPS, 1, 1), permutation_mnk=(WARPS * 16, 16, k_atom))
        # the copies' thread layout covers whole tiles: (THREADS / threads per row) rows per pass
        rows_per_pass = THREADS // (_copy_width(Dp) // vec)
        assert rows % (WARPS * 16) == 0 and cols % 16 == 0, (rows, cols)
        assert rows % rows_per_pass == 0 and cols % rows_per_pass == 0, (rows, cols, Dp, vec)
        return Tiles(dtype, math_mode, Dp, rows, cols, vec, tiled_mma)

    @property
    def tf32(self) -> bool:
        return self.math != "mma16"

    # ---- shared memory
    def smem_layout(self, rows: int, stages: int):
        """(rows, Dp, stages) layout of a Q/K/V/dO tile (see the module doc)."""
        Dp = self.Dp
        if self.tf32:
            pitch = Dp + 4
            return cute.make_layout((rows, Dp, stages), stride=(pitch, 1, pitch * rows))
        width = _copy_width(Dp)  # elements per swizzle atom row (128 or 64 bytes)
        bits = 3 if width == 64 else 2
        atom = cute.make_composed_layout(cute.make_swizzle(bits, 3, 3), 0,
                                         cute.make_layout((8, width), stride=(width, 1)))
        return cute.tile_to_shape(atom, (rows, Dp, stages), (0, 1, 2))

    def smem_tile(self, rows: int, stages: int):
        smem = cutlass.memory.SmemAllocator()
        return smem.allocate_tensor(self.dtype, self.smem_layout(rows, stages), 1024)

    def transposed(self, s: cute.Tensor) -> cute.Tensor:
        """(Dp, n, stages) view of an (n, Dp, stages) tile: the B operand of P V, dS K, P^T dO,
        dS^T Q. For TF32 the keys of each 8-block are read permuted (slot t + 4h is row 2t + h),
        matching the A operand that P's accumulator registers make (module doc)."""
        n, Dp = self.cols, self.Dp
        stages = cute.size(s, mode=[2])
        if self.tf32:
            view = cute.make_layout((Dp, (4, 2, n // 8), stages), stride=(n, (2, 1, 8), n * Dp))
        else:
            view = cute.make_layout((Dp, n, stages), stride=(n, 1, n * Dp))
        return cute.composition(s, view)

    # ---- global -> shared copies (cp.async) and shared -> global stores
    def _thread_layout(self):
        per_row = _copy_width(self.Dp) // self.vec
        return cute.make_layout((THREADS // per_row, per_row), stride=(per_row, 1))

    def g2s(self):
        """cp.async tiled copy: threads along the head dim, ``vec`` elements (4, 8 or 16 bytes) each."""
        return cute.make_tiled_copy_tv(async_copy_atom(self.dtype, self.vec), self._thread_layout(),
                                       cute.make_layout((1, self.vec)))

    def s2g(self):
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype,
                                   num_bits_per_copy=self.dtype.width * self.vec)
        return cute.make_tiled_copy_tv(atom, self._thread_layout(), cute.make_layout((1, self.vec)))

    # ---- shared -> register copies feeding the MMAs
    def _s2r(self, tiled_copy_maker, transpose: bool):
        if self.tf32:
            atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32)
        else:
            atom = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose, 4), self.dtype)
        return tiled_copy_maker(atom, self.tiled_mma)

    def operand_a(self, tidx, s: cute.Tensor, rows: int):
        """(copy, smem partition (CPY, M, K, stages), register fragment (MMA, MMA_M, MMA_K), its copy view)
        of an A operand (rows, Dp) held in smem, K-major."""
        copy = self._s2r(cute.make_tiled_copy_A, False)
        frag = cute.make_rmem_tensor(self.tiled_mma.partition_shape_A((rows, self.Dp)), self.frag_dtype())
        thr = copy.get_slice(tidx)
        return copy, thr.partition_S(s), frag, thr.retile(frag)

    def operand_b(self, tidx, s: cute.Tensor, n: int, k: int, transpose: bool):
        """The same for a B operand (n, k) in smem: K-major, or (transpose) an MN-major view."""
        copy = self._s2r(cute.make_tiled_copy_B, transpose)
        frag = cute.make_rmem_tensor(self.tiled_mma.partition_shape_B((n, k)), self.frag_dtype())
        thr = copy.get_slice(tidx)
        return copy, thr.partition_S(s), frag, thr.retile(frag)

    def frag_dtype(self):
        """Registers hold operands as loaded: the input dtype, or float32 (split into TF32 per MMA)."""
        return Float32 if self.tf32 else self.dtype

    def acc(self, rows: int, cols: int) -> cute.Tensor:
        """A zeroed float32 accumulator fragment of a (rows, cols) tile: ((2, 2), MMA_M, MMA_N)."""
        acc = cute.make_rmem_tensor(self.tiled_mma.partition_shape_C((rows, cols)), Float32)
        acc.fill(0.0)
        return acc

    # ---- the multiplications
    def mma(self, acc: cute.Tensor, a: cute.Tensor, b: cute.Tensor):
        """acc += a b for one k-block of register fragments (float32 ones are split into TF32)."""
        if cutlass.const_expr(not self.tf32):
            cute.gemm(self.tiled_mma, acc, a, b, acc)
        elif cutlass.const_expr(self.math == "tf32"):
            cute.gemm(self.tiled_mma, acc, _tf32(a), _tf32(b), acc)
        else:
            a_big, a_small = _split_tf32(a)
            b_big, b_small = _split_tf32(b)
            cute.gemm(self.tiled_mma, acc, a_small, b_big, acc)  # the small terms first
            cute.gemm(self.tiled_mma, acc, a_big, b_small, acc)
            cute.gemm(self.tiled_mma, acc, a_big, b_big, acc)

    def gemm_ss(self, acc, a_op, b_op, a_stage, b_stage):
        """acc (M, N) += A (M, K) B (N, K)^T, both operands in shared memory (K = Dp)."""
        copy_a, tXsA, rA, tXrA = a_op
        copy_b, tXsB, rB, tXrB = b_op
        for k in range(cute.size(rA, mode=[2])):
            cute.copy(copy_a, tXsA[None, None, k, a_stage], tXrA[None, None, k])
            cute.copy(copy_b, tXsB[None, None, k, b_stage], tXrB[None, None, k])
            self.mma(acc, rA[None, None, k], rB[None, None, k])

    def gemm_rs(self, acc, p: cute.Tensor, b_op, b_stage):
        """acc (M, Dp) += P (M, COLS) B^T with P a float32 accumulator fragment (rounded to the input
        dtype, or TF32, on the way) and B (Dp, COLS) a transposed smem view.

        These sums run over the whole sequence (O, dV, dK, dQ), tile after tile. In "3xtf32" the
        tile's product goes into a fresh fragment that is then added to acc in IEEE float32: the
        tensor cores' float32 accumulation truncates, and that bias, kept over 1024 keys, leaves errors
        ~ T 2^-24 |term| (2x the tests' float32 tolerance at T = 1024, H100); this way it spans one tile."""
        copy_b, tXsB, rB, tXrB = b_op
        a = self.as_operand_a(p)
        part = acc
        if cutlass.const_expr(self.math == "3xtf32"):
            part = cute.make_fragment_like(acc)
            part.fill(0.0)
        for k in range(cute.size(a, mode=[2])):
            cute.copy(copy_b, tXsB[None, None, k, b_stage], tXrB[None, None, k])
            self.mma(part, a[None, None, k], rB[None, None, k])
        if cutlass.const_expr(self.math == "3xtf32"):
            acc.store(acc.load() + part.load())

    def as_operand_a(self, p: cute.Tensor) -> cute.Tensor:
        """The accumulator fragment ((2, 2), MMA_M, MMA_N) of a score tile as the A fragment of the
        next product, k = the tile's columns (module doc): 16-bit, (((2, 2), 2), MMA_M, MMA_N / 2) of
        the rounded values; TF32, a compact ((2, 2), MMA_M, MMA_N) float32 copy with the value modes
        swapped (A value (i, j) = row g + 8 i, k-slot t + 4 j = accumulator value (j, i) = row g + 8 i,
        key 2 t + j).

        The TF32 copy must be compact: ``cute.gemm`` (DSL 4.x) reads an operand fragment whose value
        mode has out-of-order strides wrongly. Given the swapped view, value mode (2, 2):(2, 1), it feeds
        a0..a3 the registers at offsets 0, 1, 1, 2 (accumulator (g, 2t), (g, 2t+1), (g, 2t+1), (g+8, 2t))
        instead of 0, 2, 1, 3: every float32 output would be O(1) wrong. The element copy costs no
        instruction (register renaming)."""
        if cutlass.const_expr(self.tf32):
            s = p.layout.stride
            swapped = cute.make_tensor(p.iterator, cute.make_layout(
                p.layout.shape, stride=((s[0][1], s[0][0]), s[1], s[2])))
            a = cute.make_rmem_tensor(p.layout.shape, Float32)  # compact, column-major
            for i in range(cute.size(a)):  # unrolled at trace time
                a[i] = swapped[i]
            return a
        r = cute.make_fragment_like(p, self.dtype)
        r.store(p.load().to(self.dtype))
        divided = cute.logical_divide(r.layout, (None, None, 2))
        view = cute.make_layout(
            ((divided.shape[0], divided.shape[2][0]), divided.shape[1], divided.shape[2][1]),
            stride=((divided.stride[0], divided.stride[2][0]), divided.stride[1], divided.stride[2][1]))
        return cute.make_tensor(r.iterator, view)


def _tf32_bits(x: Float32) -> Int32:
    """x rounded to the nearest TF32 (cvt.rna), as the 32-bit register an MMA operand is."""
    return Int32(cute.arch.cvt_f32_tf32(x))


def _tf32(x: cute.Tensor) -> cute.Tensor:
    """A TF32 copy of a float32 fragment, rounded to nearest."""
    out = cute.make_rmem_tensor_like(x, cutlass.TFloat32)
    bits = cute.recast_tensor(out, Int32)
    for i in range(cute.size(x)):
        bits[i] = _tf32_bits(x[i])
    return out


def _split_tf32(x: cute.Tensor):
    """(big, small) TF32 fragments with big + small = x to ~2^-22: big = tf32(x), small = tf32(x - big)."""
    big = cute.make_rmem_tensor_like(x, cutlass.TFloat32)
    small = cute.make_rmem_tensor_like(x, cutlass.TFloat32)
    big_bits, small_bits = cute.recast_tensor(big, Int32), cute.recast_tensor(small, Int32)
    for i in range(cute.size(x)):
        hi = _tf32_bits(x[i])
        big_bits[i] = hi
        small_bits[i] = _tf32_bits(x[i] - hi.bitcast(Float32))
    return big, small


# ----------------------------------------------------------------------------- fragments as rows x cols

def mn_view(t: cute.Tensor) -> cute.Tensor:
    """An accumulator fragment seen as (rows, cols): a thread's rows are g, g + 8 of each m16 block, its
    columns 2t, 2t + 1 of each n8 block (lane = 4 g + t).

      mma.sync ((2, 2), MMA_M, MMA_N)          -> ((2, MMA_M), (2, MMA_N))
      WGMMA    ((2, 2, N / 8), MMA_M, MMA_N)   -> ((2, MMA_M), (2, N / 8, MMA_N))  (a warp's 16 rows of 64)
    """
    compact = cute.make_layout(t.layout.shape)
    shape, stride = compact.shape, compact.stride
    cols, col_strides = (shape[0][0], shape[2]), (stride[0][0], stride[2])
    if cutlass.const_expr(cute.rank(shape[0]) == 3):
        cols, col_strides = (shape[0][0], shape[0][2], shape[2]), (stride[0][0], stride[0][2], stride[2])
    view = cute.make_layout(((shape[0][1], shape[1]), cols), stride=((stride[0][1], stride[1]), col_strides))
    return cute.make_tensor(t.iterator, cute.composition(t.layout, view))


def coords(tiles: Tiles, tidx, rows: int, cols: int) -> cute.Tensor:
    """(rows, cols) coordinates, within a (rows, cols) tile, of this thread's accumulator elements."""
    thr = tiles.tiled_mma.get_slice(tidx)
    return mn_view(thr.partition_C(cute.make_identity_tensor((rows, cols))))


def quad_max(x: Float32) -> Float32:
    """Max over the 4 lanes of a quad: the lanes that hold one row of an accumulator."""
    x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=2))
    return cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=1))


def quad_sum(x: Float32) -> Float32:
    x = x + cute.arch.shuffle_sync_bfly(x, offset=2)
    return x + cute.arch.shuffle_sync_bfly(x, offset=1)


# ----------------------------------------------------------------------------- gmem <-> smem

def load_tile(g2s, thr_g2s, g: cute.Tensor, c: cute.Tensor, s: cute.Tensor, stage, limit):
    """smem[stage] <- one (n, Dp) gmem tile (cp.async; not committed). Vectors whose first element's
    coordinate ``c`` is outside ``limit`` = (T, D) are not loaded."""
    tXg, tXc, tXs = thr_g2s.partition_S(g), thr_g2s.partition_S(c), thr_g2s.partition_D(s)
    cute.copy(g2s, tXg, tXs[None, None, None, stage], pred=predicate(tXc, limit))


def zero_smem(thr_g2s, s: cute.Tensor):
    """Zero this thread's share of an smem tile (all stages): padded columns stay zero for good."""
    thr_g2s.partition_D(s).fill(0)


@cute.jit
def store_tile(tiles: Tiles, tidx, acc: cute.Tensor, s: cute.Tensor, g: cute.Tensor, c: cute.Tensor, limit):
    """gmem <- an accumulator tile (rows, Dp), rounded once to the dtype: registers -> smem ``s``
    (rows, Dp) -> 16-byte vectors to gmem ``g``, predicated on its coordinates ``c`` < limit (T, D).
    Waits for every cp.async of the thread and synchronizes first: nobody reads or fills ``s`` any more
    (a loop that ran no tile leaves its first loads in flight)."""
    cute.arch.cp_async_wait_group(0)
    cute.arch.sync_threads()
    r = cute.make_fragment_like(acc, tiles.dtype)
    r.store(acc.load().to(tiles.dtype))
    r2s = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), tiles.dtype), tiles.tiled_mma)
    thr_r2s = r2s.get_slice(tidx)
    cute.copy(r2s, thr_r2s.retile(r), thr_r2s.partition_D(s))
    cute.arch.sync_threads()
    s2g = tiles.s2g()
    thr = s2g.get_slice(tidx)
    tXs, tXg, tXc = thr.partition_S(s), thr.partition_D(g), thr.partition_D(c)
    staged = cute.make_rmem_tensor_like(tXs)
    cute.autovec_copy(tXs, staged)
    cute.copy(s2g, staged, tXg, pred=predicate(tXc, limit))


def head_tensor(ptr, T, D, H, B, s_t, s_h, s_b, vec: int) -> cute.Tensor:
    """A (T, D, H, B) tensor with unit stride along D; its other strides are declared multiples of
    ``vec`` (the host checked), which is what lets the copies move ``vec`` elements at once."""
    stride = (cute.assume(s_t, divby=vec), 1, cute.assume(s_h, divby=vec), cute.assume(s_b, divby=vec))
    return cute.make_tensor(ptr, cute.make_layout((T, D, H, B), stride=stride))


def row_tensor(ptr, T, H, B) -> cute.Tensor:
    """lse or delta: a contiguous float32 (B, H, T) tensor as (T, H, B); a static unit stride, 64-bit
    head and batch strides."""
    return cute.make_tensor(ptr, cute.make_layout((T, H, B), stride=(1, Int64(T), Int64(T) * H)))


# ----------------------------------------------------------------------------- the forward kernel

@cute.jit
def _mask_scores(S, cS, row0, col0, Tk, causal: cutlass.Constexpr):
    """S (rows x cols view) = -inf where the key is past Tk or (causal) after the query."""
    for r in cutlass.range_constexpr(cute.size(S, mode=[0])):
        limit = Tk
        if cutlass.const_expr(causal):
            limit = cutlass.min(row0 + cS[r, 0][0] + 1, Tk)
        for c in cutlass.range_constexpr(cute.size(S, mode=[1])):
            if col0 + cS[0, c][1] >= limit:
                S[r, c] = -Float32.inf


@cute.jit
def softmax_tile(S: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, alpha: cute.Tensor, scale):
    """One key tile of the online softmax on a (rows, cols) view of scores, c = ``scale`` (log2 units
    per score unit; 1 when S is already in log2 units): S becomes p = exp2(c S - c m') with m' the new
    row max, l = alpha l + rowsum p, alpha = exp2(c (m - m')) (0 on a row's first tile). Needs c > 0.
    A row that has seen no key yet keeps p = 0 and no NaN. The caller rescales O by alpha."""
    for r in cutlass.range_constexpr(cute.size(S, mode=[0])):
        s_row = S[r, None].load()
        m_new = cute.arch.fmax(row_max[r], quad_max(s_row.reduce(cute.ReductionOp.MAX, -Float32.inf, 0)))
        m_use = 0.0 if m_new == -Float32.inf else m_new
        alpha[r] = cute.math.exp2((row_max[r] - m_use) * scale, fastmath=True)
        p_row = cute.math.exp2(s_row * scale - m_use * scale, fastmath=True)
        S[r, None].store(p_row)
        row_sum[r] = row_sum[r] * alpha[r] + p_row.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        row_max[r] = m_new


def _fwd_factory(dtype_t, math_mode: str, Dp: int, causal: bool, vec: int, has_kv_len: bool = False):
    """The forward host function. Key: dtype, math mode, padded head dim, causal, gmem vector width,
    and ``True`` appended where the call passes kv_len (its pointer, else None)."""
    dtype = DTYPES[dtype_t]
    ROWS, COLS = tile_shape("fwd", math_mode, Dp)

    @cute.kernel
    def kernel(mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               mLen: Optional[cute.Tensor], group: Int32, scale_log2: Float32):
        # mQ, mO (Tq, D, H, B); mK, mV (Tk, D, Hkv, B); mLSE (Tq, H, B) float32; mLen (B,) int32 or None
        t = Tiles.make(dtype, math_mode, Dp, ROWS, COLS, vec)
        tidx, _, _ = cute.arch.thread_idx()
        bx, h, b = cute.arch.block_idx()
        Tq, D = mQ.shape[0], mQ.shape[1]
        Tk = mK.shape[0]  # from here on: the keys this batch row sees, kv_len[b] clamped to [0, Tk]
        if cutlass.const_expr(has_kv_len):
            Tk = cutlass.min(cutlass.max(mLen[b], Int32(0)), Tk)
        m_block = cute.ceil_div(Tq, ROWS) - 1 - bx  # the last (longest causal) query tiles first
        row0 = m_block * ROWS
        hk = h // group

        # ---- this CTA's tiles of gmem and their coordinates
        gQ = cute.local_tile(mQ[None, None, h, b], (ROWS, Dp), (m_block, 0))  # (ROWS, Dp)
        cQ = cute.local_tile(cute.make_identity_tensor((Tq, D)), (ROWS, Dp), (m_block, 0))
        gK = cute.local_tile(mK[None, None, hk, b], (COLS, Dp), (None, 0))  # (COLS, Dp, key tiles)
        gV = cute.local_tile(mV[None, None, hk, b], (COLS, Dp), (None, 0))
        cK = cute.local_tile(cute.make_identity_tensor((Tk, D)), (COLS, Dp), (None, 0))

        # ---- shared memory: Q, and a two-stage ring of K and V tiles; zeroed once
        sQ = t.smem_tile(ROWS, 1)  # (ROWS, Dp, 1)
        sK = t.smem_tile(COLS, STAGES)  # (COLS, Dp, 2)
        sV = t.smem_tile(COLS, STAGES)
        g2s = t.g2s()
        thr_g2s = g2s.get_slice(tidx)
        zero_smem(thr_g2s, sQ)
        zero_smem(thr_g2s, sK)
        zero_smem(thr_g2s, sV)
        cute.arch.sync_threads()

        # ---- MMA operands: Q and K from smem (S = Q K^T), V^T from smem (O += P V)
        op_q = t.operand_a(tidx, sQ, ROWS)
        op_k = t.operand_b(tidx, sK, COLS, Dp, transpose=False)
        op_vt = t.operand_b(tidx, t.transposed(sV), Dp, COLS, transpose=True)
        acc_o = t.acc(ROWS, Dp)
        O = mn_view(acc_o)
        cS = coords(t, tidx, ROWS, COLS)
        row_max = cute.make_rmem_tensor((cute.size(O, mode=[0]),), Float32)
        row_sum = cute.make_rmem_tensor((cute.size(O, mode=[0]),), Float32)
        alpha = cute.make_rmem_tensor((cute.size(O, mode=[0]),), Float32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)

        # ---- the key tiles: [0, n_full) need no mask, [n_full, n_end) do
        n_end = cute.ceil_div(Tk, COLS)
        n_full = Tk // COLS
        if cutlass.const_expr(causal):
            n_end = cute.ceil_div(cutlass.min(row0 + ROWS, Tk), COLS)
            n_full = cutlass.min(row0, Tk) // COLS

        load_tile(g2s, thr_g2s, gQ, cQ, sQ, 0, (Tq, D))
        load_tile(g2s, thr_g2s, gK[None, None, 0], cK[None, None, 0], sK, 0, (Tk, D))
        load_tile(g2s, thr_g2s, gV[None, None, 0], cK[None, None, 0], sV, 0, (Tk, D))
        cute.arch.cp_async_commit_group()
        for n in cutlass.range(n_end, unroll=1):
            stage = n % STAGES
            if n + 1 < n_end:  # the next tile flies while this one is multiplied
                load_tile(g2s, thr_g2s, gK[None, None, n + 1], cK[None, None, n + 1], sK, 1 - stage, (Tk, D))
                load_tile(g2s, thr_g2s, gV[None, None, n + 1], cK[None, None, n + 1], sV, 1 - stage, (Tk, D))
            cute.arch.cp_async_commit_group()  # (an empty group on the last tile: wait_group counts stay fixed)
            cute.arch.cp_async_wait_group(1)
            cute.arch.sync_threads()
            acc_s = t.acc(ROWS, COLS)
            t.gemm_ss(acc_s, op_q, op_k, 0, stage)
            S = mn_view(acc_s)
            S.store(S.load() * scale_log2)
            if n >= n_full:
                _mask_scores(S, cS, row0, n * COLS, Tk, causal)
            softmax_tile(S, row_max, row_sum, alpha, 1.0)  # S is in log2 units already
            for r in cutlass.range_constexpr(cute.size(O, mode=[0])):
                O[r, None].store(O[r, None].load() * alpha[r])
            t.gemm_rs(acc_o, acc_s, op_vt, stage)
            cute.arch.sync_threads()  # every warp is done with this stage before it is refilled

        # ---- out = O / l, lse = (m + log2 l) ln 2 (a row that saw no key, kv_len[b] = 0: out 0, lse -inf)
        lane = tidx % 32
        for r in cutlass.range_constexpr(cute.size(O, mode=[0])):
            l = quad_sum(row_sum[r])
            inv = 0.0 if l == 0.0 else 1.0 / l
            O[r, None].store(O[r, None].load() * inv)
            row = row0 + cS[r, 0][0]
            if lane % 4 == 0:  # the quad's lanes hold the same row: one writes it
                if row < Tq:
                    lse = (row_max[r] + cute.math.log2(l)) * LN2
                    if cutlass.const_expr(has_kv_len):  # (-inf + log2 0 is -inf already; not left to log2)
                        lse = -Float32.inf if l == 0.0 else lse
                    mLSE[row, h, b] = lse
        gO = cute.local_tile(mO[None, None, h, b], (ROWS, Dp), (m_block, 0))
        store_tile(t, tidx, acc_o, sQ[None, None, 0], gO, cQ, (Tq, D))

    @cute.jit
    def host(pq: cute.Pointer, pk: cute.Pointer, pv: cute.Pointer, po: cute.Pointer, plse: cute.Pointer,
             plen: Optional[cute.Pointer], B: Int32, H: Int32, Hkv: Int32, Tq: Int32, Tk: Int32, D: Int32,
             sq_b: Int64, sq_h: Int64, sq_t: Int64, sk_b: Int64, sk_h: Int64, sk_t: Int64,
             sv_b: Int64, sv_h: Int64, sv_t: Int64, so_b: Int64, so_h: Int64, so_t: Int64,
             scale_log2: Float32, stream_: cuda.CUstream):
        mQ = head_tensor(pq, Tq, D, H, B, sq_t, sq_h, sq_b, vec)
        mK = head_tensor(pk, Tk, D, Hkv, B, sk_t, sk_h, sk_b, vec)
        mV = head_tensor(pv, Tk, D, Hkv, B, sv_t, sv_h, sv_b, vec)
        mO = head_tensor(po, Tq, D, H, B, so_t, so_h, so_b, vec)
        mLSE = row_tensor(plse, Tq, H, B)
        mLen = None
        if cutlass.const_expr(has_kv_len):
            mLen = cute.make_tensor(plen, cute.make_layout(B))
        kernel(mQ, mK, mV, mO, mLSE, mLen, H // Hkv, scale_log2).launch(
            grid=[cute.ceil_div(Tq, ROWS), H, B], block=[THREADS, 1, 1], stream=stream_)

    return host
