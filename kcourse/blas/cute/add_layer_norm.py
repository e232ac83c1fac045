"""add_layer_norm: ``h = x + residual`` (``axpby.py``, computed in float32, rounded once) and ``y = layer_norm(h)``
(``layer_norm.py``), composed: two passes over memory each way where the triton backend's fused kernel
makes one. Backward: the layer_norm backward of h, then ``dx = dresidual = dh + d layer_norm/dh (dy)`` (one more
axpby: for half types the norm's part is rounded before the sum).
"""
from .. import _host
from ._norm import add
from .layer_norm import layer_norm, layer_norm_backward


add_layer_norm, add_layer_norm_backward = _host.composed_add_norm_ops(
    norm=layer_norm, norm_backward=layer_norm_backward, add=add)
