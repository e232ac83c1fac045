"""Experiment: where a runner time goes. For each call the runner times (``benchmarks/run.py``'s
Case, ``prepare`` and ``timed_call``), do_bench's loop (L2 flush, event, call, event) runs under
torch.profiler, and the device timeline splits each timed call into

    gap     from the end of the flush's kernel to the start of the call's first kernel (launch and host)
    kernels the device time of the call's kernels
    span    from the start of its first kernel to the end of its last

beside the CUDA-event time the runner reads (with and without the profiler). The same for the call
captured in a CUDA graph and replayed (the graph-time figures of ``attention_host.py``).

    source .cute/activate.sh && python -m benchmarks.experiments.launch_timeline OUT.json

Points: the attention forward at T = 1k, causal and not (cute against F.sdpa: where cute trails SDPA
in the runner by 1.5-2.5% while its kernel alone is level or ahead), and the row-wise forwards where cute
trailed triton by 0.2-0.3% (softmax float32, layer_norm bfloat16 and float32, 32768 x 8192).
"""
import argparse
import json
import os
import statistics
import tempfile

import torch
from benchmarks.timing import bench_ms, graphed

from benchmarks import run as runner

FLUSH_BYTES = 256 * 2**20


def call_of(op_name, dtype, n, backend, direction="fwd"):
    """The runner's timed call for one point and backend ("sdpa"/"torch": the reference)."""
    op = runner.OPS[op_name]
    case = runner.Case(op=op, dtype=dtype, n=n, target=True, device="cuda")
    runner.prepare(case)
    if backend in ("sdpa", "torch"):
        return runner.timed_call(case, op.reference, direction)
    return runner.timed_call(case, lambda t: op.run(t, backend), direction)


def timed_loop(fn, flush, calls):
    """do_bench's loop: per call an L2 flush, then ``fn`` between two CUDA events; the events' times, ms."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    for i in range(calls):
        flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def event_ms(fn, flush, calls):
    """do_bench's loop without the profiler: the median CUDA-event time of a call, ms."""
    return statistics.median(timed_loop(fn, flush, calls))


def timeline(fn, flush, calls):
    """do_bench's loop under torch.profiler: per call the gap after the flush, the kernels' device
    time and their span (medians, us), the event time (ms) and the names of the call's kernels."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        times = timed_loop(fn, flush, calls)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    kernels = sorted((e for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")),
                     key=lambda e: e["ts"])
    # the flushes: the fill kernels of FLUSH_BYTES (the longest fills; a call's own fills are short)
    fills = [e for e in kernels if "Fill" in e["name"] or e.get("cat") == "gpu_memset"]
    cut = max(e["dur"] for e in fills) * 0.5
    flushes = [e for e in fills if e["dur"] >= cut]
    gaps, device, spans, names = [], [], [], set()
    for a, b in zip(flushes, flushes[1:] + [None]):
        own = [e for e in kernels if e["ts"] > a["ts"] and (b is None or e["ts"] < b["ts"])]
        if not own:
            continue
        gaps.append(own[0]["ts"] - (a["ts"] + a["dur"]))
        device.append(sum(e["dur"] for e in own))
        spans.append(own[-1]["ts"] + own[-1]["dur"] - own[0]["ts"])
        names.update(e["name"][:60] for e in own)
    med = statistics.median
    return {"calls": len(gaps), "gap_us": round(med(gaps), 2), "kernels_us": round(med(device), 2),
            "span_us": round(med(spans), 2), "event_ms": round(med(times), 5),
            "flush_us": round(med(e["dur"] for e in flushes), 1), "kernel_names": sorted(names)}


def points(quick):
    bf16, f32 = torch.bfloat16, torch.float32
    rows = (32768, 8192) if not quick else (4096, 8192)
    out = []
    for causal in (False, True):
        n = (16, 16, 1024, causal) if not quick else (2, 4, 256, causal)
        out.append((f"attention fwd T=1k causal={causal}", [("cute", call_of("attention", bf16, n, "cute")),
                                                           ("sdpa", call_of("attention", bf16, n, "sdpa"))]))
    for name, dtype in (("softmax", f32), ("layer_norm", bf16), ("layer_norm", f32)):
        out.append((f"{name} fwd {str(dtype)[6:]}", [(b, call_of(name, dtype, rows, b)) for b in ("cute", "triton")]))
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    rows = []
    for point, calls in points(args.quick):
        fns = {}
        for backend, fn in calls:
            fns[backend] = fn
            try:
                fns[backend + " graph"] = graphed(fn)
            except RuntimeError as e:  # a call that cannot be captured: its runner figures only
                print(f"{point} {backend}: no graph ({str(e)[:100]})", flush=True)
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        result = {name: {"do_bench_ms": [], "event_ms": [], "profiled": []} for name in fns}
        for _ in range(args.rounds):  # interleaved
            for name, fn in fns.items():
                result[name]["do_bench_ms"].append(round(bench_ms(fn), 5))
                result[name]["event_ms"].append(round(event_ms(fn, flush, args.calls), 5))
                result[name]["profiled"].append(timeline(fn, flush, args.calls))
        row = {"point": point, "result": result}
        rows.append(row)
        print(point, flush=True)
        for name, r in result.items():
            p = r["profiled"]
            print(f"  {name:14s} do_bench {min(r['do_bench_ms']):.4f}  events {min(r['event_ms']):.4f}  "
                  f"gap {[x['gap_us'] for x in p]}  kernels {[x['kernels_us'] for x in p]}  "
                  f"span {[x['span_us'] for x in p]}  {p[0]['kernel_names']}", flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
