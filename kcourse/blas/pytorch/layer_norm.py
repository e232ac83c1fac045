"""layer_norm: ``y = (x - mean) * rstd * weight + bias`` over the last dimension, with
``F.layer_norm`` for y and ``torch.var_mean`` for the statistics the backward needs.

    mean = sum_j x_j / D,   rstd = 1 / sqrt(sum_j (x_j - mean)^2 / D + eps)   (biased variance)

Half inputs are upcast to float32 first, so y is computed in float32 and rounded once; mean and rstd
(...,) are float32 (float64 for float64 x). Backward (``_norm.norm_backward``), xhat = (x - mean) * rstd,
g = dy * weight:

    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dweight = sum_rows dy * xhat,  dbias = sum_rows dy
"""
import torch
import torch.nn.functional as F

from ._norm import norm_backward, upcast


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float):
    xf = upcast(x)  # (..., D)
    var, mean = torch.var_mean(xf, dim=-1, correction=0)  # (...,)
    y = F.layer_norm(xf, xf.shape[-1:], upcast(weight), upcast(bias), eps)
    return y.to(x.dtype), (x, weight, mean, torch.rsqrt(var + eps))


def layer_norm_backward(dout, cache, needs, eps):
    x, weight, mean, rstd = cache
    return norm_backward(dout, x, weight, mean, rstd, needs)
