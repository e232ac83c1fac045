"""copy: ``out <- x`` with ``Tensor.copy_``."""
import torch


def copy(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return out.copy_(x)
