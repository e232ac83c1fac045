"""rms_norm over the last dimension of x (..., D) on the CuTe DSL:

    rstd = 1 / sqrt(sum_j x_j^2 / D + eps),   y = x * rstd * weight      (weight (D,) or None)

Backward, with xhat = x * rstd and g = dy * weight:

    dx = rstd * (g - xhat * mean(g * xhat)),   dweight = sum_rows dy * xhat

FLOPs ~4ND forward, ~9ND backward; bytes 2NDs forward, 3NDs backward (+ the float32 partials of
dweight): memory bound. The kernels, shared with layer_norm, are in ``_norm.py`` (``center=False``:
no mean). The cache holds x as (N, D) rows and the float32 rstd (N,), as triton's does.
"""
from ._norm import norm_backward, norm_forward


def rms_norm(x, weight, eps):
    y, x2, _, rstd = norm_forward(x, weight, None, eps, center=False)
    return y, (x2, weight, rstd)


def rms_norm_backward(dout, cache, needs, eps):
    x2, weight, rstd = cache
    return norm_backward(dout, x2, weight, None, rstd, (*needs, False))[:2]
