"""gemm: ``out = alpha * A B + beta * C`` with ``torch.addmm`` (2-D) or ``torch.baddbmm`` (3-D).

``C`` is None when ``beta == 0``: ``out.addmm_(A, B, beta=0)`` ignores ``out``'s old values.
"""
import torch


def gemm(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor | None, alpha: float, beta: float,
         out: torch.Tensor) -> torch.Tensor:
    batched = A.dim() == 3
    if C is None or out is C:
        update = out.baddbmm_ if batched else out.addmm_
        return update(A, B, beta=beta if C is not None else 0, alpha=alpha)
    add = torch.baddbmm if batched else torch.addmm
    return add(C, A, B, beta=beta, alpha=alpha, out=out)
