"""GPU self-check of the cute flash attention (kcourse/blas/cute/attention.py): forward and backward
against torch's scaled_dot_product_attention, then its speed.

    PYTHONPATH=. python scripts/gpu_checks/attention.py            # checks, then the timings
    PYTHONPATH=. python scripts/gpu_checks/attention.py --quick    # checks only
    PYTHONPATH=. python scripts/gpu_checks/attention.py --bench-only

Each case runs the cute kernels (``attention`` and ``attention_backward`` of the cute backend, called
directly, and once through ``kcourse.blas.attention`` with autograd) and compares out, dq, dk, dv with
``F.scaled_dot_product_attention(is_causal, scale, enable_gqa=True)`` computed in float32 from the
upcast inputs (float64 for float32 inputs), and lse with its float64 logsumexp. It prints the max
absolute error of each, and PASS when every element is within atol + rtol |ref| (the test suite's
tolerances, tests/_util.py: gradients with sqrt(16) times the atol; float32 cases marked tf32 run
with ``torch.backends.cuda.matmul.allow_tf32``, one TF32 product per MMA, at float16-like tolerances
TOL_TF32); it never stops at a failure.
Without a GPU every case is compiled only.

Then B = 4, H = 16, T = 4096, D = 128 in bfloat16, causal and not: milliseconds and TFLOP/s of the
cute forward and backward next to SDPA's (the FLOPs counted as FlashAttention does: 4 B H T^2 D
forward, 2.5 times that backward, halved under the causal mask; the cute backward recomputes S and
dP in both of its kernels, so it does 1.4 times the counted work).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.environ.get("KCOURSE_ROOT", os.getcwd()))
import kcourse  # noqa: E402
from kcourse.blas.cute import _compile  # noqa: E402
from kcourse.blas.cute.attention import attention, attention_backward  # noqa: E402

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2)}
TOL_TF32 = (4e-3, 2e-3)  # allow_tf32: one TF32 product, operands rounded to 11 bits as float16's
GRAD_K = 16  # the tests' gradient tolerance: atol * sqrt(GRAD_K)
results = {"PASS": 0, "FAIL": 0, "COMPILED": 0}

# (B, H, Hkv, Tq, Tk, D, dtype, causal, layout[, tf32: run with torch.backends.cuda.matmul.allow_tf32])
CASES = [
    (1, 2, 2, 1, 1, 64, torch.bfloat16, False, "contiguous"),  # one token
    (1, 2, 2, 1, 1, 128, torch.float16, True, "contiguous"),
    (2, 4, 4, 257, 257, 64, torch.bfloat16, True, "contiguous"),  # odd T, several tiles
    (2, 4, 4, 257, 257, 64, torch.float16, False, "contiguous"),
    (1, 8, 2, 300, 300, 128, torch.bfloat16, True, "bthd"),  # grouped-query heads, a (B, T, H, D) view
    (1, 8, 1, 300, 300, 128, torch.float16, False, "bthd"),  # multi-query
    (1, 4, 2, 100, 333, 128, torch.bfloat16, True, "contiguous"),  # Tq < Tk
    (1, 4, 2, 333, 100, 64, torch.float16, True, "contiguous"),  # Tq > Tk
    (1, 4, 4, 77, 91, 80, torch.bfloat16, True, "strided"),  # padded head dim, a copied view
    (1, 4, 2, 50, 61, 16, torch.float16, False, "contiguous"),
    (1, 4, 2, 70, 70, 48, torch.float16, True, "misaligned"),  # 4-byte vectors
    (2, 4, 2, 129, 95, 64, torch.float32, True, "contiguous"),  # 3xTF32
    (1, 4, 4, 100, 100, 128, torch.float32, False, "bthd"),
    (1, 2, 1, 70, 19, 32, torch.float32, False, "misaligned"),
    (1, 4, 4, 77, 91, 80, torch.float32, True, "strided"),  # Dp = 96: the 64 x 16 dK/dV tile
    (1, 8, 2, 300, 300, 128, torch.float32, True, "bthd"),  # grouped-query heads, several tiles
    (1, 4, 1, 37, 70, 16, torch.float32, False, "contiguous"),  # multi-query, Tq < Tk
    (1, 4, 2, 100, 333, 64, torch.float32, False, "contiguous", True),  # one TF32 product per MMA
    (1, 4, 2, 77, 91, 128, torch.float32, True, "bthd", True),
]


def heads(B, H, T, D, dtype, layout):
    if layout == "bthd":
        return torch.randn(B, T, H, D, dtype=dtype, device=DEV).transpose(1, 2)
    if layout == "strided":
        return torch.randn(B, H, T, 2 * D, dtype=dtype, device=DEV)[..., ::2]
    if layout == "misaligned":
        skip = 4 // torch.empty(0, dtype=dtype).element_size()
        return torch.randn(B * H * T * D + skip, dtype=dtype, device=DEV)[skip:].view(B, H, T, D)
    return torch.randn(B, H, T, D, dtype=dtype, device=DEV)


def reference(q, k, v, dout, causal, scale):
    """out, lse, (dq, dk, dv) from SDPA on upcast inputs (float64 for float32 inputs, else float32)."""
    wide = torch.float64 if q.dtype == torch.float32 else torch.float32
    inputs = [t.detach().to(wide).requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*inputs, is_causal=causal, scale=scale, enable_gqa=True)
    grads = torch.autograd.grad(out, inputs, dout.to(wide))
    group = q.shape[1] // k.shape[1]
    s = scale * inputs[0].detach().double() @ inputs[1].detach().double().repeat_interleave(group, 1).mT
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return out.detach(), torch.logsumexp(s, -1), grads


def compare(name, actual, expected, tol, k=1):
    rtol, atol = tol
    atol *= math.sqrt(k)
    a, e = actual.double(), expected.double()
    err = (a - e).abs()
    ok = bool(torch.isfinite(a).all()) and bool((err <= atol + rtol * e.abs()).all())
    return ok, f"{name} {err.max().item():.2e}"


def check(B, H, Hkv, Tq, Tk, D, dtype, causal, layout, tf32=False):
    label = f"{str(dtype)[6:]:<8} B{B} H{H}/{Hkv} Tq{Tq} Tk{Tk} D{D} {'causal' if causal else 'full':<6} {layout:<10}"
    label += " tf32" if tf32 else ""
    tol, lse_tol = (TOL_TF32, TOL_TF32) if tf32 else (TOL[dtype], TOL[torch.float32])
    scale = D ** -0.5
    allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32  # the cute kernels pick their float32 math mode from it
    try:
        q = heads(B, H, Tq, D, dtype, layout)
        k, v = heads(B, Hkv, Tk, D, dtype, layout), heads(B, Hkv, Tk, D, dtype, layout)
        dout = torch.randn(B, H, Tq, D, dtype=dtype, device=DEV)
        if not GPU:
            with _compile.compiling_only():
                out, cache = attention(q, k, v, causal, scale)
                attention_backward(dout, cache, (True, True, True), causal, scale)
            results["COMPILED"] += 1
            print(f"COMPILED {label}")
            return
        out, cache = attention(q, k, v, causal, scale)
        grads = attention_backward(dout, cache, (True, True, True), causal, scale)
        out_e, lse_e, grads_e = reference(q, k, v, dout, causal, scale)
        checks = [compare("out", out, out_e, tol), compare("lse", cache[4], lse_e, lse_tol, k=4)]
        checks += [compare(n, g, g_e, tol, GRAD_K) for n, g, g_e in zip(("dq", "dk", "dv"), grads, grads_e)]
        # the same through the public op and autograd (validation, dispatch, Primitive, a contiguous dout)
        inputs = [t.detach().requires_grad_() for t in (q, k, v)]
        out_api = kcourse.blas.attention(*inputs, causal=causal, backend="cute")
        grads_api = torch.autograd.grad(out_api, inputs, dout)
        # dq may differ in its last bits: the Hopper backward sums it with float32 atomics, in an order
        # that varies from run to run; bit for bit for everything else, dq within one ulp of max |dq|
        same = torch.equal(out_api, out) and all(torch.equal(a, b) for a, b in zip(grads_api[1:], grads[1:]))
        dq_drift = (grads_api[0].float() - grads[0].float()).abs().max().item()
        same = same and dq_drift <= torch.finfo(dtype).eps * grads[0].float().abs().max().item()
        checks.append((same, "api " + ("same" if same else "DIFFERS") + (f" (dq {dq_drift:.0e})" if dq_drift else "")))
        ok = all(c[0] for c in checks)
        results["PASS" if ok else "FAIL"] += 1
        print(f"{'PASS' if ok else 'FAIL'} {label} " + "  ".join(c[1] for c in checks))
    except Exception:
        results["FAIL"] += 1
        print(f"FAIL {label} raised:")
        traceback.print_exc()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32


def timed(fn, reps=10):
    """Milliseconds per call (median of reps after two warm-ups)."""
    fn(), fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def bench(B=4, H=16, T=4096, D=128, dtype=torch.bfloat16):
    print(f"\ntimings: B={B} H={H} T={T} D={D} {str(dtype)[6:]}  (TFLOP/s as FlashAttention counts them)")
    scale = D ** -0.5
    for causal in (False, True):
        q, k, v, dout = (torch.randn(B, H, T, D, dtype=dtype, device=DEV) for _ in range(4))
        flops = 4 * B * H * T * T * D / (2 if causal else 1)
        try:
            out, cache = attention(q, k, v, causal, scale)
            t_fwd = timed(lambda: attention(q, k, v, causal, scale))
            t_bwd = timed(lambda: attention_backward(dout, cache, (True, True, True), causal, scale))
            qs = [t.detach().requires_grad_() for t in (q, k, v)]
            t_sdpa_fwd = timed(lambda: F.scaled_dot_product_attention(*qs, is_causal=causal, scale=scale))
            out_s = F.scaled_dot_product_attention(*qs, is_causal=causal, scale=scale)
            t_sdpa_bwd = timed(lambda: torch.autograd.grad(out_s, qs, dout, retain_graph=True))
            for what, t, t_ref, f in (("fwd", t_fwd, t_sdpa_fwd, flops), ("bwd", t_bwd, t_sdpa_bwd, 2.5 * flops)):
                print(f"  {'causal' if causal else 'full':<6} {what}: cute {t:7.3f} ms {f / t / 1e9:6.1f} TFLOP/s   "
                      f"sdpa {t_ref:7.3f} ms {f / t_ref / 1e9:6.1f} TFLOP/s   cute/sdpa time {t / t_ref:5.2f}")
        except Exception:
            print(f"  {'causal' if causal else 'full'}: raised")
            traceback.print_exc()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="checks only, no timings")
    parser.add_argument("--bench-only", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    start = time.time()
    print(f"device: {torch.cuda.get_device_name() if GPU else 'none (compile only)'}; target {_compile.target()}")
    if not args.bench_only:
        for case in CASES:
            check(*case)
    compile_seconds = sum(_compile.COMPILE_SECONDS.values())
    print(f"\n{results['PASS']} passed, {results['FAIL']} failed, {results['COMPILED']} compiled only "
          f"({time.time() - start:.0f} s, {compile_seconds:.0f} s of it compiling)")
    if GPU and not args.quick:
        bench()
    sys.exit(1 if results["FAIL"] else 0)


if __name__ == "__main__":
    main()
