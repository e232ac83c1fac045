"""Experiment: linear_cross_entropy's chunk count (``kcourse/blas/_host.py``: ``CHUNKS``, the rows in
about that many chunks) against its time and peak memory, on the triton and cute backends, beside
the unfused composition (gemm, then cross_entropy) the fused op must beat (issue target: time <= 1.0x
the unfused, peak memory <= 0.25x).

    python -m benchmarks.experiments.lce_chunks OUT.txt [--backends triton,cute] [--chunks 2,3,4,6,8]

Fewer chunks mean fewer, larger gemms: dweight is read and written once a chunk (the gemm adds each
chunk's product in its epilogue), and a chunk's dx product, (N / C, V) @ (V, K), has few output tiles
at K = 768 (under one wave at C = 8); more memory for the chunk's logits. Shapes and measurement:
``benchmarks/fused.py`` (the LM head at N = 16384, d 768 and 4096, V 50304 and 128256, bf16; one
forward and backward; peak memory above what was allocated before the call).
"""
import argparse

import torch

from benchmarks import fused, timing
from kcourse.blas import _host


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--backends", default="triton,cute")
    p.add_argument("--chunks", default="2,3,4,6,8")
    args = p.parse_args()
    op = fused.OPS["linear_cross_entropy"]
    time_ms = timing.timer("cuda")
    lines = [f"# linear_cross_entropy chunk count, {torch.cuda.get_device_name()}, bf16, ms and peak GiB "
             f"(shipped CHUNKS = {_host.CHUNKS})"]
    for shape in op.shapes:
        inputs = [t.cuda() if not t.is_floating_point() else t.to("cuda", torch.bfloat16).requires_grad_()
                  for t in op.inputs(shape, torch.Generator().manual_seed(0))]
        for backend in args.backends.split(","):
            unfused = fused.measure(op.unfused(backend), inputs, time_ms, "cuda")
            lines.append(f"{shape} {backend}: unfused {unfused['ms']:.3f} ms, {unfused['peak_bytes'] / 2**30:.2f} GiB")
            shipped = _host.CHUNKS
            try:
                for chunks in map(int, args.chunks.split(",")):
                    _host.CHUNKS = chunks
                    got = fused.measure(op.fused(backend), inputs, time_ms, "cuda")
                    lines.append(f"    CHUNKS={chunks}: {got['ms']:.3f} ms ({unfused['ms'] / got['ms']:.3f}x unfused), "
                                 f"{got['peak_bytes'] / 2**30:.2f} GiB ({got['peak_bytes'] / unfused['peak_bytes']:.3f}x)")
            finally:
                _host.CHUNKS = shipped
            print("\n".join(lines[-1 - len(args.chunks.split(",")):]), flush=True)
    open(args.out, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
