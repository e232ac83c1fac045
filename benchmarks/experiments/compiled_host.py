"""Experiment: the host time of a compiled GPT-2 124M training step, torch.nn against a kcourse
backend, without and with autocast: whether the compiled step waits on the host, and whether any
kcourse op's autocast rule still runs once the graph is compiled (it should not: the graph was traced
with the casts in it, and AOTAutograd runs it with autocast off).

    source .cute/activate.sh && python -m benchmarks.experiments.compiled_host OUT.txt [--backend cute]

For each model (torch.nn, the backend) and mode (compile, autocast+compile) of ``benchmarks/gpt.py``
(T = 1024, ``--batch``): after 4 warm-up steps, ``--steps`` steps timed twice over, until the last
launch returns (the host's time a step) and until the GPU is done (the step's time); a step that
waits on the host shows the two equal. Every kcourse op's autocast kernel is wrapped to count its
calls during the timed steps. Writes OUT.txt and prints it.
"""
import argparse
import collections
import time

import torch

from benchmarks import gpt as bench
from kcourse.blas import _library

AUTOCAST_CALLS = collections.Counter()


def count_autocast_calls() -> None:
    """Every op's autocast kernel, re-registered with a counter in front (the same rule behind it)."""
    for name in list(_library.IMPLS):
        for device, key in _library.AUTOCAST_KEYS.items():
            def kernel(keyset, *args, _rule=_library.autocast_kernel(name, device), _name=name):
                AUTOCAST_CALLS[_name] += 1
                return _rule(keyset, *args)

            _library.LIB.impl(name, kernel, key, with_keyset=True, allow_override=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--backend", default="cute")
    p.add_argument("--models", default=None, help="comma list (default: torch.nn and --backend)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    count_autocast_calls()
    run = argparse.Namespace(arch="gpt2", tiny=False, device="cuda", dtype="bfloat16", batch=args.batch, cuda=True,
                             allow_graph_breaks=False)
    config = bench.config(run)
    torch.manual_seed(0)
    initial = bench.GPT(config).state_dict()
    data = bench.batches(run, config)
    models = args.models.split(",") if args.models else ["torch.nn", args.backend]
    lines = [f"# compiled step, host and GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
             f"GPT-2 124M, T = 1024, batch {args.batch}, median of {args.steps} steps"]
    for mode in ("compile", "autocast+compile"):
        for model_name in models:
            name = f"{model_name}:{mode}"
            model, step = bench.warm_step(name, run, config, initial, data, warmup=4)
            AUTOCAST_CALLS.clear()
            host, wall = [], []
            for i in range(args.steps):
                start = time.perf_counter()
                step(i)
                host.append(time.perf_counter() - start)
                torch.cuda.synchronize()
                wall.append(time.perf_counter() - start)
            host.sort(), wall.sort()
            line = (f"{name}: host {host[len(host) // 2] * 1e3:.1f} ms a step, step {wall[len(wall) // 2] * 1e3:.1f} "
                    f"ms; autocast kernel calls a step: {sum(AUTOCAST_CALLS.values()) / args.steps:g}")
            print(line, flush=True)
            lines.append(line)
            del model, step
            torch._dynamo.reset()
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
