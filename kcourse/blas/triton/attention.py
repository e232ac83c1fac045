"""attention: fused flash attention (FlashAttention-2), forward and backward, in Triton.

Per (batch, query head h), with q (Tq, D), the kv head's k and v (Tk, D), c = scale and the causal
mask (query i sees keys j <= i, top-left aligned):

    S = c q k^T  (Tq, Tk)     P = softmax_rows(S)     out = P v  (Tq, D)     lse_i = log sum_j exp S_ij

Backward, with dO = dout and delta_i = sum_d dO_id out_id (= sum_j P_ij dP_ij):

    dV = P^T dO     dP = dO v^T     dS = P * (dP - delta)     dQ = c dS k     dK = c dS^T q

S and P never reach device memory. The forward walks the keys BLOCK_N at a time for a BLOCK_M tile
of queries, keeping a running row max m and row sum l (online softmax: when the max grows, the
accumulator and l are rescaled by exp(m_old - m_new)), and divides by l once at the end. The cache
is (q, k, v, out, lse) with lse the float32 log-sum-exp of each query row (B, H, Tq): the backward
recomputes P_ij = exp(S_ij - lse_i) tile by tile. The backward is three kernels:
  - delta: delta_i = rowsum(dO * out), float32 (B, H, Tq);
  - dK, dV: one program per BLOCK_N keys of a kv head, which walks the query tiles of every query
    head of its group (grouped-query attention: the sum over the group is a loop in one program,
    deterministic, no atomics and no expanded copy of k, v);
  - dQ: one program per BLOCK_M queries, which walks the keys like the forward.
Details worth reading the kernels for:
  - exponentials are exp2 with the scale folded in (c log2 e), as the hardware has exp2;
  - causal: tiles that are fully masked are skipped (the loops stop at the diagonal), tiles wholly
    below it run without a mask (MASK=False), only the tiles that straddle it or the key tail pay
    for the mask; the forward runs the longest rows first (reversed program order);
  - the head dim is padded to a power of two (>= 16) with masked, zero-filled loads; tails of the
    sequence are masked loads too. In the dK, dV kernel a padded query row loads lse = +inf, so its
    P is exactly 0 and it adds nothing; padded key rows of that kernel are computed and dropped;
  - every operand is addressed through its own strides (views read in place), offsets in int64;
  - P and dS are rounded to the input dtype before their tl.dot (tensor cores), accumulation is
    float32; float32 inputs use exact float32 products (input_precision "ieee") unless
    torch.backends.cuda.matmul.allow_tf32 is on ("tf32"), as gemm. Triton's CPU interpreter
    multiplies bfloat16/float16 tiles wrongly, so there (UPCAST) every tile is float32.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._launch import INTERPRET

LOG2E = tl.constexpr(math.log2(math.e))  # exp(x) = exp2(x log2 e)
MAX_HEAD_DIM = 128


def _configs(sizes):
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in sizes]


# (BLOCK_M, BLOCK_N, num_warps, num_stages); the interpreter gets one small config with several
# tiles per row of a test-sized problem. On an H100, configs that do not fit are skipped by the
# autotuner (float32 with D = 128 needs the smaller tiles).
if INTERPRET:
    FWD_CONFIGS = DQ_CONFIGS = _configs([(32, 16, 4, 1)])
    DKDV_CONFIGS = _configs([(16, 32, 4, 1)])
else:
    FWD_CONFIGS = _configs([(128, 64, 8, 3), (128, 64, 4, 3), (128, 32, 4, 3), (64, 64, 4, 3), (64, 32, 4, 2)])
    DKDV_CONFIGS = _configs([(32, 128, 8, 3), (32, 128, 4, 3), (64, 64, 4, 3), (32, 64, 4, 2), (16, 32, 4, 2)])
    DQ_CONFIGS = _configs([(128, 64, 8, 3), (128, 32, 8, 3), (64, 64, 4, 3), (64, 32, 4, 2)])


def tiles_that_fit(configs, args, **kwargs):
    """Skip tiles far longer than the sequences (a 7-token test compiles only the small ones), and
    for float32 inputs every tile above 64 x 32: float32 tiles of that size already fill the
    registers, larger ones spill and take minutes each to compile and autotune."""
    M, N = max(32, triton.next_power_of_2(args["Tq"])), max(32, triton.next_power_of_2(args["Tk"]))
    if args["Q"].dtype == torch.float32:
        configs = [c for c in configs if c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 64 * 32]
    fit = [c for c in configs if c.kwargs["BLOCK_M"] <= M and c.kwargs["BLOCK_N"] <= N]
    return fit or configs[-1:]


def _autotune(configs):
    return triton.autotune(configs=configs, key=["Tq", "Tk", "HEAD_DIM", "CAUSAL", "PRECISION"],
                           prune_configs_by={"early_config_prune": tiles_that_fit})


@triton.jit
def _load_rows(ptr, rows, n_rows, stride_t, stride_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               UPCAST: tl.constexpr):
    """The (len(rows), BLOCK_D) tile of a (n_rows, HEAD_DIM) matrix, zero outside it."""
    dims = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < n_rows) & (dims[None, :] < HEAD_DIM)
    tile = tl.load(ptr + rows[:, None].to(tl.int64) * stride_t + dims[None, :] * stride_d, mask=mask, other=0.0)
    if UPCAST:
        tile = tile.to(tl.float32)
    return tile


@triton.jit
def _store_rows(ptr, tile, rows, n_rows, stride_t, stride_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    dims = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < n_rows) & (dims[None, :] < HEAD_DIM)
    tl.store(ptr + rows[:, None].to(tl.int64) * stride_t + dims[None, :] * stride_d,
             tile.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _visible(rows, cols, Tk, CAUSAL: tl.constexpr):
    """(len(rows), len(cols)): may query ``rows[i]`` see key ``cols[j]``?"""
    keep = cols[None, :] < Tk
    if CAUSAL:
        keep = keep & (rows[:, None] >= cols[None, :])
    return keep


@triton.jit
def _key_ranges(start_m, Tk, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """For the query tile [start_m, start_m + BLOCK_M): keys [0, full) need no mask, [full, end) do."""
    if CAUSAL:  # keys j < start_m are seen by every row of the tile; keys j >= start_m + BLOCK_M by none
        full = tl.minimum(start_m, Tk) // BLOCK_N * BLOCK_N
        end = tl.minimum(start_m + BLOCK_M, Tk)
    else:
        full = Tk // BLOCK_N * BLOCK_N
        end = Tk
    return full, end


# ----------------------------------------------------------------------------- forward

@triton.jit
def _fwd_tiles(acc, l_i, m_i, q, K, V, stride_kt, stride_kd, stride_vt, stride_vd, rows, Tk, qk_scale, lo, hi,
               PRECISION: tl.constexpr, UPCAST: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr):
    # acc: (BLOCK_M, BLOCK_D); l_i, m_i: (BLOCK_M,) in log2 units; q: (BLOCK_M, BLOCK_D)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = _load_rows(K, cols, Tk, stride_kt, stride_kd, HEAD_DIM, BLOCK_D, UPCAST)  # (BLOCK_N, BLOCK_D)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N)
        if MASK:
            s = tl.where(_visible(rows, cols, Tk, CAUSAL), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every row sees key 0 in its first tile
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)  # rescales what was summed under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_rows(V, cols, Tk, stride_vt, stride_vd, HEAD_DIM, BLOCK_D, UPCAST)  # (BLOCK_N, BLOCK_D)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@_autotune(FWD_CONFIGS)
@triton.jit
def attention_fwd_kernel(Q, K, V, O, LSE, sqb, sqh, sqt, sqd, skb, skh, skt, skd, svb, svh, svt, svd,
                         sob, soh, sot, sod, GROUP, Tq, Tk, qk_scale,
                         CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                         PRECISION: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # q, o: (B, H, Tq, HEAD_DIM); k, v: (B, H / GROUP, Tk, HEAD_DIM); lse: (B, H, Tq) float32, contiguous
    start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M  # the longest causal rows first
    h, b = tl.program_id(1), tl.program_id(2).to(tl.int64)
    hk = (h // GROUP).to(tl.int64)  # the kv head of query head h
    H = tl.num_programs(1)
    Q += b * sqb + h.to(tl.int64) * sqh
    K += b * skb + hk * skh
    V += b * svb + hk * svh
    rows = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query indices
    q = _load_rows(Q, rows, Tq, sqt, sqd, HEAD_DIM, BLOCK_D, UPCAST)  # (BLOCK_M, BLOCK_D)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    full, end = _key_ranges(start_m, Tk, CAUSAL, BLOCK_M, BLOCK_N)
    acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, K, V, skt, skd, svt, svd, rows, Tk, qk_scale, 0, full,
                               PRECISION, UPCAST, HEAD_DIM, BLOCK_D, BLOCK_N, False, CAUSAL)
    acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, K, V, skt, skd, svt, svd, rows, Tk, qk_scale, full, end,
                               PRECISION, UPCAST, HEAD_DIM, BLOCK_D, BLOCK_N, True, CAUSAL)

    O += b * sob + h.to(tl.int64) * soh
    _store_rows(O, acc / l_i[:, None], rows, Tq, sot, sod, HEAD_DIM, BLOCK_D)
    lse = (m_i + tl.math.log2(l_i)) / LOG2E  # natural log
    tl.store(LSE + (b * H + h) * Tq + rows, lse, mask=rows < Tq)


# ----------------------------------------------------------------------------- backward

@triton.jit
def attention_delta_kernel(O, DO, DELTA, sob, soh, sot, sod, Tq,
                           HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    # o, do: (B, H, Tq, HEAD_DIM), do contiguous; delta: (B, H, Tq) float32, contiguous
    h, b = tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    H = tl.num_programs(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    o = _load_rows(O + b * sob + h * soh, rows, Tq, sot, sod, HEAD_DIM, BLOCK_D, True)
    do = _load_rows(DO + (b * H + h) * Tq * HEAD_DIM, rows, Tq, HEAD_DIM, 1, HEAD_DIM, BLOCK_D, True)
    tl.store(DELTA + (b * H + h) * Tq + rows, tl.sum(o * do, 1), mask=rows < Tq)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qt, stride_qd, cols, Tq, qk_scale, lo, hi,
                PRECISION: tl.constexpr, UPCAST: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_M: tl.constexpr, MASK: tl.constexpr):
    # dk, dv, k, v: (BLOCK_N, BLOCK_D); cols: (BLOCK_N,) key indices; S, P, dP, dS are held transposed
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        q = _load_rows(Q, rows, Tq, stride_qt, stride_qd, HEAD_DIM, BLOCK_D, UPCAST)  # (BLOCK_M, BLOCK_D)
        do = _load_rows(DO, rows, Tq, HEAD_DIM, 1, HEAD_DIM, BLOCK_D, UPCAST)  # (BLOCK_M, BLOCK_D)
        lse = tl.load(LSE + rows, mask=rows < Tq, other=float("inf"))  # padded rows: P = 0
        delta = tl.load(DELTA + rows, mask=rows < Tq, other=0.0)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale  # (BLOCK_N, BLOCK_M): S^T, log2 units
        p_t = tl.math.exp2(s_t - lse[None, :] * LOG2E)
        if MASK:  # causal: key j is seen by queries i >= j
            p_t = tl.where(rows[None, :] >= cols[:, None], p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)  # P^T dO
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M): (dO v^T)^T
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=PRECISION)  # dS^T q
    return dk, dv


@_autotune(DKDV_CONFIGS)
@triton.jit
def attention_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, sqb, sqh, sqt, sqd, skb, skh, skt, skd,
                          svb, svh, svt, svd, GROUP, Tq, Tk, qk_scale, sm_scale,
                          CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                          PRECISION: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # q, do: (B, H, Tq, HEAD_DIM), do contiguous; k, v: (B, Hkv, Tk, HEAD_DIM) with H = GROUP Hkv;
    # lse, delta: (B, H, Tq) float32; dk, dv: (B, Hkv, Tk, HEAD_DIM) contiguous
    start_n = tl.program_id(0) * BLOCK_N
    hk, b = tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    Hkv = tl.num_programs(1)
    cols = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key indices
    k = _load_rows(K + b * skb + hk * skh, cols, Tk, skt, skd, HEAD_DIM, BLOCK_D, UPCAST)  # (BLOCK_N, BLOCK_D)
    v = _load_rows(V + b * svb + hk * svh, cols, Tk, svt, svd, HEAD_DIM, BLOCK_D, UPCAST)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    if CAUSAL:  # query tiles before [lo, mid) see none of these keys, tiles after see all of them
        lo = start_n // BLOCK_M * BLOCK_M
        mid = tl.minimum(tl.cdiv(start_n + BLOCK_N, BLOCK_M) * BLOCK_M, Tq)
    else:
        lo = 0
        mid = 0
    for g in range(GROUP):  # the query heads that read this kv head
        h = hk * GROUP + g
        q_ptr = Q + b * sqb + h * sqh
        do_ptr = DO + (b * Hkv * GROUP + h) * Tq * HEAD_DIM
        lse_ptr = LSE + (b * Hkv * GROUP + h) * Tq
        delta_ptr = DELTA + (b * Hkv * GROUP + h) * Tq
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, sqt, sqd, cols, Tq, qk_scale,
                             lo, mid, PRECISION, UPCAST, HEAD_DIM, BLOCK_D, BLOCK_M, True)
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, sqt, sqd, cols, Tq, qk_scale,
                             mid, Tq, PRECISION, UPCAST, HEAD_DIM, BLOCK_D, BLOCK_M, False)
    out = (b * Hkv + hk) * Tk * HEAD_DIM
    _store_rows(DK + out, dk * sm_scale, cols, Tk, HEAD_DIM, 1, HEAD_DIM, BLOCK_D)
    _store_rows(DV + out, dv, cols, Tk, HEAD_DIM, 1, HEAD_DIM, BLOCK_D)


@triton.jit
def _dq_tiles(dq, q, do, lse, delta, K, V, stride_kt, stride_kd, stride_vt, stride_vd, rows, Tk, qk_scale, lo, hi,
              PRECISION: tl.constexpr, UPCAST: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr):
    # dq, q, do: (BLOCK_M, BLOCK_D); lse (log2 units), delta: (BLOCK_M,)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = _load_rows(K, cols, Tk, stride_kt, stride_kd, HEAD_DIM, BLOCK_D, UPCAST)  # (BLOCK_N, BLOCK_D)
        v = _load_rows(V, cols, Tk, stride_vt, stride_vd, HEAD_DIM, BLOCK_D, UPCAST)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N)
        p = tl.math.exp2(s - lse[:, None])
        if MASK:
            p = tl.where(_visible(rows, cols, Tk, CAUSAL), p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    return dq


@_autotune(DQ_CONFIGS)
@triton.jit
def attention_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, sqb, sqh, sqt, sqd, skb, skh, skt, skd,
                        svb, svh, svt, svd, GROUP, Tq, Tk, qk_scale, sm_scale,
                        CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                        PRECISION: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # q: (B, H, Tq, HEAD_DIM); k, v: (B, H / GROUP, Tk, HEAD_DIM); do, dq: (B, H, Tq, HEAD_DIM)
    # contiguous; lse, delta: (B, H, Tq) float32
    start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    h, b = tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    hk = h // GROUP
    row0 = (b * tl.num_programs(1) + h) * Tq  # this head's first row in do, dq, lse, delta
    rows = start_m + tl.arange(0, BLOCK_M)
    q = _load_rows(Q + b * sqb + h * sqh, rows, Tq, sqt, sqd, HEAD_DIM, BLOCK_D, UPCAST)
    do = _load_rows(DO + row0 * HEAD_DIM, rows, Tq, HEAD_DIM, 1, HEAD_DIM, BLOCK_D, UPCAST)
    lse = tl.load(LSE + row0 + rows, mask=rows < Tq, other=0.0) * LOG2E
    delta = tl.load(DELTA + row0 + rows, mask=rows < Tq, other=0.0)
    K += b * skb + hk * skh
    V += b * svb + hk * svh

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    full, end = _key_ranges(start_m, Tk, CAUSAL, BLOCK_M, BLOCK_N)
    dq = _dq_tiles(dq, q, do, lse, delta, K, V, skt, skd, svt, svd, rows, Tk, qk_scale, 0, full,
                   PRECISION, UPCAST, HEAD_DIM, BLOCK_D, BLOCK_N, False, CAUSAL)
    dq = _dq_tiles(dq, q, do, lse, delta, K, V, skt, skd, svt, svd, rows, Tk, qk_scale, full, end,
                   PRECISION, UPCAST, HEAD_DIM, BLOCK_D, BLOCK_N, True, CAUSAL)
    _store_rows(DQ + row0 * HEAD_DIM, dq * sm_scale, rows, Tq, HEAD_DIM, 1, HEAD_DIM, BLOCK_D)


# ----------------------------------------------------------------------------- launchers

def _meta(q: torch.Tensor) -> dict:
    """The compile-time arguments every kernel shares; raises for a head dim the kernels cannot take."""
    D = q.shape[-1]
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"attention: the triton kernels support head dims D from 1 to {MAX_HEAD_DIM}, "
                         f"got D = {D} (q {tuple(q.shape)})")
    tf32 = q.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    return {"HEAD_DIM": D, "BLOCK_D": max(16, triton.next_power_of_2(D)),
            "PRECISION": "tf32" if tf32 else "ieee", "UPCAST": INTERPRET and q.dtype != torch.float32}


def _grid(T: int, B: int, H: int, block: str):
    return lambda meta: (triton.cdiv(T, meta[block]), H, B)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float):
    """``(out, (q, k, v, out, lse))``: out (B, H, Tq, D) in q's dtype, lse (B, H, Tq) float32."""
    meta = _meta(q)
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    out = torch.empty((B, H, Tq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Tq), dtype=torch.float32, device=q.device)
    if out.numel() == 0 or Tk == 0:  # no keys: an empty sum, zeros (as scaled_dot_product_attention)
        return out.zero_(), (q, k, v, out, lse.fill_(float("-inf")))
    attention_fwd_kernel[_grid(Tq, B, H, "BLOCK_M")](
        q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(), H // k.shape[1], Tq, Tk,
        scale * LOG2E.value, CAUSAL=causal, **meta)
    return out, (q, k, v, out, lse)


def attention_backward(dout: torch.Tensor, cache, needs, causal: bool, scale: float):
    """``(dq, dk, dv)``, each None where ``needs`` says no. Recomputes P from lse; dK and dV are
    computed together when either is needed."""
    q, k, v, out, lse = cache
    meta = _meta(q)
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    if q.numel() == 0 or k.numel() == 0:  # no query or no key: every gradient is zero
        return tuple(torch.zeros(t.shape, dtype=t.dtype, device=t.device) if n else None
                     for t, n in zip((q, k, v), needs))
    strides = (*q.stride(), *k.stride(), *v.stride())
    args = (H // Hkv, Tq, Tk, scale * LOG2E.value, scale)
    delta = torch.empty_like(lse)
    attention_delta_kernel[_grid(Tq, B, H, "BLOCK_M")](out, dout, delta, *out.stride(), Tq, HEAD_DIM=D,
                                                       BLOCK_D=meta["BLOCK_D"], BLOCK_M=64)
    dq = dk = dv = None
    if needs[1] or needs[2]:
        dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        attention_dkdv_kernel[_grid(Tk, B, Hkv, "BLOCK_N")](q, k, v, dout, lse, delta, dk, dv, *strides, *args,
                                                             CAUSAL=causal, **meta)
    if needs[0]:
        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        attention_dq_kernel[_grid(Tq, B, H, "BLOCK_M")](q, k, v, dout, lse, delta, dq, *strides, *args,
                                                         CAUSAL=causal, **meta)
    return dq, dk if needs[1] else None, dv if needs[2] else None
