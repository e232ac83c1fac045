"""add_layer_norm: ``h = x + residual`` (``torch.add``: computed in float32 for half types, rounded once)
and ``y = layer_norm(h)`` through this backend's layer_norm (``aten.native_layer_norm``).

Backward: the layer_norm backward of h (``aten.native_layer_norm_backward``), plus h's own gradient:
``dx = dresidual = dh + d layer_norm/dh (dy)``. ATen writes the norm's part in h's dtype, so for half
types that sum is rounded twice (the norm's gradient, then the sum); the triton kernel rounds it once.
"""
from .. import _host
from ._norm import add, plus
from .layer_norm import layer_norm, layer_norm_backward


def add_layer_norm(x, residual, weight, bias, eps):
    h = add(x, residual)
    y, cache = layer_norm(h, weight, bias, eps)
    return (y, h), cache


add_layer_norm_backward = _host.add_norm_backward(
    lambda dy, cache, needs, eps, dh: plus(layer_norm_backward(dy, cache, needs, eps), dh))
