"""Host overhead of the cute ops: microseconds per call on tiny tensors, and each kernel's compile time.

Run from the repository root:  python /path/to/overhead.py [--iters N]

On CUDA: every op is first checked against torch on its tiny inputs (a wrong argument block in
_compile.Kernel would show here), called directly and then replayed from a CUDA graph it was
captured into (the launch must go to the current stream and never synchronize); then it is
called N times in a loop that is timed before the stream is synchronized: the time per call is
what the host spends, the launch included (target: < 20 us; before _compile.Kernel, copy of 16
elements took 56 us on an H100 host). For scale, the same loop over the torch op.

Without a GPU: each op is compiled (inside _compile.compiling_only), then every compiled kernel is
given a DSL executor whose C function is a C no-op, so the time (CPU time of the thread) is the
host part only: all the Python up to the compiled host function, whose C (on a GPU: TMA
descriptors, the launches) costs a few microseconds per kernel more. (If this DSL's executor
cannot be replaced, the whole run_compiled_program is replaced by a Python no-op, and the output
says so.)

Columns: `op` is the whole op (layout, allocations, launch); `launch` the part in
_compile.Kernel.__call__ (filling the argument block, the C call); `fill` the argument block
alone; `own` = op - launch, the op's own Python (plan look-up, allocations, pointers); `torch`
torch's own op; all in us per call. Then where the time of one launch goes, piece by piece, and
the first-call compile time of each kernel (_compile.COMPILE_SECONDS). Exit status 1 if a check
failed or an op raised.
"""
from __future__ import annotations

import argparse
import ctypes
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
    """(name, cute call, torch call or None, () -> the cute call's output tensor or None (nothing to
    check), () -> its expected value in float64, relative tolerance) per op."""
    f32, bf16 = torch.float32, torch.bfloat16
    r = lambda *shape, dtype=f32: torch.randn(*shape, dtype=dtype, device=DEV)  # noqa: E731
    x, y, out = r(16), r(16), r(16)
    x2, y2 = r(16), r(16)
    A, xa, ya = r(16, 16), r(16), r(16)
    out_v, out_a = r(16), r(16, 16)
    As, xs, out_s = r(16, 4096), r(4096), r(16)  # few rows: the columns are split, into a workspace
    Ag, Bg, Cg = r(16, 16), r(16, 16), r(16, 16)
    Ab, Bb, Cb = r(64, 64, dtype=bf16), r(64, 64, dtype=bf16), r(64, 64, dtype=bf16)
    d = {}
    f = lambda t: t.double()  # noqa: E731
    return [
        ("copy f32 n=16", lambda: copy(x, out), lambda: out.copy_(x), lambda: out, lambda: f(x), 0.0),
        ("swap f32 n=16", lambda: swap(x2, y2, x2, y2), None, None, None, 0.0),  # no torch swap to compare
        ("scal f32 n=16", lambda: scal(x, 2.5, out), lambda: torch.mul(x, 2.5, out=out), lambda: out,
         lambda: 2.5 * f(x), 1e-6),
        ("axpby f32 n=16", lambda: axpby(x, y, 2.0, -0.5, out), lambda: torch.add(-0.5 * y, x, alpha=2.0, out=out),
         lambda: out, lambda: 2.0 * f(x) - 0.5 * f(y), 1e-6),
        ("dot f32 n=16", lambda: d.__setitem__("dot", dot(x, y)), lambda: torch.dot(x, y), lambda: d["dot"],
         lambda: f(x) @ f(y), 1e-5),
        ("gemv f32 16x16", lambda: gemv(A, xa, None, 1.0, 0.0, out_v), lambda: torch.mv(A, xa, out=out_v),
         lambda: out_v, lambda: f(A) @ f(xa), 1e-5),
        ("gemv f32 16x4096 split", lambda: gemv(As, xs, None, 1.0, 0.0, out_s), lambda: torch.mv(As, xs, out=out_s),
         lambda: out_s, lambda: f(As) @ f(xs), 1e-5),
        ("geru f32 16x16", lambda: geru(A, xa, ya, 0.5, out_a), lambda: torch.addr(A, xa, ya, alpha=0.5, out=out_a),
         lambda: out_a, lambda: f(A) + 0.5 * torch.outer(f(xa), f(ya)), 1e-5),
        ("gemm f32 16x16x16", lambda: gemm(Ag, Bg, None, 1.0, 0.0, Cg), lambda: torch.mm(Ag, Bg, out=Cg),
         lambda: Cg, lambda: f(Ag) @ f(Bg), 1e-3),  # TF32 if allow_tf32 is on
        ("gemm bf16 64x64x64", lambda: gemm(Ab, Bb, None, 1.0, 0.0, Cb), lambda: torch.mm(Ab, Bb, out=Cb),
         lambda: Cb, lambda: f(Ab) @ f(Bb), 3e-2),
    ]


def relative_error(result, want) -> float:
    got, want = result().double(), want()
    return (got - want).abs().max().item() / max(want.abs().max().item(), 1.0)


def per_call_us(fn, iters: int, repeats: int = 5) -> float:
    """Median over ``repeats`` loops of ``iters`` calls of the host time per call, in us: wall time
    on a GPU, this thread's CPU time without one (where nothing waits, and it is steady on a busy
    machine)."""
    clock = time.perf_counter if GPU else time.thread_time
    for _ in range(20):
        fn()
    times = []
    for _ in range(repeats):
        if GPU:
            torch.cuda.synchronize()
        start = clock()
        for _ in range(iters):
            fn()
        times.append((clock() - start) / iters * 1e6)
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
    """Stands for the whole run_compiled_program where the DSL's executor cannot be replaced."""


def stub_c_calls() -> str:
    """Without a GPU: make every compiled kernel's C host function a C no-op, keeping all of the
    Python on the way to it (the DSL's run_compiled_program on the first launch, then
    _compile.Kernel's direct call): give each a DSL executor (JitExecutor, what
    run_compiled_program makes with .to() on a GPU) over a C function that ignores its argument
    array (libc's labs). Returns how the C call is replaced."""
    try:
        from cutlass.base_dsl.jit_executor import JitExecutor

        c_function = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)(
            ctypes.cast(ctypes.CDLL(None).labs, ctypes.c_void_p).value)

        class Module:  # what a JitExecutor reads of a loaded module
            capi_func = c_function

        for kernel in _compile._kernels.values():
            if getattr(kernel.compiled, "_default_executor", None) is None:
                kernel.compiled._default_executor = JitExecutor(Module(), None, False)
        return "C host function replaced by a C no-op"
    except Exception as e:  # noqa: BLE001 -- another DSL version: replace the whole call
        for kernel in _compile._kernels.values():
            kernel.compiled.run_compiled_program = no_launch
        return f"run_compiled_program replaced by a Python no-op ({type(e).__name__}: {e})"


def parts() -> None:
    """Where the time of one launch goes, on copy's kernel: the pieces _compile builds per call, the
    Kernel call, the same block handed to the DSL's run_compiled_program (its per-call packing, the
    way before the direct call), and the same kernel called the DSL's way (cute.Pointer and DSL
    number objects, marshalled by the DSL on every call; without a GPU only that marshalling)."""
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

    def through_dsl():
        kernel._fill(args)
        kernel.compiled.run_compiled_program(kernel._addresses)

    print(f"\nparts of a copy launch (n=16; Kernel's C call: {kernel._run.__name__}):")
    for name, fn in [("_compile.target()", _compile.target),
                     ("_compile.stream(device)", lambda: _compile.stream(x.device)),
                     ("_compile.stream_of(t)", lambda: _compile.stream_of(x)),
                     ("_compile.pointer(t, 16)", lambda: _compile.pointer(x, 16)),
                     ("Kernel._fill: the argument block", lambda: kernel._fill(args)),
                     ("Kernel._fill_exactly: slot by slot", lambda: kernel._fill_exactly(args)),
                     ("Kernel.__call__: fill + C call", lambda: kernel(*args)),
                     ("fill + run_compiled_program", through_dsl),
                     (dsl_name, dsl_call),
                     ("copy(x, out): the whole op", lambda: copy(x, out))]:
        print(f"  {name:40s} {per_call_us(fn, 2000):7.2f} us", flush=True)


def graph_replay(ours, result, want) -> float:
    """The relative error of ``ours`` captured into a CUDA graph and replayed, its output set to
    NaN in between (so a replay that wrote nothing shows)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up off the default stream, as torch.cuda.graphs advises
        ours()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ours()
    result().fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return relative_error(result, want)


def report(name: str, how: str, err: float, tol: float) -> bool:
    """Print one check's PASS/FAIL line; True if it failed."""
    status = "PASS" if err <= tol else "FAIL"  # a NaN error fails
    print(f"{status:6s} {name} ({how}): relative error {err:.2e} (tolerance {tol:.0e})", flush=True)
    return status == "FAIL"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=2000)
    args = parser.parse_args()
    torch.manual_seed(0)
    mode = torch.cuda.get_device_name() if GPU else "none: host part only"
    print(f"device: {mode}; target {_compile.target()}", flush=True)
    failures = 0
    rows = []
    stubbed = "no op was compiled"
    table = cases()
    for name, ours, theirs, result, want, tol in table:
        try:
            if GPU:
                ours()
                ours()  # the second call reuses what the first one cached (plan, workspace)
                torch.cuda.synchronize()
                if result is not None:
                    failures += report(name, "direct", relative_error(result, want), tol)
            else:
                with _compile.compiling_only():
                    ours()  # compiles
                stubbed = stub_c_calls()
            with Spy() as spy:
                ours()
            op_us = per_call_us(ours, args.iters)
            launch_us = sum(per_call_us(lambda k=k, a=a: k(*a), args.iters) for k, a in spy.calls)
            fill_us = sum(per_call_us(lambda k=k, a=a: k._fill(a), args.iters) for k, a in spy.calls)
            torch_us = per_call_us(theirs, args.iters) if GPU and theirs is not None else float("nan")
            rows.append((name, op_us, launch_us, fill_us, len(spy.calls), torch_us))
        except Exception as e:  # report and go on: one broken op must not hide the others
            failures += 1
            print(f"ERROR  {name}: {type(e).__name__}: {e}", flush=True)
    if not GPU:
        print(f"without a GPU: {stubbed}")
    print(f"\n{'us per call':22s} {'op':>7s} {'launch':>7s} {'fill':>7s} {'own':>7s} {'kernels':>8s} {'torch':>7s}")
    for name, op_us, launch_us, fill_us, kernels, torch_us in rows:
        print(f"{name:22s} {op_us:7.1f} {launch_us:7.1f} {fill_us:7.1f} {op_us - launch_us:7.1f} {kernels:8d} "
              f"{torch_us:7.1f}", flush=True)
    try:
        parts()
    except Exception as e:  # noqa: BLE001 -- the table above is what matters
        failures += 1
        print(f"ERROR  parts: {type(e).__name__}: {e}", flush=True)
    if GPU:  # last: a capture that goes wrong cannot spoil the timings
        print("\nCUDA graphs: each op captured, its output set to NaN, the graph replayed:")
        for name, ours, _, result, want, tol in table:
            if result is not None:
                try:
                    failures += report(name, "graph replay", graph_replay(ours, result, want), tol)
                except Exception as e:  # noqa: BLE001
                    failures += 1
                    print(f"ERROR  {name} (graph replay): {type(e).__name__}: {e}", flush=True)
    print("\nfirst-call compile time per kernel:")
    for (factory, key, target), seconds in sorted(_compile.COMPILE_SECONDS.items(), key=lambda kv: -kv[1]):
        print(f"  {seconds:6.2f} s  {factory}{key} [{target}]")
    print(f"total {sum(_compile.COMPILE_SECONDS.values()):.1f} s for {len(_compile.COMPILE_SECONDS)} kernels")
    print("SUMMARY", "FAIL" if failures else "PASS", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
