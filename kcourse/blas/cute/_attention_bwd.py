"""The cute attention backward kernels: delta, dK/dV, dQ (FlashAttention-2 on mma.sync).

Math (per batch b, query head h, kv head g = h // (H / Hkv), c = scale; docs/attention.md), with P
recomputed from the forward's lse and dO = dout:

    delta_i = sum_d dO_id out_id                       (= sum_j P_ij dP_ij)
    dV = P^T dO      dP = dO v^T      dS = P * (dP - delta)      dQ = c dS k      dK = c dS^T q

FLOPs: recomputing S twice (once per kernel) and dP twice, 14 B H Tq Tk D in all (about half with the
causal mask) against the 10 of a single fused pass: the price of no atomics. Bytes, at least, read q,
k, v, out, dO, lse, write dq, dk, dv.

Three kernels, each deterministic (no atomics; every output element is written by one thread):

- ``delta``: one CTA per 16 rows of (B H Tq, D); 8 threads per row read dO and out in 16-byte
  vectors, multiply in float32 and add with 3 butterfly shuffles.
- ``dkdv``: one CTA per (tile of ROWS keys, kv head, batch). K and V stay in shared memory; Q and
  dO stream through a two-stage cp.async ring, COLS queries at a time, for every query head of
  the kv head's group in turn (grouped-query attention: the group's sum is this loop, no atomics,
  no expanded copy of k and v). Per tile, with the scores held transposed (keys x queries, so the
  accumulators of P^T and dS^T are the A operands of the next products, as in the forward):

      S^T = K Q^T c log2 e;  causal: -inf where query < key;  P^T = exp2(S^T - lse log2 e)
      dV += P^T dO;  dP^T = V dO^T;  dS^T = P^T (dP^T - delta);  dK += dS^T Q

  and at the end dK *= c. A query row past Tq reads lse = +inf: its P is exactly 0 and it adds
  nothing. Key rows past Tk are computed and never stored.
- ``dq``: one CTA per (tile of ROWS queries, query head, batch), walking the keys like the forward
  (keys [0, n_full) unmasked, then the masked tiles): S = Q K^T, P = exp2(S c log2 e - lse log2 e)
  (masked: 0), dP = dO V^T, dS = P (dP - delta), dQ += dS K; at the end dQ *= c.

Shapes, layouts and math modes are the forward's (``_attention_fwd``: ``Tiles``, ``tile_shape``).
"""
from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from ._compile import DTYPES
from ._attention_fwd import (LOG2E, STAGES, THREADS, Tiles, coords, head_tensor, load_tile, mn_view, row_tensor,
                             store_tile, tile_shape, zero_smem, _mask_scores)
from ._reduce import copy_atom, predicate

DELTA_ROWS = 16  # rows of (B H Tq, D) per CTA of the delta kernel
DELTA_LANES = 8  # threads per row


# ----------------------------------------------------------------------------- delta = rowsum(dO * out)

def _delta_factory(dtype_t, Dp: int, vec: int):
    """delta (R,) = rowsum(dO * out) over (R, D) contiguous rows. Key: dtype, padded head dim, vector width."""
    dtype = DTYPES[dtype_t]
    width = -(-Dp // (DELTA_LANES * vec)) * DELTA_LANES * vec  # a tile row covers D, in whole passes

    @cute.kernel
    def kernel(mO: cute.Tensor, mdO: cute.Tensor, mDelta: cute.Tensor):
        # mO, mdO (R, D); mDelta (R,) float32
        tidx, _, _ = cute.arch.thread_idx()
        bx, _, _ = cute.arch.block_idx()
        R, D = mO.shape
        threads = cute.make_layout((DELTA_ROWS, DELTA_LANES), stride=(DELTA_LANES, 1))
        tiled = cute.make_tiled_copy_tv(copy_atom(dtype, vec), threads, cute.make_layout((1, vec)))
        thr = tiled.get_slice(tidx)
        tile = (DELTA_ROWS, width)
        tOg = thr.partition_S(cute.local_tile(mO, tile, (bx, 0)))  # (CPY, 1, passes)
        tdOg = thr.partition_S(cute.local_tile(mdO, tile, (bx, 0)))
        pred = predicate(thr.partition_S(cute.local_tile(cute.make_identity_tensor((R, D)), tile, (bx, 0))), (R, D))
        o = cute.make_rmem_tensor_like(tOg)
        do = cute.make_rmem_tensor_like(tdOg)
        o.fill(0)
        do.fill(0)
        cute.copy(tiled, tOg, o, pred=pred)
        cute.copy(tiled, tdOg, do, pred=pred)
        acc = (o.load().to(Float32) * do.load().to(Float32)).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        for offset in cutlass.range_constexpr(3):  # the row's 8 lanes: offsets 4, 2, 1
            acc = acc + cute.arch.shuffle_sync_bfly(acc, offset=DELTA_LANES >> (offset + 1))
        row = bx * DELTA_ROWS + tidx // DELTA_LANES
        if tidx % DELTA_LANES == 0:
            if row < R:
                mDelta[row] = acc

    @cute.jit
    def host(po: cute.Pointer, pdo: cute.Pointer, pdelta: cute.Pointer, R: Int32, D: Int32, stream_: cuda.CUstream):
        # contiguous (R, D) rows: the row stride D is a multiple of vec (the host checked); 64-bit offsets
        layout = cute.make_layout((R, D), stride=(cute.assume(Int64(D), divby=vec), 1))
        mO, mdO = cute.make_tensor(po, layout), cute.make_tensor(pdo, layout)
        mDelta = cute.make_tensor(pdelta, cute.make_layout((R,)))
        kernel(mO, mdO, mDelta).launch(grid=[cute.ceil_div(R, DELTA_ROWS), 1, 1],
                                       block=[DELTA_ROWS * DELTA_LANES, 1, 1], stream=stream_)

    return host


# ----------------------------------------------------------------------------- dK, dV

@cute.jit
def _mask_causal_transposed(S, cS, key0, query0):
    """S^T (keys x queries view) = -inf where the query comes before the key."""
    for r in cutlass.range_constexpr(cute.size(S, mode=[0])):
        key = key0 + cS[r, 0][0]
        for c in cutlass.range_constexpr(cute.size(S, mode=[1])):
            if query0 + cS[0, c][1] < key:
                S[r, c] = -Float32.inf


@cute.jit
def _load_columns(lse, delta, mLSE, mDelta, cS, query0, Tq, h, b):
    """lse (log2 units) and delta of this thread's query columns; +inf and 0 past Tq."""
    for c in cutlass.range_constexpr(cute.size(lse)):
        query = query0 + cS[0, c][1]
        lse[c] = Float32.inf
        delta[c] = 0.0
        if query < Tq:
            lse[c] = mLSE[query, h, b] * LOG2E
            delta[c] = mDelta[query, h, b]


@cute.jit
def _probs_transposed(S, lse):
    """P^T = exp2(S^T - lse of the column)."""
    for r in cutlass.range_constexpr(cute.size(S, mode=[0])):
        for c in cutlass.range_constexpr(cute.size(S, mode=[1])):
            S[r, c] = cute.math.exp2(S[r, c] - lse[c], fastmath=True)


@cute.jit
def _ds_transposed(P, dP, delta):
    """dS^T = P^T (dP^T - delta of the column), written over P^T."""
    for r in cutlass.range_constexpr(cute.size(P, mode=[0])):
        for c in cutlass.range_constexpr(cute.size(P, mode=[1])):
            P[r, c] = P[r, c] * (dP[r, c] - delta[c])


def _dkdv_factory(dtype_t, math_mode: str, Dp: int, causal: bool, vec: int):
    """The dK, dV host function. Key: dtype, math mode, padded head dim, causal, gmem vector width."""
    dtype = DTYPES[dtype_t]
    ROWS, COLS = tile_shape("dkdv", math_mode, Dp)

    @cute.kernel
    def kernel(mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
               mDelta: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor, group: Int32, scale_log2: Float32,
               scale: Float32):
        # mQ, mdO (Tq, D, H, B); mK, mV, mdK, mdV (Tk, D, Hkv, B); mLSE, mDelta (Tq, H, B) float32
        t = Tiles.make(dtype, math_mode, Dp, ROWS, COLS, vec)
        tidx, _, _ = cute.arch.thread_idx()
        n_block, hk, b = cute.arch.block_idx()
        Tq, D = mQ.shape[0], mQ.shape[1]
        Tk = mK.shape[0]
        key0 = n_block * ROWS

        # ---- the resident key tile, the streamed query tiles
        gK = cute.local_tile(mK[None, None, hk, b], (ROWS, Dp), (n_block, 0))  # (ROWS, Dp)
        gV = cute.local_tile(mV[None, None, hk, b], (ROWS, Dp), (n_block, 0))
        cK = cute.local_tile(cute.make_identity_tensor((Tk, D)), (ROWS, Dp), (n_block, 0))
        cQ = cute.local_tile(cute.make_identity_tensor((Tq, D)), (COLS, Dp), (None, 0))  # (COLS, Dp, tiles)

        sK = t.smem_tile(ROWS, 1)
        sV = t.smem_tile(ROWS, 1)
        sQ = t.smem_tile(COLS, STAGES)
        sdO = t.smem_tile(COLS, STAGES)
        g2s = t.g2s()
        thr_g2s = g2s.get_slice(tidx)
        zero_smem(thr_g2s, sK)
        zero_smem(thr_g2s, sV)
        zero_smem(thr_g2s, sQ)
        zero_smem(thr_g2s, sdO)
        cute.arch.sync_threads()

        # ---- MMA operands: S^T = K Q^T, dP^T = V dO^T (smem x smem); dV += P^T dO, dK += dS^T Q (registers x smem)
        op_k = t.operand_a(tidx, sK, ROWS)
        op_v = t.operand_a(tidx, sV, ROWS)
        op_q = t.operand_b(tidx, sQ, COLS, Dp, transpose=False)
        op_do = t.operand_b(tidx, sdO, COLS, Dp, transpose=False)
        op_qt = t.operand_b(tidx, t.transposed(sQ), Dp, COLS, transpose=True)
        op_dot = t.operand_b(tidx, t.transposed(sdO), Dp, COLS, transpose=True)
        acc_dk = t.acc(ROWS, Dp)
        acc_dv = t.acc(ROWS, Dp)
        cS = coords(t, tidx, ROWS, COLS)
        lse = cute.make_rmem_tensor((cute.size(cS, mode=[1]),), Float32)
        delta = cute.make_rmem_tensor((cute.size(cS, mode=[1]),), Float32)

        # ---- the query tiles: causal, tiles before m_lo see none of these keys, tiles from m_mask on
        # see all of them; the loop runs over (query head of the group, query tile) pairs
        m_lo = 0
        m_mask = 0
        if cutlass.const_expr(causal):
            m_lo = key0 // COLS
            m_mask = cute.ceil_div(key0 + ROWS, COLS)
        n_m = cutlass.max(cute.ceil_div(Tq, COLS) - m_lo, 0)
        total = group * n_m

        load_tile(g2s, thr_g2s, gK, cK, sK, 0, (Tk, D))
        load_tile(g2s, thr_g2s, gV, cK, sV, 0, (Tk, D))
        if total > 0:
            h = hk * group
            load_tile(g2s, thr_g2s, cute.local_tile(mQ[None, None, h, b], (COLS, Dp), (m_lo, 0)),
                      cQ[None, None, m_lo], sQ, 0, (Tq, D))
            load_tile(g2s, thr_g2s, cute.local_tile(mdO[None, None, h, b], (COLS, Dp), (m_lo, 0)),
                      cQ[None, None, m_lo], sdO, 0, (Tq, D))
        cute.arch.cp_async_commit_group()
        for it in cutlass.range(total, unroll=1):
            stage = it % STAGES
            if it + 1 < total:  # the next (head, tile) flies while this one is multiplied
                h_next = hk * group + (it + 1) // n_m
                m_next = m_lo + (it + 1) % n_m
                load_tile(g2s, thr_g2s, cute.local_tile(mQ[None, None, h_next, b], (COLS, Dp), (m_next, 0)),
                          cQ[None, None, m_next], sQ, 1 - stage, (Tq, D))
                load_tile(g2s, thr_g2s, cute.local_tile(mdO[None, None, h_next, b], (COLS, Dp), (m_next, 0)),
                          cQ[None, None, m_next], sdO, 1 - stage, (Tq, D))
            cute.arch.cp_async_commit_group()
            h = hk * group + it // n_m
            m = m_lo + it % n_m
            query0 = m * COLS
            _load_columns(lse, delta, mLSE, mDelta, cS, query0, Tq, h, b)
            cute.arch.cp_async_wait_group(1)
            cute.arch.sync_threads()

            acc_s = t.acc(ROWS, COLS)
            t.gemm_ss(acc_s, op_k, op_q, 0, stage)  # S^T (ROWS, COLS)
            S = mn_view(acc_s)
            S.store(S.load() * scale_log2)
            if cutlass.const_expr(causal):
                if m < m_mask:
                    _mask_causal_transposed(S, cS, key0, query0)
            _probs_transposed(S, lse)
            t.gemm_rs(acc_dv, acc_s, op_dot, stage)  # dV += P^T dO
            acc_dp = t.acc(ROWS, COLS)
            t.gemm_ss(acc_dp, op_v, op_do, 0, stage)  # dP^T (ROWS, COLS)
            _ds_transposed(S, mn_view(acc_dp), delta)
            t.gemm_rs(acc_dk, acc_s, op_qt, stage)  # dK += dS^T Q
            cute.arch.sync_threads()  # every warp is done with this stage before it is refilled

        acc_dk.store(acc_dk.load() * scale)
        store_tile(t, tidx, acc_dk, sK[None, None, 0],
                   cute.local_tile(mdK[None, None, hk, b], (ROWS, Dp), (n_block, 0)), cK, (Tk, D))
        store_tile(t, tidx, acc_dv, sV[None, None, 0],
                   cute.local_tile(mdV[None, None, hk, b], (ROWS, Dp), (n_block, 0)), cK, (Tk, D))

    @cute.jit
    def host(pq: cute.Pointer, pk: cute.Pointer, pv: cute.Pointer, pdo: cute.Pointer, plse: cute.Pointer,
             pdelta: cute.Pointer, pdk: cute.Pointer, pdv: cute.Pointer,
             B: Int32, H: Int32, Hkv: Int32, Tq: Int32, Tk: Int32, D: Int32,
             sq_b: Int64, sq_h: Int64, sq_t: Int64, sk_b: Int64, sk_h: Int64, sk_t: Int64,
             sv_b: Int64, sv_h: Int64, sv_t: Int64, sdo_b: Int64, sdo_h: Int64, sdo_t: Int64,
             scale_log2: Float32, scale: Float32, stream_: cuda.CUstream):
        mQ = head_tensor(pq, Tq, D, H, B, sq_t, sq_h, sq_b, vec)
        mK = head_tensor(pk, Tk, D, Hkv, B, sk_t, sk_h, sk_b, vec)
        mV = head_tensor(pv, Tk, D, Hkv, B, sv_t, sv_h, sv_b, vec)
        mdO = head_tensor(pdo, Tq, D, H, B, sdo_t, sdo_h, sdo_b, vec)
        # dk, dv: contiguous (B, Hkv, Tk, D)
        mdK = head_tensor(pdk, Tk, D, Hkv, B, Int64(D), Int64(Tk) * D, Int64(Tk) * D * Hkv, vec)
        mdV = head_tensor(pdv, Tk, D, Hkv, B, Int64(D), Int64(Tk) * D, Int64(Tk) * D * Hkv, vec)
        kernel(mQ, mK, mV, mdO, row_tensor(plse, Tq, H, B), row_tensor(pdelta, Tq, H, B), mdK, mdV,
               H // Hkv, scale_log2, scale).launch(
            grid=[cute.ceil_div(Tk, ROWS), Hkv, B], block=[THREADS, 1, 1], stream=stream_)

    return host


# ----------------------------------------------------------------------------- dQ

@cute.jit
def _load_rows(lse, delta, mLSE, mDelta, cS, row0, Tq, h, b):
    """lse (log2 units) and delta of this thread's query rows; 0 past Tq (those rows are dropped)."""
    for r in cutlass.range_constexpr(cute.size(lse)):
        row = row0 + cS[r, 0][0]
        lse[r] = 0.0
        delta[r] = 0.0
        if row < Tq:
            lse[r] = mLSE[row, h, b] * LOG2E
            delta[r] = mDelta[row, h, b]


@cute.jit
def _probs_and_ds(S, dP, lse, delta):
    """P = exp2(S - lse of the row), then dS = P (dP - delta of the row), written over S."""
    for r in cutlass.range_constexpr(cute.size(S, mode=[0])):
        p = cute.math.exp2(S[r, None].load() - lse[r], fastmath=True)
        S[r, None].store(p * (dP[r, None].load() - delta[r]))


def _dq_factory(dtype_t, math_mode: str, Dp: int, causal: bool, vec: int):
    """The dQ host function. Key: dtype, math mode, padded head dim, causal, gmem vector width."""
    dtype = DTYPES[dtype_t]
    ROWS, COLS = tile_shape("dq", math_mode, Dp)

    @cute.kernel
    def kernel(mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
               mDelta: cute.Tensor, mdQ: cute.Tensor, group: Int32, scale_log2: Float32, scale: Float32):
        # mQ, mdO, mdQ (Tq, D, H, B); mK, mV (Tk, D, Hkv, B); mLSE, mDelta (Tq, H, B) float32
        t = Tiles.make(dtype, math_mode, Dp, ROWS, COLS, vec)
        tidx, _, _ = cute.arch.thread_idx()
        bx, h, b = cute.arch.block_idx()
        Tq, D = mQ.shape[0], mQ.shape[1]
        Tk = mK.shape[0]
        m_block = cute.ceil_div(Tq, ROWS) - 1 - bx  # the longest causal rows first
        row0 = m_block * ROWS
        hk = h // group

        gQ = cute.local_tile(mQ[None, None, h, b], (ROWS, Dp), (m_block, 0))  # (ROWS, Dp)
        gdO = cute.local_tile(mdO[None, None, h, b], (ROWS, Dp), (m_block, 0))
        cQ = cute.local_tile(cute.make_identity_tensor((Tq, D)), (ROWS, Dp), (m_block, 0))
        gK = cute.local_tile(mK[None, None, hk, b], (COLS, Dp), (None, 0))  # (COLS, Dp, key tiles)
        gV = cute.local_tile(mV[None, None, hk, b], (COLS, Dp), (None, 0))
        cK = cute.local_tile(cute.make_identity_tensor((Tk, D)), (COLS, Dp), (None, 0))

        sQ = t.smem_tile(ROWS, 1)
        sdO = t.smem_tile(ROWS, 1)
        sK = t.smem_tile(COLS, STAGES)
        sV = t.smem_tile(COLS, STAGES)
        g2s = t.g2s()
        thr_g2s = g2s.get_slice(tidx)
        zero_smem(thr_g2s, sQ)
        zero_smem(thr_g2s, sdO)
        zero_smem(thr_g2s, sK)
        zero_smem(thr_g2s, sV)
        cute.arch.sync_threads()

        # ---- MMA operands: S = Q K^T, dP = dO V^T (smem x smem); dQ += dS K (registers x smem)
        op_q = t.operand_a(tidx, sQ, ROWS)
        op_do = t.operand_a(tidx, sdO, ROWS)
        op_k = t.operand_b(tidx, sK, COLS, Dp, transpose=False)
        op_v = t.operand_b(tidx, sV, COLS, Dp, transpose=False)
        op_kt = t.operand_b(tidx, t.transposed(sK), Dp, COLS, transpose=True)
        acc_dq = t.acc(ROWS, Dp)
        cS = coords(t, tidx, ROWS, COLS)
        lse = cute.make_rmem_tensor((cute.size(cS, mode=[0]),), Float32)
        delta = cute.make_rmem_tensor((cute.size(cS, mode=[0]),), Float32)
        _load_rows(lse, delta, mLSE, mDelta, cS, row0, Tq, h, b)

        n_end = cute.ceil_div(Tk, COLS)
        n_full = Tk // COLS
        if cutlass.const_expr(causal):
            n_end = cute.ceil_div(cutlass.min(row0 + ROWS, Tk), COLS)
            n_full = cutlass.min(row0, Tk) // COLS

        load_tile(g2s, thr_g2s, gQ, cQ, sQ, 0, (Tq, D))
        load_tile(g2s, thr_g2s, gdO, cQ, sdO, 0, (Tq, D))
        load_tile(g2s, thr_g2s, gK[None, None, 0], cK[None, None, 0], sK, 0, (Tk, D))
        load_tile(g2s, thr_g2s, gV[None, None, 0], cK[None, None, 0], sV, 0, (Tk, D))
        cute.arch.cp_async_commit_group()
        for n in cutlass.range(n_end, unroll=1):
            stage = n % STAGES
            if n + 1 < n_end:
                load_tile(g2s, thr_g2s, gK[None, None, n + 1], cK[None, None, n + 1], sK, 1 - stage, (Tk, D))
                load_tile(g2s, thr_g2s, gV[None, None, n + 1], cK[None, None, n + 1], sV, 1 - stage, (Tk, D))
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(1)
            cute.arch.sync_threads()
            acc_s = t.acc(ROWS, COLS)
            t.gemm_ss(acc_s, op_q, op_k, 0, stage)  # S (ROWS, COLS)
            S = mn_view(acc_s)
            S.store(S.load() * scale_log2)
            if n >= n_full:
                _mask_scores(S, cS, row0, n * COLS, Tk, causal)  # exp2(-inf - lse) = 0
            acc_dp = t.acc(ROWS, COLS)
            t.gemm_ss(acc_dp, op_do, op_v, 0, stage)  # dP (ROWS, COLS)
            _probs_and_ds(S, mn_view(acc_dp), lse, delta)
            t.gemm_rs(acc_dq, acc_s, op_kt, stage)  # dQ += dS K
            cute.arch.sync_threads()

        acc_dq.store(acc_dq.load() * scale)
        store_tile(t, tidx, acc_dq, sQ[None, None, 0],
                   cute.local_tile(mdQ[None, None, h, b], (ROWS, Dp), (m_block, 0)), cQ, (Tq, D))

    @cute.jit
    def host(pq: cute.Pointer, pk: cute.Pointer, pv: cute.Pointer, pdo: cute.Pointer, plse: cute.Pointer,
             pdelta: cute.Pointer, pdq: cute.Pointer,
             B: Int32, H: Int32, Hkv: Int32, Tq: Int32, Tk: Int32, D: Int32,
             sq_b: Int64, sq_h: Int64, sq_t: Int64, sk_b: Int64, sk_h: Int64, sk_t: Int64,
             sv_b: Int64, sv_h: Int64, sv_t: Int64, sdo_b: Int64, sdo_h: Int64, sdo_t: Int64,
             scale_log2: Float32, scale: Float32, stream_: cuda.CUstream):
        mQ = head_tensor(pq, Tq, D, H, B, sq_t, sq_h, sq_b, vec)
        mK = head_tensor(pk, Tk, D, Hkv, B, sk_t, sk_h, sk_b, vec)
        mV = head_tensor(pv, Tk, D, Hkv, B, sv_t, sv_h, sv_b, vec)
        mdO = head_tensor(pdo, Tq, D, H, B, sdo_t, sdo_h, sdo_b, vec)
        # dq: contiguous (B, H, Tq, D)
        mdQ = head_tensor(pdq, Tq, D, H, B, Int64(D), Int64(Tq) * D, Int64(Tq) * D * H, vec)
        kernel(mQ, mK, mV, mdO, row_tensor(plse, Tq, H, B), row_tensor(pdelta, Tq, H, B), mdQ,
               H // Hkv, scale_log2, scale).launch(
            grid=[cute.ceil_div(Tq, ROWS), H, B], block=[THREADS, 1, 1], stream=stream_)

    return host
