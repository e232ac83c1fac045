"""Experiment: the runner's own calls (``benchmarks/run.py``'s Case, ``prepare`` and
``timed_call``, through ``launch_timeline.call_of``), two backends at a time, timed in many short
interleaved rounds; for each point the quartiles over rounds of the reference backend's time over the
other's in the same round.

    source .cute/activate.sh && python -m benchmarks.experiments.runner_paired OUT.json

Why: the runner keeps each call's fastest do_bench median over its rounds, and the GPU's clocks move
between rounds, so a ratio of two fastest times spreads by a few percent (the same attention kernel
timed under two names: 4% apart in ``cute_attention_units.py --paired``). A ratio taken
within a round, where the two calls run a few milliseconds apart, moves far less; its median over
rounds says whether two kernels differ, its quartiles by how much it varies.

Points: the targets where cute and its reference are within 1% in the runner: the
row-wise primitives at 32768 x 8192 (cute against triton, both directions, bfloat16 and float32) and
the attention at T = 1k (cute against F.sdpa, both masks, both directions).
"""
import argparse
import json
import time

import torch
from benchmarks.timing import bench_ms

from benchmarks.experiments.launch_timeline import call_of


def points(quick):
    rows = (32768, 8192) if not quick else (4096, 8192)
    for op in ("softmax", "layer_norm", "rms_norm", "cross_entropy"):
        for dtype in (torch.bfloat16, torch.float32):
            for direction in ("fwd", "bwd"):
                yield f"{op} {direction} {str(dtype)[6:]}", op, dtype, rows, ("triton", "cute"), direction
    for causal in (False, True):
        n = (16, 16, 1024, causal) if not quick else (2, 4, 256, causal)
        for direction in ("fwd", "bwd"):
            yield f"attention {direction} T=1k causal={causal}", "attention", torch.bfloat16, n, ("sdpa", "cute"), \
                direction


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--rep", type=int, default=20, help="do_bench's rep per timing, ms")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="", help="the points whose names start with this (e.g. 'softmax fwd')")
    args = parser.parse_args()
    rows = []
    for name, op, dtype, n, (ref, other), direction in points(args.quick):
        if not name.startswith(args.only):
            continue
        fns = {b: call_of(op, dtype, n, b, direction) for b in (ref, other)}
        for fn in fns.values():
            fn()
        ratios, best = [], {}
        for r in range(args.rounds):
            order = (ref, other) if r % 2 == 0 else (other, ref)  # each first in every other round
            times = {b: bench_ms(fns[b], 5, args.rep) for b in order}
            ratios.append(times[ref] / times[other])
            best = {b: min(best.get(b, t), t) for b, t in times.items()}
        ratios.sort()
        q = [round(ratios[int(f * (len(ratios) - 1))], 4) for f in (0.25, 0.5, 0.75)]
        row = {"point": name, "reference": ref, "backend": other, "rounds": args.rounds,
               "ratio_quartiles": q, "fastest_ms": {b: round(t, 4) for b, t in best.items()},
               "fastest_ratio": round(best[ref] / best[other], 4)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "ratio": "the reference's time over the backend's, in the same round (> 1: the backend is faster)"}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
