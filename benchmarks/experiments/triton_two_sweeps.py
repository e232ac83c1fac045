"""Experiment: the triton softmax forward on rows longer than one program keeps (> 16384 elements),
swept twice (the row's max and sum, then the output): can the second sweep read from L2?

A row of 65536 bf16 is 128 KB. With a program per row and up to 8 programs of 8 warps an SM, 132 SMs
keep about 135 MB of rows between their two sweeps, more than an H200's L2 (50 MB); and the second
sweep, in the first one's order, starts with the chunks loaded longest ago, the first an LRU-like
cache lets go. So the shipped kernel reads most rows twice from memory, 3 passes where the peers
(quack's clusters of CTAs, each keeping its share) make 2: the triton softmax forward runs at 0.57x
quack's speed at 512 x 262144 bf16. Variants of the same two sweeps (``two_sweeps``):

- ``shipped``: ``kcourse.blas.softmax(..., backend="triton")``;
- ``forward``: this file's kernel, a program per row, both sweeps from the row's start (the shipped order);
- ``reverse``: the second sweep from the row's end back, its first chunks the ones the first sweep
  loaded last;
- ``persistent-K``: K programs an SM, each taking rows pid, pid + programs, ..., so that at most K
  rows an SM are between their sweeps (with ``reverse``);
- ``-wW``: W warps a program (8 by default), ``-sS``: the loops software-pipelined S deep (``tl.range``'s
  ``num_stages``).

The same variants of rms_norm's two sweeps (``rms_two_sweeps``: the sum of squares, then y; the
shipped triton forward at 0.60x quack's there). Each variant is checked against torch in float32
(largest error) and timed as CUDA-graph replays (``benchmarks.timing.graph_ms``) beside quack's
where importable, at 2^27 elements
(256 or 512 MiB: no call finds its input in L2 from the one before). On a GPU:

    python -m benchmarks.experiments.triton_two_sweeps OUT.json

Without one, ``--check`` runs every variant through Triton's interpreter on small rows
(``TRITON_INTERPRET=1``). Not yet measured on a GPU.
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from kcourse.blas.triton._softmax import online_logsumexp

SHAPES = [(2048, 65536), (1024, 131072), (512, 262144)]
OPS = ["softmax", "rms_norm"]
CHUNK = 4096  # columns a step, as the shipped kernel's


@triton.jit
def two_sweeps(x_ptr, y_ptr, M, N, x_stride, y_stride, REVERSE: tl.constexpr, STAGES: tl.constexpr,
               BLOCK_N: tl.constexpr):
    # x, y: (M, N), unit column stride. Program p takes rows p, p + P, ... (P programs); per row the
    # online (max, sum of exp) over BLOCK_N columns a step, then y = exp(x - max) / sum, a chunk at a
    # time, from the row's end back where REVERSE.
    cols = tl.arange(0, BLOCK_N).to(tl.int64)[None, :]  # (1, BLOCK_N)
    n_chunks = tl.cdiv(N, BLOCK_N)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        r = tl.zeros([1, 1], dtype=tl.int64) + row  # (1, 1), in int64: no overflow on huge tensors
        x_row, y_row = x_ptr + r * x_stride, y_ptr + r * y_stride
        m, s = online_logsumexp(x_row, 1, N, 1, BLOCK_N)  # (1,) each
        for i in tl.range(0, n_chunks, num_stages=STAGES):
            start = ((n_chunks - 1 - i) if REVERSE else i) * BLOCK_N
            mask = start + cols < N
            x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            y = tl.exp(x - m[:, None]) / s[:, None]
            tl.store(y_row + start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rms_two_sweeps(x_ptr, w_ptr, y_ptr, M, N, x_stride, y_stride, eps, REVERSE: tl.constexpr, STAGES: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    # rms_norm's two sweeps, as two_sweeps': per row the sum of squares, then y = x rstd w
    cols = tl.arange(0, BLOCK_N).to(tl.int64)
    n_chunks = tl.cdiv(N, BLOCK_N)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        r = tl.zeros([1], dtype=tl.int64) + row
        x_row, y_row = x_ptr + r * x_stride, y_ptr + r * y_stride  # (1,)
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for i in tl.range(0, n_chunks, num_stages=STAGES):
            x = tl.load(x_row + i * BLOCK_N + cols, mask=i * BLOCK_N + cols < N, other=0.0).to(tl.float32)
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
        for i in tl.range(0, n_chunks, num_stages=STAGES):
            start = ((n_chunks - 1 - i) if REVERSE else i) * BLOCK_N
            mask = start + cols < N
            x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + start + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def variant(name: str, op: str = "softmax"):
    """``fn(x, w)``: ``op`` of the rows of a contiguous 2-D x (softmax, or rms_norm with the weight w,
    which softmax ignores) by the variant ``name`` (see the module doc)."""
    if name == "shipped":
        from kcourse import blas
        if op == "rms_norm":
            return lambda x, w: blas.rms_norm(x, w, eps=1e-6, backend="triton")
        return lambda x, w: blas.softmax(x, -1, backend="triton")
    parts = name.split("-")
    warps = next((int(p[1:]) for p in parts if p.startswith("w")), 8)
    stages = next((int(p[1:]) for p in parts if p.startswith("s") and p[1:].isdigit()), 1)
    per_sm = int(parts[1]) if parts[0] == "persistent" else None
    reverse = parts[0] != "forward"

    def run(x, w):
        y = torch.empty_like(x)
        m, n = x.shape
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
        programs = m if per_sm is None else min(m, per_sm * sms)
        options = dict(REVERSE=reverse, STAGES=stages, BLOCK_N=CHUNK, num_warps=warps)
        if op == "rms_norm":
            rms_two_sweeps[(programs,)](x, w, y, m, n, x.stride(0), y.stride(0), 1e-6, **options)
        else:
            two_sweeps[(programs,)](x, y, m, n, x.stride(0), y.stride(0), **options)
        return y
    return run


VARIANTS = ["shipped", "forward", "reverse", "reverse-w16", "reverse-s2", "persistent-1", "persistent-2",
            "persistent-4", "persistent-2-w16", "persistent-2-s2", "persistent-1-w16-s3"]


def error(fn, x, w, op: str = "softmax") -> float:
    """The largest difference between ``fn(x, w)`` and torch's float32 result."""
    xf = x.float()
    ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float() if op == "rms_norm" else \
        torch.softmax(xf, -1)
    return (fn(x, w).float() - ref).abs().max().item()


def check() -> None:
    """Every variant but ``shipped`` against torch on small rows through the interpreter (CPU)."""
    gen = torch.Generator().manual_seed(0)
    for m, n in ((3, 9000), (5, 4096), (2, 12289)):
        x, w = torch.randn(m, n, generator=gen) * 3, 1 + 0.1 * torch.randn(n, generator=gen)
        for op in OPS:
            for name in VARIANTS[1:]:  # (the interpreter runs a pipelined loop as a plain one)
                err = error(variant(name, op), x, w, op)
                print(f"{op} {name} {m}x{n}: largest error {err:.3g}")
                assert err < 1e-5, (op, name, m, n, err)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?")
    p.add_argument("--check", action="store_true", help="the variants through the interpreter, on the CPU")
    args = p.parse_args()
    if args.check:
        check()
        return
    from benchmarks.timing import graph_ms
    try:
        from benchmarks.peers import quack_calls
        calls = quack_calls()
    except ImportError:
        calls = None
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for op, dtype, (m, n) in ((op, dtype, shape) for op in OPS for dtype in (torch.bfloat16, torch.float32)
                              for shape in SHAPES):
        x = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)
        quack = None if calls is None else calls(op, None, None)
        w = 1 + 0.1 * torch.randn(n, device="cuda", dtype=dtype, generator=gen)
        peer = None if quack is None else graph_ms(lambda: quack((x, w, None) if op == "rms_norm" else (x,)))
        for name in VARIANTS:
            fn = variant(name, op)
            row = {"op": op, "variant": name, "dtype": str(dtype).removeprefix("torch."), "shape": [m, n],
                   "error": error(fn, x, w, op), "ms": graph_ms(lambda: fn(x, w)), "quack_ms": peer}
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(args.out or "triton_two_sweeps.json", "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
