"""linear: ``y = act(x @ weight^T + bias)`` (``_host.linear_ops``) over this backend's gemm (``torch.addmm``
with the bias, cuBLAS), gemv and activations (``F.gelu``, ``F.relu``, ``F.silu`` and ATen's backward kernels).
"""
import torch
import torch.nn.functional as F

from .. import _host
from .._layout import rows_of
from .gelu import gelu, gelu_backward
from .gemm import _FLAGS, gemm, reduced_precision_off, restore, sums_in_float32
from .gemv import gemv
from .relu import relu, relu_backward
from .silu import silu, silu_backward

linear, linear_backward = _host.linear_ops(
    gemm=gemm, gemv=gemv, activations={"gelu": (gelu, gelu_backward), "relu": (relu, relu_backward),
                                        "silu": (silu, silu_backward)})


_ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"), "relu": F.relu, "silu": F.silu}


def linear_autograd(x, weight, bias, activation):
    """``[act(x W^T + b)]`` recorded by ATen's autograd (``kcourse.backend.autograd_kernel``): one
    ``torch.addmm`` (``torch.mm`` without a bias) over x's rows, then the activation; the backward is
    ATen's (AddmmBackward's two products and the bias's column sum, the activation's backward kernel),
    its products with cuBLAS's half-precision reductions off (``sums_in_float32``), as this module's.
    On CUDA; on the CPU in float32 and float64 without an activation (ATen's vectorized CPU gelu gives
    NaN at +inf, ``gelu.py``). Elsewhere None, and None while a CUDA graph is captured, whose replays
    cost no host time: the op's own formula runs, its GPU time lower (the bias's gradient as one
    ``addmv``, 0.99 against 1.81 ms a GPT-2 step for ATen's column sums, ``docs/linear.md``)."""
    if not x.is_cuda:
        if activation != "none" or x.dtype not in (torch.float32, torch.float64):
            return None
    elif torch._C._cuda_isCurrentStreamCapturing():
        return None
    rows = rows_of(x)  # (M, K)
    state = reduced_precision_off(x.dtype) if x.is_cuda and x.dtype in _FLAGS else None
    try:
        z = torch.mm(rows, weight.t()) if bias is None else torch.addmm(bias, rows, weight.t())  # (M, N)
    finally:
        restore(x.dtype, state)
    z = sums_in_float32(z)
    y = z if activation == "none" else _ACTIVATIONS[activation](z)
    return [y.view(*x.shape[:-1], weight.shape[0])]
