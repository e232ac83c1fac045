"""The pytorch backend's row-wise ops against the torch calls they stand for, forward and
forward+backward: layer_norm, rms_norm, softmax, log_softmax (32768 x 8192) and cross_entropy
(8192 x 50304), bfloat16 and float32.

Three ways of running each op are timed: ``torch`` (F.layer_norm, F.rms_norm, F.softmax,
F.log_softmax, F.cross_entropy; the backward through torch's autograd), ``module`` (the backend
module's ``<op>`` and ``<op>_backward`` called directly) and ``blas`` (``kcourse.blas.<op>(...,
backend="pytorch")`` on requires_grad inputs, backward through autograd). Each time is the median of
``--reps`` runs (CUDA events on CUDA, torch.utils.benchmark's timer elsewhere); a ratio is torch's
time over kcourse's (above 1: kcourse is faster).

    python benchmarks/experiments/pytorch_rows.py --out rows.json
    python benchmarks/experiments/pytorch_rows.py --device cpu --rows 64 --cols 256 --ce-rows 16 --vocab 1000 --out /tmp/rows.json
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
from datetime import datetime, timezone

import torch
import torch.nn.functional as F
import torch.utils.benchmark as tbench

from kcourse import blas
from kcourse.blas.pytorch import cross_entropy as ce_mod
from kcourse.blas.pytorch import layer_norm as ln_mod
from kcourse.blas.pytorch import log_softmax as lsm_mod
from kcourse.blas.pytorch import rms_norm as rms_mod
from kcourse.blas.pytorch import softmax as sm_mod

EPS = 1e-5


def median_time(fn, device: str, reps: int, warmup: int = 3) -> float:
    """Median seconds of ``fn()`` over ``reps`` runs."""
    for _ in range(warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)
    return tbench.Timer(stmt="fn()", globals={"fn": fn}).timeit(reps).median


def cases(rows: int, cols: int, ce_rows: int, vocab: int, dtype: torch.dtype, device: str):
    """``(op, {"torch": (fwd, fwdbwd), "module": (...), "blas": (...)})`` for each op, on fresh inputs."""
    x = torch.randn(rows, cols, dtype=dtype, device=device)
    w = torch.randn(cols, dtype=dtype, device=device)
    b = torch.randn(cols, dtype=dtype, device=device)
    dy = torch.randn(rows, cols, dtype=dtype, device=device)
    xg, wg, bg = (t.detach().requires_grad_() for t in (x, w, b))

    def autograd(f, leaves, seed):
        def run():
            out = f()
            torch.autograd.backward(out, seed)
            for t in leaves:
                t.grad = None
        return run

    def module(fwd, bwd, inputs, params, needs, seed):
        def forward():
            return fwd(*inputs, **params)

        def both():
            _, cache = fwd(*inputs, **params)
            return bwd(seed, cache, needs, **params)
        return forward, both

    yield "layer_norm", {
        "torch": (lambda: F.layer_norm(x, (cols,), w, b, EPS),
                  autograd(lambda: F.layer_norm(xg, (cols,), wg, bg, EPS), (xg, wg, bg), dy)),
        "module": module(ln_mod.layer_norm, ln_mod.layer_norm_backward, (x, w, b), {"eps": EPS},
                         (True, True, True), dy),
        "blas": (lambda: blas.layer_norm(x, w, b, EPS, backend="pytorch"),
                 autograd(lambda: blas.layer_norm(xg, wg, bg, EPS, backend="pytorch"), (xg, wg, bg), dy)),
    }
    yield "rms_norm", {
        "torch": (lambda: F.rms_norm(x, (cols,), w, EPS),
                  autograd(lambda: F.rms_norm(xg, (cols,), wg, EPS), (xg, wg), dy)),
        "module": module(rms_mod.rms_norm, rms_mod.rms_norm_backward, (x, w), {"eps": EPS}, (True, True), dy),
        "blas": (lambda: blas.rms_norm(x, w, EPS, backend="pytorch"),
                 autograd(lambda: blas.rms_norm(xg, wg, EPS, backend="pytorch"), (xg, wg), dy)),
    }
    for name, mod, ref in (("softmax", sm_mod, F.softmax), ("log_softmax", lsm_mod, F.log_softmax)):
        yield name, {
            "torch": (lambda ref=ref: ref(x, -1), autograd(lambda ref=ref: ref(xg, -1), (xg,), dy)),
            "module": module(getattr(mod, name), getattr(mod, name + "_backward"), (x,), {"dim": 1}, (True,), dy),
            "blas": (lambda name=name: getattr(blas, name)(x, -1, backend="pytorch"),
                     autograd(lambda name=name: getattr(blas, name)(xg, -1, backend="pytorch"), (xg,), dy)),
        }
    del x, dy, xg
    logits = torch.randn(ce_rows, vocab, dtype=dtype, device=device).mul_(3)
    target = torch.randint(0, vocab, (logits.shape[0],), device=device)
    lg = logits.detach().requires_grad_()
    one = torch.ones((), dtype=dtype, device=device)
    yield "cross_entropy", {
        "torch": (lambda: F.cross_entropy(logits, target),
                  autograd(lambda: F.cross_entropy(lg, target), (lg,), one)),
        "module": module(ce_mod.cross_entropy, ce_mod.cross_entropy_backward, (logits, target),
                         {"ignore_index": -100, "reduction": "mean"}, (True, False), one),
        "blas": (lambda: blas.cross_entropy(logits, target, backend="pytorch"),
                 autograd(lambda: blas.cross_entropy(lg, target, backend="pytorch"), (lg,), one)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", type=int, default=32768)
    parser.add_argument("--cols", type=int, default=8192)
    parser.add_argument("--ce-rows", type=int, default=8192, help="cross_entropy's N")
    parser.add_argument("--vocab", type=int, default=50304, help="cross_entropy's V")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--out", required=True, help="where to write the JSON results")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("CUDA is not available here; pass --device cpu (and small sizes)")
    results = []
    header = f"{'op':<14}{'dtype':<10}{'pass':<8}{'torch us':>10}{'module us':>11}{'blas us':>9}{'torch/module':>14}{'torch/blas':>12}"
    print(header)
    print("-" * len(header))
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for op, runs in cases(args.rows, args.cols, args.ce_rows, args.vocab, dtype, args.device):
            for i, phase in enumerate(("fwd", "fwd+bwd")):
                t = {way: median_time(fns[i], args.device, args.reps) for way, fns in runs.items()}
                row = {"op": op, "dtype": dtype_name, "pass": phase,
                       "shape": [args.ce_rows, args.vocab] if op == "cross_entropy"
                       else [args.rows, args.cols],
                       **{f"{way}_s": s for way, s in t.items()},
                       "torch_over_module": t["torch"] / t["module"], "torch_over_blas": t["torch"] / t["blas"]}
                results.append(row)
                print(f"{op:<14}{dtype_name:<10}{phase:<8}{t['torch'] * 1e6:>10.1f}{t['module'] * 1e6:>11.1f}"
                      f"{t['blas'] * 1e6:>9.1f}{row['torch_over_module']:>14.2f}{row['torch_over_blas']:>12.2f}",
                      flush=True)
            del runs
            if args.device == "cuda":
                torch.cuda.empty_cache()
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"
    meta = {"device": device_name, "torch": torch.__version__, "date": datetime.now(timezone.utc).isoformat(),
            "reps": args.reps, "timer": "CUDA events" if args.device == "cuda" else "torch.utils.benchmark"}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
