"""GPU self-check of the cute gemm (kcourse/blas/cute/gemm.py): both paths, every dtype, every layout.

    python scripts/gpu_checks/gemm.py            # on a GPU: compare against float64 torch.matmul
    python scripts/gpu_checks/gemm.py --huge     # also a product whose A has more than 2^31 elements
    python scripts/gpu_checks/gemm.py --bench    # also time the general kernel against torch.matmul

Each case prints PASS/FAIL, the path gemm() took (sm90 or general), the max error and the
tolerance. A case gemm() sends to sm90 is run a second time through the general kernel directly
(its aligned, vectorized variants are exercised too). Without a GPU every case is compiled only
(no compares): the script then checks that every kernel it would launch builds.

Tolerance, element by element: |out - ref| <= 4 * (eps_out + sqrt(k) * eps_mul) * bound + tiny, where
bound = |alpha| (|A| @ |B|) + |beta| |C|, eps_out is the output dtype's rounding and eps_mul the
products' (float32: 2^-24; TF32: 2^-11).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.environ.get("KCOURSE_ROOT", os.getcwd()))
from kcourse.blas.cute import _compile  # noqa: E402
from kcourse.blas.cute._gemm_general import gemm_general  # noqa: E402
from kcourse.blas.cute._gemm_sm90 import supports as sm90_supports  # noqa: E402
from kcourse.blas.cute.gemm import gemm  # noqa: E402

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
EPS = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
results = {"PASS": 0, "FAIL": 0, "COMPILED": 0}


def operand(rows, cols, dtype, layout, batch=None):
    """A (batch?, rows, cols) tensor: n row-major, t transposed view, s column-sliced (stride 2),
    m misaligned base (x[1:]), mt misaligned and transposed, 0 a 2-D matrix expanded over the batch."""
    lead = () if batch is None else (batch,)
    if layout == "n":
        return torch.randn(*lead, rows, cols, dtype=dtype, device=DEV)
    if layout == "t":
        return torch.randn(*lead, cols, rows, dtype=dtype, device=DEV).mT
    if layout == "s":
        return torch.randn(*lead, rows, 2 * cols, dtype=dtype, device=DEV)[..., ::2]
    if layout in ("m", "mt"):
        shape = (*lead, rows, cols) if layout == "m" else (*lead, cols, rows)
        flat = torch.randn(math.prod(shape) + 1, dtype=dtype, device=DEV)[1:]
        t = flat.view(shape)
        return t if layout == "m" else t.mT
    if layout == "0":
        return torch.randn(rows, cols, dtype=dtype, device=DEV).expand(batch, rows, cols)
    raise ValueError(layout)


def reference(A, B, C, alpha, beta):
    ref = alpha * (A.double() @ B.double())
    bound = abs(alpha) * (A.double().abs() @ B.double().abs())
    if C is not None:
        ref = ref + beta * C.double()
        bound = bound + abs(beta) * C.double().abs()
    return ref, bound


def check(name, A, B, C, alpha, beta, *, out=None, tf32=False, direct_general=False):
    """Run one case: out <- alpha A B + beta C (C None means beta == 0: never read)."""
    label = f"{name:<58}"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        batched = A.dim() == 3 or B.dim() == 3
        if out is None:
            shape = ((A.shape[0] if A.dim() == 3 else B.shape[0]),) if batched else ()
            out = torch.empty(*shape, A.shape[-2], B.shape[-1], dtype=A.dtype, device=DEV)
        ref_C = None if C is None else C.clone()  # out may be C (in place): keep the original
        A3, B3, C3, O3 = (t if t is None or t.dim() == 3 else t[None] for t in (A, B, C, out))
        path = "sm90" if sm90_supports(A3, B3, C3, O3) else "general"
        if direct_general:
            path = "general (forced)"
            run = lambda: gemm_general(A3, B3, C3, alpha, beta, O3)
        else:
            run = lambda: gemm(A, B, C, alpha, beta, out)
        if not GPU:
            with _compile.compiling_only():
                run()
            results["COMPILED"] += 1
            print(f"COMPILED {label} {path}")
            return
        run()
        torch.cuda.synchronize()
        ref, bound = reference(A, B, ref_C, alpha, beta)
        k = A.shape[-1]
        eps_mul = 2.0**-11 if tf32 and A.dtype == torch.float32 else 2.0**-24
        tol = 4 * (EPS[A.dtype] + math.sqrt(max(k, 1)) * eps_mul) * bound + 1e-30
        err = (out.double() - ref).abs()
        ok = bool(torch.isfinite(out).all()) and bool((err <= tol).all())
        worst = (err / tol).max().item() if err.numel() else 0.0
        results["PASS" if ok else "FAIL"] += 1
        print(f"{'PASS' if ok else 'FAIL'}     {label} {path:<16} max err {err.max().item() if err.numel() else 0:.3e}"
              f"  (worst err/tol {worst:.3f})")
    except Exception as e:  # one case's failure must not hide the others
        results["FAIL"] += 1
        print(f"FAIL     {label} raised {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
        if os.environ.get("VERBOSE"):
            traceback.print_exc()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def cases(dtype, tf32=False):
    d = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}[dtype] + ("/tf32" if tf32 else "")
    for (m, k, n) in [(1, 1, 1), (7, 5, 3), (257, 129, 72), (1000, 1001, 999), (128, 256, 64), (64, 72, 136)]:
        for la, lb in [("n", "n"), ("t", "t"), ("n", "t"), ("t", "n"), ("s", "s"), ("m", "mt"), ("mt", "m")]:
            if (m, k, n) == (1000, 1001, 999) and la + lb not in ("nn", "tt", "mmt"):
                continue  # the big shape: three layouts are enough
            A, B = operand(m, k, dtype, la), operand(k, n, dtype, lb)
            C = operand(m, n, dtype, "t")
            name = f"{d} {m}x{k}x{n} A:{la} B:{lb}"
            check(f"{name} beta=0.5", A, B, C, 1.5, 0.5, tf32=tf32)
            if sm90_supports(A[None], B[None], C[None], C[None]):  # the general kernel's aligned variants too
                check(f"{name} beta=0.5", A, B, C, 1.5, 0.5, tf32=tf32, direct_general=True)
            if la + lb == "nn":
                check(f"{name} beta=1 alpha=-1", A, B, C, -1.0, 1.0, tf32=tf32)
                check(f"{name} beta=0 (C None)", A, B, None, 2.0, 0.0, tf32=tf32)
    # batch 3, with a stride-0 (shared) operand on either side, bias row C (strides (0, 0, 1))
    for la, lb in [("n", "0"), ("0", "t"), ("t", "n")]:
        A, B = operand(33, 40, dtype, la, batch=3), operand(40, 17, dtype, lb, batch=3)
        bias = torch.randn(17, dtype=dtype, device=DEV).expand(3, 33, 17)
        check(f"{d} batch 3 A:{la} B:{lb} bias C", A, B, bias, 1.0, 1.0, tf32=tf32)
        check(f"{d} batch 3 A:{la} B:{lb} beta=0", A, B, None, 1.0, 0.0, tf32=tf32)
    A, B = operand(256, 128, dtype, "n", batch=3), operand(128, 192, dtype, "0", batch=3)
    check(f"{d} batch 3 aligned, B shared", A, B, None, 1.0, 0.0, tf32=tf32)
    # bias column / bias row on 2-D products
    A, B = operand(65, 40, dtype, "n"), operand(40, 33, dtype, "t")
    check(f"{d} bias row C (0, 1)", A, B, torch.randn(33, dtype=dtype, device=DEV).expand(65, 33), 1.0, 1.0, tf32=tf32)
    check(f"{d} bias column C (1, 0)", A, B, torch.randn(65, 1, dtype=dtype, device=DEV).expand(65, 33), 1.0, 1.0,
          tf32=tf32)
    # in place: out is C
    for la in ("n", "t"):
        A, B = operand(65, 40, dtype, la), operand(40, 33, dtype, la)
        C = operand(65, 33, dtype, la)
        check(f"{d} in place (out is C) A,B,C:{la}", A, B, C, 0.5, -1.5, out=C, tf32=tf32)
    A, B = operand(256, 128, dtype, "n"), operand(128, 256, dtype, "n")
    C = operand(256, 256, dtype, "n")
    check(f"{d} in place aligned (out is C)", A, B, C, 1.0, 1.0, out=C, tf32=tf32)
    # k = 0: out = beta C
    A, B, C = operand(5, 0, dtype, "n"), operand(0, 7, dtype, "n"), operand(5, 7, dtype, "n")
    check(f"{d} k=0", A, B, C, 1.0, 0.5, tf32=tf32)


def public_api():
    """Through kcourse.blas (validation, broadcasting, beta == 0 never reading a NaN C)."""
    if not GPU:
        return
    from kcourse import blas
    A, B = operand(40, 24, torch.float32, "n"), operand(24, 33, torch.float32, "t")
    C = torch.full((40, 33), math.nan, device=DEV)
    for inplace in (False, True):
        label = f"public API beta=0, C full of NaN, {'gemm_' if inplace else 'gemm'}"
        try:
            target = C.clone()
            out = blas.gemm_(A, B, target, 2.0, 0.0, backend="cute") if inplace else \
                blas.gemm(A, B, target, 2.0, 0.0, backend="cute")
            ref = 2.0 * (A.double() @ B.double())
            err = (out.double() - ref).abs().max().item()
            ok = bool(torch.isfinite(out).all()) and err < 1e-4
            results["PASS" if ok else "FAIL"] += 1
            print(f"{'PASS' if ok else 'FAIL'}     {label:<58} max err {err:.3e}")
        except Exception as e:
            results["FAIL"] += 1
            print(f"FAIL     {label:<58} raised {type(e).__name__}: {e}")


def huge():
    """A (2^21 + 5, 1024) float16: 2^31 + 5 * 1024 elements; B's odd width sends it to the general kernel."""
    m, k, n = 2**21 + 5, 1024, 63
    if GPU and torch.cuda.get_device_properties(0).total_memory < 12 * 2**30:
        print("SKIP     huge: needs 12 GB")
        return
    fill = torch.randn if GPU else torch.empty  # compiling needs no values
    A = fill(m, k, dtype=torch.float16, device=DEV)
    B = fill(k, n, dtype=torch.float16, device=DEV)
    out = torch.empty(m, n, dtype=torch.float16, device=DEV)
    label = "huge f16 A > 2^31 elements (general)"
    try:
        if not GPU:
            with _compile.compiling_only():
                gemm(A, B, None, 1.0, 0.0, out)
            print(f"COMPILED {label}")
            return
        gemm(A, B, None, 1.0, 0.0, out)
        torch.cuda.synchronize()
        for rows in (slice(0, 128), slice(m - 128, m)):
            ref, bound = reference(A[rows], B, None, 1.0, 0.0)
            err = (out[rows].double() - ref).abs()
            tol = 4 * (EPS[torch.float16] + math.sqrt(k) * 2.0**-24) * bound
            ok = bool((err <= tol).all())
            results["PASS" if ok else "FAIL"] += 1
            print(f"{'PASS' if ok else 'FAIL'}     {label} rows {rows.start}.. max err {err.max().item():.3e}")
    except Exception as e:
        results["FAIL"] += 1
        print(f"FAIL     {label} raised {type(e).__name__}: {e}")
    del A, out


def bench():
    """Time the general kernel (forced) against torch.matmul: the fallback's cost, for the record."""
    if not GPU:
        return
    for dtype, tf32, layout in [(torch.float32, False, "nn"), (torch.float32, True, "nn"), (torch.bfloat16, False, "nn"),
                                (torch.bfloat16, False, "mm"), (torch.float16, False, "tt")]:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        n = 4096
        A = operand(n, n, dtype, "m" if layout == "mm" else layout[0])[None]
        B = operand(n, n, dtype, "m" if layout == "mm" else layout[1])[None]
        out = torch.empty(1, n, n, dtype=dtype, device=DEV)
        t = {}
        for name, fn in [("cute general", lambda: gemm_general(A, B, None, 1.0, 0.0, out)),
                         ("torch.matmul", lambda: torch.matmul(A, B, out=out))]:
            fn()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                fn()
            end.record()
            torch.cuda.synchronize()
            t[name] = start.elapsed_time(end) / 10
        tflops = 2 * n**3 / (t["cute general"] * 1e-3) / 1e12
        print(f"BENCH    {str(dtype)[6:]}{'/tf32' if tf32 else ''} {layout} 4096^3: general {t['cute general']:.2f} ms "
              f"({tflops:.1f} TFLOP/s), torch {t['torch.matmul']:.2f} ms, ratio {t['torch.matmul'] / t['cute general']:.2f}")
    torch.backends.cuda.matmul.allow_tf32 = False


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--huge", action="store_true")
    parser.add_argument("--bench", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    start = time.time()
    print(f"device: {torch.cuda.get_device_name() if GPU else 'none (compile only)'}; target {_compile.target()}")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        cases(dtype)
    cases(torch.float32, tf32=True)
    public_api()
    if args.huge:
        huge()
    if args.bench:
        bench()
    print(f"\n{results['PASS']} passed, {results['FAIL']} failed, {results['COMPILED']} compiled only "
          f"({time.time() - start:.0f} s)")
    sys.exit(1 if results["FAIL"] else 0)


if __name__ == "__main__":
    main()
