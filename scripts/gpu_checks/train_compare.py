"""examples/train_gpt.py on several backends from the same seed: do the loss curves match?

    PYTHONPATH=. python scripts/gpu_checks/train_compare.py OUTDIR [--backends pytorch,triton,cute]
        [--steps 300] [--dtype float32] [train_gpt.py options ...]

Runs the example once per backend (same seed, corpus, batches and model size; the first backend
is the reference), then compares every loss sequence with the reference's, step by step, against
the relative tolerance the cross-backend training test states (``LOSS_RTOL`` in
tests/test_training.py, read from that file). That test runs 20 steps; over a long run the
backends' float32 rounding differences grow through the optimizer, so the table gives the largest
relative difference over the first 20 steps, the first 100, and all of them, and the final
validation losses. Writes OUTDIR/compare.json and OUTDIR/compare.png (all curves); exit status 1
if a run failed or the first 20 steps differ by more than LOSS_RTOL.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOSS_RTOL = float(re.search(r"^LOSS_RTOL = (.+?)\s*(#.*)?$", (ROOT / "tests" / "test_training.py").read_text(),
                            re.M).group(1))


def run(backend: str, out: Path, steps: int, dtype: str, extra: list[str]) -> dict | None:
    cmd = [sys.executable, str(ROOT / "examples" / "train_gpt.py"), "--backend", backend, "--steps", str(steps),
           "--dtype", dtype, "--out", str(out / backend), "--quiet", "--sample", "0", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True)
    print(f"$ {' '.join(cmd[1:])}\n{done.stdout.strip()}")
    if done.returncode:
        print(done.stderr[-3000:])
        return None
    return json.loads((out / backend / "losses.json").read_text())


def max_rel(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) / abs(y) for x, y in zip(a, b)), default=float("nan"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--backends", default="pytorch,triton,cute")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--dtype", default="float32")
    args, extra = p.parse_known_args(argv)
    backends = args.backends.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = {b: run(b, args.out, args.steps, args.dtype, extra) for b in backends}
    ref_name, ref = backends[0], runs[backends[0]]
    ok = ref is not None
    print(f"\nloss curves against {ref_name}, relative tolerance {LOSS_RTOL:g} (tests/test_training.py)")
    print(f"{'backend':10s} {'steps 1-20':>11s} {'1-100':>9s} {'all':>9s} {'val loss':>9s}")
    table = {}
    for name, r in runs.items():
        if r is None or ref is None:
            print(f"{name:10s} failed")
            ok = False
            continue
        a, b = r["losses"], ref["losses"]
        row = {"first20": max_rel(a[:20], b[:20]), "first100": max_rel(a[:100], b[:100]), "all": max_rel(a, b),
               "val": r["val"], "final_train": sum(a[-20:]) / len(a[-20:])}
        table[name] = row
        ok &= row["first20"] <= LOSS_RTOL
        print(f"{name:10s} {row['first20']:11.2e} {row['first100']:9.2e} {row['all']:9.2e} {row['val']:9.4f}")
    (args.out / "compare.json").write_text(json.dumps({"rtol": LOSS_RTOL, "steps": args.steps, "dtype": args.dtype,
                                                       "reference": ref_name, "table": table,
                                                       "losses": {n: r and r["losses"] for n, r in runs.items()}}))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, r in runs.items():
            if r is not None:
                ax.plot(r["losses"], label=name, linewidth=1)
        ax.set_xlabel("step")
        ax.set_ylabel("train loss (nats)")
        if any(runs.values()):
            ax.legend()
        fig.savefig(args.out / "compare.png", dpi=120, bbox_inches="tight")
    except ImportError:
        print("(matplotlib not installed: no compare.png)")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
