"""What layer_norm and rms_norm share on the pytorch backend: the upcast and the pullback.

With xhat = (x - mean) * rstd (``mean = 0`` for rms_norm) and g = dy * weight:

    dx      = rstd * (g - mean(g) - xhat * mean(g * xhat))    (rms_norm: no ``- mean(g)`` term)
    dweight = sum over rows of dy * xhat,   dbias = sum over rows of dy
"""
import torch

from .._layout import rows_of


def upcast(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` in float32 (float64 stays float64); None stays None."""
    return None if t is None else t.to(torch.promote_types(t.dtype, torch.float32))


def norm_backward(dout, x, weight, mean, rstd, needs):
    """``(dx, dweight, dbias)``, each None unless ``needs`` asks; ``mean`` is None for rms_norm."""
    d = x.shape[-1]
    dy = rows_of(upcast(dout))  # (N, D)
    xhat = rows_of(upcast(x))
    if mean is not None:
        xhat = xhat - mean.reshape(-1, 1)
    xhat = xhat * rstd.reshape(-1, 1)
    dx = dweight = dbias = None
    if needs[0]:
        g = dy if weight is None else dy * upcast(weight)
        dxhat = g - xhat * torch.linalg.vecdot(g, xhat)[:, None] / d  # (N, D)
        if mean is not None:
            dxhat -= g.mean(dim=1, keepdim=True)
        dx = (dxhat * rstd.reshape(-1, 1)).to(x.dtype).reshape(x.shape)
    if needs[1]:
        dweight = torch.linalg.vecdot(dy.T, xhat.T).to(x.dtype)  # (D,): column sums of dy * xhat
    if needs[2]:
        dbias = dy.sum(dim=0).to(x.dtype)
    return dx, dweight, dbias
