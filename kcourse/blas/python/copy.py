"""copy: ``out <- x``, element by element."""
import torch


def copy(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    out[...] = x
    return out
