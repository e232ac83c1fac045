"""gemv: ``out = alpha * A x + beta * y`` with ``torch.addmv``; ``y`` is None when ``beta == 0``.

With ``beta=0`` PyTorch ignores the added tensor, so ``out.addmv_(A, x, beta=0)`` never reads the
uninitialized ``out``.
"""
import torch


def gemv(A: torch.Tensor, x: torch.Tensor, y: torch.Tensor | None, alpha: float, beta: float,
         out: torch.Tensor) -> torch.Tensor:
    if y is None:
        return out.addmv_(A, x, beta=0, alpha=alpha)
    if out is y:
        return y.addmv_(A, x, beta=beta, alpha=alpha)
    return torch.addmv(y, A, x, beta=beta, alpha=alpha, out=out)
