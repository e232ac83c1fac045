"""Experiment: what ``kcourse.blas.triton._launch.launch`` (the compiled kernel kept per argument
specialization, its launcher called directly) saves over Triton's own ``kernel[grid](...)`` in an
eager training step, A/B in one process.

    python -m benchmarks.experiments.triton_launch OUT.json [--rounds 7] [--steps 20]

Two variants of the same process, switched by rebinding ``launch`` in every triton module that
imported it (nothing in the package changes):
  - ``direct``: the package as it is;
  - ``triton``: every launch through ``kernel[grid](*args, **kwargs)`` (``JITFunction.run``: its
    binder, key, globals check and launch metadata on every call), and an autotuned kernel's
    reuse through its jitted function the same way.
Models, each trained with AdamW on random tokens (the same batch every step), eager, bf16:
  - ``host``: GPT-2-like, 12 layers of width 64, T = 64, batch 4: the GPU's work is a few
    microseconds a kernel, so the step time is the host's;
  - ``gpt2``: GPT-2 124M, T = 1024, batch 16 (``benchmarks/gpt.py``'s), where the question is whether
    the host still sets the pace.
Rounds alternate the variants (``--rounds`` of each, ``--steps`` steps each after one warm-up step);
the median step time of each variant and their ratio are printed and written to OUT.json.
"""
import argparse
import json
import statistics
import sys
import time

import torch

from benchmarks import gpt as bench
from kcourse.blas.triton import _launch

_DIRECT = _launch.launch

SIZES = {"host": (dict(vocab_size=512, block_size=64, n_layer=12, n_head=2, n_embd=64), 4),
         "gpt2": (dict(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768), 16)}


def through_triton(kernel, grid, *args, **kwargs):
    """``launch`` as Triton's own call would do it."""
    kernel[grid](*args, **kwargs)


def rebind(fn) -> None:
    """``launch`` in ``_launch`` and in every module that imported it (not a module's own ``launch``,
    as ``_pointwise``'s, that calls it)."""
    for name, module in list(sys.modules.items()):
        if name.startswith("kcourse.blas.triton") and getattr(module, "launch", None) in (_DIRECT, through_triton):
            module.launch = fn


def step_ms(step, steps: int) -> float:
    step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--models", default="host,gpt2")
    args = parser.parse_args()
    direct = _launch.launch
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for model_name in args.models.split(","):
        size, batch = SIZES[model_name]
        config = bench.GPTConfig(**size, **bench.ARCHS["gpt2"])
        torch.manual_seed(0)
        model = bench.GPT(config, backend="triton").to("cuda", torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        data = bench.batches(argparse.Namespace(batch=batch, device="cuda"), config)
        step = bench.make_step(model, opt, "eager", argparse.Namespace(device="cuda"), data)
        one = lambda: step(0)  # noqa: E731
        for _ in range(3):  # compiles and autotunes every kernel of the step
            one()
        times = {"direct": [], "triton": []}
        for _ in range(args.rounds):
            for variant, fn in (("direct", direct), ("triton", through_triton)):
                rebind(fn)
                times[variant].append(step_ms(one, args.steps))
        rebind(direct)
        medians = {v: statistics.median(t) for v, t in times.items()}
        ratio = medians["triton"] / medians["direct"]
        results[model_name] = {"ms": medians, "rounds": times, "triton_over_direct": ratio}
        print(f"{model_name}: direct {medians['direct']:.2f} ms, through triton {medians['triton']:.2f} ms a step "
              f"({ratio:.2f}x)", flush=True)
        del model, opt
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
