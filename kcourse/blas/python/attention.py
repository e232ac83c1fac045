"""attention: ``out = softmax(scale q k^T + mask) v``, from kcourse ops on this backend.

q (B, H, Tq, D), k and v (B, Hkv, Tk, D). Each kv head serves G = H / Hkv consecutive query heads:
k and v are repeated to H heads, and every (batch, head) becomes one matrix of a batched product:

    S     = gemm(q, k^T, alpha=scale)          (B*H, Tq, Tk)
    S_ij  = -inf where j > i                   (causal, top-left aligned)
    S_ij  = -inf where j >= kv_len[b]          (with kv_len: batch row b's keys past its length)
    lse_i = log sum_j exp(S_ij)                (B*H, Tq)
    P     = exp(S - lse)                       the softmax
    out   = gemm(P, v)                         (B*H, Tq, D)

Backward, with delta_i = sum_d dO_id O_id (which equals sum_j P_ij dP_ij):

    dV = P^T dO     dP = dO V^T     dS = P * (dP - delta)     dQ = scale dS K     dK = scale dS^T Q

and dK, dV summed over the G query heads that read each kv head. The cache is
``(q, k, v, out, lse)``, as the fused kernels keep it: P is recomputed from lse. Everything runs in
float32 (float64 for float64) and is rounded once. With no keys (Tk = 0) the output is 0 and lse
is -inf.
"""
import torch

from ... import blas
from ._acc import acc


def _heads(t: torch.Tensor, H: int) -> torch.Tensor:
    """(B, Hkv, T, D) -> (B*H, T, D) in the accumulation dtype: query head h reads kv head h // (H/Hkv)."""
    B, Hkv, T, D = t.shape
    return acc(t).repeat_interleave(H // Hkv, dim=1).reshape(B * H, T, D)


def _scores(q3: torch.Tensor, k3: torch.Tensor, causal: bool, scale: float, hidden=None) -> torch.Tensor:
    """S (B*H, Tq, Tk), -inf where masked; ``hidden`` (B*H, Tk) bool: the keys past a row's kv_len."""
    s = blas.gemm(q3, k3.mT, alpha=scale, backend="python")  # (B*H, Tq, Tk)
    if causal:
        above = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(diagonal=1)  # key j > query i
        s = s.masked_fill(above, float("-inf"))
    if hidden is not None:
        s = s.masked_fill(hidden[:, None, :], float("-inf"))
    return s


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_len, causal: bool, scale: float):
    B, H, Tq, D = q.shape
    q3, k3, v3 = acc(q).reshape(B * H, Tq, D), _heads(k, H), _heads(v, H)
    hidden = None
    if kv_len is not None:  # hidden values read as 0: P is 0 there, and 0 * NaN would not be
        hidden = (torch.arange(k.shape[2], device=k.device) >= kv_len[:, None]).repeat_interleave(H, dim=0)  # (B*H, Tk)
        v3 = v3.masked_fill(hidden[:, :, None], 0.0)
    s = _scores(q3, k3, causal, scale, hidden)  # (B*H, Tq, Tk)
    if s.shape[-1]:
        m = s.amax(dim=-1, keepdim=True)  # subtracting the row max: no overflow
        lse = m + (s - m).exp().sum(dim=-1, keepdim=True).log()  # (B*H, Tq, 1)
    else:
        lse = s.new_full((B * H, Tq, 1), float("-inf"))
    p = (s - lse).exp()  # (B*H, Tq, Tk)
    if kv_len is not None:  # the rows of a batch row with no key (kv_len <= 0): lse -inf, P 0
        none = (kv_len <= 0).repeat_interleave(H)[:, None, None]  # (B*H, 1, 1)
        lse, p = lse.masked_fill(none, float("-inf")), p.masked_fill(none, 0.0)
    out = blas.gemm(p, v3, backend="python")  # (B*H, Tq, D)
    out = out.reshape(B, H, Tq, D).to(q.dtype)
    return out, (q, k, v, out, lse.reshape(B, H, Tq))


def attention_backward(dout: torch.Tensor, cache, needs, causal: bool, scale: float):
    q, k, v, out, lse = cache
    if not any(needs):
        return None, None, None
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    q3, k3, v3 = acc(q).reshape(B * H, Tq, D), _heads(k, H), _heads(v, H)
    do, o = acc(dout).reshape(B * H, Tq, D), acc(out).reshape(B * H, Tq, D)
    p = (_scores(q3, k3, causal, scale) - lse.reshape(B * H, Tq, 1)).exp()  # (B*H, Tq, Tk)
    dp = blas.gemm(do, v3.mT, backend="python")  # (B*H, Tq, Tk)
    ds = p * (dp - (do * o).sum(dim=-1, keepdim=True))

    def per_kv_head(g: torch.Tensor, like: torch.Tensor) -> torch.Tensor:  # (B*H, Tk, D) -> (B, Hkv, Tk, D)
        return g.reshape(B, Hkv, H // Hkv, Tk, D).sum(dim=2).to(like.dtype)

    dq = blas.gemm(ds, k3, alpha=scale, backend="python").reshape(B, H, Tq, D).to(q.dtype) if needs[0] else None
    dk = per_kv_head(blas.gemm(ds.mT, q3, alpha=scale, backend="python"), k) if needs[1] else None
    dv = per_kv_head(blas.gemm(p.mT, do, backend="python"), v) if needs[2] else None
    return dq, dk, dv
