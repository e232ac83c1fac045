"""linear_swiglu: ``y = silu(x W_g^T + b_g) * (x W_u^T + b_u)`` (``_host.linear_swiglu_ops``): two
``torch.addmm`` (cuBLAS), then this backend's swiglu. Backward: swiglu's backward gives dg and du,
then dx = dg W_g + du W_u (the second gemm adds in place), dW_g = dg^T x, dW_u = du^T x, and the
biases' gemvs.
"""
from .. import _host
from .gemm import gemm
from .gemv import gemv
from .swiglu import swiglu, swiglu_backward

linear_swiglu, linear_swiglu_backward = _host.linear_swiglu_ops(
    gemm=gemm, gemv=gemv, swiglu=swiglu, swiglu_backward=swiglu_backward)
