"""rms_norm over the last dimension of x (..., D):

    rstd = 1 / sqrt(sum_j x_j^2 / D + eps),   y = x * rstd * weight      (weight (D,) or None)

Backward, with xhat = x * rstd and g = dy * weight (``_norm.norm_backward`` without the mean):

    dx = rstd * (g - xhat * mean(g * xhat)),   dweight = sum_rows dy * xhat

The cache holds x, weight and rstd (N,) = one per row of x, in float32 (float64 for float64 x).
"""
import torch

from ._acc import acc
from ._norm import affine, norm_backward


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float):
    xf = acc(x)  # (..., D)
    rstd = 1 / torch.sqrt((xf * xf).mean(dim=-1) + eps)  # (...,)
    y = affine(xf * rstd[..., None], weight, None)
    return y.to(x.dtype), (x, weight, rstd.reshape(-1))


def rms_norm_backward(dout, cache, needs, eps):
    x, weight, rstd = cache
    return norm_backward(dout, x, weight, None, rstd, (*needs, False))[:2]
