"""GPU self-check of the cute reduction ops: dot, gemv, geru (kcourse/blas/cute/).

Run from the repository root (or set KCOURSE_ROOT):

    python scripts/gpu_checks/reductions.py            # every case, plus bandwidth at large sizes
    python scripts/gpu_checks/reductions.py --quick    # fewer sizes
    python scripts/gpu_checks/reductions.py --huge     # also tensors of more than 2^31 elements (~5 GiB each)
    python scripts/gpu_checks/reductions.py --no-bench

On CUDA each case calls the cute kernel function directly (``kcourse.blas.cute.<op>.<op>``) and
compares with the exact result computed in float64 from the same inputs. Tolerance, element by
element: |out - ref| <= 4 * (eps_out + sqrt(k) * eps_f32) * bound + tiny, where bound is the same
sum with every term replaced by its absolute value (sum |x_i y_i|, |alpha| |A| |x| + |beta| |y|,
|A| + |alpha x y^T|), k the reduction length and eps_out the output dtype's rounding. Each case
prints one line, PASS / FAIL / ERROR with the largest error, the error/tolerance ratio and the
kernel variant that ran (the factory key); the script never stops at a failure and exits with
status 1 if any case did not pass. It also checks that dot gives the same bits twice, that nothing
beside an output was written (outputs live inside guard buffers), that beta == 0 never reads y
(y is NaN), and in-place use (gemv out = y, geru out = A).

Without a GPU it runs the same cases on CPU tensors inside ``_compile.compiling_only()``: every
kernel variant is compiled, nothing runs, nothing is compared (lines read COMPILED).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import traceback

import torch

try:
    import kcourse  # noqa: F401
except ImportError:
    sys.path.insert(0, os.environ.get("KCOURSE_ROOT", os.getcwd()))

from kcourse.blas.cute import _compile  # noqa: E402
from kcourse.blas.cute.dot import dot  # noqa: E402
from kcourse.blas.cute.gemv import gemv  # noqa: E402
from kcourse.blas.cute.geru import geru  # noqa: E402

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
GUARD = 1000.0
EPS32 = torch.finfo(torch.float32).eps / 2  # float32 unit roundoff, 2^-24

results = {"PASS": 0, "FAIL": 0, "ERROR": 0, "COMPILED": 0}
keys: list[tuple] = []  # factory keys launched by the current case


def _record(launch):
    def wrapped(factory, key, *args):
        keys.append((factory.__name__.strip("_").replace("_factory", ""),) + tuple(
            k.__name__ if isinstance(k, type) else k for k in key))
        return launch(factory, key, *args)
    return wrapped


_compile.launch = _record(_compile.launch)


def report(status: str, name: str, detail: str = "") -> None:
    results[status] += 1
    print(f"{status:8s} {name}  {detail}", flush=True)


def randn(*shape, dtype):
    return torch.randn(*shape, dtype=dtype, device=DEV)


def vector(n, dtype, kind):
    """A 1-D input of length n laid out as ``kind``: contiguous, strided (x[::2]), misaligned (x[1:])."""
    if kind == "contiguous":
        return randn(n, dtype=dtype)
    if kind == "strided":
        return randn(2 * n, dtype=dtype)[::2]
    if kind == "misaligned":
        return randn(n + 1, dtype=dtype)[1:]
    raise ValueError(kind)


def matrix(m, n, dtype, kind):
    """A 2-D input laid out as ``kind``."""
    if kind == "contiguous":
        return randn(m, n, dtype=dtype)
    if kind == "transposed":  # column-major: A = B.mT
        return randn(n, m, dtype=dtype).mT
    if kind == "strided":  # every other column
        return randn(m, 2 * n, dtype=dtype)[:, ::2]
    if kind == "sliced":  # rows of a wider, misaligned buffer
        return randn(m + 1, n + 9, dtype=dtype)[1:, 1:n + 1]
    if kind == "transposed-sliced":
        return randn(n + 1, m + 9, dtype=dtype)[1:, 1:m + 1].mT
    raise ValueError(kind)


def guarded_vector(n, dtype, kind):
    """An output of n elements (``kind``: contiguous or strided) inside a buffer of GUARD; (view, buffer, mask)."""
    if kind == "contiguous":
        buf = torch.full((n + 16,), GUARD, dtype=dtype, device=DEV)
        view = buf[8:8 + n]
    else:
        buf = torch.full((2 * n + 2,), GUARD, dtype=dtype, device=DEV)
        view = buf[1:2 * n + 1:2]
    mark = torch.zeros(buf.shape, dtype=torch.bool, device=DEV)
    mark.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(True)
    return view, buf, mark


def guarded_matrix(m, n, dtype, kind):
    if kind == "contiguous":
        buf = torch.full((m, n + 8), GUARD, dtype=dtype, device=DEV)
        view = buf[:, :n]
    else:  # transposed
        buf = torch.full((n, m + 8), GUARD, dtype=dtype, device=DEV)
        view = buf[:, :m].mT
    mark = torch.zeros(buf.shape, dtype=torch.bool, device=DEV)
    mark.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(True)
    return view, buf, mark


# ----------------------------------------------------------------------------- comparisons

def close(out, exact, bound, k) -> tuple[bool, str]:
    """``out`` within 4 (eps_out + sqrt(k) eps_f32) bound + tiny of ``exact`` (both float64 tensors)."""
    eps = torch.finfo(out.dtype).eps / 2
    tol = 4 * (eps + math.sqrt(max(k, 1)) * EPS32) * bound + torch.finfo(out.dtype).tiny
    err = (out.double() - exact).abs()
    nan = torch.isnan(out).any().item() if out.numel() else False
    ratio = (err / tol).max().item() if out.numel() else 0.0
    return (not nan and ratio <= 1.0), (f"max |err| {err.max().item() if out.numel() else 0:.3g}, "
                                        f"err/tol {ratio:.3f}" + (", NaN in output" if nan else ""))


def untouched(buf, mark) -> tuple[bool, str]:
    bad = (buf[~mark] != GUARD).sum().item()
    return bad == 0, "" if bad == 0 else f"{bad} elements beside the output were written"


def run_case(name, fn):
    """fn(check) -> list of (ok, detail); on CPU it is called under compiling_only and only compiles."""
    keys.clear()
    try:
        if not GPU:
            with _compile.compiling_only():
                fn(False)
            report("COMPILED", name, f"{keys}")
            return
        checks = fn(True)
        ok = all(c[0] for c in checks)
        report("PASS" if ok else "FAIL", name, "; ".join(c[1] for c in checks if c[1]) + f"  {keys}")
    except Exception as e:  # noqa: BLE001 - a self-check reports every failure and goes on
        report("ERROR", name, f"{type(e).__name__}: {str(e)[:300]}  {keys}")
        traceback.print_exc(limit=3)


# ----------------------------------------------------------------------------- cases

def case_dot(dtype, n, x_kind, y_kind):
    def fn(check):
        x, y = vector(n, dtype, x_kind), vector(n, dtype, y_kind)
        z = dot(x, y)
        if not check:
            return []
        z2 = dot(x, y)
        torch.cuda.synchronize()
        p = x.double() * y.double()
        exact, bound = p.sum().reshape(()), p.abs().sum().reshape(())
        same = torch.equal(z.view(torch.int16 if dtype != torch.float32 else torch.int32),
                           z2.view(torch.int16 if dtype != torch.float32 else torch.int32))
        return [(z.shape == () and z.dtype == dtype, f"shape {tuple(z.shape)} dtype {z.dtype}"),
                close(z, exact, bound, n), (same, "" if same else "two runs gave different bits")]
    return fn


def case_gemv(dtype, m, n, a_kind, x_kind, beta, out_kind):
    """out_kind: 'new' (a guarded contiguous out), 'strided' (a guarded strided out), 'y' (out is y)."""
    def fn(check):
        A, x = matrix(m, n, dtype, a_kind), vector(n, dtype, x_kind)
        alpha = -1.25
        if beta == 0:  # y is None for the kernel; the public API never passes y when beta == 0
            y = None
            y_in = torch.full((m,), math.nan, dtype=dtype, device=DEV)  # would poison the result if read
        else:
            y = y_in = randn(m, dtype=dtype)
        y0 = y_in.clone()
        buf = mark = None
        if out_kind == "y":
            if y is None:  # in place with beta == 0: out is the NaN-filled y, never read
                out = y_in
            else:
                out = y
        else:
            out, buf, mark = guarded_vector(m, dtype, "contiguous" if out_kind == "new" else "strided")
        A0, x0 = A.clone(), x.clone()
        r = gemv(A, x, y, alpha, beta, out)
        if not check:
            return []
        torch.cuda.synchronize()
        a32 = float(torch.tensor(alpha, dtype=torch.float32))
        b32 = float(torch.tensor(beta, dtype=torch.float32))
        exact = a32 * (A0.double() @ x0.double())
        bound = abs(a32) * (A0.double().abs() @ x0.double().abs())
        if beta != 0:
            exact += b32 * y0.double()
            bound += abs(b32) * y0.double().abs()
        checks = [(r is out, "" if r is out else "did not return out"), close(out, exact, bound, n),
                  (torch.equal(A, A0) and torch.equal(x, x0), "")]
        if not checks[-1][0]:
            checks[-1] = (False, "an input changed")
        if buf is not None:
            checks.append(untouched(buf, mark))
        return checks
    return fn


def case_geru(dtype, m, n, a_kind, x_kind, out_kind):
    """out_kind: 'new' (guarded contiguous), 'new-transposed' (guarded column-major), 'A' (in place)."""
    def fn(check):
        A, x, y = matrix(m, n, dtype, a_kind), vector(m, dtype, x_kind), vector(n, dtype, x_kind)
        alpha = 0.75
        A0, x0, y0 = A.clone(), x.clone(), y.clone()
        buf = mark = None
        if out_kind == "A":
            out = A
        else:
            out, buf, mark = guarded_matrix(m, n, dtype, "contiguous" if out_kind == "new" else "transposed")
        r = geru(A, x, y, alpha, out)
        if not check:
            return []
        torch.cuda.synchronize()
        a32 = float(torch.tensor(alpha, dtype=torch.float32))
        update = (a32 * x0.double())[:, None] * y0.double()[None, :]
        exact, bound = A0.double() + update, A0.double().abs() + update.abs()
        checks = [(r is out, "" if r is out else "did not return out"), close(out, exact, bound, 1)]
        if buf is not None:
            checks.append(untouched(buf, mark))
        return checks
    return fn


def correctness(quick: bool):
    sizes = [1, 7, 1000, 4097] if quick else [1, 2, 7, 8, 9, 1000, 4097, (1 << 20) + 3, 1 << 20]
    for dtype in DTYPES:
        dt = str(dtype).replace("torch.", "")
        for n in sizes:
            for xk, yk in [("contiguous", "contiguous"), ("strided", "strided"), ("misaligned", "contiguous"),
                           ("misaligned", "misaligned"), ("contiguous", "strided")]:
                run_case(f"dot {dt} n={n} x {xk} y {yk}", case_dot(dtype, n, xk, yk))
    shapes = [(1, 1), (7, 13), (1000, 7), (33, 1000), (4097, 1), (1, 4097), (257, 4097), (4097, 257), (5, 0)]
    if not quick:
        shapes += [(16, 65536), (65536, 16), (4096, 4096)]
    a_kinds = ["contiguous", "transposed", "strided", "sliced", "transposed-sliced"]
    for dtype in DTYPES:
        dt = str(dtype).replace("torch.", "")
        for m, n in shapes:
            for ak in a_kinds:
                for xk, beta, ok in [("contiguous", 0.0, "new"), ("strided", 1.5, "new"), ("misaligned", 1.5, "y"),
                                     ("contiguous", 0.0, "y"), ("contiguous", -0.5, "strided")]:
                    run_case(f"gemv {dt} {m}x{n} A {ak} x {xk} beta={beta} out={ok}",
                             case_gemv(dtype, m, n, ak, xk, beta, ok))
    shapes = [(1, 1), (7, 13), (1000, 7), (33, 1000), (4097, 1), (1, 4097), (257, 4097), (4097, 257)]
    if not quick:
        shapes += [(2048, 2048)]
    for dtype in DTYPES:
        dt = str(dtype).replace("torch.", "")
        for m, n in shapes:
            for ak in ["contiguous", "transposed", "strided", "sliced"]:
                for xk, ok in [("contiguous", "new"), ("strided", "new-transposed"), ("misaligned", "A"),
                               ("contiguous", "A")]:
                    run_case(f"geru {dt} {m}x{n} A {ak} x,y {xk} out={ok}", case_geru(dtype, m, n, ak, xk, ok))


def huge():
    """Tensors past 2^31 elements (test_huge's sizes): the results past the 2^31st element must land."""
    big = 2**31 + 2**20 + 7
    f16 = torch.float16

    def dot_big(check):
        x, y = randn(big, dtype=f16), randn(big, dtype=f16)
        z = dot(x, y)
        if not check:
            return []
        exact = sum((x[i:i + 2**28].double() * y[i:i + 2**28].double()).sum() for i in range(0, big, 2**28))
        bound = sum((x[i:i + 2**28].double() * y[i:i + 2**28].double()).abs().sum() for i in range(0, big, 2**28))
        return [close(z, exact.reshape(()), bound.reshape(()), big)]

    def level2_big(check, n):
        m = 2**16 + 3  # m n > 2^31
        A, x, y = randn(m, n, dtype=f16), randn(n, dtype=f16), randn(m, dtype=f16)
        rows = slice(m - 64, m)
        A_tail = A[rows].clone()  # the last 64 rows: every element past 2^31
        out = torch.empty(m, dtype=f16, device=DEV)
        gemv(A, x, y, 1.0, 1.0, out)
        outT = torch.empty(n, dtype=f16, device=DEV)
        gemv(A.mT[:, rows], y[rows], None, 1.0, 0.0, outT)  # a transposed view reaching the end
        xm = randn(m, dtype=f16)
        geru(A, xm, x, -1.0, A)
        if not check:
            return []
        Ar = A_tail.double()
        c1 = close(out[rows], Ar @ x.double() + y[rows].double(), Ar.abs() @ x.double().abs() + y[rows].double().abs(), n)
        c2 = close(outT, Ar.mT @ y[rows].double(), Ar.abs().mT @ y[rows].double().abs(), 64)
        upd = -1.0 * xm[rows].double()[:, None] * x.double()[None, :]
        c3 = close(A[rows], Ar + upd, Ar.abs() + upd.abs(), 1)
        return [c1, c2, c3]

    if GPU and torch.cuda.get_device_properties(0).total_memory < 24 * 2**30:
        report("ERROR", "huge", "not enough GPU memory (needs ~24 GiB)")
        return
    run_case("dot float16 n=2^31+2^20+7", dot_big)
    run_case("gemv/geru float16 (2^16+3)x(2^15+1), scalar", lambda check: level2_big(check, 2**15 + 1))
    run_case("gemv/geru float16 (2^16+3)x(2^15+8), vectorized", lambda check: level2_big(check, 2**15 + 8))


def bench():
    """GB/s at large sizes against the device copy bandwidth (torch copy_ of 1 GiB)."""
    if not GPU:
        return

    def time_ms(fn, reps=20):
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(reps):
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]

    bf16 = torch.bfloat16
    src = torch.empty(2**29, dtype=bf16, device=DEV)
    dst = torch.empty_like(src)
    copy_gbs = 2 * src.numel() * 2 / time_ms(lambda: dst.copy_(src)) / 1e6
    print(f"BENCH    copy (torch) 1 GiB: {copy_gbs:.0f} GB/s", flush=True)
    del src, dst

    def line(name, nbytes, fn, ref=None):
        ms = time_ms(fn)
        gbs = nbytes / ms / 1e6
        extra = ""
        if ref is not None:
            ms_ref = time_ms(ref)
            extra = f", torch {nbytes / ms_ref / 1e6:.0f} GB/s"
        print(f"BENCH    {name}: {ms * 1e3:.0f} us, {gbs:.0f} GB/s = {gbs / copy_gbs:.2f} of copy{extra}", flush=True)

    n = 2**28
    x, y = torch.randn(n, dtype=bf16, device=DEV), torch.randn(n, dtype=bf16, device=DEV)
    line("dot bf16 n=2^28", 2 * n * 2, lambda: dot(x, y), lambda: torch.dot(x, y))
    del x, y
    m = n = 16384
    A = torch.randn(m, n, dtype=bf16, device=DEV)
    xv, yv, out = torch.randn(n, dtype=bf16, device=DEV), torch.randn(m, dtype=bf16, device=DEV), torch.empty(m, dtype=bf16, device=DEV)
    line("gemv bf16 16384^2 row-major", m * n * 2, lambda: gemv(A, xv, yv, 1.0, 1.0, out), lambda: torch.mv(A, xv))
    line("gemv bf16 16384^2 transposed", m * n * 2, lambda: gemv(A.mT, xv, yv, 1.0, 1.0, out), lambda: torch.mv(A.mT, xv))
    line("gemv bf16 1 x 2^26", 2**26 * 2, lambda: gemv(A.view(-1)[:2**26].view(1, -1), A.view(-1)[:2**26], None, 1.0, 0.0, out[:1]))
    outA = torch.empty_like(A)
    line("geru bf16 16384^2 out of place", 2 * m * n * 2, lambda: geru(A, xv, yv, 1.0, outA),
         lambda: torch.addr(A, xv, yv, out=outA))
    line("geru bf16 16384^2 in place", 2 * m * n * 2, lambda: geru(A, xv, yv, 1e-3, A))
    line("geru bf16 16384^2 A transposed, out row-major", 2 * m * n * 2, lambda: geru(A.mT, xv, yv, 1.0, outA))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes")
    parser.add_argument("--huge", action="store_true", help="also tensors of more than 2^31 elements")
    parser.add_argument("--no-bench", action="store_true", help="skip the bandwidth measurements")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name() if GPU else 'CPU (compile only)'}; target {_compile.target()}")
    correctness(args.quick)
    if args.huge:
        huge()
    if not args.no_bench:
        bench()
    print("summary:", ", ".join(f"{k} {v}" for k, v in results.items() if v))
    sys.exit(1 if results["FAIL"] or results["ERROR"] else 0)


if __name__ == "__main__":
    main()
