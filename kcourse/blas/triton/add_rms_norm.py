"""add_rms_norm: h = x + residual (rounded once to x's dtype) and y = rms_norm(h), one pass each way:

    forward:  reads x and residual, writes h and y (4NDs bytes; unfused, an add and an rms_norm: 5NDs)
    backward: reads dy, dh and h, writes dx once (returned for x and residual: 4NDs; unfused 5NDs)

    dx = dresidual = dh + rstd * (g - xhat * mean(g * xhat)),   xhat = h * rstd, g = dy * weight

The kernels are rms_norm's (``_norm.py``, ``CENTER=False``): the forward loads x and residual and
stores h beside y (``residual=``), the backward adds dh to dx before its one rounding
(``dresidual=``). The cache is rms_norm's, of h: h, weight and the float32 rstd (N,) (``_host.add_norm_ops``).
"""
from .. import _host
from ._norm import norm_backward, norm_forward


add_rms_norm, add_rms_norm_backward = _host.add_norm_ops(norm_forward, norm_backward)[2:]
