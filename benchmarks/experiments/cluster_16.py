"""Experiment: the cute row-wise ops on long rows with clusters of up to 16 CTAs a row, against the
shipped limit of 8 (``_rows.CLUSTER_MAX``, the largest portable cluster) and against quack.

A row of more than ``_rows.MAX_ONE_PASS`` (16384) elements is spread over a cluster of CTAs; where
the cluster's CTAs cannot keep their shares in registers (262144 elements over 8 CTAs: 32768 each)
the row is swept twice. Hopper runs clusters of 16 (non-portable: the CuTe DSL sets
``CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`` on every kernel), whose shares of 16384
stay in registers: the row read once, as quack reads it.

    python -m benchmarks.experiments.cluster_16 OUT.json --cluster-max 16   # on a Hopper GPU, CuTe DSL installed
    python -m benchmarks.experiments.cluster_16 OUT.json --staged on --shapes 512x262144,4096x32768

``--staged on`` / ``off`` forces each op's ``Launch.staged`` (shares of up to 16384 over clusters of up
to 16, copied into shared memory by cp.async and read from there, instead of held in registers or
swept); the default leaves the ops' rule. ``--cluster N`` fixes each op's ``Launch.cluster`` (N CTAs a
row where the shares fit in registers; 1: one CTA, sweeping a long row), ``--dtypes`` picks the dtypes:

    python -m benchmarks.experiments.cluster_16 OUT.json --ops layer_norm --dtypes float32 --cluster 4

Per op (rms_norm, layer_norm, softmax), dtype (bf16, float32) and shape (rows x columns: 2^27
elements, and 64 rows of 262144): the largest error of the forward and
of the input's gradient against a float64 torch composition, and the CUDA-graph median milliseconds
of the forward and the forward + backward beside quack's (where importable). Run it once per limit
in separate processes (the plans are memoized) and compare the JSONs.

Measured (H200, 2026-11-29, every error level with 8's): softmax gains from 16 in float32 forward
(512 x 262144: 0.362 -> 0.304 ms, quack 0.288) and in every backward (bf16 forward + backward 0.496 ->
0.462), not in the 16-bit forward (0.180 -> 0.188); the norm forwards gain in 16 bits for a few rows
(64 x 262144 rms_norm 0.065 -> 0.034, layer_norm 0.083 -> 0.044; 128 rows 1.3x) and lose from 256 rows
(layer_norm 512 x 262144 0.210 -> 0.267) and in float32 at every count (rms_norm 512 rows 0.313 ->
0.458: 8 CTAs of 512 threads keep their shares already). ``_rows.split_rows``'s ``most`` ships those choices.
(Those runs predate the warp-level cluster exchange.)

Staged shares (``--staged on`` against ``off``, H200, 2026-11-29, with the warp-level exchange, bf16,
graphed, ms): rms_norm 64 / 512 x 262144, 1024 x 131072, 4096 x 32768: 0.025 / 0.158 / 0.146 / 0.150
against 0.029 / 0.207 / 0.162 / 0.146 (quack 0.024 / 0.136 / 0.135 / 0.135); layer_norm 0.035 / 0.209
/ 0.180 / 0.159 against 0.041 / 0.208 / 0.212 / 0.191; softmax 0.028 / 0.155 / 0.150 / 0.149 against
0.031 / 0.172 / 0.135 / 0.134 (quack 0.025 / 0.141 / 0.135 / 0.134). Float32 staged (64 KB a share)
ran 0.69-1.01x of its shares in registers. The ops ship: 16-bit norm forwards staged past 16384
columns, the 16-bit softmax past 131072 (where 8 CTAs cannot keep the shares), float32 never.
"""
from __future__ import annotations

import argparse
import contextlib
import json

import torch

from benchmarks.timing import graph_ms
from kcourse import blas
from kcourse.blas import tuning
from kcourse.blas.cute import _rows

SHAPES = [(64, 262144), (128, 262144), (256, 262144), (512, 262144), (1024, 131072)]  # where the limit matters
OPS = ["rms_norm", "layer_norm", "softmax"]  # (log_softmax runs softmax's kernels)


def reference(op: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The op in float64 torch."""
    x, w, b = x.double(), w.double(), b.double()
    if op == "rms_norm":
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    if op == "layer_norm":
        return torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, 1e-5)
    return torch.softmax(x, -1) if op == "softmax" else torch.log_softmax(x, -1)


def ours(op: str, x, w, b):
    if op == "rms_norm":
        return blas.rms_norm(x, w, eps=1e-6, backend="cute")
    if op == "layer_norm":
        return blas.layer_norm(x, w, b, eps=1e-5, backend="cute")
    return getattr(blas, op)(x, dim=-1, backend="cute")


def quack_call(op: str):
    try:
        from benchmarks.peers import quack_calls
        calls = quack_calls()
    except ImportError:
        return None
    if op == "log_softmax":
        return None
    call = calls(op, None, None)
    return None if call is None else (lambda x, w, b: call((x, w, b)))


def errors(op: str, x, w, b, dy) -> tuple[float, float]:
    """The largest error of the forward (where the reference is finite) and of dx, against float64."""
    y = ours(op, x, w, b)
    (dx,) = torch.autograd.grad(y, x, dy)
    x64 = x.detach().double().requires_grad_()
    ref = reference(op, x64, w.detach(), b.detach())
    (dx_ref,) = torch.autograd.grad(ref, x64, dy.double())
    finite = torch.isfinite(ref)
    return (y.double() - ref)[finite].abs().max().item(), (dx.double() - dx_ref).abs().max().item()


def timed(fn, x, w, b, dy) -> tuple[float, float]:
    """CUDA-graph medians (ms) of ``fn``'s forward (no grad) and of its forward + backward (the input's
    gradient alone: no AccumulateGrad in the graph)."""
    with torch.no_grad():
        fn(x, w, b)
        fwd = graph_ms(lambda: fn(x, w, b))

    def both():
        torch.autograd.grad(fn(x, w, b), x, dy)
    both()
    return fwd, graph_ms(both)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--cluster-max", type=int, default=_rows.CLUSTER_MAX)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--no-peer", action="store_true", help="leave quack out")
    p.add_argument("--staged", choices=["rule", "on", "off"], default="rule", help="each op's Launch.staged")
    p.add_argument("--cluster", type=int, help="each op's Launch.cluster: CTAs a row, instead of the rule")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--shapes", default=",".join(f"{m}x{n}" for m, n in SHAPES), help="ROWSxCOLS,...")
    args = p.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    _rows.CLUSTER_MAX = args.cluster_max
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for op in args.ops.split(","):
        peer = None if args.no_peer else quack_call(op)
        def staged():  # the op's Launch.staged and Launch.cluster as asked
            fields = {} if args.staged == "rule" else {"staged": args.staged == "on"}
            fields.update({} if args.cluster is None else {"cluster": args.cluster})
            return tuning.override(op, **fields) if fields else contextlib.nullcontext()
        for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
            for M, N in shapes:
                x = torch.randn(M, N, device="cuda", dtype=dtype, generator=gen).requires_grad_()
                w = (1 + 0.1 * torch.randn(N, device="cuda", dtype=dtype, generator=gen)).requires_grad_()
                b = (0.1 * torch.randn(N, device="cuda", dtype=dtype, generator=gen)).requires_grad_()
                dy = torch.randn(M, N, device="cuda", dtype=dtype, generator=gen)
                row = {"op": op, "dtype": str(dtype).removeprefix("torch."), "shape": [M, N],
                       "cluster_max": args.cluster_max, "staged": args.staged, "cluster": args.cluster}
                try:
                    with staged():
                        row["y_err"], row["dx_err"] = errors(op, x, w, b, dy)
                        row["fwd_ms"], row["fwd_bwd_ms"] = timed(lambda *a: ours(op, *a), x, w, b, dy)
                except Exception as e:  # noqa: BLE001 (an experiment: record what failed and go on)
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                if peer is not None:
                    try:
                        row["quack_fwd_ms"], row["quack_fwd_bwd_ms"] = timed(peer, x, w, b, dy)
                    except Exception as e:  # noqa: BLE001
                        row["quack_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                print(json.dumps(row), flush=True)
                rows.append(row)
                with open(args.out, "w") as f:
                    json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
