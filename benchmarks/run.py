"""Benchmark every kcourse.blas op on every backend against ceilings measured in the same run.

    python benchmarks/run.py --out benchmarks/results/h100                         # full sweep, CUDA
    python benchmarks/run.py --out /tmp/b --ops gemm,dot --backends pytorch,triton --quick
    python benchmarks/run.py --out /tmp/b --device cpu --quick                      # smoke test, no GPU

Method
------
* Inputs are random (``torch.randn``), never zeros, and one set of inputs per (op, dtype, size) is
  shared by every backend.
* Before timing, each point runs once and its result is compared with plain PyTorch computed in
  float32 (``torch.dot``, ``torch.mv``, ``torch.addr``, ``torch.matmul``; written here, independent
  of the code under test) with ``torch.testing.assert_close`` at a tolerance per dtype, scaled by
  the square root of the reduction length. The point records ``checked``: a fast wrong kernel is
  reported as WRONG, not as fast. That first call also pays any JIT compile or autotuning
  (``first_call_s``), so it is not in the timing.
* Time: ``triton.testing.do_bench(fn, warmup, rep, return_mode="median")``: CUDA events around each
  call, the L2 cache flushed before each call, the median over the repetitions. Out-of-place ops
  (copy, scal, axpby, dot, gemv, geru, gemm) are timed as users call them, so the time includes
  allocating the output, which after the first call is a lookup in PyTorch's caching allocator
  (no cudaMalloc). swap is timed in place (``swap_``). ``--device cpu`` uses a
  ``time.perf_counter`` median instead (a smoke test of this script, not a benchmark).
* Ceilings, measured in the same run: (1) memory bandwidth: ``dst.copy_(src)`` on 2^28 float32
  (1 GiB each way), bytes read + written; (2) ``torch.matmul`` at every gemm point's shape and dtype.
* Metrics: median ms; for memory-bound ops GB/s of the minimal traffic (s = element size: copy
  2ns, swap 4ns, scal 2ns, axpby 3ns, dot 2ns, gemv (mn+n+m)s, geru (2mn+m+n)s) and its fraction of
  the copy bandwidth; for gemm TFLOP/s (2mnk) and its fraction of torch.matmul's TFLOP/s.
* The ``python`` backend is the elementwise reference: it runs only at small sizes (``PYTHON_MAX``).

Output in ``--out``: ``results.json`` (metadata + every point), ``<op>.png``, ``summary.md`` (the
target points, also printed at the end). ``summarize.py`` regenerates the last two from the JSON.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # summarize.py, next to this file
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # kcourse, without installing it

import kcourse  # noqa: E402
from kcourse import blas  # noqa: E402
from summarize import plot_all, summary_markdown  # noqa: E402

# ----------------------------------------------------------------------------- configuration

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
ALPHA, BETA = 1.5, -0.5

# (op, dtype, sizes, target sizes) per mode. Level 1: n elements; level 2 and gemm: square side.
P2 = [1 << e for e in range(16, 29)]  # 2^16 ... 2^28
SWEEPS = {
    "full": [
        *[(op, F32, P2, [1 << 28]) for op in ("copy", "swap", "scal", "axpby", "dot")],
        *[(op, BF16, P2, [1 << 28] if op == "dot" else []) for op in ("copy", "axpby", "dot")],
        *[(op, F32, [1024, 2048, 4096, 8192, 16384], [16384]) for op in ("gemv", "geru")],
        *[("gemm", dt, [512, 1024, 2048, 4096, 8192], [4096, 8192]) for dt in (BF16, F16)],
        ("gemm", F32, [1024, 2048, 4096], []),
    ],
    "quick": [  # every target point, plus one small size per op
        *[(op, F32, [1 << 20, 1 << 28], [1 << 28]) for op in ("copy", "swap", "scal", "axpby", "dot")],
        *[(op, F32, [1024, 16384], [16384]) for op in ("gemv", "geru")],
        *[("gemm", dt, [1024, 4096, 8192], [4096, 8192]) for dt in (BF16, F16)],
        ("gemm", F32, [1024], []),
    ],
    "cpu": [  # tiny sizes: proves the code paths on a machine without a GPU
        *[(op, F32, [1 << 10, 1 << 14], [1 << 14]) for op in ("copy", "swap", "scal", "axpby", "dot")],
        *[(op, BF16, [1 << 10, 1 << 14], []) for op in ("copy", "axpby", "dot")],
        *[(op, F32, [32, 128], [128]) for op in ("gemv", "geru")],
        *[("gemm", dt, [32, 64], [64]) for dt in (BF16, F16, F32)],
    ],
}

# A point meets its target when it reaches this fraction of its ceiling (copy_ GB/s or torch.matmul).
TARGETS = {"copy": 0.90, "swap": 0.90, "scal": 0.90, "axpby": 0.90, "dot": 0.85,
           "gemv": 0.85, "geru": 0.85, "gemm": 0.90}

# The python backend (elementwise reference) runs on CUDA only up to these sizes: it is a
# correctness oracle, and a python gemm at 8192^3 would take seconds per call.
PYTHON_MAX = {1: 1 << 24, 2: 4096, 3: 1024}

# do_bench warmup / rep in ms (CUDA); the CPU timer runs a handful of calls.
TIMING = {"full": (25, 100), "quick": (10, 40)}

# Check tolerance per dtype: rtol = tol, atol = tol * sqrt(reduction length).
TOL = {F32: 1e-4, F16: 1e-2, BF16: 2e-2}
EXACT = {"copy", "swap"}  # pure data movement: must be bit-exact

COPY_CEILING_ELEMENTS = {"cuda": 1 << 28, "cpu": 1 << 22}

# ----------------------------------------------------------------------------- the ops


@dataclass(frozen=True)
class Op:
    """How to benchmark one op: make inputs, run it on a backend, compute the expected answer."""
    name: str
    level: int
    make: Callable  # (n, dtype, device) -> tuple of random tensors
    run: Callable  # (inputs, backend) -> result: the timed call
    expect: Callable  # inputs -> the answer in plain PyTorch (float32 math)
    shape: Callable  # n -> problem shape
    bytes: Callable | None = None  # (n, element size) -> minimal bytes moved
    flops: Callable | None = None  # n -> floating-point operations
    reduction: Callable = lambda n: 1  # n -> reduction length (scales the check's atol)


def randn(*shape, dtype, device):
    return torch.randn(*shape, dtype=dtype, device=device)


def vectors(count):
    return lambda n, dt, dev: tuple(randn(n, dtype=dt, device=dev) for _ in range(count))


def vector_shape(n):
    return [n]


def square(n):
    return [n, n]


OPS = {op.name: op for op in [
    Op("copy", 1, make=vectors(1), shape=vector_shape,
       run=lambda t, b: blas.copy(t[0], backend=b),
       expect=lambda t: t[0].clone(),
       bytes=lambda n, s: 2 * n * s),
    Op("swap", 1, make=vectors(2), shape=vector_shape,
       run=lambda t, b: blas.swap_(t[0], t[1], backend=b),  # in place
       expect=lambda t: (t[1].clone(), t[0].clone()),
       bytes=lambda n, s: 4 * n * s),
    Op("scal", 1, make=vectors(1), shape=vector_shape,
       run=lambda t, b: blas.scal(t[0], ALPHA, backend=b),
       expect=lambda t: (ALPHA * t[0].float()).to(t[0].dtype),
       bytes=lambda n, s: 2 * n * s),
    Op("axpby", 1, make=vectors(2), shape=vector_shape,
       run=lambda t, b: blas.axpby(t[0], t[1], ALPHA, BETA, backend=b),
       expect=lambda t: (ALPHA * t[0].float() + BETA * t[1].float()).to(t[0].dtype),
       bytes=lambda n, s: 3 * n * s),
    Op("dot", 1, make=vectors(2), shape=vector_shape,
       run=lambda t, b: blas.dot(t[0], t[1], backend=b),
       expect=lambda t: torch.dot(t[0].float(), t[1].float()),
       bytes=lambda n, s: 2 * n * s, reduction=lambda n: n),
    Op("gemv", 2, make=lambda n, dt, dev: (randn(n, n, dtype=dt, device=dev), randn(n, dtype=dt, device=dev)),
       shape=square,
       run=lambda t, b: blas.gemv(t[0], t[1], backend=b),  # beta = 0: y is not read
       expect=lambda t: torch.mv(t[0].float(), t[1].float()).to(t[0].dtype),
       bytes=lambda n, s: (n * n + 2 * n) * s, reduction=lambda n: n),
    Op("geru", 2, make=lambda n, dt, dev: (randn(n, n, dtype=dt, device=dev), *vectors(2)(n, dt, dev)),
       shape=square,
       run=lambda t, b: blas.geru(t[0], t[1], t[2], ALPHA, backend=b),
       expect=lambda t: torch.addr(t[0].float(), t[1].float(), t[2].float(), alpha=ALPHA).to(t[0].dtype),
       bytes=lambda n, s: (2 * n * n + 2 * n) * s),
    Op("gemm", 3, make=lambda n, dt, dev: (randn(n, n, dtype=dt, device=dev), randn(n, n, dtype=dt, device=dev)),
       shape=lambda n: [n, n, n],
       run=lambda t, b: blas.gemm(t[0], t[1], backend=b),
       expect=lambda t: torch.matmul(t[0].float(), t[1].float()),
       flops=lambda n: 2 * n ** 3, reduction=lambda n: n),
]}

# ----------------------------------------------------------------------------- timing


def cuda_timer(warmup: int, rep: int) -> Callable[[Callable], float]:
    from triton.testing import do_bench
    return lambda fn: do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def cpu_timer(fn: Callable, calls: int = 7) -> float:
    """Median wall time of ``calls`` calls, in ms, after one warm-up call."""
    fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def free(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- one point


def check(op: Op, got, want, dtype: torch.dtype, n: int) -> tuple[bool, str]:
    """Compare a backend's result with the plain-PyTorch answer; (passed, message)."""
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    tol = 0.0 if op.name in EXACT else TOL[dtype]
    atol = tol * math.sqrt(op.reduction(n))
    try:
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g.float(), w.float(), rtol=tol, atol=atol)
    except (AssertionError, ValueError) as e:
        return False, " ".join(str(e).split())[:500]
    return True, ""


def new_point(op: Op, dtype, n: int, backend: str, target: bool) -> dict:
    p = dict(op=op.name, level=op.level, dtype=str(dtype).removeprefix("torch."), size=n,
             shape=op.shape(n), backend=backend, target=target, status="ok", checked=False,
             ms=None, gbs=None, tflops=None, fraction=None, target_fraction=TARGETS[op.name],
             ceiling_name="torch.matmul" if op.flops else "copy_ bandwidth")
    return p


def rates(p: dict, op: Op, n: int, dtype, ms: float, ceiling: float) -> None:
    """Fill GB/s or TFLOP/s and the fraction of the ceiling into point ``p``."""
    p["ms"] = ms
    if op.flops:
        p["flops"] = op.flops(n)
        p["tflops"] = p["flops"] / (ms * 1e-3) / 1e12
        p["fraction"] = p["tflops"] / ceiling if ceiling else None
    else:
        p["bytes"] = op.bytes(n, dtype.itemsize)
        p["gbs"] = p["bytes"] / (ms * 1e-3) / 1e9
        p["fraction"] = p["gbs"] / ceiling if ceiling else None


def measure(op: Op, backend: str, inputs: tuple, n: int, dtype, ceiling: float, timer, device: str,
            target: bool) -> dict:
    """Check once, then time, one (op, dtype, size, backend) point; never raises."""
    p = new_point(op, dtype, n, backend, target)
    try:
        want = op.expect(inputs)  # before the call: swap_ changes its inputs
        t0 = time.perf_counter()
        got = op.run(inputs, backend)
        sync(device)
        p["first_call_s"] = time.perf_counter() - t0
        p["checked"], p["check_error"] = check(op, got, want, dtype, n)
        del want, got
        rates(p, op, n, dtype, timer(lambda: op.run(inputs, backend)), ceiling)
    except NotImplementedError as e:
        p.update(status="not implemented", error=str(e))
    except Exception as e:  # noqa: BLE001 - record every failure and keep going
        p.update(status="error", error=f"{type(e).__name__}: {' '.join(str(e).split())[:500]}")
        free(device)
    return p


# ----------------------------------------------------------------------------- ceilings


def copy_bandwidth(device: str, timer) -> tuple[float, int]:
    """GB/s of ``dst.copy_(src)`` on a large float32 buffer (bytes read + written)."""
    n = COPY_CEILING_ELEMENTS[device]
    src = randn(n, dtype=F32, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    del src, dst
    free(device)
    return 2 * n * 4 / (ms * 1e-3) / 1e9, n


def matmul_ceiling(op: Op, inputs: tuple, n: int, dtype, timer, target: bool) -> dict:
    """``torch.matmul`` at a gemm point's shape and dtype: the compute ceiling, as a point."""
    p = new_point(op, dtype, n, "torch.matmul", target)
    p.update(ceiling_point=True, checked=True, target_fraction=None)
    ms = timer(lambda: torch.matmul(inputs[0], inputs[1]))
    rates(p, op, n, dtype, ms, 0.0)
    p["fraction"] = 1.0
    return p


# ----------------------------------------------------------------------------- the sweep


def run_sweep(args, backends: list[str], timer, copy_gbs: float) -> list[dict]:
    """Every (op, dtype, size) of the mode's sweep, on every backend."""
    points = []
    mode = "cpu" if args.device == "cpu" else ("quick" if args.quick else "full")
    for name, dtype, sizes, targets in SWEEPS[mode]:
        if name not in args.ops:
            continue
        if args.device == "cpu" and args.quick:
            sizes = sizes[-1:]
        t_op = time.perf_counter()
        for n in sizes:
            points += run_size(OPS[name], dtype, n, n in targets, backends, args.device, timer, copy_gbs)
        print(f"--- {name} {str(dtype).removeprefix('torch.')}: {time.perf_counter() - t_op:.1f} s", flush=True)
    return points


def run_size(op: Op, dtype, n: int, target: bool, backends: list[str], device: str, timer,
             copy_gbs: float) -> list[dict]:
    """One (op, dtype, size): make the inputs once, measure the ceiling, then every backend."""
    points = []
    try:
        inputs = op.make(n, dtype, device)
        ceiling = copy_gbs
        if op.flops:
            points.append(matmul_ceiling(op, inputs, n, dtype, timer, target))
            ceiling = points[-1]["tflops"]
            report(points[-1])
    except Exception as e:  # noqa: BLE001 - e.g. out of memory: record it and go on
        free(device)
        why = f"inputs or ceiling failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
        return [dict(new_point(op, dtype, n, b, target), status="error", error=why) for b in backends]
    for backend in backends:
        if backend == "python" and device == "cuda" and n > PYTHON_MAX[op.level]:
            p = new_point(op, dtype, n, backend, target)
            p.update(status="skipped", error=f"python reference runs only up to n={PYTHON_MAX[op.level]}")
        else:
            p = measure(op, backend, inputs, n, dtype, ceiling, timer, device, target)
            report(p)
        points.append(p)
    del inputs
    free(device)
    return points


def report(p: dict) -> None:
    """One progress line per point."""
    where = f"{p['op']:5s} {p['dtype']:8s} {'x'.join(map(str, p['shape'])):>17s} {p['backend']:12s}"
    if p["status"] != "ok":
        print(f"{where} {p['status']}: {p.get('error', '')[:120]}", flush=True)
        return
    rate = f"{p['tflops']:8.1f} TFLOP/s" if p["tflops"] is not None else f"{p['gbs']:8.0f} GB/s   "
    frac = f"{p['fraction']:.2f}" if p["fraction"] is not None else "-"
    ok = "checked" if p["checked"] else f"WRONG: {p.get('check_error', '')[:80]}"
    print(f"{where} {p['ms']:9.4f} ms {rate} {frac} of ceiling  {ok}", flush=True)


# ----------------------------------------------------------------------------- metadata and main


def git(*cmd: str) -> str | None:
    try:
        return subprocess.run(["git", *cmd], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent.parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def metadata(args, backends: list[str], timer_text: str) -> dict:
    import triton
    cuda = args.device == "cuda"
    info = kcourse.backends()
    return dict(
        device=args.device,
        device_name=torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or platform.machine()})",
        date_utc=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
        cuda=torch.version.cuda, git_commit=git("rev-parse", "--short", "HEAD"),
        git_dirty=bool(git("status", "--porcelain", "--", "kcourse")),
        quick=args.quick, backends=backends,
        unavailable={n: str(i) for n, i in info.items() if not i.available},
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        timer=timer_text, targets=TARGETS, python_max=PYTHON_MAX,
        notes=[
            "Out-of-place ops are timed as users call them (output allocation included: a caching-"
            "allocator lookup); swap is timed in place (swap_).",
            f"The python backend (elementwise reference) runs on CUDA only up to n = 2^{PYTHON_MAX[1].bit_length() - 1} "
            f"(level 1), {PYTHON_MAX[2]} (gemv/geru), {PYTHON_MAX[3]} (gemm); larger points are 'skipped'.",
            "float32 gemm is IEEE float32 on both sides unless float32_matmul_precision allows TF32; a "
            "TF32 kernel fails the float32 check.",
        ],
    )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory for results.json, <op>.png, summary.md")
    parser.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    parser.add_argument("--backends", default=",".join(kcourse.backend.NAMES),
                        help="comma-separated; unavailable ones are reported and left out")
    parser.add_argument("--quick", action="store_true", help="a few points per op (still every target point)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: tiny sizes and a perf_counter timer, a smoke test of this script")
    args = parser.parse_args(argv)
    args.ops = [o for o in args.ops.split(",") if o]
    unknown = set(args.ops) - set(OPS)
    if unknown:
        parser.error(f"unknown ops {sorted(unknown)}; choose from {list(OPS)}")
    args.backends = [b for b in args.backends.split(",") if b]
    for b in args.backends:
        kcourse.backend.check_name(b)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here; use --device cpu for a smoke test")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    info = kcourse.backends()
    backends = [b for b in args.backends if info[b].available]
    for b in set(args.backends) - set(backends):
        print(f"skipping backend {info[b]}")
    if args.device == "cuda":
        warmup, rep = TIMING["quick" if args.quick else "full"]
        timer, timer_text = cuda_timer(warmup, rep), (
            f"triton.testing.do_bench(warmup={warmup}, rep={rep}, return_mode='median'), L2 flushed per call")
    else:
        timer, timer_text = cpu_timer, "time.perf_counter median of 7 calls (CPU smoke test, not a benchmark)"

    start = time.perf_counter()
    torch.manual_seed(0)
    meta = metadata(args, backends, timer_text)
    meta["copy_gbs"], meta["copy_ceiling_elements"] = copy_bandwidth(args.device, timer)
    print(f"{meta['device_name']}: copy_ bandwidth {meta['copy_gbs']:.0f} GB/s; backends {backends}", flush=True)
    points = run_sweep(args, backends, timer, meta["copy_gbs"])
    meta["elapsed_s"] = time.perf_counter() - start
    results = dict(meta=meta, points=points)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    summary = summary_markdown(results)
    (args.out / "summary.md").write_text(summary)
    try:
        plots = plot_all(results, args.out)
    except ImportError:
        plots = []
        print("matplotlib is not installed: no plots (pip install matplotlib)")
    print(f"\nwrote {args.out / 'results.json'}, {args.out / 'summary.md'} and {len(plots)} plots "
          f"in {meta['elapsed_s']:.0f} s\n")
    print(summary)
    return results


if __name__ == "__main__":
    main()
