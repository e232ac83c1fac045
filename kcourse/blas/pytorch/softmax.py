"""softmax along ``dim`` with ``F.softmax`` (float32 accumulation for half types).

Backward: ``dx = y * (dy - sum(dy * y))`` with ``torch._softmax_backward_data``, the kernel that
``F.softmax``'s own autograd runs.
"""
import torch
import torch.nn.functional as F


def softmax(x: torch.Tensor, dim: int):
    y = F.softmax(x, dim)
    return y, (y,)


def softmax_backward(dy: torch.Tensor, cache, needs, dim: int):
    (y,) = cache
    return (torch._softmax_backward_data(dy, y, dim, y.dtype) if needs[0] else None,)
