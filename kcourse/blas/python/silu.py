"""silu: ``y = x sigmoid(x)``.

    dy/dx = s + x s (1 - s) = s (1 + x (1 - s)),   s = sigmoid(x)

Backward: dx = dy * dy/dx. Cache: ``(x,)``. ``silu_slope`` is shared with swiglu.
"""
import torch

from ._acc import acc, into


def silu_slope(a: torch.Tensor) -> torch.Tensor:
    """d silu / dx at ``a`` (already in the accumulation dtype)."""
    s = torch.sigmoid(a)
    return s * (1 + a * (1 - s))


def silu(x: torch.Tensor):
    a = acc(x)
    return (a * torch.sigmoid(a)).to(x.dtype), (x,)


def silu_backward(dout: torch.Tensor, cache, needs, out=None):
    (x,) = cache
    if not needs[0]:
        return (None,)
    return (into((acc(dout) * silu_slope(acc(x))).to(x.dtype), out),)
