"""Experiment: each matrix product of a GPT-2 124M training step (batch 16, T = 1024: 16384 tokens,
bf16) on the triton and cute gemms beside cuBLAS (``torch.mm`` on the same operand layouts), and
the triton gemm under each of its configs alone: where the step's gemm time goes.

For each Linear (in -> out) of a block: the forward ``x W^T`` (16384, in) @ (in, out), the input
gradient ``dY W`` (16384, out) @ (out, in) and the weight gradient ``dY^T X`` (out, 16384) @
(16384, in), laid out as ``kcourse.blas._host`` passes them (W row-major, dY^T a transposed view);
then linear_cross_entropy's chunk products at V = 50304 (2048-row chunks: the logits, dx, and dW
added to the running sum, beta = 1). Every call is a CUDA-graph replay timed by
``timing.graph_ms``; TFLOP/s counts 2 m n k.

    source .cute/activate.sh && python -m benchmarks.experiments.gpt_gemms OUT.txt [--configs]
"""
import argparse

import torch

from benchmarks import timing

TOKENS, CHUNK, VOCAB = 16384, 2048, 50304
LINEARS = {"c_attn": (768, 2304), "attn c_proj": (768, 768), "c_fc": (768, 3072), "mlp c_proj": (3072, 768)}


def products(device):
    """name -> (A, B, C or None, beta): the step's products on random operands."""
    r = lambda *s: torch.randn(*s, device=device, dtype=torch.bfloat16)  # noqa: E731
    out = {}
    for name, (d_in, d_out) in LINEARS.items():
        x, w, dy = r(TOKENS, d_in), r(d_out, d_in), r(TOKENS, d_out)
        out[f"{name} fwd"] = (x, w.mT, None, 0.0)
        out[f"{name} dX"] = (dy, w, None, 0.0)
        out[f"{name} dW"] = (dy.mT, x, None, 0.0)
    x, w, dl = r(CHUNK, 768), r(VOCAB, 768), r(CHUNK, VOCAB)
    out["lm head logits"] = (x, w.mT, None, 0.0)
    out["lm head dx"] = (dl, w, None, 0.0)
    out["lm head dW += "] = (dl.mT, x, r(VOCAB, 768), 1.0)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--configs", action="store_true", help="also the triton gemm under each config alone")
    args = p.parse_args()
    from kcourse.blas.cute.gemm import gemm as cute_gemm
    from kcourse.blas.triton import _gemm_tma
    from kcourse.blas.triton.gemm import gemm as triton_gemm

    def call(gemm, A, B, C, beta, out):
        return lambda: gemm(A, B, C, 1.0, beta, out)

    def torch_call(A, B, C, beta, out):
        return (lambda: torch.mm(A, B, out=out)) if C is None else (lambda: torch.addmm(C, A, B, beta=beta, out=out))

    lines = [f"# GPT-2 124M step's gemms, {torch.cuda.get_device_name()}, bf16, ms of a CUDA-graph replay "
             "(TFLOP/s; triton and cute over cuBLAS)"]
    shipped = _gemm_tma.tuned
    totals = {"cuBLAS": 0.0, "triton": 0.0, "cute": 0.0}
    for name, (A, B, C, beta) in products("cuda").items():
        m, k, n = A.shape[0], A.shape[1], B.shape[1]
        flop = 2 * m * n * k
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16) if C is None else C  # (dW += : in place)
        calls = {"cuBLAS": torch_call(A, B, C, beta, out), "triton": call(triton_gemm, A, B, C, beta, out),
                 "cute": call(cute_gemm, A, B, C, beta, out)}
        for f in calls.values():  # autotune, compile
            f()
        torch.cuda.synchronize()
        ms = {impl: timing.graph_ms(f) for impl, f in calls.items()}
        picked = _gemm_tma.tuned.best_config if hasattr(_gemm_tma.tuned, "best_config") else None
        for impl in totals:
            totals[impl] += ms[impl] * (12 if not name.startswith("lm") else 8)
        ratio = {impl: "" if impl == "cuBLAS" else f", {ms['cuBLAS'] / t:.2f}x" for impl, t in ms.items()}
        lines.append(f"{name:16s} ({m} x {k}) @ ({k} x {n}): " + ", ".join(
            f"{impl} {t:.4f} ({flop / t / 1e9:.0f}{ratio[impl]})" for impl, t in ms.items()))
        lines.append(f"    triton's pick: {picked}")
        if args.configs:
            for config in _gemm_tma.CONFIGS + [_gemm_tma.config(128, 256, 64, 8, 3, ws=True),
                                                _gemm_tma.config(128, 128, 64, 8, 4, ws=True),
                                                _gemm_tma.config(256, 128, 64, 8, 4)]:
                _gemm_tma.tuned = _gemm_tma.autotuned([config])
                _gemm_tma.KEPT.clear()
                try:
                    f = call(triton_gemm, A, B, C, beta, out)
                    f()
                    t = timing.graph_ms(f)
                    lines.append(f"    {t:.4f} ms ({ms['cuBLAS'] / t:.2f}x cuBLAS)  {config}")
                except Exception as e:  # noqa: BLE001 - a config that does not build or fit
                    lines.append(f"    failed: {type(e).__name__}: {str(e)[:100]}  {config}")
                finally:
                    _gemm_tma.tuned = shipped
                    _gemm_tma.KEPT.clear()
        print("\n".join(lines[-12:] if args.configs else lines[-2:]), flush=True)
    lines.append("a step (12 blocks, 8 chunks): " + ", ".join(f"{k} {v:.2f} ms" for k, v in totals.items()))
    print(lines[-1])
    open(args.out, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
