"""A few long rows: softmax and cross_entropy on rows too few to give every SM a CTA, with the cute
backend's rows spread over a cluster of CTAs (``_rows.split_rows``) or not, against triton and torch.

For M rows of N elements, every variant is timed as a CUDA graph of repeated calls (median of
``triton.testing.do_bench_cudagraph``), so the host's launch cost is out of the numbers; successive
calls read different copies of the inputs, 256 MiB of them at least (at most 32 copies: inputs under
8 MiB stay in L2, where the time is mostly latency anyway), so that no call finds its inputs in L2
(50 MiB on an H100) from the one before. Reported:
microseconds and the fraction of the device copy bandwidth measured in the same run, with the bytes
an op must move (softmax forward 2MN b, backward 3MN b; cross_entropy forward MN b, backward 2MN b;
b the element size).

Variants: ``cute`` (split_rows's own choice), ``cute/1`` (a CTA per row), ``cute/C`` (clusters of C
forced), ``triton`` and ``torch`` (eager). Usage, on the GPU (CuTe DSL installed):

    python -m benchmarks.experiments.long_rows OUT.json [--part few|many|all]
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench_cudagraph

from benchmarks.timing import bench_ms

from kcourse.backend import backward_kernel, resolve
from kcourse.blas import tuning
from kcourse.blas.cute import _rows, cross_entropy

ROWS = [1, 2, 4, 8, 16, 32, 64, 128, 256]  # a few rows: every op, the lengths below
LENGTHS = [16384, 65536, 262144]
MANY = [(512, 32768), (2048, 32768), (512, 65536), (2048, 65536), (8192, 65536), (256, 131072), (1024, 131072)]
FORCED = [1, 2, 4, 8]
COLD_BYTES = 2**28  # inputs are rotated among copies of at least this many bytes in all: not from L2
MAX_COPIES = 32  # ... but at most this many copies (inputs under 8 MiB stay in L2: latency-bound anyway)
def bench(fn) -> float | None:
    """Median milliseconds of ``fn`` in a CUDA graph (None where it cannot be captured)."""
    try:
        fn()
        return do_bench_cudagraph(fn, rep=10, return_mode="median")
    except RuntimeError as e:
        print(f"  not timed: {str(e).splitlines()[0]}", flush=True)
        return None


def entry(ms: float | None, nbytes: int, bandwidth: float):
    """[microseconds, fraction of the copy bandwidth] (None if not timed)."""
    return None if ms is None else [round(ms * 1e3, 2), round(nbytes / (ms * 1e-3) / bandwidth, 3)]


def copy_bandwidth() -> float:
    """Bytes per second of ``copy_`` between two 1 GiB float32 buffers (read + written), timed as
    ``benchmarks/run.py`` times its ceiling (``do_bench``, median), so the fractions compare."""
    x = torch.randn(2**28, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    ms = bench_ms(lambda: y.copy_(x))
    return 2 * x.numel() * 4 / (ms * 1e-3)


def variants(op: str, x: torch.Tensor, target: torch.Tensor, dy: torch.Tensor):
    """{name: (forward, backward)} callables for ``op`` on the inputs (``dy``: the seed of the
    softmax backward; the cross_entropy backward's is ``dy[:, 0]``)."""
    out = {}
    g = dy[:, 0].contiguous()
    for backend in ("cute", "triton"):
        fwd, bwd = resolve(op, backend)[1], backward_kernel(backend, op)
        if op == "softmax":
            y, cache = fwd(x, dim=-1)
            out[backend] = (lambda f=fwd: f(x, dim=-1), lambda b=bwd, c=cache: b(dy, c, (True,), dim=-1))
        else:
            loss, cache = fwd(x, target, ignore_index=-100, reduction="none")
            out[backend] = (lambda f=fwd: f(x, target, ignore_index=-100, reduction="none"),
                            lambda b=bwd, c=cache: b(g, c, (True, False), ignore_index=-100, reduction="none"))
    if op == "softmax":
        y = F.softmax(x, -1)
        out["torch"] = (lambda: F.softmax(x, -1), lambda: torch._softmax_backward_data(dy, y, -1, x.dtype))
    else:  # what F.cross_entropy's autograd runs: nll_loss backward, then log_softmax backward
        logp, total = F.log_softmax(x, -1), torch.zeros((), device=x.device, dtype=x.dtype)

        def backward():
            grad = torch.ops.aten.nll_loss_backward(g, logp, target, None, 0, -100, total)
            return torch.ops.aten._log_softmax_backward_data(grad, logp, -1, x.dtype)

        out["torch"] = (lambda: F.cross_entropy(x, target, reduction="none"), backward)
    return out


def rotating(calls):
    """One callable that runs ``calls`` in turn, a different one (on other buffers) at each call."""
    state = [0]

    def call():
        state[0] += 1
        return calls[state[0] % len(calls)]()

    return call


def measure(op, m, n, dtype, bandwidth, sms, forced) -> dict:
    """The variants of ``op`` on (m, n) inputs, each timed on enough copies of its inputs to miss L2."""
    copies = min(MAX_COPIES, max(1, -(-COLD_BYTES // (m * n * dtype.itemsize))))
    sets = []
    for _ in range(copies):
        x = 3 * torch.randn(m, n, device="cuda", dtype=dtype)
        sets.append((x, torch.randint(0, n, (m,), device="cuda"), torch.randn_like(x)))
    b = sets[0][0].element_size() * m * n
    passes = (2, 3) if op == "softmax" else (1, 2)
    row = {"op": op, "dtype": str(dtype).removeprefix("torch."), "M": m, "N": n, "copies": copies}

    def time_all(prefix, names):
        built = [variants(op, *inputs) for inputs in sets]
        for name in names:
            for d, (direction, k) in enumerate(zip(("fwd", "bwd"), passes)):
                ms = bench(rotating([v[name][d] for v in built]))
                row[f"{prefix or name} {direction}"] = entry(ms, k * b, bandwidth)

    time_all(None, ["cute", "triton", "torch"])
    for c in forced:  # the cute kernels with the CTAs per row forced (1: a CTA per row)
        with tuning.override(op, cluster=c):
            time_all(f"cute/{c}", ["cute"])
    vec = 16 // sets[0][0].element_size()
    shares = ((_rows.MAX_ONE_PASS, _rows.MAX_ONE_PASS // 2) if op == "softmax"
              else (0, cross_entropy.BACKWARD_SHARE))  # as softmax_rows / cross_entropy's launchers
    for direction, share in zip(("fwd", "bwd"), shares):
        row[f"auto {direction}"] = _rows.split_rows(_rows.plan(n, vec, [1]), m, n, sms, share).cluster
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--part", choices=["few", "many", "all"], default="all")
    args = parser.parse_args()
    torch.manual_seed(0)
    start = time.time()
    bandwidth = copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    meta = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
            "triton": triton.__version__, "copy_bandwidth_GBps": bandwidth / 1e9, "sms": sms,
            "cold_bytes": COLD_BYTES}
    print(json.dumps(meta), flush=True)
    results = []
    cases = []
    if args.part in ("few", "all"):
        cases += [(op, m, n, dtype) for dtype in (torch.bfloat16, torch.float32)
                  for n in (LENGTHS if dtype == torch.bfloat16 else [65536]) for m in ROWS
                  for op in ("softmax", "cross_entropy")]
    if args.part in ("many", "all"):  # many long rows (cross_entropy: its backward splits them)
        cases += [(op, m, n, dtype) for dtype in (torch.bfloat16, torch.float32) for m, n in MANY
                  for op in ("softmax", "cross_entropy") if m * n * dtype.itemsize <= 2**30]
    for op, m, n, dtype in cases:
        row = measure(op, m, n, dtype, bandwidth, sms, FORCED)
        results.append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "results": results, "seconds": round(time.time() - start)}, f, indent=1)


if __name__ == "__main__":
    main()
