"""add_layer_norm: the residual add and layer_norm, composed (``layer_norm.py``):

    h = x + residual      (in x's dtype, rounded once)
    y = (h - mean) * rstd * weight + bias      over the last dimension, as layer_norm

Backward, from the gradients of both outputs (dh None: 0), with xhat = (h - mean) * rstd, g = dy * weight:

    dx = dresidual = dh + rstd * (g - mean(g) - xhat * mean(g * xhat))     (one sum, rounded once)
    dweight = sum_rows dy * xhat,   dbias = sum_rows dy

The cache is layer_norm's of h: h, weight, mean and rstd (N,).
"""
from .. import _host
from ._norm import add, norm_backward
from .layer_norm import layer_norm


def add_layer_norm(x, residual, weight, bias, eps):
    h = add(x, residual)
    y, cache = layer_norm(h, weight, bias, eps)
    return (y, h), cache


add_layer_norm_backward = _host.add_norm_backward(
    lambda dy, cache, needs, eps, dh: norm_backward(dy, *cache, needs, dresidual=dh))
