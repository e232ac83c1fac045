"""swiglu: y = silu(gate) * up, elementwise, for same-shape tensors of any strides.

    dgate = dy * up * s (1 + g (1 - s)),   dup = dy * g * s,   s = sigmoid(g)

Forward: one pass (read gate and up, write y: 3 numel * itemsize). Backward: one pass that writes
both gradients (read dy, gate, up, write dgate, dup: 5 numel * itemsize); when only one gradient is
needed a kernel that writes only that one runs (and, for dup alone, does not read up). Memory bound.

Each case is an ``Elementwise`` declaration on ``_elementwise``'s kernel (the operands' merged
layouts, vectors of up to 128 bits when every operand allows them, 4 per thread in flight, math on
float32 register fragments one vector at a time, ``_activation.by_vector``, one rounding per
output). ``sigmoid`` uses ``_activation.exp`` (``ex2.approx``; its accuracy is argued there).
"""
from __future__ import annotations

import torch

from ._activation import by_vector, sigmoid, silu_slope
from ._elementwise import Elementwise, run


def _backward(dy, g, u):
    s = sigmoid(g)
    return dy * u * silu_slope(g, s), dy * g * s


FORWARD = Elementwise("swiglu", inputs=2, outputs=1, float32=True,  # (gate, up) -> y
                      math=by_vector(lambda g, u: (g * sigmoid(g) * u,)))
BACKWARD = Elementwise("swiglu", inputs=3, outputs=2, float32=True,  # (dy, gate, up) -> dgate, dup
                       math=by_vector(_backward))
BACKWARD_GATE = Elementwise("swiglu", inputs=3, outputs=1, float32=True,  # (dy, gate, up) -> dgate
                            math=by_vector(lambda dy, g, u: (dy * u * silu_slope(g, sigmoid(g)),)))
BACKWARD_UP = Elementwise("swiglu", inputs=2, outputs=1, float32=True,  # (dy, gate) -> dup
                          math=by_vector(lambda dy, g: (dy * g * sigmoid(g),)))


def swiglu(gate, up):
    out = torch.empty_like(gate)
    run(FORWARD, (gate, up, out))
    return out, (gate, up)


def swiglu_backward(dout, cache, needs, out=(None, None)):
    gate, up = cache  # out may be (gate, up) themselves: each vector is loaded before its gradients are stored
    dgate = (torch.empty_like(gate) if out[0] is None else out[0]) if needs[0] else None
    dup = (torch.empty_like(up) if out[1] is None else out[1]) if needs[1] else None
    if dgate is not None and dup is not None:
        run(BACKWARD, (dout, gate, up, dgate, dup))
    elif dgate is not None:
        run(BACKWARD_GATE, (dout, gate, up, dgate))
    elif dup is not None:
        run(BACKWARD_UP, (dout, gate, dup))
    return dgate, dup
