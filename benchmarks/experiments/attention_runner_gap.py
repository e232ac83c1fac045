"""Experiment (issue 6): why the runner's cute attention backward took ~0.1 ms longer than the same call
timed by ``cute_attention_units.py --api`` (session 11: causal T = 1k 0.728 against 0.634 ms; SDPA the
same in both).

    source .cute/activate.sh && PYTHONPATH=. python benchmarks/experiments/attention_runner_gap.py OUT.json

For T = 1k and 8k, causal and not (bfloat16, 16 heads, B T = 16384, D = 128): the backward as the runner
builds and times it (``benchmarks/run.py``'s Case, ``prepare`` and ``timed_call``) and as ``--api`` does
(its own leaves, dout and graph), for cute and SDPA, do_bench medians over two interleaved rounds; then
each style once under torch.profiler (CPU and CUDA): its kernels with their device times, and the
host-side calls that took longest.
"""
import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import run as runner  # noqa: E402  (benchmarks/run.py)

import kcourse  # noqa: E402


def runner_style(T, causal, backend):
    """The runner's bwd call for one point: its Case, prepare() and timed_call()."""
    op = runner.OPS["attention"]
    case = runner.Case(op=op, dtype=torch.bfloat16, n=(16384 // T, 16, T, causal), target=True, device="cuda")
    runner.prepare(case)
    if backend == "sdpa":
        return runner.timed_call(case, op.reference, "bwd")
    return runner.timed_call(case, lambda t: op.run(t, backend), "bwd")


def api_style(T, causal, backend):
    """``cute_attention_units.py --api``'s call: its own leaves, dout and graph."""
    torch.manual_seed(0)
    B, H, D = 16384 // T, 16, 128
    q, k, v, dout = (torch.randn(B, H, T, D, dtype=torch.bfloat16, device="cuda") for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if backend == "sdpa":
        out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
    else:
        out = kcourse.blas.attention(*leaves, causal=causal, backend=backend)
    return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)


def profile(fn, calls=5):
    """Kernels (device us per call) and the host calls with the most self time (us per call)."""
    fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels, host = {}, {}
    for e in prof.key_averages():
        if e.self_device_time_total > 0:
            kernels[e.key[:80]] = round(e.self_device_time_total / calls, 1)
        if e.self_cpu_time_total > 0:
            host[e.key[:80]] = round(e.self_cpu_time_total / calls, 1)
    top = dict(sorted(host.items(), key=lambda kv: -kv[1])[:12])
    return {"kernels": kernels, "host top": top}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    args = parser.parse_args()
    rows = []
    for T in (1024, 8192):
        for causal in (True, False):
            fns = {f"{style} {backend}": maker(T, causal, backend)
                   for style, maker in (("runner", runner_style), ("api", api_style)) for backend in ("cute", "sdpa")}
            ms = {}
            for _ in range(2):
                for name, fn in fns.items():
                    t = do_bench(fn, warmup=25, rep=100, return_mode="median")
                    ms[name] = round(min(ms.get(name, t), t), 4)
            row = {"T": T, "causal": causal, "ms": ms}
            if T == 1024 and causal:
                row["profile"] = {name: profile(fns[name]) for name in ("runner cute", "api cute")}
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
