"""add_rms_norm: the residual add and rms_norm, composed (``rms_norm.py``):

    h = x + residual      (in x's dtype, rounded once)
    y = h * rstd * weight,   rstd = 1 / sqrt(mean(h^2) + eps)      over the last dimension, as rms_norm

Backward, from the gradients of both outputs (dh None: 0), with xhat = h * rstd, g = dy * weight:

    dx = dresidual = dh + rstd * (g - xhat * mean(g * xhat))     (one sum, rounded once)
    dweight = sum_rows dy * xhat

The cache is rms_norm's of h: h, weight and rstd (N,).
"""
from .. import _host
from ._norm import add, norm_backward
from .rms_norm import rms_norm


def add_rms_norm(x, residual, weight, eps):
    h = add(x, residual)
    y, cache = rms_norm(h, weight, eps)
    return (y, h), cache


add_rms_norm_backward = _host.add_norm_backward(
    lambda dy, cache, needs, eps, dh: norm_backward(dy, cache[0], cache[1], None, cache[2], (*needs, False),
                                                    dresidual=dh)[:2])
