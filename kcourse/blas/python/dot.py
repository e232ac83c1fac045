"""dot: ``sum_i x_i * y_i``, as a 0-d tensor of the inputs' dtype."""
import torch

from ._acc import acc


def dot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (acc(x) * acc(y)).sum().to(x.dtype)
