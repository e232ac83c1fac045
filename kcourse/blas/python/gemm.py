"""gemm: ``out_bij = alpha * sum_p A_bip B_bpj + beta * C_bij``; ``C`` is None (not read) when ``beta == 0``.

The product is a broadcast multiply and a sum over ``p``, a few rows at a time so that the
``(rows, k, n)`` intermediate stays near 2^24 elements.
"""
import torch

from ._acc import acc

CHUNK = 1 << 24


def gemm(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor | None, alpha: float, beta: float,
         out: torch.Tensor) -> torch.Tensor:
    m, k = A.shape[-2:]
    n = B.shape[-1]
    batch = A.shape[0] if A.dim() == 3 else 1
    rows = max(1, CHUNK // max(1, batch * k * n))
    Bf = acc(B).unsqueeze(-3)  # (..., 1, k, n)
    for i in range(0, m, rows):
        Ai = acc(A[..., i:i + rows, :]).unsqueeze(-1)  # (..., r, k, 1)
        r = alpha * (Ai * Bf).sum(dim=-2)  # (..., r, k, n) -> (..., r, n)
        if C is not None:
            r = r + beta * acc(C[..., i:i + rows, :])
        out[..., i:i + rows, :] = r
    return out
