"""silu: ``F.silu`` forward, ``aten.silu_backward`` (PyTorch's own backward kernel) backward.

    y = x s,   dy/dx = s (1 + x (1 - s)),   s = sigmoid(x)

PyTorch computes float16/bfloat16 in float32 and rounds once. Cache: ``(x,)``.
"""
import torch
import torch.nn.functional as F


def silu(x: torch.Tensor):
    return F.silu(x), (x,)


def silu_backward(dout: torch.Tensor, cache, needs, out=None):
    (x,) = cache
    if not needs[0]:
        return (None,)
    if out is None:
        return (torch.ops.aten.silu_backward(dout, x),)
    return (torch.ops.aten.silu_backward.grad_input(dout, x, grad_input=out),)
