"""relu: ``y = max(x, 0)`` (NaN stays NaN, as ``torch.relu``).

    dy/dx = 1 where x > 0, else 0 (the subgradient at 0 is 0, as PyTorch's)

Backward: dx = dy where x > 0, else 0 (NaN inputs pass dy through, as ``threshold_backward``).
Cache: ``(x,)``. Exact in every dtype: nothing is rounded.
"""
import torch

from ._acc import into


def relu(x: torch.Tensor):
    return torch.where(x < 0, 0.0, x), (x,)


def relu_backward(dout: torch.Tensor, cache, needs, out=None):
    (x,) = cache
    if not needs[0]:
        return (None,)
    return (into(torch.where(x <= 0, 0.0, dout), out),)
