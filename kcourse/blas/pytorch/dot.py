"""dot: ``x^T y`` with ``torch.dot`` (float32 accumulation for half types)."""
import torch


def dot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.dot(x, y)
