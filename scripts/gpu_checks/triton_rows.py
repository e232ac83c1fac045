"""GPU check and tuning sweep of the triton row kernels: the layer_norm / rms_norm backward (with its
column sums) and the cross_entropy forward (kcourse/blas/triton/_norm.py, cross_entropy.py).

    PYTHONPATH=. python scripts/gpu_checks/triton_rows.py                # ~3.7 minutes on an H100
    PYTHONPATH=. python scripts/gpu_checks/triton_rows.py --only ce      # one section: norm, colsum, ce
    PYTHONPATH=. python scripts/gpu_checks/triton_rows.py --smoke        # tiny sizes, CPU interpreter

A variant is a dict of module constants (``_norm.PREFETCH_ITEMSIZE``, ``cross_entropy.EARLY_LOAD``,
...) set for its run and restored after it; ``default`` is the constants as committed, ``old-like``
the closest the new kernels come to the previous scheme (one row per program step, no prefetch, 4
programs per SM, 32 x 128 column-sum tiles; the old chunked cross-entropy sweep). A variant whose
launch would be the same as one already run at that shape is not run again.

Every variant is first checked against torch computed in float32 from the same inputs: the largest
error of each output next to what it may be, 2 x torch's own error in the run's dtype + tol x
max |expected| (tol 1e-4 float32, 2e-2 bfloat16, benchmarks/run.py's rule); ``ok`` is PASS or FAIL.
Then it is timed: ``ms``, the median of triton.testing.do_bench (the L2 cache flushed before each
call; host launch gaps included, which dominate at 8192 x 512); ``graph``, the median time per call
of 20 calls replayed from a CUDA graph (GPU time only, L2 warm); GB/s of the minimal traffic (norm
backward 3NDs: x, dy, dx; cross_entropy forward NVs) and its fraction of the bandwidth of a torch
``copy_`` of an (N, D) tensor of the same dtype (2NDs), measured in the same run; ``vs eager``,
torch eager's do_bench time (F.layer_norm / F.rms_norm backward through autograd, F.cross_entropy
forward) divided by ours. The kernels are called directly (``norm_backward``, ``cross_entropy``),
without autograd around them. Column sums alone: ``graph`` time of ``_column_sums`` on (2, P, D)
float32 partials. A summary per shape closes the run. Jobs go variant by variant, in the order of
the lists below (every shape's ``default``, then ``old-like``, ...); past ``--budget`` seconds (norm
up to half of it, cross_entropy up to 90%) the rest is skipped, saying so.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

GPU = torch.cuda.is_available()
if not GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is decorated
if importlib.util.find_spec("kcourse") is None:  # not installed: import it from the cwd (the repository root)
    sys.path.insert(0, os.getcwd())

from kcourse.blas.triton import _norm, cross_entropy as ce  # noqa: E402

DEV = "cuda" if GPU else "cpu"
BF16, F32 = torch.bfloat16, torch.float32
TOL = {F32: 1e-4, BF16: 2e-2}
LN_EPS, RMS_EPS = 1e-5, 1e-6

OLD_NORM = {"BACKWARD_TILE": 1, "BACKWARD_THREAD_ELEMENTS": 8, "PREFETCH_ITEMSIZE": 0, "PROGRAMS_PER_SM": 4,
            "SUM_TILE": 4096, "SUM_MAX_BLOCK_P": 32, "SUM_WARPS": 4}
NORM_VARIANTS = [  # (name, _norm constants), most important first
    ("default", {}),
    ("old-like", OLD_NORM),
    ("no-prefetch", {"PREFETCH_ITEMSIZE": 0}),
    ("pps1", {"PROGRAMS_PER_SM": 1}),
    ("pps4", {"PROGRAMS_PER_SM": 4}),
    ("tile8192", {"BACKWARD_TILE": 8192}),
    ("thread8", {"BACKWARD_THREAD_ELEMENTS": 8}),
    ("stages2", {"PREFETCH_ITEMSIZE": 0, "BACKWARD_STAGES": 2}),
    ("prefetch-fp32", {"PREFETCH_ITEMSIZE": 4}),
    ("thread32", {"BACKWARD_THREAD_ELEMENTS": 32}),
    ("tile2048", {"BACKWARD_TILE": 2048}),
    ("prefetch+stages2", {"BACKWARD_STAGES": 2}),
]
SUM_VARIANTS = [  # (name, _norm constants) of the column-sum micro benchmark
    ("default", {}),
    ("old-like (2 launches)", {"SUM_TILE": 4096, "SUM_MAX_BLOCK_P": 32, "SUM_WARPS": 4}),
    ("4096/512/4w", {"SUM_TILE": 4096, "SUM_MAX_BLOCK_P": 512, "SUM_WARPS": 4}),
    ("8192/512/8w", {"SUM_TILE": 8192, "SUM_MAX_BLOCK_P": 512, "SUM_WARPS": 8}),
    ("2048/256/4w", {"SUM_TILE": 2048, "SUM_MAX_BLOCK_P": 256, "SUM_WARPS": 4}),
    ("4096/128/4w", {"SUM_TILE": 4096, "SUM_MAX_BLOCK_P": 128, "SUM_WARPS": 4}),
    ("2048/256/2w", {"SUM_TILE": 2048, "SUM_MAX_BLOCK_P": 256, "SUM_WARPS": 2}),
]
CE_VARIANTS = [  # (name, cross_entropy constants), most important first
    ("default", {}),
    ("old-like", {"ONE_PASS_V": 0, "PREFETCH": False, "SUM_BLOCK": 1024, "SUM_WARPS": 4}),
    ("wait-target", {"EARLY_LOAD": False}),
    ("thread32", {"THREAD_ELEMENTS": 32}),
    ("tile8192", {"TILE": 8192}),
    ("one-pass<=8192", {"ONE_PASS_V": 8192}),
    ("no-prefetch", {"PREFETCH": False}),
    ("chunked", {"ONE_PASS_V": 0}),
    ("sum1024/4w", {"SUM_BLOCK": 1024, "SUM_WARPS": 4}),
    ("sum4096/8w", {"SUM_BLOCK": 4096, "SUM_WARPS": 8}),
    ("sum8192/16w", {"SUM_BLOCK": 8192, "SUM_WARPS": 16}),
    ("thread8", {"THREAD_ELEMENTS": 8}),
    ("tile16384", {"TILE": 16384}),
]

if GPU:
    NORM_SHAPES = [(32768, 8192, BF16), (32768, 8192, F32), (8192, 512, BF16)]
    CE_SHAPES = [(32768, 8192, BF16), (32768, 8192, F32), (8192, 512, BF16), (8192, 50304, BF16),
                 (32768, 16384, BF16)]
    SUM_SHAPES = [(p, d) for d in (512, 8192) for p in (132, 264, 528)]
else:  # --smoke on the CPU: the script's own logic through Triton's interpreter
    NORM_SHAPES = [(40, 300, BF16), (37, 96, F32)]
    CE_SHAPES = [(40, 300, BF16), (9, 20000, BF16)]
    SUM_SHAPES = [(5, 40), (9, 300)]

results: list[dict] = []  # one per timed job, for the summary
failures = 0
START = time.perf_counter()


# ----------------------------------------------------------------------------- timing

def bench_ms(fn) -> float:
    """Median ms: triton's do_bench on CUDA (L2 flushed before each call), a perf_counter median on the CPU."""
    if GPU:
        from triton.testing import do_bench
        return do_bench(fn, warmup=10, rep=50, return_mode="median")
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def graph_ms(fn, calls: int = 20, replays: int = 5) -> float | None:
    """Median ms per call of ``calls`` calls captured in one CUDA graph: GPU time without host gaps."""
    if not GPU:
        return None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm the allocator on the capture's side of things
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del graph
    return statistics.median(times)


_copy_cache: dict = {}


def copy_gbs(n: int, d: int, dtype) -> float:
    """GB/s (read + write) of a torch copy_ of an (n, d) tensor of ``dtype``, measured once per shape."""
    key = (n, d, dtype)
    if key not in _copy_cache:
        src = torch.randn(n, d, device=DEV).to(dtype)
        dst = torch.empty_like(src)
        _copy_cache[key] = 2 * src.numel() * src.element_size() / bench_ms(lambda: dst.copy_(src)) / 1e6
    return _copy_cache[key]


# ----------------------------------------------------------------------------- variants and checks

def patched(module, constants: dict):
    """Set ``constants`` on ``module``; returns the function that restores the old values."""
    old = {k: getattr(module, k) for k in constants}
    for k, v in constants.items():
        setattr(module, k, v)
    return lambda: [setattr(module, k, v) for k, v in old.items()]


def max_err(got, want) -> float:
    return (got.detach().float() - want.float()).abs().max().item() if want.numel() else 0.0


def verdict(name: str, got, want, own, dtype) -> tuple[bool, str]:
    """``got`` against the float32 ``want``: error, bound = 2 x torch's own error + tol x max |want|."""
    err = max_err(got, want)
    bound = 2 * (max_err(own, want) if own is not None else 0.0) + TOL[dtype] * want.abs().max().item()
    ok = err <= bound  # NaN fails
    return ok, f"{name} {err:.2e}/{bound:.1e}"


def over_budget(budget: float) -> bool:
    return time.perf_counter() - START > budget


def row(section, shape, dtype, variant, ms, gms, nbytes, ceiling, eager_ms, checks):
    """Print one result line and keep it for the summary."""
    global failures
    ok = all(c[0] for c in checks)
    failures += not ok
    gbs = nbytes / ms / 1e6 if ms else 0.0
    graph = f"{gms:8.4f}" if gms is not None else "       -"
    eager = f"{eager_ms / ms:5.2f}x" if eager_ms and ms else "    -"
    print(f"{section:14s} {shape:12s} {str(dtype)[6:]:8s} {variant:22s} {ms:8.4f} {graph} {gbs:7.0f} "
          f"{gbs / ceiling if ceiling else 0:5.3f} {eager}  {'PASS' if ok else 'FAIL'}  "
          f"{'; '.join(c[1] for c in checks)}", flush=True)
    results.append(dict(section=section, shape=shape, dtype=dtype, variant=variant, ms=ms, graph=gms, ok=ok))


def header(title: str) -> None:
    print(f"\n== {title}\n{'op':14s} {'shape':12s} {'dtype':8s} {'variant':22s} {'ms':>8s} {'graph':>8s} "
          f"{'GB/s':>7s} {'copy':>5s} {'eager':>6s}  ok    error/bound per output", flush=True)


def jobs(shapes, variants):
    """(shape, variant) pairs, variant by variant: past the budget, the last variants go unrun at every shape."""
    return [(s, v) for v in variants for s in shapes]


# ----------------------------------------------------------------------------- norm backward

class NormCase:
    """One (op, N, D, dtype): inputs, our forward's cache, torch's float32 and own-dtype gradients, eager time."""

    def __init__(self, op: str, n: int, d: int, dtype):
        self.op, self.n, self.d, self.dtype = op, n, d, dtype
        center = op == "layer_norm"
        self.x = torch.randn(n, d, device=DEV).to(dtype)
        self.w = torch.randn(d, device=DEV).to(dtype)
        self.b = torch.randn(d, device=DEV).to(dtype) if center else None
        self.dy = torch.randn(n, d, device=DEV).to(dtype)
        _, self.x2, self.mean, self.rstd = _norm.norm_forward(self.x, self.w, self.b, LN_EPS if center else RMS_EPS,
                                                              center)
        self.needs = (True, True, center)
        self.want = self.torch_grads(F32)
        self.own, self.eager_ms = self.torch_grads(dtype, time_it=True)

    def torch_grads(self, dtype, time_it=False):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (self.x, self.w, self.b) if t is not None]
        if self.op == "layer_norm":
            y = F.layer_norm(leaves[0], (self.d,), leaves[1], leaves[2], LN_EPS)
        else:
            y = F.rms_norm(leaves[0], (self.d,), leaves[1], RMS_EPS)
        dy = self.dy.to(dtype)
        grads = torch.autograd.grad(y, leaves, dy, retain_graph=time_it)
        if not time_it:
            return grads
        return grads, bench_ms(lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True))

    def run(self):
        return _norm.norm_backward(self.dy, self.x2, self.w, self.mean, self.rstd, self.needs)

    def key(self) -> tuple:
        """What decides the launch: the options, programs per SM, stages, column-sum constants."""
        options = _norm._backward_options(self.n, self.d, self.x.element_size())
        return (tuple(sorted(options.items())), _norm.PROGRAMS_PER_SM, _norm.BACKWARD_STAGES, _norm.SUM_TILE,
                _norm.SUM_MAX_BLOCK_P, _norm.SUM_WARPS)


def norm_section(budget: float) -> None:
    header("norm backward (dx, dweight[, dbias]); bytes 3NDs")
    cases: dict = {}  # every shape's tensors stay alive: the jobs come back to them
    seen: dict = {}
    shapes = [(op, *shape) for op in ("layer_norm", "rms_norm") for shape in NORM_SHAPES]
    for (op, n, d, dtype), (name, constants) in jobs(shapes, NORM_VARIANTS):
        shape = f"{n}x{d}"
        if over_budget(budget):
            print(f"{op:14s} {shape:12s} {str(dtype)[6:]:8s} {name:22s} SKIPPED (budget)", flush=True)
            continue
        restore = patched(_norm, constants)
        try:
            if (op, n, d, dtype) not in cases:
                cases[(op, n, d, dtype)] = NormCase(op, n, d, dtype)
            case = cases[(op, n, d, dtype)]
            key = (op, n, d, dtype, case.key())
            if key in seen:
                print(f"{op:14s} {shape:12s} {str(dtype)[6:]:8s} {name:22s} same launch as {seen[key]}", flush=True)
                continue
            seen[key] = name
            got = case.run()
            checks = [verdict(g, a, w, o, dtype) for g, a, w, o in zip(("dx", "dw", "db"), got, case.want, case.own)]
            del got
            row(op, shape, dtype, name, bench_ms(case.run), graph_ms(case.run), 3 * n * d * case.x.element_size(),
                copy_gbs(n, d, dtype), case.eager_ms, checks)
        except Exception as e:  # noqa: BLE001 - one failing variant must not stop the sweep
            error_line(op, shape, dtype, name, e)
        finally:
            restore()
    cases.clear()
    free()


def error_line(section, shape, dtype, name, e) -> None:
    global failures
    failures += 1
    print(f"{section:14s} {shape:12s} {str(dtype)[6:]:8s} {name:22s} ERROR {type(e).__name__}: {str(e)[:300]}",
          flush=True)
    traceback.print_exc(limit=2)
    free()


def free() -> None:
    if GPU:
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- column sums

def column_sums(partials, split: bool) -> list:
    """``_column_sums`` of (2, P, D) partials into bfloat16: one launch, or (the old code) one per set."""
    if split:
        return _norm._column_sums(partials[:1], BF16) + _norm._column_sums(partials[1:], BF16)
    return _norm._column_sums(partials, BF16)


def colsum_section(budget: float) -> None:
    header("column sums alone: (2, P, D) float32 partials -> two (D,) bfloat16; graph = GPU time")
    for p, d in SUM_SHAPES:
        partials = torch.randn(2, p, d, device=DEV)
        want = partials.sum(1)
        for name, constants in SUM_VARIANTS:
            shape = f"P{p} D{d}"
            if over_budget(budget):
                print(f"{'column_sum':14s} {shape:12s} {'float32':8s} {name:22s} SKIPPED (budget)", flush=True)
                continue
            restore = patched(_norm, constants)
            try:
                fn = functools.partial(column_sums, partials, name.startswith("old-like"))
                checks = [verdict(f"sum{i}", out, want[i], None, BF16) for i, out in enumerate(fn())]
                gms = graph_ms(fn)
                row("column_sum", shape, F32, name, gms if gms is not None else bench_ms(fn), gms,
                    2 * p * d * 4, 0.0, None, checks)
            except Exception as e:  # noqa: BLE001
                error_line("column_sum", shape, F32, name, e)
            finally:
                restore()


# ----------------------------------------------------------------------------- cross entropy

class CECase:
    """One (N, V, dtype): logits, all-valid targets (timed) and targets with ignored rows (checked)."""

    def __init__(self, n: int, v: int, dtype):
        self.n, self.v, self.dtype = n, v, dtype
        self.x = torch.randn(n, v, device=DEV).to(dtype)
        self.t = torch.randint(0, v, (n,), device=DEV)
        self.t_check = self.t.clone()
        self.t_check[::7] = -100
        xf = self.x.float()
        self.want_none = F.cross_entropy(xf, self.t_check, reduction="none")
        self.want_mean = F.cross_entropy(xf, self.t_check)
        self.want_lse = torch.logsumexp(xf, 1)
        del xf
        self.own_none = F.cross_entropy(self.x, self.t_check, reduction="none")
        leaf = self.x.detach().requires_grad_()
        self.eager_ms = bench_ms(lambda: F.cross_entropy(leaf, self.t))

    def run(self):
        return ce.cross_entropy(self.x, self.t, -100, "mean")[0]

    def checks(self) -> list:
        loss, (_, _, lse) = ce.cross_entropy(self.x, self.t_check, -100, "none")
        kept = self.t_check != -100
        out = [verdict("none", loss, self.want_none, self.own_none, self.dtype),
               verdict("lse", lse[kept], self.want_lse[kept], None, F32),
               verdict("mean", ce.cross_entropy(self.x, self.t_check, -100, "mean")[0], self.want_mean, None,
                       self.dtype)]
        bad_target = self.t_check.clone()
        bad_target[1] = self.v  # out of range: NaN on that row, the others unchanged
        loss2 = ce.cross_entropy(self.x, bad_target, -100, "none")[0]
        nan_ok = bool(loss2[1].isnan()) and torch.equal(loss2[2:], loss[2:]) and torch.equal(loss2[:1], loss[:1])
        return out + [(nan_ok, "out-of-range NaN " + ("ok" if nan_ok else "WRONG"))]

    def key(self) -> tuple:
        options = ce._forward_options(self.n, self.v)
        one_pass = options["ONE_PASS"]
        return (tuple(sorted(options.items())), ce.EARLY_LOAD if one_pass else None,
                None if one_pass else ce.PREFETCH, ce.SUM_BLOCK, ce.SUM_WARPS, ce.CHUNK)

    def backward_row(self) -> None:
        """The backward (unchanged but for n_valid's reduction) at the committed constants."""
        loss, cache = ce.cross_entropy(self.x, self.t, -100, "mean")
        dout = torch.ones((), dtype=self.dtype, device=DEV)
        fn = lambda: ce.cross_entropy_backward(dout, cache, (True, False), -100, "mean")[0]  # noqa: E731
        grads = []
        for dtype in (F32, self.dtype):
            leaf = self.x.detach().to(dtype).requires_grad_()
            y = F.cross_entropy(leaf, self.t)
            grads.append(torch.autograd.grad(y, leaf, retain_graph=True)[0])
        eager = bench_ms(lambda: torch.autograd.grad(y, leaf, retain_graph=True))
        checks = [verdict("dlogits", fn(), grads[0], grads[1], self.dtype)]
        del grads
        row("ce backward", f"{self.n}x{self.v}", self.dtype, "default", bench_ms(fn), graph_ms(fn),
            2 * self.n * self.v * self.x.element_size(), copy_gbs(self.n, self.v, self.dtype), eager, checks)


def ce_section(budget: float) -> None:
    header("cross_entropy forward (mean); bytes NV s; then the backward at the committed constants")
    cases: dict = {}  # every shape's tensors stay alive: the jobs come back to them
    seen: dict = {}
    for (n, v, dtype), (name, constants) in jobs(CE_SHAPES, CE_VARIANTS):
        shape = f"{n}x{v}"
        if over_budget(budget):
            print(f"{'cross_entropy':14s} {shape:12s} {str(dtype)[6:]:8s} {name:22s} SKIPPED (budget)", flush=True)
            continue
        restore = patched(ce, constants)
        try:
            if (n, v, dtype) not in cases:
                cases[(n, v, dtype)] = CECase(n, v, dtype)
            case = cases[(n, v, dtype)]
            key = (n, v, dtype, case.key())
            if key in seen:
                print(f"{'cross_entropy':14s} {shape:12s} {str(dtype)[6:]:8s} {name:22s} same launch as {seen[key]}",
                      flush=True)
                continue
            seen[key] = name
            row("cross_entropy", shape, dtype, name, bench_ms(case.run), graph_ms(case.run),
                n * v * case.x.element_size(), copy_gbs(n, v, dtype), case.eager_ms, case.checks())
            if name == "default":
                case.backward_row()
        except Exception as e:  # noqa: BLE001
            error_line("cross_entropy", shape, dtype, name, e)
        finally:
            restore()


# ----------------------------------------------------------------------------- summary

def summary() -> None:
    print("\n== summary: per shape, every variant's ms (do_bench) and graph ms, fastest first", flush=True)
    groups: dict = {}
    for r in results:
        groups.setdefault((r["section"], r["shape"], r["dtype"]), []).append(r)
    for (section, shape, dtype), rs in groups.items():
        base = next((r for r in rs if r["variant"] == "default"), rs[0])
        ranked = sorted(rs, key=lambda r: r["graph"] if r["graph"] is not None else r["ms"])
        cells = ", ".join(f"{r['variant']} {r['ms']:.4f}/{'-' if r['graph'] is None else format(r['graph'], '.4f')}"
                          f"{'' if r['ok'] else ' FAIL'}" for r in ranked)
        print(f"{section} {shape} {str(dtype)[6:]} (default {base['ms']:.4f} ms): {cells}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["norm", "colsum", "ce"], help="run one section")
    parser.add_argument("--budget", type=float, default=200.0, help="seconds; later jobs are skipped past it")
    parser.add_argument("--smoke", action="store_true", help="(implied without a GPU) tiny sizes on the CPU")
    args = parser.parse_args()
    torch.manual_seed(0)
    import triton
    name = torch.cuda.get_device_name() if GPU else "CPU (Triton interpreter)"
    sms = torch.cuda.get_device_properties(0).multi_processor_count if GPU else 1
    print(f"device: {name}, {sms} SMs; torch {torch.__version__}, triton {triton.__version__}", flush=True)
    if GPU:
        print(f"copy_ of 1 GiB float32: {copy_gbs(1 << 14, 1 << 14, F32):.0f} GB/s", flush=True)
    sections = {"norm": norm_section, "ce": ce_section, "colsum": colsum_section}
    shares = {"norm": 0.5, "ce": 0.9, "colsum": 1.0}  # cumulative budget shares, in this order
    for key, section in sections.items():
        if args.only in (None, key):
            section(args.budget * (1.0 if args.only else shares[key]))
    summary()
    print(f"\n{failures} failed or errored; {time.perf_counter() - START:.0f} s", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
