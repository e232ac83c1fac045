"""Experiment: which ops launch the GPU work of an eager GPT training step, on each backend next to
torch.nn: the kernel launches a step makes and their GPU time, grouped by the outermost ATen op above
each launch (or, where none is, the event that launched it: a kcourse op's autograd Function).

    source .cute/activate.sh && python -m benchmarks.experiments.gpt_kernels OUT.txt [--backends pytorch]
    ... --backends triton,cute --by kernel      # each kernel's GPU time a step, most first

The model, optimizer and batch of ``benchmarks/gpt.py`` (GPT-2 124M, bf16 weights, T = 1024,
``--batch``); after three warm-up steps, ``--steps`` steps under torch.profiler (CPU and CUDA). Per
variant: launches and GPU milliseconds a step, then the ``--rows`` groups with the most launches,
each with its count and its GPU time a step.
"""
import argparse
import collections

import torch

from benchmarks import gpt as bench


def launcher(event):
    """The outermost ATen op above a kernel's launch (None where none is: a cute kernel's launch)."""
    op = None
    while event is not None:
        if event.name.startswith("aten::"):
            op = event
        event = event.cpu_parent
    return op


def profile_variant(name: str, args, c, initial, data) -> list[str]:
    model, step = bench.warm_step(name, args, c, initial, data, warmup=3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(args.steps):
            step(i)
        torch.cuda.synchronize()
    groups = collections.defaultdict(lambda: [0, 0.0])
    launches, gpu_us = 0, 0.0
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CPU or not e.kernels:  # each kernel hangs on one CPU event
            continue
        if args.by == "kernel":  # each kernel by its own name
            for k in e.kernels:
                groups[k.name[:100]][0] += 1
                groups[k.name[:100]][1] += k.duration
        else:
            op = launcher(e) or e
            groups[op.name][0] += len(e.kernels)
            groups[op.name][1] += sum(k.duration for k in e.kernels)
        launches += len(e.kernels)
        gpu_us += sum(k.duration for k in e.kernels)
    s = args.steps
    lines = [f"## {name}: {launches / s:.0f} kernel launches a step, {gpu_us / s / 1e3:.2f} ms of kernels a step"]
    lines.append(f"  {'a step':>7} {'ms':>7}  op")
    for op, (n, us) in sorted(groups.items(), key=lambda kv: -kv[1][0 if args.by == "op" else 1])[:args.rows]:
        lines.append(f"  {n / s:7.1f} {us / s / 1e3:7.3f}  {op}")
    del model, step
    torch.cuda.empty_cache()
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--backends", default="pytorch")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--rows", type=int, default=40)
    p.add_argument("--modes", default="eager")
    p.add_argument("--by", choices=("op", "kernel"), default="op",
                   help="group by the launching op (most launches first) or by kernel name (most GPU time first)")
    args = p.parse_args()
    args.device, args.cuda, args.dtype, args.arch, args.tiny = "cuda", True, "bfloat16", "gpt2", False
    args.allow_graph_breaks = False
    c = bench.config(args)
    torch.manual_seed(0)
    initial = bench.GPT(c).state_dict()
    data = bench.batches(args, c)
    lines = [f"# GPT-2 124M, batch {args.batch}, T {c.block_size}: {torch.cuda.get_device_name()}, "
             f"torch {torch.__version__}"]
    for mode in args.modes.split(","):
        for model in ["torch.nn", *[b for b in args.backends.split(",") if b]]:
            lines += profile_variant(f"{model}:{mode}", args, c, initial, data)
            print("\n".join(lines[-args.rows - 2:]), flush=True)
    open(args.out, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
