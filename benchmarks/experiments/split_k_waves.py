"""The triton gemm's split of K (``_gemm_tma.split_k``: products of at most half as many 128 x 128
tiles as SMs, cut ``SMs // tiles`` ways) against a cost model that also splits products whose
tiles fill the SMs' last wave poorly (``cost_model_rule``: the waves of tiles over the SMs, a fixed
part per wave and the float32 partials' traffic), and the same model counting 128 x 256 tiles with
the kernel held to that tile ("model 128x256": 3072 x 768 over K = 16384 cut 3 ways, 216 tiles),
at the products a training step makes:

  - GPT-2 124M at 16 x 1024 tokens: each Linear's weight gradient dW = dY^T X, (out, tokens) @
    (tokens, in), and a Llama-like 4096-wide layer's;
  - linear_cross_entropy's per-chunk dx = dlogits W, (N / 8, V) @ (V, d), at d = 768 and 4096,
    V = 50304 and 128256, N = 16384;

each beside ``torch.matmul`` on the same operands; then linear_cross_entropy forward + backward
(N = 16384, bf16) whole. Every call is captured in a CUDA graph and its replay timed
(``benchmarks.timing.graph_ms``), the rules interleaved over rounds (``timing.interleaved``).

Measured (H200, 2026-11-29, bf16): the model splits GPT-2's 3072 x 768 dW (144 tiles) and the
d = 768 chunks' dx 4 ways. Those products ran 3-9% faster (c_fc dW 0.154 against 0.159 ms, dx at
V = 128256 0.678 against 0.741), but linear_cross_entropy as a whole did not (8.21 against 8.21
ms at d 768, V 50304; 21.31 against 20.79 at V 128256), so the shipped rule stays. torch.matmul
ran those products in 0.117 and 0.615 ms: the gap to cuBLAS there is the kernel's, not the
split's.

    python -m benchmarks.experiments.split_k_waves OUT.json
"""
from __future__ import annotations

import argparse
import json

import torch

from benchmarks import timing
from kcourse import blas
from kcourse.blas.triton import _gemm_tma

TOKENS = 16384
DW = {  # (out, in) of each Linear's weight: its dW is (out, tokens) @ (tokens, in)
    "gpt2 c_attn": (2304, 768), "gpt2 attn c_proj": (768, 768), "gpt2 c_fc": (3072, 768),
    "gpt2 mlp c_proj": (768, 3072), "llama q": (4096, 4096), "llama up": (11008, 4096),
    "llama down": (4096, 11008),
}
DX = {f"lce dx d{d} V{V}": (TOKENS // 8, V, d) for d in (768, 4096) for V in (50304, 128256)}  # (n, V, d)


PARTIAL_COST = 4e-4  # a float32 partial element written and read (8 B at 3 TB/s), in k of one 128 x 128 tile
WAVE_COST = 256  # a wave's fixed part, in k: the pipeline's fill and the tile's store


def split_cost(S, M, N, K, sms, tile=(128, 128)):
    """The modelled time of the product cut into S ranges of k, in k of one ``tile`` (m x n)."""
    cdiv = _gemm_tma.cdiv
    waves = cdiv(S * cdiv(M, tile[0]) * cdiv(N, tile[1]), sms)
    return waves * (cdiv(K, S) + WAVE_COST) + (S * M * N * PARTIAL_COST * 128 * 128 / (tile[0] * tile[1])
                                               if S > 1 else 0)


def cost_model_rule(batch, M, N, K, sms, tile=(128, 128)):
    """The S (1 to MAX_SPLITS, each range at least SPLIT_MIN_K) of least ``split_cost``."""
    if batch != 1:
        return 1, K
    best = min(range(1, min(_gemm_tma.MAX_SPLITS, K // _gemm_tma.SPLIT_MIN_K) + 1),
               key=lambda S: split_cost(S, M, N, K, sms, tile), default=1)
    if best < 2:
        return 1, K
    k_split = _gemm_tma.cdiv(_gemm_tma.cdiv(K, best), _gemm_tma.SPLIT_ALIGN) * _gemm_tma.SPLIT_ALIGN
    return _gemm_tma.cdiv(K, k_split), k_split


SHIPPED, SHIPPED_TUNED = _gemm_tma.split_k, _gemm_tma.tuned
TILE_256 = [c for c in _gemm_tma.CONFIGS if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) == (128, 256)]
# rule -> (the split, the configs the autotuner may pick from: None for all). "model 128x256": the
# cost model counting the 128 x 256 tiles that the weight gradients run fastest on (0.73x cuBLAS
# against 0.60x for 128 x 128 at 3072 x 768, K 16384), with the kernel held to that tile: 72 tiles
# on 132 SMs, 3 ways 216 (82% of two waves)
RULES = {"model": (cost_model_rule, None), "shipped": (SHIPPED, None),
         "model 128x256": (lambda b, M, N, K, sms: cost_model_rule(b, M, N, K, sms, (128, 256)), TILE_256)}


def _set(rule: str | None) -> None:
    """``rule``'s split and configs in the gemm (None: the shipped ones); kept launches dropped."""
    split, configs = RULES[rule] if rule else (SHIPPED, None)
    _gemm_tma.split_k = split
    _gemm_tma.tuned = SHIPPED_TUNED if configs is None else _gemm_tma.autotuned(configs)
    _gemm_tma.KEPT.clear()


def under(rule: str, fn):
    """``fn`` run with ``rule`` as the split (kept launches dropped: they hold the other rule's pick)."""
    def run():
        _set(rule)
        try:
            return fn()
        finally:
            _set(None)
    return run


def graphed_under(rule: str, fn):
    """``fn``'s launches under ``rule``, captured once and replayed."""
    under(rule, fn)()  # compile and tune outside the capture
    torch.cuda.synchronize()
    _set(rule)
    try:
        replay = timing.graphed(fn)
    finally:
        _set(None)
    return replay


def products(rounds: int) -> list[dict]:
    rows = []
    cases = {name: (TOKENS, out, inn, "dW") for name, (out, inn) in DW.items()}
    cases.update({name: (V, n, d, "dx") for name, (n, V, d) in DX.items()})
    for name, (k, m, n, kind) in cases.items():
        if kind == "dW":  # A = dY^T (out, tokens) a transposed view, B = X (tokens, in)
            A = torch.randn(k, m, device="cuda", dtype=torch.bfloat16).mT
            B = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        else:  # A = dlogits (n, V), B = W (V, d)
            A = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            B = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        fns = {rule: graphed_under(rule, lambda A=A, B=B: blas.gemm(A, B, backend="triton")) for rule in RULES}
        fns["torch.matmul"] = timing.graphed(lambda A=A, B=B: A @ B)
        ms = timing.interleaved(fns, rounds)
        flops = 2 * m * n * k
        sms = _gemm_tma.num_sms(A.device)
        row = {"product": name, "M": m, "N": n, "K": k, "splits": {r: RULES[r][0](1, m, n, k, sms)[0] for r in RULES},
               "ms": ms, "tflops": {r: flops / t / 1e9 for r, t in ms.items()}}
        print(f"{name:24s} {m}x{n}x{k}: splits {row['splits']}, " +
              ", ".join(f"{r} {t:.3f} ms ({row['tflops'][r]:.0f} TFLOP/s)" for r, t in ms.items()), flush=True)
        rows.append(row)
    return rows


def lce(rounds: int) -> list[dict]:
    rows = []
    for d in (768, 4096):
        for V in (50304, 128256):
            x = torch.randn(TOKENS, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            w = (torch.randn(V, d, device="cuda", dtype=torch.bfloat16) / d ** 0.5).requires_grad_()
            t = torch.randint(0, V, (TOKENS,), device="cuda")

            def step(x=x, w=w, t=t):
                x.grad = w.grad = None
                blas.linear_cross_entropy(x, w, t, backend="triton").backward()
            fns = {rule: graphed_under(rule, step) for rule in RULES}
            ms = timing.interleaved(fns, rounds)
            print(f"linear_cross_entropy d{d} V{V} fwd+bwd: " + ", ".join(f"{r} {t:.2f} ms" for r, t in ms.items()),
                  flush=True)
            rows.append({"op": "linear_cross_entropy", "d": d, "V": V, "ms": ms})
            del x, w, t, fns
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "products": products(args.rounds)}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    result["lce"] = lce(args.rounds)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
