"""What refusing an out-of-range index costs: the device-side checks of embedding and cross_entropy
against the op's own time, on GPT-2 124M's shapes (8 x 1024 tokens, V = 50304, D = 768, bf16).

    python -m benchmarks.index_check --out DIR        # CUDA: pytorch, triton, cute
    python -m benchmarks.index_check --out /tmp/i --device cpu --tokens 64 --vocab 512 --dim 32   # smoke test

On a GPU no backend reads the indices on the host (that would synchronize every call); each checks
them on the device, and this measures that check (``benchmarks.timing``: do_bench medians):

- python: ``_check.assert_indices`` (a min/max over the N indices, ``torch._assert_async``)
  launched before the kernels: timed alone;
- cute: ``_compile.index_error`` inside the kernels (a compare and a trap on the loaded index): the
  op timed as shipped and with kernels compiled without it (a fresh compile cache), the difference;
- pytorch cross_entropy: its ``_assert_targets`` (a comparison, ``any``, ``torch._assert_async``):
  timed alone; pytorch embedding: F.embedding's kernel asserts itself (nothing to separate);
- triton: ``tl.device_assert`` inside the kernels (compiled in with ``debug=True``): the op timed
  with its shipped launch options and with the assert compiled out, the difference.

Forward only (the backward reads the same indices but checks nothing). The target: < 2% of the
op's forward. Writes DIR/index_check.json.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import statistics
import time
from pathlib import Path

import torch

import kcourse
from kcourse import blas
from kcourse.blas import _check
from benchmarks import timing


@contextlib.contextmanager
def triton_unchecked(op: str):
    """The triton kernels of ``op`` launched without their device assert (debug off)."""
    module = importlib.import_module(f"kcourse.blas.triton.{op}")
    shipped = module.CHECKED
    module.CHECKED = {**shipped, "debug": False}
    try:
        yield
    finally:
        module.CHECKED = shipped


_UNCHECKED_CUTE: dict = {}  # the cute kernels compiled without their index check, kept across rounds


@contextlib.contextmanager
def cute_unchecked(op: str):
    """The cute kernels compiled, within this block, without their index check (into a compile
    cache of their own; the shipped kernels come back after)."""
    from kcourse.blas.cute import _compile
    shipped, kernels = _compile.index_error, _compile._kernels
    _compile.index_error, _compile._kernels = (lambda *args: None), _UNCHECKED_CUTE
    try:
        yield
    finally:
        _compile.index_error, _compile._kernels = shipped, kernels


def check_alone(op: str, backend: str, idx, V: int):
    """The backend's separate check as a function, or None (inside the kernel, or none to separate)."""
    if backend == "python":
        ignore = -100 if op == "cross_entropy" else None
        return lambda: _check.assert_indices(idx, V, ignore)
    if backend == "pytorch" and op == "cross_entropy":
        from kcourse.blas.pytorch.cross_entropy import _assert_targets
        return lambda: _assert_targets(idx, idx != -100, V, -100)
    return None


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backends", default="pytorch,triton,cute")
    p.add_argument("--tokens", type=int, default=8 * 1024)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--rounds", type=int, default=7, help="checked / unchecked timings alternated (in-kernel checks)")
    args = p.parse_args(argv)
    time_ms = timing.timer(args.device)
    N, V, D = args.tokens, args.vocab, args.dim
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, V, (N,), generator=gen).to(args.device)
    weight = torch.randn(V, D, generator=gen).to(args.device, torch.bfloat16)
    logits = torch.randn(N, V, generator=gen).to(args.device, torch.bfloat16)
    calls = {"embedding": lambda b: blas.embedding(idx, weight, backend=b),
             "cross_entropy": lambda b: blas.cross_entropy(logits, idx, backend=b)}
    available = kcourse.backends()
    rows = []
    for op, call in calls.items():
        for b in args.backends.split(","):
            if not available[b].available:
                continue
            op_ms = time_ms(lambda: call(b))
            alone = check_alone(op, b, idx, V)
            spread = None
            if alone is not None:
                check_ms, how = time_ms(alone), "separate launch"
            elif b in ("triton", "cute"):
                # in-kernel: the op with and without the check, alternated --rounds times (the difference
                # of one pair is at the timer's noise for a short op); the median difference and its range
                unchecked = triton_unchecked if b == "triton" else cute_unchecked
                diffs = []
                for _ in range(args.rounds):
                    checked_ms = time_ms(lambda: call(b))
                    with unchecked(op):
                        diffs.append(checked_ms - time_ms(lambda: call(b)))
                check_ms, spread = statistics.median(diffs), (min(diffs), max(diffs))
                how = "in-kernel assert (debug on vs off)" if b == "triton" else "in-kernel trap (compiled in vs out)"
            else:
                check_ms, how = None, "inside torch's kernel"
            row = {"op": op, "backend": b, "op_ms": op_ms, "how": how, "check_ms": check_ms,
                   "fraction": None if check_ms is None else check_ms / op_ms, "check_ms_range": spread}
            rows.append(row)
            cost = "-" if check_ms is None else f"{check_ms:8.4f} ms {100 * check_ms / op_ms:5.1f}%"
            if spread:
                cost += f" (rounds {spread[0]:+.4f} .. {spread[1]:+.4f} ms)"
            print(f"{op:14s} {b:8s} op {op_ms:8.4f} ms   check {cost}   ({how})", flush=True)
    meta = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "tokens": N, "vocab": V, "dim": D, "dtype": "bfloat16"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"meta": meta, "rows": rows}
    (out / "index_check.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
