"""The cute attention forward on Hopper (sm_90a): TMA, WGMMA and warp specialization (FlashAttention-3's design).

Math (per batch b, query head h, its kv head g = h // (H / Hkv), c = scale > 0; docs/attention.md):

    S = q k^T (Tq, Tk)     P = softmax_rows(c S)  (causal: key j visible to query i iff j <= i)
    out = P v (Tq, D)      lse_i = log sum_j exp(c S_ij)  (float32, saved for the backward)

The same results, cache and lse as the mma.sync kernel of ``_attention_fwd`` (which takes every case
this one does not: float32, head dims other than 64 and 128, strides TMA cannot describe, scale <= 0,
GPUs before Hopper). FLOPs 4 B H Tq Tk D (about half with the causal mask).

Why another kernel
------------------
On an H100 the mma.sync kernel reaches ~300 TFLOP/s at D = 128: mma.sync is a warp-wide instruction
whose operands go through registers (ldmatrix), and the warps that multiply also load and exponentiate,
so the tensor cores idle during the softmax. Hopper's WGMMA (``wgmma.mma_async``) multiplies a 64 x N x 16
block per warpgroup (4 warps) straight out of shared memory, asynchronously: the warps issue it and go on
computing until they wait for it. TMA copies whole tiles into shared memory with one instruction. The
kernel is organized around those two.

Warp roles (384 threads = 3 warpgroups; CTA = 128 queries of one (head, batch))
-----------------------------------------------------------------------------
  - warpgroups 0 and 1, the *consumers*, each own 64 query rows: S = Q K^T (WGMMA, Q and K from smem,
    64 x 128 float32 accumulators = 64 registers a thread), the online softmax in registers, and
    O += P V (WGMMA with A = P from registers, "RS": P never leaves the registers; B = V from smem).
  - warpgroup 2, the *producer*: one thread issues the TMA loads (Q once, then K and V tiles of 128 keys
    into two 2-stage rings, each stage guarded by a "full" mbarrier the copy engine completes and an
    "empty" one the 8 consumer warps arrive on). It keeps 24 registers (``setmaxnreg``) and gives the
    rest to the consumers (240).

Out-of-range rows need no masks on the loads: TMA fills the part of a box outside the tensor (query rows
past Tq, key rows past Tk) with zeros, and a box never crosses D (the box is D wide).

The consumer loop (FlashAttention-3's intra-warpgroup overlap)
-------------------------------------------------------------
Key tiles are visited from the last (the masked ones: the causal diagonal, the Tk tail) to the first,
so that the first tile already gives every row a finite max (a query row i >= the tile's first row
sees the first key of the last tile), and the masks are a prefix of the loop. With tile n just
multiplied into S and turned into P:

    issue S' = Q K[n-1]^T              (async)
    issue O += P V[n]                  (async: P is read from registers while the next line runs)
    wait for S'; mask S' if needed; m' = max(m, rowmax S'); alpha = exp2(c (m - m'))
    p' = exp2(c S' - c m'); l = alpha l + rowsum p'          (the softmax of tile n-1 overlaps P V[n])
    wait for P V[n]; O *= alpha; P = bf16(p')

so the tensor cores always have a product queued while the warpgroup exponentiates. Scores stay in raw
units: one FFMA (c s - c m') feeds each exp2. The P registers are the S accumulators reinterpreted: a
thread's accumulator pairs for n8 blocks 2j and 2j+1 are exactly its A-operand registers for k block j
of P V (``acc_as_operand_a``), as for mma.sync.

Ping-pong (``pingpong``): two named barriers make the consumers take turns to issue their WGMMAs, so that
one warpgroup's softmax runs while the other's products run, FlashAttention-3's inter-warpgroup overlap
(``config``: without the mask at D = 128, with it on the scheduled walk).

Across tiles (``overlap``, in a CTA that runs several: persistent or paired): the next tile's first
S = Q K^T is issued beside this tile's last P V, its softmax (into a second set of row statistics)
runs while that P V does, then this tile's epilogue; without it the last P V, the epilogue and the
next tile's first S each run alone. Two Q stages (``q_stages``) let the next tile's Q arrive early.

The epilogue: out = O / l rounded to the dtype, stored straight from registers, rows past Tq skipped;
lse = (c m + log2 l) ln 2, one lane of each quad per row.

The walk of the work (``config``): without the mask a persistent grid over single tiles; with it, up
to 64 query tiles, a persistent grid whose CTAs each walk a row of a table the host makes once per
shape (``scheduled``: pairs of tiles with equal work, m_tiles - 1 - p and p, round-robin, and the last
two rounds' tiles split and balanced longest first; ``schedule``), beyond that one CTA per tile,
longest first.

What it takes (``supports``): float16 / bfloat16, D in {64, 128}, scale > 0, sm_90a; q, k, v with a
unit-stride head dim, batch, head and sequence strides multiples of 8 elements (16 bytes: TMA's unit)
and 16-byte aligned base addresses. Compile key: (dtype, D, causal) and the variant (tile_n,
persistent, paired, pingpong, overlap, q_stages, k_stages, v_stages, tma_store, scheduled); sizes, strides,
the scale and the table are runtime arguments. The variant is ``config``'s, but for the fields the
attention table (``attention.Launch``, ``kcourse.blas.tuning``) fixes.
"""

# No ``from __future__ import annotations`` here: ``cute.struct`` reads its fields from the class's
# annotations and needs the objects, not strings (the CPU suite failed that way when the DSL ran a
# host function it had already transformed once).
import dataclasses
import heapq
import math
from types import SimpleNamespace

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.tensor_utils import LayoutEnum
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync, warp, warpgroup

from .._layout import heads_strides, is_like_heads, tma_strides, token_major
from .. import _cache
from . import _compile
from ._attention_fwd import LOG2E, _mask_scores, head_tensor, mn_view, quad_sum, row_tensor, softmax_tile
from ._reduce import sm_count

LN2 = math.log(2.0)
VEC = 8  # 16 bytes of a 16-bit type: TMA's unit of address and stride
HEAD_DIMS = (64, 128)


# ------------------------------------------------------------------------------------------------
# Host side: which calls the kernel takes (their TMA strides: ``_layout.tma_strides``)
# ------------------------------------------------------------------------------------------------
def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> bool:
    """True when this kernel computes the forward of these (B, H, T, D) operands: see the module docstring."""
    return (_compile.target() == "sm_90a" and q.dtype in (torch.float16, torch.bfloat16)
            and q.shape[-1] in HEAD_DIMS and scale > 0
            and all(tma_strides(t) is not None for t in (q, k, v)))


def config(D: int, causal: bool, Tq: int) -> dict:
    """The kernel's variant for a head dim, mask and query length: every field of the attention
    table (``attention.Launch``, where each is described) but the backward's. The choices and their
    measurements: docs/attention.md, "Why these defaults"."""
    m_tiles = -(-Tq // 128)
    scheduled = causal and m_tiles <= 64  # pairs of tiles, the last rounds balanced (``schedule``)
    tma_store = (scheduled or (not causal and m_tiles <= 32)) if D == 128 else m_tiles <= 16
    overlap = D == 128 and (scheduled or (not causal and m_tiles <= 8))
    return {"tile_n": 128, "persistent": scheduled or not causal, "paired": False, "scheduled": scheduled,
            "pingpong": scheduled or (D == 128 and not causal), "overlap": overlap, "q_stages": 2 if overlap else 1,
            "k_stages": 2, "v_stages": 2, "tma_store": tma_store}


TILE_COST = 0.5  # a work tile's fixed cost (Q, the epilogue), in key tiles, as ``schedule`` weighs it


def schedule(m_tiles: int, heads: int, Tk: int, causal: bool, grid: int) -> list[list[int]]:
    """A static walk of the work tiles for ``grid`` persistent CTAs (``scheduled``): list c is the tiles
    CTA c runs, in order. Tile t is query tile ``m_tiles - 1 - t % m_tiles`` of head (and batch)
    ``t // m_tiles``, the numbering of one tile a unit.

    Why: pairs of causal tiles (``paired``) all cost the same, m_tiles + 1 key tiles, so U pairs on G
    CTAs take ceil(U / G) pair-times: with the runner's 1024 pairs on an H100's 132 SMs, 8 where 7.76
    would do, 3% of the time with a quarter of the SMs idle in the last round. Here the pairs run as
    before (round-robin, a head's pairs side by side, so that the CTAs at work together read the same
    K and V) but for the last two rounds and the remainder: their tiles, split again, go longest first
    each to the CTA with the least work so far (LPT). A tile costs its key tiles plus ``TILE_COST``.
    The pairs' own walk is kept where it is no worse (a length that is a multiple of the grid)."""
    tile_n = 128
    cost = [0.0] * (m_tiles * heads)
    for t in range(m_tiles * heads):
        m_block = m_tiles - 1 - t % m_tiles
        n_blocks = -(-min((m_block + 1) * tile_n, Tk) // tile_n) if causal else -(-Tk // tile_n)
        cost[t] = n_blocks + TILE_COST
    units = []  # pairs: the long tile (t % m_tiles = p), then its partner, in the walk of ``paired``
    for hb in range(heads):
        for p in range(-(-m_tiles // 2)):
            units.append([hb * m_tiles + p] + ([hb * m_tiles + m_tiles - 1 - p] if 2 * p + 1 < m_tiles else []))
    walks = [[] for _ in range(grid)]
    for u, unit in enumerate(units):  # ``paired``'s own walk, for comparison
        walks[u % grid] += unit
    bulk = max(len(units) // grid - 2, 0) * grid
    lpt = [sum(units[c:bulk:grid], []) for c in range(grid)]  # the pairs' first rounds as they were
    loads = [(sum(cost[t] for t in walk), c) for c, walk in enumerate(lpt)]
    heapq.heapify(loads)
    for t in sorted((t for unit in units[bulk:] for t in unit), key=lambda t: -cost[t]):  # stable: heads in order
        load, c = heapq.heappop(loads)
        lpt[c].append(t)
        heapq.heappush(loads, (load + cost[t], c))
    makespan = lambda ws: max(sum(cost[t] for t in w) for w in ws)  # noqa: E731
    return lpt if makespan(lpt) < makespan(walks) else walks


_schedules: dict[tuple, torch.Tensor] = {}  # (device index, m_tiles, heads, Tk, causal, grid) -> its table
_captured: dict[tuple, torch.Tensor] = {}  # the tables a CUDA graph may read: never freed


def schedule_table(m_tiles: int, heads: int, Tk: int, causal: bool, grid: int, device: torch.device):
    """``schedule`` as the kernel reads it: an int32 (grid, L) tensor on ``device``, row c CTA c's walk
    then ``m_tiles * heads`` (past the last tile: the end) to the row's end. Made once per key and kept
    (at most ``_compile.PLANS``, the oldest freed first). While a CUDA graph is captured or warmed
    up (``_cache.keepable``): the table, kept for good (the graph may be replayed at any time), or None if it is not made
    yet (a copy to the device cannot be captured): then the caller walks pairs instead, which changes
    the order of the tiles, never a bit of their results."""
    key = (device.index, m_tiles, heads, Tk, causal, grid)
    table = _schedules.get(key, _captured.get(key))
    if not _cache.keepable(device):
        if table is not None:
            _captured[key] = table
        return table
    if table is None:
        walks = schedule(m_tiles, heads, Tk, causal, grid)
        width = max(len(w) for w in walks) + 1
        rows = [w + [m_tiles * heads] * (width - len(w)) for w in walks]
        if len(_schedules) >= _compile.PLANS:
            _schedules.pop(next(iter(_schedules)))
        table = _schedules[key] = torch.tensor(rows, dtype=torch.int32).to(device)
    return table


def plan(q, k, v, causal: bool, scale: float, sms: int, launch) -> tuple:
    """``(key, numbers, walk)`` of the launch for q, k, v (tensors, or their ``_compile.Operand``
    stand-ins) as ``supports`` takes them and a new out laid out as ``_layout.heads_like(q)``: the
    compile key, the runtime numbers after the pointers and the table's width, and
    ``schedule_table``'s arguments but the device where the walk is ``scheduled`` (else None).
    ``sms``: the device's SM count; ``launch``: the attention table (``attention.Launch``): its
    fields that are not None replace ``config``'s."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    c = config(D, causal, Tq)
    c.update({name: value for name in c if (value := getattr(launch, name)) is not None})
    walk = None
    if c["scheduled"]:  # a persistent CTA per SM (or per unit, if fewer) walking its row of the table
        m_tiles = -(-Tq // 128)
        sms = min(sms, -(-m_tiles // 2) * H * B)
        walk = (m_tiles, H * B, Tk, causal, sms)
    key = (q.dtype, D, causal, c["tile_n"], c["persistent"], c["paired"], c["pingpong"], c["overlap"], c["q_stages"],
           c["k_stages"], c["v_stages"], c["tma_store"], c["scheduled"])
    out = heads_strides(q.shape, token_major(q))[:3]  # heads_like(q)'s (batch, head, row) strides
    numbers = (B, H, Hkv, Tq, Tk, *tma_strides(q), *tma_strides(k), *tma_strides(v), *out, scale * LOG2E, sms)
    return key, numbers, walk


def attention_fwd_sm90(q, k, v, out, lse, causal: bool, scale: float, launch, planned: tuple | None = None) -> None:
    """out <- attention(q, k, v), lse <- its log-sum-exp; q, k, v as ``supports`` accepts, out (B, H,
    Tq, D) new, laid out as ``_layout.heads_like(q)``, lse (B, H, Tq) float32 contiguous. ``launch``: the
    attention table (``attention.Launch``; ``tuning.launch("attention")``); ``planned``: ``plan``'s
    answer for these operands under it (the cute attention caches it per layout), else worked out here."""
    if not is_like_heads(out, q):
        raise ValueError(f"attention (cute, Hopper forward): out {tuple(out.shape)} with strides {out.stride()} is "
                         f"not laid out as _layout.heads_like(q) (q's strides {q.stride()}); allocate it with that")
    key, numbers, walk = planned or plan(q, k, v, causal, scale, sm_count(q.device), launch)
    table = lse  # any int32-aligned pointer where no table is read
    if walk is not None:
        table = schedule_table(*walk, q.device)
        if table is None:  # being captured: pairs (the same results)
            return attention_fwd_sm90(q, k, v, out, lse, causal, scale,
                                      dataclasses.replace(launch, scheduled=False, paired=True))
    pointer = _compile.pointer
    _compile.launch(_AttentionFwdSm90, key, pointer(q, 16), pointer(k, 16), pointer(v, 16), pointer(out, 16),
                    pointer(lse, 4), _compile.PointerArg(table.data_ptr(), cutlass.Int32, 4), table.shape[-1],
                    *numbers, _compile.stream_of(q))


# ------------------------------------------------------------------------------------------------
# Register-level helpers
# ------------------------------------------------------------------------------------------------
def acc_as_operand_a(acc: cute.Tensor) -> cute.Tensor:
    """A WGMMA accumulator ((2, 2, N / 8), MMA_M, MMA_N) seen as the A operand of the next product,
    ((2, 2, 2), MMA_M, (N / 16, MMA_N)): for k block j of 16 keys the A registers of a thread are its
    accumulator values of n8 blocks 2j and 2j + 1 (column pair, row half, then block), the same values
    in the same order, so the view costs no instruction."""
    blocks = cute.logical_divide(acc.layout, ((None, None, 2), None, None))  # ((2, 2, (2, N/16)), M, N)
    s, d = blocks.shape, blocks.stride
    return cute.make_tensor(acc.iterator, cute.make_layout(
        ((s[0][0], s[0][1], s[0][2][0]), s[1], (s[0][2][1], s[2])),
        stride=((d[0][0], d[0][1], d[0][2][0]), d[1], (d[0][2][1], d[2]))))


def thread_roles(threads_per_wg: int):
    """(tidx, warp_idx, wg_idx, bx, grid) of this thread: its index, its warp's and warpgroup's (warp
    uniform: the compiler may branch on them without divergence), its CTA's and the CTA count."""
    tidx, _, _ = cute.arch.thread_idx()
    warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    wg_idx = cute.arch.make_warp_uniform(tidx // threads_per_wg)
    bx, _, _ = cute.arch.block_idx()
    grid, _, _ = cute.arch.grid_dim()
    return tidx, warp_idx, wg_idx, bx, grid


def epilogue_mma(dtype, D: int) -> cute.TiledMma:
    """One warpgroup's 64 x D WGMMA tile (A from registers): the accumulator layout a TMA-store
    epilogue's stmatrix copy reads (the forward's P V, the backward's dK and dV)."""
    major = cute.nvgpu.OperandMajorMode
    return sm90_utils.make_trivial_tiled_mma(dtype, dtype, major.K, major.MN, Float32, (1, 1, 1), tiler_mn=(64, D),
                                             a_source=warpgroup.OperandSource.RMEM)


def stmatrix_copy(dtype, mma_o: cute.TiledMma, sX: cute.Tensor, tidx: Int32) -> SimpleNamespace:
    """The stmatrix copy (four 8 x 8 blocks a warp) of a warpgroup's 64 x D accumulator tile, laid out
    as ``mma_o``'s (``epilogue_mma``) and rounded to ``dtype``, into sX (64, D) of shared memory;
    tidx: the thread's index in its warpgroup. ``dst``: where this thread's values go; ``src``: a
    register tile in the copy's shape (``stmatrix_store`` fills it)."""
    atom = cute.make_copy_atom(warp.StMatrix8x8x16bOp(False, 4), dtype)
    r2s = cute.make_tiled_copy_S(atom, cute.make_tiled_copy_C_atom(atom, mma_o))
    thr = r2s.get_slice(tidx)
    return SimpleNamespace(r2s=r2s, dst=thr.partition_D(sX),
                           src=cute.make_rmem_tensor(cute.shape(thr.partition_S(sX)), dtype))


@cute.jit
def stmatrix_store(copy: SimpleNamespace, rX: cute.Tensor):
    """rX (the accumulator tile in ``dtype``, mma_o's layout) -> shared memory through ``copy``."""
    copy.src.store(copy.r2s.retile(rX).load().reshape(copy.src.shape))  # the same registers in the copy's shape
    cute.copy(copy.r2s, copy.src, copy.dst)


@cute.jit
def bulk_store_tile(tma: cute.CopyAtom, sX: cute.Tensor, gX: cute.Tensor):
    """One thread's TMA store of the box sX (smem) to gX (its TMA coordinate tile); rows and columns
    past the tensor's end are clipped by the copy engine. Commit and wait with the bulk-group calls."""
    s, g = cpasync.tma_partition(tma, 0, cute.make_layout(1), cute.group_modes(sX, 0, 2), cute.group_modes(gX, 0, 2))
    cute.copy(tma, s, g)


@cute.jit
def wgmma(tiled_mma: cute.TiledMma, acc: cute.Tensor, a: cute.Tensor, b: cute.Tensor,
          zero_init: cutlass.Constexpr):
    """Issue acc (+)= a b, k block by k block, as one WGMMA group; does not wait for it. a (MMA, MMA_M,
    MMA_K) registers or smem descriptors, b (MMA, MMA_N, MMA_K) descriptors."""
    warpgroup.fence()  # register writes to acc and a come before the WGMMAs read them
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    for kb in cutlass.range_constexpr(cute.size(a, mode=[2])):
        cute.gemm(atom, acc, a[None, None, kb], b[None, None, kb], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()


@cute.jit
def next_tile(tile: Int32, grid: Int32, paired: cutlass.Constexpr) -> Int32:
    """The work tile after ``tile`` in a persistent CTA's walk, where grid CTAs walk the work units and
    a unit is one tile, or two (``paired``: tiles 2 u and 2 u + 1): the unit's other tile, or the first
    of the unit ``grid`` further on. (Used by the forward and the backward.)"""
    if cutlass.const_expr(paired):
        tile += 1
        if tile % 2 == 0:
            tile += 2 * (grid - 1)
    else:
        tile += grid
    return tile


# ------------------------------------------------------------------------------------------------
# The kernel
# ------------------------------------------------------------------------------------------------
class _AttentionFwdSm90:
    """The compiled kernel for one key (dtype, D, causal, tile_n, persistent, paired, pingpong, overlap,
    q_stages, k_stages, v_stages, tma_store, scheduled); ``__call__`` is the host function."""

    threads_per_wg = 128
    consumer_wgs = 2
    tile_m = 128  # queries per work tile: 64 per consumer warpgroup
    producer_warp = 8  # the first warp of warpgroup 2
    producer_regs, consumer_regs = 24, 240  # 128 * 24 + 256 * 240 = 64512 of the SM's 65536
    pingpong_barrier = 2  # named barriers 2, 3: "consumer warpgroup 0 / 1 may issue its WGMMAs"
    epilogue_barrier = 4  # named barriers 4, 5: the threads of consumer warpgroup 0 / 1 (the TMA store)

    def __init__(self, dtype: torch.dtype, D: int, causal: bool, tile_n: int, persistent: bool, paired: bool,
                 pingpong: bool, overlap: bool, q_stages: int, k_stages: int = 2, v_stages: int = 2,
                 tma_store: bool = False, scheduled: bool = False):
        self.dtype = _compile.DTYPES[dtype]
        self.D, self.causal, self.tile_n = D, causal, tile_n
        if scheduled and (paired or not persistent):
            raise ValueError("cute attention (forward, sm_90): a scheduled walk is of single tiles on a persistent "
                             f"grid, not paired={paired}, persistent={persistent}")
        self.persistent, self.paired, self.pingpong = persistent, paired, pingpong
        self.scheduled = scheduled  # each CTA walks its row of a host-made table (``schedule``)
        self.per_unit = 2 if paired else 1  # work tiles per unit
        self.overlap = overlap  # a tile's first product beside the last P V of the tile before
        self.q_stages = q_stages  # 2: the next tile's Q loads while this tile runs
        self.k_stages, self.v_stages = k_stages, v_stages  # the K and V rings (D = 128: 32 KB a stage each)
        self.tma_store = tma_store  # the epilogue: out through shared memory and a TMA store
        tile_bytes = 2 * self.tile_m * D  # a Q, K, V or out tile (16-bit types, tile_n = tile_m)
        smem = 1024 + tile_bytes * (q_stages + k_stages + v_stages + tma_store)  # + mbarriers and alignment
        if smem > 227 * 1024:
            raise ValueError(f"cute attention (forward, sm_90): the variant q_stages={q_stages}, k_stages={k_stages}, "
                             f"v_stages={v_stages}, tma_store={tma_store} needs {smem} bytes of shared memory at "
                             f"D = {D}, more than an SM has (227 KB)")
        self.threads = (self.consumer_wgs + 1) * self.threads_per_wg

    @cute.jit
    def __call__(self, pq: cute.Pointer, pk: cute.Pointer, pv: cute.Pointer, po: cute.Pointer, plse: cute.Pointer,
                 pwalk: cute.Pointer, walk_len: Int32, B: Int32, H: Int32, Hkv: Int32, Tq: Int32, Tk: Int32,
                 sq_b: Int64, sq_h: Int64, sq_t: Int64, sk_b: Int64, sk_h: Int64, sk_t: Int64,
                 sv_b: Int64, sv_h: Int64, sv_t: Int64, so_b: Int64, so_h: Int64, so_t: Int64,
                 scale_log2: Float32, sms: Int32, stream: cuda.CUstream):
        D, bM, bN = self.D, self.tile_m, self.tile_n

        # --- global tensors in CuTe's GEMM order: S = Q K^T has A = Q (M=Tq, K=D) and B = K (N=Tk, K=D),
        # both K-major; O = P V has B = V^T (N=D, K=Tk): V read in place as an MN-major operand. Strides
        # promised multiples of 8 elements (the host checked).
        mQ = head_tensor(pq, Tq, D, H, B, sq_t, sq_h, sq_b, VEC)
        mK = head_tensor(pk, Tk, D, Hkv, B, sk_t, sk_h, sk_b, VEC)
        mV = head_tensor(pv, Tk, D, Hkv, B, sv_t, sv_h, sv_b, VEC)
        mVt = cute.make_tensor(pv, cute.select(mV.layout, mode=[1, 0, 2, 3]))  # (D, Tk, Hkv, B)
        mO = head_tensor(po, Tq, D, H, B, so_t, so_h, so_b, VEC)
        mLSE = row_tensor(plse, Tq, H, B)
        mWalk = cute.make_tensor(pwalk, cute.make_layout((walk_len, sms), stride=(1, walk_len)))  # (L, CTA)

        # --- the two products, each warpgroup a 64-row slice: S (64 x bN) and O (64 x D), float32
        major = cute.nvgpu.OperandMajorMode
        mma_qk = sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, major.K, major.K, Float32,
                                                   (self.consumer_wgs, 1, 1), tiler_mn=(64, bN))
        mma_pv = sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, major.K, major.MN, Float32,
                                                   (self.consumer_wgs, 1, 1), tiler_mn=(64, D),
                                                   a_source=warpgroup.OperandSource.RMEM)

        # --- shared memory: 128-byte-swizzled tiles, as TMA writes them and WGMMA reads them
        row_major, col_major = LayoutEnum.ROW_MAJOR, LayoutEnum.COL_MAJOR
        q_smem = sm90_utils.make_smem_layout_a(row_major, (bM, bN, D), self.dtype, self.q_stages)  # (bM, D, Sq)
        k_smem = sm90_utils.make_smem_layout_b(row_major, (bM, bN, D), self.dtype, self.k_stages)  # (bN, D, S)
        v_smem = sm90_utils.make_smem_layout_b(col_major, (bM, D, bN), self.dtype, self.v_stages)  # (D, bN, S)

        # --- TMA: one box per tile (the DSL splits a 256-byte-wide row into two 128-byte boxes)
        load = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tma_mQ = cpasync.make_tiled_tma_atom(load, mQ, cute.slice_(q_smem, (None, None, 0)), (bM, D))
        tma_k, tma_mK = cpasync.make_tiled_tma_atom(load, mK, cute.slice_(k_smem, (None, None, 0)), (bN, D))
        tma_v, tma_mVt = cpasync.make_tiled_tma_atom(load, mVt, cute.slice_(v_smem, (None, None, 0)), (D, bN))
        # the epilogue's store (``tma_store``): each consumer warpgroup writes its 64 rows of out into its
        # own swizzled buffer (stmatrix) and ships them with one TMA store; rows past Tq are clipped by
        # the copy engine (the box is 64 x D, and D is the tensor's own last extent)
        o_smem = sm90_utils.make_smem_layout_epi(self.dtype, row_major, (64, D), self.consumer_wgs)  # (64, D, 2)
        tma_o = tma_mO = mma_o = None
        if cutlass.const_expr(self.tma_store):
            tma_o, tma_mO = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), mO,
                                                        cute.slice_(o_smem, (None, None, 0)), (64, D))
            mma_o = epilogue_mma(self.dtype, D)  # one warpgroup's share of P V, whose accumulator stmatrix copies
        o_elems = cute.cosize(o_smem) if self.tma_store else 8

        @cute.struct
        class SharedStorage:
            q_full: cute.struct.MemRange[cutlass.Int64, self.q_stages * 2]  # full, empty per Q stage
            k_barriers: cute.struct.MemRange[cutlass.Int64, self.k_stages * 2]
            v_barriers: cute.struct.MemRange[cutlass.Int64, self.v_stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(q_smem)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(k_smem)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(v_smem)], 1024]
            sO: cute.struct.Align[cute.struct.MemRange[self.dtype, o_elems], 1024]  # (tma_store)

        self.shared_storage = SharedStorage
        # work tiles (query tile, head, batch), query tile fastest: the CTAs at work together read the
        # same K and V; in reverse query order, so that under the causal mask the longest tiles start
        # first. Paired: a work *unit* is two query tiles, m_tiles - 1 - p and its partner p (none for the
        # middle tile of an odd count), which together have m_tiles + 1 key tiles under the mask: every
        # unit the same work. Otherwise a unit is one tile. Persistent: one CTA per SM walks units bx,
        # bx + grid, ... (its producer loads the next unit's Q, K and V during this one's last products
        # and stores); otherwise one CTA a unit.
        m_tiles = cute.ceil_div(Tq, bM)
        units = m_tiles * H * B
        if cutlass.const_expr(self.paired):
            units = cute.ceil_div(m_tiles, 2) * H * B
        grid = units
        if cutlass.const_expr(self.persistent):
            grid = cutlass.min(units, sms)  # scheduled: the host made sms the table's CTA count
        self.kernel(tma_q, tma_mQ, tma_k, tma_mK, tma_v, tma_mVt, mO, mLSE, mma_qk, mma_pv, q_smem, k_smem, v_smem,
                    tma_o, tma_mO, mma_o, o_smem, mWalk, H // Hkv, units, scale_log2).launch(
            grid=[grid, 1, 1], block=[self.threads, 1, 1], min_blocks_per_mp=1, stream=stream)

    def pipeline_states(self, user: pipeline.PipelineUserType):
        """Fresh (Q, K, V) pipeline states of a producer or a consumer: stage 0, phase 0."""
        return (pipeline.make_pipeline_state(user, self.q_stages), pipeline.make_pipeline_state(user, self.k_stages),
                pipeline.make_pipeline_state(user, self.v_stages))

    @cute.jit
    def work_tile(self, tile: Int32, Tq: Int32, Tk: Int32, H: Int32):
        """(valid, m_block, h, b, row0, n_blocks, n_masked) of work tile ``tile`` (unit ``tile // per``,
        its tile ``tile % per`` of ``per`` = 2 paired, else 1): its key tiles are [0, n_blocks), visited
        last to first, and those >= n_masked need the mask; a tile that is not ``valid`` (the missing
        partner of a paired middle tile) is skipped."""
        bM, bN = self.tile_m, self.tile_n
        m_tiles = cute.ceil_div(Tq, bM)
        valid = True
        m_block = m_tiles - 1 - tile % m_tiles
        h = (tile // m_tiles) % H
        b = tile // m_tiles // H
        if cutlass.const_expr(self.paired):
            pairs = cute.ceil_div(m_tiles, 2)
            unit = tile // 2
            p = unit % pairs
            h = unit // pairs % H
            b = unit // pairs // H
            m_block = m_tiles - 1 - p
            if tile % 2 == 1:
                m_block = p
                valid = p < m_tiles - 1 - p
        row0 = m_block * bM
        n_blocks = cute.ceil_div(Tk, bN)
        n_masked = Tk // bN
        if cutlass.const_expr(self.causal):
            n_blocks = cute.ceil_div(cutlass.min(row0 + bM, Tk), bN)
            n_masked = cutlass.min(row0 // bN, n_masked)
        return valid, m_block, h, b, row0, n_blocks, n_masked

    @cute.jit
    def next_valid_tile(self, tile: Int32, grid: Int32, Tq: Int32, Tk: Int32, H: Int32) -> Int32:
        """``next_tile``, past a tile that ``work_tile`` calls not valid (the missing partner of an odd
        count's paired middle tile; the tile after it, a unit's first, always is)."""
        nxt = next_tile(tile, grid, self.paired)
        if cutlass.const_expr(self.paired):
            valid = self.work_tile(nxt, Tq, Tk, H)[0]
            if not valid:
                nxt = next_tile(nxt, grid, self.paired)
        return nxt

    @cute.jit
    def first_tile(self, mWalk: cute.Tensor, bx: Int32) -> Int32:
        """The first work tile of CTA bx's walk (past the last tile: none)."""
        if cutlass.const_expr(self.scheduled):
            return mWalk[0, bx]
        return bx * self.per_unit

    @cute.jit
    def tile_after(self, tile: Int32, i: Int32, mWalk: cute.Tensor, bx: Int32, grid: Int32, Tq: Int32, Tk: Int32,
                   H: Int32) -> Int32:
        """The valid work tile after ``tile``, the i-th of CTA bx's walk (``scheduled``: its table row)."""
        if cutlass.const_expr(self.scheduled):
            return mWalk[i, bx]
        return self.next_valid_tile(tile, grid, Tq, Tk, H)

    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, mQ: cute.Tensor, tma_k: cute.CopyAtom, mK: cute.Tensor,
               tma_v: cute.CopyAtom, mVt: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               mma_qk: cute.TiledMma, mma_pv: cute.TiledMma, q_smem: cute.ComposedLayout,
               k_smem: cute.ComposedLayout, v_smem: cute.ComposedLayout, tma_o, mO_tma, mma_o,
               o_smem: cute.ComposedLayout, mWalk: cute.Tensor, group: Int32, units: Int32, scale_log2: Float32):
        # mQ (Tq, D, H, B), mK (Tk, D, Hkv, B), mVt (D, Tk, Hkv, B), mO_tma (Tq, D, H, B): TMA coordinate
        # tensors (mO_tma, tma_o, mma_o: None without ``tma_store``); mO (Tq, D, H, B) out itself;
        # mLSE (Tq, H, B) float32; mWalk (L, CTA) int32 the CTAs' walks (``scheduled``)
        tidx, warp_idx, wg_idx, bx, grid = thread_roles(self.threads_per_wg)
        Tq, Tk, H = mO.shape[0], mK.shape[0], mO.shape[2]
        if warp_idx == self.producer_warp:
            for atom in (tma_q, tma_k, tma_v):
                cpasync.prefetch_descriptor(atom)

        # --- shared memory and the three pipelines (Q: one stage, K and V: two)
        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        sQ = storage.sQ.get_tensor(q_smem.outer, swizzle=q_smem.inner)  # (bM, D, 1)
        sK = storage.sK.get_tensor(k_smem.outer, swizzle=k_smem.inner)  # (bN, D, S)
        sVt = storage.sV.get_tensor(v_smem.outer, swizzle=v_smem.inner)  # (D, bN, S)
        sO = None
        if cutlass.const_expr(self.tma_store):
            sO = storage.sO.get_tensor(o_smem.outer, swizzle=o_smem.inner)  # (64, D, consumer warpgroup)
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.consumer_wgs * 4)  # one arrive a warp

        def ring(barriers, stages, layout):
            return pipeline.PipelineTmaAsync.create(
                barrier_storage=barriers.data_ptr(), num_stages=stages, producer_group=producer,
                consumer_group=consumers, tx_count=cute.size_in_bytes(self.dtype, cute.slice_(layout, (None, None, 0))),
                cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)), defer_sync=True)

        q_pipe = ring(storage.q_full, self.q_stages, q_smem)
        k_pipe = ring(storage.k_barriers, self.k_stages, k_smem)
        v_pipe = ring(storage.v_barriers, self.v_stages, v_smem)
        pipeline.pipeline_init_arrive()
        pipeline.pipeline_init_wait()  # every barrier initialised before anyone uses it

        if wg_idx == self.consumer_wgs:  # ---------------------------------------------- producer
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == self.producer_warp:
                self.produce(tma_q, mQ, tma_k, mK, tma_v, mVt, sQ, sK, sVt, q_pipe, k_pipe, v_pipe, mWalk, bx, grid,
                             units, group, Tq, Tk, H)

        if wg_idx < self.consumer_wgs:  # --------------------------------------------- consumers
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.consume(mma_qk, mma_pv, sQ, sK, sVt, q_pipe, k_pipe, v_pipe, mO, mLSE, (tma_o, mO_tma, mma_o, sO),
                         mWalk, tidx, wg_idx, bx, grid, units, Tq, Tk, H, scale_log2)

    @cute.jit
    def load_q(self, tma_q: cute.CopyAtom, mQ: cute.Tensor, sQ: cute.Tensor, q_pipe, q_state, tile: Int32, Tq: Int32,
               Tk: Int32, H: Int32):
        """The producer: work tile ``tile``'s Q into the next Q stage, once the consumers have freed it.
        Returns the advanced Q state."""
        _, m_block, h, b, _, _, _ = self.work_tile(tile, Tq, Tk, H)
        gQ = cute.local_tile(mQ[None, None, h, b], (self.tile_m, self.D), (m_block, 0))  # (bM, D)
        tQsQ, tQgQ = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                           cute.group_modes(gQ, 0, 2))
        q_pipe.producer_acquire(q_state)  # the S = Q K^T products of the Q there before are done
        cute.copy(tma_q, tQgQ, tQsQ[(None, q_state.index)], tma_bar_ptr=q_pipe.producer_get_barrier(q_state))
        q_state.advance()
        return q_state

    @cute.jit
    def produce(self, tma_q, mQ, tma_k, mK, tma_v, mVt, sQ, sK, sVt, q_pipe, k_pipe, v_pipe, mWalk: cute.Tensor,
                bx: Int32, grid: Int32, units: Int32, group: Int32, Tq: Int32, Tk: Int32, H: Int32):
        """The producer thread: for each work tile of CTA bx's walk its Q, then its K and V tiles, last to
        first, each into its ring as a stage frees. (Loading the next tile's Q right after this tile's
        first K and V, a tile ahead, measured 2% slower with the mask at T = 1k-2k: the wait for its stage
        holds back this tile's K and V.)"""
        bN, D = self.tile_n, self.D
        q_state, k_state, v_state = self.pipeline_states(pipeline.PipelineUserType.Producer)
        tile, end, walked = self.first_tile(mWalk, bx), units * self.per_unit, Int32(0)
        while tile < end:
            walked += 1
            nxt = self.tile_after(tile, walked, mWalk, bx, grid, Tq, Tk, H)
            valid, _, h, b, _, n_blocks, _ = self.work_tile(tile, Tq, Tk, H)
            if valid:
                hk = h // group
                gK = cute.local_tile(mK[None, None, hk, b], (bN, D), (None, 0))  # (bN, D, key tiles)
                gVt = cute.local_tile(mVt[None, None, hk, b], (D, bN), (0, None))  # (D, bN, key tiles)
                tKsK, tKgK = cpasync.tma_partition(tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                                   cute.group_modes(gK, 0, 2))
                tVsV, tVgV = cpasync.tma_partition(tma_v, 0, cute.make_layout(1), cute.group_modes(sVt, 0, 2),
                                                   cute.group_modes(gVt, 0, 2))
                q_state = self.load_q(tma_q, mQ, sQ, q_pipe, q_state, tile, Tq, Tk, H)
                for i in cutlass.range(n_blocks, unroll=1):
                    n = n_blocks - 1 - i
                    k_pipe.producer_acquire(k_state)  # wait until the stage is free, arm "full"
                    cute.copy(tma_k, tKgK[(None, n)], tKsK[(None, k_state.index)],
                              tma_bar_ptr=k_pipe.producer_get_barrier(k_state))
                    k_state.advance()
                    v_pipe.producer_acquire(v_state)
                    cute.copy(tma_v, tVgV[(None, n)], tVsV[(None, v_state.index)],
                              tma_bar_ptr=v_pipe.producer_get_barrier(v_state))
                    v_state.advance()
            tile = nxt

    def registers(self, mma_qk: cute.TiledMma, mma_pv: cute.TiledMma, sQ: cute.Tensor, sK: cute.Tensor,
                  sVt: cute.Tensor, tidx: Int32, wg_idx: Int32) -> SimpleNamespace:
        """A consumer warpgroup's fragments: smem descriptors of Q, K and V^T, the O accumulator, P, the
        row statistics (``_next``: the next tile's, while this tile's last P V runs) and coordinates."""
        D, bM, bN = self.D, self.tile_m, self.tile_n
        wg_qk = mma_qk.get_slice(wg_idx * self.threads_per_wg)
        wg_pv = mma_pv.get_slice(wg_idx * self.threads_per_wg)
        r = SimpleNamespace(wg_qk=wg_qk)
        r.tSrQ = wg_qk.make_fragment_A(wg_qk.partition_A(sQ))  # (MMA, MMA_M, MMA_K, Sq)
        r.tSrK = wg_qk.make_fragment_B(wg_qk.partition_B(sK))  # (MMA, MMA_N, MMA_K, S)
        r.tOrVt = wg_pv.make_fragment_B(wg_pv.partition_B(sVt))  # (MMA, MMA_N, MMA_K, S)
        r.acc_o = cute.make_rmem_tensor(wg_pv.partition_shape_C((bM, D)), Float32)  # ((2, 2, D/8), 1, 1)
        r.tOrP = wg_pv.make_fragment_A(wg_pv.partition_shape_A((bM, bN)))  # ((2, 2, 2), 1, bN/16) of dtype
        r.O = mn_view(r.acc_o)  # (2 rows, D/4 columns) of this thread
        r.cS = mn_view(mma_qk.get_slice(tidx).partition_C(cute.make_identity_tensor((bM, bN))))
        rows = cute.size(r.O, mode=[0])
        for name in ("row_max", "row_sum", "alpha", "row_max_next", "row_sum_next"):
            setattr(r, name, cute.make_rmem_tensor((rows,), Float32))
        r.cO = mn_view(mma_pv.get_slice(tidx).partition_C(cute.make_identity_tensor((bM, D))))  # (rows, cols)
        r.rO = cute.make_rmem_tensor_like(r.acc_o, self.dtype)
        return r

    def store_setup(self, r: SimpleNamespace, store: tuple, tidx: Int32, wg_idx: Int32):
        """``tma_store``: the stmatrix copy of a warpgroup's out rows (its P V accumulator layout, rounded
        to the dtype) into its smem buffer, and what the TMA store reads, in ``r``."""
        r.tma_o, r.mO_tma, mma_o, sO = store
        r.sO = sO[None, None, wg_idx]  # (64, D)
        r.o_copy = stmatrix_copy(self.dtype, mma_o, r.sO, tidx % self.threads_per_wg)

    @cute.jit
    def consume(self, mma_qk: cute.TiledMma, mma_pv: cute.TiledMma, sQ: cute.Tensor, sK: cute.Tensor,
                sVt: cute.Tensor, q_pipe, k_pipe, v_pipe, mO: cute.Tensor, mLSE: cute.Tensor, store: tuple,
                mWalk: cute.Tensor, tidx: Int32, wg_idx: Int32, bx: Int32, step: Int32, units: Int32, Tq: Int32,
                Tk: Int32, H: Int32, scale_log2: Float32):
        """A consumer warpgroup: its 64 rows of out and lse, for the tiles of CTA bx's walk (units bx,
        bx + step, ..., or its row of mWalk). ``store``: (tma_o, mO_tma, mma_o, sO) of ``tma_store``."""
        r = self.registers(mma_qk, mma_pv, sQ, sK, sVt, tidx, wg_idx)
        if cutlass.const_expr(self.tma_store):
            self.store_setup(r, store, tidx, wg_idx)
        if cutlass.const_expr(self.pingpong):
            if wg_idx == 1:  # warpgroup 0 issues first
                cute.arch.barrier_arrive(barrier_id=self.pingpong_barrier, number_of_threads=2 * self.threads_per_wg)

        pipes = (q_pipe, k_pipe, v_pipe)
        q_state, k_read, v_read = self.pipeline_states(pipeline.PipelineUserType.Consumer)
        tile, end, walked = self.first_tile(mWalk, bx), units * self.per_unit, Int32(0)  # a unit's first is valid
        if cutlass.const_expr(self.overlap):
            if tile < end:  # the first tile's first scores: the only ones with nothing beside them
                _, _, _, _, row0, n_blocks, n_masked = self.work_tile(tile, Tq, Tk, H)
                self.reset(r.row_max, r.row_sum)
                r.acc_o.fill(0.0)
                q_pipe.consumer_wait(q_state)
                k_read = self.first_scores(r, mma_qk, k_pipe, k_read, q_state, row0, n_blocks, n_masked, Tk,
                                           scale_log2)
            while tile < end:
                walked += 1
                nxt = self.tile_after(tile, walked, mWalk, bx, step, Tq, Tk, H)
                q_state, k_read, v_read = self.overlapped_tile(
                    r, mma_qk, mma_pv, pipes, q_state, k_read, v_read, mO, mLSE, tidx, wg_idx, tile, nxt < end, nxt,
                    Tq, Tk, H, scale_log2)
                tile = nxt
        else:
            while tile < end:
                valid, _, h, b, row0, n_blocks, n_masked = self.work_tile(tile, Tq, Tk, H)
                if valid:
                    q_state, k_read, v_read = self.consume_tile(
                        r, mma_qk, mma_pv, pipes, q_state, k_read, v_read, mO, mLSE, tidx, wg_idx, h, b, row0,
                        n_blocks, n_masked, Tq, Tk, scale_log2)
                walked += 1
                tile = self.tile_after(tile, walked, mWalk, bx, step, Tq, Tk, H)
        if cutlass.const_expr(self.tma_store):
            if tidx % self.threads_per_wg == 0:
                cute.arch.cp_async_bulk_wait_group(0, read=True)  # the last store has read smem: the CTA may end

    @cute.jit
    def reset(self, row_max: cute.Tensor, row_sum: cute.Tensor):
        """Row statistics before a tile's first key tile: no max yet, an empty sum."""
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)

    @cute.jit
    def first_scores(self, r, mma_qk, k_pipe, k_read, q_state, row0: Int32, n_blocks: Int32, n_masked: Int32,
                     Tk: Int32, scale_log2: Float32):
        """S = Q K^T of a tile's last key tile, alone, masked where it needs it (the Tk tail or the causal
        diagonal: key tile n_blocks - 1 >= n_masked), then its softmax into (row_max, row_sum), and P.
        Returns the advanced K state."""
        bM, bN = self.tile_m, self.tile_n
        k_pipe.consumer_wait(k_read)
        # S accumulators are fresh registers for every product (zero_init ignores their values): an
        # accumulator carried around the tile loop makes ptxas serialize every WGMMA
        acc_s = cute.make_rmem_tensor(r.wg_qk.partition_shape_C((bM, bN)), Float32)  # ((2, 2, bN/8), 1, 1)
        S = mn_view(acc_s)  # (2 rows, bN/4 columns) of this thread
        wgmma(mma_qk, acc_s, r.tSrQ[None, None, None, q_state.index], r.tSrK[None, None, None, k_read.index],
              zero_init=True)
        warpgroup.wait_group(0)
        k_pipe.consumer_release(k_read)
        k_read.advance()
        if n_blocks - 1 >= n_masked:  # the Tk tail or the causal diagonal
            _mask_scores(S, r.cS, row0, (n_blocks - 1) * bN, Tk, self.causal)
        softmax_tile(S, r.row_max, r.row_sum, r.alpha, scale_log2)
        r.tOrP.store(acc_as_operand_a(acc_s).load().to(self.dtype))
        return k_read

    @cute.jit
    def key_tiles(self, r, mma_qk, mma_pv, pipes, q_state, k_read, v_read, wg_idx: Int32, row0: Int32,
                  n_blocks: Int32, n_masked: Int32, Tk: Int32, scale_log2: Float32):
        """Key tiles n_blocks - 2 down to 0 of a tile whose last key tile's P is in registers: S of tile n
        and P V of tile n + 1 in flight together. Returns the advanced K and V states."""
        bM, bN = self.tile_m, self.tile_n
        _, k_pipe, v_pipe = pipes
        rows = cute.size(r.O, mode=[0])
        barrier_mine = self.pingpong_barrier + wg_idx
        barrier_other = self.pingpong_barrier + 1 - wg_idx
        pair = 2 * self.threads_per_wg
        for i in cutlass.range(1, n_blocks, unroll=1):
            n = n_blocks - 1 - i
            if cutlass.const_expr(self.pingpong):
                cute.arch.barrier(barrier_id=barrier_mine, number_of_threads=pair)
            k_pipe.consumer_wait(k_read)
            acc_s = cute.make_rmem_tensor(r.wg_qk.partition_shape_C((bM, bN)), Float32)
            S = mn_view(acc_s)
            wgmma(mma_qk, acc_s, r.tSrQ[None, None, None, q_state.index], r.tSrK[None, None, None, k_read.index],
                  zero_init=True)
            v_pipe.consumer_wait(v_read)
            wgmma(mma_pv, r.acc_o, r.tOrP, r.tOrVt[None, None, None, v_read.index], zero_init=False)
            if cutlass.const_expr(self.pingpong):
                cute.arch.barrier_arrive(barrier_id=barrier_other, number_of_threads=pair)
            warpgroup.wait_group(1)  # S is ready (P V may still run)
            k_pipe.consumer_release(k_read)
            k_read.advance()
            if n >= n_masked:
                _mask_scores(S, r.cS, row0, n * bN, Tk, self.causal)
            softmax_tile(S, r.row_max, r.row_sum, r.alpha, scale_log2)
            warpgroup.wait_group(0)  # P V has read P and written O
            v_pipe.consumer_release(v_read)
            v_read.advance()
            for j in cutlass.range_constexpr(rows):
                r.O[j, None].store(r.O[j, None].load() * r.alpha[j])
            r.tOrP.store(acc_as_operand_a(acc_s).load().to(self.dtype))
        return k_read, v_read

    @cute.jit
    def last_pv(self, r, mma_pv, v_pipe, v_read):
        """The first key tile's P V, alone. Returns the advanced V state."""
        v_pipe.consumer_wait(v_read)
        wgmma(mma_pv, r.acc_o, r.tOrP, r.tOrVt[None, None, None, v_read.index], zero_init=False)
        warpgroup.wait_group(0)
        v_pipe.consumer_release(v_read)
        v_read.advance()
        return v_read

    @cute.jit
    def consume_tile(self, r, mma_qk, mma_pv, pipes, q_state, k_read, v_read, mO: cute.Tensor, mLSE: cute.Tensor,
                     tidx: Int32, wg_idx: Int32, h: Int32, b: Int32, row0: Int32, n_blocks: Int32, n_masked: Int32,
                     Tq: Int32, Tk: Int32, scale_log2: Float32):
        """One work tile, its first and last products alone: 64 rows of out and lse. Returns the advanced
        pipeline states (assigned in the caller's loop, so that the DSL carries them from one tile to the
        next)."""
        q_pipe, k_pipe, v_pipe = pipes
        self.reset(r.row_max, r.row_sum)
        r.acc_o.fill(0.0)
        q_pipe.consumer_wait(q_state)
        k_read = self.first_scores(r, mma_qk, k_pipe, k_read, q_state, row0, n_blocks, n_masked, Tk, scale_log2)
        k_read, v_read = self.key_tiles(r, mma_qk, mma_pv, pipes, q_state, k_read, v_read, wg_idx, row0, n_blocks,
                                        n_masked, Tk, scale_log2)
        q_pipe.consumer_release(q_state)  # the last S = Q K^T is done: the next tile's Q may come in
        q_state.advance()
        v_read = self.last_pv(r, mma_pv, v_pipe, v_read)
        self.epilogue(r, mma_pv, mO, mLSE, tidx, wg_idx, h, b, row0, Tq, scale_log2)
        return q_state, k_read, v_read

    @cute.jit
    def overlapped_tile(self, r, mma_qk, mma_pv, pipes, q_state, k_read, v_read, mO: cute.Tensor,
                        mLSE: cute.Tensor, tidx: Int32, wg_idx: Int32, tile: Int32, has_next, nxt: Int32, Tq: Int32,
                        Tk: Int32, H: Int32, scale_log2: Float32):
        """One work tile whose first scores are already P (``overlap``): its other key tiles, then, when
        a next tile follows, that tile's first S = Q K^T issued beside this tile's last P V and its
        softmax run while the P V does; then this tile's epilogue. Returns the advanced states."""
        q_pipe, _, v_pipe = pipes
        _, _, h, b, row0, n_blocks, n_masked = self.work_tile(tile, Tq, Tk, H)
        k_read, v_read = self.key_tiles(r, mma_qk, mma_pv, pipes, q_state, k_read, v_read, wg_idx, row0, n_blocks,
                                        n_masked, Tk, scale_log2)
        q_pipe.consumer_release(q_state)  # this tile's last S = Q K^T is done
        q_state.advance()
        if has_next:
            k_read, v_read = self.boundary(r, mma_qk, mma_pv, pipes, q_state, k_read, v_read, mO, mLSE, tidx, wg_idx,
                                           h, b, row0, nxt, Tq, Tk, H, scale_log2)
        else:
            v_read = self.last_pv(r, mma_pv, v_pipe, v_read)
            self.epilogue(r, mma_pv, mO, mLSE, tidx, wg_idx, h, b, row0, Tq, scale_log2)
        return q_state, k_read, v_read

    @cute.jit
    def boundary(self, r, mma_qk, mma_pv, pipes, q_state, k_read, v_read, mO: cute.Tensor, mLSE: cute.Tensor,
                 tidx: Int32, wg_idx: Int32, h: Int32, b: Int32, row0: Int32, nxt: Int32, Tq: Int32, Tk: Int32,
                 H: Int32, scale_log2: Float32):
        """Between two tiles: the next tile's first S = Q K^T (its last key tile) beside this tile's last
        P V, the next tile's softmax while the P V runs, then this tile's epilogue; the next tile's
        statistics and P take over. Returns the advanced K and V states."""
        bM, bN = self.tile_m, self.tile_n
        q_pipe, k_pipe, v_pipe = pipes
        _, _, _, _, row0_next, n_blocks_next, n_masked_next = self.work_tile(nxt, Tq, Tk, H)
        pair = 2 * self.threads_per_wg
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier(barrier_id=self.pingpong_barrier + wg_idx, number_of_threads=pair)
        q_pipe.consumer_wait(q_state)  # the next tile's Q (the other stage)
        k_pipe.consumer_wait(k_read)
        acc_s = cute.make_rmem_tensor(r.wg_qk.partition_shape_C((bM, bN)), Float32)
        S = mn_view(acc_s)
        wgmma(mma_qk, acc_s, r.tSrQ[None, None, None, q_state.index], r.tSrK[None, None, None, k_read.index],
              zero_init=True)
        v_pipe.consumer_wait(v_read)
        wgmma(mma_pv, r.acc_o, r.tOrP, r.tOrVt[None, None, None, v_read.index], zero_init=False)
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier_arrive(barrier_id=self.pingpong_barrier + 1 - wg_idx, number_of_threads=pair)
        warpgroup.wait_group(1)  # the next tile's S is ready
        k_pipe.consumer_release(k_read)
        k_read.advance()
        self.reset(r.row_max_next, r.row_sum_next)
        if n_blocks_next - 1 >= n_masked_next:
            _mask_scores(S, r.cS, row0_next, (n_blocks_next - 1) * bN, Tk, self.causal)
        softmax_tile(S, r.row_max_next, r.row_sum_next, r.alpha, scale_log2)
        warpgroup.wait_group(0)  # this tile's last P V is done
        v_pipe.consumer_release(v_read)
        v_read.advance()
        self.epilogue(r, mma_pv, mO, mLSE, tidx, wg_idx, h, b, row0, Tq, scale_log2)
        r.row_max.store(r.row_max_next.load())
        r.row_sum.store(r.row_sum_next.load())
        r.acc_o.fill(0.0)
        r.tOrP.store(acc_as_operand_a(acc_s).load().to(self.dtype))
        return k_read, v_read

    @cute.jit
    def epilogue(self, r, mma_pv, mO: cute.Tensor, mLSE: cute.Tensor, tidx: Int32, wg_idx: Int32, h: Int32,
                 b: Int32, row0: Int32, Tq: Int32, scale_log2: Float32):
        """out = O / l rounded to the dtype, lse = (c m + log2 l) ln 2, rows past Tq skipped."""
        D, bM = self.D, self.tile_m
        rows = cute.size(r.O, mode=[0])
        lane = tidx % 32
        for j in cutlass.range_constexpr(rows):
            l = quad_sum(r.row_sum[j])
            r.O[j, None].store(r.O[j, None].load() * (1.0 / l))
            row = row0 + r.cS[j, 0][0]
            if lane % 4 == 0:  # the quad's lanes hold the same row: one writes it
                if row < Tq:
                    mLSE[row, h, b] = (r.row_max[j] * scale_log2 + cute.math.log2(l)) * LN2
        r.rO.store(r.acc_o.load().to(self.dtype))
        if cutlass.const_expr(self.tma_store):
            self.store_out(r, tidx, wg_idx, h, b, row0)
        else:  # each thread's (row, 2t..2t+1) pairs are 4 contiguous bytes: one store each
            gO = mn_view(mma_pv.get_slice(tidx).partition_C(
                cute.local_tile(mO[None, None, h, b], (bM, D), (row0 // bM, 0))))
            rO_rows = mn_view(r.rO)
            for j in cutlass.range_constexpr(rows):
                if row0 + r.cO[j, 0][0] < Tq:
                    cute.autovec_copy(rO_rows[j, None], gO[j, None])

    @cute.jit
    def store_out(self, r, tidx: Int32, wg_idx: Int32, h: Int32, b: Int32, row0: Int32):
        """``tma_store``: this warpgroup's 64 rows of out (``r.rO``) into its smem buffer (stmatrix), then
        one thread's TMA store of the 64 x D box, which runs on while the warpgroup goes on; before the
        buffer is written again, that thread waits until the previous store has read it."""
        barrier = self.epilogue_barrier + wg_idx
        leader = tidx % self.threads_per_wg == 0
        if leader:
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        cute.arch.barrier(barrier_id=barrier, number_of_threads=self.threads_per_wg)
        stmatrix_store(r.o_copy, r.rO)
        cute.arch.fence_proxy("async.shared", space="cta")  # the writes, visible to the copy engine
        cute.arch.barrier(barrier_id=barrier, number_of_threads=self.threads_per_wg)
        if leader:
            bulk_store_tile(r.tma_o, r.sO, cute.local_tile(r.mO_tma[None, None, h, b], (64, self.D),
                                                           (row0 // 64 + wg_idx, 0)))
            cute.arch.cp_async_bulk_commit_group()
