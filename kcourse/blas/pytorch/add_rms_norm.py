"""add_rms_norm: ``h = x + residual`` (``torch.add``: computed in float32 for half types, rounded once)
and ``y = rms_norm(h)`` through this backend's rms_norm (``aten._fused_rms_norm`` on CUDA).

Backward: the rms_norm backward of h, plus h's own gradient: ``dx = dresidual = dh + d rms_norm/dh (dy)``.
The norm's part is written in h's dtype, so for half types that sum is rounded twice (the norm's
gradient, then the sum); the triton kernel rounds it once.
"""
from .. import _host
from ._norm import add, plus
from .rms_norm import rms_norm, rms_norm_backward


def add_rms_norm(x, residual, weight, eps):
    h = add(x, residual)
    y, cache = rms_norm(h, weight, eps)
    return (y, h), cache


add_rms_norm_backward = _host.add_norm_backward(
    lambda dy, cache, needs, eps, dh: plus(rms_norm_backward(dy, cache, needs, eps), dh))
