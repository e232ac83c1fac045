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
    parser.add_argument("--backend", default="cute")
    parser.add_argument("--arch", default="gpt2", choices=list(bench.ARCHS))
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    config = bench.GPTConfig(vocab_size=50304, block_size=1024, n_layer=8, n_head=8, n_embd=512,
                             **bench.ARCHS[args.arch])
    torch.manual_seed(0)
    model = bench.GPT(config, backend=args.backend).to("cuda", torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x, y = bench.batches(argparse.Namespace(batch=8, device="cuda"), config)[0]

    def step():
        bench.train_step(model, opt, x, y)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    plain_ms = (time.perf_counter() - start) / args.steps * 1e3
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    profiler.disable()
    profiled_ms = (time.perf_counter() - start) / args.steps * 1e3
    text = io.StringIO()
    text.write(f"{torch.cuda.get_device_name()} {args.backend} {args.arch}: {plain_ms:.2f} ms/step "
               f"({profiled_ms:.2f} under cProfile), {args.steps} steps; per-step times below are x{args.steps}\n")
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumtime").print_stats(60)
    with open(args.out, "w") as f:
        f.write(text.getvalue())
    print(text.getvalue()[:3000])


if __name__ == "__main__":
    main()
