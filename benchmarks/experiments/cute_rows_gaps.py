"""Experiment (issue 6): the two row-wise points where cute trailed triton (bfloat16 32768 x 8192: the
cross_entropy forward and the layer_norm backward), timed against triton in one process, then each
kernel's device time.

    source .cute/activate.sh && PYTHONPATH=. python benchmarks/experiments/cute_rows_gaps.py OUT.json

cross_entropy forward (reduction "mean", the runner's) and layer_norm backward (weight and bias: dx,
dweight, dbias), triton against cute, each result compared with torch in float32. do_bench medians
(L2 flushed), three interleaved rounds, the fastest kept; then each kernel's device time
(torch.profiler, ``kernel_times``). The variants measured with it (threads per row, CTAs per SM with
and without an occupancy hint, CTA pairs for the partials) are in the session 11 and 12 results
READMEs.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from kcourse.blas.cute import cross_entropy as cute_ce, layer_norm as cute_ln
from kcourse.blas.triton import cross_entropy as triton_ce, layer_norm as triton_ln

N, V = 32768, 8192


def timed(fns, rounds=3):
    ms = {}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = do_bench(fn, warmup=25, rep=100, return_mode="median")
            ms[name] = min(ms.get(name, t), t)
    return {name: round(t, 5) for name, t in ms.items()}


def kernel_times(fn, calls=30):
    """The device time of each kernel ``fn`` launches, in us (torch.profiler, mean over ``calls`` calls,
    each after an L2 flush as do_bench does; the flush's own kernel is left out)."""
    flush = torch.empty(2**28 // 4, device="cuda", dtype=torch.int32)
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    times = {}
    for e in prof.key_averages():
        if e.self_device_time_total > 0 and e.count >= calls and "fill" not in e.key.lower():
            times[e.key[:90]] = round(e.self_device_time_total / e.count, 2)
    return times


def cross_entropy_case():
    torch.manual_seed(0)
    logits = torch.randn(N, V, device="cuda", dtype=torch.bfloat16) * 4
    target = torch.randint(0, V, (N,), device="cuda")
    ref = F.cross_entropy(logits.float(), target)
    fns = {"triton": lambda: triton_ce.cross_entropy(logits, target, -100, "mean")[0],
           "cute": lambda: cute_ce.cross_entropy(logits, target, -100, "mean")[0]}
    errors = {name: abs(fn().float().item() - ref.item()) for name, fn in fns.items()}
    return {"op": "cross_entropy fwd", "errors": errors, "ms": timed(fns), "bytes": N * V * 2,
            "kernels us": {name: kernel_times(fns[name]) for name in ("triton", "cute")}}


def layer_norm_case():
    torch.manual_seed(0)
    x = torch.randn(N, V, device="cuda", dtype=torch.bfloat16)
    w, b = (torch.randn(V, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dy = torch.randn(N, V, device="cuda", dtype=torch.bfloat16)
    needs = (True, True, True)
    t_cache = triton_ln.layer_norm(x, w, b, 1e-5)[1]
    c_cache = cute_ln.layer_norm(x, w, b, 1e-5)[1]
    fns = {"triton": lambda: triton_ln.layer_norm_backward(dy, t_cache, needs, 1e-5),
           "cute": lambda: cute_ln.layer_norm_backward(dy, c_cache, needs, 1e-5)}
    xr = x.float().requires_grad_()
    wr, br = w.float().requires_grad_(), b.float().requires_grad_()
    ref = torch.autograd.grad(F.layer_norm(xr, (V,), wr, br, 1e-5), (xr, wr, br), dy.float())
    base = fns["cute"]()
    errors = {}
    for name, fn in fns.items():
        got = fn()
        errors[name] = {"vs torch": [round((g.float() - r).abs().max().item(), 4) for g, r in zip(got, ref)],
                        "vs cute": [round((g.float() - c.float()).abs().max().item(), 4) for g, c in zip(got, base)]}
    return {"op": "layer_norm bwd", "errors": errors, "ms": timed(fns), "bytes": 3 * N * V * 2,
            "kernels us": {name: kernel_times(fns[name]) for name in ("triton", "cute")}}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    args = parser.parse_args()
    src = torch.empty(2**28 // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=100, return_mode="median")
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "shape": [N, V], "dtype": "bfloat16", "copy_gbs": round(2 * src.numel() * 2 / copy_ms / 1e6, 1)}
    print(json.dumps(meta), flush=True)
    rows = []
    for case in (cross_entropy_case, layer_norm_case):
        row = case()
        row["fraction of copy"] = {name: round(row["bytes"] / t / 1e6 / meta["copy_gbs"], 4)
                                   for name, t in row["ms"].items()}
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
