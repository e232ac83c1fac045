"""What the Triton activation kernels (gelu, silu, relu, swiglu) share.

Each is an elementwise kernel over same-shape tensors of any strides, launched through
``_launch.launch_elementwise`` (n-D strided indexing, int64 flat indices): ``load`` reads an
operand at the flat indices ``i`` and upcasts it to float32 (before any arithmetic: the bf16 trap
of the interpreter), ``store`` rounds a float32 result once to the target's dtype. ``activate`` is
each activation's forward formula, written once for these kernels and the gemm's epilogue.
"""
from __future__ import annotations

import math

import triton
import triton.language as tl

from ._launch import launch_elementwise, strided_offsets


@triton.jit
def load(ptr, i, mask, shape, strides):
    """The elements at flat indices ``i`` of a tensor with ``strides``, in float32."""
    return tl.load(ptr + strided_offsets(i, shape, strides), mask=mask).to(tl.float32)


@triton.jit
def store(ptr, i, mask, shape, strides, value):
    """Round the float32 ``value`` to the tensor's dtype and write it at flat indices ``i``."""
    tl.store(ptr + strided_offsets(i, shape, strides), value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def sigmoid(x):
    e = tl.exp(-tl.abs(x))  # in (0, 1]: cannot overflow
    return tl.where(x >= 0, 1.0, e) / (1.0 + e)


SQRT_2_OVER_PI = tl.constexpr(math.sqrt(2 / math.pi))
RSQRT_2 = tl.constexpr(1 / math.sqrt(2))
COEF = tl.constexpr(0.044715)
# The constants multiply from the right: in Triton 3.9's interpreter, `constexpr * tensor` gives a
# value that tl.exp and tl.abs reject.


@triton.jit
def activate(x, NAME: tl.constexpr):
    """``NAME``(x) of a float32 ``x``: "gelu" (0.5 x (1 + erf(x / sqrt 2))), "gelu_tanh" (x sigmoid(2u),
    u = sqrt(2/pi) (x + 0.044715 x^3): 0.5 (1 + tanh u) = sigmoid(2u), and Triton 3.6 has no tanh),
    "relu" (NaN stays NaN), "silu" (x sigmoid(x)); any other name: x itself."""
    if NAME == "gelu":
        y = 0.5 * x * (1.0 + tl.math.erf(x * RSQRT_2))
    elif NAME == "gelu_tanh":
        y = x * sigmoid(2.0 * (x + x * x * x * COEF) * SQRT_2_OVER_PI)
    elif NAME == "relu":
        y = tl.where(x < 0, 0.0, x)
    elif NAME == "silu":
        y = x * sigmoid(x)
    else:
        y = x
    return y


@triton.jit
def silu_slope(x, s):
    """d silu / dx at ``x``, given ``s = sigmoid(x)``."""
    return s * (1.0 + x * (1.0 - s))


def launch(op: str, kernel, tensors, *scalars) -> None:
    """``launch_elementwise``, skipped for empty tensors (nothing to compute)."""
    if next(t for t in tensors if t is not None).numel():
        launch_elementwise(op, kernel, tensors, *scalars)

