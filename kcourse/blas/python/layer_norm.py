"""layer_norm over the last dimension of x (..., D), biased variance:

    mean = sum_j x_j / D,   rstd = 1 / sqrt(sum_j (x_j - mean)^2 / D + eps)
    y    = (x - mean) * rstd * weight + bias          (weight, bias (D,) or None)

Backward, with xhat = (x - mean) * rstd and g = dy * weight (``_norm.norm_backward``):

    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dweight = sum_rows dy * xhat,  dbias = sum_rows dy

The cache holds x, weight and the row statistics mean and rstd (N,) = one per row of x, in float32
(float64 for float64 x).
"""
import torch

from ._acc import acc
from ._norm import affine, norm_backward


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float):
    xf = acc(x)  # (..., D)
    mean = xf.mean(dim=-1)  # (...,)
    xc = xf - mean[..., None]
    rstd = 1 / torch.sqrt((xc * xc).mean(dim=-1) + eps)  # (...,)
    y = affine(xc * rstd[..., None], weight, bias)
    return y.to(x.dtype), (x, weight, mean.reshape(-1), rstd.reshape(-1))


def layer_norm_backward(dout, cache, needs, eps):
    x, weight, mean, rstd = cache
    return norm_backward(dout, x, weight, mean, rstd, needs)
