"""rms_norm: ``y = x * rstd * weight`` over the last dimension, with ``F.rms_norm`` for y and
``rstd = rsqrt(mean(x^2) + eps)`` (...,) kept for the backward.

Half inputs are upcast to float32 first, so y is computed in float32 and rounded once; rstd is
float32 (float64 for float64 x). Backward (``_norm.norm_backward`` without the mean),
xhat = x * rstd, g = dy * weight:

    dx = rstd * (g - xhat * mean(g * xhat)),   dweight = sum_rows dy * xhat
"""
import torch
import torch.nn.functional as F

from ._norm import norm_backward, upcast


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float):
    xf = upcast(x)  # (..., D)
    rstd = torch.rsqrt(xf.square().mean(dim=-1) + eps)  # (...,)
    y = F.rms_norm(xf, xf.shape[-1:], upcast(weight), eps)
    return y.to(x.dtype), (x, weight, rstd)


def rms_norm_backward(dout, cache, needs, eps):
    x, weight, rstd = cache
    return norm_backward(dout, x, weight, None, rstd, (*needs, False))[:2]
