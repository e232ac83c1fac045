"""Experiment: the triton attention backward as one dK/dV kernel that also adds dQ = dS K into a float32
buffer with atomics (5 products instead of 7), against the current two kernels and SDPA (issue 3; not
adopted: benchmarks/results/2026-11-22-cute-attention-bwd/triton-atomic-dq-experiment-h100.log).

    python benchmarks/experiments/triton_attention_atomic_dq.py      # on a CUDA GPU, from the repository root
"""
import torch, triton, triton.language as tl, torch.nn.functional as F
from kcourse.blas.triton import attention as TA
from kcourse.blas.triton.attention import _load_rows, _store_rows, LOG2E

def bench(fn, n=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); return ts[len(ts) // 2]

@triton.jit
def _tiles(dk, dv, k, v, Q, DO, LSE, DELTA, DQA, stride_qt, stride_qd, cols, Tq, qk_scale, lo, hi,
           HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, MASK: tl.constexpr, DESC: tl.constexpr):
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        q = _load_rows(Q, rows, Tq, stride_qt, stride_qd, HEAD_DIM, BLOCK_D, False, True)
        do = _load_rows(DO, rows, Tq, HEAD_DIM, 1, HEAD_DIM, BLOCK_D, False, True)
        lse = tl.load(LSE + rows, mask=rows < Tq, other=float("inf")) * LOG2E
        delta = tl.load(DELTA + rows, mask=rows < Tq, other=0.0)
        s_t = tl.dot(k, tl.trans(q))
        p_t = tl.math.exp2(s_t * qk_scale - lse[None, :])
        if MASK:
            p_t = tl.where(rows[None, :] >= cols[:, None], p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
        dk = tl.dot(ds_t, q, dk)
        dq = tl.dot(tl.trans(ds_t), k)  # (BLOCK_M, BLOCK_D) float32
        d = tl.arange(0, BLOCK_D)
        tl.atomic_add(DQA + rows[:, None] * BLOCK_D + d[None, :], dq, mask=rows[:, None] < Tq, sem="relaxed")
    return dk, dv

@triton.jit
def fused_bwd(Q, K, V, DO, LSE, DELTA, DQA, DK, DV, sqb, sqh, sqt, sqd, skb, skh, skt, skd,
              svb, svh, svt, svd, GROUP, Tq, Tk, qk_scale, sm_scale,
              CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, DESC: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    hk, b = tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    Hkv = tl.num_programs(1)
    cols = start_n + tl.arange(0, BLOCK_N)
    k = _load_rows(K + b * skb + hk * skh, cols, Tk, skt, skd, HEAD_DIM, BLOCK_D, False, True)
    v = _load_rows(V + b * svb + hk * svh, cols, Tk, svt, svd, HEAD_DIM, BLOCK_D, False, True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    if CAUSAL:
        lo = start_n // BLOCK_M * BLOCK_M
        mid = tl.minimum(tl.cdiv(start_n + BLOCK_N, BLOCK_M) * BLOCK_M, Tq)
    else:
        lo = 0
        mid = 0
    for g in range(GROUP):
        h = hk * GROUP + g
        row0 = (b * Hkv * GROUP + h) * Tq
        args = (Q + b * sqb + h * sqh, DO + row0 * HEAD_DIM, LSE + row0, DELTA + row0, DQA + row0 * BLOCK_D, sqt, sqd, cols, Tq, qk_scale)
        dk, dv = _tiles(dk, dv, k, v, *args, lo, mid, HEAD_DIM, BLOCK_D, BLOCK_M, True, DESC)
        dk, dv = _tiles(dk, dv, k, v, *args, mid, Tq, HEAD_DIM, BLOCK_D, BLOCK_M, False, DESC)
    out = (b * Hkv + hk) * Tk * HEAD_DIM
    _store_rows(DK + out, dk * sm_scale, cols, Tk, HEAD_DIM, 1, HEAD_DIM, BLOCK_D)
    _store_rows(DV + out, dv, cols, Tk, HEAD_DIM, 1, HEAD_DIM, BLOCK_D)

@triton.jit
def dq_convert(DQA, DQ, n, sm_scale, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(DQA + i, mask=i < n)
    tl.store(DQ + i, (x * sm_scale).to(DQ.dtype.element_ty), mask=i < n)

def backward(q, k, v, out, do, lse, causal, scale, BM, BN, warps, stages):
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    delta = torch.empty_like(lse)
    TA.attention_delta_kernel[(triton.cdiv(Tq, 64), H, B)](out, do, delta, *out.stride(), Tq, HEAD_DIM=D, BLOCK_D=D, BLOCK_M=64)
    dqa = torch.zeros(B * H * Tq * D, device=q.device, dtype=torch.float32)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    fused_bwd[(triton.cdiv(Tk, BN), Hkv, B)](q, k, v, do, lse, delta, dqa, dk, dv, *q.stride(), *k.stride(), *v.stride(),
        H // Hkv, Tq, Tk, scale * LOG2E.value, scale, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=D, BLOCK_M=BM, BLOCK_N=BN,
        DESC=False, num_warps=warps, num_stages=stages)
    dq = torch.empty_like(q)
    dq_convert[(triton.cdiv(dqa.numel(), 1024),)](dqa, dq, dqa.numel(), scale, BLOCK=1024)
    return dq, dk, dv

if __name__ == "__main__":
    dev = "cuda"
    torch.manual_seed(0)
    cfgs = [(64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2), (64, 128, 4, 2)]
    # correctness
    for (B, H, Hkv, T, D, causal) in [(2, 4, 2, 300, 128, True), (2, 4, 4, 257, 64, False)]:
        q = torch.randn(B, H, T, D, device=dev, dtype=torch.bfloat16); k, v = (torch.randn(B, Hkv, T, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
        do = torch.randn_like(q)
        out, (q_, k_, v_, o_, lse) = TA.attention(q, k, v, causal, D ** -0.5)
        ref = TA.attention_backward(do, (q_, k_, v_, o_, lse), (True,) * 3, causal, D ** -0.5)
        for c in cfgs:
            try:
                g = backward(q, k, v, out, do, lse, causal, D ** -0.5, *c)
                err = [((a.float() - b.float()).abs().max() / b.float().abs().max()).item() for a, b in zip(g, ref)]
                print("check", (B, H, Hkv, T, D, causal), c, ["%.1e" % e for e in err], flush=True)
            except Exception as e:
                print("check", c, "raised", str(e)[:200], flush=True)
    print("backward ms (bf16, H=16, B*T=16384)", flush=True)
    for D in (128,):
        for T in (1024, 2048, 4096, 8192, 16384):
            for causal in (False, True):
                B = 16384 // T
                q, k, v, do = (torch.randn(B, 16, T, D, device=dev, dtype=torch.bfloat16) for _ in range(4))
                scale = D ** -0.5
                flop = 2.5 * 4 * B * 16 * T * T * D / (2 if causal else 1)
                qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
                o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, scale=scale)
                row = {"sdpa": bench(lambda: torch.autograd.grad(o, (qq, kk, vv), do, retain_graph=True), n=10)}
                out, cache = TA.attention(q, k, v, causal, scale)
                row["triton"] = bench(lambda: TA.attention_backward(do, cache, (True,) * 3, causal, scale), n=10)
                for c in cfgs:
                    try:
                        row[str(c)] = bench(lambda: backward(q, k, v, out, do, cache[4], causal, scale, *c), n=10)
                    except Exception as e:
                        print(c, "raised", str(e)[:100])
                txt = "  ".join(f"{k_}: {row['sdpa'] / ms:.2f}" for k_, ms in row.items())
                print(f"D{D} T{T} causal={causal}: sdpa {flop / row['sdpa'] / 1e9:.0f} TF; {txt}", flush=True)
