"""Experiment: linear_cross_entropy's chunk count (``kcourse/blas/_host.py``: ``CHUNKS``, the rows in
about that many chunks) against its time and peak memory, on the triton and cute backends, beside
the unfused composition (gemm, then cross_entropy) the fused op must beat (issue target: time <= 1.0x
the unfused, peak memory <= 0.25x).

    python -m benchmarks.experiments.lce_chunks OUT.txt [--backends triton,cute] [--chunks 2,3,4,6,8]
    python -m benchmarks.experiments.lce_chunks OUT.txt --profile [--shapes 0,1]   # GPU time per kernel
    python -m benchmarks.experiments.lce_chunks OUT.txt --graphed    # timed as CUDA-graph replays

``--profile``: instead of timing, each variant's forward and backward under torch.profiler, its GPU
time summed per kernel (microseconds a step, and launches a step): where the fused op's time goes
beside the unfused composition's and torch eager's (cuBLAS and ATen).

Fewer chunks mean fewer, larger gemms: dweight is read and written once a chunk (the gemm adds each
chunk's product in its epilogue), and a chunk's dx product, (N / C, V) @ (V, K), has few output tiles
at K = 768 (under one wave at C = 8); more memory for the chunk's logits. Shapes and measurement:
``benchmarks/fused.py`` (the LM head at N = 16384, d 768 and 4096, V 50304 and 128256, bf16; one
forward and backward; peak memory above what was allocated before the call).
"""
import argparse
from collections import defaultdict

import torch
import torch.nn.functional as F

from benchmarks import fused, timing
from kcourse.blas import _host


def kernel_times(step, steps: int = 5) -> tuple[list[tuple[str, float, float]], float]:
    """(kernel name, GPU us a step, launches a step) of ``step()``, most time first, and the span of
    the steps' kernels a step (first start to last end over ``steps`` steps in a row: their sum
    plus the GPU's idle time between them)."""
    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    total, count, ends = defaultdict(float), defaultdict(int), []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[e.name] += e.time_range.elapsed_us()
            count[e.name] += 1
            ends += [e.time_range.start, e.time_range.end]
    rows = sorted(((n, total[n] / steps, count[n] / steps) for n in total), key=lambda r: -r[1])
    return rows, (max(ends) - min(ends)) / steps


def profile(lines, name, step) -> None:
    rows, span = kernel_times(step)
    lines.append(f"  {name}: {sum(r[1] for r in rows):.0f} us of kernels a step, spanning {span:.0f} us")
    lines.extend(f"    {us:9.1f} us {n:5.1f}x  {k[:110]}" for k, us, n in rows[:12])
    print("\n".join(lines[-1 - min(12, len(rows)):]), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--backends", default="triton,cute")
    p.add_argument("--chunks", default="2,3,4,6,8")
    p.add_argument("--profile", action="store_true", help="GPU time per kernel instead of timing")
    p.add_argument("--shapes", default=None, help="indices into the op's shapes (comma list)")
    p.add_argument("--graphed", action="store_true", help="time CUDA-graph replays (the kernels without the host)")
    args = p.parse_args()
    op = fused.OPS["linear_cross_entropy"]
    time_ms = timing.graph_ms if args.graphed else timing.timer("cuda")
    lines = [f"# linear_cross_entropy chunk count, {torch.cuda.get_device_name()}, bf16, ms and peak GiB "
             f"(shipped CHUNKS = {_host.CHUNKS}){', CUDA-graph replays' if args.graphed else ''}"]
    shapes = op.shapes if args.shapes is None else [op.shapes[int(i)] for i in args.shapes.split(",")]
    for shape in shapes:
        inputs = [t.cuda() if not t.is_floating_point() else t.to("cuda", torch.bfloat16).requires_grad_()
                  for t in op.inputs(shape, torch.Generator().manual_seed(0))]
        if args.profile:
            lines.append(f"{shape}")
            step = lambda f: lambda: F.cross_entropy(f(*inputs[:2]), inputs[2]).backward()  # noqa: E731
            profile(lines, "torch eager", step(F.linear))
            for backend in args.backends.split(","):
                profile(lines, f"{backend} unfused", lambda: op.unfused(backend)(*inputs).backward())
                for chunks in map(int, args.chunks.split(",")):
                    shipped, _host.CHUNKS = _host.CHUNKS, chunks
                    try:
                        profile(lines, f"{backend} CHUNKS={chunks}", lambda: op.fused(backend)(*inputs).backward())
                    finally:
                        _host.CHUNKS = shipped
            continue
        for backend in args.backends.split(","):
            unfused = fused.measure(op.unfused(backend), inputs, time_ms, "cuda")
            lines.append(f"{shape} {backend}: unfused {unfused['ms']:.3f} ms, {unfused['peak_bytes'] / 2**30:.2f} GiB")
            shipped = _host.CHUNKS
            try:
                for chunks in map(int, args.chunks.split(",")):
                    _host.CHUNKS = chunks
                    got = fused.measure(op.fused(backend), inputs, time_ms, "cuda")
                    lines.append(f"    CHUNKS={chunks}: {got['ms']:.3f} ms ({unfused['ms'] / got['ms']:.3f}x unfused), "
                                 f"{got['peak_bytes'] / 2**30:.2f} GiB ({got['peak_bytes'] / unfused['peak_bytes']:.3f}x)")
            finally:
                _host.CHUNKS = shipped
            print("\n".join(lines[-1 - len(args.chunks.split(",")):]), flush=True)
    open(args.out, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
