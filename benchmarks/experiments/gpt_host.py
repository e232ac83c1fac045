"""Experiment: where the host time of an eager GPT training step goes. On an H100 the eager
step of ``benchmarks/gpt.py``'s GPT-2-like model took 19.5 ms on cute and 40.4 ms on triton against
9.5 / 9.3 ms replayed as a CUDA graph: the host, not the GPU, sets the eager pace.

    source .cute/activate.sh && python -m benchmarks.experiments.gpt_host OUT.txt [--backend cute]

The model, optimizer and batch of ``benchmarks/gpt.py`` (bf16, T = 1024, batch 8); after the warm-up
steps, ``--steps`` steps under cProfile: the functions with the most time of their own and the most
time under them, and the step time with and without the profiler.
"""
import argparse
import cProfile
import io
import pstats
import time

import torch

from benchmarks import gpt as bench


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--backend", default="cute", help="a kcourse backend, or torch.nn")
    parser.add_argument("--arch", default="gpt2", choices=list(bench.ARCHS))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--mode", default="eager", choices=["eager", "autocast", "compile", "autocast+compile"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--small", action="store_true", help="a 2-layer width-64 model, T = 64 (the host alone)")
    args = parser.parse_args()
    size = dict(vocab_size=512, block_size=64, n_layer=2, n_head=2, n_embd=64) if args.small else \
        dict(vocab_size=50304, block_size=1024, n_layer=8, n_head=8, n_embd=512)
    config = bench.GPTConfig(**size, **bench.ARCHS[args.arch])
    torch.manual_seed(0)
    dtype = torch.float32 if args.mode.startswith("autocast") or args.device == "cpu" else torch.bfloat16
    model = (bench.torch_reference().GPT(config) if args.backend == "torch.nn"
             else bench.GPT(config, backend=args.backend)).to(args.device, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=args.device == "cuda")
    data = bench.batches(argparse.Namespace(batch=args.batch, device=args.device), config)
    step_i = bench.make_step(model, opt, args.mode, argparse.Namespace(device=args.device, allow_graph_breaks=False),
                             data)

    def step():
        step_i(0)

    for _ in range(5):
        step()
    bench.sync(args.device)
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    bench.sync(args.device)
    plain_ms = (time.perf_counter() - start) / args.steps * 1e3
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for _ in range(args.steps):
        step()
    bench.sync(args.device)
    profiler.disable()
    profiled_ms = (time.perf_counter() - start) / args.steps * 1e3
    text = io.StringIO()
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    text.write(f"{device} {args.backend} {args.arch} {args.mode}: {plain_ms:.2f} ms/step "
               f"({profiled_ms:.2f} under cProfile), {args.steps} steps; per-step times below are x{args.steps}\n")
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumtime").print_stats(60)
    with open(args.out, "w") as f:
        f.write(text.getvalue())
    print(text.getvalue()[:3000])


if __name__ == "__main__":
    main()
