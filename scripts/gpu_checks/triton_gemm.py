"""GPU check and benchmark of the triton gemm: the pointer kernel (gemm.py) and the Hopper kernel (_gemm_tma.py).

    PYTHONPATH=. python scripts/gpu_checks/triton_gemm.py            # H100/H200: ~4 minutes, 5 at most
    PYTHONPATH=. python scripts/gpu_checks/triton_gemm.py --no-ws    # without the warp-specialization probe
    PYTHONPATH=. python scripts/gpu_checks/triton_gemm.py --dry-run  # no GPU: the script's own logic,
                                                                     # interpreter, tiny shapes, float16

Sections, each in processes of its own (a kernel that kills its CUDA context takes only its section down):
  warm   in parallel processes: every kernel the later sections run (dtype x path x config, each
         with every layout / C / split it meets) is compiled, run on the bench shapes (TMA configs
         also on edge cases: tails, batched with a shared B, a padded out, in place, a transposed
         C) and compared with a float32 torch.matmul: one PASS/FAIL line per kernel with the worst
         err / tol (tol = 2 u |ref| + 8 sqrt(k) 2^-24 max|ref|, u the output's unit roundoff; out
         starts as NaN, a padded out's padding must stay 7) and the max relative error
         max|out - ref| / max|ref|. It fills Triton's disk cache, so the rest compiles nothing.
  bench  one process, alone on the GPU: float32 (pointer kernel) against float64 first; then per
         dtype and case the median time (CUDA graph of back-to-back calls, triton.testing.
         do_bench_cudagraph) of torch.matmul / torch.addmm (the ceiling), the pointer kernel and
         the TMA kernel, both autotuned, and the TMA kernel without split K where it splits;
         TFLOP/s, fraction of torch, the TMA result's max rel. difference from torch's, the tuned
         configs; then the training shapes' total, and host microseconds per call at one small shape.
  sweep  bfloat16: every TMA config (CONFIGS, then EXTRA) alone at the key shapes, as a fraction of
         torch: edit _gemm_tma.CONFIGS from it (the autotuner picks among them per shape).
  ws     last: warp_specialize=True (Triton documents it for Blackwell; sm_90 has a pass for it in
         3.6): correctness and time at three shapes, a probe only.
The last line counts the FAIL lines. Shapes: 4096^3 (nn, nt, tn) and 8192^3 (nn), and GPT training
with 8192 tokens, n_embd 512, MLP 2048, vocab 50304: forward x W^T + b ("nt", a bias row), dX = dY W
("nn"), dW = dY^T X ("tn", (out, in) as W is stored; k = 8192: split K where the output has few tiles).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import subprocess
import sys
import threading
import time
from typing import NamedTuple

skips = 0  # SKIP lines: kernels not checked for lack of time
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECTIONS = ("warm", "bench", "sweep", "ws")
TIME_REP_MS = 15  # each timing: 10 replays of a CUDA graph of ~15 ms of calls, the median


class Case(NamedTuple):
    name: str
    m: int
    k: int
    n: int
    layout: str  # A then B: n row-major, t a transposed view
    c: str | None = None  # None (beta 0), "bias" (a row, beta 1), "full" (transposed, beta -0.5), "inplace" (out is C)
    batch: int = 0  # > 0: A (batch, m, k), B one (k, n) matrix shared by the batch (stride 0)
    pad: bool = False  # out a column slice of a wider buffer


SQUARE = [Case("4096^3", 4096, 4096, 4096, lay) for lay in ("nn", "nt", "tn")]
SQUARE.append(Case("8192^3", 8192, 8192, 8192, "nn"))
TRAIN = [  # M = B*T = 8192 tokens, n_embd 512, MLP hidden 2048, vocab 50304
    Case("fwd qkv", 8192, 512, 1536, "nt", "bias"), Case("fwd attn-proj", 8192, 512, 512, "nt", "bias"),
    Case("fwd fc", 8192, 512, 2048, "nt", "bias"), Case("fwd mlp-proj", 8192, 2048, 512, "nt", "bias"),
    Case("fwd lm-head", 8192, 512, 50304, "nt"),
    Case("dX qkv", 8192, 1536, 512, "nn"), Case("dX attn-proj", 8192, 512, 512, "nn"),
    Case("dX fc", 8192, 2048, 512, "nn"), Case("dX mlp-proj", 8192, 512, 2048, "nn"),
    Case("dX lm-head", 8192, 50304, 512, "nn"),
    Case("dW qkv", 1536, 8192, 512, "tn"), Case("dW attn-proj", 512, 8192, 512, "tn"),
    Case("dW fc", 2048, 8192, 512, "tn"), Case("dW mlp-proj", 512, 8192, 2048, "tn"),
    Case("dW lm-head", 50304, 8192, 512, "tn"),
]
EDGE = [  # the TMA kernel's edges, run by every TMA config in warm
    Case("tails tt full C", 1000, 1000, 1000, "tt", "full"), Case("tails nn pad", 1000, 264, 200, "nn", None, pad=True),
    Case("batch 4 nn shared B bias", 1000, 512, 1032, "nn", "bias", batch=4),
    Case("batch 3 tt in place", 264, 136, 200, "tt", "inplace", batch=3),
    Case("in place nt", 512, 256, 512, "nt", "inplace"),
    Case("split tn full C", 256, 4096, 192, "tn", "full"), Case("split nn tails", 200, 3000, 72, "nn", "bias"),
]
SWEEP = [SQUARE[0], SQUARE[3], TRAIN[0], TRAIN[4], TRAIN[9], TRAIN[11], TRAIN[12]]
EXTRA = [(128, 256, 64, 8, 3, False), (256, 128, 64, 8, 4), (64, 256, 64, 4, 4), (128, 128, 64, 4, 4),
         (128, 128, 64, 8, 3), (128, 256, 128, 8, 2)]  # sweep-only TMA configs (config() arguments)
WS = [(128, 256, 64, 8, 3, True, True), (128, 128, 64, 8, 4, True, True), (128, 256, 64, 4, 3, True, True)]


# ----------------------------------------------------------------------------- the parent: sections in processes

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=float, default=290, help="seconds for the whole run")
    p.add_argument("--no-ws", action="store_true", help="skip the warp-specialization probe")
    p.add_argument("--dry-run", action="store_true", help="no GPU: interpreter, tiny shapes, float16")
    p.add_argument("--section", choices=SECTIONS, help=argparse.SUPPRESS)
    p.add_argument("--part", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--parts", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=math.inf, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.section:
        return child(args)
    start = time.time()
    deadline = start + args.budget
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if args.dry_run:
        env["TRITON_INTERPRET"] = "1"
    base = [sys.executable, os.path.abspath(__file__)] + (["--dry-run"] if args.dry_run else [])
    fails = 0
    parts = 1 if args.dry_run else max(1, min(14, (os.cpu_count() or 4) - 2))
    # warm: parts processes side by side, each output printed whole when it ends; at most 45% of the budget
    warm_end = min(deadline, start + 0.45 * args.budget)
    print(f"== warm: {parts} processes (compile + check every kernel)", flush=True)
    procs = [subprocess.Popen(base + ["--section", "warm", "--part", str(i), "--parts", str(parts),
                                      "--deadline", str(warm_end - 5)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(parts)]
    for i, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=max(1.0, warm_end - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            out += f"FAIL  warm part {i}: killed at the time limit\n"
        fails += report(out, proc.returncode, f"warm part {i}")
    shares = {"bench": 0.75, "sweep": 0.6, "ws": 1.0}  # of the time left when the section starts
    for section in ("bench", "sweep") + (() if args.no_ws or args.dry_run else ("ws",)):
        left = deadline - time.time()
        if left < 10:
            print(f"== {section}: skipped, out of time")
            continue
        limit = left * shares[section]
        print(f"== {section} ({limit:.0f} s at most)", flush=True)
        out, rc = streamed(base + ["--section", section, "--deadline", str(time.time() + limit - 10)], env, limit)
        fails += report(out, rc, section, echo=False)
    print(f"\n{fails} FAIL line(s), {skips} SKIP line(s); {time.time() - start:.0f} s in all")
    sys.exit(1 if fails else 0)


def streamed(cmd, env, limit):
    """Run cmd, printing its output as it comes (a hang still shows how far it got); kill it after limit s."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []

    def pump():
        for line in proc.stdout:
            print(line, end="", flush=True)
            lines.append(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
        lines.append("FAIL  killed at the time limit\n")
        print(lines[-1], end="", flush=True)
    reader.join(timeout=5)
    return "".join(lines), rc


def report(out: str, rc, name: str, echo: bool = True) -> int:
    """Print a section's output (unless it was streamed) and count its FAIL lines (+1 if it crashed)."""
    global skips
    skips += sum(line.startswith("SKIP") for line in out.splitlines())
    if echo:
        print(out, end="" if out.endswith("\n") else "\n", flush=True)
    fails = sum(line.startswith("FAIL") for line in out.splitlines())
    if rc not in (0, None):
        print(f"FAIL  {name}: exited with status {rc}")
        fails += 1
    return fails


# ----------------------------------------------------------------------------- the children

def child(args):
    global torch, triton, G, T, DEV, DRY
    os.chdir(ROOT)
    sys.path.insert(0, ROOT)
    import torch
    import triton
    import triton.testing
    from kcourse.blas.triton import _gemm_tma as T, gemm as G

    DRY, DEV = args.dry_run, "cpu" if args.dry_run else "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(args.part)
    # the autotuners time each config for 5 + 25 ms instead of 25 + 100 (the bench tunes ~40 keys)
    G.gemm_kernel._do_bench = lambda fn, quantiles: triton.testing.do_bench(fn, warmup=5, rep=25, quantiles=quantiles)
    T.TUNE_WARMUP_MS, T.TUNE_REP_MS = 5, 25
    if args.section == "warm" and args.part == 0:
        dev = "cpu (dry run)" if DRY else f"{torch.cuda.get_device_name()}, {T.num_sms(torch.device('cuda'))} SMs"
        print(f"{dev}; torch {torch.__version__}, triton {triton.__version__}")
    {"warm": warm, "bench": bench, "sweep": sweep, "ws": ws}[args.section](args)


POINTER_FN = None  # the pointer kernel's heuristics-wrapped jit function (set on first use)


def pointer_kernel(cfg):
    global POINTER_FN
    POINTER_FN = POINTER_FN or G.gemm_kernel.fn
    return triton.autotune(configs=[cfg], key=["M", "N", "K", "PRECISION"])(POINTER_FN)


@contextlib.contextmanager
def forced(path, cfg=None, split=True):
    """gemm() down one path: "pointer" (the TMA plan refused) or "tma"; cfg: that config alone
    instead of tuning; split=False: no split K."""
    saved = G.tma_plan, G.gemm_kernel, T.tuned, T.MAX_SPLITS
    try:
        if path == "pointer":
            G.tma_plan = lambda A, B, out: None
            if cfg is not None:
                G.gemm_kernel = pointer_kernel(cfg)
        else:
            if DRY:  # the interpreter: skip the device check, as tests/test_gemm.py does
                G.tma_plan = T.tma_layouts
            if cfg is not None:
                T.tuned = T.autotuned([cfg])
            if not split:
                T.MAX_SPLITS = 1
        yield
    finally:
        G.tma_plan, G.gemm_kernel, T.tuned, T.MAX_SPLITS = saved


def dims(case):
    if not DRY:
        return case.m, case.k, case.n
    # tiny: m, n / 64 and k / 8, multiples of 8 (>= 16); the split cases still split (3 "SMs")
    return tuple(max(16, x // d // 8 * 8) for x, d in ((case.m, 64), (case.k, 8), (case.n, 64)))


def build(case, dtype):
    """(A, B, C, alpha, beta, out, padded buffer or None) for gemm(), C expanded to out's shape."""
    m, k, n = dims(case)
    lead = (case.batch,) if case.batch else ()
    rnd = lambda *s: torch.randn(*s, dtype=dtype, device=DEV)
    A = rnd(*lead, m, k) if case.layout[0] == "n" else rnd(*lead, k, m).mT
    B = rnd(k, n) if case.layout[1] == "n" else rnd(n, k).mT
    B = B.expand(*lead, k, n)
    buf = None
    if case.pad:
        buf = torch.full((*lead, m, n + 8), 7.0, dtype=dtype, device=DEV)
        out = buf[..., :n]
    else:
        out = torch.empty(*lead, m, n, dtype=dtype, device=DEV)
    C, alpha, beta = None, 1.0, 0.0
    if case.c == "bias":
        C, beta = rnd(n).expand(*lead, m, n), 1.0
    elif case.c == "full":
        C, alpha, beta = rnd(*lead, n, m).mT, 1.5, -0.5
    elif case.c == "inplace":
        out.copy_(rnd(*lead, m, n))
        C, alpha, beta = out, 0.5, 0.5
    return A, B, C, alpha, beta, out, buf


def splits(case):
    m, k, n = dims(case)
    return T.split_k(case.batch or 1, m, n, k, T.num_sms(torch.device(DEV)))[0]


def verdict(out, A, B, C0, alpha, beta, buf):
    """(ok, worst err/tol, max rel err) against a float32 torch.matmul (C0: C before the call), in
    chunks of rows of at most 2^24 elements (warm runs a dozen processes side by side)."""
    u = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}[out.dtype]
    o3, A3, B3 = (t if t.dim() == 3 else t[None] for t in (out, A, B))
    C3 = None if C0 is None else (C0 if C0.dim() == 3 else C0[None])
    step, k = max(1, 2**24 // o3.shape[-1]), A.shape[-1]
    worst = err_max = big = 0.0
    finite = True
    for b in range(o3.shape[0]):
        Bf = B3[b].float()
        for r in range(0, o3.shape[1], step):
            ref = alpha * (A3[b, r:r + step].float() @ Bf)
            if C3 is not None:
                ref += beta * C3[b, r:r + step]
            o = o3[b, r:r + step].float()
            finite &= bool(torch.isfinite(o).all())
            err = (o - ref).abs_()
            chunk_big = ref.abs().max().item()
            tol = ref.abs_().mul_(2 * u).add_(8 * math.sqrt(k) * 2.0**-24 * chunk_big + 1e-30)
            worst = max(worst, err.div(tol).nan_to_num_(math.inf).max().item())
            err_max, big = max(err_max, err.max().item()), max(big, chunk_big)
    ok = worst <= 1.0 and finite
    if buf is not None:
        ok &= bool((buf[..., out.shape[-1]:] == 7).all())  # the padding after each row untouched
    return ok, worst, err_max / max(big, 1e-30)


def takes_tma(A, B, out):
    """Does gemm() send this product to the TMA kernel (its dispatcher's own test)?"""
    return G.tma_plan(*(t if t.dim() == 3 else t[None] for t in (A, B, out))) is not None


def run_checked(case, dtype, path, cfg, split):
    A, B, C, alpha, beta, out, buf = build(case, dtype)
    C0 = None if C is None else C.float().clone()
    if case.c != "inplace":
        out.fill_(math.nan)
    with forced(path, cfg, split):
        if path == "tma" and not takes_tma(A, B, out):
            return False, math.inf, math.inf, "not taken by the TMA kernel"
        G.gemm(A, B, C, alpha, beta, out)
    if not DRY:
        torch.cuda.synchronize()
    return (*verdict(out, A, B, C0, alpha, beta, buf), "")


def failure(e: Exception) -> str:
    """An exception in one line."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300] if text else ''}"


def cfg_name(c):
    kw = c.kwargs
    return (f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} w{c.num_warps} s{c.num_stages}"
            + (" sub" if kw.get("SUBTILE") else "") + (" ws" if kw.get("WARP_SPECIALIZE") else ""))


def dtypes():
    return [("fp16", torch.float16)] if DRY else [("bf16", torch.bfloat16), ("fp16", torch.float16)]


def warm_groups():
    """(dtype name, dtype, path, config, cases): every kernel the later sections run."""
    groups = []
    for dn, dt in dtypes():
        groups += [(dn, dt, "tma", c, SQUARE + TRAIN + EDGE) for c in T.CONFIGS]
        groups += [(dn, dt, "pointer", c, SQUARE + TRAIN) for c in G.CONFIGS]
    groups += [("bf16", torch.bfloat16, "tma", T.config(*e), SWEEP) for e in EXTRA if not DRY]
    return groups


def my_groups(part, parts):
    """This process's share of warm_groups(), balanced by the number of compiles (longest first,
    each to the least loaded process; every process computes the same split)."""
    groups = warm_groups()
    cost = lambda g: len({(c.layout, c.c, c.batch, c.pad, splits(c) > 1) for c in g[4]})  # ~ kernels compiled
    loads, mine = [0] * parts, []
    for g in sorted(groups, key=cost, reverse=True):
        least = loads.index(min(loads))
        loads[least] += cost(g)
        if least == part:
            mine.append(g)
    return mine


def warm(args):
    for dn, dt, path, cfg, cases in my_groups(args.part, args.parts):
        label = f"{dn} {path:<7} {cfg_name(cfg):<24}"
        if time.time() > args.deadline:
            print(f"SKIP  {label} out of time", flush=True)
            continue
        t0, worst, rel, runs, bad, notes = time.time(), 0.0, 0.0, 0, [], []
        todo = [(c, split) for c in cases for split in ((True, False) if path == "tma" and splits(c) > 1 else (True,))]
        for case, split in todo:
            if time.time() > args.deadline:
                notes.append("out of time: the rest not run")
                break
            try:
                ok, w, r, why = run_checked(case, dt, path, cfg, split)
            except triton.runtime.errors.OutOfResources as e:  # the autotuner skips it too
                notes.append(f"{case.name}: does not fit ({e})")
                continue
            except Exception as e:  # noqa: BLE001 - report it, go on with the next case
                ok, w, r, why = False, math.inf, math.inf, failure(e)
            runs += 1
            worst, rel = max(worst, w), max(rel, r)
            if not ok:
                bad.append(f"{case.name}{'' if split else ' (no split)'}: err/tol {w:.3g} {why}")
        print(f"{'FAIL' if bad else 'PASS'}  {label} {runs} runs, worst err/tol {worst:.3f}, max rel err "
              f"{rel:.2e} ({time.time() - t0:.0f} s)", flush=True)
        for line in bad:
            print(f"FAIL      {line}", flush=True)
        for line in notes:
            print(f"note      {line}", flush=True)


def timed(fn):
    """Median ms of fn (tuned first): a CUDA graph of back-to-back calls; wall clock in a dry run."""
    fn()
    if DRY:
        t0 = time.time()
        fn()
        return (time.time() - t0) * 1e3
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=TIME_REP_MS, return_mode="median")


def torch_fn(A, B, C, out):
    if C is not None and C.stride()[-2] == 0:  # a bias row: cuBLAS's fused epilogue (F.linear)
        return lambda: torch.addmm(C[0], A, B, out=out)
    return lambda: torch.matmul(A, B, out=out)


def flops(case):
    m, k, n = dims(case)
    return 2.0 * m * n * k * (case.batch or 1)


def float32_check():
    m, k, n = (64, 40, 72) if DRY else (1024, 1000, 1032)
    A, B = torch.randn(m, k, device=DEV), torch.randn(k, n, device=DEV).mT.contiguous().mT  # B column-major
    out = torch.empty(m, n, device=DEV)
    G.gemm(A, B, None, 1.0, 0.0, out)
    ref = A.double() @ B.double()
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    plan = T.tma_plan(A[None], B[None], out[None])
    ok = rel < 1e-5 and plan is None
    print(f"{'PASS' if ok else 'FAIL'}  float32 {m}x{k}x{n}, B column-major (pointer kernel, IEEE): rel err {rel:.2e}"
          f"{'' if plan is None else ' (sent to the TMA kernel!)'}", flush=True)


def bench(args):
    float32_check()
    for dn, dt in dtypes():
        print(f"\n{dn}: ms (TFLOP/s, fraction of torch); torch = matmul, addmm with a bias; 'no split' = TMA "
              f"without split K; diff = max|tma - torch| / max|torch|")
        print(f"{'case':<14}{'ly':<4}{'torch':>16}{'pointer':>22}{'tma':>22}{'no split':>10}{'diff':>9}  "
              f"tuned: pointer | tma")
        totals = {"torch": 0.0, "pointer": 0.0, "tma": 0.0}
        for case in SQUARE + TRAIN:
            if time.time() > args.deadline:
                print(f"{case.name:<14} skipped: out of time", flush=True)
                continue
            try:
                row, t = bench_case(case, dt)
                print(row, flush=True)
                if case in TRAIN:
                    for key in totals:
                        totals[key] += t[key]
            except Exception as e:  # noqa: BLE001
                print(f"FAIL  {dn} {case.name}: {failure(e)}", flush=True)
        if totals["torch"]:
            print(f"training shapes, each once: torch {totals['torch']:.3f} ms, pointer {totals['pointer']:.3f} ms "
                  f"({totals['pointer'] / totals['torch']:.2f}x torch), tma {totals['tma']:.3f} ms "
                  f"({totals['tma'] / totals['torch']:.2f}x torch)", flush=True)
    host_overhead()


def bench_case(case, dt):
    A, B, C, alpha, beta, out, _ = build(case, dt)
    f, t = flops(case), {}
    cell = lambda ms: f"{ms:8.3f} ({f / ms / 1e9:4.0f})"
    t["torch"] = timed(torch_fn(A, B, C, out))
    ref = out.clone()
    with forced("pointer"):
        t["pointer"] = timed(lambda: G.gemm(A, B, C, alpha, beta, out))
        ptr_cfg = cfg_name(G.gemm_kernel.best_config)
    with forced("tma"):
        assert takes_tma(A, B, out), "not taken by the TMA kernel"
        t["tma"] = timed(lambda: G.gemm(A, B, C, alpha, beta, out))
        tma_cfg = cfg_name(T.tuned.best_config)
    diff = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    nosplit = ""
    if splits(case) > 1:
        with forced("tma", split=False):
            nosplit = f"{t['torch'] / timed(lambda: G.gemm(A, B, C, alpha, beta, out)):10.2f}"
    frac = lambda key: f"{cell(t[key])} {t['torch'] / t[key]:5.2f}"
    return (f"{case.name:<14}{case.layout:<4}{cell(t['torch']):>16}{frac('pointer'):>22}{frac('tma'):>22}"
            f"{nosplit:>10}{diff:9.1e}  {ptr_cfg} | {tma_cfg}"
            + (f" split {splits(case)}" if splits(case) > 1 else "")), t


def host_overhead():
    """Host microseconds per call at a small shape (the GPU needs ~6 us for it): launch cost."""
    case = TRAIN[6]  # dX attn-proj, 8192 x 512 x 512
    A, B, C, alpha, beta, out, _ = build(case, dtypes()[0][1])
    from kcourse import blas
    runs = {"torch.matmul": torch_fn(A, B, None, out), "pointer": lambda: G.gemm(A, B, None, 1.0, 0.0, out),
            "tma": lambda: G.gemm(A, B, None, 1.0, 0.0, out),
            "blas.gemm (tma)": lambda: blas.gemm(A, B, backend="triton")}
    cells, calls = [], 2 if DRY else 200
    for name, fn in runs.items():
        with forced("pointer" if name == "pointer" else "tma"):
            fn()
            sync = (lambda: None) if DRY else torch.cuda.synchronize
            sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            cells.append(f"{name} {(time.perf_counter() - t0) / calls * 1e6:.1f}")
    print(f"\nwall us per call, {case.name} {dims(case)}, {calls} calls back to back: " + ", ".join(cells), flush=True)


def sweep(args):
    dt = torch.bfloat16 if not DRY else torch.float16
    configs = list(T.CONFIGS) + ([T.config(*e) for e in EXTRA] if not DRY else [])
    print("every TMA config alone, fraction of torch (CONFIGS first, then EXTRA; '-' failed or out of time)")
    print(f"{'config':<26}" + "".join(f"{c.name[:12]:>13}" for c in SWEEP))
    base = {}
    for case in SWEEP:
        A, B, C, alpha, beta, out, _ = build(case, dt)
        base[case] = (A, B, C, alpha, beta, out, timed(torch_fn(A, B, C, out)))
    print(f"{'torch ms':<26}" + "".join(f"{base[c][-1]:13.3f}" for c in SWEEP), flush=True)
    for i, cfg in enumerate(configs):
        cells = []
        for case in SWEEP:
            A, B, C, alpha, beta, out, t_torch = base[case]
            if time.time() > args.deadline:
                cells.append("-")
                continue
            try:
                with forced("tma", cfg):
                    cells.append(f"{t_torch / timed(lambda: G.gemm(A, B, C, alpha, beta, out)):.2f}")
            except Exception as e:  # noqa: BLE001 - a config that does not fit: '-'
                cells.append("-")
                print(f"  ({cfg_name(cfg)} at {case.name}: {failure(e)})")
        tag = "" if i < len(T.CONFIGS) else " *"
        print(f"{cfg_name(cfg) + tag:<26}" + "".join(f"{c:>13}" for c in cells), flush=True)
    print("(* EXTRA: not in CONFIGS)")


def ws(args):
    dt = torch.bfloat16 if not DRY else torch.float16
    for e in WS:
        cfg = T.config(*e)
        for case in (SQUARE[0], SQUARE[3], TRAIN[0]):
            if time.time() > args.deadline:
                print(f"ws {cfg_name(cfg)} {case.name}: out of time")
                continue
            try:
                ok, worst, rel, _ = run_checked(case, dt, "tma", cfg, True)
                A, B, C, alpha, beta, out, _ = build(case, dt)
                t_torch = timed(torch_fn(A, B, C, out))
                with forced("tma", cfg):
                    t = timed(lambda: G.gemm(A, B, C, alpha, beta, out))
                # a probe: a wrong result is reported, not counted (WS is not in CONFIGS)
                print(f"ws {cfg_name(cfg):<26} {case.name:<10} {'correct' if ok else 'WRONG'} (err/tol {worst:.3g}), "
                      f"{t:.3f} ms, {t_torch / t:.2f} of torch", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"ws {cfg_name(cfg):<26} {case.name:<10} failed: {failure(e)}", flush=True)


if __name__ == "__main__":
    main()
