"""softmax along ``dim``: ``y_i = exp(x_i - m) / sum_j exp(x_j - m)`` with ``m = max_j x_j``.

Backward: ``dx_i = y_i (dy_i - sum_j dy_j y_j)``, from the Jacobian ``dy_i/dx_k = y_i ([i == k] - y_k)``.
The cache is the output ``y`` (in ``x``'s dtype, as torch keeps it).
"""
import torch

from ._acc import acc


def softmax(x: torch.Tensor, dim: int):
    if x.shape[dim] == 0:  # nothing to normalize (amax has no identity): an empty result, as torch's
        y = torch.empty_like(x)
        return y, (y,)
    a = acc(x)
    e = (a - a.amax(dim, keepdim=True)).exp()  # subtracting the max: no overflow, same ratios
    y = (e / e.sum(dim, keepdim=True)).to(x.dtype)
    return y, (y,)


def softmax_backward(dy: torch.Tensor, cache, needs, dim: int):
    (y,) = cache
    if not needs[0]:
        return (None,)
    y_, dy_ = acc(y), acc(dy)
    dx = y_ * (dy_ - (dy_ * y_).sum(dim, keepdim=True))
    return (dx.to(y.dtype),)
