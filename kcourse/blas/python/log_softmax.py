"""log_softmax along ``dim``: ``y_i = x_i - m - log sum_j exp(x_j - m)`` with ``m = max_j x_j``.

Backward: ``dx_i = dy_i - exp(y_i) sum_j dy_j``, from ``dy_i/dx_k = [i == k] - softmax(x)_k`` and
``softmax(x) = exp(y)``. The cache is the output ``y`` (in ``x``'s dtype, as torch keeps it).
"""
import torch

from ._acc import acc


def log_softmax(x: torch.Tensor, dim: int):
    if x.shape[dim] == 0:  # nothing to normalize (amax has no identity): an empty result, as torch's
        y = torch.empty_like(x)
        return y, (y,)
    a = acc(x)
    shifted = a - a.amax(dim, keepdim=True)  # subtracting the max: no overflow in exp
    y = (shifted - shifted.exp().sum(dim, keepdim=True).log()).to(x.dtype)
    return y, (y,)


def log_softmax_backward(dy: torch.Tensor, cache, needs, dim: int):
    (y,) = cache
    if not needs[0]:
        return (None,)
    dy_ = acc(dy)
    dx = dy_ - acc(y).exp() * dy_.sum(dim, keepdim=True)
    return (dx.to(y.dtype),)
