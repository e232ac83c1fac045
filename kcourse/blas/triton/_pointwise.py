"""What the Triton activation kernels (gelu, silu, relu, swiglu) share.

Each is an elementwise kernel over same-shape tensors of any strides, launched through
``_launch.launch_elementwise`` (n-D strided indexing, int64 flat indices): ``load`` reads an
operand at the flat indices ``i`` and upcasts it to float32 (before any arithmetic: the bf16 trap
of the interpreter), ``store`` rounds a float32 result once to the target's dtype.
"""
from __future__ import annotations

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


@triton.jit
def silu_slope(x, s):
    """d silu / dx at ``x``, given ``s = sigmoid(x)``."""
    return s * (1.0 + x * (1.0 - s))


def launch(op: str, kernel, tensors, *scalars) -> None:
    """``launch_elementwise``, skipped for empty tensors (nothing to compute)."""
    if next(t for t in tensors if t is not None).numel():
        launch_elementwise(op, kernel, tensors, *scalars)

