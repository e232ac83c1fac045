"""Experiment: why the runner's triton attention forward at T = 1k with the causal mask moves
between runs (0.40, 0.81, 0.55 of SDPA in three runs) while its other points hold still.

    python -m benchmarks.experiments.triton_attention_host OUT.json

bfloat16, 16 heads, B = 16, T = 1024, D = 128, causal and not. For each: the autotuner's pick, and the
forward timed four ways, median milliseconds:
  - ``runner``: ``do_bench`` (L2 flushed before each call) of ``kcourse.blas.attention`` on inputs that
    require grad, as benchmarks/run.py times it;
  - ``kernel``: ``do_bench`` of the backend function ``attention`` (no autograd, no validation);
  - ``graph``: the same call captured in a CUDA graph and replayed (no host work at all);
  - ``host``: wall time per call of ``kcourse.blas.attention`` over 200 calls, without synchronizing
    (what the CPU spends per call while the GPU queue is not empty).
Where ``runner`` exceeds ``graph`` by about ``host`` minus the flush, the host is what the timer sees.

    python -m benchmarks.experiments.triton_attention_host OUT.json --runner

The same point through benchmarks/run.py's own functions, as its first attention
point: ``prepare`` (the float32 reference forward and backward), then ``measure`` of SDPA and of
triton, forward; then, in that process, the same timed call again with do_bench, its host time per
call, and the device time of each kernel it launches (torch.profiler): is a slow point the kernel or
the time around it. ``--host-profile OUT.txt``: cProfile of 200 such calls (causal), the host's time
by function.

    python -m benchmarks.experiments.triton_attention_host OUT.json --launch

``launch_tuned`` (the autotuner's pick launched directly after its first call)
against the autotuner's dispatch on every call, interleaved rounds in one process: at T = 1k, causal
and not, forward and backward as the runner times them (do_bench, L2 flushed), the host time a call
(200 calls without synchronizing) and the kernels alone (a CUDA graph's replay); then, at a size
whose kernels are short (B = H = 1, T = 128), the host microseconds of each step of a forward call.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
import triton
from benchmarks.timing import bench_ms, graph_ms, host_us

import kcourse
from kcourse.blas.triton import attention as A


def runner_point(causal):
    """The forward point at T = 1k as the runner measures it, then the same call timed again and profiled."""
    from benchmarks import run as runner
    op = runner.OPS["attention"]
    case = runner.Case(op=op, dtype=torch.bfloat16, n=(16, 16, 1024, causal), target=True, device="cuda")
    runner.prepare(case)
    timer = runner.cuda_timer(25, 100)
    ref = runner.measure(case, "F.sdpa", op.reference, "fwd", timer, 0.0)
    call = lambda t: op.run(t, "triton")
    point = runner.measure(case, "triton", call, "fwd", timer, ref["tflops"])
    fn = runner.timed_call(case, call, "fwd")
    row = {"causal": causal, "runner ms": round(point["ms"], 4), "sdpa ms": round(ref["ms"], 4),
           "fraction": round(point["fraction"], 3), "autotuned": point.get("autotuned"),
           "again ms": round(bench_ms(fn), 4)}
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(200):
        fn()
    row["host ms"] = round((time.perf_counter() - start) / 200 * 1e3, 4)
    torch.cuda.synchronize()
    flush = torch.empty(2**26, dtype=torch.int32, device="cuda")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    row["kernels us"] = {e.key[:60]: round(e.self_device_time_total / e.count, 1) for e in prof.key_averages()
                         if e.self_device_time_total > 0 and "fill" not in e.key.lower()}
    row["fn"] = fn
    return row


def host_profile(fn, path):
    """cProfile of 200 calls of ``fn``: the top functions by their own time and by cumulative time."""
    import cProfile
    import io
    import pstats
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)
    with open(path, "w") as f:
        f.write(text.getvalue())


def _old_launch(kernel, grid, key, *args, **kwargs):
    """The launch before launch_tuned: through the autotuner on every call."""
    kernel[grid](*args, **kwargs)


def launch_rows(rounds):
    """launch_tuned against the autotuner's dispatch: runner-style times at T = 1k, host time per call."""
    from kcourse.blas.triton import _launch
    launches = {"direct": _launch.launch_tuned, "autotuner": _old_launch}
    B, H, T, D = 16, 16, 1024, 128
    rows = []
    for causal in (True, False):
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
                   for _ in range(3))  # SDPA's layout, as the runner's inputs
        dout = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        fwd = lambda: kcourse.blas.attention(q, k, v, causal=causal, backend="triton")
        out = fwd()
        bwd = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        sdpa_out = sdpa()
        sdpa_bwd = lambda: torch.autograd.grad(sdpa_out, (q, k, v), dout, retain_graph=True)
        bwd()
        row = {"causal": causal, "T": T}
        for r in range(rounds):
            for name, launch in launches.items():
                A.launch_tuned = launch
                for direction, fn in (("fwd", fwd), ("bwd", bwd)):
                    ms = bench_ms(fn)
                    row.setdefault(f"{direction} {name} ms", []).append(round(ms, 4))
                    row.setdefault(f"{direction} {name} host us", []).append(host_us(fn, 200))
            for direction, fn in (("fwd", sdpa), ("bwd", sdpa_bwd)):
                row.setdefault(f"{direction} sdpa ms", []).append(round(bench_ms(fn), 4))
                row.setdefault(f"{direction} sdpa host us", []).append(host_us(fn, 200))
        A.launch_tuned = launches["direct"]
        qd, kd, vd, od = (t.detach() for t in (q, k, v, out))
        cache = (qd, kd, vd, od, out.grad_fn.saved_tensors[4])
        for direction, kernel in (("fwd", lambda: A.attention(qd, kd, vd, None, causal, D ** -0.5)),
                                  ("bwd", lambda: A.attention_backward(dout, cache, (True, True, True), causal,
                                                                       D ** -0.5))):
            kernel()
            row[f"{direction} graph ms"] = round(graph_ms(kernel), 4)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def step_rows():
    """Host microseconds of each step of a triton forward call, at B = H = 1, T = 128 (short kernels)."""
    from kcourse.blas import _check
    from kcourse.blas.triton import _launch
    q, k, v = (torch.randn(1, 1, 128, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    qd, kd, vd = (t.detach() for t in (q, k, v))
    out, (_, _, _, _, lse) = A.attention(qd, kd, vd, None, True, 0.125)
    descriptors = A.tma_descriptors(qd, kd, vd, out)
    args = (1, 128, 128, 0.125 * A.LOG2E.value)
    meta = A._meta(qd)
    grid = A._grid(128, 1, 1, "BLOCK_M")
    key = A._key(qd, 128, 128, True, meta)
    kernel = A.attention_fwd_tma_kernel
    _launch.launch_tuned(kernel, grid, key, *descriptors, lse, *args, CAUSAL=True, NEG_SCALE=False, **meta)
    config = _launch._PICKED[(kernel, key)][0]
    A._tma_block_shapes({"Q": descriptors[0], "K": descriptors[1], "V": descriptors[2], "O": descriptors[3],
                         **config.kwargs, "BLOCK_D": 128})
    direct = {**config.all_kwargs(), "CAUSAL": True, "NEG_SCALE": False, **meta}
    steps = {
        "blas.attention (autograd)": lambda: kcourse.blas.attention(q, k, v, causal=True, backend="triton"),
        "blas.attention (no grad)": lambda: kcourse.blas.attention(qd, kd, vd, causal=True, backend="triton"),
        "backend attention()": lambda: A.attention(qd, kd, vd, None, True, 0.125),
        "check_attention": lambda: _check.check_attention("triton", qd, kd, vd, True, None),
        "two torch.empty": lambda: (torch.empty_like(qd), torch.empty((1, 1, 128), device="cuda")),
        "tma_descriptors (4)": lambda: A.tma_descriptors(qd, kd, vd, out),
        "launch: autotuner": lambda: kernel[grid](*descriptors, lse, *args, CAUSAL=True, NEG_SCALE=False, **meta),
        "launch: launch_tuned": lambda: _launch.launch_tuned(kernel, grid, key, *descriptors, lse, *args,
                                                             CAUSAL=True, NEG_SCALE=False, **meta),
        "launch: jitted, no hook": lambda: kernel.fn[(1, 1, 1)](*descriptors, lse, *args, **direct),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    row = {name: host_us(fn, 2000) for name, fn in steps.items()}
    print(json.dumps(row), flush=True)
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--runner", action="store_true", help="the point through benchmarks/run.py's functions")
    parser.add_argument("--host-profile", help="with --runner: a cProfile of the causal point's calls, to this file")
    parser.add_argument("--launch", action="store_true", help="launch_tuned against the autotuner's dispatch")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.launch:
        result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                  "date": time.strftime("%Y-%m-%d"), "steps": step_rows(), "rows": launch_rows(args.rounds)}
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        return
    if args.runner:
        rows = []
        for causal in (True, False):
            rows.append(runner_point(causal))
            fn = rows[-1].pop("fn")
            if causal and args.host_profile:
                host_profile(fn, args.host_profile)
            print(json.dumps(rows[-1]), flush=True)
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "rows": rows}, f, indent=1)
        return
    B, H, T, D = 16, 16, 1024, 128
    rows = []
    for causal in (True, False):
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        qd, kd, vd = (t.detach() for t in (q, k, v))
        scale = D ** -0.5
        run = lambda: kcourse.blas.attention(q, k, v, causal=causal, backend="triton")
        kernel = lambda: A.attention(qd, kd, vd, None, causal, scale)
        run()  # autotunes
        row = {"causal": causal, "config": str(A.attention_fwd_tma_kernel.best_config)
               if A.use_tma(qd, causal) else str(A.attention_fwd_kernel.best_config)}
        row["sdpa"] = bench_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        row["runner"] = bench_ms(run)
        row["kernel"] = bench_ms(kernel)
        row["graph"] = graph_ms(kernel)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(200):
            run()
        row["host"] = (time.perf_counter() - start) / 200 * 1e3
        torch.cuda.synchronize()
        row = {key: round(val, 4) if isinstance(val, float) else val for key, val in row.items()}
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d"), "shape": [B, H, T, D], "dtype": "bfloat16"}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
