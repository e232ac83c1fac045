"""relu: y = max(x, 0), elementwise, any shape and strides (NaN stays NaN, as torch.relu).

    dx = dy where x > 0, else 0   (subgradient 0 at 0; written ``x <= 0 ? 0 : dy`` as PyTorch's
                                   threshold_backward, so a NaN input passes dy through)

Exact: no rounding (the float32 round trip of a float16/bfloat16 value is exact). Bytes: 2 numel *
itemsize forward, 3 numel * itemsize backward.

Two ``Elementwise`` declarations run on ``_elementwise``'s kernel (merged layouts, vectors of up to
128 bits, 4 per thread in flight). The selects are ``cute.where`` on register fragments (one
vector at a time, ``_activation.by_vector``): ``x < 0 ? 0 : x`` rather than a max, so that a NaN
input gives NaN (``max.f32`` would return 0).
"""
from __future__ import annotations

import cutlass.cute as cute

from ._activation import by_vector, unary, unary_backward
from ._elementwise import Elementwise

FORWARD = Elementwise("relu", inputs=1, outputs=1, float32=True,
                      math=by_vector(lambda x: (cute.where(x < 0.0, 0.0, x),)))
BACKWARD = Elementwise("relu", inputs=2, outputs=1, float32=True,  # (dy, x) -> dx
                       math=by_vector(lambda dy, x: (cute.where(x <= 0.0, 0.0, dy),)))


def relu(x):
    return unary(FORWARD, x)


def relu_backward(dout, cache, needs, out=None):
    return unary_backward(BACKWARD, dout, cache, needs, out)
