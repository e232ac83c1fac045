"""axpby: ``out = alpha * x + beta * y`` with ``torch.add(a, b, alpha=s)``, which computes ``a + s * b``
in float32 for half types (float64 stays) and rounds once; ``y`` is None when ``beta == 0``.

With ``beta == 1`` (a residual add) or ``alpha == 1`` it is that one call. With both scaled,
``beta * y`` is formed in float32 first (a transient float32 copy of y for half types), so the
result is still rounded once, never through a rounded ``beta * y``.
"""
import torch


def axpby(x: torch.Tensor, y: torch.Tensor | None, alpha: float, beta: float, out: torch.Tensor) -> torch.Tensor:
    if y is None:
        return torch.mul(x, alpha, out=out)
    if beta == 1:
        return torch.add(y, x, alpha=alpha, out=out)
    if alpha == 1:
        return torch.add(x, y, alpha=beta, out=out)
    scaled_y = torch.mul(y.to(torch.promote_types(y.dtype, torch.float32)), beta)  # a new tensor: y stays
    return torch.add(scaled_y, x, alpha=alpha, out=out)  # (out may be y itself: in place)
