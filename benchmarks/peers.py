"""Race kcourse's row-wise ops against the libraries a user would pick instead, in one process, at
the same shapes, on the same inputs.

    python -m benchmarks.peers --out /tmp/peers                                     # every op, CUDA
    python -m benchmarks.peers --out /tmp/p --ops rms_norm,softmax --backends triton,cute --quick
    python -m benchmarks.peers --out /tmp/p --device cpu --quick                    # smoke test, no GPU
    python -m benchmarks.peers --out /tmp/p --from /tmp/peers/peers.json            # peers.md and plots from a JSON
    python -m benchmarks.history add /tmp/peers/peers.json                          # into the history

Method
------
* Ops: softmax, log_softmax, cross_entropy (mean over the rows), layer_norm (weight and bias),
  rms_norm (weight), defined once in ``benchmarks/run.py`` (``OPS``: inputs, the kcourse call,
  torch's call, minimal traffic). Shapes: ``ELEMENTS`` elements (2^27 on CUDA) in rows of 1k, 4k,
  16k, 64k and 256k columns (131072 x 1024 ... 512 x 262144), bfloat16 and float32. One set of
  random inputs per (op, dtype, shape) is shared by every backend and peer.
* Peers, each left out where it does not import (recorded as unavailable with the error; none is a
  dependency of kcourse):
  - ``torch eager``: the ``torch.nn.functional`` call (``F.softmax``, ``F.log_softmax``,
    ``F.cross_entropy``, ``F.layer_norm``, ``F.rms_norm``);
  - ``torch.compile``: that call compiled with ``torch.compile(dynamic=False)``, one compiled
    function per (op, dtype, direction); it recompiles per shape (``dynamic=False``), in the first,
    untimed call, and a recompile-limit hit is an error, not a silent fall back to eager;
  - ``quack`` (quack-kernels): ``quack.softmax.softmax``, ``quack.cross_entropy.cross_entropy``,
    ``quack.rmsnorm.rmsnorm``; quack has no differentiable layer_norm, so ``layernorm_fwd`` and
    ``layernorm_bwd`` of ``quack.rmsnorm`` run in a thin ``autograd.Function``, the weight and
    bias passed in float32 as they require; no log_softmax;
  - ``liger`` (liger-kernel): ``LigerSoftmaxFunction``, ``LigerLayerNormFunction``,
    ``LigerRMSNormFunction`` (casting "llama", ``in_place=False``: its default writes dx into the
    shared grad_out), ``LigerCrossEntropyFunction``; its forward writes the logits' gradient into
    the logits, so it runs on its own copy of them, made once per point outside the timing (later
    calls read the last call's gradient as logits: the same work); no log_softmax.
  On ``--device cpu`` quack and liger are left out (their kernels need CUDA) and torch.compile is
  skipped unless ``--cpu-compile`` (inductor builds C++ for every shape, seconds each).
* Directions: ``fwd`` is the call on inputs that require grad, as in training; ``fwd+bwd`` is one
  call of the forward then ``torch.autograd.grad(out, inputs, grad_out)``, grad_out random and
  fixed per point (1 for the scalar loss); every peer and backend is timed the same way.
* Check first, as ``benchmarks/run.py`` does: each point (peers too) runs once and is compared with
  the ``torch.nn.functional`` call in float32 (largest error at most twice torch's own in the run's
  dtype + tol x max |expected|; fwd+bwd: the output and every input gradient). A wrong result is
  reported as WRONG and not timed. That first call also pays JIT compiles and autotuning.
* Time: ``benchmarks/timing.py``'s timer (CUDA: ``do_bench`` median, L2 flushed before each call;
  CPU: a ``perf_counter`` median, a smoke test, not a benchmark). ``--rounds R``: every timed call
  of a point is timed R - 1 more times, in turn, and keeps its fastest median.
* Ratio: at each point the best peer is the fastest peer that ran and passed its check there; every
  point's ratio is the best peer's ms over its own (above 1: faster than every peer; a peer's is at
  most 1). GB/s counts the minimal traffic of ``run.py``; fwd+bwd adds the two directions'.
* Targets (issue 34): per op and kcourse backend, over both dtypes, both directions and every row
  length, ratio >= 1.00 at every point except at most two, which must still be >= 0.95; a point
  without a ratio (error, WRONG, no peer ran) misses.

Output in ``--out``: ``peers.json`` (metadata, the peers and why one is missing, every point),
``peers.md`` (the targets, a table per op, problems) and ``peers_<op>.png`` (ratio against row
length, a line per backend, dtype and direction).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import platform
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from benchmarks import timing
from benchmarks.common import environment, usable_backends
from benchmarks.run import (LAYER_NORM_EPS, OPS, RMS_NORM_EPS, TIMING, Case, measure, new_point, per_direction,
                            rates, retime)
from benchmarks.summarize import COLORS, MARKERS, notes, shape_text

ROW_OPS = ("softmax", "log_softmax", "cross_entropy", "layer_norm", "rms_norm")
DIRECTIONS = ("fwd", "fwd+bwd")
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
ELEMENTS = {"cuda": 1 << 27, "cpu": 1 << 12}  # per (N, D) tensor: 256 MiB in bfloat16, 512 MiB in float32
COLUMNS = {  # row lengths per device and mode
    ("cuda", False): [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18],
    ("cuda", True): [1 << 10, 1 << 14, 1 << 18],
    ("cpu", False): [1 << 6, 1 << 8, 1 << 10],
    ("cpu", True): [1 << 6, 1 << 10],
}
TARGET, SLACK, SLACK_POINTS = 1.0, 0.95, 2  # ratio >= TARGET everywhere but SLACK_POINTS points >= SLACK
RECOMPILE_LIMIT = 64  # torch.compile: every (dtype, direction, shape) of one op recompiles its call


# ----------------------------------------------------------------------------- the peers


@dataclass(frozen=True)
class Peer:
    """A library a user could call instead of kcourse."""
    name: str
    load: Callable[[], Callable]  # imports it; returns (op, dtype, direction) -> call(inputs), or None: no such op
    dist: str | None = None  # its PyPI distribution (for the version); None: torch itself
    cuda_only: bool = False
    slow_on_cpu: bool = False  # skipped on --device cpu unless --cpu-compile
    own_inputs: tuple = ()  # ops it runs on its own copy of the inputs (it writes into them)


def eager_calls() -> Callable:
    """torch eager: run.py's reference of each op, the ``torch.nn.functional`` call."""
    return lambda op, dtype, direction: OPS[op].reference


def compiled_calls() -> Callable:
    """torch.compile(dynamic=False) of the torch call, one compiled function per (op, dtype, direction)."""
    compiled = {}

    def call(op, dtype, direction):
        if (op, dtype, direction) not in compiled:
            compiled[op, dtype, direction] = torch.compile(OPS[op].reference, dynamic=False)
        return compiled[op, dtype, direction]
    return call


def quack_calls() -> Callable:
    """quack-kernels: softmax, cross_entropy, rmsnorm, and layer_norm through its forward and
    backward functions."""
    from quack.cross_entropy import cross_entropy
    from quack.rmsnorm import layernorm_bwd, layernorm_fwd, rmsnorm
    from quack.softmax import softmax

    class LayerNorm(torch.autograd.Function):
        """quack's layer_norm kernels, differentiable (weight and bias in float32, as they must be)."""

        @staticmethod
        def forward(ctx, x, weight, bias, eps):
            out, rstd, mean = layernorm_fwd(x, weight.float(), bias.float(), eps, return_rstd=True, return_mean=True)
            ctx.save_for_backward(x, weight, rstd, mean)
            return out

        @staticmethod
        def backward(ctx, dout):
            x, weight, rstd, mean = ctx.saved_tensors
            dx, dw, db = layernorm_bwd(x, weight.float(), dout, rstd, mean, has_bias=True)
            return dx, dw.to(weight.dtype), db.to(weight.dtype), None

    calls = {"softmax": lambda t: softmax(t[0]),
             "cross_entropy": lambda t: cross_entropy(t[0], t[1], reduction="mean"),
             "layer_norm": lambda t: LayerNorm.apply(t[0], t[1], t[2], LAYER_NORM_EPS),
             "rms_norm": lambda t: rmsnorm(t[0], t[1], eps=RMS_NORM_EPS)}
    return lambda op, dtype, direction: calls.get(op)


def liger_calls() -> Callable:
    """liger-kernel's autograd Functions."""
    from liger_kernel.ops import (LigerCrossEntropyFunction, LigerLayerNormFunction, LigerRMSNormFunction,
                                  LigerSoftmaxFunction)

    calls = {"softmax": lambda t: LigerSoftmaxFunction.apply(t[0]),
             # (input, target, weight, ignore_index, lse_square_scale, label_smoothing, reduction) -> (loss, ...)
             "cross_entropy": lambda t: LigerCrossEntropyFunction.apply(t[0], t[1], None, -100, 0.0, 0.0, "mean")[0],
             "layer_norm": lambda t: LigerLayerNormFunction.apply(t[0], t[1], t[2], LAYER_NORM_EPS),
             # (X, W, eps, offset, casting_mode, in_place)
             "rms_norm": lambda t: LigerRMSNormFunction.apply(t[0], t[1], RMS_NORM_EPS, 0.0, "llama", False)}
    return lambda op, dtype, direction: calls.get(op)


PEERS = {p.name: p for p in [
    Peer("torch eager", eager_calls),
    Peer("torch.compile", compiled_calls, slow_on_cpu=True),
    Peer("quack", quack_calls, dist="quack-kernels", cuda_only=True),
    Peer("liger", liger_calls, dist="liger-kernel", cuda_only=True, own_inputs=("cross_entropy",)),
]}


def version(dist: str | None) -> str | None:
    """The installed version of a distribution (torch's for None), or None where it is not installed."""
    if dist is None:
        return torch.__version__
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_peer(peer: Peer, device: str, cpu_compile: bool) -> tuple[Callable | None, dict]:
    """(its calls, or None where it does not run here; what the JSON records of it)."""
    info = dict(available=False, version=version(peer.dist))
    if device == "cpu" and peer.slow_on_cpu and not cpu_compile:
        return None, dict(info, reason="skipped on --device cpu: inductor builds C++ for every shape, seconds "
                                       "each (--cpu-compile runs it)")
    try:
        calls = peer.load()
    except Exception as e:  # noqa: BLE001 - ImportError, or a library that fails while it loads
        return None, dict(info, reason=f"import failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
    if device == "cpu" and peer.cuda_only:
        return None, dict(info, reason="its kernels need CUDA")
    return calls, dict(info, available=True)


def load_peers(names: list[str], device: str, cpu_compile: bool) -> tuple[list, dict]:
    """([(peer, its calls)] of those that run here, {name: availability, version, reason})."""
    loaded, info = [], {}
    for name in names:
        calls, info[name] = load_peer(PEERS[name], device, cpu_compile)
        if calls is not None:
            loaded.append((PEERS[name], calls))
        print(f"peer {name}: {'available' if calls else info[name]['reason']}", flush=True)
    return loaded, info


# ----------------------------------------------------------------------------- one point


def own_copy(case: Case) -> Case:
    """The case with fresh leaf copies of its floating-point inputs, for a peer that writes into them."""
    inputs = tuple(x.detach().clone().requires_grad_(x.requires_grad)
                   if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in case.inputs)
    return dataclasses.replace(case, inputs=inputs)


def measure_peer(case: Case, peer: Peer, calls: Callable, direction: str, timer, timed: list) -> dict:
    """One peer at one point, through run.py's ``measure`` (check, then time; not timed when wrong)."""
    call = calls(case.op.name, case.dtype, direction)
    if call is None:
        p = dict(new_point(case, peer.name, direction), status="not implemented",
                 error=f"{peer.name} has no {case.op.name}")
    else:
        on = own_copy(case) if case.op.name in peer.own_inputs else case
        p = measure(on, peer.name, call, direction, timer, 0.0, timed, time_wrong=False)
    p["peer"] = True
    return p


def run_point(case: Case, direction: str, backends: list[str], peers: list, timer, rounds: int) -> list[dict]:
    """Every peer, then every kcourse backend, at one (op, dtype, shape, direction); then the ratios."""
    timed = []
    points = [measure_peer(case, peer, calls, direction, timer, timed) for peer, calls in peers]
    points += [measure(case, b, lambda t, b=b: case.op.run(t, b), direction, timer, 0.0, timed, time_wrong=False)
               for b in backends]
    fastest = retime(timed, timer, rounds)
    for p, _ in timed:
        rates(p, case, fastest[id(p)], 0.0)
    rank(points)
    for p in points:
        report(p)
    return points


def rank(points: list[dict]) -> None:
    """Fill each point's best peer (the fastest peer timed here: only checked points are timed) and
    ratio (the best peer's ms over its own); kcourse's points get their target."""
    ran = [p for p in points if p.get("peer") and p.get("ms") is not None]
    best = min(ran, key=lambda p: p["ms"], default=None)
    for p in points:
        ratio = best["ms"] / p["ms"] if best and p.get("ms") else None
        p.update(best_peer=best and best["backend"], best_peer_ms=best and best["ms"], ratio=ratio,
                 fraction=ratio, ceiling_name="best peer", target=False, target_fraction=None,
                 target_ratio=None if p.get("peer") else TARGET)


def report(p: dict) -> None:
    """One progress line per point."""
    where = f"{p['op']:13s} {p['direction']:7s} {p['dtype']:8s} {shape_text(p):>12s} {p['backend']:13s}"
    if p["status"] != "ok":
        print(f"{where} {p['status']}: {p.get('error', '')[:120]}", flush=True)
    elif not p["checked"]:
        print(f"{where} WRONG (not timed): {p.get('check_error', '')[:120]}", flush=True)
    else:
        ratio = f"{p['ratio']:.2f}x best peer ({p['best_peer']})" if p["ratio"] else "no peer ran"
        print(f"{where} {p['ms']:9.4f} ms {p['gbs']:8.1f} GB/s  {ratio}", flush=True)


# ----------------------------------------------------------------------------- the sweep


def shapes(device: str, quick: bool) -> list[tuple[int, int]]:
    """(rows, columns) of every point: ``ELEMENTS[device]`` elements in rows of each length."""
    return [(ELEMENTS[device] // d, d) for d in COLUMNS[device, quick]]


def run_op(name: str, args, backends: list[str], peers: list, timer) -> list[dict]:
    """Every (dtype, shape, direction) of one op, peers and backends."""
    labels = [peer.name for peer, _ in peers] + backends
    points, start = [], time.perf_counter()
    for dtype in args.dtypes:
        for n in shapes(args.device, args.quick):
            case = Case(OPS[name], dtype, n, False, args.device)
            points += per_direction(case, labels, DIRECTIONS,
                                    lambda d: run_point(case, d, backends, peers, timer, args.rounds))
    print(f"--- {name}: {time.perf_counter() - start:.1f} s", flush=True)
    return points


# ----------------------------------------------------------------------------- targets, table, plots


def verdicts(points: list[dict]) -> list[dict]:
    """Per (op, kcourse backend): the lowest ratio, the points under TARGET, and whether the target holds."""
    groups = defaultdict(list)
    for p in points:
        if not p.get("peer"):
            groups[(p["op"], p["backend"])].append(p)
    out = []
    for (op, backend), pts in groups.items():
        rated = [p for p in pts if p.get("ratio") is not None]
        below = [p for p in rated if p["ratio"] < TARGET]
        lowest = min(rated, key=lambda p: p["ratio"], default=None)
        met = (len(rated) == len(pts) and len(below) <= SLACK_POINTS and all(p["ratio"] >= SLACK for p in below))
        out.append(dict(op=op, backend=backend, points=len(pts), unrated=len(pts) - len(rated), below=len(below),
                        lowest=lowest and lowest["ratio"],
                        lowest_at=lowest and f"{shape_text(lowest)} {lowest['dtype']} {lowest['direction']}",
                        met=met))
    return out


def cell(p: dict | None) -> str:
    """A table cell: the point's ratio, or why it has none."""
    if p is None:
        return ""
    if p["status"] != "ok":
        return "-" if p["status"] == "not implemented" else p["status"]
    if not p["checked"]:
        return "WRONG"
    return f"{p['ratio']:.2f}x" if p.get("ratio") is not None else "no peer"


def op_table(points: list[dict], labels: list[str]) -> list[str]:
    """One op's markdown table: a row per (dtype, direction, shape), a column per peer and backend."""
    rows = defaultdict(dict)
    for p in points:
        rows[(p["dtype"], p["direction"], p["size"], shape_text(p))][p["backend"]] = p
    lines = ["| dtype | dir | shape | best peer | its ms | " + " | ".join(labels) + " |",
             "|---|---|---|---|---:|" + "---:|" * len(labels)]
    for (dtype, direction, _, shape), by in sorted(rows.items(), key=lambda kv: kv[0][:3]):
        first = next(iter(by.values()))
        ms = "-" if first.get("best_peer_ms") is None else f"{first['best_peer_ms']:.4f}"
        lines.append(f"| {dtype} | {direction} | {shape} | {first.get('best_peer') or '-'} | {ms} | "
                     + " | ".join(cell(by.get(label)) for label in labels) + " |")
    return lines


def summary_markdown(results: dict) -> str:
    """``peers.md``: provenance, the peers, the targets per op and backend, a table per op, problems."""
    m = results["meta"]
    versions = ", ".join(f"{k} {m[k]}" for k in ("torch", "triton", "cuda", "python") if m.get(k))
    out = [f"# kcourse against its peers: {m['device']}", "",
           f"{m['date_utc']} UTC; {versions}; kcourse {m.get('git_commit') or 'uncommitted'}"
           f"{' (dirty tree)' if m.get('git_dirty') else ''}; {m['elements']:,} elements a tensor; "
           f"{m['elapsed_s']:.0f} s. Timing: {m['timer']}.", "",
           f"Ratio: the best peer's ms over the backend's at the same point (above 1: faster than every peer). "
           f"Target per op and backend: >= {TARGET:.2f}x at every point, >= {SLACK:.2f}x at no more than "
           f"{SLACK_POINTS} of them.", ""]
    for name, info in results["peers"].items():
        state = f"{info.get('version') or ''}" if info["available"] else f"not run: {info['reason']}"
        out.append(f"- {name}: {state}")
    out += ["", "## Targets", "", "| op | backend | result | lowest | at | points below 1.00x | without a ratio |",
            "|---|---|---|---:|---|---:|---:|"]
    for v in verdicts(results["points"]):
        low = "-" if v["lowest"] is None else f"{v['lowest']:.2f}x"
        out.append(f"| {v['op']} | {v['backend']} | {'met' if v['met'] else 'missed'} | {low} | "
                   f"{v['lowest_at'] or '-'} | {v['below']} of {v['points']} | {v['unrated']} |")
    labels = [n for n, i in results["peers"].items() if i["available"]] + m["backends"]
    for op in m["ops"]:
        pts = [p for p in results["points"] if p["op"] == op]
        out += ["", f"## {op}", "", *op_table(pts, labels)]
    problems = notes(results)
    if problems:
        out += ["", "## Problems", "", *[f"- {line}" for line in problems]]
    return "\n".join(out) + "\n"


def plot_ratios(results: dict, out_dir: Path) -> list[Path]:
    """``peers_<op>.png``: each kcourse backend's ratio against the row length, a line per (backend,
    dtype, direction); the target and the slack as horizontal lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for op in results["meta"]["ops"]:
        pts = [p for p in results["points"] if p["op"] == op and not p.get("peer") and p.get("ratio") is not None]
        if not pts:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        series = sorted({(p["backend"], p["dtype"], p["direction"]) for p in pts})
        for backend, dtype, direction in series:
            line = sorted((p for p in pts if (p["backend"], p["dtype"], p["direction"]) == (backend, dtype, direction)),
                          key=lambda p: p["size"])
            ax.plot([p["size"] for p in line], [p["ratio"] for p in line], color=COLORS.get(backend, "tab:red"),
                    marker=MARKERS.get(dtype, "o"), linestyle="-" if direction == "fwd" else "--",
                    label=f"{backend} {dtype} {direction}")
        ax.axhline(TARGET, color="black", linewidth=0.8)
        ax.axhline(SLACK, color="black", linewidth=0.8, linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"row length (columns; {results['meta']['elements']:,} elements a tensor)")
        ax.set_ylabel("best peer's ms / kcourse's ms")
        ax.set_title(f"{op} against the best peer on {results['meta']['device']}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"peers_{op}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


# ----------------------------------------------------------------------------- metadata and main


def metadata(args, backends: list[str], skipped: dict, timer_text: str) -> dict:
    """Where, when and with what the run ran (``common.environment``), and what it measured."""
    env = environment(args.device)
    if args.device == "cpu":
        env["device"] = f"CPU ({platform.processor() or platform.machine()})"
    return dict(env, runner="benchmarks/peers.py", ops=args.ops,
                dtypes=[str(d).removeprefix("torch.") for d in args.dtypes], elements=ELEMENTS[args.device],
                columns=COLUMNS[args.device, args.quick], directions=list(DIRECTIONS),
                backends=backends, skipped_backends=skipped, quick=args.quick, rounds=args.rounds, timer=timer_text,
                target=TARGET, slack=SLACK, slack_points=SLACK_POINTS)


def names(text: str, valid, what: str, parser) -> list[str]:
    """The comma-separated names of ``text``; an unknown one is a usage error."""
    chosen = [n for n in text.split(",") if n]
    unknown = [n for n in chosen if n not in valid]
    if unknown:
        parser.error(f"unknown {what} {unknown}; choose from {list(valid)}")
    return chosen


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory for peers.json, peers.md, peers_<op>.png")
    parser.add_argument("--ops", default=",".join(ROW_OPS), help=f"comma-separated subset of {','.join(ROW_OPS)}")
    parser.add_argument("--backends", default="pytorch,triton,cute", help="kcourse backends, comma-separated")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated subset of {','.join(PEERS)}")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated: bfloat16,float32")
    parser.add_argument("--quick", action="store_true", help="three row lengths (1k, 16k, 256k) instead of five")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: tiny sizes, a perf_counter timer, torch eager only: a smoke test of this script")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time each call this many times, in turn; keep the fastest")
    parser.add_argument("--cpu-compile", action="store_true", help="on --device cpu, run the torch.compile peer too")
    parser.add_argument("--from", dest="source", type=Path,
                        help="run nothing: rewrite peers.md and the plots in --out from this peers.json")
    args = parser.parse_args(argv)
    args.ops = names(args.ops, ROW_OPS, "ops", parser)
    args.peers = names(args.peers, PEERS, "peers", parser)
    args.dtypes = [DTYPES[d] for d in names(args.dtypes, DTYPES, "dtypes", parser)]
    args.backends = [b for b in args.backends.split(",") if b]
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available() and not args.source:
        parser.error("no CUDA device here; use --device cpu for a smoke test")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.source:
        return write(json.loads(args.source.read_text()), args.out)
    backends, skipped = usable_backends(args.backends, cuda=args.device == "cuda")
    for b, why in skipped.items():
        print(f"skipping backend {b}: {why}")
    warmup, rep = TIMING["quick" if args.quick else "full"]
    timer = timing.timer(args.device, warmup, rep)
    timer_text = (f"triton.testing.do_bench(warmup={warmup}, rep={rep}, return_mode='median'), L2 flushed per call"
                  if args.device == "cuda" else "time.perf_counter median of 7 calls (CPU smoke test, not a benchmark)")
    start = time.perf_counter()
    torch.manual_seed(0)
    meta = metadata(args, backends, skipped, timer_text)
    peers, info = load_peers(args.peers, args.device, args.cpu_compile)
    limits = {k: v for k, v in dict(recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True).items()
              if hasattr(torch._dynamo.config, k)}
    results = dict(meta=meta, peers=info, points=[])
    with torch._dynamo.config.patch(**limits):
        for name in args.ops:  # peers.json after each op: a run stopped by a time limit keeps the ops it did
            results["points"] += run_op(name, args, backends, peers, timer)
            meta["elapsed_s"] = time.perf_counter() - start
            save(results, args.out)
    return write(results, args.out)


def save(results: dict, out: Path) -> None:
    """``out/peers.json``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "peers.json").write_text(json.dumps(results, indent=1) + "\n")


def write(results: dict, out: Path) -> dict:
    """peers.json, peers.md and the plots into ``out``; the summary printed."""
    save(results, out)
    summary = summary_markdown(results)
    (out / "peers.md").write_text(summary)
    try:
        plots = plot_ratios(results, out)
    except ImportError:
        plots = []
        print("matplotlib is not installed: no plots (pip install matplotlib)")
    print(f"\nwrote {out / 'peers.json'}, {out / 'peers.md'} and {len(plots)} plots\n")
    print(summary)
    return results


if __name__ == "__main__":
    main()
