"""Experiment: the triton attention forward with its q, k, v and out tiles moved by TMA
(``attention_fwd_tma_kernel``: host-side ``TensorDescriptor``s over the (B, H, T, D) tensors, boxes
of (1, 1, rows, D)) against the pointer kernel (``attention_fwd_kernel``) and SDPA, in one run.
bfloat16, 16 heads, B T = 16384, do_bench medians, TFLOP/s and SDPA's time / ours.

    python -m benchmarks.experiments.triton_attention_tma OUT.json              # D = 64 and 128, T = 1k..16k
    python -m benchmarks.experiments.triton_attention_tma OUT.json --sweep      # the config sweep, D = 128
    python -m benchmarks.experiments.triton_attention_tma OUT.json --backward   # the backward's kernels
    python -m benchmarks.experiments.triton_attention_tma OUT.json --backward-sweep  # their TMA config sweep

``--backward`` times the backward (from one forward's cache, as autograd runs it) with the dQ and
the dK/dV kernels each reading by pointer or by TMA (``TMA=True``: q, k, v, dO as descriptors):
pointer/pointer, pointer/TMA, TMA/TMA.

``--sweep`` autotunes the TMA kernel over the 28 configs Triton's fused-attention tutorial sweeps on
Hopper (blocks 64/128 x 32/64/128, 2-6 stages, 4/8 warps, no 8 warps below 128 x 128) at T = 1k,
4k, 16k, causal and not, and prints the winner of each: how ``TMA_FWD_SIZES`` was chosen.

``--backward-sweep`` does the same for the two backward kernels reading by TMA (``BWD_SWEEP``: dQ over
64/128 query rows x 32/64/128 keys, dK/dV over 32/64/128 query rows x 64/128 keys, 4/8 warps, 2/3
stages), D = 128 and 64, T = 1k, 4k, 16k, causal and not: every config's time (the autotuner's
do_bench median), the winner, and the whole backward with the winners against the shipped tables.
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
import triton
from benchmarks.timing import bench_ms

from kcourse.blas.triton import attention as A

SWEEP = [(m, n, w, s) for m in (64, 128) for n in (32, 64, 128) for s in (2, 3, 4, 6) for w in (4, 8)
         if not (m * n < 128 * 128 and w == 8)]
BWD_SWEEP = {"dq": [(m, n, w, s) for m in (64, 128) for n in (32, 64, 128) for w in (4, 8) for s in (2, 3)],
             "dkdv": [(m, n, w, s) for m in (32, 64, 128) for n in (64, 128) for w in (4, 8) for s in (2, 3)]}


def run_tma(kernel, q, k, v, causal, scale):
    """The TMA forward of ``attention`` with ``kernel`` (an autotuned attention_fwd_tma_kernel)."""
    B, H, Tq, D = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((B, H, Tq), dtype=torch.float32, device=q.device)
    kernel[lambda meta: (triton.cdiv(Tq, meta["BLOCK_M"]), H, B)](
        *A.tma_descriptors(q, k, v, out), lse, H // k.shape[1], Tq, k.shape[2], scale * A.LOG2E.value,
        CAUSAL=causal, NEG_SCALE=False, **A._meta(q))
    return out, lse


def backward(dout, cache, causal, scale, tma_dq, tma_dkdv, dq_kernel=None, dkdv_kernel=None):
    """``attention_backward`` for all three gradients with each kernel's TMA choice given (and, for the
    sweep, other autotuned versions of the two kernels)."""
    dq_kernel, dkdv_kernel = dq_kernel or A.attention_dq_kernel, dkdv_kernel or A.attention_dkdv_kernel
    q, k, v, out, lse = cache
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    meta, strides = A._meta(q), (*q.stride(), *k.stride(), *v.stride())
    args = (H // Hkv, Tq, Tk, scale * A.LOG2E.value, scale)
    descriptors = A.tma_descriptors(q, k, v, dout)
    dq, delta = torch.empty_like(q), torch.empty_like(lse)
    dk, dv = torch.empty_like(k), torch.empty_like(v)  # k, v contiguous here
    q_, k_, v_, dout_ = descriptors if tma_dq else (q, k, v, dout)
    dq_kernel[A._grid(Tq, B, H, "BLOCK_M")](q_, k_, v_, out, dout_, lse, delta, dq, *strides,
                                                         *out.stride(), *args, CAUSAL=causal, TMA=tma_dq, **meta)
    q_, k_, v_, dout_ = descriptors if tma_dkdv else (q, k, v, dout)
    dkdv_kernel[A._grid(Tk, B, Hkv, "BLOCK_N")](q_, k_, v_, dout_, lse, delta, dk, dv, *strides, *args,
                                                             CAUSAL=causal, TMA=tma_dkdv, **meta)
    return dq, dk, dv


def main_backward(out_path):
    H, TOKENS, dt = 16, 16384, torch.bfloat16
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d"), "dtype": "bfloat16", "H": H, "tokens": TOKENS, "backward": True}
    print(json.dumps(meta), flush=True)
    variants = {"pointer": (False, False), "dkdv tma": (False, True), "tma": (True, True)}
    rows, start = [], time.time()
    for D in (128, 64):
        for T in (1024, 2048, 4096, 8192, 16384):
            for causal in (False, True):
                B = TOKENS // T
                torch.manual_seed(0)
                q, k, v, dout = (torch.randn(B, H, T, D, device="cuda", dtype=dt) for _ in range(4))
                scale = 1 / math.sqrt(D)
                leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                o = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale)
                cache = A.attention(q, k, v, None, causal, scale)[1]
                fns = {"sdpa": lambda: torch.autograd.grad(o, leaves, dout, retain_graph=True)}
                fns.update({name: (lambda t=t: backward(dout, cache, causal, scale, *t)) for name, t in variants.items()})
                expected = fns["pointer"]()
                row = {"D": D, "T": T, "causal": causal}
                flops = 2.5 * 4 * B * H * T * T * D * (0.5 if causal else 1.0)
                for name, fn in fns.items():
                    if name in variants:  # max |ours - pointer| / max |pointer| over dq, dk, dv (tiles may differ)
                        row[f"err {name}"] = max(((a - b).abs().max() / b.abs().max()).item()
                                                 for a, b in zip(fn(), expected))
                    ms = bench_ms(fn, 25, 200)
                    row[name] = [round(ms, 4), round(flops / ms / 1e9, 1)]
                for name in fns:
                    row[name].append(round(row["sdpa"][0] / row[name][0], 3))
                rows.append(row)
                print(json.dumps(row), flush=True)
    with open(out_path, "w") as f:
        json.dump({"meta": meta, "rows": rows, "seconds": round(time.time() - start)}, f, indent=1)


def main_backward_sweep(out_path):
    H, TOKENS, dt = 16, 16384, torch.bfloat16
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d"), "dtype": "bfloat16", "H": H, "tokens": TOKENS, "sweep": BWD_SWEEP}
    print(json.dumps(meta), flush=True)
    key = ["Tq", "Tk", "HEAD_DIM", "CAUSAL", "PRECISION", "TMA"]
    sweep = {name: triton.autotune([triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s,
                                                  pre_hook=A._tma_block_shapes) for m, n, w, s in BWD_SWEEP[name]],
                                   key=key)(kernel.fn)
             for name, kernel in (("dq", A.attention_dq_kernel), ("dkdv", A.attention_dkdv_kernel))}
    rows, start = [], time.time()
    for D in (128, 64):
        for T in (1024, 4096, 16384):
            for causal in (False, True):
                B = TOKENS // T
                torch.manual_seed(0)
                q, k, v, dout = (torch.randn(B, H, T, D, device="cuda", dtype=dt) for _ in range(4))
                scale = 1 / math.sqrt(D)
                cache = A.attention(q, k, v, None, causal, scale)[1]
                fns = {"shipped": lambda: backward(dout, cache, causal, scale, True, True),
                       "swept": lambda: backward(dout, cache, causal, scale, True, True, sweep["dq"], sweep["dkdv"])}
                expected = fns["shipped"]()
                got = fns["swept"]()  # autotunes both kernels
                row = {"D": D, "T": T, "causal": causal,
                       "err swept": max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, expected))}
                for name, kernel in sweep.items():
                    timings = {str(c): round(t[0], 4) for c, t in kernel.configs_timings.items()}
                    row[f"{name} best"] = str(kernel.best_config)
                    row[f"{name} timings"] = dict(sorted(timings.items(), key=lambda kv: kv[1]))
                row[f"shipped configs"] = [str(A.attention_dq_kernel.best_config),
                                           str(A.attention_dkdv_kernel.best_config)]
                flops = 2.5 * 4 * B * H * T * T * D * (0.5 if causal else 1.0)
                ms = {}
                for _ in range(2):  # interleaved rounds, the faster of each
                    for name, fn in fns.items():
                        t = bench_ms(fn)
                        ms[name] = min(ms.get(name, t), t)
                for name, t in ms.items():
                    row[name] = [round(t, 4), round(flops / t / 1e9, 1)]
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if "timings" not in k}), flush=True)
                with open(out_path, "w") as f:
                    json.dump({"meta": meta, "rows": rows, "seconds": round(time.time() - start)}, f, indent=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--backward-sweep", action="store_true")
    args = parser.parse_args()
    if args.backward:
        return main_backward(args.out)
    if args.backward_sweep:
        return main_backward_sweep(args.out)
    H, TOKENS, dt = 16, 16384, torch.bfloat16
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d"), "dtype": "bfloat16", "H": H, "tokens": TOKENS}
    print(json.dumps(meta), flush=True)
    sweep = triton.autotune([triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s,
                                           pre_hook=A._tma_block_shapes) for m, n, w, s in SWEEP],
                            key=["Tq", "Tk", "HEAD_DIM", "CAUSAL"])(A.attention_fwd_tma_kernel.fn)
    rows, start = [], time.time()
    cases = ([(128, T) for T in (1024, 4096, 16384)] if args.sweep
             else [(D, T) for D in (128, 64) for T in (1024, 2048, 4096, 8192, 16384)])
    for D, T in cases:
        for causal in (False, True):
            B = TOKENS // T
            torch.manual_seed(0)
            q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=dt) for _ in range(3))
            scale = 1 / math.sqrt(D)
            ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            def ours(tma):
                A.USE_TMA = tma
                try:
                    return A.attention(q, k, v, None, causal, scale)[0]
                finally:
                    A.USE_TMA = True

            fns = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                   "pointer": lambda: ours(False), "tma": lambda: ours(True)}
            if args.sweep:
                fns["tma sweep"] = lambda: run_tma(sweep, q, k, v, causal, scale)[0]
            row = {"D": D, "T": T, "causal": causal}
            flops = 4 * B * H * T * T * D * (0.5 if causal else 1.0)
            for name, fn in fns.items():
                row[f"err {name}"] = (fn().float() - ref.float()).abs().max().item()
                ms = bench_ms(fn, 25, 200)
                row[name] = [round(ms, 4), round(flops / ms / 1e9, 1)]
            for name in fns:
                row[name].append(round(row["sdpa"][0] / row[name][0], 3))
            row["configs"] = {"pointer": str(A.attention_fwd_kernel.best_config),
                              "tma": str(A.attention_fwd_tma_kernel.best_config)}
            if args.sweep:
                row["configs"]["tma sweep"] = str(sweep.best_config)
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows, "seconds": round(time.time() - start)}, f, indent=1)


if __name__ == "__main__":
    main()
