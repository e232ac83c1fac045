"""rms_norm: ``y = x * rstd * weight`` over the last dimension, ``rstd = rsqrt(mean(x^2) + eps)``.

On CUDA with ATen's fused kernels ``aten._fused_rms_norm`` and ``aten._fused_rms_norm_backward``
(what ``F.rms_norm`` and its autograd run there, torch >= 2.9): half inputs computed in float32,
y, dx and dweight rounded once, rstd float32 (float64 for float64 x), kept flattened to (N,) in the
cache. Elsewhere (CPU, where ATen has no fused backward, or an older torch) composed: ``F.rms_norm``
on the input upcast to float32 (float64 stays) and ``_norm.norm_backward`` without the mean, with
xhat = x * rstd, g = dy * weight:

    dx = rstd * (g - xhat * mean(g * xhat)),   dweight = sum_rows dy * xhat
"""
import torch
import torch.nn.functional as F

from ._norm import aten_autograd, norm_backward, stat_shape, upcast

_aten = torch.ops.aten
FUSED = hasattr(_aten, "_fused_rms_norm") and hasattr(_aten, "_fused_rms_norm_backward")


def _fused(x: torch.Tensor) -> bool:
    return FUSED and x.device.type == "cuda"


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float):
    n = x.shape[:-1].numel()
    if _fused(x):
        y, rstd = _aten._fused_rms_norm(x, list(x.shape[-1:]), weight, eps)  # rstd (..., 1)
        return y, (x, weight, rstd.reshape(n))
    xf = upcast(x)  # (..., D)
    rstd = torch.rsqrt(xf.square().mean(dim=-1) + eps)  # (...,)
    y = F.rms_norm(xf, xf.shape[-1:], upcast(weight), eps)
    return y.to(x.dtype), (x, weight, rstd.reshape(n))


def rms_norm_backward(dout, cache, needs, eps):
    x, weight, rstd = cache
    if _fused(x):
        dx, dweight = _aten._fused_rms_norm_backward(dout, x, list(x.shape[-1:]), rstd.reshape(stat_shape(x)),
                                                     weight, list(needs))
        return dx, dweight
    return norm_backward(dout, x, weight, None, rstd, (*needs, False))[:2]


def autograd_ready(x, weight) -> bool:
    """Do ATen's fused kernels run here (``_fused``) and may they run under its autograd (``_norm.aten_autograd``)?"""
    return _fused(x) and aten_autograd(x, weight)


def rms_norm_autograd(x, weight, eps):
    """``[aten._fused_rms_norm(x)]`` recorded by ATen's autograd (``kcourse.backend.autograd_kernel``): the
    same kernels, where ``autograd_ready``; else None."""
    return [_aten._fused_rms_norm(x, list(x.shape[-1:]), weight, eps)[0]] if autograd_ready(x, weight) else None
