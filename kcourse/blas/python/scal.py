"""scal: ``out_i = alpha * x_i``."""
import torch

from ._acc import acc


def scal(x: torch.Tensor, alpha: float, out: torch.Tensor) -> torch.Tensor:
    out[...] = alpha * acc(x)
    return out
