"""Experiment (issue 3): the triton attention backward in one pass on Hopper (``attention_dkdv_kernel``
with TMA=True, ATOMIC_DQ=True: q and dO tiles moved by TMA, dQ = c dS k added into a float32
accumulator by TMA atomic adds, 5 products) against the deterministic two kernels (dQ, then dK/dV:
7 products) and SDPA's backward, in one run. bfloat16, 16 heads, B T = 16384, do_bench medians,
TFLOP/s and SDPA's time / ours.

    python benchmarks/experiments/triton_attention_bwd_atomic.py OUT.json              # D = 128 sweep
    python benchmarks/experiments/triton_attention_bwd_atomic.py OUT.json --d 64

First a check: every config of the sweep, pinned, on small odd cases (tails, grouped-query heads,
Tq != Tk, a (B, T, H, D) view, float16 and bfloat16), its dq, dk, dv against the two-kernel
backward's: the largest difference relative to the largest gradient. Then per (T, causal): SDPA,
the two kernels (their autotuners), the one-pass kernel with each config pinned (including the
delta kernel, the accumulator's zeroing and the cast to dq, as ``attention_backward`` runs them).
(An earlier try, ``triton_attention_atomic_dq.py``, added dQ with per-element atomics from the
registers: no faster than the two kernels.)
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from kcourse.blas.triton import attention as A

SWEEP = {128: [(64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 8, 2), (32, 128, 8, 3), (64, 64, 4, 3)],
         64: [(64, 128, 8, 2), (64, 128, 8, 3), (64, 128, 4, 2), (64, 64, 4, 3), (128, 128, 8, 2), (128, 64, 8, 2),
              (64, 64, 4, 2)]}
KERNEL = A.attention_dkdv_kernel
OWN = list(KERNEL.configs)


def pin(size):
    KERNEL.configs = A._configs([size], A._tma_block_shapes) if size else OWN
    KERNEL.cache.clear()


def call(fn, atomic, tma_dkdv=False):
    A.USE_ATOMIC_DQ, A.TMA_DKDV = atomic, tma_dkdv
    try:
        return fn()
    finally:
        A.USE_ATOMIC_DQ, A.TMA_DKDV = False, False


def reference(q, k, v, dout, causal, scale):
    """(dq, dk, dv) of softmax(scale q k^T) v written out in float32 on upcast inputs."""
    inputs = [t.detach().float().requires_grad_() for t in (q, k, v)]
    group = q.shape[1] // k.shape[1]
    s = scale * inputs[0] @ inputs[1].repeat_interleave(group, 1).mT
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    out = torch.softmax(s, -1) @ inputs[2].repeat_interleave(group, 1)
    return torch.autograd.grad(out, inputs, dout.float())


def errors(got, ref):
    """|got - ref| at its largest for dq, dk, dv, each relative to the largest |ref| (at least 1e-3)."""
    return [round(((a.float() - b).abs().max() / b.abs().max().clamp_min(1e-3)).item(), 5) for a, b in zip(got, ref)]


def check(D, sizes):
    """Per config: the largest error of the one-pass backward over small odd cases; "two kernels": theirs."""
    cases = [(2, 4, 4, 257, 257, torch.bfloat16, True, False), (2, 4, 2, 300, 300, torch.float16, False, True),
             (1, 4, 1, 100, 333, torch.bfloat16, True, False), (1, 4, 2, 333, 100, torch.bfloat16, True, True),
             (1, 2, 2, 1, 1, torch.bfloat16, True, False)]
    worst = {}
    for B, H, Hkv, Tq, Tk, dt, causal, bthd in cases:
        torch.manual_seed(0)
        if bthd:
            q = torch.randn(B, Tq, H, D, device="cuda", dtype=dt).transpose(1, 2)
            k, v = (torch.randn(B, Tk, Hkv, D, device="cuda", dtype=dt).transpose(1, 2) for _ in range(2))
        else:
            q = torch.randn(B, H, Tq, D, device="cuda", dtype=dt)
            k, v = (torch.randn(B, Hkv, Tk, D, device="cuda", dtype=dt) for _ in range(2))
        dout = torch.randn(B, H, Tq, D, device="cuda", dtype=dt)
        scale = 1 / math.sqrt(D)
        ref = reference(q, k, v, dout, causal, scale)
        out, cache = A.attention(q, k, v, causal, scale)
        for size in ["two kernels", "two kernels, TMA dK dV", *sizes]:
            name = str(size)
            pin(size if isinstance(size, tuple) else None)
            try:
                per = errors(call(lambda: A.attention_backward(dout, cache, (True,) * 3, causal, scale),
                                  isinstance(size, tuple), size == "two kernels, TMA dK dV"), ref)
                print(f"  {name} B={B} H={H} Hkv={Hkv} Tq={Tq} Tk={Tk} {dt} causal={causal} bthd={bthd}: "
                      f"dq, dk, dv {per}", flush=True)
                err = max(per)
            except Exception as e:  # noqa: BLE001 (a config that does not fit: report it)
                err = f"raised {type(e).__name__}: {str(e)[:120]}"
            previous = worst.get(name, 0.0)
            worst[name] = err if isinstance(err, str) or isinstance(previous, str) else max(err, previous)
    pin(None)
    return worst


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--T", default="1024,2048,4096,8192,16384")
    parser.add_argument("--sizes", default=None, help="the configs to try, e.g. '64,128,8,3;64,64,4,3'")
    args = parser.parse_args()
    H, TOKENS, dt, D = 16, 16384, torch.bfloat16, args.d
    sizes = [tuple(map(int, c.split(","))) for c in args.sizes.split(";")] if args.sizes else SWEEP[D]
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d"), "dtype": "bfloat16", "H": H, "tokens": TOKENS, "D": D}
    print(json.dumps(meta), flush=True)
    start = time.time()
    worst = check(D, sizes)
    print("check (max |ours - float32 reference| / max |reference|):", json.dumps(worst), flush=True)
    rows = []
    for T in [int(t) for t in args.T.split(",") if t]:
        for causal in (False, True):
            B = TOKENS // T
            torch.manual_seed(0)
            q, k, v, dout = (torch.randn(B, H, T, D, device="cuda", dtype=dt) for _ in range(4))
            scale = 1 / math.sqrt(D)
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, scale=scale)
            out, cache = A.attention(q, k, v, causal, scale)
            run = lambda: A.attention_backward(dout, cache, (True,) * 3, causal, scale)  # noqa: E731
            fns = {"sdpa": lambda: torch.autograd.grad(o, (qq, kk, vv), dout, retain_graph=True),
                   "two kernels": lambda: call(run, False),
                   "two kernels, TMA dK dV": lambda: call(run, False, True)}
            fns.update({str(size): (size, lambda: call(run, True)) for size in sizes})
            flops = 2.5 * 4 * B * H * T * T * D * (0.5 if causal else 1.0)
            row = {"D": D, "T": T, "causal": causal}
            for name, fn in fns.items():
                size = None
                if isinstance(fn, tuple):
                    size, fn = fn
                pin(size)
                try:
                    ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
                    row[name] = [round(ms, 4), round(flops / ms / 1e9, 1)]
                except Exception as e:  # noqa: BLE001
                    row[name] = f"raised {type(e).__name__}"
            pin(None)
            timed = {n: r for n, r in row.items() if isinstance(r, list)}
            best = max((n for n in timed if n.startswith("(")), key=lambda n: timed[n][1], default=None)
            row["best"] = best
            rows.append(row)
            print(f"D={D} T={T} causal={causal}: sdpa {timed['sdpa'][1]} TF/s | "
                  + "  ".join(f"{n}: {timed['sdpa'][0] / r[0]:.2f}" for n, r in timed.items())
                  + f" | best {best} ({time.time() - start:.0f} s)", flush=True)
    json.dump({"meta": meta, "check": worst, "rows": rows}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
