"""Turn a benchmark run's ``results.json`` into the markdown summary and the per-op plots.

    python -m benchmarks.summarize /tmp/bench/results.json            # print the table
    python -m benchmarks.summarize /tmp/bench/results.json --plots    # and redraw <op>.png

``run.py`` calls the same two functions at the end of a run, so a committed ``results.json`` is
enough to regenerate ``summary.md`` and every plot without a GPU.

A point is one (op, dtype, size, direction, backend) measurement; see ``run.py`` for how it is
measured and for the meaning of each field. Torch's own points (``torch.matmul``, ``F.sdpa``: the
ceilings; ``F.softmax`` & co.: the eager times to beat) are marked ``ceiling_point`` or
``eager_point``. Results written before the backward and the transformer primitives existed (no
``direction``, no ``memory``) read as forward-only runs.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

# ----------------------------------------------------------------------------- formatting

def shape_text(p: dict) -> str:
    """``2^28`` for a vector, ``16384x16384`` for a matrix, ``4096^3`` for a square gemm,
    ``2x16x8192x128 causal`` for causal attention."""
    shape = p["shape"]
    if len(shape) == 1:
        n = shape[0]
        return f"2^{n.bit_length() - 1}" if n & (n - 1) == 0 else str(n)
    if p["op"] == "gemm" and len(set(shape)) == 1:
        return f"{shape[0]}^3"
    return "x".join(str(s) for s in shape) + (" causal" if p.get("causal") else "")


def direction(p: dict) -> str:
    return p.get("direction", "fwd")


def is_reference(p: dict) -> bool:
    """Torch's own point (a ceiling or the eager time), not a backend's."""
    return bool(p.get("ceiling_point") or p.get("eager_point"))


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
    met = p["fraction"] >= p["target_fraction"]
    if p.get("target_speedup") is not None:  # and not slower than torch eager
        if p.get("speedup_vs_eager") is None:
            return "- (no eager time)"
        met = met and p["speedup_vs_eager"] >= p["target_speedup"]
    return "met" if met else "missed"


def target_text(p: dict) -> str:
    if p.get("target_fraction") is None:
        return "-"
    text = f">= {p['target_fraction']:.2f} of {p['ceiling_name']}"
    if p.get("target_speedup") is not None:
        text += f" and >= {p['target_speedup']:.2f}x eager"
    return text


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


# ----------------------------------------------------------------------------- markdown

def target_table(results: dict) -> str:
    """The markdown table of the target points (every backend that ran there)."""
    head = ("| op | shape | dtype | dir | backend | median ms | GB/s or TFLOP/s | fraction of ceiling "
            "| vs eager | target | result |\n|---|---|---|---|---|---:|---:|---:|---:|---|---|")
    rows = []
    for p in results["points"]:
        if not p.get("target") or p["status"] == "skipped" or is_reference(p):
            continue
        speedup = _num(p.get("speedup_vs_eager"), ".2f") + ("x" if p.get("speedup_vs_eager") else "")
        rows.append(f"| {p['op']} | {shape_text(p)} | {p['dtype']} | {direction(p)} | {p['backend']} "
                    f"| {_num(p.get('ms'), '.4f')} | {rate_text(p)} | {_num(p.get('fraction'), '.3f')} "
                    f"| {speedup} | {target_text(p)} | {verdict(p)} |")
    return "\n".join([head, *rows])


def memory_table(results: dict) -> str:
    """Attention's peak memory over one forward + backward, each backend beside F.sdpa's."""
    rows = results.get("memory") or []
    reference = {r.get("causal"): r["peak_bytes"] for r in rows if r.get("reference")}
    lines = ["| shape | dtype | backend | peak MiB above the inputs | vs F.sdpa |", "|---|---|---|---:|---:|"]
    for r in rows:
        peak, ref = r.get("peak_bytes"), reference.get(r.get("causal"))
        mib = r["status"] if r["status"] != "ok" else _num(None if peak is None else peak / 2**20, ".0f")
        ratio = f"{peak / ref:.2f}x" if peak is not None and ref else "-"
        lines.append(f"| {shape_text(r)} | {r['dtype']} | {r['backend']} | {mib} | {ratio} |")
    return "\n".join(lines)


def notes(results: dict) -> list[str]:
    """Problems anywhere in the sweep (not only at target points), one line each."""
    lines = []
    pts = results["points"]  # torch's own points too: a failed ceiling or eager time is a problem
    wrong = [p for p in pts if p["status"] == "ok" and not p.get("checked")]
    errors = [p for p in pts if p["status"] == "error"]
    missing = sorted({(p["op"], p["backend"]) for p in pts if p["status"] == "not implemented"})
    where = lambda p: f"{p['op']} {direction(p)} {shape_text(p)} {p['dtype']} on {p['backend']}"  # noqa: E731
    for p in wrong:
        lines.append(f"WRONG RESULT: {where(p)}: {p.get('check_error', '')[:200]}")
    for p in errors:
        lines.append(f"error: {where(p)}: {p.get('error', '')[:200]}")
    for r in results.get("memory") or []:
        if r["status"] == "error":
            lines.append(f"error (peak memory): attention {shape_text(r)} on {r['backend']}: "
                         f"{r.get('error', '')[:200]}")
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
    if results.get("memory"):
        out += ["", "## Attention peak memory", "",
                "One forward + backward (after a warm-up one): bytes allocated at the peak above those allocated "
                "before it (q, k, v and the output's gradient); CUDA only.", "", memory_table(results)]
    problems = notes(results)
    if problems:
        out += ["", "## Problems", "", *[f"- {line}" for line in problems]]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- plots

COLORS = {"python": "tab:gray", "pytorch": "tab:blue", "triton": "tab:orange", "cute": "tab:green"}
MARKERS = {"float32": "o", "bfloat16": "s", "float16": "^"}  # one marker per dtype
DEFAULT_X_LABELS = {1: "n (elements)", 2: "n (square side)", 3: "n (square side)"}  # results without meta x_labels


def plot_all(results: dict, out_dir: Path) -> list[Path]:
    """One PNG per op: rate against size, a line per backend, dtype (and causal), torch's own points
    dashed; one panel per direction (fwd, bwd)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for op in sorted({p["op"] for p in results["points"]}):
        pts = [p for p in results["points"] if p["op"] == op and p["status"] == "ok"]
        if not pts:
            continue
        directions = [d for d in ("fwd", "bwd") if any(direction(p) == d for p in pts)]
        fig, axes = plt.subplots(1, len(directions), figsize=(7 * len(directions), 4.5), squeeze=False)
        for ax, d in zip(axes[0], directions):
            title = f"{op}{' ' + d if len(directions) > 1 else ''} on {results['meta']['device_name']}"
            plot_panel(ax, [p for p in pts if direction(p) == d], results["meta"], title)
        fig.tight_layout()
        path = out_dir / f"{op}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def plot_panel(ax, pts: list[dict], meta: dict, title: str) -> None:
    """One direction of one op: a line per (backend, dtype, causal)."""
    compute = any(p.get("tflops") is not None for p in pts)
    rate = (lambda p: p["tflops"]) if compute else (lambda p: p["gbs"])
    series = lambda p: (p["backend"], p["dtype"], bool(p.get("causal")))  # noqa: E731
    for key in sorted({series(p) for p in pts}):
        line = sorted((p for p in pts if series(p) == key), key=lambda p: p["size"])
        backend, dtype, causal = key
        reference, ceiling = is_reference(line[0]), bool(line[0].get("ceiling_point"))
        kind = " (ceiling)" if ceiling else " (eager)" if reference else ""
        color = "black" if ceiling else "tab:purple" if reference else COLORS.get(backend, "tab:red")
        ax.plot([p["size"] for p in line], [rate(p) for p in line], color=color,
                marker=MARKERS.get(dtype, "o"), markersize=4, markerfacecolor="none" if causal else color,
                linestyle="--" if reference else ":" if causal else "-",
                label=f"{backend} {dtype}{' causal' if causal else ''}{kind}")
        wrong = [p for p in line if not p.get("checked") and not reference]
        if wrong:
            ax.plot([p["size"] for p in wrong], [rate(p) for p in wrong], "rx", markersize=8,
                    label=f"{backend} {dtype}: WRONG result")
    if not compute:
        ax.axhline(meta["copy_gbs"], color="black", linestyle="--", label="copy_ bandwidth (ceiling)")
    ax.set_xscale("log", base=2)
    op, level = pts[0]["op"], pts[0]["level"]
    ax.set_xlabel(meta.get("x_labels", {}).get(op) or DEFAULT_X_LABELS[level])
    ax.set_ylabel("TFLOP/s" if compute else "GB/s")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="a results.json written by benchmarks/run.py")
    parser.add_argument("--plots", action="store_true", help="also redraw <op>.png next to results.json")
    args = parser.parse_args()
    results = json.loads(args.results.read_text())
    print(summary_markdown(results))
    if args.plots:
        for path in plot_all(results, args.results.parent):
            print("wrote", path)


if __name__ == "__main__":
    main()
