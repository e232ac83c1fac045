"""layer_norm over the last dimension of x (..., D) on the CuTe DSL, biased variance:

    mean = sum_j x_j / D,   rstd = 1 / sqrt(sum_j (x_j - mean)^2 / D + eps)
    y    = (x - mean) * rstd * weight + bias          (weight, bias (D,) or None)

Backward, with xhat = (x - mean) * rstd and g = dy * weight:

    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dweight = sum_rows dy * xhat,  dbias = sum_rows dy

FLOPs ~7ND forward, ~13ND backward; bytes 2NDs forward, 3NDs backward (+ the float32 partials of
dweight and dbias): memory bound. The kernels, shared with rms_norm, are in ``_norm.py``
(``center=True`` here): rows kept in registers, warp-shuffle then shared-memory row sums, and a
deterministic two-stage reduction for dweight and dbias. The cache holds x, weight and
the float32 mean and rstd (N,), as triton's does.
"""
from .. import _host
from ._norm import norm_backward, norm_forward


layer_norm, layer_norm_backward = _host.layer_norm_ops(norm_forward, norm_backward)
