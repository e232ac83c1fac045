"""What layer_norm and rms_norm share in the reference: the affine step and the pullback.

Both normalize each row of x (..., D) to ``xhat = (x - mean) * rstd`` (``mean = 0`` for rms_norm)
and return ``y = xhat * weight + bias``. With ``g = dy * weight``, the pullback is

    dx      = rstd * (g - mean(g) - xhat * mean(g * xhat))    (rms_norm: no ``- mean(g)`` term)
    dweight = sum over rows of dy * xhat
    dbias   = sum over rows of dy

The fused add + norms normalize h = x + residual and add h's own gradient to dx (``dresidual``).
"""
import torch

from ._acc import acc


def affine(xhat: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """``xhat * weight + bias`` in the accumulation dtype; a missing weight is 1, a missing bias 0."""
    y = xhat if weight is None else xhat * acc(weight)
    return y if bias is None else y + acc(bias)


def add(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``x + residual`` in the accumulation dtype, rounded once to x's dtype (the fused add + norms' h)."""
    return (acc(x) + acc(residual)).to(x.dtype)


def norm_backward(dout, x, weight, mean, rstd, needs, dresidual=None):
    """``(dx, dweight, dbias)``, each None unless ``needs`` asks; ``mean`` is None for rms_norm;
    mean and rstd hold one value per row of x (N,). ``dresidual`` (x's shape, or None: 0), the gradient x
    also receives from elsewhere (the fused add + norms' h), is added to dx before it is rounded."""
    d = x.shape[-1]
    dy, xf = acc(dout), acc(x)  # (..., D)
    rstd = rstd.reshape(*x.shape[:-1], 1)  # (..., 1)
    xhat = (xf if mean is None else xf - mean.reshape(*x.shape[:-1], 1)) * rstd
    dx = dweight = dbias = None
    if needs[0]:
        g = dy if weight is None else dy * acc(weight)
        dxhat = g - xhat * (g * xhat).mean(dim=-1, keepdim=True)
        if mean is not None:
            dxhat = dxhat - g.mean(dim=-1, keepdim=True)
        dx = rstd * dxhat
        dx = (dx if dresidual is None else dx + acc(dresidual)).to(x.dtype)
    if needs[1]:
        dweight = (dy * xhat).reshape(x.shape[:-1].numel(), d).sum(dim=0).to(x.dtype)  # (D,)
    if needs[2]:
        dbias = dy.reshape(x.shape[:-1].numel(), d).sum(dim=0).to(x.dtype)  # (D,)
    return dx, dweight, dbias
