"""geru: ``out = A + alpha * x y^T`` with ``torch.addr``.

PyTorch's ``addr`` rounds each product ``alpha * x_i * y_j`` to the tensor's dtype before the
add, so for float16/bfloat16 the outer product is formed in float32 and added with one rounding.
"""
import torch


def geru(A: torch.Tensor, x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor) -> torch.Tensor:
    if A.dtype in (torch.float16, torch.bfloat16):
        return torch.add(A, torch.outer(x.float(), y.float()), alpha=alpha, out=out)  # (m, n) in float32
    if out is A:
        return A.addr_(x, y, alpha=alpha)
    return torch.addr(A, x, y, alpha=alpha, out=out)
