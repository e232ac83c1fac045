"""linear: ``y = act(x @ weight^T + bias)`` (``_host.linear_ops``) with the bias and the activation in the
epilogue of ``gemm.py``'s kernels (pointer and TMA): the float32 accumulator plus the bias is stored
as z (rounded, for the backward) and act(z) as y, one pass over the tile. Backward: the activation's
backward kernel (dz = dy act'(z)), then the gemms dx = dz W, dW = dz^T x and the gemv db = dz^T 1.
"""
from .. import _host
from .gelu import gelu, gelu_backward
from .gemm import gemm
from .gemv import gemv
from .relu import relu, relu_backward
from .silu import silu, silu_backward

linear, linear_backward = _host.linear_ops(
    gemm=gemm, gemv=gemv, activations={"gelu": (gelu, gelu_backward), "relu": (relu, relu_backward),
                                        "silu": (silu, silu_backward)}, epilogue=True)
