"""Experiment: where a kcourse op's host time goes, next to the torch call it stands for, and a small
GPT's eager step next to torch.nn's: the numbers behind the host-time work of README's "Eager".

    python -m benchmarks.experiments.host_profile OUT.txt [--ops layer_norm,gemm] [--backends pytorch,triton]

For each op of ``benchmarks/host.py`` (tiny operands: the host's time, not the GPU's): microseconds
per forward and per forward + backward call for torch and each backend, then cProfile's functions
with the most time of their own over the forward + backward calls. Then a 2-layer width-64 GPT
(T = 64, batch 8; ``--compile``: under torch.compile): milliseconds per forward, forward + backward and whole AdamW step for torch.nn and
each backend, and the step's cProfile on each backend.
"""
import argparse
import cProfile
import pstats

import torch

import kcourse
from benchmarks import gpt as bench
from benchmarks.host import cases, per_call as timed  # median us per call: calls in a row, one sync


def profile(fn, calls: int, lines: int) -> str:
    """cProfile's ``lines`` functions with the most time of their own, in microseconds per ``fn()``."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (primitive calls, calls, own, cumulative, callers)}
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:lines]
    text = [f"{'calls':>7s} {'own us':>8s} {'cum us':>8s}  function (per call of the profiled function)"]
    for (file, line, name), (_, n, own, cum, _) in rows:
        short = file.rpartition("site-packages/")[2].rpartition("/work/main/")[2]
        where = name if file == "~" else f"{short}:{line}({name})"
        text.append(f"{n / calls:7.1f} {own / calls * 1e6:8.1f} {cum / calls * 1e6:8.1f}  {where}")
    return "\n".join(text) + "\n"


def ops(args, backends, write) -> None:
    for op, (make, ours, theirs) in cases(args.device).items():
        if op not in args.ops.split(","):
            continue
        inputs = tuple(x.requires_grad_() if x.is_floating_point() else x for x in make())

        def both(f):
            def run():
                f().float().sum().backward()
            return run
        for name, f in [("torch", lambda: theirs(*inputs))] + [(b, lambda b=b: ours(b, *inputs)) for b in backends]:
            fwd = timed(lambda: f(), args.calls, args.rounds, args.device)
            with torch.no_grad():
                nograd = timed(lambda: f(), args.calls, args.rounds, args.device)
            fb = timed(both(f), args.calls, args.rounds, args.device)
            write(f"\n## {op} {name}: forward {nograd:.1f} us (no grad), {fwd:.1f} us (grad), forward + backward "
                  f"{fb:.1f} us\n")
            write(profile(both(f), args.calls, args.lines))


def model_steps(args, backends, write) -> None:
    c = bench.GPTConfig(vocab_size=512, block_size=64, n_layer=2, n_head=2, n_embd=64, **bench.ARCHS["gpt2"])
    data = bench.batches(argparse.Namespace(batch=8, device=args.device), c)
    x, y = data[0]
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    for name in ["torch.nn", *backends]:
        torch.manual_seed(0)
        model = bench.torch_reference().GPT(c) if name == "torch.nn" else bench.GPT(c, backend=name)
        model = model.to(args.device, dtype)
        if args.compile:
            model = torch.compile(model, fullgraph=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=args.device == "cuda")

        def forward():
            return model(x, y)[1]

        def fb():
            forward().backward()

        def step():
            opt.zero_grad(set_to_none=True)
            fb()
            opt.step()
        with torch.no_grad():
            f = timed(forward, 20, args.rounds, args.device)
        times = [f] + [timed(g, 20, args.rounds, args.device) for g in (forward, fb, step)]
        write(f"\n## GPT 2 layers {name}: forward {times[0] / 1e3:.2f} ms (no grad), {times[1] / 1e3:.2f} ms (grad), "
              f"forward + backward {times[2] / 1e3:.2f} ms, AdamW step {times[3] / 1e3:.2f} ms\n")
        if name != "torch.nn":
            write(profile(step, 20, args.lines))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--ops", default="gemm,layer_norm,gelu,cross_entropy,attention")
    p.add_argument("--backends", default="pytorch,triton,cute")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--lines", type=int, default=25)
    p.add_argument("--no-model", action="store_true")
    p.add_argument("--compile", action="store_true", help="the GPT under torch.compile(fullgraph=True)")
    args = p.parse_args()
    available = kcourse.backends()
    backends = [b for b in args.backends.split(",") if available[b].available]
    with open(args.out, "w") as out:
        def write(s):
            out.write(s)
            out.flush()
            if s.startswith("\n##"):  # the headline of each section on the terminal
                print(s.splitlines()[1], flush=True)
        write(f"# {torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}, torch {torch.__version__}\n")
        if not args.no_model:
            model_steps(args, backends, write)
        ops(args, backends, write)


if __name__ == "__main__":
    main()
