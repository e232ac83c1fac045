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
recomputes P_ij = exp(S_ij - lse_i) tile by tile. The backward is two kernels, in this order:
  - dQ: one program per BLOCK_M queries, which walks the keys like the forward; it also computes
    delta_i = rowsum(dO * out) of its rows (float32, (B, H, Tq)) and stores it for the next kernel
    (when dQ is not wanted, a small kernel computes delta alone);
  - dK, dV: one program per BLOCK_N keys of a kv head, which walks the query tiles of every query
    head of its group (grouped-query attention: the sum over the group is a loop in one program,
    deterministic, no atomics and no expanded copy of k, v).
Work (FlashAttention's count, halved under the causal mask): forward 4 B H Tq Tk D FLOP, backward
2.5 times that; the dQ kernel recomputes S and dP, so the backward does 7 instead of 5 T x T x D
products (the price of no atomics: deterministic). Each tensor crosses device memory about once (q,
k, v, out, lse forward; those, dO, delta and the gradients backward), but k, v are re-read for each
query tile and q, dO for each key tile: 2 T D elements per 4 BLOCK T D FLOP, BLOCK / 2 FLOP per
byte in 16-bit, which L2 serves (HBM alone would need ~300 on an H100). Hence tiles as large as
the registers allow (a program's accumulator is BLOCK x D float32), autotuned per (Tq, Tk, D,
causal).
On Hopper the 16-bit forward at D = 128 (and D = 64 under the causal mask) runs
``attention_fwd_tma_kernel``: the same loop with q, k, v and out moved by TMA (host-side tensor
descriptors of the (B, H, T, D) tensors, boxes of (1, 1, rows, D)): the copy engine computes the
addresses and zero-fills rows past T, so the loads need no masks, and Triton pipelines the
descriptor loads through shared memory. With its own configs (128 query rows on one warpgroup win
from T = 1k to 16k) it is 1.06-1.16x the pointer kernel's speed at D = 128 on an H100. The two
backward kernels take the same descriptors there (``TMA=True``, 16-bit D = 64 and 128): 1.00-1.14x.
Host time: at T = 1k the forward kernel runs 0.19 ms (causal; B = H = 16, D = 128, H100), about
what one call costs the host (validation, the autograd node, two allocations, four descriptors, the
autotuner's dispatch, Triton's launch: 0.20-0.30 ms on the benchmark machines), so the GPU waited on
the host. The launchers go around the autotuner once it has picked a config for a key
(``_launch.launch_tuned``), build the descriptors without re-checking what ``tma_strides`` checked,
and ``kcourse.blas`` skips the autograd node when no input wants a gradient: 0.10-0.11 ms a call on
the machine that measured the autotuner's dispatch at 0.14-0.33 (up to 0.24 on a slower one), and
the runner's forward at T = 1k runs at 0.82 / 0.77 of SDPA (causal / not) on an H100 instead of 0.32 / 0.62
through the autotuner: the kernel's own speed.
Details worth reading the kernels for:
  - exponentials are exp2 with the scale folded in (c log2 e), as the hardware has exp2; on
    unmasked tiles the row max of c S is c times the row max of S (the min when c < 0), so each
    score costs one fused multiply-add and one exp2;
  - causal: tiles that are fully masked are skipped (the loops stop at the diagonal), tiles wholly
    below it run without a mask (MASK=False) and load k, v with no row mask, only the tiles that
    straddle it or the key tail pay for the mask; the forward runs the longest rows first
    (reversed program order);
  - the head dim is padded to a power of two (>= 16) with masked, zero-filled loads; tails of the
    sequence are masked loads too. In the dK, dV kernel a padded query row loads lse = +inf, so its
    P is exactly 0 and it adds nothing; padded key rows of that kernel are computed and dropped;
  - ``kv_len`` (a static KV cache, inference only): the pointer forward reads kv_len[b] once per
    program and uses it as that row's Tk, so the key walk stops there and the tail is masked; a row
    of no key stores 0 (l = 0 guarded) and lse -inf. The TMA forward takes no kv_len;
  - every operand is addressed through its own strides (views read in place), offsets in int64;
  - P and dS are rounded to the input dtype before their tl.dot (tensor cores), accumulation is
    float32; float32 inputs use exact float32 products (input_precision "ieee") unless
    torch.backends.cuda.matmul.allow_tf32 is on ("tf32"), as gemm. Triton's CPU interpreter
    multiplies bfloat16/float16 tiles wrongly, so there (UPCAST) every tile is float32.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .._layout import heads_like, tma_strides
from ._launch import INTERPRET, cdiv, is_hopper, launch, launch_tuned, next_power_of_2

LOG2E = tl.constexpr(math.log2(math.e))  # exp(x) = exp2(x log2 e)
MAX_HEAD_DIM = 128
TMA_HEAD_DIMS = (64, 128)  # the head dims the TMA forward takes
USE_TMA = True  # False: the pointer forward everywhere (measurements)


def _tma_block_shapes(nargs):
    """Every config's pre_hook: the boxes of the arguments that are TMA descriptors, each one (1, 1, rows, D)
    tile of a (B, H, T, D) tensor, BLOCK_M rows of the query side (Q, O, DO), BLOCK_N of K, V."""
    for name, rows in (("Q", "BLOCK_M"), ("O", "BLOCK_M"), ("DO", "BLOCK_M"), ("K", "BLOCK_N"), ("V", "BLOCK_N")):
        if isinstance(nargs.get(name), TensorDescriptor):
            nargs[name].block_shape = [1, 1, nargs[rows], nargs["BLOCK_D"]]


def _configs(sizes):
    """triton.Config objects from (BLOCK_M, BLOCK_N, num_warps, num_stages)."""
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s, pre_hook=_tma_block_shapes)
            for m, n, w, s in sizes]


# Autotuned tiles, (BLOCK_M, BLOCK_N, num_warps, num_stages), one list for head dims up to 64 and one
# for 65..128 (key: the larger BLOCK_D). Each compiles for sm_90 without register spills (ptxas -v)
# in 16-bit types at D = 64 and 128 without grouped-query heads (the group loop of the dK, dV kernel
# costs registers: there some spill, and the autotuner weighs them); the float32 prune
# (tiles_that_fit) leaves the small tiles at the end of each list. The backward's first entries are
# the winners of a sweep of its kernels reading by TMA (benchmarks/experiments/triton_attention_tma.py
# --backward-sweep, H100, 48 configs, T = 1k..16k): dK/dV (64, 64, 4, 2) within 2% of the best at
# every point at D = 128 and (128, 64, 4, 2) at D = 64, where the autotuner's old picks were up to
# 12% and 14% slower; dQ (128, 64, 8, 3) and (128, 64, 4, 3). The interpreter gets one small config
# with several tiles per row of a test-sized problem.
if INTERPRET:
    FWD_CONFIGS = DQ_CONFIGS = dict.fromkeys((64, 128), _configs([(32, 16, 4, 1)]))
    DKDV_CONFIGS = dict.fromkeys((64, 128), _configs([(16, 32, 4, 1)]))
else:
    FWD_CONFIGS = {64: _configs([(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (256, 64, 16, 3),
                                 (256, 128, 16, 2), (64, 64, 4, 3), (64, 32, 4, 2)]),
                   128: _configs([(128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (256, 64, 16, 2),
                                  (256, 64, 16, 3), (64, 64, 4, 3), (64, 32, 4, 2)])}
    DKDV_CONFIGS = {64: _configs([(128, 64, 4, 2), (32, 128, 4, 3), (64, 128, 8, 3), (32, 128, 8, 3), (64, 64, 4, 3),
                                  (32, 64, 4, 2), (16, 32, 4, 2)]),
                    128: _configs([(64, 64, 4, 2), (32, 128, 8, 3), (64, 128, 8, 3), (64, 128, 8, 2), (64, 64, 8, 3),
                                   (32, 64, 4, 2), (16, 32, 4, 2)])}
    DQ_CONFIGS = {64: _configs([(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 128, 4, 3), (64, 64, 4, 3),
                                (64, 32, 4, 2)]),
                  128: _configs([(128, 64, 8, 3), (128, 64, 8, 2), (128, 32, 8, 3), (64, 32, 4, 3), (64, 64, 4, 3),
                                 (64, 32, 4, 2)])}
# The TMA forward (Hopper, 16-bit, D = 128, or 64 with the causal mask): the winners of a 28-config sweep at D = 128
# (blocks 64/128 x 32/64/128, 2-6 stages, 4/8 warps; benchmarks/experiments/triton_attention_tma.py,
# H100) and their neighbours; 128 query rows on 4 warps (one warpgroup) win from T = 1k to 16k.
TMA_FWD_SIZES = [(128, 64, 4, 2), (64, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 3)]
TMA_FWD_CONFIGS = dict.fromkeys((64, 128), _configs([(32, 16, 4, 1)] if INTERPRET else TMA_FWD_SIZES))



def tiles_that_fit(configs, args, **kwargs):
    """Skip tiles far longer than the sequences (a 7-token test compiles only the small ones), and
    for float32 inputs every tile above 64 x 32: float32 tiles of that size already fill the
    registers, larger ones spill and take minutes each to compile and autotune. (The TMA kernel's
    Q is a descriptor of a 16-bit tensor.)"""
    M, N = max(32, next_power_of_2(args["Tq"])), max(32, next_power_of_2(args["Tk"]))
    if getattr(args["Q"], "dtype", None) == torch.float32:
        configs = [c for c in configs if c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 64 * 32]
    fit = [c for c in configs if c.kwargs["BLOCK_M"] <= M and c.kwargs["BLOCK_N"] <= N]
    return fit or configs[-1:]


def _autotune(table, key=()):
    """Autotune over ``table[64]`` for head dims up to 64 (BLOCK_D <= 64), ``table[128]`` above;
    ``key``: the kernel's own arguments the choice also depends on."""
    def prune(configs, args, **kwargs):
        return tiles_that_fit(table[64 if kwargs["BLOCK_D"] <= 64 else 128], args, **kwargs)

    union = table[64] + [c for c in table[128] if c not in table[64]]
    return triton.autotune(configs=union, key=["Tq", "Tk", "HEAD_DIM", "CAUSAL", "PRECISION", *key],
                           prune_configs_by={"early_config_prune": prune})


@triton.jit
def _load_rows(ptr, rows, n_rows, stride_t, stride_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               UPCAST: tl.constexpr, CHECK_ROWS: tl.constexpr):
    """The (len(rows), BLOCK_D) tile of a (n_rows, HEAD_DIM) matrix, zero outside it; without
    CHECK_ROWS every row is known to be inside and only the padded head dims are masked."""
    dims = tl.arange(0, BLOCK_D)
    ptrs = ptr + rows[:, None].to(tl.int64) * stride_t + dims[None, :] * stride_d
    if CHECK_ROWS:
        tile = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (dims[None, :] < HEAD_DIM), other=0.0)
    elif HEAD_DIM < BLOCK_D:
        tile = tl.load(ptrs, mask=dims[None, :] < HEAD_DIM, other=0.0)
    else:
        tile = tl.load(ptrs)
    if UPCAST:
        tile = tile.to(tl.float32)
    return tile


@triton.jit
def _head(X, b, h, stride_b, stride_h):
    """The first element of head ``h`` of batch ``b`` of a (B, H, T, D) tensor at ``X`` (64-bit offsets)."""
    return X + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h


@triton.jit
def _load_tma_pair(X, Y, b, h, start, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    """The (ROWS, BLOCK_D) tiles at rows [start, start + ROWS) of head h of batch b of two TMA
    descriptors of (B, H, T, D) tensors; rows past T arrive as zeros."""
    x = X.load([b, h, start, 0]).reshape(ROWS, BLOCK_D)
    y = Y.load([b, h, start, 0]).reshape(ROWS, BLOCK_D)
    if UPCAST:
        x, y = x.to(tl.float32), y.to(tl.float32)
    return x, y


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
def _softmax_update(s, m_i, l_i, rows, cols, Tk, qk_scale, MASK: tl.constexpr, CAUSAL: tl.constexpr,
                    NEG_SCALE: tl.constexpr):
    """Online softmax over one more tile of raw scores s = q k^T (BLOCK_M, BLOCK_N): the new row max
    m (log2 units), the tile's probabilities p relative to it, the factor alpha that rescales what
    was summed under the old max, and the new row sum l."""
    if MASK:  # scale, then hide: -inf whatever the sign of the scale (0 included)
        s = tl.where(_visible(rows, cols, Tk, CAUSAL), s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
    else:  # max_j c s_j = c max_j s_j (c min_j s_j for c < 0): one fused multiply-add per element
        if NEG_SCALE:
            m_new = tl.maximum(m_i, tl.min(s, 1) * qk_scale)
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    return p, alpha, l_i * alpha + tl.sum(p, 1), m_new


@triton.jit
def _fwd_tiles(acc, l_i, m_i, q, K, V, stride_kt, stride_kd, stride_vt, stride_vd, rows, Tk, qk_scale, lo, hi,
               PRECISION: tl.constexpr, UPCAST: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, NEG_SCALE: tl.constexpr):
    # acc: (BLOCK_M, BLOCK_D) float32; l_i, m_i: (BLOCK_M,) in log2 units; q: (BLOCK_M, BLOCK_D);
    # without MASK every key of [lo, hi) is < Tk and the K, V loads take no row mask
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = _load_rows(K, cols, Tk, stride_kt, stride_kd, HEAD_DIM, BLOCK_D, UPCAST, MASK)  # (BLOCK_N, BLOCK_D)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N), unscaled
        p, alpha, l_i, m_i = _softmax_update(s, m_i, l_i, rows, cols, Tk, qk_scale, MASK, CAUSAL, NEG_SCALE)
        v = _load_rows(V, cols, Tk, stride_vt, stride_vd, HEAD_DIM, BLOCK_D, UPCAST, MASK)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
    return acc, l_i, m_i


@_autotune(FWD_CONFIGS)
@triton.jit
def attention_fwd_kernel(Q, K, V, O, LSE, KV_LEN, sqb, sqh, sqt, sqd, skb, skh, skt, skd, svb, svh, svt, svd,
                         sob, soh, sot, sod, GROUP, Tq, Tk, qk_scale,
                         CAUSAL: tl.constexpr, NEG_SCALE: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                         HAS_KV_LEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # q, o: (B, H, Tq, HEAD_DIM); k, v: (B, H / GROUP, Tk, HEAD_DIM); lse: (B, H, Tq) float32, contiguous;
    # with HAS_KV_LEN, kv_len (B,) int32: batch row b sees only its first clamp(kv_len[b], 0, Tk) keys
    start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M  # the longest causal rows first
    h, b = tl.program_id(1), tl.program_id(2).to(tl.int64)
    if HAS_KV_LEN:  # from here on Tk is this batch row's key count
        Tk = tl.minimum(tl.maximum(tl.load(KV_LEN + b), 0), Tk)
    hk = h // GROUP  # the kv head of query head h
    H = tl.num_programs(1)
    Q, K, V = _head(Q, b, h, sqb, sqh), _head(K, b, hk, skb, skh), _head(V, b, hk, svb, svh)
    rows = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query indices
    q = _load_rows(Q, rows, Tq, sqt, sqd, HEAD_DIM, BLOCK_D, UPCAST, True)  # (BLOCK_M, BLOCK_D)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    full, end = _key_ranges(start_m, Tk, CAUSAL, BLOCK_M, BLOCK_N)
    acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, K, V, skt, skd, svt, svd, rows, Tk, qk_scale, 0, full,
                               PRECISION, UPCAST, HEAD_DIM, BLOCK_D, BLOCK_N, False, CAUSAL, NEG_SCALE)
    acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, K, V, skt, skd, svt, svd, rows, Tk, qk_scale, full, end,
                               PRECISION, UPCAST, HEAD_DIM, BLOCK_D, BLOCK_N, True, CAUSAL, NEG_SCALE)

    if HAS_KV_LEN:  # a row of no key (l = 0): out 0, lse -inf
        acc = acc * (1.0 / tl.where(l_i == 0.0, 1.0, l_i))[:, None]
    else:
        acc = acc * (1.0 / l_i)[:, None]
    _store_rows(_head(O, b, h, sob, soh), acc, rows, Tq, sot, sod, HEAD_DIM, BLOCK_D)
    lse = (m_i + tl.math.log2(l_i)) / LOG2E  # natural log
    tl.store(LSE + (b * H + h) * Tq + rows, lse, mask=rows < Tq)


# ----------------------------------------------------------------------------- forward through TMA (Hopper)

@triton.jit
def _fwd_tiles_tma(acc, l_i, m_i, q, K, V, b, hk, rows, Tk, qk_scale, lo, hi, UPCAST: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
                   NEG_SCALE: tl.constexpr):
    # _fwd_tiles with K, V tiles brought by TMA (K, V: descriptors of (B, Hkv, Tk, D)); key rows past
    # Tk arrive as zeros (their scores are masked all the same)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = K.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D)  # (BLOCK_N, D)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k))  # (BLOCK_M, BLOCK_N), unscaled
        p, alpha, l_i, m_i = _softmax_update(s, m_i, l_i, rows, cols, Tk, qk_scale, MASK, CAUSAL, NEG_SCALE)
        v = V.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        if UPCAST:
            v = v.to(tl.float32)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_i


@_autotune(TMA_FWD_CONFIGS)
@triton.jit
def attention_fwd_tma_kernel(Q, K, V, O, LSE, GROUP, Tq, Tk, qk_scale, CAUSAL: tl.constexpr,
                             NEG_SCALE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                             PRECISION: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr):
    # attention_fwd_kernel with every tile of q, k, v and out moved by TMA: Q, O descriptors of
    # (B, H, Tq, D), K, V of (B, H / GROUP, Tk, D), boxes (1, 1, rows, D) (_tma_block_shapes), D =
    # BLOCK_D; the copy engine computes the addresses, fills rows past T with zeros and drops the
    # stores of out's rows past Tq. lse: (B, H, Tq) float32, contiguous. PRECISION: part of the
    # autotuner's key only (16-bit products); UPCAST: the interpreter's float32 tiles, as there.
    start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M  # the longest causal rows first
    h, b = tl.program_id(1), tl.program_id(2)
    hk = h // GROUP
    H = tl.num_programs(1)
    rows = start_m + tl.arange(0, BLOCK_M)
    q = Q.load([b, h, start_m, 0]).reshape(BLOCK_M, BLOCK_D)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    full, end = _key_ranges(start_m, Tk, CAUSAL, BLOCK_M, BLOCK_N)
    acc, l_i, m_i = _fwd_tiles_tma(acc, l_i, m_i, q, K, V, b, hk, rows, Tk, qk_scale, 0, full,
                                   UPCAST, BLOCK_D, BLOCK_N, False, CAUSAL, NEG_SCALE)
    acc, l_i, m_i = _fwd_tiles_tma(acc, l_i, m_i, q, K, V, b, hk, rows, Tk, qk_scale, full, end,
                                   UPCAST, BLOCK_D, BLOCK_N, True, CAUSAL, NEG_SCALE)

    out = (acc * (1.0 / l_i)[:, None]).to(O.dtype)
    O.store([b, h, start_m, 0], out.reshape(1, 1, BLOCK_M, BLOCK_D))
    lse = (m_i + tl.math.log2(l_i)) / LOG2E  # natural log
    tl.store(LSE + (b.to(tl.int64) * H + h) * Tq + rows, lse, mask=rows < Tq)


# ----------------------------------------------------------------------------- backward

@triton.jit
def attention_delta_kernel(O, DO, DELTA, sob, soh, sot, sod, sdob, sdoh, sdot, sdod, Tq,
                           HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    # o, do: (B, H, Tq, HEAD_DIM), each through its strides; delta: (B, H, Tq) float32, contiguous
    h, b = tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    H = tl.num_programs(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    o = _load_rows(_head(O, b, h, sob, soh), rows, Tq, sot, sod, HEAD_DIM, BLOCK_D, True, True)
    do = _load_rows(_head(DO, b, h, sdob, sdoh), rows, Tq, sdot, sdod, HEAD_DIM, BLOCK_D, True, True)
    tl.store(DELTA + (b * H + h) * Tq + rows, tl.sum(o * do, 1), mask=rows < Tq)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, Q, DO, LSE, DELTA, b, h, stride_qt, stride_qd, stride_dot, stride_dod, cols, Tq,
                qk_scale, lo, hi, PRECISION: tl.constexpr, UPCAST: tl.constexpr, HEAD_DIM: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, MASK: tl.constexpr, TMA: tl.constexpr):
    # dk, dv, k, v: (BLOCK_N, BLOCK_D); cols: (BLOCK_N,) key indices; S, P, dP, dS are held transposed.
    # LSE, DELTA: query head h's rows; Q, DO: h's rows too, or with TMA descriptors of (B, H, Tq, D)
    # read at (b, h)
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        if TMA:  # rows past Tq arrive as zeros
            q, do = _load_tma_pair(Q, DO, b, h, start_m, BLOCK_M, BLOCK_D, UPCAST)
        else:
            q = _load_rows(Q, rows, Tq, stride_qt, stride_qd, HEAD_DIM, BLOCK_D, UPCAST, True)  # (BLOCK_M, BLOCK_D)
            do = _load_rows(DO, rows, Tq, stride_dot, stride_dod, HEAD_DIM, BLOCK_D, UPCAST, True)
        lse = tl.load(LSE + rows, mask=rows < Tq, other=float("inf")) * LOG2E  # padded rows: P = 0
        delta = tl.load(DELTA + rows, mask=rows < Tq, other=0.0)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M): S^T, unscaled
        p_t = tl.math.exp2(s_t * qk_scale - lse[None, :])
        if MASK:  # causal: key j is seen by queries i >= j
            p_t = tl.where(rows[None, :] >= cols[:, None], p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)  # P^T dO
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M): (dO v^T)^T
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=PRECISION)  # dS^T q
    return dk, dv


@_autotune(DKDV_CONFIGS, key=("TMA",))
@triton.jit
def attention_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, sqb, sqh, sqt, sqd, skb, skh, skt, skd,
                          svb, svh, svt, svd, sdob, sdoh, sdot, sdod, sdkb, sdkh, sdkt, sdvb, sdvh, sdvt,
                          GROUP, Tq, Tk, qk_scale, sm_scale,
                          CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                          PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # q, do: (B, H, Tq, HEAD_DIM); k, v: (B, Hkv, Tk, HEAD_DIM) with H = GROUP Hkv, all through their
    # strides (with TMA: Q, K, V, DO are descriptors of them, D = BLOCK_D, and the strides go unused);
    # lse, delta: (B, H, Tq) float32; dk, dv: (B, Hkv, Tk, HEAD_DIM), the head dim of stride 1
    start_n = tl.program_id(0) * BLOCK_N
    hk, b = tl.program_id(1), tl.program_id(2)
    Hkv = tl.num_programs(1)
    cols = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key indices
    if TMA:  # key rows past Tk arrive as zeros
        k, v = _load_tma_pair(K, V, b, hk, start_n, BLOCK_N, BLOCK_D, UPCAST)
    else:
        k = _load_rows(_head(K, b, hk, skb, skh), cols, Tk, skt, skd, HEAD_DIM, BLOCK_D, UPCAST, True)
        v = _load_rows(_head(V, b, hk, svb, svh), cols, Tk, svt, svd, HEAD_DIM, BLOCK_D, UPCAST, True)
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
        row0 = (b.to(tl.int64) * Hkv * GROUP + h) * Tq  # h's first row in lse, delta
        if TMA:
            q_at, do_at = Q, DO
        else:
            q_at, do_at = _head(Q, b, h, sqb, sqh), _head(DO, b, h, sdob, sdoh)
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_at, do_at, LSE + row0, DELTA + row0, b, h, sqt, sqd, sdot, sdod, cols,
                             Tq, qk_scale, lo, mid, PRECISION, UPCAST, HEAD_DIM, BLOCK_D, BLOCK_M, True, TMA)
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_at, do_at, LSE + row0, DELTA + row0, b, h, sqt, sqd, sdot, sdod, cols,
                             Tq, qk_scale, mid, Tq, PRECISION, UPCAST, HEAD_DIM, BLOCK_D, BLOCK_M, False, TMA)
    _store_rows(_head(DK, b, hk, sdkb, sdkh), dk * sm_scale, cols, Tk, sdkt, 1, HEAD_DIM, BLOCK_D)
    _store_rows(_head(DV, b, hk, sdvb, sdvh), dv, cols, Tk, sdvt, 1, HEAD_DIM, BLOCK_D)


@triton.jit
def _dq_tiles(dq, q, do, lse, delta, K, V, b, hk, stride_kt, stride_kd, stride_vt, stride_vd, rows, Tk, qk_scale,
              lo, hi, PRECISION: tl.constexpr, UPCAST: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr):
    # dq, q, do: (BLOCK_M, BLOCK_D); lse (log2 units), delta: (BLOCK_M,); K, V: kv head hk's rows, or
    # with TMA descriptors of (B, Hkv, Tk, D) read at (b, hk); without MASK every key of [lo, hi) is
    # < Tk and the K, V loads take no row mask
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        if TMA:  # key rows past Tk arrive as zeros (their P is masked all the same)
            k, v = _load_tma_pair(K, V, b, hk, start_n, BLOCK_N, BLOCK_D, UPCAST)
        else:
            k = _load_rows(K, cols, Tk, stride_kt, stride_kd, HEAD_DIM, BLOCK_D, UPCAST, MASK)  # (BLOCK_N, BLOCK_D)
            v = _load_rows(V, cols, Tk, stride_vt, stride_vd, HEAD_DIM, BLOCK_D, UPCAST, MASK)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N), unscaled
        p = tl.math.exp2(s * qk_scale - lse[:, None])
        if MASK:
            p = tl.where(_visible(rows, cols, Tk, CAUSAL), p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    return dq


@_autotune(DQ_CONFIGS, key=("TMA",))
@triton.jit
def attention_dq_kernel(Q, K, V, O, DO, LSE, DELTA, DQ, sqb, sqh, sqt, sqd, skb, skh, skt, skd,
                        svb, svh, svt, svd, sob, soh, sot, sod, sdob, sdoh, sdot, sdod, sdqb, sdqh, sdqt,
                        GROUP, Tq, Tk, qk_scale, sm_scale,
                        CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                        PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # q, o, do: (B, H, Tq, HEAD_DIM); k, v: (B, H / GROUP, Tk, HEAD_DIM), all through their strides;
    # dq: (B, H, Tq, HEAD_DIM), the head dim of stride 1 (with TMA: Q, K, V, DO are descriptors, their
    # strides unused);
    # lse: (B, H, Tq) float32. Writes delta (B, H, Tq) float32 too: its rows are this program's, and
    # the dK, dV kernel reads it after.
    start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    h, b = tl.program_id(1), tl.program_id(2)
    hk = h // GROUP
    row0 = (b.to(tl.int64) * tl.num_programs(1) + h) * Tq  # this head's first row in lse, delta
    rows = start_m + tl.arange(0, BLOCK_M)
    if TMA:  # query rows past Tq arrive as zeros
        q, do = _load_tma_pair(Q, DO, b, h, start_m, BLOCK_M, BLOCK_D, UPCAST)
    else:
        q = _load_rows(_head(Q, b, h, sqb, sqh), rows, Tq, sqt, sqd, HEAD_DIM, BLOCK_D, UPCAST, True)
        do = _load_rows(_head(DO, b, h, sdob, sdoh), rows, Tq, sdot, sdod, HEAD_DIM, BLOCK_D, UPCAST, True)
        K, V = _head(K, b, hk, skb, skh), _head(V, b, hk, svb, svh)
    o = _load_rows(_head(O, b, h, sob, soh), rows, Tq, sot, sod, HEAD_DIM, BLOCK_D, True, True)
    delta = tl.sum(o * do.to(tl.float32), 1)  # (BLOCK_M,)
    tl.store(DELTA + row0 + rows, delta, mask=rows < Tq)
    lse = tl.load(LSE + row0 + rows, mask=rows < Tq, other=0.0) * LOG2E

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    full, end = _key_ranges(start_m, Tk, CAUSAL, BLOCK_M, BLOCK_N)
    dq = _dq_tiles(dq, q, do, lse, delta, K, V, b, hk, skt, skd, svt, svd, rows, Tk, qk_scale, 0, full,
                   PRECISION, UPCAST, HEAD_DIM, BLOCK_D, BLOCK_N, False, CAUSAL, TMA)
    dq = _dq_tiles(dq, q, do, lse, delta, K, V, b, hk, skt, skd, svt, svd, rows, Tk, qk_scale, full, end,
                   PRECISION, UPCAST, HEAD_DIM, BLOCK_D, BLOCK_N, True, CAUSAL, TMA)
    _store_rows(_head(DQ, b, h, sdqb, sdqh), dq * sm_scale, rows, Tq, sdqt, 1, HEAD_DIM, BLOCK_D)


# ----------------------------------------------------------------------------- launchers

def _meta(q: torch.Tensor) -> dict:
    """The compile-time arguments every kernel shares (one dict per head dim, dtype and precision: do
    not change it); raises for a head dim the kernels cannot take."""
    D = q.shape[-1]
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"attention: the triton kernels support head dims D from 1 to {MAX_HEAD_DIM}, "
                         f"got D = {D} (q {tuple(q.shape)})")
    return _meta_of(D, q.dtype, q.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32)


@functools.lru_cache(maxsize=None)
def _meta_of(D: int, dtype: torch.dtype, tf32: bool) -> dict:
    return {"HEAD_DIM": D, "BLOCK_D": max(16, next_power_of_2(D)),
            "PRECISION": "tf32" if tf32 else "ieee", "UPCAST": INTERPRET and dtype != torch.float32}


def _key(q: torch.Tensor, Tq: int, Tk: int, causal: bool, meta: dict) -> tuple:
    """The key of a launch's tile choice (``launch_tuned``; the backward's adds TMA): what the
    autotuners key on (``_autotune``), q's dtype included, with each length rounded up to a power of
    2. The autotuner runs at the first length of a class and its pick serves the rest (any tile is
    correct at any length: tails are masked), so decoding, whose key length grows by one each step,
    tunes once per doubling rather than at every step."""
    return next_power_of_2(Tq), next_power_of_2(Tk), meta["HEAD_DIM"], causal, meta["PRECISION"], q.dtype


def _grid(T: int, B: int, H: int, block: str):
    return lambda meta: (cdiv(T, meta[block]), H, B)


def tma_device(q: torch.Tensor) -> bool:
    """Whether the TMA kernels may run on q's device: a Hopper GPU (their configs were tuned there),
    never under the interpreter (tests call the kernels there by patching this)."""
    return USE_TMA and q.is_cuda and not INTERPRET and is_hopper(q.device.index)


def use_tma(q: torch.Tensor, causal: bool, backward: bool = False) -> bool:
    """Whether the kernels take their TMA tiles (where ``tma_descriptors`` can make them, 16-bit, D = 64
    or 128): on Hopper (``tma_device``) where they measured faster (H100, bfloat16, T = 1k-16k;
    benchmarks/experiments/triton_attention_tma.py). The forward at D = 128 (1.06-1.16x the pointer
    kernel's speed) and at D = 64 under the causal mask (1.00-1.06x; without it 0.97-1.01x: the pointer
    kernel there). The backward, both kernels, everywhere: D = 128 1.00-1.09x, D = 64 causal 1.08-1.14x,
    D = 64 without the mask 0.98-1.04x."""
    return tma_device(q) and (backward or causal or q.shape[-1] == 128)


def tma_descriptors(*tensors: torch.Tensor):
    """TMA descriptors of (B, H, T, D) tensors (``_layout.tma_strides``) when the first is 16-bit with
    D = 64 or 128 and TMA can read them all, else None; the config's pre_hook sets the boxes."""
    if tensors[0].dtype not in (torch.float16, torch.bfloat16) or tensors[0].shape[-1] not in TMA_HEAD_DIMS:
        return None
    strides = [tma_strides(t) for t in tensors]
    if None in strides or max(t.shape[2] for t in tensors) >= 2**31:
        return None
    return [_descriptor(t, s) for t, s in zip(tensors, strides)]


# TensorDescriptor's fields after (base, shape, strides, block_shape), with their defaults (padding, ...)
_DESCRIPTOR_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TensorDescriptor)
                        if f.default is not dataclasses.MISSING}


def _descriptor(t: torch.Tensor, strides) -> TensorDescriptor:
    """``TensorDescriptor(t, t.shape, (*strides, 1), (1, 1, 1, D))`` without the dataclass's checks
    (alignment, strides, box sizes), which ``tma_strides`` and the configs' boxes satisfy already:
    four descriptors a call, their checks cost ~10 us of host time, and the short kernels wait on
    the host (the module's docstring)."""
    descriptor = object.__new__(TensorDescriptor)
    descriptor.__dict__.update(_DESCRIPTOR_DEFAULTS, base=t, shape=list(t.shape), strides=[*strides, 1],
                               block_shape=[1, 1, 1, t.shape[-1]])
    return descriptor


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_len, causal: bool, scale: float):
    """``(out, (q, k, v, out, lse))``: out (B, H, Tq, D) in q's dtype, laid out as ``heads_like(q)``,
    lse (B, H, Tq) float32; ``kv_len`` None or (B,) int32 (the pointer kernel reads it: each batch
    row's key count)."""
    meta = _meta(q)
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    out = heads_like(q)  # token-major for token-major q: the op's layout
    lse = torch.empty((B, H, Tq), dtype=torch.float32, device=q.device)
    if out.numel() == 0 or Tk == 0:  # no keys: an empty sum, zeros (as scaled_dot_product_attention)
        return out.zero_(), (q, k, v, out, lse.fill_(float("-inf")))
    args = (H // k.shape[1], Tq, Tk, scale * LOG2E.value)
    descriptors = tma_descriptors(q, k, v, out) if kv_len is None and use_tma(q, causal) else None
    key = (*_key(q, Tq, Tk, causal, meta), kv_len is not None)
    if descriptors is not None:  # Hopper: the tiles move by TMA
        launch_tuned(attention_fwd_tma_kernel, _grid(Tq, B, H, "BLOCK_M"), key,
                     *descriptors, lse, *args, CAUSAL=causal, NEG_SCALE=scale < 0, **meta)
    else:
        launch_tuned(attention_fwd_kernel, _grid(Tq, B, H, "BLOCK_M"), key,
                     q, k, v, out, lse, lse if kv_len is None else kv_len, *q.stride(), *k.stride(), *v.stride(),
                     *out.stride(), *args, CAUSAL=causal, NEG_SCALE=scale < 0, HAS_KV_LEN=kv_len is not None, **meta)
    return out, (q, k, v, out, lse)


def attention_backward(dout: torch.Tensor, cache, needs, causal: bool, scale: float):
    """``(dq, dk, dv)``, each None where ``needs`` says no. Recomputes P from lse: the dQ kernel (with
    delta), then the dK, dV kernel (dK and dV computed together when either is needed); on Hopper both
    read their tiles by TMA (``use_tma``)."""
    q, k, v, out, lse = cache
    meta = _meta(q)
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    if q.numel() == 0 or k.numel() == 0:  # no query or no key: every gradient is zero
        return tuple(torch.zeros(t.shape, dtype=t.dtype, device=t.device) if n else None
                     for t, n in zip((q, k, v), needs))
    strides = (*q.stride(), *k.stride(), *v.stride())
    args = (H // Hkv, Tq, Tk, scale * LOG2E.value, scale)
    descriptors = tma_descriptors(q, k, v, dout) if use_tma(q, causal, backward=True) else None
    q_, k_, v_, dout_ = descriptors or (q, k, v, dout)  # what the kernels read: tensors or descriptors
    delta = torch.empty_like(lse)
    dq = dk = dv = None
    tma = descriptors is not None
    key = (*_key(q, Tq, Tk, causal, meta), tma)
    if needs[0]:  # the dQ kernel computes delta on the way
        dq = heads_like(q)  # each gradient laid out as its input (the op's layout)
        launch_tuned(attention_dq_kernel, _grid(Tq, B, H, "BLOCK_M"), key, q_, k_, v_, out, dout_, lse, delta, dq,
                     *strides, *out.stride(), *dout.stride(), *dq.stride()[:3], *args, CAUSAL=causal, TMA=tma,
                     **meta)
    else:
        launch(attention_delta_kernel, _grid(Tq, B, H, "BLOCK_M"), out, dout, delta, *out.stride(), *dout.stride(), Tq,
               HEAD_DIM=D, BLOCK_D=meta["BLOCK_D"], BLOCK_M=64)
    if needs[1] or needs[2]:
        dk, dv = heads_like(k), heads_like(v)
        launch_tuned(attention_dkdv_kernel, _grid(Tk, B, Hkv, "BLOCK_N"), key, q_, k_, v_, dout_, lse, delta, dk, dv,
                     *strides, *dout.stride(), *dk.stride()[:3], *dv.stride()[:3], *args, CAUSAL=causal, TMA=tma,
                     **meta)
    return dq, dk if needs[1] else None, dv if needs[2] else None
