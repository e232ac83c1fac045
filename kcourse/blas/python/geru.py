"""geru: ``out_ij = A_ij + alpha * x_i * y_j`` (the rank-1 update)."""
import torch

from ._acc import acc


def geru(A: torch.Tensor, x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor) -> torch.Tensor:
    out[...] = acc(A) + alpha * (acc(x)[:, None] * acc(y)[None, :])  # (m, 1) * (1, n) -> (m, n)
    return out
