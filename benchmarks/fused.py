"""The fused LM head and loss against what it replaces: time and peak memory of one forward and backward.

    python -m benchmarks.fused --out DIR                     # CUDA: N = 16384, d 768 and 4096, V 50304 and 128256
    python -m benchmarks.fused --out /tmp/f --tiny --device cpu --backends pytorch   # smoke test, no GPU
    python -m benchmarks.history add DIR/fused.json

For each shape (N rows of d features, V classes, --dtype) and each kcourse backend:
  B:fused     blas.linear_cross_entropy(x, W, target)         the (N, V) logits never whole
  B:unfused   blas.cross_entropy(blas.gemm(x, W.mT), target)  the composition it replaces
and, once per shape, torch's own: ``torch:eager`` F.cross_entropy(F.linear(x, W), target) and
``torch:compile``, that function under torch.compile (inductor fuses the loss's row kernels; the
logits are still made whole).

Each variant's call is a forward and a backward (gradients of x and W, mean reduction): its time is
``benchmarks/timing.py``'s ``timer`` (CUDA: the median of do_bench), its memory the peak allocated
during one call above what was allocated before it (the inputs and gradients' own storage
included in neither). ``ratio_time`` and ``ratio_memory`` of a fused variant are over its backend's
unfused one (issue targets: time <= 1.0, memory <= 0.25), ``vs_compile`` is torch:compile's time
over the variant's. Writes DIR/fused.json (after each shape).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from kcourse import blas
from . import common, timing

SHAPES = [(16384, 768, 50304), (16384, 4096, 50304), (16384, 768, 128256), (16384, 4096, 128256)]
TINY = [(64, 32, 300)]


def variants(backends: list[str], compiler: str) -> dict:
    """name -> f(x, W, target) -> loss."""
    out = {}
    for b in backends:
        out[f"{b}:fused"] = lambda x, w, t, b=b: blas.linear_cross_entropy(x, w, t, backend=b)
        out[f"{b}:unfused"] = lambda x, w, t, b=b: blas.cross_entropy(blas.gemm(x, w.mT, backend=b), t, backend=b)
    eager = lambda x, w, t: F.cross_entropy(F.linear(x, w), t)  # noqa: E731
    out["torch:eager"], out["torch:compile"] = eager, torch.compile(eager, backend=compiler)
    return out


def measure(f, x, w, t, time_ms, device) -> dict:
    """ms of a forward and backward, and its peak memory above what was allocated before (CUDA)."""
    def step():
        x.grad = w.grad = None
        f(x, w, t).backward()
    step()  # compiles, autotunes
    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        x.grad = w.grad = None
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        f(x, w, t).backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    return {"ms": time_ms(step), "peak_bytes": peak if cuda else None}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="writes OUT/fused.json")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backends", default="pytorch,triton,cute", help="kcourse backends (comma list)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--tiny", action="store_true", help="one tiny shape: a smoke test of this script")
    p.add_argument("--compiler", default="inductor", help="torch.compile's backend for torch:compile")
    args = p.parse_args(argv)
    cuda = torch.device(args.device).type == "cuda"
    backends, skipped = common.usable_backends([b for b in args.backends.split(",") if b], cuda)
    time_ms = timing.timer(args.device)
    dtype = getattr(torch, args.dtype)
    rows = []
    for N, d, V in TINY if args.tiny else SHAPES:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(N, d, generator=gen).to(args.device, dtype).requires_grad_()
        w = (torch.randn(V, d, generator=gen) * d ** -0.5).to(args.device, dtype).requires_grad_()
        t = torch.randint(0, V, (N,), generator=gen).to(args.device)
        results = {}
        for name, f in variants(backends, args.compiler).items():
            try:
                results[name] = measure(f, x, w, t, time_ms, args.device)
            except Exception as e:  # noqa: BLE001 - recorded, the others still run
                results[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"N={N} d={d} V={V} {name:18s} {results[name]}", flush=True)
        compiled = results["torch:compile"].get("ms")
        for name, r in results.items():
            row = {"variant": name, "N": N, "d": d, "V": V, **r}
            unfused = results.get(name.replace(":fused", ":unfused")) if name.endswith(":fused") else None
            if "ms" in r and unfused and "ms" in unfused:
                row["ratio_time"] = round(r["ms"] / unfused["ms"], 3)
                if r["peak_bytes"] is not None:
                    row["ratio_memory"] = round(r["peak_bytes"] / unfused["peak_bytes"], 3)
            if "ms" in r and compiled:
                row["vs_compile"] = round(compiled / r["ms"], 3)
            rows.append(row)
        result = {"meta": {**common.environment(args.device), "dtype": args.dtype, "skipped": skipped}, "fused": rows}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fused.json").write_text(json.dumps(result, indent=1))  # after each shape: a time limit keeps the rest
    return result


if __name__ == "__main__":
    main()
