"""Experiment: where the pytorch backend's cross_entropy and attention spend their GPU time, next to
the torch calls they stand for, and what ATen offers instead.

    python -m benchmarks.experiments.pytorch_backend_parts OUT.txt

Every time is a CUDA-graph replay (``graph_ms``: the kernels alone, L2 flushed per call).

cross_entropy, logits (32768, 8192) in bf16 and float32 (``benchmarks/run.py``'s shape, where the
backend runs at 0.71x torch eager forward and 0.33x backward in bf16): torch's
``F.cross_entropy`` forward and forward + backward; the backend's forward and backward functions;
each of their full passes alone (log_softmax, softmax, amax, the in-place row scaling); and two
candidates: the forward as ``F.cross_entropy(reduction="none")`` plus the +inf rule's amax, the
backward as ``exp`` of a kept log_softmax scaled in place (what torch's own backward reads).

attention, (B, H, T, D) bf16 at GPT-2's (8, 12, 1024, 64) and a grouped-query Llama-like
(4, 16 / 4 kv heads, 2048, 128), causal: SDPA's forward and forward + backward; the backend's
backward (which recomputes SDPA's forward under autograd); and ATen's flash attention forward and
backward called directly (``_scaled_dot_product_flash_attention`` / ``_backward``: the forward's
lse kept, no recompute), its gradients checked against SDPA's (max |difference|), or the error
it raises (grouped-query heads, say).
"""
import argparse

import torch
import torch.nn.functional as F

from benchmarks.timing import graph_ms
from kcourse.blas.pytorch import attention as kattention
from kcourse.blas.pytorch import cross_entropy as kce


def cross_entropy_lines(dtype: torch.dtype) -> list[str]:
    N, V = 32768, 8192
    x = torch.randn(N, V, device="cuda", dtype=dtype)
    t = torch.randint(0, V, (N,), device="cuda")
    xg = x.detach().requires_grad_()
    one = torch.ones((), device="cuda", dtype=dtype)
    _, cache = kce.cross_entropy(x, t, -100, "mean")
    logp = torch.log_softmax(x, dim=1)
    g = torch.full((N,), 1.0 / N, device="cuda", dtype=dtype)
    buf = torch.empty_like(x)
    calls = {
        "torch F.cross_entropy fwd": lambda: F.cross_entropy(x, t),
        "torch F.cross_entropy fwd+bwd": lambda: torch.autograd.grad(F.cross_entropy(xg, t), xg),
        "kcourse pytorch fwd": lambda: kce.cross_entropy(x, t, -100, "mean"),
        "kcourse pytorch bwd": lambda: kce.cross_entropy_backward(one, cache, (True, False), -100, "mean"),
        "part: log_softmax": lambda: torch.log_softmax(x, dim=1),
        "part: softmax": lambda: torch.softmax(x, dim=1),
        "part: amax": lambda: x.amax(dim=1),
        "part: buf.mul_(g[:, None])": lambda: buf.mul_(g[:, None]),
        "candidate fwd: F.cross_entropy(none) + amax": lambda: (F.cross_entropy(x, t, reduction="none"),
                                                                x.amax(dim=1)),
        "candidate bwd: exp(kept log_softmax).mul_(g)": lambda: torch.exp(logp).mul_(g[:, None]),
    }
    lines = [f"## cross_entropy {N} x {V} {str(dtype).removeprefix('torch.')}"]
    for name, fn in calls.items():
        lines.append(f"  {graph_ms(fn):8.4f} ms  {name}")
    return lines


def attention_lines(B: int, H: int, Hkv: int, T: int, D: int) -> list[str]:
    q = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, Hkv, T, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn_like(q)
    scale = D ** -0.5
    qg, kg, vg = (a.detach().requires_grad_() for a in (q, k, v))

    def sdpa_grads():
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, scale=scale, enable_gqa=Hkv != H)
        return torch.autograd.grad(out, (qg, kg, vg), dout)

    _, cache = kattention.attention(q, k, v, None, True, scale)
    calls = {
        "SDPA fwd": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=Hkv != H),
        "SDPA fwd+bwd": sdpa_grads,
        "kcourse pytorch bwd (recomputes the forward)":
            lambda: kattention.attention_backward(dout, cache, (True, True, True), True, scale),
    }
    lines = [f"## attention B {B}, H {H}, kv heads {Hkv}, T {T}, D {D}, bf16, causal"]
    for name, fn in calls.items():
        lines.append(f"  {graph_ms(fn):8.4f} ms  {name}")
    try:
        flash = torch.ops.aten._scaled_dot_product_flash_attention
        back = torch.ops.aten._scaled_dot_product_flash_attention_backward
        res = flash(q, k, v, 0.0, True, False, scale=scale)
        out, lse, cq, ck, mq, mk, seed, offset = res[:8]
        grads = back(dout, q, k, v, out, lse, cq, ck, mq, mk, 0.0, True, seed, offset, scale=scale)
        want = sdpa_grads()
        diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(grads, want))
        lines.append(f"  {graph_ms(lambda: flash(q, k, v, 0.0, True, False, scale=scale)):8.4f} ms  aten flash fwd "
                     f"(lse {tuple(lse.shape)} {lse.dtype})")
        backward_ms = graph_ms(lambda: back(dout, q, k, v, out, lse, cq, ck, mq, mk, 0.0, True, seed, offset,
                                            scale=scale))
        lines.append(f"  {backward_ms:8.4f} ms  aten flash bwd from the kept lse; gradients vs SDPA's: "
                     f"max |diff| {diff:.3g}")
    except Exception as e:  # noqa: BLE001 - what ATen refuses is the finding
        lines.append(f"  aten flash fwd/bwd: {type(e).__name__}: {str(e)[:300]}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    args = p.parse_args()
    lines = [f"# pytorch backend parts: {torch.cuda.get_device_name()}, torch {torch.__version__}, graphed ms"]
    for dtype in (torch.bfloat16, torch.float32):
        lines += cross_entropy_lines(dtype)
        torch.cuda.empty_cache()
    lines += attention_lines(8, 12, 12, 1024, 64)
    lines += attention_lines(4, 16, 4, 2048, 128)
    text = "\n".join(lines) + "\n"
    open(args.out, "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
