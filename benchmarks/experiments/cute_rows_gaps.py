"""Experiment: the two row-wise points where cute trailed triton (bfloat16 32768 x 8192: the
cross_entropy forward and the layer_norm backward), timed against triton in one process, then each
kernel's device time.

    source .cute/activate.sh && python -m benchmarks.experiments.cute_rows_gaps OUT.json

cross_entropy forward (reduction "mean", the runner's) and layer_norm backward (weight and bias: dx,
dweight, dbias), triton against cute, each result compared with torch in float32. do_bench medians
(L2 flushed), three interleaved rounds, the fastest kept; then each kernel's device time
(torch.profiler, ``kernel_times``). Variants measured with it and not kept: threads per row, CTAs per SM
with and without an occupancy hint, CTA pairs for the partials.

``--norm-variants``: instead, the norm backward (``--ops``, op:dtype pairs; ``--dims``, row lengths,
2^28 elements each) with each variant of the backward's launch (``NORM_VARIANTS``, set through
``kcourse.blas.tuning.override``: threads per CTA, CTAs per SM, the next row staged in shared
memory; "config" is ``backward_launch``'s choice) against
triton, in the same interleaved rounds, with each kernel's device time at D = 8192; every variant's
gradients are compared with torch's and with two CTAs of 256 threads'. A named barrier per row slot
at 512 threads measured slower (0.586 against 0.582 ms, layer_norm bf16).

``--row-variants``: the softmax forward and backward (bf16 and f32, ``--dims``) with the shipped
plans ("config") and with 256-thread CTAs (``tuning.override("softmax", ...)``), against triton.
Measured and not adopted: 512-thread CTAs for
the forward (float32 1-2% slower), a row across all 512 threads (16 elements a thread: 0.5262 ms backward bf16 against
0.5261 for two rows of 256) and the cross_entropy forward at 512 threads (0.197 / 0.192 ms against
0.1907 with 256).
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
from benchmarks.timing import bench_ms

from kcourse.blas import tuning
from kcourse.blas.cute import (cross_entropy as cute_ce, layer_norm as cute_ln, rms_norm as cute_rms,
                               softmax as cute_sm)
from kcourse.blas.triton import (cross_entropy as triton_ce, layer_norm as triton_ln, rms_norm as triton_rms,
                                 softmax as triton_sm)

N, V = 32768, 8192


def timed(fns, rounds=3):
    ms = {}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = bench_ms(fn)
            ms[name] = min(ms.get(name, t), t)
    return {name: round(t, 5) for name, t in ms.items()}


def kernel_times(fn, calls=30):
    """The device time of each kernel ``fn`` launches, in us (torch.profiler, mean over ``calls`` calls,
    each after an L2 flush as do_bench does; the flush's own kernel is left out)."""
    flush = torch.empty(2**28 // 4, device="cuda", dtype=torch.int32)
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    times = {}
    for e in prof.key_averages():
        if e.self_device_time_total > 0 and e.count >= calls and "fill" not in e.key.lower():
            times[e.key[:90]] = round(e.self_device_time_total / e.count, 2)
    return times


def cross_entropy_case():
    torch.manual_seed(0)
    logits = torch.randn(N, V, device="cuda", dtype=torch.bfloat16) * 4
    target = torch.randint(0, V, (N,), device="cuda")
    ref = F.cross_entropy(logits.float(), target)
    fns = {"triton": lambda: triton_ce.cross_entropy(logits, target, -100, "mean")[0],
           "cute": lambda: cute_ce.cross_entropy(logits, target, -100, "mean")[0]}
    errors = {name: abs(fn().float().item() - ref.item()) for name, fn in fns.items()}
    return {"op": "cross_entropy fwd", "errors": errors, "ms": timed(fns), "bytes": N * V * 2,
            "kernels us": {name: kernel_times(fns[name]) for name in ("triton", "cute")}}


def layer_norm_case():
    torch.manual_seed(0)
    x = torch.randn(N, V, device="cuda", dtype=torch.bfloat16)
    w, b = (torch.randn(V, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dy = torch.randn(N, V, device="cuda", dtype=torch.bfloat16)
    needs = (True, True, True)
    t_cache = triton_ln.layer_norm(x, w, b, 1e-5)[1]
    c_cache = cute_ln.layer_norm(x, w, b, 1e-5)[1]
    fns = {"triton": lambda: triton_ln.layer_norm_backward(dy, t_cache, needs, 1e-5),
           "cute": lambda: cute_ln.layer_norm_backward(dy, c_cache, needs, 1e-5)}
    xr = x.float().requires_grad_()
    wr, br = w.float().requires_grad_(), b.float().requires_grad_()
    ref = torch.autograd.grad(F.layer_norm(xr, (V,), wr, br, 1e-5), (xr, wr, br), dy.float())
    base = fns["cute"]()
    errors = {}
    for name, fn in fns.items():
        got = fn()
        errors[name] = {"vs torch": [round((g.float() - r).abs().max().item(), 4) for g, r in zip(got, ref)],
                        "vs cute": [round((g.float() - c.float()).abs().max().item(), 4) for g, c in zip(got, base)]}
    return {"op": "layer_norm bwd", "errors": errors, "ms": timed(fns), "bytes": 3 * N * V * 2,
            "kernels us": {name: kernel_times(fns[name]) for name in ("triton", "cute")}}


# name: the norm table's backward fields (threads, CTAs per SM, prefetch); "config": the shipped choice
NORM_VARIANTS = {
    "config": (None, None, None), "256x2": (256, 2, False), "512x1": (512, 1, False), "256x2 prefetch": (256, 2, True),
    "512x1 prefetch": (512, 1, True)}


def _with(op, variant, fn):
    """``fn`` run with ``op``'s backward launch set to ``variant`` (``tuning.override``)."""
    threads, per_sm, prefetch = NORM_VARIANTS[variant]

    def run():
        with tuning.override(op, backward_threads=threads, backward_ctas_per_sm=per_sm, backward_prefetch=prefetch):
            return fn()
    return run


def norm_variants_case(op, dtype, d, profile):
    """The backward of layer_norm (weight and bias) or rms_norm (weight) on 2^28 / d rows of d: triton
    and each variant (the prefetch only in 16 bits: 32-bit rows staged beside the accumulators would
    not fit in shared memory)."""
    torch.manual_seed(0)
    n = 2**28 // d
    x = torch.randn(n, d, device="cuda", dtype=dtype)
    w, b = (torch.randn(d, device="cuda", dtype=dtype) for _ in range(2))
    dy = torch.randn(n, d, device="cuda", dtype=dtype)
    xr, wr, br = (t.float().requires_grad_() for t in (x, w, b))
    if op == "layer_norm":
        needs = (True, True, True)
        t_cache, c_cache = triton_ln.layer_norm(x, w, b, 1e-5)[1], cute_ln.layer_norm(x, w, b, 1e-5)[1]
        fns = {"triton": lambda: triton_ln.layer_norm_backward(dy, t_cache, needs, 1e-5)}
        cute_fn = lambda: cute_ln.layer_norm_backward(dy, c_cache, needs, 1e-5)  # noqa: E731
        ref = torch.autograd.grad(F.layer_norm(xr, (d,), wr, br, 1e-5), (xr, wr, br), dy.float())
    else:
        needs = (True, True)
        t_cache, c_cache = triton_rms.rms_norm(x, w, 1e-5)[1], cute_rms.rms_norm(x, w, 1e-5)[1]
        fns = {"triton": lambda: triton_rms.rms_norm_backward(dy, t_cache, needs, 1e-5)}
        cute_fn = lambda: cute_rms.rms_norm_backward(dy, c_cache, needs, 1e-5)  # noqa: E731
        ref = torch.autograd.grad(F.rms_norm(xr, (d,), wr, 1e-5), (xr, wr), dy.float())
    del xr, wr, br
    variants = [v for v in NORM_VARIANTS if dtype != torch.float32 or "prefetch" not in v]
    fns.update({name: _with(op, name, cute_fn) for name in variants})
    base = fns["256x2"]()
    errors = {}
    for name, fn in fns.items():
        got = [g for g in fn() if g is not None]
        errors[name] = {"vs torch": [round((g.float() - r).abs().max().item(), 4) for g, r in zip(got, ref)],
                        "vs 256x2": [round((g.float() - c.float()).abs().max().item(), 4)
                                     for g, c in zip(got, [c for c in base if c is not None])]}
    size = torch.tensor([], dtype=dtype).element_size()
    row = {"op": f"{op} bwd {str(dtype)[6:]}", "shape": [n, d], "errors": errors, "ms": timed(fns),
           "bytes": 3 * n * d * size}
    if profile:
        row["kernels us"] = {name: kernel_times(fns[name]) for name in fns}
    return row


ROW_VARIANTS = {  # name: fields of the softmax table (``_softmax.Launch``); "config": the shipped ones
    "config": {}, "256": {"row_threads": 256, "backward_threads": 256}}


def _rows_with(variant, fn):
    """``fn`` run with the softmax table's fields set to ``variant`` (``tuning.override``)."""
    def run():
        with tuning.override("softmax", **ROW_VARIANTS[variant]):
            return fn()
    return run


def row_variants_case(op, dtype, d, profile):
    """softmax forward or backward on 2^28 / d rows of d: triton and each variant."""
    torch.manual_seed(0)
    n = 2**28 // d
    x = torch.randn(n, d, device="cuda", dtype=dtype) * 4
    dy = torch.randn(n, d, device="cuda", dtype=dtype)
    if op == "softmax fwd":
        ref = torch.softmax(x.float(), -1)
        t_fn, c_fn = (lambda: triton_sm.softmax(x, -1)[0]), (lambda: cute_sm.softmax(x, -1)[0])
    else:
        y = torch.softmax(x.float(), -1).to(dtype)
        ref = y.float() * (dy.float() - (y.float() * dy.float()).sum(-1, keepdim=True))
        t_fn = lambda: triton_sm.softmax_backward(dy, (y,), (True,), -1)[0]  # noqa: E731
        c_fn = lambda: cute_sm.softmax_backward(dy, (y,), (True,), -1)[0]  # noqa: E731
    fns = {"triton": t_fn, **{name: _rows_with(name, c_fn) for name in ROW_VARIANTS}}
    errors = {name: round((fn().float() - ref).abs().max().item(), 5) for name, fn in fns.items()}
    size = torch.tensor([], dtype=dtype).element_size()
    row = {"op": f"{op} {str(dtype)[6:]}", "shape": [n, d], "errors vs float32": errors, "ms": timed(fns),
           "bytes": (2 if op == "softmax fwd" else 3) * n * d * size}
    if profile:
        row["kernels us"] = {name: kernel_times(fns[name]) for name in fns}
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--norm-variants", action="store_true")
    parser.add_argument("--row-variants", action="store_true", help="the softmax launches instead (--dims)")
    parser.add_argument("--dims", default="8192", help="--norm-variants: row lengths, comma-separated")
    parser.add_argument("--ops", default="layer_norm:bfloat16,layer_norm:float32,rms_norm:bfloat16",
                        help="--norm-variants: op:dtype pairs, comma-separated")
    args = parser.parse_args()
    src = torch.empty(2**28 // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_ms = bench_ms(lambda: dst.copy_(src))
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "shape": [N, V], "dtype": "bfloat16", "copy_gbs": round(2 * src.numel() * 2 / copy_ms / 1e6, 1)}
    print(json.dumps(meta), flush=True)
    rows = []
    cases = (cross_entropy_case, layer_norm_case)
    if args.norm_variants:
        pairs = [item.split(":") for item in args.ops.split(",")]
        cases = [lambda op=op, dtype=dtype, d=d: norm_variants_case(op, getattr(torch, dtype), d, d == 8192)
                 for d in map(int, args.dims.split(",")) for op, dtype in pairs]
    if args.row_variants:
        cases = [lambda op=op, dtype=dtype, d=d: row_variants_case(op, dtype, d, d == 8192)
                 for d in map(int, args.dims.split(",")) for op in ("softmax bwd", "softmax fwd")
                 for dtype in (torch.bfloat16, torch.float32)]
    for case in cases:
        row = case()
        row["fraction of copy"] = {name: round(row["bytes"] / t / 1e6 / meta["copy_gbs"], 4)
                                   for name, t in row["ms"].items()}
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
