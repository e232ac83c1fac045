"""Host overhead of the cute ops: microseconds per call on tiny tensors, and each kernel's compile time.

Run from the repository root:  python /path/to/overhead.py [--iters N]

On CUDA: every op is first checked against torch on its tiny inputs (a wrong argument block in
_compile.Kernel would show here), then called N times in a loop that is timed before the stream is
synchronized: the time per call is what the host spends, the launch included (target: < 20 us;
before _compile.Kernel, copy of 16 elements took 56 us on an H100 host). For scale, the same loop
over the torch op.

Without a GPU: each op is compiled (inside _compile.compiling_only), then called with the C call of
every compiled kernel replaced by a no-op, so the time is the host part only: everything up to the
launch (the launch itself costs a few microseconds more on a GPU).

Columns: `op us/call` is the whole op (layout, allocations, launch); `launch us/call` the part in
_compile.Kernel.__call__ (filling the argument block, the C call); `torch us/call` torch's own op.
Then where the time of one copy launch goes, piece by piece, and the first-call compile time of
each kernel (_compile.COMPILE_SECONDS). Exit status 1 if a check failed or an op raised.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

import torch

if importlib.util.find_spec("kcourse") is None:  # not installed: import it from the cwd (the repository root)
    sys.path.insert(0, os.getcwd())

from kcourse.blas.cute import _compile  # noqa: E402
from kcourse.blas.cute.axpby import axpby  # noqa: E402
from kcourse.blas.cute.copy import copy  # noqa: E402
from kcourse.blas.cute.dot import dot  # noqa: E402
from kcourse.blas.cute.gemm import gemm  # noqa: E402
from kcourse.blas.cute.gemv import gemv  # noqa: E402
from kcourse.blas.cute.geru import geru  # noqa: E402
from kcourse.blas.cute.scal import scal  # noqa: E402
from kcourse.blas.cute.swap import swap  # noqa: E402

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"


def cases():
    """(name, cute call, torch call or None, () -> (result, expected) after the cute call or None,
    relative tolerance) per op."""
    f32, bf16 = torch.float32, torch.bfloat16
    r = lambda *shape, dtype=f32: torch.randn(*shape, dtype=dtype, device=DEV)  # noqa: E731
    x, y, out = r(16), r(16), r(16)
    x2, y2 = r(16), r(16)
    A, xa, ya = r(16, 16), r(16), r(16)
    out_v, out_a = r(16), r(16, 16)
    Ag, Bg, Cg = r(16, 16), r(16, 16), r(16, 16)
    Ab, Bb, Cb = r(64, 64, dtype=bf16), r(64, 64, dtype=bf16), r(64, 64, dtype=bf16)
    d = {}
    f = lambda t: t.double()  # noqa: E731
    return [
        ("copy f32 n=16", lambda: copy(x, out), lambda: out.copy_(x), lambda: (out, x), 0.0),
        ("swap f32 n=16", lambda: swap(x2, y2, x2, y2), None, None, 0.0),  # no torch swap to compare
        ("scal f32 n=16", lambda: scal(x, 2.5, out), lambda: torch.mul(x, 2.5, out=out),
         lambda: (f(out), 2.5 * f(x)), 1e-6),
        ("axpby f32 n=16", lambda: axpby(x, y, 2.0, -0.5, out), lambda: torch.add(-0.5 * y, x, alpha=2.0, out=out),
         lambda: (f(out), 2.0 * f(x) - 0.5 * f(y)), 1e-6),
        ("dot f32 n=16", lambda: d.__setitem__("dot", dot(x, y)), lambda: torch.dot(x, y),
         lambda: (f(d["dot"]), f(x) @ f(y)), 1e-5),
        ("gemv f32 16x16", lambda: gemv(A, xa, None, 1.0, 0.0, out_v), lambda: torch.mv(A, xa, out=out_v),
         lambda: (f(out_v), f(A) @ f(xa)), 1e-5),
        ("geru f32 16x16", lambda: geru(A, xa, ya, 0.5, out_a), lambda: torch.addr(A, xa, ya, alpha=0.5, out=out_a),
         lambda: (f(out_a), f(A) + 0.5 * torch.outer(f(xa), f(ya))), 1e-5),
        ("gemm f32 16x16x16", lambda: gemm(Ag, Bg, None, 1.0, 0.0, Cg), lambda: torch.mm(Ag, Bg, out=Cg),
         lambda: (f(Cg), f(Ag) @ f(Bg)), 1e-3),  # TF32 if allow_tf32 is on
        ("gemm bf16 64x64x64", lambda: gemm(Ab, Bb, None, 1.0, 0.0, Cb), lambda: torch.mm(Ab, Bb, out=Cb),
         lambda: (f(Cb), f(Ab) @ f(Bb)), 3e-2),
    ]


def per_call_us(fn, iters: int, repeats: int = 5) -> float:
    """Median over ``repeats`` loops of ``iters`` calls of the host time per call, in us."""
    for _ in range(20):
        fn()
    times = []
    for _ in range(repeats):
        if GPU:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - start) / iters * 1e6)
    if GPU:
        torch.cuda.synchronize()
    return statistics.median(times)


class Spy:
    """Records the Kernel calls of an op call: (kernel, args) for each launch."""

    def __init__(self):
        self.calls = []
        self.original = _compile.Kernel.__call__

    def __enter__(self):
        spy = self

        def recording(kernel, *args):
            spy.calls.append((kernel, args))
            return spy.original(kernel, *args)

        _compile.Kernel.__call__ = recording
        return self

    def __exit__(self, *exc):
        _compile.Kernel.__call__ = self.original


def no_launch(addresses) -> None:
    """Stands for the C call where there is no GPU."""


def parts() -> None:
    """Where the time of one launch goes, on copy's kernel: the pieces _compile builds per call, the
    Kernel call, and the same kernel called the DSL's way (cute.Pointer and DSL number objects,
    marshalled by the DSL on every call; without a GPU only that marshalling can be timed)."""
    x, out = torch.randn(16, device=DEV), torch.empty(16, device=DEV)
    with Spy() as spy:
        copy(x, out)
    (kernel, args), = spy.calls
    dsl_args = [slot.compile_value(arg) for slot, arg in zip(kernel._slots, args)]
    if GPU:
        dsl_name = "the DSL way: compiled(*DSL objects)"
        dsl_call = lambda: kernel.compiled(*dsl_args)  # noqa: E731
    else:
        dsl_name = "the DSL way, marshalling only"
        dsl_call = lambda: kernel.compiled.generate_execution_args(*dsl_args)  # noqa: E731
    print("\nparts of a copy launch (n=16):")
    for name, fn in [("_compile.target()", _compile.target),
                     ("_compile.stream(device)", lambda: _compile.stream(x.device)),
                     ("_compile.pointer(t, 16)", lambda: _compile.pointer(x, 16)),
                     ("Kernel._fill: the argument block", lambda: kernel._fill(args)),
                     ("Kernel.__call__: fill + C call", lambda: kernel(*args)),
                     (dsl_name, dsl_call),
                     ("copy(x, out): the whole op", lambda: copy(x, out))]:
        print(f"  {name:40s} {per_call_us(fn, 2000):7.2f} us", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=2000)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name() if GPU else 'none: host part only, C launch replaced by a no-op'}"
          f"; target {_compile.target()}", flush=True)
    failures = 0
    rows = []
    for name, ours, theirs, check, tol in cases():
        try:
            if GPU:
                ours()
                torch.cuda.synchronize()
                if check is not None:
                    got, want = check()
                    err = (got - want).abs().max().item() / max(want.abs().max().item(), 1.0)
                    status = "PASS" if err <= tol else "FAIL"
                    failures += status == "FAIL"
                    print(f"{status:6s} {name}: relative error {err:.2e} (tolerance {tol:.0e})", flush=True)
            else:
                with _compile.compiling_only():
                    ours()  # compiles
                for kernel in _compile._kernels.values():
                    kernel.compiled.run_compiled_program = no_launch
            with Spy() as spy:
                ours()
            op_us = per_call_us(ours, args.iters)
            launch_us = sum(per_call_us(lambda k=k, a=a: k(*a), args.iters) for k, a in spy.calls)
            torch_us = per_call_us(theirs, args.iters) if GPU and theirs is not None else float("nan")
            rows.append((name, op_us, launch_us, len(spy.calls), torch_us))
        except Exception as e:  # report and go on: one broken op must not hide the others
            failures += 1
            print(f"ERROR  {name}: {type(e).__name__}: {e}", flush=True)
    print(f"\n{'op':22s} {'op us/call':>11s} {'launch us/call':>15s} {'kernels':>8s} {'torch us/call':>14s}")
    for name, op_us, launch_us, kernels, torch_us in rows:
        print(f"{name:22s} {op_us:11.1f} {launch_us:15.1f} {kernels:8d} {torch_us:14.1f}", flush=True)
    parts()
    print("\nfirst-call compile time per kernel:")
    for (factory, key, target), seconds in sorted(_compile.COMPILE_SECONDS.items(), key=lambda kv: -kv[1]):
        print(f"  {seconds:6.2f} s  {factory}{key} [{target}]")
    print(f"total {sum(_compile.COMPILE_SECONDS.values()):.1f} s for {len(_compile.COMPILE_SECONDS)} kernels")
    print("SUMMARY", "FAIL" if failures else "PASS", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
