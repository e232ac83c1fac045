"""Two versions of kcourse on one host: ``benchmarks.gpt`` run in turns on a base checkout and on
this tree, each run in a new process, and the median step time of each variant per side.

    git worktree add .ab-base REV                                 # the base (git-ignored), once
    python -m benchmarks.ab --out DIR --base .ab-base --rounds 2 -- --batch 16 --backends triton --variants eager

Eager step times move by up to 50% between GPU hosts (the host's speed sets them when the GPU waits
on it), and by a few percent between runs on one host: a speedup is claimed only from runs of both
versions on one host, in turns (base, new, base, new, ...), so that a drift of the host's speed
during the call falls on both. On the GPU machine the base travels as an ignored folder
(``carry: [".ab-base"]``), its git history staying here. Writes DIR/ab.json (every run's step times
and the medians) and prints, per variant, base and new milliseconds and new's speed over base's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # this tree's root


def run_gpt(root: Path, out: Path, gpt_args: list[str]) -> dict:
    """``python -m benchmarks.gpt --out OUT *gpt_args`` with ``root`` first on the path; its JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    subprocess.run([sys.executable, "-m", "benchmarks.gpt", "--out", str(out), *gpt_args], cwd=root, env=env,
                   check=True)
    return json.loads((out / "gpt.json").read_text())


def summarize(runs: list[dict]) -> dict:
    """Per variant: each side's step times (ms) and median, and new's speed over base's (base / new)."""
    table: dict = {}
    for r in runs:
        for name, v in r["variants"].items():
            if "step_ms" in v:
                table.setdefault(name, {"base": [], "new": []})[r["side"]].append(v["step_ms"])
    for row in table.values():
        for side in ("base", "new"):
            row[f"{side}_median_ms"] = statistics.median(row[side]) if row[side] else None
        both = row["base_median_ms"] and row["new_median_ms"]
        row["speedup"] = row["base_median_ms"] / row["new_median_ms"] if both else None
    return table


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="writes OUT/ab.json")
    p.add_argument("--base", type=Path, required=True, help="a checkout of the base version (git worktree add)")
    p.add_argument("--rounds", type=int, default=2, help="base-then-new rounds")
    p.add_argument("gpt_args", nargs=argparse.REMAINDER, help="after --: benchmarks.gpt's arguments (not --out)")
    args = p.parse_args(argv)
    gpt_args = args.gpt_args[1:] if args.gpt_args[:1] == ["--"] else args.gpt_args
    base = args.base.resolve()
    if not (base / "benchmarks" / "gpt.py").is_file():
        p.error(f"--base {args.base}: not a kcourse checkout (no benchmarks/gpt.py)")
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for i in range(args.rounds):
        for side, root in (("base", base), ("new", HERE)):
            result = run_gpt(root, args.out / f"{side}{i + 1}", gpt_args)
            runs.append({"side": side, "round": i + 1, "meta": result["meta"], "variants": result["variants"]})
    table = summarize(runs)
    (args.out / "ab.json").write_text(json.dumps({"gpt_args": gpt_args, "runs": runs, "table": table}, indent=1) + "\n")
    print(f"\n{'variant':28s} {'base ms':>9s} {'new ms':>9s} {'speedup':>8s}  (medians of {args.rounds} runs a side)")
    for name, row in table.items():
        b, n, s = row["base_median_ms"], row["new_median_ms"], row["speedup"]
        print(f"{name:28s} {b or float('nan'):9.1f} {n or float('nan'):9.1f} {s or float('nan'):8.2f}")
    return table


if __name__ == "__main__":
    main()
