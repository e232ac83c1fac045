"""axpby: ``out_i = alpha * x_i + beta * y_i``; ``y`` is None (not read) when ``beta == 0``."""
import torch

from ._acc import acc


def axpby(x: torch.Tensor, y: torch.Tensor | None, alpha: float, beta: float, out: torch.Tensor) -> torch.Tensor:
    r = alpha * acc(x)
    if y is not None:
        r = r + beta * acc(y)
    out[...] = r
    return out
