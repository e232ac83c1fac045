"""add_layer_norm: h = x + residual (rounded once to x's dtype) and y = layer_norm(h), one pass each way:

    forward:  reads x and residual, writes h and y (4NDs bytes; unfused, an add and a layer_norm: 5NDs)
    backward: reads dy, dh and h, writes dx once (returned for x and residual: 4NDs; unfused 5NDs)

    dx = dresidual = dh + rstd * (g - mean(g) - xhat * mean(g * xhat)),   xhat = (h - mean) * rstd, g = dy * weight

The kernels are layer_norm's (``_norm.py``): the forward loads x and residual and stores h beside
y (``residual=``), the backward adds dh to dx before its one rounding (``dresidual=``). The cache is
layer_norm's, of h: h, weight and the float32 mean and rstd (N,) (``_host.add_norm_ops``).
"""
from .. import _host
from ._norm import norm_backward, norm_forward


add_layer_norm, add_layer_norm_backward = _host.add_norm_ops(norm_forward, norm_backward)[:2]
