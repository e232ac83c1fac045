"""layer_norm: ``y = (x - mean) * rstd * weight + bias`` over the last dimension, with ATen's fused
kernels ``torch.native_layer_norm`` and ``aten.native_layer_norm_backward`` (what ``F.layer_norm``
and its autograd run):

    mean = sum_j x_j / D,   rstd = 1 / sqrt(sum_j (x_j - mean)^2 / D + eps)   (biased variance)

The kernels compute half inputs in float32 and round y, dx, dweight and dbias once; mean and rstd
are float32 (float64 for float64 x), kept flattened to (N,) in the cache. On CPU, where ATen would
keep half statistics, half tensors are upcast first (``_norm.aten_ready``). Backward, xhat = (x -
mean) * rstd, g = dy * weight (off CUDA, dweight and dbias are ``_norm.norm_backward``'s sums: ATen's CPU
kernel adds each column up in one running float32 sum, ~20x the error at 66k rows):

    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dweight = sum_rows dy * xhat,  dbias = sum_rows dy
"""
import torch
import torch.nn.functional as F

from ._norm import aten_autograd, aten_ready, norm_backward, stat_shape


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float):
    xa, wa, ba = aten_ready(x, weight, bias)
    y, mean, rstd = torch.native_layer_norm(xa, x.shape[-1:], wa, ba, eps)  # stats (..., 1)
    n = x.shape[:-1].numel()
    return y if y.dtype == x.dtype else y.to(x.dtype), (x, weight, mean.reshape(n), rstd.reshape(n))


def layer_norm_backward(dout, cache, needs, eps):
    x, weight, mean, rstd = cache
    if x.device.type != "cuda" and (needs[1] or needs[2]):
        # ATen's CPU kernel adds up dweight and dbias over the rows in running float32 sums: at 66k rows
        # ~20x the error of the reduction tree of torch.sum, which the composed sums use
        dx = layer_norm_backward(dout, cache, (needs[0], False, False), eps)[0] if needs[0] else None
        return (dx, *norm_backward(dout, x, weight, mean, rstd, (False, needs[1], needs[2]))[1:])
    xa, dya, wa = aten_ready(x, dout, weight)
    # the kernel reads bias only for dbias's shape and dtype, and the cache holds no bias: the weight,
    # of that shape and dtype, stands in for it (an allocation fewer per call), else an empty one
    bias = (wa if wa is not None else x.new_empty(x.shape[-1:], dtype=xa.dtype)) if needs[2] else None
    mask = list(needs)
    if needs[2] and not needs[1]:  # CUDA's column sums past 65536 rows (torch 2.11) give dbias of shape (0,)
        mask[1] = True             # or wrong values unless dweight is computed too (of a ones weight if None)
        wa = xa.new_ones(x.shape[-1:]) if wa is None else wa
    grads = torch.ops.aten.native_layer_norm_backward(
        dya, xa, x.shape[-1:], mean.reshape(stat_shape(x)), rstd.reshape(stat_shape(x)), wa, bias, mask)
    return tuple(None if g is None or not need else g if g.dtype == x.dtype else g.to(x.dtype)
                 for g, need in zip(grads, needs))


def layer_norm_autograd(x, weight, bias, eps):
    """``[F.layer_norm(x)]`` recorded by ATen's autograd (``kcourse.backend.autograd_kernel``): the same
    kernels, where ``_norm.aten_autograd`` allows; else None."""
    return [F.layer_norm(x, x.shape[-1:], weight, bias, eps)] if aten_autograd(x, weight, bias) else None
