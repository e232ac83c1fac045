"""attention (composite): ``out = softmax(scale q k^T + mask) v`` from kcourse ops on this backend.

q (B, H, Tq, D), k and v (B, Hkv, Tk, D). Each kv head serves H / Hkv consecutive query heads: k and
v are repeated to H heads, and every (batch, head) becomes one matrix of a batched product:

    S = gemm(q, k^T, alpha=scale)          (B*H, Tq, Tk)
    S_ij = -inf where j > i                (causal, top-left aligned)
    P = softmax(S, dim=-1)
    out = gemm(P, v)                       (B*H, Tq, D)

There is no ``attention_backward``: the gradients flow through the pullbacks of gemm and softmax
(and of the reshapes, the repeat, the mask and the dtype casts, which torch differentiates). The
whole chain runs in float32 (float64 for float64) and ``out`` is rounded once.
"""
import torch

from ... import blas
from ._acc import acc


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float):
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    q3 = acc(q).reshape(B * H, Tq, D)
    k3 = acc(k).repeat_interleave(H // Hkv, dim=1).reshape(B * H, Tk, D)  # query head h reads kv head h // (H/Hkv)
    v3 = acc(v).repeat_interleave(H // Hkv, dim=1).reshape(B * H, Tk, D)
    s = blas.gemm(q3, k3.mT, alpha=scale, backend="python")  # (B*H, Tq, Tk)
    if causal:
        above = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).triu(diagonal=1)  # key j > query i
        s = s.masked_fill(above, float("-inf"))
    p = blas.softmax(s, dim=-1, backend="python")
    out = blas.gemm(p, v3, backend="python")  # (B*H, Tq, D)
    return out.reshape(B, H, Tq, D).to(q.dtype), ()
