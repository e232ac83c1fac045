"""Experiment: a first Gluon attention forward for Hopper (issue "The triton backend's attention at
cuDNN's speed on Hopper, written in Gluon"): TMA loads of Q and a ring of K/V tiles, async
``warpgroup_mma`` for S = Q K^T and O += P V, the online softmax in registers between them. Not yet
warp-specialized (one partition: the K/V loads run ``STAGES - 1`` tiles ahead of the products).

    python -m benchmarks.experiments.gluon_attention --compile-only    # any machine: builds for sm_90a
    python -m benchmarks.experiments.gluon_attention OUT.txt            # a Hopper GPU: checks and times

On a GPU: out and lse against the python reference (causal and not, grouped-query, head dims 64 and
128, odd T), then forward milliseconds against ``F.scaled_dot_product_attention`` and the triton
backend's ``tl`` kernel at T = 1k ... 16k. Without a GPU (``--compile-only``) each variant is compiled
for sm_90a through ``kcourse.blas.triton._launch.compiling_only``, with Triton 3.6 and 3.9 alike.

    S  = scale Q K^T (in log2 units: times log2 e)      masked: key j >= Tk, or j > i (causal, top-left)
    m' = max(m, rowmax S)    P = exp2(S - m')    l' = l exp2(m - m') + rowsum P    O' = O exp2(m - m') + P V
    out = O / l              lse = (m + log2 l) ln 2
"""
import argparse
import statistics

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
def attention_fwd_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, H, GROUP, Tq, Tk, qk_scale,
                         CAUSAL: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    dtype: gl.constexpr = q_desc.dtype
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
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(kv_bars.index(s), count=1)
    fence_async_shared()

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma_load(q_desc, [b, h, off_m, 0], q_bar, q_smem)
    # the keys this tile sees: all Tk, or (causal) up to its last query row
    hi = gl.minimum(Tk, off_m + BLOCK_M) if CAUSAL else Tk
    n_tiles = gl.cdiv(hi, BLOCK_N)
    kv_bytes: gl.constexpr = k_desc.block_type.nbytes + v_desc.block_type.nbytes
    for t in gl.static_range(STAGES - 1):  # the ring's first tiles
        if t < n_tiles:
            mbarrier.expect(kv_bars.index(t), kv_bytes)
            tma_load(k_desc, [b, hk, t * BLOCK_N, 0], kv_bars.index(t), k_smem.index(t))
            tma_load(v_desc, [b, hk, t * BLOCK_N, 0], kv_bars.index(t), v_smem.index(t))

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=rows_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=rows_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    rows = off_m + gl.arange(0, BLOCK_M, layout=rows_s)
    mbarrier.wait(q_bar, phase=0)
    q = q_smem.reshape([BLOCK_M, HEAD_DIM])

    for t in range(n_tiles):
        ahead = t + STAGES - 1  # into the stage the previous tile used (its products are done): loads
        if ahead < n_tiles:     # run STAGES - 1 tiles ahead of the products
            refill = ahead % STAGES
            mbarrier.expect(kv_bars.index(refill), kv_bytes)
            tma_load(k_desc, [b, hk, ahead * BLOCK_N, 0], kv_bars.index(refill), k_smem.index(refill))
            tma_load(v_desc, [b, hk, ahead * BLOCK_N, 0], kv_bars.index(refill), v_smem.index(refill))
        stage = t % STAGES
        mbarrier.wait(kv_bars.index(stage), phase=(t // STAGES) & 1)
        k = k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM])
        v = v_smem.index(stage).reshape([BLOCK_N, HEAD_DIM])
        s_acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        s_acc = warpgroup_mma(q, k.permute((1, 0)), s_acc, use_acc=False, is_async=True)
        s_acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_acc, ))

        cols = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=cols_s)
        hidden = gl.expand_dims(cols, 0) >= Tk
        if CAUSAL:
            hidden = hidden | (gl.expand_dims(cols, 0) > gl.expand_dims(rows, 1))
        scores = gl.where(hidden, float("-inf"), s_acc * qk_scale)
        m_new = gl.maximum(m_i, gl.max(scores, axis=1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(scores - gl.expand_dims(m_new, 1))
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, rows_o), 1)
        acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), v, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))


    mbarrier.invalidate(q_bar)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(kv_bars.index(s))
    out = acc / gl.expand_dims(gl.convert_layout(l_i, rows_o), 1)
    o_smem = gl.allocate_shared_memory(dtype, o_desc.block_type.shape, o_desc.layout)
    o_smem.reshape([BLOCK_M, HEAD_DIM]).store(out.to(dtype))
    fence_async_shared()
    tma_store(o_desc, [b, h, off_m, 0], o_smem)  # rows past Tq are clipped by the descriptor
    lse = (m_i + gl.log2(l_i)) / LOG2E_CONST
    gl.store(lse_ptr + bh * Tq + rows, lse, mask=rows < Tq)
    tma.store_wait(pendings=0)



def _descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A 4-D TMA descriptor of the (B, H, T, D) ``t`` with (1, 1, rows, D) blocks."""
    block = [1, 1, rows, t.shape[3]]
    dtype = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for(block, dtype)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


def attention_fwd(q, k, v, causal: bool, scale: float, block_m=128, block_n=128, stages=2, num_warps=8,
                  compile_only=False):
    """``(out (B, H, Tq, D), lse (B, H, Tq) float32)`` for bf16/fp16 q (B, H, Tq, D) and k, v (B, Hkv, Tk, D)
    whose last dim has stride 1 and other strides 16-byte multiples (TMA's rules), D 64 or 128."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, H, Tq, dtype=torch.float32, device=q.device)
    if Tk == 0 or out.numel() == 0:  # no keys: out 0, lse -inf (the reference's answer)
        return out.zero_(), lse.fill_(float("-inf"))
    grid = (triton.cdiv(Tq, block_m), B * H)
    args = (_descriptor(q, block_m), _descriptor(k, block_n), _descriptor(v, block_n), _descriptor(out, block_m),
            lse, H, H // Hkv, Tq, Tk, scale * LOG2E)
    options = dict(CAUSAL=causal, STAGES=stages, num_warps=num_warps)
    if compile_only:  # (inside _launch.compiling_only: compiled for sm_90a by a driver with no GPU)
        return attention_fwd_kernel.warmup(*args, grid=grid, **options)
    attention_fwd_kernel[grid](*args, **options)
    return out, lse


VARIANTS = [dict(D=d, causal=c, dtype=dt) for d in (64, 128) for c in (False, True)
            for dt in (torch.bfloat16, torch.float16)]


def compile_all() -> list:
    """Every variant compiled for sm_90a, with no GPU: the compiled kernels."""
    compiled = []
    with _launch.compiling_only():
        for var in VARIANTS:
            q = torch.zeros(2, 4, 200, var["D"], dtype=var["dtype"])
            kv = torch.zeros(2, 2, 200, var["D"], dtype=var["dtype"])
            compiled.append(attention_fwd(q, kv, kv, var["causal"], var["D"] ** -0.5, compile_only=True))
    return compiled


def check_and_time(out_path: str) -> None:
    from kcourse import blas
    from kcourse.blas.python.attention import attention as reference
    lines = [torch.cuda.get_device_name()]
    gen = torch.Generator(device="cuda").manual_seed(0)
    for var in VARIANTS:
        for B, H, Hkv, Tq, Tk in ((2, 4, 4, 197, 197), (1, 8, 2, 300, 300), (2, 2, 1, 64, 64)):
            D, dtype = var["D"], var["dtype"]
            q = torch.randn(B, H, Tq, D, device="cuda", dtype=dtype, generator=gen)
            k, v = (torch.randn(B, Hkv, Tk, D, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
            out, lse = attention_fwd(q, k, v, var["causal"], D ** -0.5)
            ref, cache = reference(q.double(), k.double(), v.double(), var["causal"], D ** -0.5)
            err, lse_err = (out.double() - ref).abs().max().item(), (lse.double() - cache[4]).abs().max().item()
            lines.append(f"{var} B={B} H={H} Hkv={Hkv} T={Tq}: max |out - reference| {err:.3g}, "
                         f"max |lse - reference| {lse_err:.3g}")
    for T in (1024, 2048, 4096, 8192, 16384):
        for causal in (False, True):
            B, H, D = max(1, 16384 // T), 16, 128
            q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
            times = {}
            sdpa = torch.nn.functional.scaled_dot_product_attention
            for name, fn in (("gluon", lambda: attention_fwd(q, k, v, causal, D ** -0.5)),
                             ("sdpa", lambda: sdpa(q, k, v, is_causal=causal)),
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
            lines.append(f"T={T} causal={causal}: " + ", ".join(
                f"{n} {t:.3f} ms ({flops / t / 1e9:.0f} TFLOP/s)" for n, t in times.items())
                + f"; gluon / sdpa speed {times['sdpa'] / times['gluon']:.2f}")
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?")
    p.add_argument("--compile-only", action="store_true")
    args = p.parse_args()
    if args.compile_only or not torch.cuda.is_available():
        kernels = compile_all()
        print(f"{len(kernels)} variants compiled for sm_90a with Triton {triton.__version__}")
        return
    check_and_time(args.out or "gluon_attention.txt")


if __name__ == "__main__":
    main()
