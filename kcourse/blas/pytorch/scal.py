"""scal: ``out = alpha * x`` with ``torch.mul``."""
import torch


def scal(x: torch.Tensor, alpha: float, out: torch.Tensor) -> torch.Tensor:
    return torch.mul(x, alpha, out=out)
