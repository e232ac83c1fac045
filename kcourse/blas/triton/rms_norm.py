"""rms_norm over the last dimension of x (..., D):

    rstd = 1 / sqrt(sum_j x_j^2 / D + eps),   y = x * rstd * weight      (weight (D,) or None)

Backward, with xhat = x * rstd and g = dy * weight:

    dx = rstd * (g - xhat * mean(g * xhat)),   dweight = sum_rows dy * xhat

The kernels, shared with layer_norm, are in ``_norm.py`` (``CENTER=False``: no mean). The cache
holds x, weight and the float32 rstd (N,) (``_host.rms_norm_ops``).
"""
from .. import _host
from ._norm import norm_backward, norm_forward


rms_norm, rms_norm_backward = _host.rms_norm_ops(norm_forward, norm_backward)
