"""geru: ``out = A + alpha * x y^T`` with ``torch.addr``.

PyTorch's CPU ``addr`` rounds each product ``alpha * x_i * y_j`` to float16/bfloat16 before the
add (the CUDA kernel computes in float32), so on the CPU half types go through float32 once.
"""
import torch


def geru(A: torch.Tensor, x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor) -> torch.Tensor:
    if A.device.type == "cpu" and A.dtype in (torch.float16, torch.bfloat16):
        return out.copy_(torch.addr(A.float(), x.float(), y.float(), alpha=alpha))
    if out is A:
        return A.addr_(x, y, alpha=alpha)
    return torch.addr(A, x, y, alpha=alpha, out=out)
