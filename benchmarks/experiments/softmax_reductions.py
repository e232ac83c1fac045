"""Experiment (issue 6): the cute softmax forward against triton's, 32768 rows of 1024..16384 columns,
bfloat16 and float32, each output checked against torch in float32; do_bench (rep 20 ms) in 30
rounds, alternating orders, and the quartiles over rounds of triton's time over cute's within a round.

    source .cute/activate.sh && PYTHONPATH=. python benchmarks/experiments/softmax_reductions.py OUT.json

Session 20 ran it with a third column, "cute-2" (results/h100-2026-11-26-session20/softmax-reductions.json):
the shipped kernel then reduced a row kept in one CTA once, over (max, sum of exp(x - max)) pairs
(``_rows.combine_lse``, two exp2 at each of 9 levels at 512 threads), and "cute-2", a factory argument
since removed, reduced it twice, the max and then the sum, as triton does. The two reductions were
level at 4096 and 8192 columns and 0.4-1.2% faster at 1024 and 16384, and are the forward's path now.
"""
import argparse
import json
import time

import torch
from triton.testing import do_bench

from kcourse.blas.cute import softmax as cute_softmax
from kcourse.blas.triton import softmax as triton_softmax


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for n in (1024, 4096, 8192, 16384):
            torch.manual_seed(0)
            x = torch.randn(32768, n, dtype=dtype, device="cuda") * 3
            want = torch.softmax(x.float(), -1)
            fns = {"triton": lambda: triton_softmax.softmax(x, -1)[0], "cute": lambda: cute_softmax.softmax(x, -1)[0]}
            errors = {name: (fn().float() - want).abs().max().item() for name, fn in fns.items()}
            names, per_round = list(fns), []
            for r in range(args.rounds):
                order = names[r % len(names):] + names[:r % len(names)]
                per_round.append({k: do_bench(fns[k], warmup=5, rep=20, return_mode="median") for k in order})
            row = {"dtype": str(dtype)[6:], "n": n, "max_error": errors}
            for name in names[1:]:
                ratios = sorted(t["triton"] / t[name] for t in per_round)
                row[name] = [round(ratios[int(f * (len(ratios) - 1))], 4) for f in (0.25, 0.5, 0.75)]
            row["ms"] = {k: round(min(t[k] for t in per_round), 4) for k in names}
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
            "ratio": "triton's time over cute's in the same round: quartiles over rounds"}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
