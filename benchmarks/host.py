"""Host time per call: each kcourse op on each backend against the torch call it stands for.

    python -m benchmarks.host --out DIR                  # CUDA: pytorch, triton, cute
    python -m benchmarks.host --out /tmp/h --device cpu --backends python,pytorch

Tiny operands, so a call's time is the host's (Python, validation, dispatch, the launch), not the
GPU's: ``--calls`` calls in a row after a warm-up, then one synchronization; the median of
``--rounds`` rounds, in microseconds per call. "fwd" calls the op without gradients; "fwd+bwd"
calls it on inputs that require grad and runs the backward from a gradient of ones made once
(``torch.autograd.backward(y, dy)``: no extra op in the timed call; rows before 2026-11-28 ran
``y.float().sum().backward()``, two ops more). Writes DIR/host.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import kcourse
from benchmarks.common import environment
from kcourse import blas


def cases(device):
    """op -> (make inputs, kcourse call (backend, *inputs), torch call (*inputs))."""
    def t(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=device, dtype=dtype)

    return {
        "gemm": (lambda: (t(8, 16), t(16, 8), t(8)),
                 lambda b, A, B, C: blas.gemm(A, B, C, beta=1.0, backend=b), lambda A, B, C: torch.addmm(C, A, B)),
        "axpby": (lambda: (t(64), t(64)), lambda b, x, y: blas.axpby(x, y, backend=b), lambda x, y: x + y),
        "softmax": (lambda: (t(8, 64),), lambda b, x: blas.softmax(x, backend=b), lambda x: F.softmax(x, -1)),
        "cross_entropy": (lambda: (t(8, 64), torch.randint(0, 64, (8,), device=device)),
                          lambda b, x, y: blas.cross_entropy(x, y, backend=b), lambda x, y: F.cross_entropy(x, y)),
        "layer_norm": (lambda: (t(8, 64), t(64), t(64)), lambda b, x, w, c: blas.layer_norm(x, w, c, backend=b),
                       lambda x, w, c: F.layer_norm(x, (64,), w, c)),
        "add_layer_norm": (lambda: (t(8, 64), t(8, 64), t(64), t(64)),  # a block's residual add and norm
                           lambda b, x, r, w, c: blas.add_layer_norm(x, r, w, c, backend=b)[0],
                           lambda x, r, w, c: F.layer_norm(x + r, (64,), w, c)),
        "linear": (lambda: (t(8, 64), t(32, 64), t(32)),  # the MLP's first projection and its GELU
                   lambda b, x, w, c: blas.linear(x, w, c, "gelu", backend=b), lambda x, w, c: F.gelu(F.linear(x, w, c))),
        "rms_norm": (lambda: (t(8, 64), t(64)), lambda b, x, w: blas.rms_norm(x, w, backend=b),
                     lambda x, w: F.rms_norm(x, (64,), w, 1e-6)),
        "gelu": (lambda: (t(8, 64),), lambda b, x: blas.gelu(x, backend=b), F.gelu),
        "swiglu": (lambda: (t(8, 64), t(8, 64)), lambda b, g, u: blas.swiglu(g, u, backend=b),
                   lambda g, u: F.silu(g) * u),
        "embedding": (lambda: (torch.randint(0, 64, (8,), device=device), t(64, 32)),
                      lambda b, i, w: blas.embedding(i, w, backend=b), F.embedding),
        "attention": (lambda: (t(1, 2, 16, 64), t(1, 2, 16, 64), t(1, 2, 16, 64)),
                      lambda b, q, k, v: blas.attention(q, k, v, causal=True, backend=b),
                      lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    }


def per_call(fn, calls: int, rounds: int, device) -> float:
    def sync():
        if device == "cuda":
            torch.cuda.synchronize()
    for _ in range(20):
        fn()
    sync()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backends", default="pytorch,triton,cute")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    available = kcourse.backends()
    rows = []
    for op, (make, ours, theirs) in cases(args.device).items():
        for grad in (False, True):
            inputs = make()
            if grad:
                inputs = tuple(x.requires_grad_() if x.is_floating_point() else x for x in inputs)

            dy = torch.ones_like(theirs(*inputs)) if grad else None  # the output's gradient, made once

            def run(f, dy=dy):
                y = f()
                if dy is not None:
                    torch.autograd.backward(y, dy)
            base = per_call(lambda: run(lambda: theirs(*inputs)), args.calls, args.rounds, args.device)
            for b in args.backends.split(","):
                if not available[b].available:
                    continue
                try:
                    ours_us = per_call(lambda: run(lambda: ours(b, *inputs)), args.calls, args.rounds, args.device)
                except Exception as e:  # noqa: BLE001 - recorded, the others still run
                    rows.append({"op": op, "backend": b, "direction": "fwd+bwd" if grad else "fwd", "error": repr(e)})
                    continue
                rows.append({"op": op, "backend": b, "direction": "fwd+bwd" if grad else "fwd",
                             "us_per_call": round(ours_us, 1), "torch_us_per_call": round(base, 1),
                             "ratio": round(ours_us / base, 2)})
                print(f"{op:14s} {b:8s} {'fwd+bwd' if grad else 'fwd':8s} {ours_us:8.1f} us   torch {base:7.1f} us"
                      f"   x{ours_us / base:5.2f}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = environment(args.device)  # device, UTC date and time, versions, git commit
    result = {"meta": meta, "rows": rows}
    (out / "host.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
