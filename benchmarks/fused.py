"""The fused ops against what each replaces: time and peak memory of one forward and backward.

    python -m benchmarks.fused --out DIR                     # CUDA: every fused op at its shapes, bf16
    python -m benchmarks.fused --out DIR --ops linear_cross_entropy     # the LM head and loss only
    python -m benchmarks.fused --out /tmp/f --tiny --device cpu --backends pytorch   # smoke test, no GPU
    python -m benchmarks.history add DIR/fused.json

For each op (``OPS``), each of its shapes (--dtype) and each kcourse backend:
  B:fused     the fused op (blas.linear_cross_entropy, blas.linear with gelu_tanh, blas.linear_swiglu,
              blas.add_layer_norm, blas.add_rms_norm)
  B:unfused   the composition of kcourse ops it replaces, on the same backend
and, once per shape, torch's own: ``torch:eager`` (the torch.nn.functional composition) and
``torch:compile``, that function under torch.compile (inductor fuses what it can).

Shapes: the LM head at N = 16384 tokens, d 768 and 4096, V 50304 and 128256; the MLP's first
projection with the tanh gelu (GPT-2: 768 -> 3072, and 4096 -> 16384) and SwiGLU's pair (Llama-like:
768 -> 2048, 4096 -> 11008) at 16384 tokens; the residual add and norm at 16384 x 768 and x 4096.

Each variant's call is a forward and a backward (every floating input's gradient; a loss's gradient 1,
other outputs' fixed random gradients): its time is ``benchmarks/timing.py``'s ``timer`` (CUDA: the
median of do_bench), its memory the peak allocated during one call above what was allocated before
it (the inputs and gradients' own storage included in neither). ``ratio_time`` and ``ratio_memory``
of a fused variant are over its backend's unfused one (targets: time <= 1.0; the LM head's memory
<= 0.25), ``vs_compile`` is torch:compile's time over the variant's. Writes DIR/fused.json (after
each shape).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from kcourse import blas
from . import common, timing


@dataclasses.dataclass(frozen=True)
class Op:
    """A fused op: its shapes, how to make its inputs, and its three forms (each ``f(*inputs)``; the
    kcourse ones made for a backend)."""
    shapes: list
    tiny: tuple
    inputs: Callable  # (shape, generator) -> float32 CPU tensors (integer ones are targets)
    fused: Callable  # backend -> f
    unfused: Callable  # backend -> f
    torch: Callable  # f


def _scaled(gen, *shape):
    """N(0, 1 / fan_in) values of ``shape`` (a weight (out, in)): activations of unit scale."""
    return torch.randn(*shape, generator=gen) / math.sqrt(max(shape[-1], 1))


OPS = {
    "linear_cross_entropy": Op(
        [(16384, 768, 50304), (16384, 4096, 50304), (16384, 768, 128256), (16384, 4096, 128256)], (64, 32, 300),
        lambda s, g: (torch.randn(s[0], s[1], generator=g), _scaled(g, s[2], s[1]),
                      torch.randint(0, s[2], (s[0],), generator=g)),
        lambda b: lambda x, w, t: blas.linear_cross_entropy(x, w, t, backend=b),
        lambda b: lambda x, w, t: blas.cross_entropy(blas.gemm(x, w.mT, backend=b), t, backend=b),
        lambda x, w, t: F.cross_entropy(F.linear(x, w), t)),
    "linear_gelu": Op(
        [(16384, 768, 3072), (16384, 4096, 16384)], (64, 32, 48),
        lambda s, g: (torch.randn(s[0], s[1], generator=g), _scaled(g, s[2], s[1]), torch.randn(s[2], generator=g)),
        lambda b: lambda x, w, bias: blas.linear(x, w, bias, "gelu_tanh", backend=b),
        lambda b: lambda x, w, bias: blas.gelu(blas.gemm(x, w.mT, bias, beta=1.0, backend=b), "tanh", backend=b),
        lambda x, w, bias: F.gelu(F.linear(x, w, bias), approximate="tanh")),
    "linear_swiglu": Op(
        [(16384, 768, 2048), (16384, 4096, 11008)], (64, 32, 48),
        lambda s, g: (torch.randn(s[0], s[1], generator=g), _scaled(g, s[2], s[1]), _scaled(g, s[2], s[1])),
        lambda b: lambda x, wg, wu: blas.linear_swiglu(x, wg, wu, backend=b),
        lambda b: lambda x, wg, wu: blas.swiglu(blas.gemm(x, wg.mT, backend=b), blas.gemm(x, wu.mT, backend=b),
                                                backend=b),
        lambda x, wg, wu: F.silu(F.linear(x, wg)) * F.linear(x, wu)),
    "add_layer_norm": Op(
        [(16384, 768), (16384, 4096)], (64, 48),
        lambda s, g: (torch.randn(*s, generator=g), torch.randn(*s, generator=g), torch.randn(s[1], generator=g),
                      torch.randn(s[1], generator=g)),
        lambda b: lambda x, r, w, bias: blas.add_layer_norm(x, r, w, bias, backend=b),
        lambda b: lambda x, r, w, bias: _norm_of_sum(blas.axpby(x, r, backend=b),
                                                     lambda h: blas.layer_norm(h, w, bias, backend=b)),
        lambda x, r, w, bias: _norm_of_sum(x + r, lambda h: F.layer_norm(h, h.shape[-1:], w, bias))),
    "add_rms_norm": Op(
        [(16384, 768), (16384, 4096)], (64, 48),
        lambda s, g: (torch.randn(*s, generator=g), torch.randn(*s, generator=g), torch.randn(s[1], generator=g)),
        lambda b: lambda x, r, w: blas.add_rms_norm(x, r, w, backend=b),
        lambda b: lambda x, r, w: _norm_of_sum(blas.axpby(x, r, backend=b), lambda h: blas.rms_norm(h, w, backend=b)),
        lambda x, r, w: _norm_of_sum(x + r, lambda h: F.rms_norm(h, h.shape[-1:], w, eps=1e-6))),
}


def _norm_of_sum(h, norm):
    """``(norm(h), h)``: what the fused add + norms return."""
    return norm(h), h


def variants(op: Op, backends: list[str], compiler: str) -> dict:
    """name -> f(*inputs)."""
    out = {}
    for b in backends:
        out[f"{b}:fused"], out[f"{b}:unfused"] = op.fused(b), op.unfused(b)
    out["torch:eager"], out["torch:compile"] = op.torch, torch.compile(op.torch, backend=compiler)
    return out


def measure(f, inputs, time_ms, device) -> dict:
    """ms of a forward and backward, and its peak memory above what was allocated before (CUDA)."""
    leaves = [t for t in inputs if t.requires_grad]
    douts = []

    def step():
        for t in leaves:
            t.grad = None
        outs = f(*inputs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        if not douts:  # fixed gradients of the outputs: 1 for a loss, N(0, 1) otherwise
            gen = torch.Generator().manual_seed(1)
            douts.extend(torch.ones_like(o) if o.dim() == 0 else torch.randn(o.shape, generator=gen).to(o)
                         for o in outs)
        torch.autograd.backward(outs, douts)
    step()  # compiles, autotunes
    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        for t in leaves:
            t.grad = None
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    return {"ms": time_ms(step), "peak_bytes": peak if cuda else None}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="writes OUT/fused.json")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--ops", default=",".join(OPS), help="fused ops (comma list)")
    p.add_argument("--backends", default="pytorch,triton,cute", help="kcourse backends (comma list)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--tiny", action="store_true", help="one tiny shape per op: a smoke test of this script")
    p.add_argument("--compiler", default="inductor", help="torch.compile's backend for torch:compile")
    args = p.parse_args(argv)
    cuda = torch.device(args.device).type == "cuda"
    backends, skipped = common.usable_backends([b for b in args.backends.split(",") if b], cuda)
    time_ms = timing.timer(args.device)
    dtype = getattr(torch, args.dtype)
    rows = []
    result = {"meta": {**common.environment(args.device), "dtype": args.dtype, "skipped": skipped}, "fused": rows}
    for name in args.ops.split(","):
        op = OPS[name]
        for shape in [op.tiny] if args.tiny else op.shapes:
            inputs = [t.to(args.device) if not t.is_floating_point() else
                      t.to(args.device, dtype).requires_grad_() for t in op.inputs(shape, torch.Generator().manual_seed(0))]
            results = {}
            for variant, f in variants(op, backends, args.compiler).items():
                try:
                    results[variant] = measure(f, inputs, time_ms, args.device)
                except Exception as e:  # noqa: BLE001 - recorded, the others still run
                    results[variant] = {"error": f"{type(e).__name__}: {e}"}
                print(f"{name} {shape} {variant:18s} {results[variant]}", flush=True)
            compiled = results["torch:compile"].get("ms")
            for variant, r in results.items():
                row = {"op": name, "variant": variant, "shape": list(shape), **r}
                unfused = results.get(variant.replace(":fused", ":unfused")) if variant.endswith(":fused") else None
                if "ms" in r and unfused and "ms" in unfused:
                    row["ratio_time"] = round(r["ms"] / unfused["ms"], 3)
                    if r["peak_bytes"] is not None:
                        row["ratio_memory"] = round(r["peak_bytes"] / unfused["peak_bytes"], 3)
                if "ms" in r and compiled:
                    row["vs_compile"] = round(compiled / r["ms"], 3)
                rows.append(row)
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "fused.json").write_text(json.dumps(result, indent=1))  # after each shape
    return result


if __name__ == "__main__":
    main()
