"""The cute attention backward on Hopper (sm_90a): TMA, WGMMA, warp specialization, dQ by bulk reduction.

Math (per batch b, query head h, its kv head g = h // (H / Hkv), c = scale > 0; docs/attention.md),
with P recomputed from the forward's lse and dO = dout:

    delta_i = sum_d dO_id out_id
    P = exp(c q k^T - lse)    dP = dO v^T    dS = P * (dP - delta)
    dV = P^T dO    dK = c dS^T q    dQ = c dS k

FLOPs 10 B H Tq Tk D (five products of 2 Tq Tk D; about half with the causal mask), against the 14 of
the mma.sync backward (``_attention_bwd``), which recomputes S and dP in a second kernel for dQ.
Here dQ is accumulated across key tiles in float32 device memory instead: the price is
nondeterminism in dQ's last bits (the order of the additions varies from run to run).

Three kernels:

- ``_Preprocess``: one CTA per 64 query rows of a (head, batch): delta = rowsum(dO out), and lse
  times log2 e, both into (B, H, Tq rounded up to 64) float32 buffers padded with delta 0 and
  lse +inf (a query row past Tq then has P = 0 exactly), and zeroes the CTA's tile of dQaccum.
- ``_AttentionBwdSm90``: a work tile is (128 keys, kv head, batch); K and V stay in shared memory and
  the query tiles of 64 rows stream through, for each query head of the group in turn (the
  group's sum is this loop: dK and dV never leave the registers until the end). One CTA per tile;
  with the causal mask (up to 64 key tiles, ``config``) one CTA per SM walks units of two key tiles,
  n and n_blocks - 1 - n, which see the same number of query tiles together.
- ``_Postprocess``: dq = c dQaccum, rounded to the dtype, one CTA per 64 query rows (16-byte stores).

out is read, and dq, dk, dv are written, through their strides: contiguous, or the token-major heads
layout the op gives a projection's views (``_layout.heads_like``), any that TMA can describe.

Warp roles of the main kernel (384 threads = 3 warpgroups)
---------------------------------------------------------
  - warpgroups 0 and 1, the *consumers*: warpgroup w owns keys [64 w, 64 w + 64) of the tile. Per
    query tile, with the scores transposed (keys x queries, FlashAttention-3's "swapAB" for D = 128)
    so that P^T and dS^T come out of the accumulators as the A operands of dV and dK:

        S^T = K Q^T, dP^T = V dO^T              (WGMMA, operands in smem, issued together)
        P^T = exp2(c log2e S^T - lse log2e)     (causal: 0 where query < key)
        dS^T = P^T (dP^T - delta)               -> 16-bit registers, and dS^T into smem for dQ
        dV += P^T dO,  dK += dS^T Q             (WGMMA "RS": A from registers, B = dO, Q in smem)
        dQ[:, D/2 w ..] = dS K[:, D/2 w ..]     (both warpgroups' dS: a named barrier first)

    Each dQ tile (64 x D/2 float32 a warpgroup) goes to a shared-memory buffer in the order the
    accumulator registers hold it (16-byte stores, no bank conflicts), for the dQ warp.
  - warpgroup 2: warp 0, the *producer*, issues the TMA loads (K and V once; Q with lse and dO with
    delta into two 2-stage rings, each stage guarded by a full / empty mbarrier pair); warp 1, the
    *dQ writer*, adds each buffer to dQaccum in device memory with one
    ``cp.reduce.async.bulk .add.f32`` (the copy engine does the float32 additions in L2) and frees
    the buffer once the engine has read it. Both keep 24 registers; the consumers get 240.

dQaccum is (B, H, Tq tiles, 2, 64 D / 2) float32: each tile in the consumers' register order, which
``_Postprocess`` undoes: a thread reads the four vectors that hold 8 columns of two rows and writes
them as two 16-byte rows (89 -> 75 us at D = 128, B T = 16k, 16 heads on an H100, against 72 us for a
plain float32 -> bfloat16 copy of as many elements; storing the fragment's 4-byte pairs as they
are measured slower: benchmarks/experiments/cute_dq_postprocess.py).

After a tile's last query tile each consumer warpgroup stores its 64 rows of dK and dV: from the
registers (4 bytes a store), or (``tma_store``, ``config``) with stmatrix into shared memory (dV into a
buffer of its own, dK into the warpgroup's own halves of the dS stages) and TMA stores of 64 x 64
boxes, which run on while the next tile starts.

Shared memory (D = 128, bfloat16): K, V 32 KiB each; Q, dO 2 stages x 16 KiB each; dS 2 stages x
16 KiB; dQ buffers 32 KiB; lse, delta 1 KiB: 193 KiB (225 with ``tma_store``'s dV buffer). Q, dO
and K are each read by two products with opposite majorness (Q is B of S^T = K Q^T, K-major, and B of
dK = dS^T Q, MN-major): one 128-byte-swizzled layout serves both, its D halves as the outer mode, so
that its transpose is a canonical MN-major WGMMA layout too.

What it takes: as ``_attention_fwd_sm90.supports`` (float16 / bfloat16, D in {64, 128}, scale > 0,
sm_90a, strides TMA can describe), and dout the same. Compile key: (dtype, D, causal, paired,
tma_store) for the main kernel, (dtype, D) for the other two; sizes, strides, the scale (and the
persistent grid's CTA count) are runtime arguments.
"""

# No ``from __future__ import annotations``: ``cute.struct`` needs the annotation objects (see
# ``_attention_fwd_sm90``).
import math

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.tensor_utils import LayoutEnum

from .._layout import tma_strides
from . import _compile
from ._attention_fwd import head_tensor, mn_view, row_tensor
from ._attention_fwd_sm90 import (acc_as_operand_a, bulk_store_tile, epilogue_mma, next_tile, stmatrix_copy,
                                  stmatrix_store, thread_roles, wgmma)
from ._attention_fwd_sm90 import supports as forward_supports
from ._reduce import sm_count

LOG2E = math.log2(math.e)
VEC = 8  # 16 bytes of a 16-bit type
TILE_M = 64  # query rows per tile (the ring's stage, the pre- and postprocess CTAs)


# ------------------------------------------------------------------------------------------------
# Host side
# ------------------------------------------------------------------------------------------------
def supports(q, k, v, dout, scale: float) -> bool:
    """True when this backward takes these (B, H, T, D) operands: see the module docstring."""
    return forward_supports(q, k, v, scale) and dout.dtype == q.dtype and tma_strides(dout) is not None


def config(D: int, causal: bool, Tk: int) -> dict:
    """The main kernel's variant for a head dim, mask and key length: ``persistent``, ``paired`` and
    ``tma_store`` as the attention table (``attention.Launch``) describes its ``backward_`` fields.
    The choices and their measurements: docs/attention.md, "Why these defaults"."""
    n_blocks = -(-Tk // _AttentionBwdSm90.tile_n)
    paired = causal and n_blocks <= 64
    tma_store = n_blocks <= ((32 if causal else 16) if D == 128 else 8)
    return {"persistent": paired, "paired": paired, "tma_store": tma_store}


def plan(q, k, v, dout, causal: bool, scale: float, sms: int, launch, dk=None, dv=None) -> tuple:
    """``(key, dout_strides, numbers)`` of the launches for q, k, v, dout (tensors, or their
    ``_compile.Operand`` stand-ins) as ``supports`` takes them and dk, dv laid out as ``dk``, ``dv``
    (tensors or stand-ins whose strides TMA can describe; None: new contiguous ones): the main
    kernel's compile key, dout's TMA strides (the preprocess reads it through them) and the main
    kernel's runtime numbers after its pointers. ``sms``: the device's SM count; ``launch``: the
    attention table (``attention.Launch``): its ``backward_`` fields that are not None replace ``config``'s."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    c = config(D, causal, Tk)
    c.update({name: value for name in c if (value := getattr(launch, "backward_" + name)) is not None})
    n_blocks = -(-Tk // _AttentionBwdSm90.tile_n)
    units = (-(-n_blocks // 2) if c["paired"] else n_blocks) * Hkv * B
    ctas = min(units, sms) if c["persistent"] else units
    contiguous = (Hkv * Tk * D, Tk * D, D)  # a new contiguous (B, Hkv, Tk, D) tensor's
    dk_strides, dv_strides = (contiguous if t is None else tma_strides(t) for t in (dk, dv))
    dout_strides = tma_strides(dout)
    numbers = (B, H, Hkv, Tq, Tk, *tma_strides(q), *tma_strides(k), *tma_strides(v), *dout_strides,
               *dk_strides, *dv_strides, scale * LOG2E, scale, ctas)
    return (q.dtype, D, causal, c["paired"], c["tma_store"]), dout_strides, numbers


def attention_bwd_sm90(q, k, v, out, dout, lse, dq, dk, dv, causal: bool, scale: float,
                       launch, planned: tuple | None = None) -> None:
    """dq, dk, dv <- the gradients of attention(q, k, v) for dout. q, k, v, dout as ``supports``
    takes them (dout, say, the transposed view a model's output projection hands back, read in place);
    out (B, H, Tq, D) and dq, dk, dv in any layout whose strides TMA can describe (``tma_strides``:
    contiguous, or the token-major heads layout of ``_layout.heads_like``), dq and out read and
    written through their strides, dk and dv as ``plan`` was given them; lse (B, H, Tq) float32
    contiguous. dq may be None: dQ is then not written out. ``launch``: the attention table
    (``attention.Launch``; ``tuning.launch("attention")``); ``planned``: ``plan``'s answer for these
    operands under it (the cute attention caches it per layout), else worked out here."""
    B, H, Tq, D = q.shape
    out_strides = tma_strides(out)
    if out_strides is None:  # (the preprocess reads out's rows through 16-byte vectors)
        out = out.contiguous()
        out_strides = tma_strides(out)
    grads = {"dq": dq, "dk": dk, "dv": dv}
    strides = {name: None if t is None else tma_strides(t) for name, t in grads.items()}
    for name, t in grads.items():
        if t is not None and strides[name] is None:
            raise ValueError(f"attention (cute, Hopper backward): {name} {tuple(t.shape)} with strides {t.stride()}: "
                             "the kernels write it through TMA-describable strides; pass a new contiguous tensor")
    key, dout_strides, numbers = planned or plan(q, k, v, dout, causal, scale, sm_count(q.device), launch, dk, dv)
    rows = B * H * -(-Tq // TILE_M) * TILE_M  # lse2 and delta: (B, H, Tq) padded to whole tiles
    dev = _compile.stream_of(q)
    pointer = _compile.pointer
    # scratch the three kernels hand on: lse2 and delta (the workspace, reused call to call), and
    # dQ's float32 sums (twice dq's size: allocated per call, so that it is not held between calls)
    scratch = _compile.workspace((_AttentionBwdSm90, key), q, 2 * rows)
    lse2, delta = pointer(scratch, 16), pointer(scratch, 16, offset=rows)
    accum = q.new_empty(rows * D, dtype=torch.float32)  # (referenced until the launches are made)
    dq_accum = pointer(accum, 16)
    dout_ = pointer(dout, 16)
    _compile.launch(_Preprocess, (q.dtype, D), pointer(out, 16), dout_, pointer(lse, 4), lse2, delta, dq_accum,
                    B, H, Tq, *out_strides, *dout_strides, dev)
    _compile.launch(_AttentionBwdSm90, key, pointer(q, 16), pointer(k, 16), pointer(v, 16), dout_, lse2, delta,
                    dq_accum, pointer(dk, 16), pointer(dv, 16), *numbers, dev)
    if dq is not None:
        _compile.launch(_Postprocess, (q.dtype, D), dq_accum, pointer(dq, 16), B, H, Tq, *strides["dq"], scale, dev)


# ------------------------------------------------------------------------------------------------
# Helpers shared by the kernels
# ------------------------------------------------------------------------------------------------
@dsl_user_op
def bulk_load(gmem: cute.Pointer, smem: cute.Pointer, mbar: cute.Pointer, size: int, *, loc=None, ip=None):
    """``size`` bytes from global to shared memory with the copy engine (one thread issues it); the
    mbarrier counts the bytes as they land."""
    llvm.inline_asm(
        None, [gmem.toint(loc=loc, ip=ip).ir_value(), smem.toint(loc=loc, ip=ip).ir_value(),
               mbar.toint(loc=loc, ip=ip).ir_value(), Int32(size).ir_value()],
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$1], [$0], $3, [$2];",
        "l,r,r,r", has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def bulk_reduce_add(smem: cute.Pointer, gmem: cute.Pointer, size: int, *, loc=None, ip=None):
    """global[0:size) += shared[0:size) as float32, by the copy engine (one thread issues it; the
    additions happen in L2, atomically per element); completes as a bulk group."""
    llvm.inline_asm(
        None, [gmem.toint(loc=loc, ip=ip).ir_value(), smem.toint(loc=loc, ip=ip).ir_value(),
               Int32(size).ir_value()],
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], $2;",
        "l,r,r", has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


def dq_mma(dtype, D: int) -> cute.TiledMma:
    """dQ = dS K: two warpgroups side by side along D (64 x D/2 each), A = dS (queries-major in smem),
    B = K^T (D-major in smem). The postprocess kernel reuses it for the thread-to-element map."""
    major = cute.nvgpu.OperandMajorMode
    return sm90_utils.make_trivial_tiled_mma(dtype, dtype, major.MN, major.MN, Float32, (1, 2, 1),
                                             tiler_mn=(64, D // 2))


def register_order(t: cute.Tensor, tidx, D: int) -> cute.Tensor:
    """A warpgroup's dQ tile (64 x D/2 float32, the flat tensor ``t``) in register order: thread t's
    16-byte vector j at element 4 (128 j + t), as the (4, D/16) of thread ``tidx % 128``. (A slice of
    a layout with static strides: the compiler sees the 16-byte alignment and vectorizes.)"""
    threads = cute.make_tensor(t.iterator, cute.make_layout(((4, 128), D // 16), stride=((1, 4), 512)))
    return threads[(None, tidx % 128), None]


def accum_tensor(ptr: cute.Pointer, D: int, m_tiles: Int32, H: Int32, B: Int32) -> cute.Tensor:
    """dQaccum as (64 D / 2, warpgroup, Tq tiles, H, B) float32: a warpgroup's chunk is contiguous."""
    tile = TILE_M * D
    s_m = cute.assume(Int64(m_tiles) * tile, divby=tile)
    return cute.make_tensor(ptr, cute.make_layout((tile // 2, 2, m_tiles, H, B),
                                                  stride=(1, tile // 2, tile, s_m, s_m * H)))


# ------------------------------------------------------------------------------------------------
# Preprocess: delta, lse log2 e, dQaccum = 0
# ------------------------------------------------------------------------------------------------
class _Preprocess:
    """delta = rowsum(dO out) and lse log2 e into padded buffers; dQaccum's tile zeroed. One CTA of
    256 threads per (64 query rows, head, batch): 4 threads a row, each D/4 elements in 16-byte vectors
    (vector j of the row is thread j % 4's), two butterfly shuffles. dO and out are read through
    their strides (those ``tma_strides`` gives, as the main kernel's descriptor takes dO's)."""

    threads = 256

    def __init__(self, dtype: torch.dtype, D: int):
        self.dtype, self.D = _compile.DTYPES[dtype], D

    @cute.jit
    def __call__(self, po: cute.Pointer, pdo: cute.Pointer, plse: cute.Pointer, plse2: cute.Pointer,
                 pdelta: cute.Pointer, pacc: cute.Pointer, B: Int32, H: Int32, Tq: Int32,
                 so_b: Int64, so_h: Int64, so_t: Int64, sdo_b: Int64, sdo_h: Int64, sdo_t: Int64,
                 stream: cuda.CUstream):
        D = self.D
        m_tiles = cute.ceil_div(Tq, TILE_M)
        Tp = m_tiles * TILE_M
        mO = head_tensor(po, Tq, D, H, B, so_t, so_h, so_b, VEC)  # strides multiples of 8 (tma_strides)
        mdO = head_tensor(pdo, Tq, D, H, B, sdo_t, sdo_h, sdo_b, VEC)
        mLSE = row_tensor(plse, Tq, H, B)
        mLSE2, mDelta = row_tensor(plse2, Tp, H, B), row_tensor(pdelta, Tp, H, B)
        mAcc = accum_tensor(pacc, D, m_tiles, H, B)
        self.kernel(mO, mdO, mLSE, mLSE2, mDelta, mAcc, Tq).launch(
            grid=[m_tiles, H, B], block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mLSE2: cute.Tensor,
               mDelta: cute.Tensor, mAcc: cute.Tensor, Tq: Int32):
        # mO, mdO (Tq, D, H, B); mLSE (Tq, H, B); mLSE2, mDelta (Tq padded, H, B); mAcc as accum_tensor
        D = self.D
        tidx, _, _ = cute.arch.thread_idx()
        m, h, b = cute.arch.block_idx()
        row = m * TILE_M + tidx // 4
        part = tidx % 4
        parts = cute.make_layout(((VEC, 4), D // (4 * VEC)), stride=((1, VEC), 4 * VEC))  # a row by thread
        acc = Float32(0.0)
        if row < Tq:
            o = cute.make_rmem_tensor((VEC, D // (4 * VEC)), self.dtype)
            do = cute.make_rmem_tensor((VEC, D // (4 * VEC)), self.dtype)
            cute.autovec_copy(cute.make_tensor(mO[row, None, h, b].iterator, parts)[(None, part), None], o)
            cute.autovec_copy(cute.make_tensor(mdO[row, None, h, b].iterator, parts)[(None, part), None], do)
            acc = (o.load().to(Float32) * do.load().to(Float32)).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        acc = acc + cute.arch.shuffle_sync_bfly(acc, offset=2)
        acc = acc + cute.arch.shuffle_sync_bfly(acc, offset=1)
        if part == 0:
            mDelta[row, h, b] = acc
            lse2 = Float32.inf  # a padding row: P = exp2(S - inf) = 0
            if row < Tq:
                lse2 = mLSE[row, h, b] * LOG2E
            mLSE2[row, h, b] = lse2
        # dQaccum's tile (64 D floats) = 0: thread t's 16-byte vectors t, t + 256, ...
        zeros = cute.make_rmem_tensor((4, D // 16), Float32)
        zeros.fill(0.0)
        by_thread = cute.make_layout(((4, self.threads), D // 16), stride=((1, 4), 4 * self.threads))
        cute.autovec_copy(zeros, cute.make_tensor(mAcc[None, None, m, h, b].iterator, by_thread)[(None, tidx), None])


# ------------------------------------------------------------------------------------------------
# Postprocess: dq = c dQaccum
# ------------------------------------------------------------------------------------------------
class _Postprocess:
    """dq = c dQaccum rounded to the dtype. One CTA of 256 threads per (64 query rows, head, batch).

    A warpgroup's 64 x D/2 tile of dQaccum is in the main kernel's register order (``register_order``):
    the 16 floats at 16 (u + 32 j) are threads 4u .. 4u + 3's vector j, that is rows r and r + 8, r =
    16 (u // 8) + u % 8, by columns 8j .. 8j + 7 of the warpgroup's half, each thread's column pair
    (c, c + 1) in rows r, r + 8 (the WGMMA accumulator fragment), the four threads side by side. A
    thread reads such a block (four 16-byte loads) and writes its two rows of 8 (two 16-byte stores);
    consecutive threads take consecutive j, so a warp's stores cover whole rows of its half."""

    threads = 256

    def __init__(self, dtype: torch.dtype, D: int):
        self.dtype, self.D = _compile.DTYPES[dtype], D

    @cute.jit
    def __call__(self, pacc: cute.Pointer, pdq: cute.Pointer, B: Int32, H: Int32, Tq: Int32,
                 sdq_b: Int64, sdq_h: Int64, sdq_t: Int64, scale: Float32, stream: cuda.CUstream):
        D = self.D
        m_tiles = cute.ceil_div(Tq, TILE_M)
        mAcc = accum_tensor(pacc, D, m_tiles, H, B)
        mdQ = head_tensor(pdq, Tq, D, H, B, sdq_t, sdq_h, sdq_b, VEC)  # strides multiples of 8 (tma_strides)
        self.kernel(mAcc, mdQ, scale).launch(grid=[m_tiles, H, B], block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mAcc: cute.Tensor, mdQ: cute.Tensor, scale: Float32):
        D = self.D
        J = D // 16  # 8-column groups of a warpgroup's half
        tidx, _, _ = cute.arch.thread_idx()
        m, h, b = cute.arch.block_idx()
        Tq = mdQ.shape[0]
        # a block of 16 floats as (row r or r + 8, column (c or c + 1, thread)) of the fragment
        fragment = cute.make_layout((2, (2, 4)), stride=(2, (1, 4)))
        for k in cutlass.range_constexpr(4 * D // self.threads):  # the CTA's 4D blocks, D / 64 a thread
            block = tidx + self.threads * k
            j, u, w = block % J, block // J % 32, block // (32 * J)
            blocks = cute.make_tensor(mAcc[None, w, m, h, b].iterator,
                                      cute.make_layout((16, 32, J), stride=(1, 16, 512)))  # (float, u, j)
            acc = cute.make_rmem_tensor(16, Float32)
            cute.autovec_copy(blocks[None, u, j], acc)
            vals = cute.make_tensor(acc.iterator, fragment)
            for i in cutlass.range_constexpr(2):
                row = m * TILE_M + 16 * (u // 8) + u % 8 + 8 * i
                if row < Tq:
                    out = cute.make_rmem_tensor(8, self.dtype)
                    out.store((vals[i, None].load() * scale).to(self.dtype))
                    groups = cute.make_tensor(mdQ[row, None, h, b].iterator,
                                              cute.make_layout((8, 2 * J), stride=(1, 8)))  # the row by 8
                    cute.autovec_copy(out, groups[None, w * J + j])


# ------------------------------------------------------------------------------------------------
# The main kernel: dK, dV and the dQ partial sums
# ------------------------------------------------------------------------------------------------
class _AttentionBwdSm90:
    """The compiled kernel for one key (dtype, D, causal); ``__call__`` is the host function."""

    threads_per_wg = 128
    consumer_wgs = 2
    tile_m, tile_n = TILE_M, 128  # queries per step, keys per CTA (64 per consumer warpgroup)
    stages = 2  # Q and dO rings, dS buffers
    producer_warp, dq_warp = 8, 9  # warps 0 and 1 of warpgroup 2
    producer_regs, consumer_regs = 24, 240
    # named barriers (0 is __syncthreads): both consumers' dS are in smem; dQ buffer w full / empty;
    # consumer warpgroup w's threads (``tma_store``)
    bar_ds, bar_dq_full, bar_dq_empty, bar_epilogue = 2, 3, 5, 7

    def __init__(self, dtype: torch.dtype, D: int, causal: bool, paired: bool, tma_store: bool = False):
        self.dtype = _compile.DTYPES[dtype]
        self.D, self.causal, self.paired = D, causal, paired
        self.tma_store = tma_store  # dK and dV through shared memory and TMA stores
        self.per_unit = 2 if paired else 1  # key tiles per work unit
        self.threads = (self.consumer_wgs + 1) * self.threads_per_wg

    @cute.jit
    def __call__(self, pq: cute.Pointer, pk: cute.Pointer, pv: cute.Pointer, pdo: cute.Pointer,
                 plse2: cute.Pointer, pdelta: cute.Pointer, pacc: cute.Pointer, pdk: cute.Pointer,
                 pdv: cute.Pointer, B: Int32, H: Int32, Hkv: Int32, Tq: Int32, Tk: Int32,
                 sq_b: Int64, sq_h: Int64, sq_t: Int64, sk_b: Int64, sk_h: Int64, sk_t: Int64,
                 sv_b: Int64, sv_h: Int64, sv_t: Int64, sdo_b: Int64, sdo_h: Int64, sdo_t: Int64,
                 sdk_b: Int64, sdk_h: Int64, sdk_t: Int64, sdv_b: Int64, sdv_h: Int64, sdv_t: Int64,
                 scale_log2: Float32, scale: Float32, ctas: Int32, stream: cuda.CUstream):
        D, bM, bN = self.D, self.tile_m, self.tile_n

        # (T, D, H, B) views, strides promised multiples of 8 elements (the host checked)
        mQ = head_tensor(pq, Tq, D, H, B, sq_t, sq_h, sq_b, VEC)
        mdO = head_tensor(pdo, Tq, D, H, B, sdo_t, sdo_h, sdo_b, VEC)
        mK = head_tensor(pk, Tk, D, Hkv, B, sk_t, sk_h, sk_b, VEC)
        mV = head_tensor(pv, Tk, D, Hkv, B, sv_t, sv_h, sv_b, VEC)
        mdK = head_tensor(pdk, Tk, D, Hkv, B, sdk_t, sdk_h, sdk_b, VEC)
        mdV = head_tensor(pdv, Tk, D, Hkv, B, sdv_t, sdv_h, sdv_b, VEC)
        m_tiles = cute.ceil_div(Tq, bM)
        mLSE2, mDelta = row_tensor(plse2, m_tiles * bM, H, B), row_tensor(pdelta, m_tiles * bM, H, B)
        mAcc = accum_tensor(pacc, D, m_tiles, H, B)

        # --- the products; each warpgroup a 64-row slice (keys) of S^T, dP^T, dV, dK, or a D/2 slice of dQ
        major = cute.nvgpu.OperandMajorMode
        wgs = (self.consumer_wgs, 1, 1)
        mma_sdp = sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, major.K, major.K, Float32, wgs,
                                                    tiler_mn=(64, bM))  # S^T = K Q^T, dP^T = V dO^T
        mma_dkv = sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, major.K, major.MN, Float32, wgs,
                                                    tiler_mn=(64, D), a_source=warpgroup.OperandSource.RMEM)
        mma_dq = dq_mma(self.dtype, D)

        # --- shared memory: K-major tiles (D halves outermost), so the transposes are MN-major WGMMA layouts
        row_major, col_major = LayoutEnum.ROW_MAJOR, LayoutEnum.COL_MAJOR
        q_smem = sm90_utils.make_smem_layout_a(row_major, (bM, bN, D), self.dtype, self.stages)  # (bM, D, S)
        kv_smem = sm90_utils.make_smem_layout_a(row_major, (bN, bM, D), self.dtype, 1)  # (bN, D, 1)
        ds_smem = sm90_utils.make_smem_layout_a(col_major, (bM, D, bN), self.dtype, self.stages)  # (bM, bN, S)

        load = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tma_mQ = cpasync.make_tiled_tma_atom(load, mQ, cute.slice_(q_smem, (None, None, 0)), (bM, D))
        tma_do, tma_mdO = cpasync.make_tiled_tma_atom(load, mdO, cute.slice_(q_smem, (None, None, 0)), (bM, D))
        tma_k, tma_mK = cpasync.make_tiled_tma_atom(load, mK, cute.slice_(kv_smem, (None, None, 0)), (bN, D))
        tma_v, tma_mV = cpasync.make_tiled_tma_atom(load, mV, cute.slice_(kv_smem, (None, None, 0)), (bN, D))
        # the epilogue's stores (``tma_store``): a warpgroup's 64 key rows of dV and dK, each (64, D) in
        # 64 x 64 boxes of 8 KB (128-byte swizzle), dV in a buffer of its own, dK in the warpgroup's own
        # halves of the two dS stages (dS^T rows are keys: warpgroup w writes bytes [8 KB w, 8 KB w + 8 KB)
        # of each 16 KB stage), so box j of dK is stage j's half; rows past Tk are clipped by the engine
        tma_dk = tma_mdK = tma_dv = tma_mdV = mma_o = dv_smem = dk_view = None
        dv_elems = 8
        if cutlass.const_expr(self.tma_store):
            box = sm90_utils.make_smem_layout_epi(self.dtype, row_major, (64, 64), 1)  # ((8, 8), 64, 1), swizzled
            dv_smem = sm90_utils.make_smem_layout_epi(self.dtype, row_major, (64, D), self.consumer_wgs)  # (64, D, 2)
            dv_elems = cute.cosize(dv_smem)
            stage = cute.cosize(cute.slice_(ds_smem, (None, None, 0)).outer)  # elements of a dS stage
            dk_view = cute.make_composed_layout(box.inner, 0, cute.make_layout(
                ((8, 8), (64, D // 64), self.consumer_wgs), stride=((64, 512), (1, stage), stage // 2)))  # (64, D, 2)
            store = cpasync.CopyBulkTensorTileS2GOp()
            tma_dk, tma_mdK = cpasync.make_tiled_tma_atom(store, mdK, cute.slice_(box, (None, None, 0)), (64, 64))
            tma_dv, tma_mdV = cpasync.make_tiled_tma_atom(store, mdV, cute.slice_(box, (None, None, 0)), (64, 64))
            mma_o = epilogue_mma(self.dtype, D)  # a warpgroup's dK, dV accumulator layout

        @cute.struct
        class SharedStorage:
            kv_barriers: cute.struct.MemRange[cutlass.Int64, 2]
            q_barriers: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            do_barriers: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sLSE: cute.struct.Align[cute.struct.MemRange[Float32, bM * self.stages], 128]
            sDelta: cute.struct.Align[cute.struct.MemRange[Float32, bM * self.stages], 128]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(q_smem)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(q_smem)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(kv_smem)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(kv_smem)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(ds_smem)], 1024]
            sdQ: cute.struct.Align[cute.struct.MemRange[Float32, bM * D], 128]
            sdV: cute.struct.Align[cute.struct.MemRange[self.dtype, dv_elems], 1024]  # (tma_store)

        self.shared_storage = SharedStorage
        self.kernel(tma_q, tma_mQ, tma_do, tma_mdO, tma_k, tma_mK, tma_v, tma_mV, mLSE2, mDelta, mAcc,
                    mdK, mdV, mma_sdp, mma_dkv, mma_dq, q_smem, kv_smem, ds_smem, tma_dk, tma_mdK, tma_dv, tma_mdV,
                    mma_o, dv_smem, dk_view, H // Hkv, Tq, scale_log2, scale).launch(
            grid=[ctas, 1, 1], block=[self.threads, 1, 1], min_blocks_per_mp=1, stream=stream)

    @cute.jit
    def work_tile(self, tile: Int32, n_blocks: Int32, Hkv: Int32):
        """(valid, key tile, kv head, batch) of work tile ``tile`` (unit ``tile // per_unit``), key tile
        fastest: the CTAs at work together stream the same head's Q and dO, which L2 then serves once.
        (Key tile slowest, so that under the causal mask the longest CTAs start first, measured
        0.55-0.96x as fast on an H100: the L2 misses cost more than the shorter tail.) Paired: unit u's
        tiles are p and n_blocks - 1 - p, p = u % pairs; the second is not ``valid`` when it is p."""
        valid = True
        n_block, hk, b = tile % n_blocks, tile // n_blocks % Hkv, tile // n_blocks // Hkv
        if cutlass.const_expr(self.paired):
            pairs = cute.ceil_div(n_blocks, 2)
            unit = tile // 2
            n_block, hk, b = unit % pairs, unit // pairs % Hkv, unit // pairs // Hkv
            if tile % 2 == 1:
                valid = n_block < n_blocks - 1 - n_block
                n_block = n_blocks - 1 - n_block
        return valid, n_block, hk, b

    def pipeline_states(self, user: pipeline.PipelineUserType):
        """Fresh (K and V, Q, dO) pipeline states of a producer or a consumer: stage 0, phase 0."""
        return (pipeline.make_pipeline_state(user, 1), pipeline.make_pipeline_state(user, self.stages),
                pipeline.make_pipeline_state(user, self.stages))

    @cute.jit
    def q_range(self, n_block: Int32, Tq: Int32):
        """(first, count) of the query tiles that see key tile ``n_block``: all of them, or causal ones
        from the tile holding query n_block * 128 (a query sees the keys up to its own index)."""
        m_tiles = cute.ceil_div(Tq, self.tile_m)
        first = Int32(0)
        if cutlass.const_expr(self.causal):
            first = cutlass.min(n_block * self.tile_n // self.tile_m, m_tiles)
        return first, m_tiles - first

    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, mQ: cute.Tensor, tma_do: cute.CopyAtom, mdO: cute.Tensor,
               tma_k: cute.CopyAtom, mK: cute.Tensor, tma_v: cute.CopyAtom, mV: cute.Tensor,
               mLSE2: cute.Tensor, mDelta: cute.Tensor, mAcc: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
               mma_sdp: cute.TiledMma, mma_dkv: cute.TiledMma, mma_dq: cute.TiledMma,
               q_smem: cute.ComposedLayout, kv_smem: cute.ComposedLayout, ds_smem: cute.ComposedLayout,
               tma_dk, mdK_tma, tma_dv, mdV_tma, mma_o, dv_smem, dk_view, group: Int32, Tq: Int32,
               scale_log2: Float32, scale: Float32):
        # mQ, mdO (Tq, D, H, B) and mK, mV (Tk, D, Hkv, B): TMA coordinate tensors; mdK, mdV (Tk, D, Hkv,
        # B) the outputs; mLSE2, mDelta (Tq padded, H, B); mAcc as accum_tensor; ``tma_store``'s atoms
        # and coordinate tensors of dK and dV, their smem layouts (dv_smem; dk_view in the dS stages) and
        # accumulator layout (mma_o), else None
        D, bM, bN = self.D, self.tile_m, self.tile_n
        tidx, warp_idx, wg_idx, bx, ctas = thread_roles(self.threads_per_wg)
        Tk, Hkv, B = mK.shape[0], mK.shape[2], mK.shape[3]
        n_blocks = cute.ceil_div(Tk, bN)
        tiles = cute.ceil_div(n_blocks, 2) * 2 * Hkv * B if self.paired else n_blocks * Hkv * B
        first_tile = bx * self.per_unit  # this CTA's units are bx, bx + ctas, ... (next_tile)
        if warp_idx == self.producer_warp:
            for atom in (tma_q, tma_do, tma_k, tma_v):
                cpasync.prefetch_descriptor(atom)

        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        def tensors(region, layout):  # the tile and its transpose (the first two modes swapped), same bytes
            return (region.get_tensor(layout.outer, swizzle=layout.inner),
                    region.get_tensor(cute.select(layout.outer, mode=[1, 0, 2]), swizzle=layout.inner))

        sQ, sQt = tensors(storage.sQ, q_smem)  # (bM, D, S), (D, bM, S)
        sdO, sdOt = tensors(storage.sdO, q_smem)
        sK, sKt = tensors(storage.sK, kv_smem)  # (bN, D, 1), (D, bN, 1)
        sV = storage.sV.get_tensor(kv_smem.outer, swizzle=kv_smem.inner)
        sdS, sdSt = tensors(storage.sdS, ds_smem)  # (bM, bN, S), (bN, bM, S)
        sLSE = storage.sLSE.get_tensor(cute.make_layout((bM, self.stages)))
        sDelta = storage.sDelta.get_tensor(cute.make_layout((bM, self.stages)))
        sdQ = storage.sdQ.get_tensor(cute.make_layout((bM * D // 2, 2)))  # a flat buffer per warpgroup
        store = None
        if cutlass.const_expr(self.tma_store):
            sdV_out = storage.sdV.get_tensor(dv_smem.outer, swizzle=dv_smem.inner)  # (64, D, warpgroup)
            sdK_out = storage.sdS.get_tensor(dk_view.outer, swizzle=dk_view.inner)  # (64, D, warpgroup) in dS
            store = (tma_dk, mdK_tma, sdK_out, tma_dv, mdV_tma, sdV_out, mma_o)

        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.consumer_wgs * 4)  # one arrive a warp
        tile_bytes = cute.size_in_bytes(self.dtype, cute.slice_(q_smem, (None, None, 0)))

        def ring(barriers, stages, tx):
            return pipeline.PipelineTmaAsync.create(
                barrier_storage=barriers.data_ptr(), num_stages=stages, producer_group=producer,
                consumer_group=consumers, tx_count=tx, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
                defer_sync=True)

        kv_bytes = 2 * cute.size_in_bytes(self.dtype, cute.slice_(kv_smem, (None, None, 0)))  # K and V
        kv_pipe = ring(storage.kv_barriers, 1, kv_bytes)
        q_pipe = ring(storage.q_barriers, self.stages, tile_bytes + bM * 4)  # Q and its lse
        do_pipe = ring(storage.do_barriers, self.stages, tile_bytes + bM * 4)  # dO and its delta
        pipeline.pipeline_init_arrive()
        pipeline.pipeline_init_wait()

        if wg_idx == self.consumer_wgs:  # ------------------------------------- producer, dQ writer
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == self.producer_warp:
                self.produce(tma_q, mQ, tma_do, mdO, tma_k, mK, tma_v, mV, mLSE2, mDelta, sQ, sdO, sK, sV,
                             sLSE, sDelta, kv_pipe, q_pipe, do_pipe, first_tile, ctas, tiles, n_blocks, group, Tq)
            if warp_idx == self.dq_warp:
                tile = first_tile
                while tile < tiles:
                    valid, n_block, hk, b = self.work_tile(tile, n_blocks, Hkv)
                    first, count = self.q_range(n_block, Tq)
                    if not valid:
                        count = 0
                    for step in cutlass.range(count * group, unroll=1):
                        h = hk * group + step // count
                        m_block = first + step % count
                        for w in cutlass.range_constexpr(self.consumer_wgs):
                            cute.arch.cp_async_bulk_wait_group(self.consumer_wgs - 1 - w, read=True)
                            cute.arch.barrier_arrive(barrier_id=self.bar_dq_empty + w,
                                                     number_of_threads=self.threads_per_wg + 32)
                        for w in cutlass.range_constexpr(self.consumer_wgs):
                            cute.arch.barrier(barrier_id=self.bar_dq_full + w,
                                              number_of_threads=self.threads_per_wg + 32)
                            with cute.arch.elect_one():
                                bulk_reduce_add(sdQ[None, w].iterator, mAcc[None, w, m_block, h, b].iterator,
                                                bM * D * 2)
                            cute.arch.cp_async_bulk_commit_group()
                    tile = next_tile(tile, ctas, self.paired)
                cute.arch.cp_async_bulk_wait_group(0, read=True)  # the engine has read the last buffers

        if wg_idx < self.consumer_wgs:  # --------------------------------------------- consumers
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.consume(mma_sdp, mma_dkv, mma_dq, sQ, sQt, sdO, sdOt, sK, sKt, sV, sdS, sdSt, sLSE, sDelta, sdQ,
                         kv_pipe, q_pipe, do_pipe, mdK, mdV, store, tidx, wg_idx, first_tile, ctas, tiles, n_blocks,
                         group, Tq, scale_log2, scale)

    @cute.jit
    def produce(self, tma_q, mQ, tma_do, mdO, tma_k, mK, tma_v, mV, mLSE2, mDelta, sQ, sdO, sK, sV, sLSE,
                sDelta, kv_pipe, q_pipe, do_pipe, first_tile, ctas, tiles, n_blocks, group, Tq):
        """The producer warp, per work tile: K and V, then Q with lse and dO with delta for every step."""
        D, bM, bN = self.D, self.tile_m, self.tile_n
        Hkv = mK.shape[2]

        def tma(atom, s, g):  # (smem stages, gmem tiles) as the TMA unit sees them
            return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 2),
                                         cute.group_modes(g, 0, 2))

        kv_state, q_state, do_state = self.pipeline_states(pipeline.PipelineUserType.Producer)
        tile = first_tile
        while tile < tiles:
            valid, n_block, hk, b = self.work_tile(tile, n_blocks, Hkv)
            if valid:
                first, count = self.q_range(n_block, Tq)
                tKsK, tKgK = tma(tma_k, sK, cute.local_tile(mK[None, None, hk, b], (bN, D), (n_block, 0)))
                tVsV, tVgV = tma(tma_v, sV, cute.local_tile(mV[None, None, hk, b], (bN, D), (n_block, 0)))
                kv_pipe.producer_acquire(kv_state)  # the last tile's products are done with K and V
                cute.copy(tma_k, tKgK, tKsK[(None, 0)], tma_bar_ptr=kv_pipe.producer_get_barrier(kv_state))
                cute.copy(tma_v, tVgV, tVsV[(None, 0)], tma_bar_ptr=kv_pipe.producer_get_barrier(kv_state))
                kv_state.advance()
                for step in cutlass.range(count * group, unroll=1):
                    h = hk * group + step // count
                    m_block = first + step % count
                    tQsQ, tQgQ = tma(tma_q, sQ, cute.local_tile(mQ[None, None, h, b], (bM, D), (None, 0)))
                    tdOsdO, tdOgdO = tma(tma_do, sdO, cute.local_tile(mdO[None, None, h, b], (bM, D), (None, 0)))
                    q_pipe.producer_acquire(q_state)
                    bar = q_pipe.producer_get_barrier(q_state)
                    cute.copy(tma_q, tQgQ[(None, m_block)], tQsQ[(None, q_state.index)], tma_bar_ptr=bar)
                    with cute.arch.elect_one():
                        bulk_load(mLSE2[None, h, b].iterator + m_block * bM, sLSE[None, q_state.index].iterator, bar,
                                  bM * 4)
                    q_state.advance()
                    do_pipe.producer_acquire(do_state)
                    bar = do_pipe.producer_get_barrier(do_state)
                    cute.copy(tma_do, tdOgdO[(None, m_block)], tdOsdO[(None, do_state.index)], tma_bar_ptr=bar)
                    with cute.arch.elect_one():
                        bulk_load(mDelta[None, h, b].iterator + m_block * bM, sDelta[None, do_state.index].iterator,
                                  bar, bM * 4)
                    do_state.advance()
            tile = next_tile(tile, ctas, self.paired)

    @cute.jit
    def consume(self, mma_sdp: cute.TiledMma, mma_dkv: cute.TiledMma, mma_dq: cute.TiledMma, sQ: cute.Tensor,
                sQt: cute.Tensor, sdO: cute.Tensor, sdOt: cute.Tensor, sK: cute.Tensor, sKt: cute.Tensor,
                sV: cute.Tensor, sdS: cute.Tensor, sdSt: cute.Tensor, sLSE: cute.Tensor, sDelta: cute.Tensor,
                sdQ: cute.Tensor, kv_pipe, q_pipe, do_pipe, mdK: cute.Tensor, mdV: cute.Tensor, store: tuple,
                tidx: Int32, wg_idx: Int32, first_tile: Int32, ctas: Int32, tiles: Int32, n_blocks: Int32,
                group: Int32, Tq: Int32, scale_log2: Float32, scale: Float32):
        """A consumer warpgroup, per work tile: keys [64 w, 64 w + 64) of the tile, their dK and dV,
        its half of each dQ. ``store``: (tma_dk, mdK_tma, sdK_out, tma_dv, mdV_tma, sdV_out, mma_o) of
        ``tma_store``."""
        D, bM, bN = self.D, self.tile_m, self.tile_n
        wg_sdp = mma_sdp.get_slice(wg_idx * self.threads_per_wg)
        wg_dkv = mma_dkv.get_slice(wg_idx * self.threads_per_wg)
        wg_dq = mma_dq.get_slice(wg_idx * self.threads_per_wg)
        thr_sdp = mma_sdp.get_slice(tidx)
        # operands: smem descriptors (last mode: the stage), or registers for P^T and dS^T
        tSrK = wg_sdp.make_fragment_A(wg_sdp.partition_A(sK))  # S^T = K Q^T
        tSrQ = wg_sdp.make_fragment_B(wg_sdp.partition_B(sQ))
        tdPrV = wg_sdp.make_fragment_A(wg_sdp.partition_A(sV))  # dP^T = V dO^T
        tdPrdO = wg_sdp.make_fragment_B(wg_sdp.partition_B(sdO))
        tdVrP = wg_dkv.make_fragment_A(wg_dkv.partition_shape_A((bN, bM)))  # dV += P^T dO
        tdVrdO = wg_dkv.make_fragment_B(wg_dkv.partition_B(sdOt))
        tdKrdS = wg_dkv.make_fragment_A(wg_dkv.partition_shape_A((bN, bM)))  # dK += dS^T Q
        tdKrQ = wg_dkv.make_fragment_B(wg_dkv.partition_B(sQt))
        tdQrdS = wg_dq.make_fragment_A(wg_dq.partition_A(sdS))  # dQ = dS K
        tdQrK = wg_dq.make_fragment_B(wg_dq.partition_B(sKt))
        tsdS = thr_sdp.partition_C(sdSt)  # where this thread's dS^T values go: ((2, 2, bM/8), 1, 1, S)
        acc_dv = cute.make_rmem_tensor(wg_dkv.partition_shape_C((bN, D)), Float32)  # ((2, 2, D/8), 1, 1)
        acc_dk = cute.make_rmem_tensor(wg_dkv.partition_shape_C((bN, D)), Float32)
        cS = mn_view(thr_sdp.partition_C(cute.make_identity_tensor((bN, bM))))  # (key, query) in the tile
        thr_dkv = mma_dkv.get_slice(tidx)
        cD = mn_view(thr_dkv.partition_C(cute.make_identity_tensor((bN, D))))  # (key, d) in the tile
        out = None  # (tma_store) this warpgroup's dK and dV boxes and stmatrix copies
        if cutlass.const_expr(self.tma_store):
            tma_dk, mdK_tma, sdK_out, tma_dv, mdV_tma, sdV_out, mma_o = store
            sdK_w, sdV_w = sdK_out[None, None, wg_idx], sdV_out[None, None, wg_idx]  # (64, D)
            lane = tidx % self.threads_per_wg
            out = ((tma_dk, mdK_tma, sdK_w, stmatrix_copy(self.dtype, mma_o, sdK_w, lane)),
                   (tma_dv, mdV_tma, sdV_w, stmatrix_copy(self.dtype, mma_o, sdV_w, lane)))

        kv_read, q_read, do_read = self.pipeline_states(pipeline.PipelineUserType.Consumer)
        tile = first_tile
        while tile < tiles:
            valid, n_block, hk, b = self.work_tile(tile, n_blocks, mdK.shape[2])
            if valid:
                first, count = self.q_range(n_block, Tq)
                kv_read, q_read, do_read = self.consume_tile(
                    mma_sdp, mma_dkv, mma_dq, tSrK, tSrQ, tdPrV, tdPrdO, tdVrP, tdVrdO, tdKrdS, tdKrQ, tdQrdS,
                    tdQrK, tsdS, acc_dv, acc_dk, cS, wg_sdp, wg_dq, sLSE, sDelta, sdQ, kv_pipe, q_pipe, do_pipe,
                    kv_read, q_read, do_read, tidx, wg_idx, n_block, first, count, count * group, scale_log2)
                self.epilogue(acc_dk, acc_dv, out, cD, thr_dkv, mdK, mdV, tidx, wg_idx, n_block, hk, b, scale)
            tile = next_tile(tile, ctas, self.paired)
        if cutlass.const_expr(self.tma_store):
            if tidx % self.threads_per_wg == 0:
                cute.arch.cp_async_bulk_wait_group(0, read=True)  # the last stores have read smem: the CTA may end

    @cute.jit
    def consume_tile(self, mma_sdp, mma_dkv, mma_dq, tSrK, tSrQ, tdPrV, tdPrdO, tdVrP, tdVrdO, tdKrdS, tdKrQ,
                     tdQrdS, tdQrK, tsdS, acc_dv, acc_dk, cS, wg_sdp, wg_dq, sLSE, sDelta, sdQ, kv_pipe, q_pipe,
                     do_pipe, kv_read, q_read, do_read, tidx: Int32, wg_idx: Int32, n_block: Int32, first: Int32,
                     count: Int32, steps: Int32, scale_log2: Float32):
        """One work tile's products: dK / c and dV in acc_dk, acc_dv. Returns the advanced pipeline
        states (assigned in the caller's loop, so that the DSL carries them from one tile to the next)."""
        D, bM, bN = self.D, self.tile_m, self.tile_n
        pair = self.consumer_wgs * self.threads_per_wg
        rows, cols = cute.size(cS, mode=[0]), cute.size(cS, mode=[1])
        key0 = n_block * bN
        acc_dv.fill(0.0)
        acc_dk.fill(0.0)
        kv_pipe.consumer_wait(kv_read)
        for step in cutlass.range(steps, unroll=1):
            m_block = first + step % count
            stage = q_read.index  # Q, lse and this step's dS buffer
            # --- S^T and dP^T, issued together; fresh accumulators (see _attention_fwd_sm90)
            q_pipe.consumer_wait(q_read)
            acc_s = cute.make_rmem_tensor(wg_sdp.partition_shape_C((bN, bM)), Float32)  # ((2, 2, bM/8), 1, 1)
            wgmma(mma_sdp, acc_s, tSrK[None, None, None, 0], tSrQ[None, None, None, stage], zero_init=True)
            do_pipe.consumer_wait(do_read)
            acc_dp = cute.make_rmem_tensor(wg_sdp.partition_shape_C((bN, bM)), Float32)
            wgmma(mma_sdp, acc_dp, tdPrV[None, None, None, 0], tdPrdO[None, None, None, do_read.index],
                  zero_init=True)
            # --- P^T = exp2(c log2e S^T - lse log2e), 0 where the mask hides the key (query < key)
            warpgroup.wait_group(1)
            S = mn_view(acc_s)
            if cutlass.const_expr(self.causal):
                if m_block * bM < key0 + bN - 1:  # the tile crosses the diagonal
                    for r in cutlass.range_constexpr(rows):
                        for c in cutlass.range_constexpr(cols):
                            if m_block * bM + cS[r, c][1] < key0 + cS[r, c][0]:
                                S[r, c] = -Float32.inf
            for c in cutlass.range_constexpr(cols):
                lse2 = sLSE[cS[0, c][1], stage]
                for r in cutlass.range_constexpr(rows):
                    S[r, c] = cute.math.exp2(S[r, c] * scale_log2 - lse2, fastmath=True)
            tdVrP.store(acc_as_operand_a(acc_s).load().to(self.dtype))
            # --- dS^T = P^T (dP^T - delta): to registers (dK) and to smem (dQ)
            warpgroup.wait_group(0)
            dP = mn_view(acc_dp)
            for c in cutlass.range_constexpr(cols):
                delta = sDelta[cS[0, c][1], do_read.index]
                for r in cutlass.range_constexpr(rows):
                    dP[r, c] = S[r, c] * (dP[r, c] - delta)
            rdS = cute.make_rmem_tensor_like(acc_dp, self.dtype)
            rdS.store(acc_dp.load().to(self.dtype))
            if cutlass.const_expr(self.tma_store):
                if step == 0:  # the last tile's dK stores have read this warpgroup's halves of dS
                    if tidx % self.threads_per_wg == 0:
                        cute.arch.cp_async_bulk_wait_group(0, read=True)
                    cute.arch.barrier(barrier_id=self.bar_epilogue + wg_idx, number_of_threads=self.threads_per_wg)
            cute.autovec_copy(rdS, tsdS[None, None, None, stage])
            tdKrdS.store(acc_as_operand_a(rdS).load())
            # --- dV += P^T dO; then, with both warpgroups' dS in smem, dQ = dS K and dK += dS^T Q
            wgmma(mma_dkv, acc_dv, tdVrP, tdVrdO[None, None, None, do_read.index], zero_init=False)
            cute.arch.fence_view_async_shared()  # the dS stores, visible to the WGMMA (async) proxy
            cute.arch.barrier(barrier_id=self.bar_ds, number_of_threads=pair)
            acc_dq = cute.make_rmem_tensor(wg_dq.partition_shape_C((bM, D)), Float32)  # ((2, 2, D/16), 1, 1)
            wgmma(mma_dq, acc_dq, tdQrdS[None, None, None, stage], tdQrK[None, None, None, 0], zero_init=True)
            wgmma(mma_dkv, acc_dk, tdKrdS, tdKrQ[None, None, None, stage], zero_init=False)
            warpgroup.wait_group(1)  # dV and dQ are done (dK may still run)
            do_pipe.consumer_release(do_read)
            do_read.advance()
            # --- dQ to this warpgroup's buffer once the dQ warp has sent the last one
            cute.arch.barrier(barrier_id=self.bar_dq_empty + wg_idx, number_of_threads=self.threads_per_wg + 32)
            cute.autovec_copy(cute.make_tensor(acc_dq.iterator, cute.make_layout((4, D // 16))),
                              register_order(sdQ[None, wg_idx], tidx, D))
            cute.arch.fence_view_async_shared()
            cute.arch.barrier_arrive(barrier_id=self.bar_dq_full + wg_idx, number_of_threads=self.threads_per_wg + 32)
            warpgroup.wait_group(0)
            q_pipe.consumer_release(q_read)
            q_read.advance()
        kv_pipe.consumer_release(kv_read)  # every product of the tile is done: K and V may be replaced
        kv_read.advance()

        return kv_read, q_read, do_read

    @cute.jit
    def epilogue(self, acc_dk: cute.Tensor, acc_dv: cute.Tensor, out, cD: cute.Tensor, thr_dkv, mdK: cute.Tensor,
                 mdV: cute.Tensor, tidx: Int32, wg_idx: Int32, n_block: Int32, hk: Int32, b: Int32, scale: Float32):
        """dK = c dS^T Q summed, and dV, rounded to the dtype: this warpgroup's 64 key rows. Stored from
        the registers (4 bytes a store, rows past Tk skipped), or (``tma_store``, ``out``) through shared
        memory: dV into its buffer, dK into this warpgroup's halves of the dS stages, once the other
        warpgroup's last dQ = dS K has read them, then one thread's TMA stores, which run on while the
        next tile starts (its first dS write waits until they have read shared memory)."""
        D, bN = self.D, self.tile_n
        acc_dk.store(acc_dk.load() * scale)
        if cutlass.const_expr(self.tma_store):
            leader = tidx % self.threads_per_wg == 0
            if leader:  # (a tile without query tiles wrote no dS: its predecessor's stores may still read)
                cute.arch.cp_async_bulk_wait_group(0, read=True)
            # both warpgroups' products are done (each waited for its own): dS is free
            cute.arch.barrier(barrier_id=self.bar_ds, number_of_threads=self.consumer_wgs * self.threads_per_wg)
            for acc, (_, _, _, copy) in ((acc_dk, out[0]), (acc_dv, out[1])):
                rOut = cute.make_rmem_tensor_like(acc, self.dtype)
                rOut.store(acc.load().to(self.dtype))
                stmatrix_store(copy, rOut)
            cute.arch.fence_proxy("async.shared", space="cta")  # the writes, visible to the copy engine
            cute.arch.barrier(barrier_id=self.bar_epilogue + wg_idx, number_of_threads=self.threads_per_wg)
            if leader:
                for tma, mOut, sOut, _ in out:
                    for j in cutlass.range_constexpr(D // 64):
                        bulk_store_tile(tma, sOut[None, (None, j)], cute.local_tile(
                            mOut[None, None, hk, b], (64, 64), (n_block * 2 + wg_idx, j)))
                cute.arch.cp_async_bulk_commit_group()
        else:
            Tk = mdK.shape[0]
            for acc, mOut in ((acc_dv, mdV), (acc_dk, mdK)):
                rOut = cute.make_rmem_tensor_like(acc, self.dtype)
                rOut.store(acc.load().to(self.dtype))
                rows_out = mn_view(rOut)
                gOut = mn_view(thr_dkv.partition_C(cute.local_tile(mOut[None, None, hk, b], (bN, D), (n_block, 0))))
                for r in cutlass.range_constexpr(cute.size(rows_out, mode=[0])):
                    if n_block * bN + cD[r, 0][0] < Tk:
                        cute.autovec_copy(rows_out[r, None], gOut[r, None])
