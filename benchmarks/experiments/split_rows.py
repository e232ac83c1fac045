"""The triton norms' backward on rows split over programs that meet once per row
(``kcourse/blas/triton/_split.py``) against one program's two sweeps, over the split's settings,
beside quack and torch: rms_norm and layer_norm, forward and forward + backward.

Every call is captured in a CUDA graph and its replay timed (``benchmarks.timing.graph_ms``: median,
L2 flushed), so the numbers are the kernels' alone. 2^27 elements a point. Variants of the triton
backend (module constants set for the variant, then restored):

  - ``split``: as shipped (rows of 8192 < D <= 16384, ``_norm.SPLIT_LAUNCH``'s blocks and warps);
    ``sweep``: no split;
  - ``4k_w8``, ``8k_w8``, ``8k_w16``: every dtype and norm in blocks of 4096 or 8192 columns with 8
    or 16 warps; ``fewer`` and ``more``: half and twice as many groups.

Not in the tree: the same split for the norms' and softmax's forwards (one program a row, or
``ROWS`` a group) and for the backward up to 2^20 columns measured slower than, or as fast as, the
two sweeps from 65536 columns (H200, 2026-11-29; ``_split``'s docstring has the numbers).

Usage, on the GPU (quack optional: its wheels as benchmarks/README.md says):

    python -m benchmarks.experiments.split_rows OUT.json [--ops rms_norm,layer_norm]
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from benchmarks import timing
from kcourse import blas
from kcourse.blas.triton import _norm

ELEMENTS = 2**27
LENGTHS = [12288, 16384]
SETTINGS = list(_norm.SPLIT_LAUNCH)
VARIANTS = {
    "split": {},
    "sweep": {"split": None},
    "4k_w8": {(_norm, "SPLIT_LAUNCH"): dict.fromkeys(SETTINGS, (4096, 8))},
    "8k_w8": {(_norm, "SPLIT_LAUNCH"): dict.fromkeys(SETTINGS, (8192, 8))},
    "8k_w16": {(_norm, "SPLIT_LAUNCH"): dict.fromkeys(SETTINGS, (8192, 16))},
    "fewer": {(_norm, "SPLIT_PROGRAMS_PER_SM"): 1},
    "more": {(_norm, "SPLIT_PROGRAMS_PER_SM"): 4},
}


def set_variant(changes: dict) -> dict:
    """Apply a variant's changes; returns what to restore."""
    saved = {}
    for key, value in changes.items():
        if key == "split":  # no split: the modules' own reference to it answers None
            saved[(_norm, "split")] = _norm.split
            _norm.split = lambda *args: None
        else:
            saved[key] = getattr(*key)
            setattr(*key, value)
    return saved


def restore(saved: dict) -> None:
    for (module, name), value in saved.items():
        setattr(module, name, value)


def calls(op):
    """name -> f(t) for one op, t = (x, weight, bias): kcourse's triton, torch eager, quack (when it imports)."""
    out = {"kcourse": {"rms_norm": lambda t: blas.rms_norm(t[0], t[1], backend="triton"),
                       "layer_norm": lambda t: blas.layer_norm(*t, backend="triton")}[op],
           "torch": {"rms_norm": lambda t: F.rms_norm(t[0], t[0].shape[-1:], t[1], 1e-6),
                     "layer_norm": lambda t: F.layer_norm(t[0], t[0].shape[-1:], t[1], t[2], 1e-5)}[op]}
    try:
        from benchmarks.peers import quack_calls
        out["quack"] = quack_calls()(op, None, None)
    except Exception as exc:  # noqa: BLE001  (quack not installed)
        print(f"no quack: {type(exc).__name__}: {exc}")
    return {k: v for k, v in out.items() if v is not None}


def timed(f, t, dy, direction):
    if direction == "fwd":
        return timing.graph_ms(lambda: f(t))
    leaves = [a for a in t if a is not None]
    return timing.graph_ms(lambda: torch.autograd.grad(f(t), leaves, dy))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--ops", default="rms_norm,layer_norm")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--variants", default=",".join(VARIANTS))
    args = p.parse_args()
    rows = []
    start = time.perf_counter()
    for op in args.ops.split(","):
        for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
            for n in LENGTHS:
                m = ELEMENTS // n
                x = torch.randn(m, n, device="cuda", dtype=dtype).requires_grad_()
                w = torch.randn(n, device="cuda", dtype=dtype).requires_grad_()
                b = torch.randn(n, device="cuda", dtype=dtype).requires_grad_() if op == "layer_norm" else None
                t, dy = (x, w, b), torch.randn(m, n, device="cuda", dtype=dtype)
                fns = calls(op)
                expected = fns["torch"](tuple(None if a is None else a.detach().float() for a in t))
                for direction in ("fwd", "fwd+bwd"):
                    row = dict(op=op, dtype=str(dtype).split(".")[-1], shape=f"{m}x{n}", dir=direction)
                    for name in [k for k in fns if k != "kcourse"] + args.variants.split(","):
                        saved = set_variant(VARIANTS.get(name, {}))
                        f = fns.get(name, fns["kcourse"])
                        try:
                            if name in VARIANTS and direction == "fwd" and name in ("split", "sweep"):
                                row[f"{name}_err"] = (f(t).float() - expected).abs().max().item()
                            row[name] = round(timed(f, t, dy, direction), 4)
                        except Exception as exc:  # noqa: BLE001
                            row[name] = f"error: {type(exc).__name__}: {str(exc)[:160]}"
                        finally:
                            restore(saved)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                del x, w, b, t, dy, expected
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, elapsed_s=time.perf_counter() - start)
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
