"""Experiment: one call of SDPA and one of the cute Hopper attention, between
cudaProfilerStart and cudaProfilerStop, for Nsight Compute to read (launch configuration, occupancy,
pipe utilization, warp stalls) -- what a kernel does that timing alone does not show.

    source .cute/activate.sh && PYTHONPATH=. ncu --profile-from-start off --clock-control none \\
        --section LaunchStats --section Occupancy --section SpeedOfLight --section ComputeWorkloadAnalysis \\
        --section WarpStateStats python -m benchmarks.experiments.attention_ncu 1024 full fwd

Arguments: T (16 heads, B T = 16384 tokens, D = 128, bfloat16, as the runner), full or causal, fwd or
bwd, and optionally which of sdpa, cute, triton and the Gluon schedules (sdpa and cute by default). Each runs a few times first (compiles,
cuDNN's plan, warm caches) and then once under the profiler; for bwd only the backward is inside.
"""
import argparse

import torch
import torch.nn.functional as F


def kernels(name):
    """``(forward, backward)`` of a kcourse attention: forward(q, k, v, causal, scale) -> (out, cache),
    backward(dout, q, k, v, cache, causal, scale)."""
    if name.startswith("gluon"):  # gluon-<schedule>-<keys per tile>: gluon_attention.py's forwards
        from benchmarks.experiments import gluon_attention
        schedule, block_n = name.removeprefix("gluon-").rsplit("-", 1)
        def forward(*args):
            out, lse = gluon_attention.forward(schedule, int(block_n), *args)
            return out, (out, lse)

        return forward, lambda dout, q, k, v, cache, *a: gluon_attention.attention_bwd(dout, q, k, v, *cache, *a)
    if name == "triton":  # the triton backend's tl kernels
        from kcourse.blas.triton import attention as module
    else:
        from kcourse.blas.cute import attention as module
    return lambda q, k, v, *a: module.attention(q, k, v, None, *a), lambda dout, q, k, v, cache, *a: module.attention_backward(dout, cache, (True,) * 3, *a)


def call(name, q, k, v, causal, direction):
    """The call to profile: the forward, or the backward of a forward run here (its graph or cache)."""
    scale = q.shape[-1] ** -0.5
    if name == "sdpa":
        if direction == "fwd":
            return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        dout = torch.randn_like(out)
        return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    forward, backward = kernels(name)
    with torch.no_grad():
        if direction == "fwd":
            return lambda: forward(q, k, v, causal, scale)
        out, cache = forward(q, k, v, causal, scale)
    dout = torch.randn_like(out)
    return lambda: backward(dout, q, k, v, cache, causal, scale)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("T", type=int)
    parser.add_argument("mask", choices=("full", "causal"))
    parser.add_argument("direction", choices=("fwd", "bwd"))
    parser.add_argument("which", nargs="*", default=["sdpa", "cute"],
                        help="sdpa, cute, triton (the tl kernels), gluon-<schedule>-<keys per tile> (e.g. "
                             "gluon-pingpong-128: benchmarks/experiments/gluon_attention.py)")
    args = parser.parse_args()
    torch.manual_seed(0)
    B, H, D = 16384 // args.T, 16, 128
    q, k, v = (torch.randn(B, H, args.T, D, dtype=torch.bfloat16, device="cuda", requires_grad=True)
               for _ in range(3))
    for name in args.which:
        fn = call(name, q, k, v, args.mask == "causal", args.direction)
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(name, args.T, args.mask, args.direction, "profiled", flush=True)


if __name__ == "__main__":
    main()
