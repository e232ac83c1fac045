"""Experiment: a first Gluon attention forward and backward for Hopper (issue "The triton backend's attention at
cuDNN's speed on Hopper, written in Gluon"): TMA loads of Q and a ring of K/V tiles, async
``warpgroup_mma`` for S = Q K^T and O += P V, the online softmax in registers between them; the
backward per key tile (``attention_bwd_kernel``). ``attention_fwd_kernel`` is one partition (the
loads run ``STAGES - 1`` tiles ahead of the products); ``attention_fwd_ws_kernel`` is warp-specialized.

    python -m benchmarks.experiments.gluon_attention --compile-only    # any machine: builds for sm_90a
    python -m benchmarks.experiments.gluon_attention OUT.txt            # a Hopper GPU: checks and times
    python -m benchmarks.experiments.gluon_attention OUT.txt --time-only  # the timings alone
    python -m benchmarks.experiments.gluon_attention OUT.txt --quick --schedules pingpong,pingpong-fa3-s3

On a GPU: out, lse and the gradients against the python reference (causal and not, grouped-query,
head dims 64 and 128, odd T), then forward milliseconds against ``F.scaled_dot_product_attention`` and the triton
backend's ``tl`` kernel at T = 1k ... 16k. Without a GPU (``--compile-only``) each variant is compiled
for sm_90a through ``kcourse.blas.triton._launch.compiling_only``, with Triton 3.6 and 3.9 alike.

Measured (H200, Triton 3.6, 1e5f1d0; docs/attention.md "Why these defaults"): every schedule passes
every check (out, lse and the gradients against the reference, causal and not, GQA, D = 64/128,
fp16/bf16, odd T; the deterministic backward bitwise repeatable over two runs), and none is faster
where it matters. Forward, D = 128, bf16, not causal, T = 1k / 2k / 4k / 8k / 16k, speed against SDPA:
``pingpong`` 128 keys 0.52 / 0.62 / 0.71 / 0.77 / 0.80, ``plain`` and ``ws`` 0.49-0.69, the ``tl``
kernel 0.57 / 0.64 / 0.74 / 0.81 / 0.73 (causal: ``pingpong`` 0.44-0.80, ``tl`` 0.57-0.78). The schedules
(``FORWARDS``):
  - ``plain``: one partition, the loads ``STAGES - 1`` tiles ahead; ``overlap``: FlashAttention-3's
    in-warpgroup overlap of the next QK^T with this PV; 64- or 128-key tiles, the mask only on the
    tiles that need it (``_softmax_tile``);
  - ``ws`` (``attention_fwd_ws_kernel``): a producer warp with 24 registers (``_fill_ring``) feeding
    the consumer warpgroups (``_consume``) through ready/empty mbarriers, 12 warps, ``setmaxnreg``;
  - ``pingpong`` (``attention_fwd_pp_kernel``): FlashAttention-3's partitions, two consumer
    warpgroups each with its own 64-row query tile and the producer warp, not yet ordered against
    each other by named barriers as FlashAttention-3's ping-pong is: 1.1-1.2x over one partition at
    T >= 4k; below 4k what limits every schedule is not yet profiled;
  - ``pingpong-ordered``: the same partitions taking turns at the tensor cores (``_my_turn``,
    ``_your_turn``: each consumer hands over through an mbarrier once its product is done). Every check
    passes; slower at 5 of 6 points (H200, D = 128, bf16, T = 2k / 8k / 16k: 0.64 / 0.72 / 0.71 of
    SDPA against 0.67 / 0.77 / 0.75 unordered; causal 0.54 / 0.74 / 0.75 against 0.66 / 0.78 / 0.71):
    the hand-over waits for the product, where FlashAttention-3 hands over once the products are
    issued, with the next QK^T in flight;
  - ``pingpong-overlap`` (each consumer's S of a tile issued with its P V of the tile before, the
    softmax running while P V does: ``_consume``) and ``pingpong-fa3`` (that, the consumers
    taking turns, each handing over once its two products are issued): FlashAttention-3's forward;
    a ``-s3`` suffix gives any ping-pong schedule three K/V slots (229,752 bytes of shared memory at
    D = 128, of 232,448). All correct; none faster than ``pingpong`` beyond the run-to-run spread
    (H200, not causal, T = 2k / 8k / 16k: ``pingpong-fa3-s3`` 0.59-0.68 / 0.76-0.80 / 0.78-0.84 of SDPA
    over two runs, ``pingpong`` 0.58-0.68 / 0.78-0.80 / 0.79-0.80; with two slots the overlapped
    consumers are slower: ``pingpong-overlap`` 0.45 / 0.60 / 0.64; docs/attention.md);
  - a deterministic backward (``attention_dq_kernel``: dQ per query tile, no atomics).

    S  = scale Q K^T (in log2 units: times log2 e)      masked: key j >= Tk, or j > i (causal, top-left)
    m' = max(m, rowmax S)    P = exp2(S - m')    l' = l exp2(m - m') + rowsum P    O' = O exp2(m - m') + P V
    out = O / l              lse = (m + log2 l) ln 2
"""
import argparse
import statistics
import time

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kcourse.blas.triton import _launch

# Triton 3.9 renamed the TMA copies (and makes the old names raise); 3.6 has only the old ones.
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global
LOG2E = 1.4426950408889634
LOG2E_CONST = gl.constexpr(LOG2E)  # (the kernel reads globals as constexprs)


@gluon.jit
def _barriers(STAGES: gl.constexpr):
    """``(one, ring)``: an mbarrier and a ring of ``STAGES`` of them, each initialized for one arrival."""
    one = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ring = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(one, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ring.index(s), count=1)
    fence_async_shared()
    return one, ring


@gluon.jit
def _retire(one, ring, STAGES: gl.constexpr):
    mbarrier.invalidate(one)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ring.index(s))


@gluon.jit
def _load_kv(k_desc, v_desc, bar, k_buf, v_buf, b, hk, tile):
    """Tile ``tile`` of K and V into their buffers, both arriving on ``bar``."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma_load(k_desc, [b, hk, tile * BLOCK_N, 0], bar, k_buf)
    tma_load(v_desc, [b, hk, tile * BLOCK_N, 0], bar, v_buf)


@gluon.jit
def _issue_scores(q, s_zero, k_desc, v_desc, kv_bars, k_smem, v_smem, b, hk, t, ahead, n_tiles):
    """Start loading K/V tile ``ahead`` (if any) into its ring slot, wait for tile ``t``'s, and issue
    S = Q K_t^T (async: the caller waits for it)."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    HEAD_DIM: gl.constexpr = k_desc.block_type.shape[3]
    if ahead < n_tiles:
        _load_kv(k_desc, v_desc, kv_bars.index(ahead % STAGES), k_smem.index(ahead % STAGES),
                 v_smem.index(ahead % STAGES), b, hk, ahead)
    stage = t % STAGES
    mbarrier.wait(kv_bars.index(stage), phase=(t // STAGES) & 1)
    k = k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM])
    return warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False, is_async=True)


@gluon.jit
def _softmax_step(s_acc, m_i, l_i, rows, tile, Tk, qk_scale, CAUSAL: gl.constexpr, MASKED: gl.constexpr,
                  dtype: gl.constexpr, p_layout: gl.constexpr):
    """One tile of the online softmax: ``(P in the PV product's operand layout and dtype, alpha, m', l')``
    for the scores ``s_acc`` of keys tile * BLOCK_N ... (``MASKED``: hidden past Tk and, causal, past
    each row; else every key of the tile is visible to every row)."""
    BLOCK_N: gl.constexpr = s_acc.shape[1]
    if MASKED:
        cols = gl.expand_dims(tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_acc.type.layout)), 0)
        # (one expression: a warp-specialized partition may receive CAUSAL as a value, not a constexpr)
        hidden = (cols >= Tk) | ((cols > gl.expand_dims(rows, 1)) & CAUSAL)
        scores = gl.where(hidden, float("-inf"), s_acc * qk_scale)
    else:
        scores = s_acc * qk_scale
    m_new = gl.maximum(m_i, gl.max(scores, axis=1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(scores - gl.expand_dims(m_new, 1))
    l_new = l_i * alpha + gl.sum(p, axis=1)
    return gl.convert_layout(p.to(dtype), p_layout), alpha, m_new, l_new


@gluon.jit
def _softmax_tile(s_acc, m_i, l_i, rows, tile, n_full, Tk, qk_scale, CAUSAL: gl.constexpr, dtype: gl.constexpr,
                  p_layout: gl.constexpr):
    """``_softmax_step`` with the mask only on the tiles that need one: the first ``n_full`` tiles are
    visible whole (a warp-uniform branch per tile)."""
    if tile < n_full:
        p, alpha, m_new, l_new = _softmax_step(s_acc, m_i, l_i, rows, tile, Tk, qk_scale, CAUSAL, False, dtype,
                                               p_layout)
    else:
        p, alpha, m_new, l_new = _softmax_step(s_acc, m_i, l_i, rows, tile, Tk, qk_scale, CAUSAL, True, dtype,
                                               p_layout)
    return p, alpha, m_new, l_new


@gluon.jit
def _initial_state(off, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                   s_layout: gl.constexpr, o_layout: gl.constexpr):
    """The online softmax's start for query rows off ... off + BLOCK_M - 1: ``(m = -inf, l = 0, O = 0,
    a zero S accumulator, the row indices)``."""
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    return (gl.full([BLOCK_M], float("-inf"), gl.float32, layout=rows_s),
            gl.zeros([BLOCK_M], gl.float32, layout=rows_s), gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout),
            gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout), off + gl.arange(0, BLOCK_M, layout=rows_s))


@gluon.jit
def attention_fwd_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, H, GROUP, Tq, Tk, qk_scale,
                         CAUSAL: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr,
                         num_warps: gl.constexpr):
    """One CTA a tile of BLOCK_M queries of one head. ``OVERLAP``: FlashAttention-3's schedule within
    the warpgroups: the tile's S = Q K^T and the previous tile's O += P V are issued together and the
    softmax of S runs while the P V product does (STAGES >= 3: a K/V buffer is refilled only once its
    P V is done); else each tile's products in turn."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    dtype: gl.constexpr = q_desc.dtype
    gl.static_assert(not OVERLAP or STAGES >= 3, "the overlapped schedule keeps three K/V tiles")
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP  # the kv head of this query head
    off_m = pid_m * BLOCK_M

    # wgmma accumulators: S (BLOCK_M, BLOCK_N) and O (BLOCK_M, HEAD_DIM), warps stacked along M
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)  # P from registers
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)  # (later O's staging)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar, kv_bars = _barriers(STAGES)

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma_load(q_desc, [b, h, off_m, 0], q_bar, q_smem)
    # the keys this tile sees: all Tk, or (causal) up to its last query row; at least one tile (Tk > 0)
    hi = gl.minimum(Tk, off_m + BLOCK_M) if CAUSAL else Tk
    n_tiles = gl.cdiv(hi, BLOCK_N)
    # the leading tiles every row sees whole (no key past Tk; causal: none past the tile's first row)
    n_full = gl.minimum(Tk // BLOCK_N, (off_m + 1) // BLOCK_N) if CAUSAL else Tk // BLOCK_N
    for t in gl.static_range(STAGES - 1):  # the ring's first tiles
        if t < n_tiles:
            _load_kv(k_desc, v_desc, kv_bars.index(t), k_smem.index(t), v_smem.index(t), b, hk, t)

    m_i, l_i, acc, s_zero, rows = _initial_state(off_m, BLOCK_M, BLOCK_N, HEAD_DIM, s_layout, o_layout)
    mbarrier.wait(q_bar, phase=0)
    q = q_smem.reshape([BLOCK_M, HEAD_DIM])

    if OVERLAP:
        mbarrier.wait(kv_bars.index(0), phase=0)
        s_acc = warpgroup_mma(q, k_smem.index(0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), s_zero,
                              use_acc=False, is_async=True)
        s_acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_acc, ))
        p, alpha, m_i, l_i = _softmax_tile(s_acc, m_i, l_i, rows, 0, n_full, Tk, qk_scale, CAUSAL, dtype, p_layout)
        for t in range(1, n_tiles):
            # the next loads into the buffers of tile t - 2, whose P V finished last iteration
            s_acc = _issue_scores(q, s_zero, k_desc, v_desc, kv_bars, k_smem, v_smem, b, hk, t, t + STAGES - 2,
                                  n_tiles)
            v_prev = v_smem.index((t - 1) % STAGES).reshape([BLOCK_N, HEAD_DIM])
            acc = warpgroup_mma(p, v_prev, acc, is_async=True)
            s_acc = warpgroup_mma_wait(num_outstanding=1, deps=(s_acc, ))  # S done; P V may still run
            p, alpha, m_i, l_i = _softmax_tile(s_acc, m_i, l_i, rows, t, n_full, Tk, qk_scale, CAUSAL, dtype,
                                                p_layout)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, rows_o), 1)
        v_last = v_smem.index((n_tiles - 1) % STAGES).reshape([BLOCK_N, HEAD_DIM])
        acc = warpgroup_mma(p, v_last, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    else:
        for t in range(n_tiles):
            # the next loads into the buffers of tile t - 1, whose products are done: STAGES - 1 tiles ahead
            s_acc = _issue_scores(q, s_zero, k_desc, v_desc, kv_bars, k_smem, v_smem, b, hk, t, t + STAGES - 1,
                                  n_tiles)
            s_acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_acc, ))
            stage = t % STAGES
            p, alpha, m_i, l_i = _softmax_tile(s_acc, m_i, l_i, rows, t, n_full, Tk, qk_scale, CAUSAL, dtype,
                                                p_layout)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, rows_o), 1)
            acc = warpgroup_mma(p, v_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))

    _retire(q_bar, kv_bars, STAGES)
    out = acc / gl.expand_dims(gl.convert_layout(l_i, rows_o), 1)
    q.store(out.to(dtype))  # Q's buffer, free now, stages O (the same block shape and layout)
    fence_async_shared()
    tma_store(o_desc, [b, h, off_m, 0], q_smem)  # rows past Tq are clipped by the descriptor
    lse = (m_i + gl.log2(l_i)) / LOG2E_CONST
    gl.store(lse_ptr + bh * Tq + rows, lse, mask=rows < Tq)
    tma.store_wait(pendings=0)


@gluon.jit
def _fill_ring(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, kv_empty, b, hk, n_tiles):
    """The producer's loop: K/V tiles 0 ... n_tiles - 1, each into the ring slot its consumers released
    (``kv_empty``), K and V on barriers of their own so that S = Q K^T can start before V has landed."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    for t in range(n_tiles):
        stage = t % STAGES
        phase = (t // STAGES) & 1
        mbarrier.wait(kv_empty.index(stage), phase ^ 1)  # (a fresh barrier's previous phase counts as done)
        mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
        tma_load(k_desc, [b, hk, t * BLOCK_N, 0], k_ready.index(stage), k_smem.index(stage))
        mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
        tma_load(v_desc, [b, hk, t * BLOCK_N, 0], v_ready.index(stage), v_smem.index(stage))


@gluon.jit
def _my_turn(turns, ROLE: gl.constexpr, PHASE, ORDERED: gl.constexpr):
    """With ``ORDERED``: wait until consumer ``ROLE`` may issue its next products. The two consumers
    strictly alternate: each wait is for one arrival of the other on ``turns[ROLE]``, so the i-th wait
    of a consumer is for phase ``i & 1`` (``_consume``: 0 before a tile's S, 1 before its PV;
    overlapped: the tile's index, one wait a tile)."""
    if ORDERED:
        mbarrier.wait(turns.index(ROLE), PHASE)


@gluon.jit
def _your_turn(turns, ROLE: gl.constexpr, ORDERED: gl.constexpr):
    """With ``ORDERED``: hand the tensor cores to the other consumer (its product done, this one's softmax next)."""
    if ORDERED:
        mbarrier.arrive(turns.index(1 - ROLE), count=1)


@gluon.jit
def _consume(q_buf, q_bar, k_smem, v_smem, k_ready, v_ready, kv_empty, off, n_tiles, n_full, Tk, qk_scale,
             CAUSAL: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr,
             turns, ROLE: gl.constexpr, ORDERED: gl.constexpr, OVERLAP: gl.constexpr):
    """A consumer's loop over tiles 0 ... n_tiles - 1 of the ring for the query rows off ... held in
    ``q_buf`` (landing on ``q_bar``): S = Q K^T, the online softmax, O += P V, then the slot back to
    the producer. Returns ``(O unnormalized, m, l)``. ``ORDERED``: consumer ``ROLE`` of two takes turns
    at the tensor cores with the other through the two mbarriers ``turns`` (``_my_turn``, ``_your_turn``).
    ``OVERLAP``: FlashAttention-3's order within the warpgroup: tile t's S and tile t - 1's P V issued
    together, the softmax of S running while P V does; ordered, one turn a tile (its two products),
    handed over as soon as they are issued, not done."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_M: gl.constexpr = q_buf.shape[2]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    HEAD_DIM: gl.constexpr = k_smem.shape[4]
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    m_i, l_i, acc, s_zero, rows = _initial_state(off, BLOCK_M, BLOCK_N, HEAD_DIM, s_layout, o_layout)
    mbarrier.wait(q_bar, phase=0)
    q = q_buf.reshape([BLOCK_M, HEAD_DIM])
    if OVERLAP:
        mbarrier.wait(k_ready.index(0), 0)
        _my_turn(turns, ROLE, 0, ORDERED)
        s_acc = warpgroup_mma(q, k_smem.index(0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), s_zero,
                              use_acc=False, is_async=True)
        _your_turn(turns, ROLE, ORDERED)
        s_acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_acc, ))
        p, alpha, m_i, l_i = _softmax_tile(s_acc, m_i, l_i, rows, 0, n_full, Tk, qk_scale, CAUSAL, k_smem.dtype,
                                           p_layout)
        for t in range(1, n_tiles):
            stage, prev = t % STAGES, (t - 1) % STAGES
            mbarrier.wait(k_ready.index(stage), (t // STAGES) & 1)
            mbarrier.wait(v_ready.index(prev), ((t - 1) // STAGES) & 1)
            _my_turn(turns, ROLE, t & 1, ORDERED)
            s_acc = warpgroup_mma(q, k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), s_zero,
                                  use_acc=False, is_async=True)
            acc = warpgroup_mma(p, v_smem.index(prev).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
            _your_turn(turns, ROLE, ORDERED)
            s_acc = warpgroup_mma_wait(num_outstanding=1, deps=(s_acc, ))  # S done; P V may still run
            p, alpha, m_i, l_i = _softmax_tile(s_acc, m_i, l_i, rows, t, n_full, Tk, qk_scale, CAUSAL, k_smem.dtype,
                                               p_layout)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            mbarrier.arrive(kv_empty.index(prev), count=1)  # tile t - 1's products are done with its slot
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, rows_o), 1)
        last = (n_tiles - 1) % STAGES
        mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
        _my_turn(turns, ROLE, n_tiles & 1, ORDERED)
        acc = warpgroup_mma(p, v_smem.index(last).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
        _your_turn(turns, ROLE, ORDERED)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(kv_empty.index(last), count=1)
    else:
        for t in range(n_tiles):
            stage = t % STAGES
            phase = (t // STAGES) & 1
            mbarrier.wait(k_ready.index(stage), phase)
            k = k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM])
            _my_turn(turns, ROLE, 0, ORDERED)
            s_acc = warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s_acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_acc, ))
            _your_turn(turns, ROLE, ORDERED)  # the other consumer's product runs during this softmax
            p, alpha, m_i, l_i = _softmax_tile(s_acc, m_i, l_i, rows, t, n_full, Tk, qk_scale, CAUSAL, k_smem.dtype,
                                               p_layout)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, rows_o), 1)
            mbarrier.wait(v_ready.index(stage), phase)
            _my_turn(turns, ROLE, 1, ORDERED)
            acc = warpgroup_mma(p, v_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            _your_turn(turns, ROLE, ORDERED)
            mbarrier.arrive(kv_empty.index(stage), count=1)  # both products of this tile are done with it
    return acc, m_i, l_i


@gluon.jit
def _ws_load(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_empty, b, h, hk, off_m,
             n_tiles):
    """The producer warp: Q, then the K/V tiles (``_fill_ring``); the consumer warpgroups run ``_consume``."""
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma_load(q_desc, [b, h, off_m, 0], q_bar, q_smem)
    _fill_ring(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, kv_empty, b, hk, n_tiles)


@gluon.jit
def attention_fwd_ws_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, H, GROUP, Tq, Tk, qk_scale,
                            CAUSAL: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """``attention_fwd_kernel`` warp-specialized: a producer warp (``_ws_load``, 24 registers) keeps
    the K/V ring full while the consumer warpgroups (the default partition, ``_consume``) multiply
    and exponentiate; the epilogue runs on the consumers once the partitions join."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    dtype: gl.constexpr = q_desc.dtype
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    off_m = pid_m * BLOCK_M
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)

    q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar, k_ready = _barriers(STAGES)
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(kv_empty.index(s), count=1)
    fence_async_shared()

    hi = gl.minimum(Tk, off_m + BLOCK_M) if CAUSAL else Tk
    n_tiles = gl.cdiv(hi, BLOCK_N)
    n_full = gl.minimum(Tk // BLOCK_N, (off_m + 1) // BLOCK_N) if CAUSAL else Tk // BLOCK_N
    acc, m_i, l_i = gl.warp_specialize([
        (_consume, (q_smem, q_bar, k_smem, v_smem, k_ready, v_ready, kv_empty, off_m, n_tiles, n_full, Tk, qk_scale,
                    CAUSAL, s_layout, o_layout, p_layout, kv_empty, 0, False, False)),
        (_ws_load, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_empty, b, h, hk,
                    off_m, n_tiles)),
    ], [1], [24])

    _retire(q_bar, k_ready, STAGES)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(v_ready.index(s))
        mbarrier.invalidate(kv_empty.index(s))
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    out = acc / gl.expand_dims(gl.convert_layout(l_i, rows_o), 1)
    q_smem.reshape([BLOCK_M, HEAD_DIM]).store(out.to(dtype))  # Q's buffer stages O
    fence_async_shared()
    tma_store(o_desc, [b, h, off_m, 0], q_smem)
    rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    gl.store(lse_ptr + bh * Tq + rows, (m_i + gl.log2(l_i)) / LOG2E_CONST, mask=rows < Tq)
    tma.store_wait(pendings=0)


@gluon.jit
def _pp_tiles(off, Tk, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """The K/V tiles query rows off ... off + BLOCK_M - 1 see (at least one: Tk > 0)."""
    hi = gl.minimum(Tk, off + BLOCK_M) if CAUSAL else Tk
    return gl.cdiv(hi, BLOCK_N)


@gluon.jit
def _pp_load(q_desc, k_desc, v_desc, o_desc, lse_ptr, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, kv_empty,
             turns, b, h, hk, bh, off_m, Tq, Tk, qk_scale, CAUSAL: gl.constexpr, ORDERED: gl.constexpr,
             OVERLAP: gl.constexpr):
    """The producer warp: both consumers' query tiles, then the K/V tiles the later one sees, each into
    the ring slot both consumers released."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    for r in gl.static_range(2):
        mbarrier.expect(q_bars.index(r), q_desc.block_type.nbytes)
        tma_load(q_desc, [b, h, off_m + r * BLOCK_M, 0], q_bars.index(r), q_smem.index(r))
    _fill_ring(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, kv_empty, b, hk,
               _pp_tiles(off_m + BLOCK_M, Tk, CAUSAL, BLOCK_M, BLOCK_N))


@gluon.jit
def _pp_consume(q_desc, k_desc, v_desc, o_desc, lse_ptr, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, kv_empty,
                turns, b, h, hk, bh, off_m, Tq, Tk, qk_scale, CAUSAL: gl.constexpr, ORDERED: gl.constexpr,
                OVERLAP: gl.constexpr, ROLE: gl.constexpr):
    """Consumer warpgroup ``ROLE`` (0 or 1): query rows off_m + ROLE * BLOCK_M ..., every product, the
    online softmax and its own epilogue (O through its Q buffer by TMA, lse). Tiles only the other
    consumer sees (causal) are handed back to the producer as they land. ``ORDERED``: the two
    take turns at the tensor cores (``_consume``), consumer 1 letting consumer 0 start; consumer 0 keeps
    taking its turns, without products, over the tiles it does not see. ``OVERLAP``: each consumer's
    loop overlapped (``_consume``)."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    off = off_m + ROLE * BLOCK_M
    n_mine = _pp_tiles(off, Tk, CAUSAL, BLOCK_M, BLOCK_N)
    n_all = _pp_tiles(off_m + BLOCK_M, Tk, CAUSAL, BLOCK_M, BLOCK_N)
    n_full = gl.minimum(Tk // BLOCK_N, (off + 1) // BLOCK_N) if CAUSAL else Tk // BLOCK_N

    q_buf = q_smem.index(ROLE)
    if ROLE == 1:
        _your_turn(turns, ROLE, ORDERED)  # consumer 0 goes first
    q_bar = q_bars.index(ROLE)
    acc, m_i, l_i = _consume(q_buf, q_bar, k_smem, v_smem, k_ready, v_ready, kv_empty, off, n_mine, n_full, Tk,
                             qk_scale, CAUSAL, s_layout, o_layout, p_layout, turns, ROLE, ORDERED, OVERLAP)
    for t in range(n_mine, n_all):  # (waiting for the tile to land keeps each arrival in its slot's phase)
        stage = t % STAGES
        mbarrier.wait(k_ready.index(stage), (t // STAGES) & 1)
        mbarrier.arrive(kv_empty.index(stage), count=1)
        # (only consumer 0 has tiles it does not see) the other's turns at them: one a tile overlapped, else two
        if OVERLAP:
            _my_turn(turns, ROLE, (t + 1) & 1, ORDERED)
            _your_turn(turns, ROLE, ORDERED)
        else:
            for product in gl.static_range(2):
                _my_turn(turns, ROLE, product, ORDERED)
                _your_turn(turns, ROLE, ORDERED)

    out = acc / gl.expand_dims(gl.convert_layout(l_i, rows_o), 1)
    q_buf.reshape([BLOCK_M, HEAD_DIM]).store(out.to(dtype))  # this consumer's Q buffer stages its O
    fence_async_shared()
    tma_store(o_desc, [b, h, off, 0], q_buf)  # rows past Tq are clipped by the descriptor
    rows = off + gl.arange(0, BLOCK_M, layout=rows_s)
    gl.store(lse_ptr + bh * Tq + rows, (m_i + gl.log2(l_i)) / LOG2E_CONST, mask=rows < Tq)
    tma.store_wait(pendings=0)


@gluon.jit
def _pp_consume0(q_desc, k_desc, v_desc, o_desc, lse_ptr, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready,
                 kv_empty, turns, b, h, hk, bh, off_m, Tq, Tk, qk_scale, CAUSAL: gl.constexpr,
                 ORDERED: gl.constexpr, OVERLAP: gl.constexpr):
    _pp_consume(q_desc, k_desc, v_desc, o_desc, lse_ptr, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, kv_empty,
                turns, b, h, hk, bh, off_m, Tq, Tk, qk_scale, CAUSAL, ORDERED, OVERLAP, 0)


@gluon.jit
def _pp_consume1(q_desc, k_desc, v_desc, o_desc, lse_ptr, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready,
                 kv_empty, turns, b, h, hk, bh, off_m, Tq, Tk, qk_scale, CAUSAL: gl.constexpr,
                 ORDERED: gl.constexpr, OVERLAP: gl.constexpr):
    _pp_consume(q_desc, k_desc, v_desc, o_desc, lse_ptr, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, kv_empty,
                turns, b, h, hk, bh, off_m, Tq, Tk, qk_scale, CAUSAL, ORDERED, OVERLAP, 1)


@gluon.jit
def attention_fwd_pp_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, H, GROUP, Tq, Tk, qk_scale,
                            CAUSAL: gl.constexpr, STAGES: gl.constexpr, ORDERED: gl.constexpr,
                            OVERLAP: gl.constexpr, num_warps: gl.constexpr):
    """FlashAttention-3's partitions: one CTA two query tiles of BLOCK_M (64) rows of one head, each
    its own consumer warpgroup (the default partition and a 4-warp worker), fed
    by a producer warp (24 registers) through a K/V ring whose slots both consumers release
    (``kv_empty`` counts two arrivals). ``ORDERED``: the two warpgroups take turns at the tensor cores,
    one's softmax during the other's product, as FlashAttention-3's ping-pong orders them (with named
    barriers there, mbarriers here); else the warp schedulers interleave them as they come. ``OVERLAP``:
    each consumer overlaps its softmax with its own previous P V (``_consume``)."""
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    dtype: gl.constexpr = q_desc.dtype
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    off_m = gl.program_id(0) * 2 * BLOCK_M

    q_smem = gl.allocate_shared_memory(dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for r in gl.static_range(2):
        mbarrier.init(q_bars.index(r), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(kv_empty.index(s), count=2)  # both consumers
    turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for r in gl.static_range(2):
        mbarrier.init(turn_bars.index(r), count=1)
    fence_async_shared()

    args = (q_desc, k_desc, v_desc, o_desc, lse_ptr, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, kv_empty,
            turn_bars, b, h, hk, bh, off_m, Tq, Tk, qk_scale, CAUSAL, ORDERED, OVERLAP)
    # registers per thread: the default partition takes 256 (Triton 3.6's choice, read in the PTX), so
    # the workers get 24 and 224: (256 + 224 + 24) x 128 threads = what 12 warps of 168 were given
    gl.warp_specialize([(_pp_consume0, args), (_pp_load, args), (_pp_consume1, args)], [1, 4], [24, 224])

    for r in gl.static_range(2):
        mbarrier.invalidate(q_bars.index(r))
        mbarrier.invalidate(turn_bars.index(r))
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(k_ready.index(s))
        mbarrier.invalidate(v_ready.index(s))
        mbarrier.invalidate(kv_empty.index(s))


@gluon.jit
def attention_bwd_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse_ptr, delta_ptr, dq_ptr,
                         H, GROUP, Tq, Tk, qk_scale, scale,
                         CAUSAL: gl.constexpr, STAGES: gl.constexpr, DQ: gl.constexpr, num_warps: gl.constexpr):
    """One CTA a tile of BLOCK_N keys of one kv head: dK and dV accumulated in registers over every
    query tile (and every query head of the group) that sees the keys; with ``DQ``, dQ's share of
    each added into a float32 dq with atomics (in an order that changes from run to run; without,
    ``attention_dq_kernel`` makes dQ, deterministically). Transposed scores, so that P^T and dS^T feed the products as
    register operands: S^T = K Q^T, P^T = exp2(S^T - lse), dV += P^T dO, dP^T = V dO^T,
    dS^T = P^T (dP^T - delta), dK += dS^T Q, dQ += dS K (dS^T through shared memory)."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    dtype: gl.constexpr = q_desc.dtype
    pid_n = gl.program_id(0)
    bhk = gl.program_id(1)
    HKV = H // GROUP
    b = bhk // HKV
    hk = bhk % HKV
    off_n = pid_n * BLOCK_N

    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, BLOCK_M, 16])  # (BLOCK_N, BLOCK_M)
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])  # dK, dV (BLOCK_N, D)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    keys_st: gl.constexpr = gl.SliceLayout(1, st_layout)
    queries_st: gl.constexpr = gl.SliceLayout(0, st_layout)

    k_smem = gl.allocate_shared_memory(dtype, k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, v_desc.block_type.shape, v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)
    kv_bar, q_bars = _barriers(STAGES)

    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma_load(k_desc, [b, hk, off_n, 0], kv_bar, k_smem)
    tma_load(v_desc, [b, hk, off_n, 0], kv_bar, v_smem)
    # the query tiles that see these keys: all, or (causal) from the one holding query off_n on
    first = (off_n // BLOCK_M) if CAUSAL else 0
    n_q = gl.cdiv(Tq, BLOCK_M) - first
    total = GROUP * gl.maximum(n_q, 0)  # (query head, query tile) pairs, in one ring
    q_bytes: gl.constexpr = q_desc.block_type.nbytes + do_desc.block_type.nbytes
    for t in gl.static_range(STAGES - 1):
        if t < total:
            h = hk * GROUP + t // n_q
            off_m = (first + t % n_q) * BLOCK_M
            mbarrier.expect(q_bars.index(t), q_bytes)
            tma_load(q_desc, [b, h, off_m, 0], q_bars.index(t), q_smem.index(t))
            tma_load(do_desc, [b, h, off_m, 0], q_bars.index(t), do_smem.index(t))

    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
    keys = off_n + gl.arange(0, BLOCK_N, layout=keys_st)
    mbarrier.wait(kv_bar, phase=0)
    k = k_smem.reshape([BLOCK_N, HEAD_DIM])
    v = v_smem.reshape([BLOCK_N, HEAD_DIM])
    # dQ's share (BLOCK_M, D): BLOCK_M = 64 rows over two warpgroups side by side
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, num_warps // 4],
                                                        instr_shape=[16, HEAD_DIM // (num_warps // 4), 16])
    dq_rows: gl.constexpr = gl.SliceLayout(1, dq_layout)
    dq_cols: gl.constexpr = gl.SliceLayout(0, dq_layout)

    for t in range(total):
        ahead = t + STAGES - 1
        if ahead < total:
            refill = ahead % STAGES
            h_ahead = hk * GROUP + ahead // n_q
            m_ahead = (first + ahead % n_q) * BLOCK_M
            mbarrier.expect(q_bars.index(refill), q_bytes)
            tma_load(q_desc, [b, h_ahead, m_ahead, 0], q_bars.index(refill), q_smem.index(refill))
            tma_load(do_desc, [b, h_ahead, m_ahead, 0], q_bars.index(refill), do_smem.index(refill))
        stage = t % STAGES
        h = hk * GROUP + t // n_q
        off_m = (first + t % n_q) * BLOCK_M
        mbarrier.wait(q_bars.index(stage), phase=(t // STAGES) & 1)
        q = q_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
        do = do_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])

        queries = off_m + gl.arange(0, BLOCK_M, layout=queries_st)
        row = (b * H + h) * Tq + queries
        lse = gl.load(lse_ptr + row, mask=queries < Tq, other=float("inf")) * LOG2E_CONST
        delta = gl.load(delta_ptr + row, mask=queries < Tq, other=0.0)

        st = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)
        st = warpgroup_mma(k, q.permute((1, 0)), st, use_acc=False, is_async=True)
        st = warpgroup_mma_wait(num_outstanding=0, deps=(st, ))
        hidden = gl.expand_dims(keys, 1) >= Tk
        if CAUSAL:
            hidden = hidden | (gl.expand_dims(keys, 1) > gl.expand_dims(queries, 0))
        pt = gl.where(hidden, 0.0, gl.exp2(st * qk_scale - gl.expand_dims(lse, 0)))  # (BLOCK_N, BLOCK_M)
        dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), a_layout), do, dv, is_async=True)
        dpt = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)
        dpt = warpgroup_mma(v, do.permute((1, 0)), dpt, use_acc=False, is_async=True)
        dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt, ))
        dst = (pt * (dpt - gl.expand_dims(delta, 0))).to(dtype)  # (BLOCK_N, BLOCK_M)
        dk = warpgroup_mma(gl.convert_layout(dst, a_layout), q, dk, is_async=True)
        if DQ:
            ds_smem.store(dst)
            fence_async_shared()
            dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=dq_layout)
            dq = warpgroup_mma(ds_smem.permute((1, 0)), k, dq, use_acc=False, is_async=True)
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ))  # (every product of this tile done)
        dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk, ))
        dv = warpgroup_mma_wait(num_outstanding=0, deps=(dv, ))
        if DQ:
            rows = off_m + gl.arange(0, BLOCK_M, layout=dq_rows)
            cols = gl.arange(0, HEAD_DIM, layout=dq_cols)
            where = dq_ptr + gl.expand_dims(((b * H + h) * Tq + rows) * HEAD_DIM, 1) + gl.expand_dims(cols, 0)
            gl.atomic_add(where, dq * scale, mask=gl.expand_dims(rows < Tq, 1), sem="relaxed")

    _retire(kv_bar, q_bars, STAGES)
    dk_smem = gl.allocate_shared_memory(dtype, dk_desc.block_type.shape, dk_desc.layout)
    dv_smem = gl.allocate_shared_memory(dtype, dv_desc.block_type.shape, dv_desc.layout)
    dk_smem.reshape([BLOCK_N, HEAD_DIM]).store((dk * scale).to(dtype))
    dv_smem.reshape([BLOCK_N, HEAD_DIM]).store(dv.to(dtype))
    fence_async_shared()
    tma_store(dk_desc, [b, hk, off_n, 0], dk_smem)  # keys past Tk are clipped by the descriptor
    tma_store(dv_desc, [b, hk, off_n, 0], dv_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def attention_dq_kernel(q_desc, k_desc, v_desc, do_desc, lse_ptr, delta_ptr, dq_ptr, H, GROUP, Tq, Tk, qk_scale,
                        scale, CAUSAL: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """The deterministic backward's dQ: one CTA a tile of BLOCK_M queries of one head, over the key
    tiles it sees (a K/V ring ``STAGES - 1`` tiles ahead): S = Q K^T, P = exp2(S - lse),
    dP = dO V^T, dS = P (dP - delta), dQ += dS K with dS from registers; each dQ row summed by one
    CTA in a fixed order. Recomputes S and dP, which the dK/dV kernel also computes (7 products in
    all against 5 with atomics)."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    dtype: gl.constexpr = q_desc.dtype
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    off_m = gl.program_id(0) * BLOCK_M
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])  # S, dP (BLOCK_M, BLOCK_N)
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    ds_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)

    q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, do_desc.block_type.shape, do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar, kv_bars = _barriers(STAGES)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
    tma_load(q_desc, [b, h, off_m, 0], q_bar, q_smem)
    tma_load(do_desc, [b, h, off_m, 0], q_bar, do_smem)
    n_tiles = gl.cdiv(gl.minimum(Tk, off_m + BLOCK_M) if CAUSAL else Tk, BLOCK_N)
    n_full = gl.minimum(Tk // BLOCK_N, (off_m + 1) // BLOCK_N) if CAUSAL else Tk // BLOCK_N
    for t in gl.static_range(STAGES - 1):
        if t < n_tiles:
            _load_kv(k_desc, v_desc, kv_bars.index(t), k_smem.index(t), v_smem.index(t), b, hk, t)

    rows = off_m + gl.arange(0, BLOCK_M, layout=rows_s)
    lse = gl.load(lse_ptr + bh * Tq + rows, mask=rows < Tq, other=float("inf")) * LOG2E_CONST
    delta = gl.load(delta_ptr + bh * Tq + rows, mask=rows < Tq, other=0.0)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=dq_layout)
    mbarrier.wait(q_bar, phase=0)
    q = q_smem.reshape([BLOCK_M, HEAD_DIM])
    do = do_smem.reshape([BLOCK_M, HEAD_DIM])
    for t in range(n_tiles):
        ahead = t + STAGES - 1  # into the buffers of tile t - 1, whose products are done
        if ahead < n_tiles:
            _load_kv(k_desc, v_desc, kv_bars.index(ahead % STAGES), k_smem.index(ahead % STAGES),
                     v_smem.index(ahead % STAGES), b, hk, ahead)
        stage = t % STAGES
        mbarrier.wait(kv_bars.index(stage), phase=(t // STAGES) & 1)
        k = k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM])
        v = v_smem.index(stage).reshape([BLOCK_N, HEAD_DIM])
        st = warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dp = warpgroup_mma(do, v.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st, ))
        scores = st * qk_scale
        if t >= n_full:  # the tiles with keys past Tk or, causal, past a row
            cols = gl.expand_dims(t * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)), 0)
            hidden = (cols >= Tk) | ((cols > gl.expand_dims(rows, 1)) & CAUSAL)
            scores = gl.where(hidden, float("-inf"), scores)
        p = gl.exp2(scores - gl.expand_dims(lse, 1))
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp, ))
        ds = gl.convert_layout((p * (dp - gl.expand_dims(delta, 1))).to(dtype), ds_layout)
        dq = warpgroup_mma(ds, k, dq, is_async=True)
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ))
    _retire(q_bar, kv_bars, STAGES)
    rows_dq = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, dq_layout))
    where = dq_ptr + gl.expand_dims((bh * Tq + rows_dq) * HEAD_DIM, 1) + gl.expand_dims(cols, 0)
    gl.store(where, dq * scale, mask=gl.expand_dims(rows_dq < Tq, 1))


def _descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A 4-D TMA descriptor of the (B, H, T, D) ``t`` with (1, 1, rows, D) blocks."""
    block = [1, 1, rows, t.shape[3]]
    dtype = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for(block, dtype)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


def attention_fwd(q, k, v, causal: bool, scale: float, block_m=128, block_n=128, overlap=True, num_warps=8,
                  compile_only=False, ws=False, pingpong=False, ordered=False, stages=2):
    """``(out (B, H, Tq, D), lse (B, H, Tq) float32)`` for bf16/fp16 q (B, H, Tq, D) and k, v (B, Hkv, Tk, D)
    whose last dim has stride 1 and other strides 16-byte multiples (TMA's rules), D 64 or 128. ``pingpong``
    with ``ordered``: the consumers take turns; with ``overlap``: each one's loop overlapped (``_consume``);
    ``stages``: its K/V ring's slots."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, H, Tq, dtype=torch.float32, device=q.device)
    if Tk == 0 or out.numel() == 0:  # no keys: out 0, lse -inf (the reference's answer)
        return out.zero_(), lse.fill_(float("-inf"))
    grid = (triton.cdiv(Tq, block_m), B * H)
    args = (_descriptor(q, block_m), _descriptor(k, block_n), _descriptor(v, block_n), _descriptor(out, block_m),
            lse, H, H // Hkv, Tq, Tk, scale * LOG2E)
    if pingpong:  # two 64-row consumer warpgroups and the producer's: 12 warps
        grid = (triton.cdiv(Tq, 2 * 64), B * H)
        args = (_descriptor(q, 64), args[1], args[2], _descriptor(out, 64), *args[4:])
        kernel, options = attention_fwd_pp_kernel, dict(CAUSAL=causal, STAGES=stages, ORDERED=ordered, OVERLAP=overlap,
                                                        num_warps=4,
                                                        maxnreg=65536 // (12 * 32) // 8 * 8)
    elif ws:  # the producer warp's warpgroup joins: registers per thread <= 65536 / ((num_warps + 4) * 32)
        kernel, options = attention_fwd_ws_kernel, dict(CAUSAL=causal, STAGES=2, num_warps=num_warps,
                                                        maxnreg=65536 // ((num_warps + 4) * 32) // 8 * 8)
    else:
        kernel, options = attention_fwd_kernel, dict(CAUSAL=causal, STAGES=3 if overlap else 2, OVERLAP=overlap,
                                                     num_warps=num_warps)
    if compile_only:  # (inside _launch.compiling_only: compiled for sm_90a by a driver with no GPU)
        return kernel.warmup(*args, grid=grid, **options)
    kernel[grid](*args, **options)
    return out, lse


def attention_bwd(dout, q, k, v, out, lse, causal: bool, scale: float, block_m=64, block_n=128, stages=2,
                  num_warps=8, compile_only=False, deterministic=False):
    """``(dq, dk, dv)`` of ``attention_fwd``'s output for ``dout`` (B, H, Tq, D), under the same rules;
    delta = rowsum(dout * out) and dq's float32 sums are made by torch here. ``deterministic``: dQ by
    ``attention_dq_kernel`` (the same bits every run) instead of atomics."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    dq = torch.zeros(B, H, Tq, D, dtype=torch.float32, device=q.device)
    if Tq == 0 or Tk == 0 or dk.numel() == 0:  # no scores: every gradient 0
        return dq.to(q.dtype), dk.zero_(), dv.zero_()
    delta = (dout.float() * out.float()).sum(-1)  # (B, H, Tq)
    grid = (triton.cdiv(Tk, block_n), B * Hkv)
    args = (_descriptor(q, block_m), _descriptor(k, block_n), _descriptor(v, block_n), _descriptor(dout, block_m),
            _descriptor(dk, block_n), _descriptor(dv, block_n), lse, delta, dq, H, H // Hkv, Tq, Tk,
            scale * LOG2E, scale)
    options = dict(CAUSAL=causal, STAGES=stages, DQ=not deterministic, num_warps=num_warps)
    dq_grid = (triton.cdiv(Tq, 64), B * H)
    dq_args = (_descriptor(q, 64), _descriptor(k, 64), _descriptor(v, 64), _descriptor(dout, 64), lse, delta, dq, H,
               H // Hkv, Tq, Tk, scale * LOG2E, scale)
    dq_options = dict(CAUSAL=causal, STAGES=2, num_warps=4)
    if compile_only:
        compiled = attention_bwd_kernel.warmup(*args, grid=grid, **options)
        return (compiled, attention_dq_kernel.warmup(*dq_args, grid=dq_grid, **dq_options)) if deterministic \
            else compiled
    attention_bwd_kernel[grid](*args, **options)
    if deterministic:
        attention_dq_kernel[dq_grid](*dq_args, **dq_options)
    return dq.to(q.dtype), dk, dv


VARIANTS = [dict(D=d, causal=c, dtype=dt) for d in (64, 128) for c in (False, True)
            for dt in (torch.bfloat16, torch.float16)]
# the forward's schedules: (OVERLAP, keys per tile). 128 keys: one CTA per SM (224 KiB of shared memory
# overlapped, 160 KiB not); 64 keys and no overlap: 96 KiB, two CTAs per SM, whose softmax and products
# the warp schedulers interleave.
# "ws": warp-specialized (a producer warp, ``attention_fwd_ws_kernel``), two K/V stages.
# "pingpong": two consumer warpgroups of 64 query rows each and a producer warp (``attention_fwd_pp_kernel``);
# "pingpong-ordered": the same, the consumers taking turns at the tensor cores; "pingpong-overlap": each
# consumer's S of a tile issued with its P V of the one before; "pingpong-fa3": both (FlashAttention-3's);
# a "-s3" suffix: three K/V slots (the next tile's load need not wait for this tile's P V).
# With 128 keys the overlapped ping-pongs spill (ptxas holds the partitions to about the kernel's 168
# registers, whatever setmaxnreg gives the consumers: 332-364 bytes, about 40 local loads and stores
# a tile in one consumer's loop under Nsight Compute; both consumers as workers at 240 registers, the
# producer the default partition at 24: 436 bytes); with 64 keys none spills.
FORWARDS = [("plain", 128), ("overlap", 128), ("plain", 64), ("overlap", 64), ("ws", 128), ("ws", 64),
            ("pingpong", 128), ("pingpong", 64), ("pingpong-ordered", 128), ("pingpong-ordered", 64),
            ("pingpong-overlap", 128), ("pingpong-fa3", 128), ("pingpong-s3", 128), ("pingpong-overlap-s3", 128),
            ("pingpong-fa3-s3", 128), ("pingpong-overlap", 64), ("pingpong-fa3", 64), ("pingpong-overlap-s3", 64),
            ("pingpong-fa3-s3", 64)]


def forward(schedule: str, block_n: int, *args, **kwargs):
    """``attention_fwd`` with one of ``FORWARDS``' schedules."""
    base = schedule.removesuffix("-s3")  # "-s3": three K/V slots
    fa3 = base == "pingpong-fa3"
    return attention_fwd(*args, overlap=base in ("overlap", "pingpong-overlap") or fa3, ws=base == "ws",
                         pingpong=base.startswith("pingpong"), ordered=base == "pingpong-ordered" or fa3,
                         stages=3 if schedule.endswith("-s3") else 2, block_n=block_n, **kwargs)


def compile_all() -> list:
    """Every variant compiled for sm_90a, with no GPU: the compiled kernels."""
    compiled = []
    with _launch.compiling_only():
        for var in VARIANTS:
            q = torch.zeros(2, 4, 200, var["D"], dtype=var["dtype"])
            kv = torch.zeros(2, 2, 200, var["D"], dtype=var["dtype"])
            for schedule, block_n in FORWARDS:
                compiled.append(forward(schedule, block_n, q, kv, kv, var["causal"], var["D"] ** -0.5,
                                        compile_only=True))
            lse = torch.zeros(2, 4, 200)
            compiled.append(attention_bwd(q, q, kv, kv, q, lse, var["causal"], var["D"] ** -0.5, compile_only=True))
            compiled.extend(attention_bwd(q, q, kv, kv, q, lse, var["causal"], var["D"] ** -0.5, compile_only=True,
                                          deterministic=True))
    return compiled


def check_and_time(out_path: str, check: bool = True, forwards=FORWARDS, variants=VARIANTS,
                   lengths=(1024, 2048, 4096, 8192, 16384), deterministic: bool = True) -> None:
    from kcourse import blas
    from kcourse.blas.python.attention import attention as reference, attention_backward as reference_backward
    started = time.perf_counter()
    out_file = open(out_path, "w")

    def log(line: str) -> None:  # each line as it comes (with the seconds since the start): a cut run keeps them
        line = f"[{time.perf_counter() - started:5.0f} s] {line}"
        print(line, flush=True)
        out_file.write(line + "\n")
        out_file.flush()

    log(torch.cuda.get_device_name())
    gen = torch.Generator(device="cuda").manual_seed(0)
    for var in variants if check else ():
        for B, H, Hkv, Tq, Tk in ((2, 4, 4, 197, 197), (1, 8, 2, 300, 300), (2, 2, 1, 64, 64)):
            D, dtype = var["D"], var["dtype"]
            q = torch.randn(B, H, Tq, D, device="cuda", dtype=dtype, generator=gen)
            k, v = (torch.randn(B, Hkv, Tk, D, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
            dout = torch.randn(B, H, Tq, D, device="cuda", dtype=dtype, generator=gen)
            ref, cache = reference(q.double(), k.double(), v.double(), None, var["causal"], D ** -0.5)
            ref_grads = reference_backward(dout.double(), cache, (True, True, True), var["causal"], D ** -0.5)
            for schedule, block_n in forwards:
                out, lse = forward(schedule, block_n, q, k, v, var["causal"], D ** -0.5)
                grads = attention_bwd(dout, q, k, v, out, lse, var["causal"], D ** -0.5)
                errors = [(out.double() - ref).abs().max().item(), (lse.double() - cache[4]).abs().max().item()]
                errors += [(g.double() - r).abs().max().item() for g, r in zip(grads, ref_grads)]
                log(f"{var} {schedule} keys/tile={block_n} B={B} H={H} Hkv={Hkv} T={Tq}: largest "
                             "error against the reference: " + ", ".join(f"{n} {e:.3g}" for n, e in
                                                                        zip(("out", "lse", "dq", "dk", "dv"), errors)))
            if not deterministic:
                continue
            # the deterministic backward: the same errors, and the same bits on a second run
            out, lse = forward("plain", 128, q, k, v, var["causal"], D ** -0.5)
            runs = [attention_bwd(dout, q, k, v, out, lse, var["causal"], D ** -0.5, deterministic=True)
                    for _ in range(2)]
            errors = [(g.double() - r).abs().max().item() for g, r in zip(runs[0], ref_grads)]
            same = all(torch.equal(a, b) for a, b in zip(*runs))
            log(f"{var} deterministic backward B={B} H={H} Hkv={Hkv} T={Tq}: largest error against the "
                         "reference: " + ", ".join(f"{n} {e:.3g}" for n, e in zip(("dq", "dk", "dv"), errors))
                         + f"; two runs bitwise equal: {same}")
    for T in lengths:
        for causal in (False, True):
            B, H, D = max(1, 16384 // T), 16, 128
            q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
            times = {}
            sdpa = torch.nn.functional.scaled_dot_product_attention
            gluon = [(f"gluon {sched} {n}", lambda sched=sched, n=n: forward(sched, n, q, k, v, causal, D ** -0.5))
                     for sched, n in forwards]
            for name, fn in (*gluon, ("sdpa", lambda: sdpa(q, k, v, is_causal=causal)),
                             ("triton tl", lambda: blas.attention(q, k, v, causal=causal, backend="triton"))):
                fn()
                torch.cuda.synchronize()
                ms = []
                for _ in range(20):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    fn()
                    end.record()
                    end.synchronize()
                    ms.append(start.elapsed_time(end))
                times[name] = statistics.median(ms)
            flops = 4 * B * H * T * T * D / (2 if causal else 1)
            log(f"T={T} causal={causal}: " + ", ".join(
                f"{n} {t:.3f} ms ({flops / t / 1e9:.0f} TFLOP/s)" for n, t in times.items())
                + "; speed against sdpa: " + ", ".join(f"{n} {times['sdpa'] / times[n]:.2f}" for n, _ in gluon))
    out_file.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?")
    p.add_argument("--compile-only", action="store_true")
    p.add_argument("--time-only", action="store_true", help="skip the checks against the reference")
    p.add_argument("--schedules", help="only these of FORWARDS' schedules (comma-separated names)")
    p.add_argument("--quick", action="store_true",
                   help="checks of bf16 at D = 128 alone, no deterministic backward; times at T = 2k, 8k, 16k")
    args = p.parse_args()
    if args.compile_only or not torch.cuda.is_available():
        kernels = compile_all()
        print(f"{len(kernels)} kernels ({len(FORWARDS)} forwards and two backwards of {len(VARIANTS)} variants) "
              f"compiled for sm_90a with Triton {triton.__version__}")
        return
    forwards = [f for f in FORWARDS if args.schedules is None or f[0] in args.schedules.split(",")]
    quick = dict(variants=[v for v in VARIANTS if v["D"] == 128 and v["dtype"] == torch.bfloat16],
                 lengths=(2048, 8192, 16384), deterministic=False) if args.quick else {}
    check_and_time(args.out or "gluon_attention.txt", check=not args.time_only, forwards=forwards, **quick)


if __name__ == "__main__":
    main()
