"""Turn a benchmark run's ``results.json`` into the markdown summary and the per-op plots.

    python benchmarks/summarize.py benchmarks/results/h100/results.json            # print the table
    python benchmarks/summarize.py benchmarks/results/h100/results.json --plots    # and redraw <op>.png

``run.py`` calls the same two functions at the end of a run, so a committed ``results.json`` is
enough to regenerate ``summary.md`` and every plot without a GPU.

A point is one (op, dtype, size, backend) measurement; see ``run.py`` for how it is measured and
for the meaning of each field.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

# ----------------------------------------------------------------------------- formatting

def shape_text(p: dict) -> str:
    """``2^28`` for a vector, ``16384x16384`` for a matrix, ``4096^3`` for a square gemm."""
    shape = p["shape"]
    if len(shape) == 1:
        n = shape[0]
        return f"2^{n.bit_length() - 1}" if n & (n - 1) == 0 else str(n)
    if p["op"] == "gemm" and len(set(shape)) == 1:
        return f"{shape[0]}^3"
    return "x".join(str(s) for s in shape)


def rate_text(p: dict) -> str:
    if p.get("tflops") is not None:
        return f"{p['tflops']:.1f} TFLOP/s"
    if p.get("gbs") is not None:
        return f"{p['gbs']:.0f} GB/s" if p["gbs"] >= 100 else f"{p['gbs']:.2f} GB/s"
    return "-"


def verdict(p: dict) -> str:
    """met / missed against the point's target, or why there is no number."""
    if p["status"] != "ok":
        return p["status"]
    if not p.get("checked"):
        return "WRONG RESULT (check failed)"
    if p.get("target_fraction") is None or p.get("fraction") is None:
        return "-"
    return "met" if p["fraction"] >= p["target_fraction"] else "missed"


def target_text(p: dict) -> str:
    if p.get("target_fraction") is None:
        return "-"
    return f">= {p['target_fraction']:.2f} of {p['ceiling_name']}"


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


# ----------------------------------------------------------------------------- markdown

def target_table(results: dict) -> str:
    """The markdown table of the target points (every backend that ran there)."""
    head = ("| op | shape | dtype | backend | median ms | GB/s or TFLOP/s | fraction of ceiling "
            "| target | result |\n|---|---|---|---|---:|---:|---:|---|---|")
    rows = []
    for p in results["points"]:
        if not p.get("target") or p["status"] == "skipped" or p.get("ceiling_point"):
            continue
        rows.append(f"| {p['op']} | {shape_text(p)} | {p['dtype']} | {p['backend']} "
                    f"| {_num(p.get('ms'), '.4f')} | {rate_text(p)} | {_num(p.get('fraction'), '.3f')} "
                    f"| {target_text(p)} | {verdict(p)} |")
    return "\n".join([head, *rows])


def notes(results: dict) -> list[str]:
    """Problems anywhere in the sweep (not only at target points), one line each."""
    lines = []
    pts = [p for p in results["points"] if not p.get("ceiling_point")]
    wrong = [p for p in pts if p["status"] == "ok" and not p.get("checked")]
    errors = [p for p in pts if p["status"] == "error"]
    missing = sorted({(p["op"], p["backend"]) for p in pts if p["status"] == "not implemented"})
    for p in wrong:
        lines.append(f"WRONG RESULT: {p['op']} {shape_text(p)} {p['dtype']} on {p['backend']}: "
                     f"{p.get('check_error', '')[:200]}")
    for p in errors:
        lines.append(f"error: {p['op']} {shape_text(p)} {p['dtype']} on {p['backend']}: {p.get('error', '')[:200]}")
    if missing:
        lines.append("not implemented: " + ", ".join(f"{op} on {b}" for op, b in missing))
    return lines


def summary_markdown(results: dict) -> str:
    """The whole ``summary.md``: provenance, ceilings, the target table, notes."""
    m = results["meta"]
    out = [
        f"# kcourse.blas benchmark: {m['device_name']}",
        "",
        f"{m['date_utc']} UTC; torch {m['torch']}, triton {m['triton']}, CUDA {m['cuda']}, "
        f"Python {m['python']}; kcourse {m.get('git_commit') or 'uncommitted'}"
        f"{' (dirty tree)' if m.get('git_dirty') else ''}; {'quick' if m.get('quick') else 'full'} run, "
        f"{m.get('elapsed_s', 0):.0f} s.",
        "",
        f"- Memory-bound ceiling: `dst.copy_(src)` on {m['copy_ceiling_elements']:,} float32 moves "
        f"**{m['copy_gbs']:.0f} GB/s** (bytes read + written). GB/s counts each op's minimal traffic.",
        "- Compute ceiling: `torch.matmul` at the same shape and dtype as each gemm point; "
        f"float32 matmul precision is `{m['float32_matmul_precision']}` "
        f"({'IEEE float32' if m['float32_matmul_precision'] == 'highest' else 'TF32 allowed'}).",
        f"- Timing: {m['timer']}.",
        *[f"- {n}" for n in m.get("notes", [])],
        "",
        "## Target points",
        "",
        target_table(results),
    ]
    problems = notes(results)
    if problems:
        out += ["", "## Problems", "", *[f"- {line}" for line in problems]]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- plots

COLORS = {"python": "tab:gray", "pytorch": "tab:blue", "triton": "tab:orange", "cute": "tab:green",
          "torch.matmul": "black"}  # one color per backend, the ceiling black
MARKERS = {"float32": "o", "bfloat16": "s", "float16": "^"}  # one marker per dtype


def plot_all(results: dict, out_dir: Path) -> list[Path]:
    """One PNG per op: rate against size, a line per backend and dtype, the ceiling dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    ops = sorted({p["op"] for p in results["points"]})
    for op in ops:
        pts = [p for p in results["points"] if p["op"] == op and p["status"] == "ok"]
        if not pts:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        gemm = op == "gemm"
        series = sorted({(p["backend"], p["dtype"]) for p in pts})
        for backend, dtype in series:
            line = sorted((p for p in pts if (p["backend"], p["dtype"]) == (backend, dtype)),
                          key=lambda p: p["size"])
            xs = [p["size"] for p in line]
            ys = [p["tflops"] if gemm else p["gbs"] for p in line]
            ceiling = any(p.get("ceiling_point") for p in line)
            wrong = [p for p in line if not p.get("checked") and not ceiling]
            style = dict(color=COLORS.get(backend, "tab:red"), marker=MARKERS.get(dtype, "o"), markersize=4,
                         linestyle="--" if ceiling else "-")
            ax.plot(xs, ys, label=f"{backend} {dtype}" + (" (ceiling)" if ceiling else ""), **style)
            if wrong:
                ax.plot([p["size"] for p in wrong], [p["tflops"] if gemm else p["gbs"] for p in wrong],
                        "rx", markersize=8, label=f"{backend} {dtype}: WRONG result")
        if not gemm:
            ax.axhline(results["meta"]["copy_gbs"], color="black", linestyle="--",
                       label="copy_ bandwidth (ceiling)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("n (elements)" if pts[0]["level"] == 1 else "n (square side)")
        ax.set_ylabel("TFLOP/s" if gemm else "GB/s")
        ax.set_title(f"{op} on {results['meta']['device_name']}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"{op}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def readme_section(path: Path, reruns: list[Path]) -> str:
    """The README's performance section: the target table of one run, and how the gemm target
    points moved across repeated runs (the spread is part of the result)."""
    results = json.loads(path.read_text())
    meta = results["meta"]
    lines = [f"{meta['device_name']}, {meta['date_utc'][:10]}; torch {meta['torch']}, triton {meta['triton']}, "
             f"CUDA {meta['cuda']}. Ceilings measured in the same run: `copy_` {meta['copy_gbs']:.0f} GB/s; "
             f"`torch.matmul` per shape. Results: [`{path.parent.as_posix()}`]({path.parent.as_posix()}).", "",
             target_table(results)]
    runs = [results] + [json.loads(r.read_text()) for r in reruns]
    if reruns:
        lines += ["", "gemm target points, fraction of `torch.matmul`, in each of the "
                  f"{len(runs)} runs of that day (same code):", "",
                  "| shape | dtype | backend | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " |",
                  "|---|---|---|" + "---:|" * len(runs)]
        key = lambda p: (shape_text(p), p["dtype"], p["backend"])  # noqa: E731
        for p in results["points"]:
            if p["op"] != "gemm" or not p.get("target") or p.get("ceiling_point") or p["status"] != "ok":
                continue
            fractions = [next((q.get("fraction") for q in r["points"] if q["op"] == "gemm"
                               and not q.get("ceiling_point") and key(q) == key(p)), None) for r in runs]
            lines.append(f"| {' | '.join(key(p))} | " + " | ".join(_num(f, ".3f") for f in fractions) + " |")
    return "\n".join(lines)


def write_readme(section: str, readme: Path = Path(__file__).resolve().parents[1] / "README.md") -> None:
    text = readme.read_text()
    head, rest = text.split("<!-- bench:start -->")
    _, tail = rest.split("<!-- bench:end -->")
    readme.write_text(f"{head}<!-- bench:start -->\n{section}\n<!-- bench:end -->{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="a results.json written by benchmarks/run.py")
    parser.add_argument("--plots", action="store_true", help="also redraw <op>.png next to results.json")
    parser.add_argument("--readme", action="store_true", help="write the README's performance section from this run")
    parser.add_argument("--rerun", type=Path, action="append", default=[],
                        help="with --readme: another run's results.json whose gemm points join the spread table")
    args = parser.parse_args()
    results = json.loads(args.results.read_text())
    if args.readme:
        write_readme(readme_section(args.results, args.rerun))
        return
    print(summary_markdown(results))
    if args.plots:
        for path in plot_all(results, args.results.parent):
            print("wrote", path)


if __name__ == "__main__":
    main()
