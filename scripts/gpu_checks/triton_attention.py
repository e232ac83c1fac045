"""GPU check and tuning sweep of the triton flash attention (kcourse/blas/triton/attention.py).

    PYTHONPATH=. python scripts/gpu_checks/triton_attention.py             # everything, ~5 min on an H100
    PYTHONPATH=. python scripts/gpu_checks/triton_attention.py --quick     # correctness only (1, 3)
    PYTHONPATH=. python scripts/gpu_checks/triton_attention.py --speed     # speed only (2)
    PYTHONPATH=. python scripts/gpu_checks/triton_attention.py --budget 240

1. Correctness at small shapes (causal and not, grouped-query heads, odd T, Tq != Tk, D 16..128,
   (B, T, H, D) and strided views, T = 1, a negative scale, float16/bfloat16/float32) with one
   pinned config per kernel (the first its autotuner would try: no autotuning, so it is quick):
   out, lse, dq, dk, dv against attention computed by torch on upcast inputs (float32; float64 for
   float32 inputs; softmax(scale q k^T) v written out, as SDPA's math backend takes sqrt(scale)),
   the same through kcourse.blas.attention and autograd, and a second backward, bit for bit.
2. Speed, bfloat16: the GPT shape (B=8 H=8 T=1024 D=64 causal), then B=4 H=16 D=128 at T = 4096,
   16384, 1024, causal and not. Per shape: SDPA (F.scaled_dot_product_attention, default backends;
   then pinned to its flash (FlashAttention-2) and cuDNN backends, to show which the default is);
   ours, whose first call autotunes the forward, dQ and dK/dV kernels (the sweep: every config's
   median, the chosen one marked *). Then milliseconds, TFLOP/s and SDPA's time / ours ("1.00x" =
   as fast), forward and backward through autograd as a model runs them: do_bench medians, and for
   the small shapes also medians of CUDA-graph replays (device time without the host's launch
   overhead); and the largest difference of our out, dq, dk, dv from SDPA's (a miscompiled config
   is O(1) off). FLOPs as FlashAttention counts them: 4 B H T^2 D forward, 2.5 times that
   backward, halved when causal.
3. Every config of every kernel, pinned in turn, bfloat16, at B=4 H=16 T=1024 D=128 causal and not
   and at the GPT shape, against the reference of 1: a config that miscompiles shows here, whether
   or not an autotuner picked it (the kernels are those 2 compiled).

A result passes when every element is within atol + rtol |ref| (the test suite's tolerances,
tests/_util.py; gradients with atol sqrt(16) times larger) or when its largest error is at most
twice that of SDPA run in the input dtype (FlashAttention's own test). Nothing stops at a failure;
every error is printed. --budget bounds the run: no shape of 2 starts after budget - 60 s, no
check of 3 after budget, and a watchdog ends the run (printing where it was) 100 s after it,
should a kernel hang. To adopt a winner, edit the config lists at the top of
kcourse/blas/triton/attention.py.
"""
from __future__ import annotations

import argparse
import faulthandler
import math
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench, do_bench_cudagraph

sys.path.insert(0, os.environ.get("KCOURSE_ROOT", os.getcwd()))
import kcourse  # noqa: E402
from kcourse.blas.triton import attention as A  # noqa: E402

DEV = "cuda"
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2)}
GRAD_K = 16
KERNELS = {"fwd": A.attention_fwd_kernel, "dq": A.attention_dq_kernel, "dkdv": A.attention_dkdv_kernel}
TABLES = {"fwd": A.FWD_CONFIGS, "dq": A.DQ_CONFIGS, "dkdv": A.DKDV_CONFIGS}
OWN = {name: list(kernel.configs) for name, kernel in KERNELS.items()}  # the autotuners' lists
results = {"PASS": 0, "FAIL": 0}
START = time.time()

# (B, H, Hkv, Tq, Tk, D, dtype, causal, layout, scale or None for D^-1/2)
CASES = [
    (2, 4, 4, 257, 257, 64, torch.bfloat16, True, "contiguous", None),  # odd T, several tiles
    (2, 4, 4, 257, 257, 64, torch.float16, False, "contiguous", None),
    (1, 8, 2, 300, 300, 128, torch.bfloat16, True, "bthd", None),  # grouped-query, a (B, T, H, D) view
    (1, 8, 1, 300, 300, 128, torch.float16, False, "bthd", None),  # multi-query
    (1, 4, 2, 100, 333, 128, torch.bfloat16, True, "contiguous", None),  # Tq < Tk
    (1, 4, 2, 333, 100, 64, torch.float16, True, "contiguous", None),  # Tq > Tk
    (1, 4, 4, 77, 91, 80, torch.bfloat16, True, "contiguous", None),  # padded head dim
    (1, 4, 4, 77, 91, 80, torch.bfloat16, False, "strided", None),  # stride 2 along D
    (1, 4, 2, 50, 61, 16, torch.float16, False, "contiguous", None),
    (1, 2, 2, 1, 1, 128, torch.bfloat16, True, "contiguous", None),  # one token
    (2, 4, 2, 200, 200, 64, torch.bfloat16, True, "contiguous", -0.2),  # negative scale
    (2, 4, 2, 129, 95, 64, torch.float32, True, "contiguous", None),
    (1, 4, 4, 100, 100, 128, torch.float32, False, "bthd", None),
]


def heads(B, H, T, D, dtype, layout):
    if layout == "bthd":
        return torch.randn(B, T, H, D, dtype=dtype, device=DEV).transpose(1, 2)
    if layout == "strided":
        return torch.randn(B, H, T, 2 * D, dtype=dtype, device=DEV)[..., ::2]
    return torch.randn(B, H, T, D, dtype=dtype, device=DEV)


def pin(name, config):
    if config is not None:
        KERNELS[name].configs = [config]
        KERNELS[name].cache.clear()


def unpin_all():
    for name, kernel in KERNELS.items():
        kernel.configs = OWN[name]
        kernel.cache.clear()


def first_config(name, q, Tk):
    """The first config the kernel's autotuner would try for these inputs (its prune applied)."""
    table = TABLES[name][64 if max(16, triton.next_power_of_2(q.shape[-1])) <= 64 else 128]
    return A.tiles_that_fit(table, {"Q": q, "Tq": q.shape[2], "Tk": Tk})[0]


def describe(config):
    kw = config.kwargs
    return f"{kw['BLOCK_M']}x{kw['BLOCK_N']} w{config.num_warps} s{config.num_stages}"


def reference(q, k, v, dout, causal, scale):
    """out, lse, (dq, dk, dv) of softmax(scale q k^T) v on upcast inputs (float64 for float32 inputs,
    else float32), written out: SDPA's math backend scales q and k by sqrt(scale), NaN for scale < 0."""
    wide = torch.float64 if q.dtype == torch.float32 else torch.float32
    inputs = [t.detach().to(wide).requires_grad_() for t in (q, k, v)]
    group = q.shape[1] // k.shape[1]
    s = scale * inputs[0] @ inputs[1].repeat_interleave(group, 1).mT
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=DEV).triu(1), float("-inf"))
    out = torch.softmax(s, -1) @ inputs[2].repeat_interleave(group, 1)
    grads = torch.autograd.grad(out, inputs, dout.to(wide))
    return out.detach(), torch.logsumexp(s.detach(), -1), grads


def sdpa_same_dtype(q, k, v, dout, causal, scale):
    """SDPA in the inputs' own dtype: out and (dq, dk, dv), the yardstick of FlashAttention's test."""
    inputs = [t.detach().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*inputs, is_causal=causal, scale=scale, enable_gqa=True)
    return out.detach(), torch.autograd.grad(out, inputs, dout)


def compare(name, actual, expected, tol, k=1, own=None):
    """(ok, text): within atol sqrt(k) + rtol |expected|, or at most twice SDPA's own error ``own``."""
    rtol, atol = tol
    a, e = actual.double(), expected.double()
    err = (a - e).abs()
    finite = bool(torch.isfinite(a).all())
    ok = finite and bool((err <= atol * math.sqrt(k) + rtol * e.abs()).all())
    text = f"{name} {err.max().item():.1e}"
    if own is not None:
        own_err = (own.double() - e).abs().max().item()
        ok = ok or (finite and err.max().item() <= 2 * own_err)
        text += f"/{own_err:.0e}"
    return ok, text


def report(label, checks):
    ok = all(c[0] for c in checks)
    results["PASS" if ok else "FAIL"] += 1
    print(f"{'PASS' if ok else 'FAIL'} {label}  " + "  ".join(c[1] for c in checks), flush=True)


def check_case(B, H, Hkv, Tq, Tk, D, dtype, causal, layout, scale):
    """Section 1: one case, one pinned config per kernel."""
    scale = D ** -0.5 if scale is None else scale
    q = heads(B, H, Tq, D, dtype, layout)
    k, v = heads(B, Hkv, Tk, D, dtype, layout), heads(B, Hkv, Tk, D, dtype, layout)
    dout = torch.randn(B, H, Tq, D, dtype=dtype, device=DEV)
    out_e, lse_e, grads_e = reference(q, k, v, dout, causal, scale)
    own_out, own_grads = None, (None,) * 3  # float32: no SDPA of the same dtype to measure against
    if dtype != torch.float32:
        own_out, own_grads = sdpa_same_dtype(q, k, v, dout, causal, scale)
    tol = TOL[dtype]
    for name in KERNELS:
        pin(name, first_config(name, q, Tk))
    label = (f"{str(dtype)[6:]:<8} B{B} H{H}/{Hkv} Tq{Tq} Tk{Tk} D{D} {'causal' if causal else 'full':<6} {layout:<10} "
             f"scale {scale:+.3f} fwd {describe(KERNELS['fwd'].configs[0])}")
    try:
        out, cache = A.attention(q, k, v, causal, scale)
        grads = A.attention_backward(dout, cache, (True, True, True), causal, scale)
        checks = [compare("out", out, out_e, tol, own=own_out), compare("lse", cache[4], lse_e, TOL[torch.float32], 4)]
        checks += [compare(n, g, g_e, tol, GRAD_K, own)
                   for n, g, g_e, own in zip(("dq", "dk", "dv"), grads, grads_e, own_grads)]
        again = A.attention_backward(dout, cache, (True, True, True), causal, scale)
        same = all(torch.equal(a, b) for a, b in zip(grads, again))
        checks.append((same, "deterministic" if same else "bwd NOT DETERMINISTIC"))
        inputs = [t.detach().requires_grad_() for t in (q, k, v)]
        out_api = kcourse.blas.attention(*inputs, causal=causal, scale=scale, backend="triton")
        grads_api = torch.autograd.grad(out_api, inputs, dout)
        same = torch.equal(out_api, out) and all(torch.equal(a, b) for a, b in zip(grads_api, grads))
        checks.append((same, "api same" if same else "api DIFFERS"))
        report(label, checks)
    except Exception:
        results["FAIL"] += 1
        print(f"FAIL {label} raised:")
        traceback.print_exc()


def check_configs(names, B, H, T, D, causal):
    """Section 3: every config of the kernels ``names``, pinned in turn, at one bfloat16 shape."""
    dtype, scale = torch.bfloat16, D ** -0.5
    q, k, v, dout = (torch.randn(B, H, T, D, dtype=dtype, device=DEV) for _ in range(4))
    out_e, lse_e, grads_e = reference(q, k, v, dout, causal, scale)
    own_out, own_grads = sdpa_same_dtype(q, k, v, dout, causal, scale)
    tol = TOL[dtype]
    for name in KERNELS:
        pin(name, first_config(name, q, T))
    where = f"B{B} H{H} T{T} D{D} {'causal' if causal else 'full':<6}"
    for name in names:
        for config in TABLES[name][64 if D <= 64 else 128]:
            pin(name, config)
            label = f"{where} {name:<7} {describe(config):<18}"
            try:
                out, cache = A.attention(q, k, v, causal, scale)
                checks = [compare("out", out, out_e, tol, own=own_out),
                          compare("lse", cache[4], lse_e, TOL[torch.float32], 4)]
                if name in ("dq", "dkdv"):
                    grads = A.attention_backward(dout, cache, (True, True, True), causal, scale)
                    checks += [compare(("dq", "dk", "dv")[i], grads[i], grads_e[i], tol, GRAD_K, own_grads[i])
                               for i in ((0,) if name == "dq" else (1, 2))]
                report(label, checks)
            except Exception:
                results["FAIL"] += 1
                print(f"FAIL {label} raised:")
                traceback.print_exc()
        pin(name, first_config(name, q, T))


def sweep_lines(name):
    """The autotuner's median of each config in its last tuning, best first (the winner is *)."""
    timings = getattr(KERNELS[name], "configs_timings", None) or {}
    rows = sorted(((t[0] if isinstance(t, (list, tuple)) else t), describe(c)) for c, t in timings.items())
    if not rows:
        return [f"    {name:<7} (no tuning: one config)"]
    best = rows[0][0]
    return [f"    {name:<7} {'*' if i == 0 else ' '} {d:<18} {ms:8.3f} ms  x{ms / best:5.2f}" if math.isfinite(ms)
            else f"    {name:<7}   {d:<18} failed to compile or run" for i, (ms, d) in enumerate(rows)]


def _bench(fn, graph=False):
    """Median milliseconds: do_bench (as benchmarks/run.py: host time included where it dominates),
    or with ``graph`` the calls replayed from a CUDA graph (device time; NaN if capture fails)."""
    if not graph:
        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    try:
        return do_bench_cudagraph(fn, rep=100, return_mode="median")
    except Exception as e:
        print(f"    (CUDA graph timing failed: {type(e).__name__}: {str(e)[:100]})")
        return float("nan")


def speed_row(what, flops, fwd, bwd, sdpa):
    """One line: forward (and backward) ms, TFLOP/s and the fraction of SDPA's, eager then graph."""
    line = f"  {what:<11}"
    for name, times, ref, work in (("fwd", fwd, sdpa[0], flops), ("bwd", bwd, sdpa[1], 2.5 * flops)):
        for t, t_ref, how in zip(times, ref, ("", " graph")):
            if math.isfinite(t):
                line += f"  {name}{how} {t:7.3f} ms {work / t / 1e9:5.0f} TFLOP/s {t_ref / t:4.2f}x"
    print(line, flush=True)


def where_of(B, H, T, D, causal):
    return f"B={B} H={H} T={T} D={D} {'causal' if causal else 'full'}"


def timings(forward, inputs, dout, graph, backward=True):
    """((forward ms, ...), (backward ms, ...)) through autograd as a model runs them: eager, then
    from a CUDA graph where ``graph`` (the forward only); the backward's tuple is empty without ``backward``."""
    out = forward()
    grad = lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True)  # noqa: E731
    ways = (False, True) if graph else (False,)  # backward: eager only (capturing autograd.grad of
    # SDPA fails, and a failed capture can leave the CUDA generator unusable for the next shape)
    return tuple(_bench(forward, g) for g in ways), (_bench(grad),) if backward else ()


def speed(B, H, T, D, causal):
    """Section 2 at one bfloat16 shape: SDPA, then ours (autotuning the forward, dQ and dK/dV
    kernels: their sweeps), checked against SDPA's results (a config that miscompiles is far off:
    O(1) not O(1e-2)). Shapes under 2 ms of SDPA forward + backward are also timed from CUDA graphs."""
    scale, where = D ** -0.5, where_of(B, H, T, D, causal)
    flops = 4 * B * H * T * T * D / (2 if causal else 1)
    print(f"\n{where}", flush=True)
    torch.manual_seed(T + D)
    q, k, v, dout = (torch.randn(B, H, T, D, dtype=torch.bfloat16, device=DEV) for _ in range(4))
    inputs = [t.detach().requires_grad_() for t in (q, k, v)]
    sdpa = lambda: F.scaled_dot_product_attention(*inputs, is_causal=causal, scale=scale)  # noqa: E731
    ours = lambda: kcourse.blas.attention(*inputs, causal=causal, scale=scale, backend="triton")  # noqa: E731
    try:
        eager = timings(sdpa, inputs, dout, graph=False)
        graph = eager[0][0] + eager[1][0] < 2.0
        ref = timings(sdpa, inputs, dout, graph) if graph else eager
        out_s = sdpa()
        grads_s = torch.autograd.grad(out_s, inputs, dout)
        speed_row("sdpa", flops, *ref, ref)
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):  # which one is the default?
            try:
                with sdpa_kernel([backend]):
                    speed_row(f"  {backend.name.split('_')[0].lower()}", flops, *timings(sdpa, inputs, dout, graph), ref)
            except Exception as e:  # noqa: BLE001
                print(f"    sdpa {backend.name}: {type(e).__name__}: {str(e)[:80]}")
        out = ours()  # autotunes the forward
        grads = torch.autograd.grad(out, inputs, dout)  # autotunes dQ and dK/dV
        lines = sweep_lines("fwd") + sweep_lines("dq") + sweep_lines("dkdv")
        diffs = f"largest |ours - SDPA's|: out {(out.float() - out_s.float()).abs().max().item():.1e}"
        diffs += "".join(f", {n} {(g.float() - g_s.float()).abs().max().item():.1e}"
                         for n, g, g_s in zip(("dq", "dk", "dv"), grads, grads_s))
        fwd, bwd = timings(ours, inputs, dout, graph)
        print("\n".join(lines) + f"\n    {diffs}")
        speed_row("triton", flops, fwd, bwd, ref)
    except Exception:
        print(f"  {where}: raised")
        traceback.print_exc()


SHAPES = [(8, 8, 1024, 64, True)] + [(4, 16, T, 128, c) for T in (4096, 16384, 1024) for c in (False, True)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="correctness only (sections 1, 3)")
    parser.add_argument("--speed", action="store_true", help="speed only (section 2)")
    parser.add_argument("--budget", type=float, default=300,
                        help="seconds: no shape of 2 starts after budget - 60, no config check of 3 after budget")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.budget + 100, exit=True)  # a hung kernel ends the run, not the call
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print("\n1. correctness, one pinned config per kernel (errors: ours/SDPA's own in the input dtype)")
    for case in CASES if not args.speed else []:
        check_case(*case)
    unpin_all()
    if not args.quick:
        print(f"({time.time() - START:.0f} s)\n\n2. speed, bfloat16: each kernel's autotuning (config medians, "
              "* = chosen), then through autograd: ms, TFLOP/s, SDPA's time / ours")
        for shape in SHAPES:
            if time.time() - START > args.budget - 60:
                print(f"\nskipped {where_of(*shape)}: past {args.budget - 60:.0f} s")
            else:
                speed(*shape)
    print(f"({time.time() - START:.0f} s)\n\n3. every config of every kernel, pinned, bfloat16")
    for names, shape in [(("fwd", "dq", "dkdv"), (4, 16, 1024, 128, c)) for c in (False, True)] + \
            [(("fwd", "dq", "dkdv"), (8, 8, 1024, 64, True))]:
        if time.time() - START > args.budget or args.speed:
            print(f"skipped {where_of(*shape)}: past the {args.budget:.0f} s budget or --speed")
        else:
            check_configs(names, *shape)
    print(f"\ndone in {time.time() - START:.0f} s; {results['PASS']} passed, {results['FAIL']} failed")
    sys.exit(1 if results["FAIL"] else 0)


if __name__ == "__main__":
    main()
