"""linear: ``y = act(x @ weight^T + bias)`` (``_host.linear_ops``) over this backend's gemm (``torch.addmm``
with the bias, cuBLAS), gemv and activations (``F.gelu``, ``F.relu``, ``F.silu`` and ATen's backward kernels).
"""
from .. import _host
from .gelu import gelu, gelu_backward
from .gemm import gemm
from .gemv import gemv
from .relu import relu, relu_backward
from .silu import silu, silu_backward

linear, linear_backward = _host.linear_ops(
    gemm=gemm, gemv=gemv, activations={"gelu": (gelu, gelu_backward), "relu": (relu, relu_backward),
                                        "silu": (silu, silu_backward)})
