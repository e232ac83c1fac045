"""Experiment: is a backend's attention forward at T = 1k bound by the GPU or by the host?

    source .cute/activate.sh && python -m benchmarks.experiments.attention_host OUT.json

For SDPA, triton and cute, bfloat16, 16 heads, B = 16, T = 1024, D = 128, causal and not, inputs in
SDPA's layout that require grad (as the runner's): the forward timed as the runner times it (do_bench,
L2 flushed before each call), the kernels alone (the backend's function captured in a CUDA graph and
replayed: no host work), and the host time per call (200 calls without synchronizing), three
interleaved rounds. Where the runner's time exceeds the graph's, the host is what the timer saw.

    ... --steps: the host microseconds of the layers of a call at B = H = 1, T = 128 (kernels too short
    to matter): kcourse.blas.attention with and without autograd, the backends' functions, the
    autograd node alone (``autograd.Primitive`` over a stub kernel, and a bare torch.autograd.Function),
    on CUDA tensors and, for the last two, CPU tensors.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
import triton
from benchmarks.timing import bench_ms, graph_ms, host_us

import kcourse


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def steps():
    from kcourse.blas import autograd
    from kcourse.blas.cute import attention as cute_attention
    from kcourse.blas.triton import attention as triton_attention
    rows = {}
    for device in ("cuda", "cpu"):
        q, k, v = (torch.randn(1, 1, 128, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        out, lse = torch.empty_like(q), torch.empty(1, 1, 128, device=device)
        stub = lambda q, k, v, causal, scale: (out, (q, k, v, out, lse))
        fns = {"Primitive.apply over a stub": lambda: autograd.Primitive.apply("attention", "stub",
                                                                               {"causal": True, "scale": 0.1}, q, k, v),
               "bare autograd.Function": lambda: _Identity.apply(q)}
        if device == "cuda":
            qd, kd, vd = (t.detach() for t in (q, k, v))
            for name, module in (("triton", triton_attention), ("cute", cute_attention)):
                fns[f"{name} blas.attention (autograd)"] = lambda name=name: kcourse.blas.attention(
                    q, k, v, causal=True, backend=name)
                fns[f"{name} blas.attention (no grad)"] = lambda name=name: kcourse.blas.attention(
                    qd, kd, vd, causal=True, backend=name)
                fns[f"{name} backend function"] = lambda module=module: module.attention(qd, kd, vd, None, True, 0.1)
            fns["sdpa (autograd)"] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        original = autograd.resolve_kernel
        autograd.resolve_kernel = lambda op, backend: stub if backend == "stub" else original(op, backend)
        try:
            for name, fn in fns.items():
                rows[f"{device}: {name}"] = host_us(fn, 2000)
        finally:
            autograd.resolve_kernel = original
    print(json.dumps(rows), flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", action="store_true", help="the host time of each layer of a call")
    args = parser.parse_args()
    if args.steps:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "steps": steps()}, f,
                      indent=1)
        return
    B, H, T, D = 16, 16, 1024, 128
    rows = []
    for causal in (True, False):
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
                   for _ in range(3))
        calls = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)}
        kernels = {"sdpa": calls["sdpa"]}
        for name in ("triton", "cute"):
            module = __import__(f"kcourse.blas.{name}.attention", fromlist=["attention"])
            calls[name] = lambda name=name: kcourse.blas.attention(q, k, v, causal=causal, backend=name)
            kernels[name] = lambda module=module: module.attention(q.detach(), k.detach(), v.detach(), None, causal,
                                                                   D ** -0.5)
        row = {"causal": causal}
        for name in calls:
            calls[name]()
            row[f"{name} graph ms"] = round(graph_ms(kernels[name]), 4)
        for _ in range(args.rounds):
            for name, fn in calls.items():
                row.setdefault(f"{name} runner ms", []).append(round(bench_ms(fn), 4))
                row.setdefault(f"{name} host us", []).append(host_us(fn))
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
