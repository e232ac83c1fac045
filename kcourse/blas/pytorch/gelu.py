"""gelu: ``F.gelu`` forward, ``aten.gelu_backward`` (the kernel PyTorch's own autograd runs) backward.

    exact:  y = x Phi(x)                      dy/dx = Phi(x) + x phi(x)
    tanh:   y = 0.5 x (1 + tanh u),  u = sqrt(2/pi) (x + 0.044715 x^3)
            dy/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2)

PyTorch computes float16/bfloat16 in float32 and rounds once. Cache: ``(x,)``.
"""
import math

import torch
import torch.nn.functional as F


def gelu(x: torch.Tensor, approximate: str):
    y = F.gelu(x, approximate=approximate)
    if x.device.type == "cpu" and approximate == "none":  # ATen's vectorized CPU kernel gives NaN at +inf
        y = torch.where(x == math.inf, x, y)  # (its float64 and CUDA kernels, and the formula, give +inf)
    return y, (x,)


def gelu_backward(dout: torch.Tensor, cache, needs, approximate: str, out=None):
    (x,) = cache
    if not needs[0]:
        return (None,)
    if out is None:
        return (torch.ops.aten.gelu_backward(dout, x, approximate=approximate),)
    return (torch.ops.aten.gelu_backward.grad_input(dout, x, approximate=approximate, grad_input=out),)
