"""linear_swiglu: ``y = silu(x W_g^T + b_g) * (x W_u^T + b_u)`` (``_host.linear_swiglu_ops``): one pass
of ``gemm.py``'s kernel (TMA on Hopper, else pointers) over x with two accumulators (W_g's and W_u's
tiles against the same x tile), the biases and the gated unit in its epilogue, which stores g, u and y. Backward: swiglu's
backward gives dg and du, then dx = dg W_g + du W_u (the second gemm adds in place), dW_g = dg^T x,
dW_u = du^T x, and the biases' gemvs.
"""
from .. import _host
from .gemm import gemm
from .gemv import gemv
from .swiglu import swiglu, swiglu_backward

linear_swiglu, linear_swiglu_backward = _host.linear_swiglu_ops(
    gemm=gemm, gemv=gemv, swiglu=swiglu, swiglu_backward=swiglu_backward, epilogue=True)
