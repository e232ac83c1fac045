"""Experiment: does DDP itself slow an eager step down, or does the host? One training step of
``examples/train_gpt.py`` (its model, AdamW, autocast and batches; GPT-2 124M, T = 1024, 16
sequences per process), timed two ways: the whole step up to the all-reduced loss on the host, and
the host's issue time alone (``train_step`` returning, before the loss is read). An issue time near
the step time means the host sets the pace.

    python -m benchmarks.experiments.ddp_host MODEL                      # one process, no DDP
    torchrun --nproc_per_node 1 -m benchmarks.experiments.ddp_host MODEL  # DDP over a one-rank group
    torchrun --nproc_per_node 2 -m benchmarks.experiments.ddp_host MODEL  # DDP over two GPUs

MODEL: ``torch.nn`` (the twin of ``tests/torch_reference.py`` with kcourse's initial weights) or a
kcourse backend. ``--small`` runs a 1-layer width-32 model on the CPU (gloo): a smoke test.
Under torchrun every process runs the model under DDP, a one-rank group included; rank 0 prints.
``--cuda-graph`` times the step as train_gpt.py --cuda-graph runs it: warmed up on a side stream
(DDP built on it), captured, then replayed (the issue time is then the batch copy and the replay).
"""
import argparse
import statistics
import time

import torch

from benchmarks import common
from benchmarks.scaling import twin_of
from kcourse import distributed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model", help="torch.nn or a kcourse backend")
    p.add_argument("--steps", type=int, default=16,
                   help="timed steps, after 6 untimed ones (--cuda-graph: the eager ones and the capture)")
    p.add_argument("--small", action="store_true", help="a tiny model on the CPU")
    p.add_argument("--cuda-graph", action="store_true", help="replay the step as a CUDA graph")
    args = p.parse_args()
    if args.small and args.cuda_graph:
        p.error("--cuda-graph needs CUDA: not with --small")
    tg = common.load("examples/train_gpt.py")
    if args.model == "torch.nn":
        tg.GPT = twin_of(tg.GPT)
    world = distributed.world_size()
    size = ["--block-size", "64", "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--vocab-size", "512",
            "--device", "cpu"] if args.small else \
        ["--block-size", "1024", "--n-layer", "12", "--n-head", "12", "--n-embd", "768", "--vocab-size", "50304",
         "--device", "cuda"]
    run = tg.parse_args(["--backend", "pytorch" if args.model == "torch.nn" else args.model, *size,
                         "--batch-size", str(16 * world), "--quiet", "--no-save"]
                        + ["--dist", "ddp"] * distributed.launched())
    group, device = distributed.init(run.dist, run.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    data = tg.corpus(run.corpus_bytes)
    side = torch.cuda.Stream(device) if args.cuda_graph else None
    model, optimizer = tg.build(run, group, device, side)
    tg.place_optimizer(optimizer, device)
    gen = torch.Generator().manual_seed(0)
    amp = lambda: tg.autocast(run)  # noqa: E731
    eager = tg.DDP_WARMUP if run.dist else tg.WARMUP
    warm, graphed = (eager + 1 if args.cuda_graph else 6), None
    issue, step = [], []
    for i in range(warm + args.steps):
        x, y = tg.batch(data, run.batch_size, run.block_size, gen, device, group)
        sync()
        t0 = time.perf_counter()
        if not args.cuda_graph:
            loss = tg.train_step(model, optimizer, x, y, amp)
        elif i < eager:
            loss = tg.on_side_stream(side, tg.train_step, model, optimizer, x, y, amp)
        else:
            graphed = graphed or tg.capture(model, optimizer, x, y, amp, side)
            loss = graphed(x, y)
        t1 = time.perf_counter()
        distributed.mean(loss).item()
        if i >= warm:
            issue.append((t1 - t0) * 1e3)
            step.append((time.perf_counter() - t0) * 1e3)
    if group.main:
        ddp = f"DDP over {world} rank{'s' * (world > 1)}" if run.dist else "no DDP"
        print(f"{args.model}, {ddp}{', CUDA graph' * args.cuda_graph}, {torch.get_num_threads()} threads: "
              f"step {statistics.median(step):.1f} ms, host issue {statistics.median(issue):.1f} ms "
              f"(min {min(issue):.1f}, max {max(issue):.1f})", flush=True)
    distributed.finish()


if __name__ == "__main__":
    main()
