"""Experiment: what switching off cuBLAS's reduced-precision (half) split-K reductions costs the
pytorch backend's gemm, in host time per call and in GPU time on GPT-2 124M's shapes (bf16).

    python -m benchmarks.experiments.pytorch_gemm_flags OUT.txt

Variants: ``default`` (torch's flags: reduced-precision reductions allowed), ``off`` (both
``allow_*_reduced_precision_reduction`` flags False for the whole run), ``kcourse`` (the pytorch
backend's gemm kernel: the flags switched off and back around each call). Host time: a tiny
(8, 16) x (16, 8) addmm, many calls and one sync. GPU time: each shape's median over CUDA events.
"""
import statistics
import sys
import time

import torch

from kcourse.blas.pytorch.gemm import gemm as kcourse_gemm

# (M, K, N) of a GPT-2 124M step at batch 16, T = 1024: the projections' forward (x W^T), their input
# gradients (dy W) and weight gradients (dy^T x, K = the 16384 tokens)
SHAPES = [(16384, 768, 2304), (16384, 768, 3072), (16384, 3072, 768), (16384, 2304, 768),
          (768, 16384, 3072), (3072, 16384, 768), (2304, 16384, 768), (768, 16384, 768)]


def variant(name):
    flags = torch.backends.cuda.matmul

    def run(A, B, out):
        if name == "kcourse":
            kcourse_gemm(A, B, None, 1.0, 0.0, out)
        else:
            out.addmm_(A, B, beta=0)
    allowed = name == "default"
    return run, lambda: (setattr(flags, "allow_fp16_reduced_precision_reduction", allowed or name == "kcourse"),
                         setattr(flags, "allow_bf16_reduced_precision_reduction", allowed or name == "kcourse"))


def host_us(run, calls=2000, rounds=5):
    A = torch.randn(8, 16, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(16, 8, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(8, 8, device="cuda", dtype=torch.bfloat16)
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            run(A, B, out)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def gpu_ms(run, M, K, N, reps=20):
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        run(A, B, out)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run(A, B, out)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}"]
    for name in ("default", "off", "kcourse"):
        run, setup = variant(name)
        setup()
        row = [f"{name:8s} host {host_us(run):6.1f} us/call; GPU ms:"]
        row += [f"{M}x{K}x{N} {gpu_ms(run, M, K, N):.3f}" for M, K, N in SHAPES]
        lines.append("  ".join(row))
        print(lines[-1], flush=True)
    with open(sys.argv[1], "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
