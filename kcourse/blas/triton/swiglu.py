"""swiglu: y = silu(gate) * up, elementwise, for same-shape tensors of any strides.

    dgate = dy * up * s (1 + g (1 - s)),   dup = dy * g * s,   s = sigmoid(g)

Forward: one pass (read gate and up, write y: 3 numel * itemsize). Backward: one pass that writes
both gradients (read dy, gate, up, write dgate, dup: 5 numel * itemsize); a gradient that is not
needed is passed as None and never written (nor up read, when only dup is needed). Memory bound.
Math in float32, one rounding per output.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import block_indices
from ._pointwise import launch, load, sigmoid, silu_slope, store


@triton.jit
def swiglu_kernel(gate_ptr, up_ptr, out_ptr, numel, shape, gate_strides, up_strides, out_strides,
                  BLOCK: tl.constexpr):
    i = block_indices(BLOCK)  # (BLOCK,) int64 flat indices
    mask = i < numel
    g = load(gate_ptr, i, mask, shape, gate_strides)
    u = load(up_ptr, i, mask, shape, up_strides)
    store(out_ptr, i, mask, shape, out_strides, g * sigmoid(g) * u)


@triton.jit
def swiglu_backward_kernel(dout_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, numel, shape, dout_strides,
                           gate_strides, up_strides, dgate_strides, dup_strides, BLOCK: tl.constexpr):
    i = block_indices(BLOCK)  # (BLOCK,) int64 flat indices
    mask = i < numel
    dy = load(dout_ptr, i, mask, shape, dout_strides)
    g = load(gate_ptr, i, mask, shape, gate_strides)
    s = sigmoid(g)
    if dgate_ptr is not None:  # compile-time tests: a gradient nobody needs is None
        u = load(up_ptr, i, mask, shape, up_strides)
        store(dgate_ptr, i, mask, shape, dgate_strides, dy * u * silu_slope(g, s))
    if dup_ptr is not None:
        store(dup_ptr, i, mask, shape, dup_strides, dy * g * s)


def swiglu(gate, up):
    out = torch.empty_like(gate)
    launch("swiglu", swiglu_kernel, (gate, up, out))
    return out, (gate, up)


def swiglu_backward(dout, cache, needs, out=(None, None)):
    gate, up = cache  # out may be (gate, up) themselves: each element's gate and up are read, then written
    dgate = (torch.empty_like(gate) if out[0] is None else out[0]) if needs[0] else None
    dup = (torch.empty_like(up) if out[1] is None else out[1]) if needs[1] else None
    if dgate is not None or dup is not None:
        launch("swiglu", swiglu_backward_kernel, (dout, gate, up if needs[0] else None, dgate, dup))
    return dgate, dup
