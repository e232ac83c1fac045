"""GPU self-check of the cute elementwise ops: copy, swap, scal, axpby (kcourse/blas/cute/).

Run from the repository root:  python /path/to/elementwise.py [--quick] [--no-huge] [--no-bench] [--only TEXT]

On CUDA every case runs and is compared with torch: copy and swap bit for bit; scal and axpby with
the float32 formula evaluated in float64 and a bound of one rounding to the dtype plus a few
float32 ulps of the terms (a fused multiply-add is allowed). Each case prints one line,
PASS / FAIL / ERROR with the largest error; the script never stops at the first failure and exits
with status 1 if any case did not pass. It also checks that no byte beside an output was written,
that the kernel variant (vector width) picked is the expected one, tensors of more than 2^31
elements (if the GPU has the memory), and the bandwidth of copy/scal/axpby at n = 2^28 against
torch.

An illegal memory access poisons the CUDA context, so every later case errors too: the first
ERROR line is the one to read; ``--only TEXT`` runs just the cases whose name contains TEXT.

Without a GPU it runs the same cases inside ``_compile.compiling_only()`` on CPU tensors: every
kernel variant is compiled, nothing runs, nothing is compared (lines read COMPILED).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback

import torch

import importlib.util

if importlib.util.find_spec("kcourse") is None:  # not installed: import it from the cwd (the repository root)
    sys.path.insert(0, os.getcwd())

from kcourse.blas._layout import strided_layout  # noqa: E402
from kcourse.blas.cute import _compile, _elementwise  # noqa: E402
from kcourse.blas.cute.axpby import axpby  # noqa: E402
from kcourse.blas.cute.copy import copy  # noqa: E402
from kcourse.blas.cute.scal import scal  # noqa: E402
from kcourse.blas.cute.swap import swap  # noqa: E402

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
GUARD = 1000.0  # value written around every output, must survive

results = {"PASS": 0, "FAIL": 0, "ERROR": 0, "COMPILED": 0}


def report(status: str, name: str, detail: str = "") -> None:
    results[status] += 1
    print(f"{status:8s} {name}  {detail}", flush=True)


# ----------------------------------------------------------------------------- layouts

def randn(*shape, dtype):
    return torch.randn(*shape, dtype=dtype, device=DEV)


def guarded(shape, dtype, kind):
    """An output tensor of ``shape`` laid out as ``kind``, inside a buffer filled with GUARD;
    returns (view, buffer, mask of the buffer elements the view covers)."""
    n = math.prod(shape)
    if kind == "contiguous":
        buf = torch.full((n + 16,), GUARD, dtype=dtype, device=DEV)
        view = buf[8:8 + n].view(shape)  # 8 elements in: still 16-byte aligned
    elif kind == "misaligned":
        buf = torch.full((n + 16,), GUARD, dtype=dtype, device=DEV)
        view = buf[1:1 + n].view(shape)
    elif kind == "strided":  # every other element of the last dim
        buf = torch.full((*shape[:-1], 2 * shape[-1]), GUARD, dtype=dtype, device=DEV)
        view = buf[..., ::2]
    elif kind == "transposed":  # a .mT view (2-D+)
        buf = torch.full((*shape[:-2], shape[-1], shape[-2]), GUARD, dtype=dtype, device=DEV)
        view = buf.mT
    else:
        raise ValueError(kind)
    mark = torch.zeros(buf.shape, dtype=torch.bool, device=DEV)
    mark_view = mark.as_strided(view.shape, view.stride(), view.storage_offset() - buf.storage_offset())
    mark_view.fill_(True)
    return view, buf, mark


# Each input layout: name -> function(dtype) -> tensor. All inputs of one case share the shape.
def input_layouts(quick: bool):
    sizes = [1, 7, 4097] if quick else [1, 2, 3, 7, 8, 9, 15, 16, 17, 1000, 4097, (1 << 20) + 3, 1 << 20]
    layouts = {}
    for n in sizes:
        layouts[f"contiguous n={n}"] = ((n,), lambda dt, n=n: randn(n, dtype=dt))
    layouts.update({
        "strided x[::2] n=4097": ((4097,), lambda dt: randn(8194, dtype=dt)[::2]),
        "misaligned x[1:] n=4097": ((4097,), lambda dt: randn(4098, dtype=dt)[1:]),
        "misaligned x[1:] n=1<<20": ((1 << 20,), lambda dt: randn((1 << 20) + 1, dtype=dt)[1:]),
        "transposed (33, 65)": ((33, 65), lambda dt: randn(65, 33, dtype=dt).t()),
        "transposed (1000, 999)": ((1000, 999), lambda dt: randn(999, 1000, dtype=dt).t()),
        "permuted 3-D (9, 5, 7)": ((9, 5, 7), lambda dt: randn(5, 7, 9, dtype=dt).permute(2, 0, 1)),
        "row slice (64, 32) of (64, 48)": ((64, 32), lambda dt: randn(64, 48, dtype=dt)[:, :32]),  # rank 2, vectorized
        "row slice (300, 1000) of (300, 1024)": ((300, 1000), lambda dt: randn(300, 1024, dtype=dt)[:, :1000]),
        "row slice (31, 9) of (31, 12)": ((31, 9), lambda dt: randn(31, 12, dtype=dt)[:, :9]),
        "rank-4 (4, 6, 5, 4)": ((4, 6, 5, 4), lambda dt: randn(4, 5, 6, 8, dtype=dt).permute(0, 2, 1, 3)[..., ::2]),
        "expanded (50, 300) from (1, 300)": ((50, 300), lambda dt: randn(1, 300, dtype=dt).expand(50, 300)),
        "expanded (300, 50) from (300, 1)": ((300, 50), lambda dt: randn(300, 1, dtype=dt).expand(300, 50)),
        "0-d": ((), lambda dt: randn((), dtype=dt)),
    })
    return layouts


# ----------------------------------------------------------------------------- comparisons

def bits_equal(a, b) -> tuple[bool, str]:
    if a.shape != b.shape:
        return False, f"shape {tuple(a.shape)} != {tuple(b.shape)}"
    ai, bi = a.view(INT_VIEW[a.dtype]), b.view(INT_VIEW[b.dtype])
    bad = (ai != bi).sum().item()
    err = (a.float() - b.float()).abs().max().item() if a.numel() else 0.0
    return bad == 0, f"bit mismatches {bad}/{a.numel()}, max |err| {err:.3g}"


def formula_close(out, terms) -> tuple[bool, str]:
    """``out`` against sum(coef * t) computed in float64 from the float32 values of the operands:
    one rounding to out's dtype (half an ulp, taken as eps * |exact|) plus 4 float32 ulps of the
    terms (float32 intermediate rounding, fused or not)."""
    exact = torch.zeros(out.shape, dtype=torch.float64, device=out.device)
    magnitude = torch.zeros_like(exact)
    for coef, t in terms:
        c = float(torch.tensor(coef, dtype=torch.float32))  # the kernel's float32 scalar
        term = c * t.double()
        exact += term
        magnitude += term.abs()
    eps = torch.finfo(out.dtype).eps
    tiny = torch.finfo(out.dtype).tiny
    bound = eps * exact.abs() + 4 * torch.finfo(torch.float32).eps * magnitude + tiny
    err = (out.double() - exact).abs()
    ratio = (err / bound).max().item() if out.numel() else 0.0
    exact_match = torch.equal(out, exact.to(torch.float32).to(out.dtype))
    return ratio <= 1.0, f"max |err| {err.max().item() if out.numel() else 0:.3g}, max err/bound {ratio:.3f}" + \
        (", equals the float32 formula rounded once" if exact_match else "")


def untouched(buf, mark) -> tuple[bool, str]:
    outside = buf[~mark]
    bad = (outside != GUARD).sum().item()
    return bad == 0, "" if bad == 0 else f"{bad} elements beside the output were written"


def expected_vec(tensors) -> int:
    shape, strides = strided_layout("check", *tensors)
    return _elementwise.vector_width(tensors, shape, strides)


# ----------------------------------------------------------------------------- cases

ONLY = None  # --only: run just the cases whose name contains this


def run_case(name, fn):
    """fn(check) -> list of (ok, detail) on GPU; on CPU it only compiles."""
    if ONLY is not None and ONLY not in name:
        return
    try:
        if not GPU:
            with _compile.compiling_only():
                fn(check=False)
            report("COMPILED", name)
            return
        checks = fn(check=True)
        torch.cuda.synchronize()
        ok = all(c[0] for c in checks)
        report("PASS" if ok else "FAIL", name, "; ".join(c[1] for c in checks if c[1]))
    except Exception as e:  # noqa: BLE001 - a self-check reports every failure and goes on
        report("ERROR", name, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        traceback.print_exc(limit=4)


def case_copy(dtype, make_x, shape, out_kind):
    def fn(check):
        x = make_x(dtype)
        x0 = x.clone()
        out, buf, mark = guarded(shape, dtype, out_kind)
        vec = expected_vec((x, out))
        r = copy(x, out)
        if not check:
            return []
        torch.cuda.synchronize()
        return [(r is out, "" if r is out else "did not return out"), bits_equal(out, x0),
                bits_equal(x, x0), untouched(buf, mark), (True, f"vec={vec}")]
    return fn


def case_swap(dtype, make_x, shape, inplace):
    def fn(check):
        x, y = make_x(dtype), make_x(dtype)
        if inplace:
            if 0 in x.stride() and x.numel() > 1:  # an expanded view cannot be written in place
                x, y = x.contiguous(), y.contiguous()
            x0, y0 = x.clone(), y.clone()
            out_x, out_y = x, y
            bufs = []
        else:
            x0, y0 = x.clone(), y.clone()
            out_x, bx, mx = guarded(shape, dtype, "contiguous")
            out_y, by, my = guarded(shape, dtype, "strided" if len(shape) else "contiguous")
            bufs = [(bx, mx), (by, my)]
        vec = expected_vec((x, y, out_x, out_y))
        rx, ry = swap(x, y, out_x, out_y)
        if not check:
            return []
        torch.cuda.synchronize()
        checks = [(rx is out_x and ry is out_y, ""), bits_equal(out_x, y0), bits_equal(out_y, x0)]
        if not inplace:
            checks += [bits_equal(x, x0), bits_equal(y, y0)]
        checks += [untouched(b, m) for b, m in bufs] + [(True, f"vec={vec}")]
        return checks
    return fn


def case_scal(dtype, make_x, shape, inplace, alpha=-1.7):
    def fn(check):
        x = make_x(dtype)
        if inplace and 0 in x.stride() and x.numel() > 1:
            x = x.contiguous()
        x0 = x.clone()
        if inplace:
            out, bufs = x, []
        else:
            out, buf, mark = guarded(shape, dtype, "contiguous")
            bufs = [(buf, mark)]
        vec = expected_vec((x, out))
        r = scal(x, alpha, out)
        if not check:
            return []
        torch.cuda.synchronize()
        checks = [(r is out, ""), formula_close(out, [(alpha, x0)])]
        if not inplace:
            checks.append(bits_equal(x, x0))
        return checks + [untouched(b, m) for b, m in bufs] + [(True, f"vec={vec}")]
    return fn


def case_axpby(dtype, make_x, shape, mode, alpha=0.75, beta=-2.5):
    """mode: 'out' (fresh out), 'inplace' (out is y), 'beta0' (y None, y full of NaN elsewhere)."""
    def fn(check):
        x, y = make_x(dtype), make_x(dtype)
        if mode == "inplace" and 0 in y.stride() and y.numel() > 1:
            y = y.contiguous()
        x0, y0 = x.clone(), y.clone()
        bufs = []
        if mode == "inplace":
            out = y
        else:
            out, buf, mark = guarded(shape, dtype, "strided" if len(shape) else "contiguous")
            bufs = [(buf, mark)]
        yy = None if mode == "beta0" else y
        b = 0.0 if mode == "beta0" else beta
        vec = expected_vec(tuple(t for t in (x, yy, out) if t is not None))
        r = axpby(x, yy, alpha, b, out)
        if not check:
            return []
        torch.cuda.synchronize()
        terms = [(alpha, x0)] + ([] if mode == "beta0" else [(beta, y0)])
        checks = [(r is out, ""), formula_close(out, terms), bits_equal(x, x0)]
        if mode == "out":
            checks.append(bits_equal(y, y0))
        return checks + [untouched(b_, m) for b_, m in bufs] + [(True, f"vec={vec}")]
    return fn


def case_too_many_dims(dtype):
    def fn(check):
        x = randn(2, 3, 2, 3, 2, 3, dtype=dtype).permute(5, 3, 1, 4, 2, 0)  # 6 dims that do not merge
        out = torch.empty(x.shape, dtype=dtype, device=DEV)
        try:
            copy(x, out)
        except ValueError as e:
            msg = str(e)
            ok = msg.startswith("copy:") and "dims" in msg
            return [(ok, f"ValueError: {msg[:90]}...")]
        return [(False, "no ValueError for 6 unmergeable dims")]
    return fn


def variant_checks():
    """The host picks the vector width it should (pure Python; runs everywhere)."""
    f32 = torch.randn(4100)
    cases = [
        ("f32 contiguous -> 4", (f32, torch.empty(4100)), 4),
        ("f32 x[1:] -> 1", (f32[1:], torch.empty(4099)), 1),
        ("f32 x[2:] vs aligned out -> 2", (f32[2:], torch.empty(4098)), 2),
        ("bf16 contiguous -> 8", (torch.randn(64, dtype=torch.bfloat16), torch.empty(64, dtype=torch.bfloat16)), 8),
        ("bf16 (64, 32) of (64, 48) -> 8", (torch.randn(64, 48, dtype=torch.bfloat16)[:, :32],
                                            torch.empty(64, 32, dtype=torch.bfloat16)), 8),
        ("bf16 (64, 36) of (64, 48) -> 4", (torch.randn(64, 48, dtype=torch.bfloat16)[:, :36],
                                            torch.empty(64, 36, dtype=torch.bfloat16)), 4),
        ("f32 transposed -> 1", (torch.randn(8, 8).t(), torch.empty(8, 8)), 1),
        ("f32 expanded inner dim -> 1", (torch.randn(8, 1).expand(8, 8), torch.empty(8, 8)), 1),
        ("f32 expanded outer dim -> 4", (torch.randn(1, 8).expand(8, 8), torch.empty(8, 8)), 4),
    ]
    for name, tensors, want in cases:
        got = expected_vec(tensors)
        report("PASS" if got == want else "FAIL", f"variant {name}", f"vec={got}")


def huge_cases():
    """More than 2^31 elements (64-bit indices and offsets), if the GPU has the memory."""
    free = torch.cuda.mem_get_info()[0]
    n = (1 << 31) + 5  # a partial last vector, indices past 2^31
    need = 3 * n * 2 + 2 * (2 * n) * 2  # bf16: x, out, y; plus a 2n strided source and its copy
    if free < need * 1.2:
        report("PASS", "huge (skipped)", f"needs ~{need / 2**30:.0f} GiB free, have {free / 2**30:.0f} GiB")
        return

    def fn_copy(check):
        x = torch.randn(n, dtype=torch.bfloat16, device=DEV)
        out = torch.empty_like(x)
        copy(x, out)
        torch.cuda.synchronize()
        ok = torch.equal(out[-1000:], x[-1000:]) and torch.equal(out[:1000], x[:1000]) and torch.equal(out, x)
        return [(ok, f"bf16 n={n}")]

    def fn_axpby(check):
        x = torch.randn(n, dtype=torch.bfloat16, device=DEV)
        y = torch.randn(n, dtype=torch.bfloat16, device=DEV)
        out = torch.empty_like(x)
        axpby(x, y, 2.0, -1.0, out)
        torch.cuda.synchronize()
        checks = []
        for sl in (slice(0, 1 << 20), slice(n - (1 << 20), n), slice((1 << 31) - 7, (1 << 31) + 5)):
            checks.append(formula_close(out[sl], [(2.0, x[sl]), (-1.0, y[sl])]))
        return checks

    def fn_strided(check):  # scalar path, element offsets past 2^32
        src = torch.randn(2 * n, dtype=torch.bfloat16, device=DEV)
        x = src[::2]
        out = torch.empty(n, dtype=torch.bfloat16, device=DEV)
        copy(x, out)
        torch.cuda.synchronize()
        ok = torch.equal(out[-1000:], x[-1000:]) and torch.equal(out[:1000], x[:1000])
        return [(ok, f"x[::2] of 2n bf16, n={n}")]

    for name, fn in (("huge copy bf16 contiguous", fn_copy), ("huge axpby bf16 contiguous", fn_axpby),
                     ("huge copy bf16 strided (offsets > 2^32)", fn_strided)):
        run_case(name, fn)
        torch.cuda.empty_cache()


def bench(fn, iters=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def bandwidth_of(dtype, n=1 << 28):
    x = torch.randn(n, dtype=dtype, device=DEV)
    y = torch.randn(n, dtype=dtype, device=DEV)
    out = torch.empty_like(x)
    nbytes = n * x.element_size()
    rows = [  # name, bytes moved / nbytes, cute, torch eager
        ("copy", 2, lambda: copy(x, out), lambda: out.copy_(x)),
        ("scal", 2, lambda: scal(x, 1.5, out), lambda: torch.mul(x, 1.5, out=out)),
        ("axpby", 3, lambda: axpby(x, y, 1.5, -2.0, out), lambda: torch.add(y * -2.0, x, alpha=1.5, out=out)),
        ("swap", 4, lambda: swap(x, y, x, y), None),
    ]
    bw_copy_torch = 2 * nbytes / bench(lambda: out.copy_(x))
    for name, k, ours, theirs in rows:
        bw = k * nbytes / bench(ours)
        line = f"{name:5s} {str(dtype)[6:]:8s} n=2^28: cute {bw / 1e9:7.1f} GB/s = {bw / bw_copy_torch:.3f} x torch copy"
        if theirs is not None:
            line += f"; torch eager {name} {k * nbytes / bench(theirs) / 1e9:7.1f} GB/s"
        print("BENCH   ", line, flush=True)


def bandwidth():
    for dtype in (torch.float32, torch.bfloat16):
        bandwidth_of(dtype)
        torch.cuda.empty_cache()
    # host overhead of a tiny launch
    x = torch.randn(16, device=DEV)
    out = torch.empty_like(x)
    copy(x, out)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(1000):
        copy(x, out)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(f"BENCH    copy n=16: {(t1 - t0) * 1e3:.1f} us per call on the host (launch included)", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer sizes")
    parser.add_argument("--no-huge", action="store_true", help="skip the > 2^31-element cases")
    parser.add_argument("--no-bench", action="store_true", help="skip the bandwidth measurement")
    parser.add_argument("--only", default=None, help="run only the cases whose name contains this text")
    args = parser.parse_args()
    global ONLY
    ONLY = args.only
    print(f"device: {torch.cuda.get_device_name() if GPU else 'none: compile-only mode (CPU tensors)'}; "
          f"target {_compile.target()}", flush=True)
    torch.manual_seed(0)

    variant_checks()
    layouts = input_layouts(args.quick)
    for dtype in DTYPES:
        dt = str(dtype)[6:]
        for lname, (shape, make_x) in layouts.items():
            for out_kind in ("contiguous", "strided", "misaligned") if len(shape) else ("contiguous",):
                run_case(f"copy  {dt:8s} {lname} -> {out_kind} out", case_copy(dtype, make_x, shape, out_kind))
            for inplace in (False, True):
                run_case(f"swap  {dt:8s} {lname} {'in place' if inplace else ''}",
                         case_swap(dtype, make_x, shape, inplace))
                run_case(f"scal  {dt:8s} {lname} {'in place' if inplace else ''}",
                         case_scal(dtype, make_x, shape, inplace))
            for mode in ("out", "inplace", "beta0"):
                run_case(f"axpby {dt:8s} {lname} [{mode}]", case_axpby(dtype, make_x, shape, mode))
        run_case(f"copy  {dt:8s} 6 unmergeable dims -> ValueError", case_too_many_dims(dtype))

    if GPU and not args.no_huge and ONLY is None:
        huge_cases()
    if GPU and not args.no_bench and ONLY is None:
        bandwidth()
    compiled = {k: v for k, v in _compile.COMPILE_SECONDS.items() if k[0] == "elementwise_kernel"}
    print(f"kernel variants compiled: {len(compiled)} in {sum(compiled.values()):.1f} s", flush=True)
    print("SUMMARY " + ", ".join(f"{k} {v}" for k, v in results.items() if v), flush=True)
    sys.exit(1 if results["FAIL"] or results["ERROR"] else 0)


if __name__ == "__main__":
    main()
