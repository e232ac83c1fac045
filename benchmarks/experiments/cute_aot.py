"""Experiment: the cute kernels a training step compiles, kept on disk and loaded back as the next
process does (``kcourse/blas/cute/_disk.py``): what writing and loading cost against compiling, and
that a step through loaded kernels computes what the compiled ones did.

    source .cute/activate.sh && KCOURSE_CACHE_DIR=0 python -m benchmarks.experiments.cute_aot OUT.txt

``cute.compile`` never uses the CuTe DSL's own file cache (it passes ``no_cache``), so each process
compiles every kernel again (~22 s for GPT-2 124M's first step on an H100/H200). The DSL can write a
compiled host function as an object file (``JitCompiledFunction.dump_to_object(prefix)``; its
``export_to_c`` also writes a C header, which refuses our host functions' unannotated ``*args``) and
load one back (``cutlass.runtime.load_module(path)``, then ``getattr(module, prefix)``: a
``JitCompiledFunction`` again). Both need the CUDA runtime's symbols, so this runs on a GPU machine.

Steps: one eager step of a small GPT-2-like model (cute, bf16) compiles its kernels
(``_compile.COMPILE_SECONDS``); each kernel is dumped and loaded back, timed; the loaded functions
replace the compiled ones in their ``Kernel`` and the same step runs again: its loss and gradients
against the first run's, beside a second run of the compiled kernels (atomic float32 sums, as
attention's dq, may differ in their last bits between any two runs).
"""
import argparse
import os
import time

import torch

from benchmarks import gpt as bench
from kcourse.blas.cute import _compile


def step(model, x, y):
    model.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    loss.backward()
    torch.cuda.synchronize()
    return loss.detach().clone(), [p.grad.clone() for p in model.parameters()]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--dir", default="/tmp/cute-aot")
    args = p.parse_args()
    from cutlass import runtime

    os.makedirs(args.dir, exist_ok=True)
    c = bench.GPTConfig(vocab_size=50304, block_size=256, n_layer=2, n_head=12, n_embd=768, **bench.ARCHS["gpt2"])
    torch.manual_seed(0)
    model = bench.GPT(c, backend="cute").cuda().to(torch.bfloat16)
    x, y = (torch.randint(0, c.vocab_size, (4, c.block_size), device="cuda") for _ in range(2))
    start = time.perf_counter()
    first = step(model, x, y)
    again = step(model, x, y)
    lines = [f"{torch.cuda.get_device_name()}: first step {time.perf_counter() - start:.1f} s, "
             f"{len(_compile._kernels)} kernels compiled in {sum(_compile.COMPILE_SECONDS.values()):.1f} s"]
    dumped = loaded = 0.0
    failures = []
    for i, ((factory, key, target), kernel) in enumerate(list(_compile._kernels.items())):
        prefix = f"kcourse_{i}"
        path = os.path.join(args.dir, prefix + ".o")
        try:
            t0 = time.perf_counter()
            with open(path, "wb") as f:
                f.write(kernel.compiled.dump_to_object(prefix))
            t1 = time.perf_counter()
            function = getattr(runtime.load_module(path), prefix)
            t2 = time.perf_counter()
        except Exception as e:  # noqa: BLE001 - an experiment: say what failed, go on
            failures.append(f"{kernel.name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            continue
        dumped, loaded = dumped + t1 - t0, loaded + t2 - t1
        kernel.compiled, kernel._run = function, kernel._first_run  # the next launch loads it onto the GPU
    size = sum(os.path.getsize(os.path.join(args.dir, f)) for f in os.listdir(args.dir))
    lines.append(f"dumped in {dumped:.2f} s, loaded in {loaded:.2f} s, {len(failures)} failed; "
                 f"object files {size / 2**20:.1f} MiB")
    lines += [f"  failed: {f}" for f in failures[:20]]
    loaded_run = step(model, x, y)

    def largest_difference(run):
        return max((a.float() - b.float()).abs().max().item() for a, b in zip(first[1], run[1]))
    lines.append(f"loss: first {first[0].item():.6f}, compiled again {again[0].item():.6f}, loaded "
                 f"{loaded_run[0].item():.6f}; largest gradient difference from the first run: compiled again "
                 f"{largest_difference(again):.3g}, loaded {largest_difference(loaded_run):.3g}")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
