"""Experiment (issue 3): why the runner's triton attention forward at T = 1k with the causal mask moves
between runs (0.40, 0.81, 0.55 of SDPA in three runs) while its other points hold still.

    PYTHONPATH=. python benchmarks/experiments/triton_attention_host.py OUT.json

bfloat16, 16 heads, B = 16, T = 1024, D = 128, causal and not. For each: the autotuner's pick, and the
forward timed four ways, median milliseconds:
  - ``runner``: ``do_bench`` (L2 flushed before each call) of ``kcourse.blas.attention`` on inputs that
    require grad, as benchmarks/run.py times it;
  - ``kernel``: ``do_bench`` of the backend function ``attention`` (no autograd, no validation);
  - ``graph``: the same call captured in a CUDA graph and replayed (no host work at all);
  - ``host``: wall time per call of ``kcourse.blas.attention`` over 200 calls, without synchronizing
    (what the CPU spends per call while the GPU queue is not empty).
Where ``runner`` exceeds ``graph`` by about ``host`` minus the flush, the host is what the timer sees.

    PYTHONPATH=. python benchmarks/experiments/triton_attention_host.py OUT.json --runner

(twelfth session) the same point through benchmarks/run.py's own functions, as its first attention
point: ``prepare`` (the float32 reference forward and backward), then ``measure`` of SDPA and of
triton, forward; then, in that process, the same timed call again with do_bench, its host time per
call, and the device time of each kernel it launches (torch.profiler): is a slow point the kernel or
the time around it. ``--host-profile OUT.txt``: cProfile of 200 such calls (causal), the host's time
by function.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

import kcourse
from kcourse.blas.triton import attention as A


def runner_point(causal):
    """The forward point at T = 1k as the runner measures it, then the same call timed again and profiled."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import run as runner
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
           "again ms": round(do_bench(fn, warmup=25, rep=100, return_mode="median"), 4)}
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--runner", action="store_true", help="the point through benchmarks/run.py's functions")
    parser.add_argument("--host-profile", help="with --runner: a cProfile of the causal point's calls, to this file")
    args = parser.parse_args()
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
        kernel = lambda: A.attention(qd, kd, vd, causal, scale)
        run()  # autotunes
        row = {"causal": causal, "config": str(A.attention_fwd_tma_kernel.best_config)
               if A.use_tma(qd, causal) else str(A.attention_fwd_kernel.best_config)}
        row["sdpa"] = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                               return_mode="median")
        row["runner"] = do_bench(run, return_mode="median")
        row["kernel"] = do_bench(kernel, return_mode="median")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            kernel()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            kernel()
        row["graph"] = do_bench(graph.replay, return_mode="median")
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
