"""What layer_norm and rms_norm share on the pytorch backend: when ATen's own norm kernels meet the
op contract, the upcast where they do not, and the composed pullback for where no fused one exists.

ATen's CUDA norm kernels (``native_layer_norm``, ``_fused_rms_norm`` and their backwards) read half
inputs, compute in float32, round each output once and keep the statistics (mean, rstd) in float32;
float32 and float64 inputs stay in their dtype on every device. Its CPU kernels round half inputs'
statistics (layer_norm) or outputs (the rms_norm composite) through the half type, so there half
tensors are upcast to float32 first (``aten_ready``): a transient float32 copy, on CPU only.

The composed pullback, with xhat = (x - mean) * rstd (``mean = 0`` for rms_norm) and g = dy * weight:

    dx      = rstd * (g - mean(g) - xhat * mean(g * xhat))    (rms_norm: no ``- mean(g)`` term)
    dweight = sum over rows of dy * xhat,   dbias = sum over rows of dy
"""
import torch

from .._layout import rows_of

HALF = (torch.float16, torch.bfloat16)


def upcast(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` in float32 (float64 stays float64); None stays None."""
    return None if t is None else t.to(torch.promote_types(t.dtype, torch.float32))


def aten_ready(x: torch.Tensor, *tensors: torch.Tensor | None) -> tuple:
    """``(x, *tensors)`` as ATen's norm kernels take them under the op contract: unchanged on CUDA
    and for float32/float64, upcast to float32 for half types anywhere else."""
    if x.device.type == "cuda" or x.dtype not in HALF:
        return (x, *tensors)
    return tuple(upcast(t) for t in (x, *tensors))


def stat_shape(x: torch.Tensor) -> tuple[int, ...]:
    """The shape ATen gives the statistics of x (..., D): (..., 1)."""
    return (*x.shape[:-1], 1)


def add(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``x + residual``, contiguous, in x's dtype: ATen computes half types in float32 and rounds once."""
    return torch.add(x, residual).contiguous()


def aten_autograd(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None = None) -> bool:
    """May a norm of x run under ATen's autograd (``<op>_autograd``)? On CUDA, where ATen's kernels
    meet the contract, with some element, and unless a bias wants a gradient that the weight does
    not: ATen's CUDA column sums then give dbias wrongly past 65536 rows (torch 2.11, ``layer_norm.py``)."""
    return x.is_cuda and x.numel() > 0 and (
        bias is None or not bias.requires_grad or (weight is not None and weight.requires_grad))


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
