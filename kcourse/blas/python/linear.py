"""linear: ``y = act(x @ weight^T + bias)``, the reference composed of this backend's gemm, gemv and
activation kernels (``_host.linear_ops``: z = x W^T + b by the gemm, then the activation on z).
Backward: dz = dy act'(z) (the activation's backward), dx = dz W, dW = dz^T x, db = dz^T 1.
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
