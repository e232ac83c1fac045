"""silu: y = x sigmoid(x), elementwise, any shape and strides.

    dy/dx = s (1 + x (1 - s)),   s = sigmoid(x)

FLOPs: ~5 per element. Bytes: 2 numel * itemsize forward (read x, write y), 3 numel * itemsize
backward (read dy and x, write dx): memory bound.

Two ``Elementwise`` declarations run on ``_elementwise``'s kernel (merged layouts, vectors of up to
128 bits, 4 per thread in flight, math on float32 register fragments one vector at a time, one
rounding per output). ``sigmoid`` is built from ``exp(-|x|)`` (``_activation.py``: a 2-instruction
``ex2.approx``, and why it is accurate enough), so it never overflows.
"""
from __future__ import annotations

from ._activation import by_vector, sigmoid, silu_slope, unary, unary_backward
from ._elementwise import Elementwise

FORWARD = Elementwise("silu", inputs=1, outputs=1, float32=True, math=by_vector(lambda x: (x * sigmoid(x),)))
BACKWARD = Elementwise("silu", inputs=2, outputs=1, float32=True,  # (dy, x) -> dx
                       math=by_vector(lambda dy, x: (dy * silu_slope(x, sigmoid(x)),)))


def silu(x):
    return unary(FORWARD, x)


def silu_backward(dout, cache, needs, out=None):
    return unary_backward(BACKWARD, dout, cache, needs, out)
