"""rms_norm over the last dimension of x (..., D) on the CuTe DSL:

    rstd = 1 / sqrt(sum_j x_j^2 / D + eps),   y = x * rstd * weight      (weight (D,) or None)

Backward, with xhat = x * rstd and g = dy * weight:

    dx = rstd * (g - xhat * mean(g * xhat)),   dweight = sum_rows dy * xhat

FLOPs ~4ND forward, ~9ND backward; bytes 2NDs forward, 3NDs backward (+ the float32 partials of
dweight): memory bound. The kernels, shared with layer_norm, are in ``_norm.py`` (``center=False``:
no mean). The cache holds x and the float32 rstd (N,), as triton's does.
"""
from .._layout import rows_of
from ._norm import norm_backward, norm_forward


def rms_norm(x, weight, eps):
    y, _, _, rstd = norm_forward(x, weight, None, eps, center=False)
    return y, (x, weight, rstd)


def rms_norm_backward(dout, cache, needs, eps):
    x, weight, rstd = cache
    return norm_backward(dout, rows_of(x), weight, None, rstd, (*needs, False))[:2]
