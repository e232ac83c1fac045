"""add_rms_norm: ``h = x + residual`` (``axpby.py``, computed in float32, rounded once) and ``y = rms_norm(h)``
(``rms_norm.py``), composed: two passes over memory each way where the triton backend's fused kernel
makes one. Backward: the rms_norm backward of h, then ``dx = dresidual = dh + d rms_norm/dh (dy)`` (one more
axpby: for half types the norm's part is rounded before the sum).
"""
from .. import _host
from ._norm import add
from .rms_norm import rms_norm, rms_norm_backward


add_rms_norm, add_rms_norm_backward = _host.composed_add_norm_ops(
    norm=rms_norm, norm_backward=rms_norm_backward, add=add)
