"""add_rms_norm: ``h = x + residual`` (``torch.add``: computed in float32 for half types, rounded once)
and ``y = rms_norm(h)`` through this backend's rms_norm (``aten._fused_rms_norm`` on CUDA).

Backward: the rms_norm backward of h, plus h's own gradient: ``dx = dresidual = dh + d rms_norm/dh (dy)``.
The norm's part is written in h's dtype, so for half types that sum is rounded twice (the norm's
gradient, then the sum); the triton kernel rounds it once.
"""
from .. import _host
from ._norm import add
from .rms_norm import autograd_ready, rms_norm, rms_norm_autograd, rms_norm_backward

add_rms_norm, add_rms_norm_backward = _host.composed_add_norm_ops(
    norm=rms_norm, norm_backward=rms_norm_backward, add=add)


def add_rms_norm_autograd(x, residual, weight, eps):
    """``[rms_norm(h), h]`` with ``h = add(x, residual)``, recorded by ATen's autograd
    (``kcourse.backend.autograd_kernel``) where ``rms_norm_autograd`` runs; else None."""
    if not autograd_ready(x, weight):
        return None
    h = add(x, residual)
    return [rms_norm_autograd(h, weight, eps)[0], h]
