"""axpby: ``out = alpha * x + beta * y`` with ``torch.add(..., alpha=)``; ``y`` is None when ``beta == 0``."""
import torch


def axpby(x: torch.Tensor, y: torch.Tensor | None, alpha: float, beta: float, out: torch.Tensor) -> torch.Tensor:
    if y is None:
        return torch.mul(x, alpha, out=out)
    if out is y:  # in place: y <- beta * y, then y += alpha * x
        return y.mul_(beta).add_(x, alpha=alpha)
    return torch.add(torch.mul(y, beta), x, alpha=alpha, out=out)
