"""Experiment: the triton backend's host time per training step, measured on a machine without a GPU.

    python -m benchmarks.experiments.triton_host_cpu OUT.txt [--layers 2] [--width 128] [--steps 10]

A GPT-2-like model (bf16, tanh GELU, tied head) on the triton backend runs its training step on CPU
tensors. The first step compiles every kernel for sm_90a (``_launch.compiling_only``; the TMA gemm
and attention paths forced on, as on a Hopper GPU). From then on each compiled kernel stands behind
a stub launcher (``Stub``), and the steps go through kcourse's real launch path: validation, the
autograd Functions, descriptors and plans, ``launch_tuned``'s reused pick, ``launch``'s cached
kernel. Only Triton's C launcher and the GPU's work are missing. Writes the step time and cProfile's
functions with the most time of their own. Compare code versions on the same machine, not against
another one's numbers; ``benchmarks/experiments/gpt_host.py`` is the same measurement on a GPU.
"""
import argparse
import time

import torch

import kcourse.backend as backend
from benchmarks.experiments.host_profile import profile
import kcourse.blas._check as check
from kcourse.blas.triton import _gemm_tma, _launch, attention, gemm
from kcourse.modules import GPT, GPTConfig


class Stub:
    """A compiled kernel's stand-in: ``run`` takes the launch's arguments and does nothing."""

    function = packed_metadata = None

    def run(self, *args):
        pass


def stub_launches(restore: list) -> None:
    """Each jitted function's launch compiles it (the compile-only driver), or finds it in memory, and
    returns a ``Stub``, which ``_launch.launch`` keeps; an autotuner takes its first config, as
    ``launch_tuned`` does without a GPU. ``restore`` gets what to put back."""
    runtime = __import__("triton").runtime
    jit_run, tuner_run = runtime.JITFunction.run, runtime.Autotuner.run

    def run(self, *args, grid, warmup, **kwargs):
        jit_run(self, *args, grid=grid, warmup=True, **kwargs)
        return Stub()

    def tune(self, *args, **kwargs):
        self.best_config = config = self.configs[0]
        if config.pre_hook is not None:
            config.pre_hook({**dict(zip(self.arg_names, args)), **kwargs, **config.all_kwargs()})
        return self.fn.run(*args, **kwargs, **config.all_kwargs())

    runtime.JITFunction.run, runtime.Autotuner.run = run, tune
    restore += [(runtime.JITFunction, "run", jit_run), (runtime.Autotuner, "run", tuner_run)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lines", type=int, default=30)
    args = p.parse_args()
    if _launch.INTERPRET:
        raise SystemExit("unset TRITON_INTERPRET: this experiment compiles the kernels (no interpreter)")
    backend._available = lambda name: backend.BackendInfo(name, True)  # triton "runs" on CPU tensors here
    check.triton_interpreting = lambda: True  # (its device check lets them through)
    attention.tma_device = lambda q: True  # the Hopper paths, as on an H100 or H200
    gemm.tma_plan = _gemm_tma.tma_layouts
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=512, block_size=128, n_layer=args.layers, n_head=2, n_embd=args.width,
                       activation="gelu_tanh")
    model = GPT(config, backend="triton").to(torch.bfloat16)
    idx = torch.randint(0, 512, (2, 128))

    def step():
        model(idx, idx)[1].backward()

    restore = [(torch.cuda, "current_device", torch.cuda.current_device), (_launch, "KEEP_PICKS", _launch.KEEP_PICKS)]
    try:
        with _launch.compiling_only():  # the compile-only driver: device 0, stream 0, sm_90a
            start = time.perf_counter()
            step()  # every kernel compiled once
            compile_s = time.perf_counter() - start
            _launch._compile_only[0] = False  # from here the real launch path, with Stub launchers
            _launch.KEEP_PICKS = False
            torch.cuda.current_device = lambda: 0
            stub_launches(restore)
            for _ in range(3):  # the stubs made, the picks and plans cached
                step()
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            step_ms = (time.perf_counter() - start) / args.steps * 1e3
            table = profile(step, args.steps, args.lines)
    finally:
        for owner, name, value in restore:
            setattr(owner, name, value)
    text = (f"triton backend, GPT {args.layers} layers width {args.width}, bf16, B 2, T 128, on the CPU: "
            f"{step_ms:.2f} ms a step (host only; the first step compiled for {compile_s:.0f} s)\n{table}")
    with open(args.out, "w") as f:
        f.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
