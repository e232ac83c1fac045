"""gemv: ``out_i = alpha * sum_j A_ij x_j + beta * y_i``; ``y`` is None (not read) when ``beta == 0``."""
import torch

from ._acc import acc


def gemv(A: torch.Tensor, x: torch.Tensor, y: torch.Tensor | None, alpha: float, beta: float,
         out: torch.Tensor) -> torch.Tensor:
    Ax = (acc(A) * acc(x)[None, :]).sum(dim=1)  # (m, n) * (1, n) -> (m,)
    r = alpha * Ax
    if y is not None:
        r = r + beta * acc(y)
    out[...] = r
    return out
