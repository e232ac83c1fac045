"""add_layer_norm: ``h = x + residual`` (``torch.add``: computed in float32 for half types, rounded once)
and ``y = layer_norm(h)`` through this backend's layer_norm (``aten.native_layer_norm``).

Backward: the layer_norm backward of h (``aten.native_layer_norm_backward``), plus h's own gradient:
``dx = dresidual = dh + d layer_norm/dh (dy)``. ATen writes the norm's part in h's dtype, so for half
types that sum is rounded twice (the norm's gradient, then the sum); the triton kernel rounds it once.
"""
from .. import _host
from ._norm import add, aten_autograd
from .layer_norm import layer_norm, layer_norm_autograd, layer_norm_backward

add_layer_norm, add_layer_norm_backward = _host.composed_add_norm_ops(
    norm=layer_norm, norm_backward=layer_norm_backward, add=add)


def add_layer_norm_autograd(x, residual, weight, bias, eps):
    """``[layer_norm(h), h]`` with ``h = add(x, residual)``, recorded by ATen's autograd
    (``kcourse.backend.autograd_kernel``) where ``layer_norm_autograd`` runs; else None."""
    if not aten_autograd(x, weight, bias):
        return None
    h = add(x, residual)
    return [layer_norm_autograd(h, weight, bias, eps)[0], h]
